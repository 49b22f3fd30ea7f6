"""Expert trajectories (serl.rollout.expert, `serl data expert`): the ALFWorld walkthrough expert
wins through the real env, its SFT prompts are byte-identical to the RL collector's prompts of the
same states, the reply parses back to the action, the WebShop oracle reaches the target's recorded
best score, rows are deterministic for a seed, and the CLI writes the file."""

from __future__ import annotations

import json

import pytest

from serl.agent.chat import chat_prompt_ids
from serl.configure import load_config
from serl.agent.parsing import FALLBACK_CHARS, project_action
from serl.envs.alfworld import AlfWorldEnv, extract_task, fixture_data_dir, walkthrough
from serl.envs.alfworld_experts import ALFWORLD_THINK
from serl.envs.base import EnvError
from serl.envs.pool import EnvPool
from serl.envs.webshop.catalog import hidden_price
from serl.envs.webshop.env import WebShopEnv, load_world
from serl.envs.webshop.expert import WebShopOracle
from serl.envs.webshop.goals import priced_goal
from serl.envs.webshop.reward import get_reward
from serl.rollout.collector import Collector
from serl.rollout.engine import SamplingParams
from serl.rollout.expert import (
    collect_expert,
    make_expert,
    pick_tasks,
    play_expert,
    read_rows,
)


def _task_of_type(tasks, ttype):
    return next(t for t in tasks if t.task_type == ttype)


class ScriptedEngine:
    """Emits the token ids of given replies (plus EOS), one per generate call and prompt."""

    def __init__(self, tokenizer, replies):
        self.tok = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params):
        self.prompts.extend(prompts)
        out = []
        for _ in prompts:
            ids = self.tok(self.replies.pop(0), add_special_tokens=False).input_ids
            out.append(ids + [self.tok.eos_token_id])
        return out


def _collector_steps(tokenizer, task, replies, history_length, max_prompt_length):
    pool = EnvPool("alfworld", 1, 0, {"max_steps": 50, "data_dir": str(fixture_data_dir())})
    try:
        engine = ScriptedEngine(tokenizer, replies)
        coll = Collector(pool, engine, tokenizer, "alfworld", history_length, 50, max_prompt_length)
        groups = coll.collect([task], 1, SamplingParams(max_new_tokens=128))
    finally:
        pool.close()
    assert not engine.replies  # every expert reply was used
    return groups[0].trajectories[0]


@pytest.mark.parametrize("max_prompt_length", [2048, 450, 300])
def test_alfworld_expert_wins_and_its_prompts_equal_the_collectors(alf_env, train_tasks, tokenizer,
                                                                  max_prompt_length):
    # pick_two: the longest fixture plan (8 steps), so the history window slides several times.
    # Its prompts are 264-524 tokens: 450 makes the shared prompt function drop history on most
    # steps, 300 also cuts some history-free prompts from the left.
    task = _task_of_type(train_tasks, "pick_two_obj_and_place")
    ep = play_expert(alf_env, task, make_expert(task, seed=3), tokenizer, history_length=2,
                     max_prompt_length=max_prompt_length, max_steps=50)
    plan = walkthrough(task)
    assert ep.won and ep.episode_reward == 10.0 and not ep.gave_up
    assert [r["action"] for r in ep.rows] == plan
    assert [r["step"] for r in ep.rows] == list(range(len(plan)))
    assert all(r["won"] and r["action_admissible"] for r in ep.rows)
    assert any(r["prompt_truncated"] for r in ep.rows) == (max_prompt_length < 2048)

    traj = _collector_steps(tokenizer, task, [r["response"] for r in ep.rows], 2, max_prompt_length)
    assert traj.won and len(traj.steps) == len(ep.rows)
    for row, step in zip(ep.rows, traj.steps):
        content = row["messages"][0]["content"]
        assert row["messages"][0]["role"] == "user" and len(row["messages"]) == 1
        assert step.prompt.encode() == content.encode(), row["step"]
        assert step.prompt_ids == chat_prompt_ids(tokenizer, content)[-max_prompt_length:]
        assert step.response_text == row["response"]
        assert step.action == row["action"] and step.action_valid


