"""ALFWorld's planner expert made to search (serl.envs.alfworld_experts.search, `serl data expert
--expert search`): one search step and the choice between search and planner by hand (a fake
planner), and through the real engine on the shipped train games: every episode is won with admissible actions,
episodes are longer than the walkthroughs (the search), and before the first take no place is gone
to twice."""

from __future__ import annotations

import json
import random
import re

import pytest

from serl.envs.alfworld import fixture_data_dir, walkthrough
from serl.envs.alfworld_experts.search import AlfWorldSearchExpert, search_step
from serl.rollout.expert import collect_expert, make_expert, play_expert

ADMISSIBLE = ["go to cabinet 1", "go to countertop 1", "go to drawer 2", "open drawer 1", "inventory", "look"]


def test_search_step_opens_where_it_stands_else_goes_somewhere_new():
    seen = "You are in the middle of a room.\nYou arrive at drawer 1. The drawer 1 is closed."
    assert search_step(seen, ADMISSIBLE, random.Random(0)) == "open drawer 1"
    # drawer 1 is open now (no "open drawer 1" listed): go to a receptacle not arrived at
    seen2 = seen + "\nYou arrive at cabinet 1. On the cabinet 1, you see nothing."
    admissible = [a for a in ADMISSIBLE if not a.startswith("open ")]
    draws = {search_step(seen2, admissible, random.Random(s)) for s in range(40)}
    assert draws == {"go to countertop 1", "go to drawer 2"}  # never cabinet 1, both others drawn
    # the draw depends on the seed, not on the list's order
    assert [search_step(seen2, admissible[::-1], random.Random(s)) for s in range(10)] == \
        [search_step(seen2, admissible, random.Random(s)) for s in range(10)]
    everywhere = seen2 + "\nYou arrive at countertop 1.\nYou arrive at drawer 2."
    assert search_step(everywhere, admissible, random.Random(0)) is None


def test_search_step_in_list_order_goes_to_the_first_place_not_visited():
    seen = "You are in the middle of a room.\nYou arrive at drawer 1. The drawer 1 is closed."
    places = ["drawer 2", "drawer 1", "countertop 1", "cabinet 1"]
    assert search_step(seen, ADMISSIBLE, random.Random(0), places) == "open drawer 1"  # opening comes first
    admissible = [a for a in ADMISSIBLE if not a.startswith("open ")]
    assert {search_step(seen, admissible, random.Random(s), places) for s in range(20)} == {"go to drawer 2"}
    seen2 = seen + "\nYou arrive at drawer 2. On the drawer 2, you see nothing."
    assert search_step(seen2, admissible, random.Random(0), places) == "go to countertop 1"  # drawer 1 visited
    assert search_step(seen2, admissible, random.Random(0), places[::-1]) == "go to cabinet 1"  # the order is the list's
    assert search_step(seen2 + "\nYou arrive at countertop 1.\nYou arrive at cabinet 1.", admissible,
                       random.Random(0), places) is None
    # drawer 2's neighbour has no go to there: opened where the agent stands, then counted as visited
    beside = ["go to countertop 1", "open drawer 3", "look"]
    assert search_step(seen2, beside, random.Random(0), ["drawer 3", "countertop 1"]) == "open drawer 3"
    opened = seen2 + "\nYou open the drawer 3. The drawer 3 is open. In it, you see nothing."
    assert search_step(opened, ["go to countertop 1", "go to drawer 3"], random.Random(0),
                       ["drawer 3", "countertop 1"]) == "go to countertop 1"


class _FakeEnv:
    def __init__(self, plan):
        self.plan = plan

    def expert_plan(self):
        return list(self.plan)


def test_act_searches_only_where_the_planner_fetches_an_unseen_object(train_tasks):
    from serl.envs.base import StepResult

    def state(obs, admissible):
        return StepResult(observation=obs, reward=0.0, done=False, won=False, admissible_actions=admissible,
                          task="Your task is to: put some apple on drawer 2.", info={})

    env = _FakeEnv(["go to cabinet 1", "take apple 1 from cabinet 1", "go to drawer 2", "move apple 1 to drawer 2"])
    expert = make_expert(train_tasks[0], 0, "search")
    closed = state("You arrive at drawer 1. The drawer 1 is closed.", ADMISSIBLE)
    think, action = expert.act(env, closed, 0)
    assert action == "open drawer 1" and action in think and expert.searches == 1  # not the planner's guess
    found = state("You open the drawer 1. The drawer 1 is open. In it, you see nothing.", ADMISSIBLE[:3])
    # somewhere not arrived at (cabinet 1 too: the search draws it, the planner's reason does not count)
    assert expert.act(env, found, 1)[1] in ("go to cabinet 1", "go to countertop 1", "go to drawer 2")
    assert expert.searches == 2
    named = state("You arrive at countertop 1. On the countertop 1, you see a apple 2.", ADMISSIBLE[:3])
    assert expert.act(env, named, 2)[1] in ("go to cabinet 1", "go to drawer 2")  # apple 1 still unseen
    env.plan = ["go to cabinet 1", "take apple 2 from cabinet 1"]  # the planner fetches the apple it saw
    assert expert.act(env, named, 3)[1] == "go to cabinet 1" and expert.searches == 3
    env.plan = ["go to drawer 2", "move apple 2 to drawer 2"]  # not a fetch: the planner's action
    assert expert.act(env, state("You pick up the apple 2.", ADMISSIBLE), 4)[1] == "go to drawer 2"
    env.plan = []
    assert expert.act(env, named, 5) is None  # won


