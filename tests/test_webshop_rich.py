"""WebShop's ``text_rich`` observation mode and explicit per-task prices.

The expected pages follow princeton-nlp/WebShop@64fa2a5's templates (``web_agent_site/templates/``)
through its ``convert_html_to_text(html, simple=False)``: one line per visible text node with the
template's own spaces ("Instruction: " on the search page, " " + bullet on the features page), buttons
as ``[button] X [button_]``, option labels indented by two spaces and marked ``[clicked button]`` when
``'"X"'`` is in the page URL (the JSON of the chosen options), product links on a line of their own,
marked once opened, and "You have clicked X." lines put first.
"""

from __future__ import annotations

import json

import pytest

from serl.config import EnvConfig
from serl.configure import load_config
from serl.envs.base import EnvError, Task
from serl.envs.base import check_config as check_env_config
from serl.envs.webshop import WebShopEnv, load_world
from serl.envs.webshop.goals import load_task_prices
from serl.envs.webshop.options import OBSERVATION_MODES as WEBSHOP_OBSERVATION_MODES
from serl.envs.webshop.pages import OBSERVATION_MODES
from serl.errors import ConfigError

INSTR0 = ('Find me double sided, machine washable decorative pillows with printing technology with size: '
          '28" x 28", and price lower than 50.00 dollars')
HEAD = f"Instruction:\n{INSTR0}\n[button] Back to Search [button_]\n"
TITLE = ('Ambesonne Abstract Throw Pillow Cushion Cover, Geometric Composition with Different Colored Squares '
         'Striped Dotted Rhombus, Decorative Square Accent Pillow Case, 16" X 16", Grey Purple')
SIZES = ['16" x 16"', "18 x 18-inch", '20" x 20"', '24" x 24"', '26" x 16"', '26" x 26"', '28" x 28"',
         '36" x 16"', '36" x 36"', '40" x 40"']


def task(i, seed: int = 0) -> Task:
    return Task("webshop", str(i), "webshop", seed)


@pytest.fixture
def rich():
    e = WebShopEnv(observation_mode="text_rich", show_attrs=True, max_steps=40)
    yield e
    e.close()


def _item_page(clicked: str | None) -> str:
    labels = "".join(f"  [clicked button] {v} [clicked button_]\n" if v == clicked else f"  [button] {v} [button_]\n"
                     for v in SIZES)
    return ((f"You have clicked {clicked}.\n" if clicked else "") + HEAD + "[button] < Prev [button_]\nsize\n" + labels
            + f"{TITLE}\nPrice: $14.95\nRating: N.A.\n[button] Description [button_]\n[button] Features [button_]\n"
            "[button] Reviews [button_]\n[button] Attributes [button_]\n[button] Buy Now [button_]\n")


def test_every_page_type_matches_the_templates(rich):
    r = rich.reset(task(0))
    want = f"WebShop\nInstruction: \n{INSTR0}\n[button] Search [button_]\n"
    assert r.observation == want and r.info["raw_observation"] == want
    assert r.task == INSTR0 and r.admissible_actions == ["search[<your query>]"]

    r = rich.step(f"search[{INSTR0}]")
    assert r.observation.startswith(
        HEAD + "Page 1 (Total results: 50)\n[button] Next > [button_]\n\n[button] B0743JKHBV [button_]\n"
        f"{TITLE}\n$14.95\n\n[button] B07XTK3P89 [button_]\nLunarable Oriental Storage Toy Bag Chair, ")
    assert r.observation.count("\n\n[button] B") == 10 and r.observation.endswith("\n")
    r = rich.step("click[next >]")
    assert r.observation.startswith(HEAD + "Page 2 (Total results: 50)\n[button] < Prev [button_]\n[button] Next > [button_]\n\n")
    r = rich.step("click[< prev]")

    r = rich.step("click[b0743jkhbv]")
    assert r.observation == _item_page(None)
    r = rich.step("click[18 x 18-inch]")
    assert r.observation == _item_page("18 x 18-inch")
    # as in the original, a value holding '"' is never marked: its JSON form in the URL is escaped
    r = rich.step('click[28" x 28"]')
    assert not r.info["invalid_action"] and r.observation == _item_page(None)

    r = rich.step("click[features]")
    assert r.observation == HEAD + (
        "[button] < Prev [button_]\n Imported \n 16 Inches x 16 Inches - Double sided print - With Zipper. Cut and "
        "sewn by hand. Insert not included. \n Made from - 100% Spun Polyester - waterproof, High quality fabric. "
        "Highly unique. Versatile. Fun. \n Machine washable - Delicate cycle, Dryer safe. Durable enough for both "
        "indoor and outdoor. \n Features - Vivid colors & Clear image. No fading - No dyes harming health of your "
        "family. \n Modern Prints - Printed with state of the art digital printing technology. Imported or Made in USA \n")
    rich.step("click[< prev]")
    r = rich.step("click[attributes]")
    assert r.observation == HEAD + (
        "[button] < Prev [button_]\n printing technology\n double sided\n throw pillow\n machine washable\ngarden\n"
        "decorative pillows\nHome & Kitchen › Bedding › Decorative Pillows, Inserts & Covers › Throw Pillow Covers\n")
    rich.step("click[< prev]")
    r = rich.step("click[reviews]")
    assert r.observation == HEAD + "[button] < Prev [button_]\n"  # the data has no reviews
    rich.step("click[< prev]")
    r = rich.step("click[description]")
    product = load_world().catalog.by_asin["B0743JKHBV"]
    assert r.observation == HEAD + f"[button] < Prev [button_]\n{product.description}\n"
    rich.step("click[< prev]")
    r = rich.step("click[< prev]")  # back to the results: the opened product is marked
    assert "\n\n[clicked button] B0743JKHBV [clicked button_]\n" in r.observation
    assert r.observation.count("[clicked button]") == 1

    rich.step("click[b0743jkhbv]")
    rich.step("click[18 x 18-inch]")
    r = rich.step("click[buy now]")
    assert r.done and r.observation == (
        "Thank you for shopping with us!\nYour code: \nNone\n (Paste it in your MTurk interface.)\nPurchased\nasin\n"
        'B0743JKHBV\noptions\n{"size": "18 x 18-inch"}\nattrs\nNone\ncategory\nNone\nquery\nNone\n'
        "product category\nNone\nTarget\nasin\noptions\nattrs\nprice upper\ninstuction text\ncategory\n"
        "product category\nquery\nGoal \nNone\nReward\nYour score (min 0.0, max 1.0)\n"
        f"{r.info['task_score']}\nReward Details \nNone\n")


