"""ALFWorld's planner expert from any state (serl.envs.alfworld_expert), on the shipped fixture.

The game ``pick_and_place_simple-Book-None-CoffeeTable-229`` (train) is small enough to check by
hand: ``put a book in coffeetable``; book 1 lies on dresser 1 with creditcard 1, creditcard 2 and
television 1; its walkthrough is go to dresser 1, take book 1, go to coffeetable 1, move book 1.
One env is shared (a reset costs 0.4-1 s) and each plan costs about 0.05 s.
"""

from __future__ import annotations

import json

import pytest

from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir, walkthrough
from serl.envs.base import EnvError, Task

pytest.importorskip("textworld", reason="alfworld==0.4.2 is not installed")

import serl.envs.alfworld_expert as ae  # noqa: E402

BOOK_PLAN = ["go to dresser 1", "take book 1 from dresser 1", "go to coffeetable 1", "move book 1 to coffeetable 1"]


@pytest.fixture(scope="module")
def env():
    e = AlfWorldEnv(data_dir=fixture_data_dir())
    yield e
    e.close()


@pytest.fixture(scope="module")
def book_task() -> Task:
    return next(t for t in AlfWorldEnv.list_tasks("train", fixture_data_dir()) if "CoffeeTable-229" in t.task_id)


def _follow(env, r, limit=20):
    for _ in range(limit):
        if r.done:
            break
        r = env.step(env.expert_action())
    return r


def test_next_action_from_the_initial_state_is_admissible_and_following_it_wins(env, book_task):
    r = env.reset(book_task)
    plan = env.expert_plan()
    assert plan == BOOK_PLAN == walkthrough(book_task)
    assert plan[0] in r.admissible_actions and env.expert_action() == "go to dresser 1"
    searches = env.expert_stats.searches
    r = _follow(env, r)
    assert r.won and r.info["steps"] == 4
    assert env.expert_stats.searches == searches  # the plan was followed: no second search
    assert env.expert_plan() == []  # won: nothing left to do
    with pytest.raises(EnvError, match="already won"):
        env.expert_action()


def test_after_wrong_actions_it_replans_and_still_wins(env, book_task):
    r = env.reset(book_task)
    r = env.step("go to sofa 1")  # elsewhere
    assert env.expert_plan() == BOOK_PLAN
    r = env.step("go to dresser 1")
    r = env.step("take creditcard 1 from dresser 1")  # the wrong object: hands are full
    assert "creditcard 1" in r.observation
    plan = env.expert_plan()
    assert plan == ["move creditcard 1 to dresser 1"] + BOOK_PLAN[1:]
    assert plan[0] in r.admissible_actions
    r = _follow(env, r)
    assert r.won and r.info["steps"] == 3 + 4


def test_state_neutral_and_inadmissible_actions_keep_the_plan(env, book_task):
    r = env.reset(book_task)
    env.expert_plan()
    searches = env.expert_stats.searches
    r = env.step("jump")  # not admissible: Nothing happens
    r = env.step("look")
    r = env.step("go to dresser 1")
    r = env.step("examine dresser 1")
    assert env.expert_plan() == BOOK_PLAN[1:]
    assert env.expert_last_call.cached and env.expert_stats.searches == searches
    r = env.step("go to sofa 1")  # off the plan: searched again
    assert env.expert_plan() == BOOK_PLAN
    assert not env.expert_last_call.cached and env.expert_stats.searches == searches + 1


def test_no_plan_raises_a_clear_error_naming_the_game_and_state(env, book_task, monkeypatch):
    env.reset(book_task)
    env.step("go to sofa 1")
    # the sub-problem has no plan: the full problem's search answers (exact), and is counted
    monkeypatch.setattr(ae, "solve_relevant", lambda pddl_env: (None, 7))
    fallbacks = env.expert_stats.fallbacks
    assert env.expert_plan() == BOOK_PLAN
    assert env.expert_last_call.fallback and env.expert_stats.fallbacks == fallbacks + 1
    # neither has a plan: a PlannerError (an EnvError) naming the game and the actions taken
    env.step("go to armchair 1")
    monkeypatch.setattr(ae, "solve_full", lambda pddl_env: None)
    with pytest.raises(ae.PlannerError) as info:
        env.expert_plan()
    assert isinstance(info.value, EnvError)
    msg = str(info.value)
    assert "found no plan" in msg and book_task.task_id in msg and "['go to sofa 1', 'go to armchair 1']" in msg
    assert info.value.gamefile == book_task.task_id and info.value.actions == ["go to sofa 1", "go to armchair 1"]


