"""DAgger rows (serl.rollout.dagger, `serl data dagger`): an episode played through the RL collector
with the planner asked at every state, labelled and turned into SFT rows whose rendering is the
collector's chat up to the mistake plus the expert's reply, the loss on that reply alone; the
step layout's rows, the `weight` key of conversation rows, env.alfworld's config check and the
command's output and errors."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from serl.agent.tool_chat import render_sft_conversation
from serl.cli import main as serl_main
from serl.configure import check_config, load_config
from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir, walkthrough
from serl.envs.alfworld_experts.walkthrough import ALFWORLD_THINK, task_phrase
from serl.envs.base import Task
from serl.envs.pool import EnvPool
from serl.errors import ConfigError, SerlError
from serl.rollout.collector import Collector
from serl.rollout.dagger import (LABEL_MODES, DaggerSummary, dagger_rows, is_exploring, label_is_seen, labelled_states,
                                 receptacle_prior, search_action, state_plans, step_labels, sweep_action)
from serl.rollout.engine import SamplingParams
from serl.rollout.expert import format_response
from serl.train.sft_data import read_rows
from serl.trajectory import Step, Trajectory, write_jsonl


class ScriptedEngine:
    """Replies with given texts (plus <|im_end|>), one per prompt."""

    def __init__(self, tokenizer, replies):
        self.tok, self.replies = tokenizer, list(replies)

    def generate(self, prompts, params):
        return [self.tok(self.replies.pop(0), add_special_tokens=False).input_ids + [self.tok.eos_token_id]
                for _ in prompts]


def _reply(action: str) -> str:
    return format_response(ALFWORLD_THINK[0].format(task="x", action=action), action)


@pytest.fixture(scope="module")
def look_task():
    return next(t for t in AlfWorldEnv.list_tasks("train", fixture_data_dir()) if t.task_type == "look_at_obj_in_light")


@pytest.fixture(scope="module")
def played(tokenizer, look_task):
    """The walkthrough with one state-neutral mistake (``inventory``) at step 1, played in the
    conversation layout with the planner asked at every state."""
    plan = walkthrough(look_task)
    actions = [plan[0], "inventory", *plan[1:]]
    pool = EnvPool("alfworld", 1, 0, {"max_steps": 50, "data_dir": str(fixture_data_dir()), "expert": "planner"})
    try:
        col = Collector(pool, ScriptedEngine(tokenizer, [_reply(a) for a in actions]), tokenizer, "alfworld", 2, 50,
                        4096, "conversation", "state")
        traj = col.collect([look_task], 1, SamplingParams(max_new_tokens=64))[0].trajectories[0]
    finally:
        pool.close()
    return traj, plan


def test_the_collector_records_the_planners_plan_from_every_state(played):
    traj, plan = played
    assert traj.won and [s.action for s in traj.steps][:2] == [plan[0], "inventory"]
    assert len(traj.extra["expert_plan0"]) == len(plan)  # from the initial state: as long as the walkthrough
    plans = state_plans(traj)
    assert len(plans) == len(traj.steps) and plans[0] == traj.extra["expert_plan0"]
    assert plans[1] == plans[2] and len(plans[1]) == len(plan) - 1  # `inventory` changes nothing
    assert step_labels(traj) == [True, False] + [True] * (len(traj.steps) - 2)


def test_a_dagger_row_is_the_chat_up_to_the_mistake_and_the_experts_reply(played, tokenizer):
    traj, plan = played
    rows = dagger_rows(traj, rows_per_episode=3, seed=7)
    assert len(rows) == 1  # one wrong step
    row = rows[0]
    expert = state_plans(traj)[1][0]  # the planner's action (another instance of the object may cost the same as the walkthrough's)
    assert (row["source"], row["step"], row["policy_action"], row["expert_action"]) == ("dagger", 1, "inventory", expert)
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]
    assert row["messages"][1]["weight"] == 0 and "weight" not in row["messages"][3]
    reply = row["messages"][3]["content"]
    assert reply.endswith(f"<action>{expert}</action>") and task_phrase(traj.task_text) in reply
    assert any(reply.startswith("<think>" + t.split("{")[0]) for t in ALFWORLD_THINK)
    ids, mask = render_sft_conversation(tokenizer, row["messages"], [])
    s1 = traj.steps[1]
    assert ids[: len(s1.prompt_ids)] == s1.prompt_ids  # the collector's chat up to the mistake, token for token
    assert mask[: len(s1.prompt_ids)] == [0] * len(s1.prompt_ids)  # the policy's own reply is context
    target = tokenizer(reply, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    assert ids[len(s1.prompt_ids):] == target and mask[len(s1.prompt_ids):] == [1] * len(target)
    # the same seed picks the same reply; rows_per_episode=0 makes none
    assert dagger_rows(traj, rows_per_episode=3, seed=7) == rows and dagger_rows(traj, rows_per_episode=0) == []


def test_keep_won_keeps_the_episode_whole_with_every_reply_trained(played, tokenizer):
    traj, _ = played
    won = [r for r in dagger_rows(traj, rows_per_episode=0, keep_won=True)]
    assert len(won) == 1 and won[0]["source"] == "won" and won[0]["episode_won"]
    ids, mask = render_sft_conversation(tokenizer, won[0]["messages"], [])
    last = traj.steps[-1]
    assert ids == last.prompt_ids + last.response_ids
    sampled = [0] * len(ids)
    for s in traj.steps:
        sampled[len(s.prompt_ids): len(s.prompt_ids) + len(s.response_ids)] = [1] * len(s.response_ids)
    assert mask == sampled


def _step(i, action, plan, won=False, fmt="chat"):
    return Step(step_id=i, observation="", prompt=f"prompt {i}", prompt_ids=[1], response_ids=[2],
                response_text=f"reply {i}", action_mask=[1], action=action, action_valid=True, won=won, done=won,
                info={} if plan is None else {"expert_plan": plan}, prompt_format=fmt)


def _hand_traj(fmt="chat"):
    t = Trajectory(uid="g", traj_uid="t1", task=Task("alfworld", "game-1", "pick_and_place_simple"), task_text="put a pen on shelf")
    t.extra["expert_plan0"] = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1"]
    p1 = ["take pen 1 from desk 1", "go to shelf 1"]
    t.steps = [_step(0, "go to desk 1", p1, fmt=fmt), _step(1, "look", p1, fmt=fmt),  # right, wrong
               _step(2, "go to bed 1", ["go to desk 1", *p1], fmt=fmt),  # wrong
               _step(3, "go to desk 1", p1, fmt=fmt), _step(4, "inventory", p1, fmt=fmt)]  # right, wrong
    return t


def test_step_layout_rows_and_the_cap_per_episode():
    t = _hand_traj()
    assert step_labels(t) == [True, False, False, True, False]
    rows = dagger_rows(t, rows_per_episode=2, seed=0)
    assert len(rows) == 2 and rows[0]["step"] == 1  # the first mistake always, one more drawn from steps 2 and 4
    assert rows[1]["step"] in (2, 4)
    assert [r["step"] for r in dagger_rows(t, rows_per_episode=9)] == [1, 2, 4]
    r = rows[0]
    assert r["messages"] == [{"role": "user", "content": "prompt 1"}] and r["expert_action"] == "take pen 1 from desk 1"
    assert r["response"].endswith("<action>take pen 1 from desk 1</action>") and "put a pen on shelf" in r["response"]
    assert dagger_rows(t, rows_per_episode=2, keep_won=True) == rows  # lost: nothing more
    # the draw is the episode's, not its random traj_uid's: the same file gives the same rows
    other = _hand_traj()
    other.traj_uid = "another-uuid"
    picks = [[r["step"] for r in dagger_rows(x, rows_per_episode=2, seed=s)] for s in range(8) for x in (t, other)]
    assert picks[0::2] == picks[1::2] and {p[1] for p in picks} == {2, 4}
    summary = DaggerSummary()
    summary.add(t, rows)
    assert (summary.labelled, summary.right, summary.wrong, summary.rows["dagger"]) == (5, 2, 3, 2)
    assert summary.by_type == {"pick_and_place_simple": [1, 0, 5, 2]}
    with pytest.raises(ValueError, match="rows_per_episode"):
        dagger_rows(t, rows_per_episode=-1)
    math = _hand_traj(fmt="tool_chat")
    with pytest.raises(ValueError, match="prompt format"):
        dagger_rows(math)


def _search_traj():
    """A lost conversation episode of 'put a pen on shelf' (the pen is on the desk), by hand: the
    planner's plan from each state, and what each step is."""
    room = "You are in the middle of a room. Looking quickly around you, you see a bed 1, a desk 1, a drawer 1, and a shelf 1."
    go = ["go to bed 1", "go to desk 1", "go to drawer 1", "go to shelf 1"]
    fetch = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1", "move pen 1 to shelf 1"]
    steps = [  # (action, user turn, admissible actions, plan from the next state)
        ("go to bed 1", room, go, fetch),  # 0: a search, wrong only for the omniscient planner
        ("take pen 1 from bed 1", "You arrive at bed 1. On the bed 1, you see a pillow 1.", go, fetch),  # 1: not there
        ("go to drawer 1", "Nothing happens.", go, fetch),  # 2: a search again
        ("open drawer 1", "You arrive at drawer 1. The drawer 1 is closed.", go + ["open drawer 1"], fetch),  # 3: a search
        ("go to bed 1", "You open the drawer 1. In it, you see nothing.", go + ["close drawer 1"], fetch),  # 4: a revisit
        ("go to desk 1", "You arrive at bed 1. On the bed 1, you see a pillow 1.", go, fetch[1:]),  # 5: right
        ("go to drawer 1", "You arrive at desk 1. On the desk 1, you see a pen 1.", go + ["take pen 1 from desk 1"], fetch),
        ("go to shelf 1", "You arrive at drawer 1. The drawer 1 is open. In it, you see nothing.", go, fetch),  # 7: pen seen
    ]
    t = Trajectory(uid="g", traj_uid="s1", task=Task("alfworld", "game-3", "pick_and_place_simple"), task_text="put a pen on shelf")
    t.extra["expert_plan0"] = fetch
    t.steps = [Step(step_id=i, observation="", prompt=p, prompt_ids=[1], response_ids=[2], response_text=f"reply {i}",
                    action_mask=[1], action=a, action_valid=True, admissible_actions=adm, info={"expert_plan": nxt},
                    prompt_format="conversation") for i, (a, p, adm, nxt) in enumerate(steps)]
    return t


