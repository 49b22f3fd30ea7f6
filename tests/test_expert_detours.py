"""ALFWorld's walkthrough expert with detours (serl.envs.alfworld_experts.detours, `serl data expert
--detours`): through the real engine on the shipped train games, every episode is still won, the
trained replies are the walkthrough in order, the context-only replies are the detours' `go to`
and refused `take`s (which the engine answers "Nothing happens."), and `serl sft` trains on none of
their tokens."""

from __future__ import annotations

import json

import pytest

from serl.agent.tool_chat import render_sft_conversation
from serl.envs.alfworld import fixture_data_dir, walkthrough
from serl.envs.base import EnvError
from serl.envs.alfworld_experts import AlfWorldDetourExpert, alfworld_think
from serl.rollout.expert import collect_expert, make_expert, play_expert
from serl.train.sft_data import encode_conversation


def _turns(row):
    """``(user text, assistant text, weight)`` per step of a conversation row."""
    m = row["messages"]
    return [(m[i]["content"], m[i + 1]["content"], m[i + 1].get("weight", 1)) for i in range(0, len(m), 2)]


def test_detours_keep_the_walkthrough_trained_and_the_game_won(alf_env, train_tasks, tokenizer):
    rows, summary = collect_expert(alf_env, train_tasks, tokenizer, history_length=2, max_prompt_length=8000,
                                   max_steps=50, seed=0, prompt_layout="conversation", turn_actions="none",
                                   detours=1.0)
    assert summary.won == summary.tasks == len(train_tasks) == len(rows)
    detoured = refused = 0
    for task, row in zip(train_tasks, rows):
        turns = _turns(row)
        assert len(turns) == len(row["actions"])
        trained = [a for a, (_, _, w) in zip(row["actions"], turns) if w == 1]
        assert trained == walkthrough(task)  # the walkthrough, in order, is what the row teaches
        context = [(t, a) for t, (a, (_, _, w)) in enumerate(zip(row["actions"], turns)) if w == 0]
        goes = [a for _, a in context if a.startswith("go to ")]
        takes = [(t, a) for t, a in context if a.startswith("take ")]
        assert len(goes) + len(takes) == len(context) and 1 <= len(goes) <= 2
        for t, a in takes:  # refused by the engine: the next turn says so
            assert not row["action_admissible"][t]
            assert turns[t + 1][0].endswith("Observation: Nothing happens.")
            assert row["actions"][t - 1].startswith("go to ")  # tried where the detour went
        assert all(row["action_admissible"][t] == a.startswith("go to ") for t, a in context)
        detoured += len(goes)
        refused += len(takes)
    assert detoured >= len(train_tasks) and refused >= 1  # p = 1: every episode has one at least


def test_detour_rows_train_only_on_the_walkthroughs_replies(alf_env, train_tasks, tokenizer):
    task = next(t for t in train_tasks if t.task_type == "pick_and_place_simple")
    ep = play_expert(alf_env, task, make_expert(task, seed=0, detours=1.0), tokenizer, 2, 8000, 50,
                     prompt_layout="conversation", turn_actions="none")
    (row,) = ep.rows
    ex = encode_conversation(tokenizer, row, 8192)
    ids, mask = ex.prompt_ids + ex.target_ids, [0] * len(ex.prompt_ids) + ex.target_mask
    trained = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    for _, reply, w in _turns(row):
        assert (reply in trained) == bool(w), reply
    ids2, mask2 = render_sft_conversation(tokenizer, row["messages"], [])
    assert ids2 == ids and mask2 == mask


def test_step_layout_drops_the_detours_rows(alf_env, train_tasks, tokenizer):
    task = next(t for t in train_tasks if t.task_type == "pick_two_obj_and_place")
    ep = play_expert(alf_env, task, make_expert(task, seed=0, detours=1.0), tokenizer, 2, 2048, 50)
    assert ep.won and [r["action"] for r in ep.rows] == walkthrough(task)
    assert ep.steps > len(ep.rows)  # the detours were played, their rows left out
    assert all("weight" not in r for r in ep.rows)


def test_detours_are_deterministic_and_zero_is_the_walkthrough(alf_env, train_tasks, tokenizer):
    kw = dict(history_length=2, max_prompt_length=8000, max_steps=50, prompt_layout="conversation",
              turn_actions="none")
    a, _ = collect_expert(alf_env, train_tasks[:3], tokenizer, seed=4, detours=0.5, **kw)
    b, _ = collect_expert(alf_env, train_tasks[:3], tokenizer, seed=4, detours=0.5, **kw)
    plain, _ = collect_expert(alf_env, train_tasks[:3], tokenizer, seed=4, **kw)
    assert a == b
    assert all("weight" not in m for r in plain for m in r["messages"])
    assert [r["actions"] for r in plain] == [walkthrough(t) for t in train_tasks[:3]]


def test_bad_detours_are_clear_errors(train_tasks):
    task = train_tasks[0]
    with pytest.raises(EnvError, match="walkthrough"):
        make_expert(task, 0, "planner", detours=0.5)
    with pytest.raises(EnvError, match=r"\(0, 1\]"):
        make_expert(task, 0, None, detours=1.5)
    with pytest.raises(ValueError, match="max_detours"):
        AlfWorldDetourExpert(task, 0, alfworld_think, 0.5, max_detours=-1)


def test_cli_detours(tmp_path, tiny_model_dir, capsys):
    from serl.cli import main

    out = tmp_path / "d.jsonl"
    rc = main(["data", "expert", "alfworld", f"model.path={tiny_model_dir}", "env.prompt_layout=conversation",
               "env.turn_actions=none", "--num-tasks", "2", "--detours", "1", "--data-dir",
               str(fixture_data_dir()), "--out", str(out)])
    assert rc == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 2 and all(any(m.get("weight") == 0 for m in r["messages"]) for r in rows)
    for args, msg in ((["webshop", "--detours", "0.5"], "--detours"),
                      (["alfworld", "--expert", "planner", "--detours", "0.5"], "--detours"),
                      (["alfworld", "--detours", "2"], "--detours")):
        capsys.readouterr()
        assert main(["data", "expert", *args, "--out", str(tmp_path / "x.jsonl")]) != 0
        assert msg in capsys.readouterr().err