def test_back_to_search_forgets_opened_products_and_text_mode_is_unchanged(rich):
    rich.reset(task(0))
    rich.step(f"search[{INSTR0}]")
    rich.step("click[b0743jkhbv]")
    rich.step("click[back to search]")
    r = rich.step(f"search[{INSTR0}]")
    assert "[clicked button]" not in r.observation
    plain = WebShopEnv()
    r = plain.reset(task(0))
    assert r.observation == "'Search'"  # the default stays verl-agent's text view


def test_observation_mode_is_checked():
    assert OBSERVATION_MODES == WEBSHOP_OBSERVATION_MODES == ("text", "text_rich")
    with pytest.raises(EnvError, match="observation_mode"):
        WebShopEnv(observation_mode="html")
    cfg = EnvConfig(name="webshop", webshop={"observation_mode": "url"})
    with pytest.raises(ConfigError, match="env.webshop.observation_mode"):
        check_env_config(cfg)  # the env registry runs WebShop's own check (serl.envs.webshop.options)
    check_env_config(EnvConfig(name="webshop", webshop={"observation_mode": "text_rich"}))
    c = load_config("webshop", ["env.webshop.observation_mode=text_rich"])
    assert WebShopEnv.config_kwargs(c.env)["observation_mode"] == "text_rich"


# ---------------------------------------------------------------------------- explicit prices
def test_explicit_price_upper_and_price_are_used_in_text_and_reward(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"0": {"price_upper": 12.5, "price": 14.95}, "1": {"price_upper": 1e6}}))
    env = WebShopEnv(task_prices=str(path))
    r = env.reset(task(0))
    assert r.task.endswith("size: 28\" x 28\", and price lower than 12.50 dollars")
    env.step(f"search[{INSTR0}]")
    env.step("click[b0743jkhbv]")
    env.step('click[28" x 28"]')
    r = env.step("click[buy now]")
    # all attributes and the option match; the $14.95 pillow is over the explicit $12.50 budget
    assert r.info["price_upper"] == 12.5 and r.info["price"] == 14.95
    d = r.info["reward_details"]
    assert r.info["task_score"] == pytest.approx(1.0 - d["w_price"]) and not r.won
    # the same purchase under the seeded budget ($50) scores 1.0
    seeded = WebShopEnv()
    seeded.reset(task(0))
    for a in (f"search[{INSTR0}]", "click[b0743jkhbv]", 'click[28" x 28"]'):
        seeded.step(a)
    assert seeded.step("click[buy now]").info["task_score"] == 1.0
    # price_upper >= 1e6: no price clause, as WebShop
    r = env.reset(task(1))
    assert "price lower than" not in r.task and env.price_upper == 1e6


def test_explicit_hidden_price_decides_the_price_term():
    env = WebShopEnv(task_prices={"0": {"price": 60.0}})  # inline mapping; budget drawn above $60
    r = env.reset(task(0))
    assert env.price_upper > 60.0 and f"lower than {env.price_upper:.2f} dollars" in r.task
    env2 = WebShopEnv(task_prices={"0": {"price_upper": 50.0, "price": 60.0}})
    env2.reset(task(0))
    for a in (f"search[{INSTR0}]", "click[b0743jkhbv]", 'click[28" x 28"]'):
        env2.step(a)
    r = env2.step("click[buy now]")
    assert r.info["price"] == 60.0 and r.info["task_score"] < 1.0  # the hidden $60 breaks the $50 budget


def test_bad_task_prices_are_clear_errors(tmp_path):
    with pytest.raises(EnvError, match="cannot read"):
        load_task_prices(str(tmp_path / "none.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EnvError, match="not valid JSON"):
        load_task_prices(str(bad))
    with pytest.raises(EnvError, match="price_upper"):
        load_task_prices({"0": {"price_upper": -1}})
    with pytest.raises(EnvError, match="price_upper' and/or 'price'"):
        load_task_prices({"0": {"budget": 10}})
    with pytest.raises(EnvError, match="must map task ids"):
        load_task_prices([1, 2])
    with pytest.raises(ConfigError, match="env.webshop.task_prices"):
        check_env_config(EnvConfig(name="webshop", webshop={"task_prices": str(tmp_path / "none.json")}))
    assert load_task_prices({"h2": {"price": 3}}) == {"h2": load_task_prices({"h2": {"price": 3.0}})["h2"]}