def test_sweep_follows_the_first_turns_list_and_says_so(train_tasks):
    from serl.envs.base import StepResult
    from serl.envs.alfworld_experts.search import AlfWorldSearchExpert

    def state(obs, admissible):
        return StepResult(observation=obs, reward=0.0, done=False, won=False, admissible_actions=admissible,
                          task="Your task is to: put some apple on drawer 2.", info={})

    env = _FakeEnv(["go to cabinet 1", "take apple 1 from cabinet 1", "go to drawer 2", "move apple 1 to drawer 2"])
    first = ["go to drawer 2", "go to countertop 1", "go to cabinet 1", "inventory", "look"]
    sweeps = [make_expert(train_tasks[0], seed, "sweep") for seed in range(3)]
    for expert in sweeps:
        think, action = expert.act(env, state("You are in the middle of a room.", first), 0)
        assert action == "go to drawer 2"  # the list's first, whatever the seed
        assert think == "I have not seen an apple yet; drawer 2 is the first place on the list I have not been to."
    # a later turn's list in another order does not change the sweep's order
    later = state("You arrive at drawer 2. On the drawer 2, you see nothing.", sorted(first))
    assert sweeps[0].act(env, later, 1)[1] == "go to countertop 1" and sweeps[0].searches == 2
    env.plan = ["go to drawer 2", "move apple 1 to drawer 2"]  # not a fetch: the planner's action
    assert sweeps[0].act(env, later, 2)[1] == "go to drawer 2" and sweeps[0].searches == 2
    with pytest.raises(ValueError, match="search order"):
        AlfWorldSearchExpert(train_tasks[0], 0, lambda *a: "", order="prior")


def test_state_think_names_what_the_agent_sees():
    from serl.envs.alfworld_experts.search import state_think

    fetch = ["go to countertop 2", "open countertop 2", "take mug 1 from countertop 2", "go to shelf 1"]
    cases = [
        (("go to cabinet 3", fetch, "apple"), "I have not seen an apple yet; cabinet 3 is the first place on the list I have not been to."),
        (("open cabinet 3", fetch, "mug"), "The cabinet 3 is closed and I have not seen a mug yet, so I open it."),
        (("open fridge 1", ["open fridge 1", "cool mug 1 with fridge 1"], None), "The fridge 1 is closed, so I open it."),
        (("take mug 1 from countertop 2", fetch[2:], None), "The mug 1 is here, so I take it."),
        (("use desklamp 1", ["use desklamp 1"], None), "The desklamp 1 is here, so I use it."),
        (("go to countertop 2", fetch, None), "I saw the mug 1 at the countertop 2, so I go there."),  # past the open
        (("go to microwave 1", ["go to microwave 1", "heat mug 1 with microwave 1"], None),
         "I have the mug 1, so I go to the microwave 1 to heat it."),
        (("go to shelf 1", ["go to shelf 1", "move mug 1 to shelf 1"], None), "I have the mug 1, so I go to the shelf 1 to put it there."),
        (("go to shelf 1", ["go to shelf 1"], None), "I go to the shelf 1."),
        (("clean mug 1 with sinkbasin 1", [], None), "I have the mug 1 and I am at the sinkbasin 1, so I clean it."),
        (("move mug 1 to shelf 1", [], None), "I have the mug 1 and I am at the shelf 1, so I put it there."),
        (("close fridge 1", [], None), "The next step is to close fridge 1."),
        # a go to that is not the plan's first action has no purpose read off the plan
        (("go to countertop 2", ["go to shelf 1", "take mug 1 from shelf 1"], None), "I go to the countertop 2."),
    ]
    for (action, plan, searching), want in cases:
        assert state_think(action, plan, searching) == want, action
    assert state_think("go to countertop 2", fetch, seen=False) == "I have not found a mug; I go to the countertop 2."