def test_alfworld_reply_format_and_project_action(alf_env, train_tasks, tokenizer):
    task = _task_of_type(train_tasks, "pick_clean_then_place_in_recep")
    ep = play_expert(alf_env, task, make_expert(task, seed=0), tokenizer, 2, 2048, 50)
    assert ep.won
    first = ep.rows[0]["messages"][0]["content"]
    task_phrase = extract_task(first[: first.index("\nYour admissible actions")]).rstrip(".")
    assert "clean" in task_phrase
    for r in ep.rows:
        resp = r["response"]
        assert resp.startswith("<think>") and resp.endswith(f"</think><action>{r['action']}</action>")
        think = resp[len("<think>"):resp.index("</think>")]
        # the think names the task and the chosen action, from one of the templates
        assert any(think == t.format(task=task_phrase, action=r["action"]) for t in ALFWORLD_THINK), think
        assert project_action(resp, FALLBACK_CHARS["alfworld"]) == (r["action"], True)


def test_expert_gives_up_when_the_plan_is_cut(alf_env, train_tasks, tokenizer):
    task = _task_of_type(train_tasks, "pick_two_obj_and_place")
    ep = play_expert(alf_env, task, make_expert(task, seed=0), tokenizer, 2, 2048, max_steps=3)
    assert len(ep.rows) == 3 and not ep.won and ep.episode_reward == 0.0
    rows, summary = collect_expert(alf_env, [task], tokenizer, history_length=2, max_prompt_length=2048,
                                   max_steps=3)
    assert rows == [] and summary.tasks == 1 and summary.kept == 0 and summary.won == 0


def test_rows_are_deterministic_for_a_seed(alf_env, train_tasks, tokenizer):
    assert pick_tasks(train_tasks, 2, 5) == pick_tasks(train_tasks, 2, 5)
    assert pick_tasks(train_tasks, -1, 5) != train_tasks and sorted(pick_tasks(train_tasks, -1, 5),
                                                                    key=lambda t: t.task_id) == train_tasks
    tasks = [_task_of_type(train_tasks, "look_at_obj_in_light"), _task_of_type(train_tasks, "pick_and_place_simple")]
    kw = dict(history_length=2, max_prompt_length=2048, max_steps=50)
    a, sa = collect_expert(alf_env, tasks, tokenizer, seed=1, **kw)
    b, _ = collect_expert(alf_env, tasks, tokenizer, seed=1, **kw)
    c, _ = collect_expert(alf_env, tasks, tokenizer, seed=2, **kw)
    assert a == b and sa.kept == 2 and sa.rows == len(a)
    assert [r["messages"] for r in a] == [r["messages"] for r in c]  # prompts do not depend on the seed
    assert [r["response"] for r in a] != [r["response"] for r in c]  # the think templates do


def _recorded_best_score(i: int, seed: int = 0) -> float:
    """WebShop's score of buying goal i's target with exactly the goal's options."""
    w = load_world()
    g = w.goals[i]
    p = w.catalog.by_asin[g.asin]
    pg = priced_goal(w.catalog, w.goals, i, seed)
    score, _ = get_reward(w.catalog, p, g, hidden_price(p, seed, i), pg.price_upper, dict(g.goal_options))
    return score


def test_webshop_oracle_reaches_the_recorded_score_on_the_first_test_goals(tokenizer):
    env = WebShopEnv()
    tasks = WebShopEnv.list_tasks("test")[:20]
    wins = 0
    for task in tasks:
        ep = play_expert(env, task, make_expert(task, seed=0), tokenizer, 2, 4096, 15)
        best = _recorded_best_score(int(task.task_id))
        assert not ep.gave_up and ep.task_score == pytest.approx(best), task.task_id
        assert ep.won == (best == 1.0) and ep.episode_reward == (10.0 if best == 1.0 else 0.0)
        acts = [r["action"] for r in ep.rows]
        assert acts[0].startswith("search[") and acts[-1] == "click[buy now]"
        assert f"click[{env.goal.asin.lower()}]" in acts
        for r in ep.rows:
            assert r["action_admissible"], r["action"]
            assert project_action(r["response"], FALLBACK_CHARS["webshop"]) == (r["action"], True)
        wins += ep.won
    assert wins >= 17
    rows, summary = collect_expert(env, tasks, tokenizer, history_length=2, max_prompt_length=4096, max_steps=15,
                                   min_score=1.0)
    assert summary.kept == wins and {r["task_id"] for r in rows} == {t.task_id for t in tasks
                                                                      if _recorded_best_score(int(t.task_id)) == 1.0}


def test_webshop_search_query_drops_price_clause_and_brackets():
    q = WebShopOracle.search_query("Find me a [big] Pillow with size: 28\" x 28\", and price lower than 40.00 dollars")
    assert q == "find me a big pillow with size: 28\" x 28\""


