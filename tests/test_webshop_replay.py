"""Replaying an original WebShop session through ``env.webshop.task_prices`` alone.

The original (princeton-nlp/WebShop@64fa2a5:web_agent_site) draws one hidden price per product
(``engine.generate_product_prices``: ``pricing[0]``, or ``random.uniform(a, b)`` for a range) and
uses it in exactly two places: the budget drawn above the target's price (``goal.py``) and the price
term of the purchase's reward (``web_agent_text_env.py:SimServer.done`` →
``get_reward(..., price=product_prices[asin])``). Result and item pages show the ``Price`` tag
(``"$a"`` / ``"$a to $b"``, Python float formatting), never the hidden price. The reward is
``r_type * (n_attr + n_opt + [price <= price_upper]) / (|A| + |O| + 1)``.

Goal 10 (seed 0): "Find me machine wash men's pants with relaxed fit with color: grey, and size:
40w x 34l": 2 attributes, 2 options, so the denominator is 5; its target B08LKKSL8F is priced
"$45.99 to $49.99".
"""

from __future__ import annotations

import json

import pytest

from serl.config import EnvConfig
from serl.envs.base import EnvError, Task
from serl.envs.base import check_config as check_env_config
from serl.envs.webshop import WebShopEnv
from serl.envs.webshop.catalog import hidden_price
from serl.envs.webshop.goals import TaskPrice, load_task_prices
from serl.errors import ConfigError

TARGET = "B08LKKSL8F"
OTHER = "B085S5P7WB"  # a range-priced non-target product on the same results page
QUERY = "Find me machine wash men's pants with relaxed fit with color: grey, and size: 40w x 34l"
#: page 1 of the results of QUERY: asin -> the Price tag the original's templates show
PAGE1_TAGS = {
    "B08LKKSL8F": "$45.99 to $49.99", "B099231V35": "$16.79", "B09ND8P2QR": "$43.59", "B09ND9DP7J": "$43.59",
    "B09QCVCYVY": "$6.82", "B09Q67H373": "$1.99 to $8.99", "B09NNMV9LN": "$3.99 to $10.99", "B098B8KGMB": "$2.99",
    "B09RVF4JP1": "$19.99", "B085S5P7WB": "$0.01 to $2.99",
}
#: hidden prices as an original session could have drawn them: pricing[0] for one price, a
#: point of [a, b] for a range
REPLAY_PRICES = {
    "B08LKKSL8F": 47.5, "B099231V35": 16.79, "B09ND8P2QR": 43.59, "B09ND9DP7J": 43.59, "B09QCVCYVY": 6.82,
    "B09Q67H373": 5.55, "B09NNMV9LN": 7.77, "B098B8KGMB": 2.99, "B09RVF4JP1": 19.99, "B085S5P7WB": 1.5,
}
SESSION = [f"search[{QUERY}]", f"click[{OTHER.lower()}]", "click[< prev]", f"click[{TARGET.lower()}]",
           "click[grey]", "click[40w x 34l]", "click[buy now]"]


def task(tid: str = "10") -> Task:
    return Task("webshop", tid, "webshop", 0)


def play(env: WebShopEnv, actions, tid: str = "10"):
    results = [env.reset(task(tid))]
    for a in actions:
        results.append(env.step(a))
        assert not results[-1].info["invalid_action"], (a, results[-1].info)
    return results


def _segments(r) -> list[str]:
    return r.info["raw_observation"].split(" [SEP] ")


