"""AlfWorldEnv on the real TextWorld engine, with the fixture shipped in serl/data/alfworld.

A reset costs about 0.85 s (fast-downward translates the PDDL), so the tests share one env and
reset only a handful of games.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
from pathlib import Path

import pytest

from serl.envs.alfworld import (
    BANNER,
    TASK_TYPES,
    AlfWorldEnv,
    fixture_data_dir,
    resolve_data_dir,
    walkthrough,
)
from serl.envs.base import EnvError, Task, TextEnv, get_env_class

pytest.importorskip("textworld", reason="alfworld==0.4.2 is not installed")

REPO = Path(__file__).resolve().parents[1]
SHARED_CANDIDATES = [REPO.parent / "shared" / "data" / "alfworld", Path("/work/shared/data/alfworld")]
SHARED = next((p for p in SHARED_CANDIDATES if (p / "json_2.1.1").is_dir()), None)


@pytest.fixture(scope="module")
def env():
    e = AlfWorldEnv(data_dir=fixture_data_dir())
    yield e
    e.close()


@pytest.fixture(scope="module")
def unseen_tasks():
    return AlfWorldEnv.list_tasks("valid_unseen", data_dir=fixture_data_dir())


def test_registered_and_protocol():
    assert get_env_class("alfworld") is AlfWorldEnv
    e = AlfWorldEnv(max_steps=7)
    assert isinstance(e, TextEnv)
    assert e.name == "alfworld" and e.max_steps == 7


def test_fixture_has_two_games_per_type_in_each_split():
    for split in ("train", "valid_unseen"):
        tasks = AlfWorldEnv.list_tasks(split, data_dir=fixture_data_dir())
        counts = collections.Counter(t.task_type for t in tasks)
        assert set(counts) == set(TASK_TYPES), split
        assert all(n >= 2 for n in counts.values()), (split, counts)
        # deterministic, sorted, absolute game paths
        assert [t.task_id for t in tasks] == sorted(t.task_id for t in tasks)
        assert all(Path(t.task_id).is_absolute() and t.task_id.endswith("game.tw-pddl") for t in tasks)
        assert all(t.env_name == "alfworld" for t in tasks)
    # the licence notices travel with the data
    lic = (fixture_data_dir() / "LICENSE").read_text()
    assert "Copyright (c) 2019 ALFRED" in lic and "MIT License" in lic


def test_task_type_is_folder_prefix(unseen_tasks):
    for t in unseen_tasks:
        assert Path(t.task_id).parent.parent.name.startswith(t.task_type + "-")


def test_walkthrough_wins(env, unseen_tasks):
    # a pick_two game: the longest walkthroughs (9 steps) exercise the most engine actions
    task = next(t for t in unseen_tasks if t.task_type == "pick_two_obj_and_place")
    first = env.reset(task)
    assert not first.observation.startswith(BANNER) and BANNER not in first.observation
    assert first.observation.startswith("You are in the middle of a room.")
    assert first.task and first.observation.endswith("Your task is to: " + first.task)
    assert first.task.startswith("put two ") or first.task.startswith("find two ")
    assert first.reward == 0.0 and not first.done and not first.won and first.feedback == ""
    assert first.info["gamefile"] == task.task_id
    assert "look" in first.admissible_actions and "inventory" in first.admissible_actions

    plan = walkthrough(task)
    assert len(plan) >= 2
    for k, action in enumerate(plan):
        r = env.step(action)
        assert action in (first.admissible_actions if k == 0 else prev.admissible_actions)
        assert r.observation == r.feedback and r.feedback != "Nothing happens."
        assert r.task == first.task and r.info["gamefile"] == task.task_id
        prev = r
        if k < len(plan) - 1:
            assert not r.won and not r.done and r.reward == 0.0
    assert r.won and r.done and r.reward == 10.0
    with pytest.raises(EnvError, match="ended"):
        env.step("look")


def test_invalid_command_costs_a_step_and_max_steps_ends(unseen_tasks):
    e = AlfWorldEnv(max_steps=3, data_dir=fixture_data_dir())
    try:
        task = unseen_tasks[0]
        e.reset(task)
        r1 = e.step("put the moon in the fridge")
        assert r1.feedback == "Nothing happens." and r1.observation == "Nothing happens."
        assert not r1.done and r1.info["steps"] == 1 and r1.reward == 0.0
        r2 = e.step("look")
        assert not r2.done and r2.info["steps"] == 2
        r3 = e.step("")
        assert r3.feedback == "Nothing happens."
        assert r3.done and not r3.won and r3.reward == 0.0 and r3.info["steps"] == 3
        with pytest.raises(EnvError):
            e.step("look")
        # reset of the same game starts a fresh episode with the full step budget
        again = e.reset(task)
        assert not again.done and e.step("look").info["steps"] == 1
    finally:
        e.close()


def test_step_before_reset_raises():
    with pytest.raises(EnvError, match="reset"):
        AlfWorldEnv().step("look")


def test_missing_and_corrupt_game_files(env, unseen_tasks, tmp_path):
    missing = tmp_path / "json_2.1.1" / "valid_unseen" / "x-y" / "trial_1" / "game.tw-pddl"
    with pytest.raises(EnvError, match="not found") as ei:
        env.reset(Task("alfworld", str(missing), "x"))
    assert str(missing) in str(ei.value) and "serl data download alfworld" in str(ei.value)

    garbage = tmp_path / "garbage.tw-pddl"
    garbage.write_text("{this is not json")
    with pytest.raises(EnvError, match="not valid JSON") as ei:
        env.reset(Task("alfworld", str(garbage), "x"))
    assert str(garbage) in str(ei.value)

    # valid JSON with a broken PDDL problem: TextWorld's parser fails inside load
    good = json.loads(Path(unseen_tasks[0].task_id).read_text())
    good["pddl_problem"] = "(define (problem broken"
    broken = tmp_path / "broken.tw-pddl"
    broken.write_text(json.dumps(good))
    with pytest.raises(EnvError, match="could not be loaded") as ei:
        env.reset(Task("alfworld", str(broken), "x"))
    assert str(broken) in str(ei.value)
    # the failed load does not leave the previous game playable
    with pytest.raises(EnvError):
        env.step("look")

    with pytest.raises(EnvError, match="not found"):
        walkthrough(tmp_path / "nothing.tw-pddl")
    no_plan = tmp_path / "no_plan.tw-pddl"
    no_plan.write_text(json.dumps({k: v for k, v in good.items() if k != "walkthrough"}))
    with pytest.raises(EnvError, match="no 'walkthrough'"):
        walkthrough(no_plan)
    with pytest.raises(EnvError, match="webshop"):
        env.reset(Task("webshop", "3", "webshop"))


def test_env_recovers_after_corrupt_file(env, unseen_tasks, tmp_path):
    bad = tmp_path / "bad.tw-pddl"
    bad.write_text(json.dumps({"pddl_domain": "x", "grammar": "y", "pddl_problem": "z"}))
    with pytest.raises(EnvError):
        env.reset(Task("alfworld", str(bad), "x"))
    task = unseen_tasks[1]
    # a task id relative to the env's data_dir works too
    rel = os.path.relpath(task.task_id, fixture_data_dir())
    r = env.reset(Task("alfworld", rel, task.task_type))
    assert r.info["gamefile"] == task.task_id and r.task
    assert r.observation.startswith("You are in the middle of a room.")


def test_list_tasks_missing_split_says_what_to_do(tmp_path):
    with pytest.raises(EnvError) as ei:
        AlfWorldEnv.list_tasks("valid_seen", data_dir=tmp_path)
    msg = str(ei.value)
    assert str(tmp_path / "json_2.1.1" / "valid_seen") in msg
    assert "serl data download alfworld" in msg and "--data-dir" in msg and "SERL_DATA" in msg


def test_list_tasks_skips_movable_and_sliced(tmp_path):
    src = Path(AlfWorldEnv.list_tasks("train", data_dir=fixture_data_dir())[0].task_id)
    for d in ("pick_and_place_simple-A-None-B-1", "pick_and_place_simple-A-None-B-1-movable", "pick_heat_then_place_in_recep-AppleSliced-None-B-2"):
        dst = tmp_path / "json_2.1.1" / "train" / d / "trial_T1" / "game.tw-pddl"
        dst.parent.mkdir(parents=True)
        shutil.copyfile(src, dst)
    tasks = AlfWorldEnv.list_tasks("train", data_dir=tmp_path)
    assert [Path(t.task_id).parent.parent.name for t in tasks] == ["pick_and_place_simple-A-None-B-1"]


def test_resolve_data_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("SERL_DATA", raising=False)
    assert resolve_data_dir(None) == fixture_data_dir()
    monkeypatch.setenv("SERL_DATA", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path.resolve()
    (tmp_path / "alfworld" / "json_2.1.1").mkdir(parents=True)  # serl data root layout
    assert resolve_data_dir(None) == (tmp_path / "alfworld").resolve()
    explicit = tmp_path / "other"
    assert resolve_data_dir(explicit) == explicit.resolve()
    assert AlfWorldEnv(data_dir=explicit).data_dir == explicit.resolve()


@pytest.mark.skipif(SHARED is None, reason="shared ALFWorld data not present (../shared/data/alfworld)")
def test_list_tasks_on_shared_data():
    tasks = AlfWorldEnv.list_tasks("valid_unseen", data_dir=SHARED)
    assert len(tasks) == 134
    counts = collections.Counter(t.task_type for t in tasks)
    # the ReAct paper's per-type valid_unseen counts
    assert counts == {
        "look_at_obj_in_light": 18,
        "pick_and_place_simple": 24,
        "pick_clean_then_place_in_recep": 31,
        "pick_cool_then_place_in_recep": 21,
        "pick_heat_then_place_in_recep": 23,
        "pick_two_obj_and_place": 17,
    }
    assert len(AlfWorldEnv.list_tasks("valid_seen", data_dir=SHARED)) == 140


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SERL_SLOW") != "1", reason="about 50 s; set SERL_SLOW=1 to run")
def test_every_fixture_game_is_won_by_its_walkthrough(env):
    """~2 s per game: replays all 24 fixture games (set ``SERL_SLOW=1``)."""
    for split in ("train", "valid_unseen"):
        for task in AlfWorldEnv.list_tasks(split, data_dir=fixture_data_dir()):
            env.reset(task)
            for action in walkthrough(task):
                r = env.step(action)
            assert r.won and r.done and r.reward == 10.0, task.task_id


def test_episode_metrics_by_hand():
    # serl eval prints these beside the success rate: steps to win, and how the lost games lost
    from serl.envs.alfworld import AlfWorldEnv, is_loop
    from serl.trajectory import Step, Trajectory

    def episode(actions, won=False):
        steps = [Step(step_id=i, observation="", prompt="", prompt_ids=[1], response_ids=[2], response_text=a,
                      action_mask=[1], action=a, action_valid=True, won=won and i == len(actions) - 1)
                 for i, a in enumerate(actions)]
        return Trajectory(uid="u", traj_uid=str(len(actions)), task=Task("alfworld", "g", "pick_and_place_simple"),
                          steps=steps)

    won = episode(["go to desk 1", "take pen 1 from desk 1", "go to shelf 1", "put pen 1 in/on shelf 1"], won=True)
    stuck = episode(["go to desk 1"] + ["take pen 1 from desk 1"] * 5)  # 6 steps, 2 distinct: a loop, 4 repeats
    wander = episode(["go to desk 1", "go to shelf 1", "go to bed 1", "go to desk 1", "open drawer 1",
                      "go to drawer 2", "look"])  # 7 steps, 6 distinct: no loop; 4 places gone to
    m = AlfWorldEnv.episode_metrics([won, stuck, wander])
    assert m["alfworld_steps_to_win"] == 4.0
    assert m["alfworld_loop_rate"] == 0.5
    assert m["alfworld_repeat_rate"] == 4 / 13
    assert m["alfworld_receptacles_visited"] == (1 + 4) / 2
    assert is_loop([s.action for s in stuck.steps]) and not is_loop(["a"] * 5)
    assert set(AlfWorldEnv.episode_metrics([won])) == {"alfworld_steps_to_win"}
    assert "alfworld_steps_to_win" not in AlfWorldEnv.episode_metrics([stuck])
    assert "alfworld_lost_saw_object" not in m  # task id "g" names no object


def test_lost_episodes_say_whether_they_saw_and_took_the_tasks_object():
    # where a lost game stopped on the way to its object: never saw it, saw it, picked it up
    from serl.envs.alfworld import AlfWorldEnv, target_object
    from serl.trajectory import Step, Trajectory

    game = "/d/json_2.1.1/valid_unseen/pick_heat_then_place_in_recep-Apple-None-Fridge-10/trial_T1/game.tw-pddl"
    assert target_object(game) == "apple"
    assert target_object(game.replace("Apple", "ButterKnife")) == "butterknife"
    assert target_object("g") is None and target_object("/d/x/some-folder/trial/game.tw-pddl") is None

    def lost(*feedback, gamefile=game):
        steps = [Step(step_id=i, observation="", prompt="", prompt_ids=[1], response_ids=[2], response_text="a",
                      action_mask=[1], action=f"a{i}", action_valid=True, feedback=f) for i, f in enumerate(feedback)]
        return Trajectory(uid="u", traj_uid=str(len(feedback)), task=Task("alfworld", gamefile, "heat"), steps=steps)

    blind = lost("You arrive at cabinet 1. On the cabinet 1, you see a pineapple 1.",  # "pineapple 1" is no apple
                 "You arrive at countertop 1. On the countertop 1, you see a applesauce 2, and a cup 1.")
    saw = lost("You arrive at countertop 1. On the countertop 1, you see a apple 3, and a cup 1.", "Nothing happens.")
    took = lost("You arrive at countertop 1. On the countertop 1, you see a apple 3.",
                "You pick up the apple 3 from the countertop 1.", "Nothing happens.")
    other = lost("You pick up the cup 1 from the countertop 1.", gamefile="g")  # names no object: left out
    m = AlfWorldEnv.episode_metrics([blind, saw, took, other])
    assert m["alfworld_lost_saw_object"] == 2 / 3
    assert m["alfworld_lost_took_object"] == 1 / 3
    assert m["alfworld_receptacles_visited"] == 0  # the other keys still count all four lost episodes


def test_state_metrics_count_the_opens_at_closed_places_and_the_takes_of_the_object():
    # the two decisions of a search, at the states where each is due (hand-counted below)
    from serl.envs.alfworld import AlfWorldEnv
    from serl.trajectory import Step, Trajectory

    game = "/d/json_2.1.1/valid_unseen/pick_heat_then_place_in_recep-Apple-None-Fridge-10/trial_T1/game.tw-pddl"

    def episode(*states, gamefile=game, won=False):  # states: (observation, admissible actions, action)
        steps = [Step(step_id=i, observation=o, prompt="", prompt_ids=[1], response_ids=[2], response_text=a,
                      action_mask=[1], action=a, action_valid=True, admissible_actions=allowed,
                      won=won and i == len(states) - 1) for i, (o, allowed, a) in enumerate(states)]
        return Trajectory(uid="u", traj_uid=str(len(states)), task=Task("alfworld", gamefile, "heat"), steps=steps)

    closed = "You arrive at cabinet 1. The cabinet 1 is closed."
    skip = episode(("You are in the middle of a room.", ["go to cabinet 1"], "go to cabinet 1"),
                   (closed, ["open cabinet 1", "go to cabinet 2"], "go to cabinet 2"),  # due, not opened
                   ("You arrive at cabinet 2. The cabinet 2 is closed.", ["open cabinet 2"], "open cabinet 2"),  # opened
                   ("You open the cabinet 2. In it, you see a apple 1.", ["take apple 1 from cabinet 2"], "look"))  # not taken
    found = episode(("You arrive at countertop 1. On the countertop 1, you see a apple 3.",
                     ["take apple 3 from countertop 1"], "take apple 3 from countertop 1"),  # taken
                    ("You arrive at cabinet 4. The cabinet 4 is closed.", ["open cabinet 4"], "go to fridge 1"),
                    won=True)  # the apple seen: the closed cabinet 4 is not due
    unlisted = episode((closed, [], "go to cabinet 2"))  # no admissible actions: counts for neither
    m = AlfWorldEnv.episode_metrics([skip, found, unlisted])
    assert m["alfworld_open_when_closed"] == 1 / 2
    assert m["alfworld_take_when_takeable"] == 1 / 2
    assert "alfworld_take_when_takeable" not in AlfWorldEnv.episode_metrics([unlisted])
    m = AlfWorldEnv.episode_metrics([episode((closed, ["open cabinet 1"], "open cabinet 1"), gamefile="g")])
    assert m["alfworld_open_when_closed"] == 1.0 and "alfworld_take_when_takeable" not in m  # "g" names no object