def test_make_expert_unknown_env():
    from serl.envs.base import Task

    with pytest.raises(EnvError, match="no expert for env"):
        make_expert(Task("other", "1", "x"), 0)
    with pytest.raises(EnvError, match=r"^no expert for env 'math'; valid: \['alfworld', 'webshop'\]$"):
        make_expert(Task("math", "1", "gsm8k"), 0)  # math's expert rows come from GSM8K, not a played expert


def _scripted_factory(task, seed, expert=None, **options):
    return ("scripted", task.task_id, seed, expert, options)


def test_experts_come_from_the_env_class(monkeypatch):
    """make_expert names no env: it asks the env class of the task (its expert_factory entry point),
    passing on the options the caller set; an option the env's experts do not take is refused."""
    import inspect

    import serl.rollout.expert as expert_mod
    from serl.envs import base

    class ScriptedEnv(base.BaseTextEnv):
        name = "scripted"
        expert_factory = f"{__name__}:_scripted_factory"
        expert_names = ("a", "b")
        expert_options = {"think": ("b",)}

    monkeypatch.setitem(base.ENV_ENTRY_POINTS, "scripted", f"{__name__}:ScriptedEnv")
    monkeypatch.setitem(base._LOADED, "scripted", ScriptedEnv)
    task = base.Task("scripted", "7", "t")
    assert make_expert(task, 3) == ("scripted", "7", 3, None, {})
    assert make_expert(task, 3, "b", think="state") == ("scripted", "7", 3, "b", {"think": "state"})
    assert "scripted" in base.expert_envs() and "math" not in base.expert_envs()
    refused = "^detours=0.5: no scripted expert takes that option; it is for alfworld's walkthrough$"
    with pytest.raises(EnvError, match=refused):
        make_expert(task, 3, detours=0.5)
    monkeypatch.setattr(ScriptedEnv, "expert_factory", "")
    with pytest.raises(EnvError, match=r"^no expert for env 'scripted'; valid: \['alfworld', 'webshop'\]$"):
        make_expert(task, 3)
    assert "env_name ==" not in inspect.getsource(expert_mod)


def test_cli_writes_the_file(tmp_path, tiny_model_dir, capsys):
    from serl.cli import main

    out = tmp_path / "expert.jsonl"
    rc = main(["data", "expert", "alfworld", f"model.path={tiny_model_dir}", "--split", "train", "--num-tasks", "2",
               "--seed", "4", "--out", str(out)])
    assert rc == 0
    rows = read_rows(out)
    lines = out.read_text().splitlines()
    assert len(lines) == len(rows) > 0 and all(json.loads(line) == r for line, r in zip(lines, rows))
    keys = {"env", "task_id", "task_type", "step", "messages", "response", "action", "won", "episode_reward"}
    assert all(keys <= set(r) and r["env"] == "alfworld" and r["won"] for r in rows)
    assert len({r["task_id"] for r in rows}) == 2
    listed = [t for t in AlfWorldEnv.list_tasks("train", fixture_data_dir())
              if t.task_type in load_config("cpu").env.task_types]  # the default recipe's task types
    expected = [t.task_id for t in pick_tasks(listed, 2, 4)]
    assert list(dict.fromkeys(r["task_id"] for r in rows)) == expected
    assert "kept 2 episodes" in capsys.readouterr().out

    out2 = tmp_path / "ws.jsonl"
    assert main(["data", "expert", "webshop", f"model.path={tiny_model_dir}", "--split", "train", "--num-tasks", "3",
                 "--out", str(out2)]) == 0
    ws = read_rows(out2)
    assert ws and all(r["env"] == "webshop" and r["task_score"] >= 1.0 for r in ws)


def test_cli_missing_split_is_a_clear_error(tmp_path, tiny_model_dir, capsys):
    from serl.cli import main

    rc = main(["data", "expert", "alfworld", f"model.path={tiny_model_dir}", "--split", "nope",
               "--data-dir", str(tmp_path), "--out", str(tmp_path / "x.jsonl")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "split 'nope' not found" in err and "serl data download alfworld" in err
    assert not (tmp_path / "x.jsonl").exists()
    rc = main(["data", "expert", "alfworld", "env.name=webshop", "--out", str(tmp_path / "y.jsonl")])
    assert rc == 2 and "env.name is 'webshop'" in capsys.readouterr().err
