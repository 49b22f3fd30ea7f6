"""WebShopEnv: pages and exact text (as princeton-nlp/WebShop@64fa2a5's text env), scripted
episodes, invalid actions, limits."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from serl.envs.base import EnvError, Task, TextEnv, get_env_class
from serl.envs.webshop import WebShopEnv, load_world
from serl.envs.webshop.catalog import hidden_price
from serl.envs.webshop.goals import priced_goal
from serl.envs.webshop.reward import get_reward

ROOT = Path(__file__).resolve().parents[1]
INSTR0 = ('Find me double sided, machine washable decorative pillows with printing technology with size: '
          '28" x 28", and price lower than 50.00 dollars')


def task(i: int, seed: int = 0) -> Task:
    return Task("webshop", str(i), "webshop", seed)


@pytest.fixture
def env():
    e = WebShopEnv()
    yield e
    e.close()


def test_registered_and_protocol(env):
    assert get_env_class("webshop") is WebShopEnv
    assert isinstance(env, TextEnv)
    assert env.name == "webshop" and env.max_steps == 15


def test_pages_render_exactly_as_webshop(env):
    """Strings captured from the original WebShop text env (goal 0, seed 0 happens to draw the same budget)."""
    r = env.reset(task(0))
    raw = r.info["raw_observation"]
    assert raw == f"WebShop [SEP] Instruction: [SEP] {INSTR0} [SEP] Search"
    assert r.task == INSTR0
    assert r.observation == "'Search'"
    assert r.admissible_actions == ["search[<your query>]"]
    assert r.info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert r.reward == 0.0 and not r.done and not r.won and r.feedback == ""

    r = env.step(f"search[{INSTR0}]")
    raw = r.info["raw_observation"]
    assert raw.startswith(f"Instruction: [SEP] {INSTR0} [SEP] Back to Search [SEP] Page 1 (Total results: 50) "
                          "[SEP] Next > [SEP] B0743JKHBV [SEP] Ambesonne Abstract Throw Pillow Cushion Cover, ")
    assert "Grey Purple [SEP] $14.95 [SEP] B" in raw
    assert r.observation.startswith("'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] 'Next >' [SEP] 'B0743JKHBV'")
    assert r.feedback == r.observation
    assert r.admissible_actions[:2] == ["click[back to search]", "click[next >]"]
    assert len(r.admissible_actions) == 12  # 2 buttons + 10 products
    assert not r.info["available_actions"]["has_search_bar"]

    r = env.step("click[next >]")
    assert "Page 2 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP] " in r.info["raw_observation"]
    assert r.admissible_actions[:3] == ["click[back to search]", "click[< prev]", "click[next >]"]
    r = env.step("click[< prev]")
    r = env.step("click[b0743jkhbv]")
    raw = r.info["raw_observation"]
    assert raw.startswith(f"Instruction: [SEP] {INSTR0} [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] "
                          '16" x 16" [SEP] 18 x 18-inch [SEP] ')
    assert raw.endswith('40" x 40" [SEP] Ambesonne Abstract Throw Pillow Cushion Cover, Geometric Composition with '
                        "Different Colored Squares Striped Dotted Rhombus, Decorative Square Accent Pillow Case, "
                        '16" X 16", Grey Purple [SEP] Price: $14.95 [SEP] Rating: N.A. [SEP] Description [SEP] '
                        "Features [SEP] Reviews [SEP] Buy Now")
    assert r.admissible_actions[:6] == ["click[back to search]", "click[< prev]", "click[description]",
                                        "click[features]", "click[reviews]", "click[buy now]"]
    assert 'click[28" x 28"]' in r.admissible_actions
    before = r.observation
    r = env.step('click[28" x 28"]')
    assert not r.info["invalid_action"]
    assert r.observation == before  # text mode never shows which option is selected (as WebShop)
    r = env.step("click[description]")
    assert r.info["raw_observation"].startswith(f"Instruction: [SEP] {INSTR0} [SEP] Back to Search [SEP] < Prev [SEP] ")
    assert r.admissible_actions == ["click[back to search]", "click[< prev]"]
    r = env.step("click[reviews]")
    assert r.info["invalid_action"]  # not clickable on a sub-page
    r = env.step("click[< prev]")
    assert r.info["page"] == "item"
    r = env.step("click[buy now]")
    assert r.done and r.won and r.reward == 10.0 and r.info["task_score"] == 1.0
    assert r.info["raw_observation"] == (
        'Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk interface.) [SEP] '
        'Purchased [SEP] asin [SEP] B0743JKHBV [SEP] options [SEP] {"size": "28\\" x 28\\""} [SEP] attrs [SEP] None '
        "[SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category [SEP] None [SEP] Target [SEP] asin "
        "[SEP] options [SEP] attrs [SEP] price upper [SEP] instuction text [SEP] category [SEP] product category "
        "[SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0 [SEP] "
        "Reward Details [SEP] None")
    assert r.observation == r.info["raw_observation"]  # no instruction on the done page: raw text
    assert r.admissible_actions == []
    assert r.info["purchased_asin"] == "B0743JKHBV" and r.info["purchased_options"] == {"size": '28" x 28"'}
    after = env.step("click[buy now]")
    assert after.done and after.reward == 0.0 and after.info["invalid_action"]


def _state(env):
    s = env.site.state
    return (s.page, s.keywords, list(s.results), s.page_num, s.asin, dict(s.options), set(s.visited))


INVALID = ["click[search]", "click[nothing here]", "search[]", "buy now", "", "CLICK[next >]", "click[]",
           "look around", "search [red]"]


def test_invalid_actions_change_nothing(env):
    env.reset(task(1))
    for setup in ([], ["search[red shirt]"], ["search[red shirt]", "click[next >]"]):
        env.reset(task(1))
        r0 = None
        for a in setup:
            r0 = env.step(a)
        if r0 is None:
            r0 = env.reset(task(1))
        for a in INVALID:
            st = _state(env)
            r = env.step(a)
            assert r.info["invalid_action"] is True, a
            assert r.info["invalid_reason"], a
            assert r.observation == r0.observation and r.info["raw_observation"] == r0.info["raw_observation"], a
            assert r.admissible_actions == r0.admissible_actions, a
            assert _state(env) == st, a
            assert r.reward == 0.0 and not r.done, a
    # on an item page a click on an asin of the results page is invalid too
    env.reset(task(1))
    r = env.step("search[red shirt]")
    asin = r.admissible_actions[2][len("click["):-1]
    env.step(f"click[{asin}]")
    r = env.step(f"click[{asin}]")
    assert r.info["invalid_action"]


def test_search_works_from_any_page_and_back_to_search_resets(env):
    env.reset(task(2))
    env.step("search[pillow]")
    r = env.step("click[next >]")
    asin = [a for a in r.admissible_actions if a.startswith("click[b")][0]
    r = env.step(asin)
    opts = [a for a in r.admissible_actions[6:]]
    if opts:
        env.step(opts[0])
    r = env.step("search[lamp]")  # no search bar shown here, still accepted (as WebShop)
    assert not r.info["invalid_action"] and r.info["page"] == "results"
    assert env.site.state.page_num == 1 and env.site.state.options == {} and env.site.state.asin is None
    r = env.step("click[back to search]")
    assert r.info["page"] == "start" and r.observation == "'Search'"
    assert env.site.state.keywords is None and env.site.state.visited == set()


def test_next_past_the_end_shows_an_empty_page(env):
    env.reset(task(3))
    for _ in range(5):
        r = env.step("click[next >]") if env.site.state.page == "results" else env.step("search[pillow cover]")
    r = env.step("click[next >]")
    raw = r.info["raw_observation"]
    assert raw.endswith("Back to Search [SEP] Page 6 (Total results: 50) [SEP] < Prev [SEP] Next >")
    assert r.admissible_actions == ["click[back to search]", "click[< prev]", "click[next >]"]


def test_prev_from_item_returns_to_the_same_results_page_and_clears_options(env):
    env.reset(task(0))
    env.step("search[pillow]")
    env.step("click[next >]")
    r = env.step("click[b07xtk3p89]") if "click[b07xtk3p89]" in env.site.admissible_actions() else \
        env.step([a for a in env.site.admissible_actions() if a.startswith("click[b")][0])
    first_opt = next((a for a in r.admissible_actions[6:]), None)
    if first_opt:
        env.step(first_opt)
        assert env.site.state.options
    r = env.step("click[< prev]")
    assert r.info["page"] == "results" and env.site.state.page_num == 2 and env.site.state.options == {}


def test_step_limit_truncates(env):
    env.reset(task(4))
    for i in range(14):
        r = env.step("click[nothing]")
        assert not r.done
    r = env.step("click[nothing]")
    assert r.done and r.info["truncated"] and not r.won and r.reward == 0.0 and r.info["task_score"] == 0.0
    short = WebShopEnv(max_steps=2)
    short.reset(task(4))
    assert not short.step("search[x]").done
    assert short.step("search[y]").done


def _find_and_buy(env, r, goal):
    """search the instruction, page to the target, open it, choose the goal options, buy."""
    r = env.step(f"search[{r.task}]")
    link = f"click[{goal.asin.lower()}]"
    for _ in range(4):
        if link in r.admissible_actions:
            break
        r = env.step("click[next >]")
    if link not in r.admissible_actions:  # not among the top 50: look it up by its title
        r = env.step(f"search[{env.world.catalog.by_asin[goal.asin].title}]")
    assert link in r.admissible_actions, goal.asin
    r = env.step(link)
    for value in goal.goal_options.values():
        r = env.step(f"click[{value}]")
        assert not r.info["invalid_action"], value
    return env.step("click[buy now]")


def test_scripted_episodes_win_every_oracle_goal_among_the_first_50(env):
    w = load_world()
    wins = 0
    for i in range(50):
        g = w.goals[i]
        pg = priced_goal(w.catalog, w.goals, i, 0)
        p = w.catalog.by_asin[g.asin]
        oracle, _ = get_reward(w.catalog, p, g, hidden_price(p, 0, i), pg.price_upper, dict(g.goal_options))
        r = env.reset(task(i))
        r = _find_and_buy(env, r, g)
        assert r.done and r.info["task_score"] == pytest.approx(oracle), i
        if oracle == 1.0:
            assert r.won and r.reward == 10.0, i
            wins += 1
        else:
            assert not r.won and r.reward == 0.0, i
    assert wins >= 45


def test_wrong_purchase_scores_less(env):
    r = env.reset(task(0))
    r = env.step("search[usb cable]")
    r = env.step(r.admissible_actions[2])
    r = env.step("click[buy now]")
    assert r.done and not r.won and r.reward == 0.0 and r.info["task_score"] < 1.0
    assert set(r.info["reward_details"]) >= {"r_type", "r_att", "w_att", "r_price", "w_price", "title_score"}


def test_kwargs_are_picklable_and_env_is_independent():
    kwargs = dict(max_steps=15, data_dir=None, human_goals=False, seed=0, show_attrs=False)
    assert pickle.loads(pickle.dumps(kwargs)) == kwargs
    a, b = WebShopEnv(**kwargs), WebShopEnv(**kwargs)
    assert a.world is b.world  # shared per process
    a.reset(task(5))
    b.reset(task(6))
    a.step("search[pillow]")
    assert b.site.state.page == "start"


def test_show_attrs_option(env):
    e = WebShopEnv(show_attrs=True)
    e.reset(task(0))
    r = e.step("search[pillow]")
    r = e.step(r.admissible_actions[2])
    assert "click[attributes]" in r.admissible_actions and "[SEP] Reviews [SEP] Attributes [SEP] Buy Now" in r.info["raw_observation"]
    r = e.step("click[attributes]")
    assert r.info["page"] == "attributes"


def test_bad_options_and_missing_data(tmp_path, monkeypatch):
    with pytest.raises(EnvError, match="human_goals"):
        WebShopEnv(human_goals="yes")
    with pytest.raises(EnvError, match="max_steps"):
        WebShopEnv(max_steps=0)
    with pytest.raises(EnvError, match=r"unknown env.webshop option\(s\) \['use_small'\]"):
        WebShopEnv(use_small=True)
    with pytest.raises(EnvError, match="use_small"):
        WebShopEnv.list_tasks("test", use_small=True)
    with pytest.raises(EnvError, match="holds no WebShop data"):
        WebShopEnv(data_dir=tmp_path)
    monkeypatch.setenv("SERL_WEBSHOP_DATA", str(tmp_path))
    with pytest.raises(EnvError, match="SERL_WEBSHOP_DATA"):
        WebShopEnv.list_tasks("test")
    monkeypatch.delenv("SERL_WEBSHOP_DATA")
    # a folder with a damaged products file
    (tmp_path / "webshop").mkdir()
    (tmp_path / "webshop" / "items_shuffle_1000.json.xz").write_bytes(b"not xz")
    with pytest.raises(EnvError, match="cannot read"):
        WebShopEnv(data_dir=tmp_path)
    # $SERL_DATA without WebShop data is ignored (e.g. an ALFWorld folder): shipped data is used
    monkeypatch.setenv("SERL_DATA", str(tmp_path / "elsewhere"))
    assert len(WebShopEnv.list_tasks("test")) == 500


def test_corrupt_shipped_file_is_reported(tmp_path, monkeypatch):
    from serl.envs.webshop import data as wsdata

    folder = tmp_path / "ship"
    folder.mkdir()
    src = wsdata.shipped_data_dir()
    for f in src.iterdir():
        if f.is_file():  # not __pycache__
            (folder / f.name).write_bytes(f.read_bytes())
    import lzma

    (folder / "items_ins_v2_1000.json.xz").write_bytes(lzma.compress(b'{"tampered": 1}'))
    monkeypatch.setattr(wsdata, "shipped_data_dir", lambda: folder)
    with pytest.raises(EnvError, match="corrupt"):
        wsdata.read_json(folder, wsdata.ATTRIBUTES_FILE)


def test_no_torch_import():
    code = ("import sys; from serl.envs.webshop import WebShopEnv; "
            "e = WebShopEnv(); from serl.envs.base import Task; e.reset(Task('webshop','0','webshop',0)); "
            "e.step('search[pillow]'); assert 'torch' not in sys.modules, 'torch imported'")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(ROOT), timeout=120)


def test_episode_is_deterministic(env):
    def play():
        out = []
        r = env.reset(task(7, seed=3))
        for a in ["search[<r>]", "click[next >]", "search[shoes]", "click[next >]"]:
            r = env.step(a)
            out.append(copy.deepcopy(r.observation))
        return r.task, out

    assert play() == play()