def test_replay_sets_every_shown_price_pages_show_tags_and_the_reward_uses_the_set_prices():
    env = WebShopEnv(task_prices={"10": {"price_upper": 48.0, "product_prices": REPLAY_PRICES}})
    rs = play(env, SESSION)
    assert rs[0].task == QUERY + ", and price lower than 48.00 dollars"
    # the results page (twice: after the search and after "< prev") lists these 10 products with their tags
    for r in (rs[1], rs[3]):
        seg = _segments(r)
        shown = {seg[i]: seg[i + 2] for i in range(len(seg)) if seg[i] in PAGE1_TAGS}
        assert shown == PAGE1_TAGS
    assert "Price: $0.01 to $2.99" in _segments(rs[2]) and "Price: $45.99 to $49.99" in _segments(rs[4])
    # pages never show a hidden price: they equal the pages of the same session with seeded prices
    seeded = play(WebShopEnv(task_prices={"10": {"price_upper": 48.0}}), SESSION)
    assert [r.info["raw_observation"] for r in rs] == [r.info["raw_observation"] for r in seeded]
    # the reward: both attributes, both options and the price term hold -> (2 + 2 + 1) / 5
    done = rs[-1]
    assert done.info["purchased_asin"] == TARGET and done.info["price"] == 47.5 and done.info["price_upper"] == 48.0
    assert done.info["task_score"] == 5 / 5 and done.reward == 10.0 and done.won
    # the same session with the target's hidden price $48.50 (inside its range) over the $48 budget: 4 / 5
    over = dict(REPLAY_PRICES, **{TARGET: 48.5})
    done = play(WebShopEnv(task_prices={"10": {"price_upper": 48.0, "product_prices": over}}), SESSION)[-1]
    assert done.info["price"] == 48.5 and done.info["task_score"] == pytest.approx(4 / 5)
    assert done.reward == 0.0 and not done.won and done.info["reward_details"]["r_price"] is False


@pytest.mark.parametrize("hidden, price_term", [(1.5, 1), (2.5, 0)])
def test_a_non_target_purchase_uses_its_set_hidden_price(hidden, price_term):
    env = WebShopEnv(task_prices={"10": {"price_upper": 2.0, "product_prices": {OTHER: hidden}}})
    done = play(env, [f"search[{QUERY}]", f"click[{OTHER.lower()}]", "click[buy now]"])[-1]
    d = done.info["reward_details"]
    assert done.info["purchased_asin"] == OTHER and done.info["price"] == hidden
    # r_type 0.1 (title_score < 0.1), 1 of 2 attributes, no option chosen
    assert d["r_type"] == 0.1 and d["r_att"] == 0.5 and d["r_option"] == 0.0
    assert done.info["task_score"] == pytest.approx(0.1 * (1 + 0 + price_term) / 5)


def test_budget_is_drawn_above_the_targets_product_price():
    # $55: the first four budgets above it are 60, 70, 80, 90; the larger of two is 70, 80 or 90
    env = WebShopEnv(task_prices={"10": {"product_prices": {TARGET: 55.0}}})
    env.reset(task())
    assert env.price_upper in (70.0, 80.0, 90.0) and env.target_price == 55.0
    same = WebShopEnv(task_prices={"10": {"price": 55.0}})
    same.reset(task())
    assert same.price_upper == env.price_upper
    # 'price' and product_prices[target] may both be given when they agree
    both = WebShopEnv(task_prices={"10": {"price": 55.0, "product_prices": {TARGET: 55.0}}})
    assert both.reset(task()).task == same.reset(task()).task


def test_unlisted_products_and_other_tasks_keep_the_seeded_draws():
    env = WebShopEnv(task_prices={"10": {"product_prices": {TARGET: 47.5}}})
    done = play(env, [f"search[{QUERY}]", "click[b09nnmv9ln]", "click[buy now]"])[-1]
    assert done.info["price"] == hidden_price(env.world.catalog.by_asin["B09NNMV9LN"], 0, 10)
    other = ["search[men's shirt]", "click[next >]", "click[back to search]"]
    a, b = play(env, other, "11"), play(WebShopEnv(), other, "11")
    assert [(r.observation, r.task, r.info) for r in a] == [(r.observation, r.task, r.info) for r in b]


def test_task_price_records_and_lookup():
    tp = load_task_prices({"10": {"price": 47.5, "product_prices": {OTHER: 1.5, TARGET: 47.5}}})["10"]
    assert tp == TaskPrice(price_upper=None, price=47.5, product_prices={OTHER: 1.5, TARGET: 47.5})
    assert tp.hidden_price_of(TARGET, TARGET) == 47.5 and tp.hidden_price_of(OTHER, TARGET) == 1.5
    assert tp.hidden_price_of("B09NNMV9LN", TARGET) is None
    assert TaskPrice(product_prices={TARGET: 47.0}).hidden_price_of(TARGET, TARGET) == 47.0