def test_seen_labels_drop_the_searches_only_the_planner_calls_wrong():
    t = _search_traj()
    assert step_labels(t) == [False, False, False, False, False, True, False, False]
    assert labelled_states(t, "all") == [0, 1, 2, 3, 4, 6, 7]
    # dropped: 0, 2, 3 (searches while the pen was unseen); kept: 1 (a take of what is not there),
    # 4 (a revisit), 6 (leaving the pen it sees), 7 (a search, but the pen was seen: go back for it)
    assert labelled_states(t, "seen") == [1, 4, 6, 7]
    rows = dagger_rows(t, rows_per_episode=9, labels="seen")
    assert [(r["step"], r["policy_action"], r["expert_action"]) for r in rows] == [
        (1, "take pen 1 from bed 1", "go to desk 1"), (4, "go to bed 1", "go to desk 1"),
        (6, "go to drawer 1", "take pen 1 from desk 1"), (7, "go to shelf 1", "go to desk 1")]
    assert [m["content"] for m in rows[0]["messages"][::2]] == [t.steps[0].prompt, t.steps[1].prompt]
    summary = DaggerSummary()
    summary.add(t, rows, "seen")
    assert (summary.wrong, summary.eligible, summary.rows["dagger"]) == (7, 4, 4)
    seen = "You arrive at desk 1. On the desk 1, you see a pen 10."
    assert not label_is_seen(["go to desk 1", "take pen 1 from desk 1"], seen)  # pen 10 is not pen 1
    assert label_is_seen(["go to desk 1", "take pen 1 from desk 1"], seen.replace("pen 10", "pen 1."))
    assert not label_is_seen(["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1"], "")
    assert label_is_seen(["go to fridge 1", "open fridge 1", "move apple 1 to fridge 1"], "")  # in hand: to the goal
    assert label_is_seen(["take pen 1 from desk 1"], "") and label_is_seen(["go to shelf 1"], "")
    assert not is_exploring("open drawer 1", ["open drawer 1"], "You arrive at bed 1.")  # not where it stands
    assert not is_exploring("go to bed 2", ["go to bed 1"], "")  # inadmissible
    with pytest.raises(ValueError, match="labels must be one of"):
        labelled_states(t, "none")