def test_sweep_with_state_think_says_what_it_sees_at_every_reply(train_tasks):
    from serl.envs.base import EnvError, StepResult

    def state(obs, admissible):
        return StepResult(observation=obs, reward=0.0, done=False, won=False, admissible_actions=admissible,
                          task="Your task is to: put some apple on drawer 2.", info={})

    env = _FakeEnv(["go to cabinet 1", "take apple 1 from cabinet 1", "go to drawer 2", "move apple 1 to drawer 2"])
    expert = make_expert(train_tasks[0], 0, "sweep", think="state")
    first = ["go to drawer 1", "go to countertop 1", "go to cabinet 1", "inventory", "look"]
    assert expert.act(env, state("You are in the middle of a room.", first), 0) == (
        "I have not seen an apple yet; drawer 1 is the first place on the list I have not been to.", "go to drawer 1")
    assert expert.act(env, state("You arrive at drawer 1. The drawer 1 is closed.", first + ["open drawer 1"]), 1) == (
        "The drawer 1 is closed and I have not seen an apple yet, so I open it.", "open drawer 1")
    arrive = state("You arrive at cabinet 1. On the cabinet 1, you see a apple 1.", first + ["take apple 1 from cabinet 1"])
    env.plan = env.plan[1:]  # the planner's own action from here: the apple is in sight
    assert expert.act(env, arrive, 2) == ("The apple 1 is here, so I take it.", "take apple 1 from cabinet 1")
    env.plan = env.plan[1:]
    assert expert.act(env, state("You pick up the apple 1.", first), 3) == (
        "I have the apple 1, so I go to the drawer 2 to put it there.", "go to drawer 2")
    assert expert.searches == 2
    # the task templates are the default: the open's reasoning names the task, not the closed drawer
    task_think = make_expert(train_tasks[0], 0, "sweep")
    env.plan = ["go to cabinet 1", "take apple 1 from cabinet 1"]
    task_think.act(env, state("You are in the middle of a room.", first), 0)
    think, action = task_think.act(env, state("You arrive at drawer 1. The drawer 1 is closed.", first + ["open drawer 1"]), 1)
    assert action == "open drawer 1" and "closed" not in think and "put some apple on drawer 2" in think
    with pytest.raises(EnvError, match="'state'"):
        make_expert(train_tasks[0], 0, "planner", think="state")
    with pytest.raises(ValueError, match="think mode"):
        AlfWorldSearchExpert(train_tasks[0], 0, lambda *a: "", order="random", think_mode="state")


def test_sweep_wins_the_shipped_games_going_down_the_list(alf_env, train_tasks, tokenizer):
    rows, summary = collect_expert(alf_env, train_tasks, tokenizer, history_length=2, max_prompt_length=8000,
                                   max_steps=50, seed=0, expert="sweep", prompt_layout="conversation",
                                   turn_actions="state")
    assert summary.won >= len(train_tasks) - 1 and summary.won == len(rows)
    swept = 0
    for row in rows:
        turns, actions = _turns(row), row["actions"]
        places = re.findall(r"'go to ([^']+)'", turns[0][0])  # the first turn's admissible list
        assert places, turns[0][0]
        sweep = [re.sub(r"^(go to|open) ", "", a) for a, (_, reply) in zip(actions, turns)
                 if "first place on the list" in reply]
        # each sweep step went to the first listed place not arrived at before it
        for place in sweep:
            assert place in places
        positions = [places.index(p) for p in sweep]
        assert positions == sorted(positions), (row["task_id"], sweep)
        swept += bool(sweep)
    assert swept >= len(rows) // 2


def test_search_draws_do_not_depend_on_where_the_data_lies(train_tasks):
    from dataclasses import replace

    from serl.envs.base import StepResult

    task = train_tasks[0]
    moved = replace(task, task_id="/elsewhere/ci/json_2.1.1/train/" + task.key)
    assert moved.key == task.key == "/".join(task.task_id.split("/")[-3:]) and moved.task_id != task.task_id
    assert replace(task, env_name="webshop", task_id="17").key == "17"
    env = _FakeEnv(["go to cabinet 1", "take apple 1 from cabinet 1"])
    start = StepResult(observation="You are in the middle of a room.", reward=0.0, done=False, won=False,
                       admissible_actions=["go to cabinet 1", "go to countertop 1", "go to drawer 1",
                                           "go to drawer 2", "go to shelf 1"],
                       task="Your task is to: put some apple on drawer 2.", info={})
    draws = lambda t: [make_expert(t, seed, "search").act(env, start, 0)[1] for seed in range(12)]  # noqa: E731
    assert draws(moved) == draws(task) and len(set(draws(task))) > 1