# ---------------------------------------------------------------------------- errors
BAD_ENTRIES = [
    ({"product_prices": {TARGET: 0}}, r"\['10'\]\.product_prices\['B08LKKSL8F'\] must be a finite number > 0"),
    ({"product_prices": {TARGET: -3.5}}, r"\['10'\]\.product_prices\['B08LKKSL8F'\] must be .* > 0"),
    ({"product_prices": {TARGET: float("nan")}}, r"\['10'\]\.product_prices\['B08LKKSL8F'\]"),
    ({"product_prices": {TARGET: "47.5"}}, r"\['10'\]\.product_prices\['B08LKKSL8F'\]"),
    ({"product_prices": {TARGET: True}}, r"\['10'\]\.product_prices\['B08LKKSL8F'\]"),
    ({"product_prices": {"B08LKKSL8F0": 1.0}}, r"\['10'\]\.product_prices: 'B08LKKSL8F0' is not a WebShop ASIN"),
    ({"product_prices": {"": 1.0}}, r"\['10'\]\.product_prices: '' is not a WebShop ASIN"),
    ({"product_prices": [47.5]}, r"\['10'\]\.product_prices must map ASINs"),
    ({"prices": {TARGET: 1.0}}, r"\['10'\] must be an object with 'price_upper' and/or 'price' and/or 'product_prices'"),
]


@pytest.mark.parametrize("entry, message", BAD_ENTRIES)
def test_bad_entries_fail_at_config_check_and_at_load(entry, message, tmp_path):
    spec = {"10": entry}
    with pytest.raises(ConfigError, match=message):  # without the catalogue
        check_env_config(EnvConfig(name="webshop", webshop={"task_prices": spec}))
    with pytest.raises(EnvError, match=message):
        load_task_prices(spec)
    with pytest.raises(EnvError, match=message):
        WebShopEnv(task_prices=spec)
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(spec))  # Python's json writes and reads NaN
    with pytest.raises(ConfigError, match=message):  # a JSON file is read and checked too
        check_env_config(EnvConfig(name="webshop", webshop={"task_prices": str(path)}))


def test_good_entries_pass_the_config_check(tmp_path):
    spec = {"10": {"price_upper": 48.0, "product_prices": REPLAY_PRICES}, "h2": {"price": 3}}
    check_env_config(EnvConfig(name="webshop", webshop={"task_prices": spec}))
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(spec))
    check_env_config(EnvConfig(name="webshop", webshop={"task_prices": str(path)}))


@pytest.mark.parametrize("spec, message", [
    ({"10": {"product_prices": {"B000000000": 5.0}}},
     r"task_prices\['10'\]\.product_prices: unknown ASIN 'B000000000': no such product in the 1000-product"),
    ({"10": {"product_prices": {"b08lkksl8f": 5.0}}},
     r"task_prices\['10'\]\.product_prices: unknown ASIN 'b08lkksl8f'.*upper case: 'B08LKKSL8F'"),
    ({"10": {"price": 47.5, "product_prices": {TARGET: 48.0}}},
     r"task_prices\['10'\]: 'price' 47.5 and product_prices\['B08LKKSL8F'\] 48.0 .* differ"),
    ({"99999": {"price": 3.0}}, r"task_prices\['99999'\]: WebShop task id '99999' out of range"),
    ({"h99": {"price": 3.0}}, r"task_prices\['h99'\]: WebShop task id 'h99' out of range"),
    ({"pillow": {"price": 3.0}}, r"task_prices\['pillow'\]: bad WebShop task id 'pillow'"),
])
def test_env_checks_asins_task_ids_and_target_prices_when_built(spec, message):
    check_env_config(EnvConfig(name="webshop", webshop={"task_prices": spec}))  # needs the catalogue: passes
    with pytest.raises(EnvError, match=message):
        WebShopEnv(task_prices=spec)