def test_search_labels_replace_the_planners_guess_with_a_search():
    t = _search_traj()
    assert receptacle_prior([t]) == {"pen": Counter({"desk": 1})}  # the plan from the initial state
    prior = {"pen": Counter({"drawer": 2, "desk": 1, "shelf": 2})}  # less this game's own desk: 0
    rows = dagger_rows(t, rows_per_episode=9, labels="search", prior=prior)
    assert [(r["step"], r["expert_action"], r["label"]) for r in rows] == [
        (1, "go to drawer 1", "search"),  # at bed 1: drawer and shelf tie at 2, drawer first in the first turn's list
        (4, "go to shelf 1", "search"),  # bed 1 and drawer 1 searched: shelf (2) before desk (0)
        (6, "take pen 1 from desk 1", "planner"), (7, "go to desk 1", "planner")]  # the pen was seen
    assert rows[0]["messages"][-1]["content"].endswith("<action>go to drawer 1</action>")
    assert search_action(t, 3, prior) == "open drawer 1"  # standing at a closed drawer
    assert search_action(t, 6, prior) is None  # the plan's next action is no go to
    assert [r["expert_action"] for r in dagger_rows(t, rows_per_episode=9, labels="search")][:2] == [
        "go to desk 1", "go to desk 1"]  # no prior: the first unvisited in the first turn's list


