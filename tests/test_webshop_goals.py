"""WebShop goals (WebShop's get_goals): generation, the seed-233 order, splits, seeded price clauses."""

from __future__ import annotations

from pathlib import Path

import pytest

from serl.envs.base import EnvError, Task
from serl.envs.webshop import WebShopEnv, load_world
from serl.envs.webshop.catalog import hidden_price
from serl.envs.webshop.data import read_jsonl
from serl.envs.webshop.goals import NO_BUDGET, PRICE_RANGE, price_clause, priced_goal, split_indices

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def world():
    return load_world()


def test_goal_list_equals_fixture_all_6910_in_order(world):
    fx = read_jsonl(FIXTURES / "webshop_synthetic_goals_seed233.jsonl.xz")
    assert len(fx) == 6910
    assert len(world.goals) == 6910
    for f, g in zip(fx, world.goals):
        assert f["asin"] == g.asin, f["idx"]
        assert f["instruction_text_without_price"] == g.base_text, f["idx"]
        assert f["attributes"] == list(g.attributes), f["idx"]
        assert f["goal_options"] == g.goal_options, f["idx"]


def test_first_goal_text(world):
    g = world.goals[0]
    assert g.asin == "B0743JKHBV"
    assert g.base_text == ('Find me double sided, machine washable decorative pillows with printing technology '
                           'with size: 28" x 28"')
    assert g.goal_options == {"size": '28" x 28"'}


def test_splits_are_webshops_fixed_split():
    test = WebShopEnv.list_tasks("test")
    train = WebShopEnv.list_tasks("train")
    assert [t.task_id for t in test] == [str(i) for i in range(500)]
    assert [t.task_id for t in train] == [str(i) for i in range(500, 6910)]
    assert all(t.task_type == "webshop" and t.env_name == "webshop" and t.seed == 0 for t in test + train)
    assert {t.seed for t in WebShopEnv.list_tasks("test", seed=7)} == {7}
    assert len(WebShopEnv.list_tasks("all")) == 6910
    with pytest.raises(EnvError, match="unknown WebShop split"):
        WebShopEnv.list_tasks("valid_unseen")
    assert list(split_indices("test", 10)) == list(range(10))


def test_human_goals(world):
    assert len(world.human_goals) == 13
    tasks = WebShopEnv.list_tasks("test", human_goals=True)
    assert [t.task_id for t in tasks] == [f"h{i}" for i in range(13)]
    with pytest.raises(EnvError, match="no human goals"):
        WebShopEnv.list_tasks("train", human_goals=True)
    g = world.human_goals[0]
    assert isinstance(g.goal_options, list) and g.human and not g.base_text.endswith(".")
    env = WebShopEnv()
    r = env.reset(tasks[0])
    assert r.task.startswith(g.base_text)


def test_price_clause_rule_and_seeding(world):
    cat = world.catalog
    for i in range(200):
        g = world.goals[i]
        p = cat.by_asin[g.asin]
        upper, text = price_clause(p, 0, i)
        assert (upper, text) == price_clause(p, 0, i)  # deterministic
        price = hidden_price(p, 0, i)
        if upper == NO_BUDGET:
            assert text == "" and price >= 980
            continue
        above = [x for x in PRICE_RANGE if x > price][:4]
        assert upper in above[1:]  # the larger of two distinct draws is never the smallest candidate
        assert text == f", and price lower than {upper:.2f} dollars"
    # different seeds give different budgets for some goals
    diffs = sum(price_clause(cat.by_asin[world.goals[i].asin], 0, i) != price_clause(cat.by_asin[world.goals[i].asin], 1, i)
                for i in range(100))
    assert diffs > 20


def test_hidden_price_of_range_products_is_seeded_and_inside_the_range(world):
    ranged = [p for p in world.catalog.products if len(p.pricing) == 2]
    assert len(ranged) == 93
    p = ranged[0]
    draws = {hidden_price(p, s, 5) for s in range(20)}
    assert len(draws) > 10
    assert all(p.pricing[0] <= d <= p.pricing[1] for d in draws)
    assert hidden_price(p, 3, 5) == hidden_price(p, 3, 5)


def test_instruction_of_a_task_is_base_text_plus_price_clause(world):
    env = WebShopEnv()
    r = env.reset(Task("webshop", "0", "webshop", 0))
    pg = priced_goal(world.catalog, world.goals, 0, 0)
    assert r.task == pg.instruction_text
    assert r.task.startswith(world.goals[0].base_text + ", and price lower than ")
    assert r.info["goal_index"] == 0
    # the same task always renders the same instruction; another seed may change the budget only
    assert env.reset(Task("webshop", "0", "webshop", 0)).task == r.task
    assert env.reset(Task("webshop", "0", "webshop", 5)).task.startswith(world.goals[0].base_text)


def test_bad_task_ids():
    env = WebShopEnv()
    with pytest.raises(EnvError, match="out of range"):
        env.reset(Task("webshop", "6910", "webshop", 0))
    with pytest.raises(EnvError, match="bad WebShop task id"):
        env.reset(Task("webshop", "abc", "webshop", 0))
    with pytest.raises(EnvError, match="not webshop"):
        env.reset(Task("alfworld", "0", "webshop", 0))