def _turns(row):
    m = row["messages"]
    return [(m[i]["content"], m[i + 1]["content"]) for i in range(0, len(m), 2)]


def test_search_expert_wins_every_shipped_game_and_searches(alf_env, train_tasks, tokenizer):
    rows, summary = collect_expert(alf_env, train_tasks, tokenizer, history_length=2, max_prompt_length=8000,
                                   max_steps=50, seed=3, expert="search", prompt_layout="conversation",
                                   turn_actions="state")
    assert summary.won == summary.tasks == len(train_tasks) == len(rows)
    longer = 0
    for task, row in zip(train_tasks, rows):
        turns, actions = _turns(row), row["actions"]
        assert all(row["action_admissible"]) and all("weight" not in m for m in row["messages"])
        for t, action in enumerate(actions):
            m = re.match(r"^take (.+) from (.+)$", actions[t + 1] if t + 1 < len(actions) else "")
            if action.startswith("go to ") and m and action == f"go to {m.group(2)}":
                # went to R and took obj there: obj was named in an earlier turn, or R is a place the
                # search had not been to (it found obj there); never a return to fetch an unseen obj
                named = "\n".join(text for text, _ in turns[: t + 1])
                seen = re.search(rf"(?<!\w){re.escape(m.group(1))}(?!\d)", named)
                assert seen or f"You arrive at {m.group(2)}." not in named, (task.task_id, t, action)
        first_take = next(t for t, a in enumerate(actions) if a.startswith("take "))
        goes = [a for a in actions[:first_take] if a.startswith("go to ")]
        assert len(goes) == len(set(goes)), (task.task_id, goes)  # a search goes to each place once
        longer += len(actions) > len(walkthrough(task))
    assert longer >= len(train_tasks) // 2  # it searches where the walkthrough goes straight there


def test_search_expert_is_deterministic_per_seed(alf_env, train_tasks, tokenizer):
    task = next(t for t in train_tasks if t.task_type == "pick_clean_then_place_in_recep")
    play = lambda seed: play_expert(alf_env, task, make_expert(task, seed, "search"), tokenizer, 2, 8000, 50,  # noqa: E731
                                    prompt_layout="conversation")
    a, b, c = play(1), play(1), play(2)
    assert a.won and a.rows == b.rows
    assert [r["actions"] for r in a.rows] != [r["actions"] for r in c.rows]  # the search order is the seed's
    assert isinstance(make_expert(task, 0, "search"), AlfWorldSearchExpert)


def test_cli_search_expert(tmp_path, tiny_model_dir, capsys):
    from serl.cli import main

    out = tmp_path / "s.jsonl"
    rc = main(["data", "expert", "alfworld", f"model.path={tiny_model_dir}", "env.prompt_layout=conversation",
               "--num-tasks", "2", "--seed", "4", "--expert", "search", "--data-dir", str(fixture_data_dir()),
               "--out", str(out)])
    assert rc == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["won"] for r in rows)
    assert "planner: " in capsys.readouterr().out
    assert main(["data", "expert", "alfworld", "--expert", "search", "--detours", "0.5",
                 "--out", str(tmp_path / "x.jsonl")]) != 0
    assert "--detours" in capsys.readouterr().err
    assert main(["data", "expert", "alfworld", "--expert", "search", "--think", "state",
                 "--out", str(tmp_path / "x.jsonl")]) != 0
    assert "--think state is for alfworld's sweep" in capsys.readouterr().err


def test_cli_sweep_with_state_think(tmp_path, tiny_model_dir):
    from serl.cli import main

    out = tmp_path / "s.jsonl"
    assert main(["data", "expert", "alfworld", f"model.path={tiny_model_dir}", "env.prompt_layout=conversation",
                 "--num-tasks", "1", "--seed", "4", "--expert", "sweep", "--think", "state",
                 "--data-dir", str(fixture_data_dir()), "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    assert row["won"] and len(replies) == len(row["actions"])
    templates = ("To ", "My task is to", "I need to")  # the task templates of serl.envs.alfworld_experts.ALFWORLD_THINK
    assert not any(r.startswith("<think>" + t) for r in replies for t in templates), replies
    for reply, action in zip(replies, row["actions"]):
        if action.startswith("open "):
            assert f"The {action[5:]} is closed" in reply
        if action.startswith("take "):
            assert f"The {action[5:].split(' from ')[0]} is here, so I take it." in reply


@pytest.mark.parametrize("name", ["searching", "Search"])
def test_unknown_expert_is_a_clear_error(train_tasks, name):
    from serl.envs.base import EnvError

    with pytest.raises(EnvError, match=r"valid: \[.*'search'.*\]"):  # listed among the valid experts
        make_expert(train_tasks[0], 0, name)