def test_sweep_labels_go_down_the_first_turns_list_and_say_so():
    t = _search_traj()
    t.steps[0].admissible_actions = ["go to bed 1", "go to shelf 1", "go to drawer 1", "go to desk 1"]  # the sweep's order
    rows = dagger_rows(t, rows_per_episode=9, labels="sweep")
    assert [(r["step"], r["expert_action"], r["label"]) for r in rows] == [
        (1, "go to shelf 1", "sweep"),  # at bed 1: the list's next place, not the planner's desk (the pen unseen)
        (4, "go to shelf 1", "sweep"),  # bed 1 arrived at, drawer 1 opened: shelf 1 is still the next
        (6, "take pen 1 from desk 1", "planner"), (7, "go to desk 1", "planner")]  # the pen was seen
    assert rows[0]["messages"][-1]["content"] == format_response(
        "I have not seen a pen yet; shelf 1 is the first place on the list I have not been to.", "go to shelf 1")
    assert "first place on the list" not in rows[2]["messages"][-1]["content"]  # the planner's: its reasoning template
    assert sweep_action(t, 3) == (None, "open drawer 1")  # standing at a closed drawer: the caller's reasoning
    assert sweep_action(t, 6) is None  # the plan's next action is no go to
    t.steps[0].admissible_actions = ["go to bed 1"]  # every listed place visited: the planner's guess stands
    assert [r["label"] for r in dagger_rows(t, rows_per_episode=9, labels="sweep")] == ["planner"] * 4
    assert LABEL_MODES == ("all", "seen", "search", "sweep")
    # with the state's reasoning every row says what the agent sees
    t.steps[0].admissible_actions = ["go to bed 1", "go to shelf 1", "go to drawer 1", "go to desk 1"]
    replies = [r["messages"][-1]["content"] for r in dagger_rows(t, rows_per_episode=9, labels="sweep", think="state")]
    assert replies == [
        format_response("I have not seen a pen yet; shelf 1 is the first place on the list I have not been to.", "go to shelf 1"),
        format_response("I have not seen a pen yet; shelf 1 is the first place on the list I have not been to.", "go to shelf 1"),
        format_response("The pen 1 is here, so I take it.", "take pen 1 from desk 1"),
        format_response("I saw the pen 1 at the desk 1, so I go there.", "go to desk 1")]
    t.steps[0].admissible_actions = ["go to bed 1"]  # every listed place visited: the planner's guess, said as one
    assert dagger_rows(t, rows_per_episode=9, labels="sweep", think="state")[0]["messages"][-1]["content"] == \
        format_response("I have not found a pen; I go to the desk 1.", "go to desk 1")
    with pytest.raises(ValueError, match="'state' is for the sweep's labels"):
        dagger_rows(t, labels="seen", think="state")