def test_an_inadmissible_planned_command_is_an_error_not_a_look(env, book_task):
    env.reset(book_task)
    env._planner._remaining = ["fly to the moon"]  # as if the planner had planned it
    with pytest.raises(ae.PlannerError, match="'fly to the moon'.*is not admissible"):
        env.expert_action()


def test_a_translation_failure_is_a_planner_error(env, book_task, monkeypatch):
    env.reset(book_task)

    def broken(domain, problem):
        raise ValueError("malformed")

    monkeypatch.setattr(ae, "_translate", broken)
    with pytest.raises(ae.PlannerError, match="could not translate.*ValueError: malformed"):
        env.expert_plan()


def test_relevant_problem_keeps_the_goal_objects_and_drops_the_rest(env, book_task):
    env.reset(book_task)
    pddl_env = env._tw_env.unwrapped
    goal = ae.goal_formula(pddl_env._game_data["pddl_problem"])
    assert goal.startswith("(:goal") and goal.count("(") == goal.count(")")
    text, kept = ae.relevant_problem(list(pddl_env._pddl_state.facts), goal)
    names = {f.arguments[0].name for f in pddl_env._pddl_state.facts if f.name == "objecttype"}
    assert any("book" in n for n in names) and any("creditcard" in n for n in names)
    objects = text.split("(:objects", 1)[1].split(")", 1)[0]
    assert "- object" in objects and all("creditcard" not in ln for ln in objects.splitlines() if "- object" in ln)
    assert any(ln.startswith("book") and ln.endswith("- object") for ln in objects.splitlines())
    assert 0 < kept < len({a.name for f in pddl_env._pddl_state.facts for a in f.arguments})


def test_expert_planner_env_kwarg_labels_every_state_and_works_in_a_pool(book_task):
    from serl.envs.pool import EnvPool

    with pytest.raises(ValueError, match="expert must be"):
        AlfWorldEnv(expert="oracle")
    with EnvPool("alfworld", 1, 1, {"data_dir": str(fixture_data_dir()), "expert": "planner"}) as pool:
        (r,) = pool.reset([book_task])
        assert r.info["expert_plan"] == BOOK_PLAN
        (r,) = pool.step(["go to sofa 1"])
        assert r.info["expert_plan"] == BOOK_PLAN
        for action in BOOK_PLAN:
            (r,) = pool.step([action])
        assert r.won and "expert_plan" not in r.info  # the episode ended: no state to label


def test_cli_planner_expert_writes_rows(tmp_path, tiny_model_dir, capsys):
    from serl.cli import main
    from serl.rollout.expert import read_rows

    out = tmp_path / "planner.jsonl"
    rc = main(["data", "expert", "alfworld", f"model.path={tiny_model_dir}", "--split", "train", "--num-tasks", "2",
               "--seed", "4", "--expert", "planner", "--out", str(out)])
    assert rc == 0
    rows = read_rows(out)
    assert rows and all(r["won"] and r["action_admissible"] for r in rows)
    assert len({r["task_id"] for r in rows}) == 2
    by_game: dict[str, list[str]] = {}
    for r in rows:
        by_game.setdefault(r["task_id"], []).append(r["action"])
    for game, actions in by_game.items():  # from the initial state: as long as the walkthrough
        assert len(actions) == len(walkthrough(game)), game
    printed = capsys.readouterr().out
    assert "kept 2 episodes" in printed and "planner: " in printed and "2 searches (1.00 per task" in printed
    assert json.loads(out.read_text().splitlines()[0])["env"] == "alfworld"

    rc = main(["data", "expert", "webshop", f"model.path={tiny_model_dir}", "--expert", "planner",
               "--out", str(tmp_path / "ws.jsonl")])
    assert rc == 2 and "--expert is for alfworld" in capsys.readouterr().err