def test_weight_key_of_conversation_rows(tmp_path):
    ok = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 0},
                       {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "weight": 1}]}
    for bad, where in [({"role": "assistant", "content": "d", "weight": 2}, 3),
                       ({"role": "assistant", "content": "d", "weight": True}, 3)]:
        row = json.loads(json.dumps(ok))
        row["messages"][where] = bad
        p = tmp_path / "bad.jsonl"
        p.write_text(json.dumps(row) + "\n")
        with pytest.raises(SerlError, match=r"messages\[3\].weight must be 0 or 1"):
            read_rows(p)
    row = json.loads(json.dumps(ok))
    row["messages"][0]["weight"] = 0
    p = tmp_path / "user.jsonl"
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(SerlError, match="on an assistant message only"):
        read_rows(p)
    p = tmp_path / "ok.jsonl"
    p.write_text(json.dumps(ok) + "\n")
    assert read_rows(p) == [ok]


def test_env_alfworld_options_are_checked_and_reach_the_env():
    cfg = load_config("cpu", ["env.alfworld.expert=planner"])
    check_config(cfg)
    assert AlfWorldEnv.config_kwargs(cfg.env)["expert"] == "planner"
    assert "expert" not in AlfWorldEnv.config_kwargs(load_config("cpu", []).env)
    with pytest.raises(ConfigError, match="env.alfworld.expert: must be null or one of"):
        check_config(load_config("cpu", ["env.alfworld.expert=oracle"]))
    with pytest.raises(ConfigError, match=r"env.alfworld: unknown option\(s\) \['expret'\]"):
        check_config(load_config("cpu", ["env.alfworld.expret=planner"]))


def test_serl_data_dagger_command(played, tmp_path, capsys):
    traj, plan = played
    src = tmp_path / "trajectories.jsonl"
    write_jsonl(src, [traj, _hand_traj()])
    out = tmp_path / "rows.jsonl"
    assert serl_main(["data", "dagger", str(src), "--out", str(out), "--keep-won"]) == 0
    text = capsys.readouterr().out
    assert "2 episodes (1 won)" in text and "rows: 3 expert-labelled states, 1 won episodes" in text
    rows = read_rows(out)  # serl sft reads them
    assert [r["source"] for r in rows] == ["dagger", "won", "dagger", "dagger"]
    unlabelled = Trajectory(uid="g", traj_uid="u", task=Task("alfworld", "game-2", "pick_and_place_simple"))
    unlabelled.steps = [_step(0, "look", None)]
    write_jsonl(src, [unlabelled])
    assert serl_main(["data", "dagger", str(src), "--out", str(out)]) == 2
    assert "holds no planner labels: play the episodes with env.alfworld.expert=planner" in capsys.readouterr().err
    assert serl_main(["data", "dagger", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
    assert "no trajectories file" in capsys.readouterr().err
    assert read_rows(out) == rows  # a failed command leaves the earlier output alone
    write_jsonl(src, [_search_traj()])
    assert serl_main(["data", "dagger", str(src), "--out", str(out), "--labels", "seen", "--rows-per-episode", "9"]) == 0
    assert "7 wrong, 4 of them not a search only the planner calls wrong" in capsys.readouterr().out
    assert [r["step"] for r in read_rows(out)] == [1, 4, 6, 7]
    assert serl_main(["data", "dagger", str(src), "--out", str(out), "--labels", "search", "--rows-per-episode", "9"]) == 0
    assert "rows: 4 expert-labelled states (2 with a search's label)" in capsys.readouterr().out
    assert serl_main(["data", "dagger", str(src), "--out", str(out), "--labels", "sweep", "--rows-per-episode", "9"]) == 0
    assert "rows: 4 expert-labelled states (2 with a sweep's label)" in capsys.readouterr().out
    assert [r["label"] for r in read_rows(out)] == ["sweep", "sweep", "planner", "planner"]
