"""The `serl` command line: config errors name the key; eval reports per-task-type success."""

from __future__ import annotations

import json

import pytest

from serl.cli import main


def test_train_rejects_unknown_key(capsys):
    assert main(["train", "actor.lrr=1e-5"]) == 2
    err = capsys.readouterr().err
    assert "actor.lrr" in err


def test_train_rejects_bad_value(capsys):
    assert main(["train", "algorithm.serl.mixing_lambda=1.5"]) == 2
    assert "algorithm.serl.mixing_lambda" in capsys.readouterr().err


def test_train_rejects_unknown_env_listing_the_valid_names(capsys):
    assert main(["train", "env.name=nope"]) == 2
    err = capsys.readouterr().err
    assert "env.name" in err and "'alfworld', 'math', 'webshop'" in err and "Traceback" not in err


def test_train_rejects_a_run_name_leaving_the_output_dir(capsys, tmp_path):
    assert main(["train", f"trainer.output_dir={tmp_path}", "trainer.run_name=../escape"]) == 2
    assert "trainer.run_name" in capsys.readouterr().err
    assert not (tmp_path.parent / "escape").exists()


def test_eval_rejects_bad_value_before_loading_a_model(capsys):
    assert main(["eval", "model.path=/nonexistent/model", "actor.lr=inf"]) == 2
    err = capsys.readouterr().err
    assert "actor.lr" in err and "/nonexistent/model" not in err


def test_eval_rejects_zero_tasks_before_loading_a_model(capsys):
    # 0 tasks used to evaluate nothing and print "success rate: 0.000" with exit 0
    for recipe in ("cpu", "webshop"):
        assert main(["eval", f"recipe={recipe}", "model.path=/nonexistent/model", "--split", "valid_unseen"
                     if recipe == "cpu" else "test", "--num-tasks", "0"]) == 2
        err = capsys.readouterr().err
        assert "--num-tasks must be >= 1 (or -1 for the whole split), got 0" in err and "/nonexistent/model" not in err
    assert main(["eval", "model.path=/nonexistent/model", "env.eval_num_tasks=0"]) == 2
    assert "env.eval_num_tasks must be >= 1" in capsys.readouterr().err
    assert main(["eval", "model.path=/nonexistent/model", "--num-tasks", "-2"]) == 2
    assert "got -2" in capsys.readouterr().err


def test_train_rejects_unknown_recipe(capsys):
    assert main(["train", "recipe=nope"]) == 2
    assert "unknown recipe" in capsys.readouterr().err


def test_eval_reports_success_per_task_type(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    rc = main(["eval", f"model.path={tiny_model_dir}", "env.max_steps=2", "data.max_response_length=8",
               "rollout.micro_batch_size=2", "--split", "valid_unseen", "--num-tasks", "2", "--greedy",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "success rate" in printed and "look_at_obj_in_light" in printed
    m = json.loads((out / "metrics.json").read_text())
    assert m["num_tasks"] == 2 and 0.0 <= m["success_rate"] <= 1.0
    assert (out / "trajectories.jsonl").read_text().count("\n") == 2


def test_eval_shards_play_interleaved_parts_of_the_tasks(tiny_model_dir, tmp_path, capsys):
    """`--shard I/N` plays tasks I, I+N, ... of the evaluation: N processes together play its tasks."""
    args = [f"model.path={tiny_model_dir}", "env.max_steps=1", "data.max_response_length=8", "rollout.micro_batch_size=4",
            "trainer.progress=false", "--split", "valid_unseen", "--num-tasks", "5", "--greedy"]
    assert main(["eval", *args, "--out", str(tmp_path / "all")]) == 0
    for k in (0, 1):
        assert main(["eval", *args, "--shard", f"{k}/2", "--out", str(tmp_path / f"part{k}")]) == 0
    ids = {d: [json.loads(x)["task_id"] for x in (tmp_path / d / "tasks.jsonl").read_text().splitlines()]
           for d in ("all", "part0", "part1")}
    assert ids["part0"] == ids["all"][0::2] and ids["part1"] == ids["all"][1::2] and len(ids["all"]) == 5
    assert json.loads((tmp_path / "part1" / "metrics.json").read_text())["shard"] == "1/2"
    assert "5 tasks," in capsys.readouterr().out.split("serl eval: alfworld valid_unseen")[1]
    assert "shard" not in json.loads((tmp_path / "all" / "metrics.json").read_text())
    for bad, msg in (("2/2", "0 <= I < N"), ("1-2", "must be I/N")):
        assert main(["eval", *args, "--shard", bad]) == 2
        assert msg in capsys.readouterr().err
    assert main(["eval", *args[:-3], "--num-tasks", "1", "--greedy", "--shard", "1/2", "--out", str(tmp_path / "x")]) == 2
    assert "holds none" in capsys.readouterr().err
    assert not (tmp_path / "x" / "trajectories.jsonl.partial").exists()  # refused before a journal began
    # the parts merged: the whole evaluation's tasks in its order, each with its part's episode
    assert main(["eval", "--merge", str(tmp_path / "part1"), str(tmp_path / "part0"), "--out", str(tmp_path / "m")]) == 0
    assert "5 tasks from 2 shards" in capsys.readouterr().out
    lines = {d: [json.loads(x) for x in (tmp_path / d / "tasks.jsonl").read_text().splitlines()] for d in ("part0", "part1", "m")}
    assert [x["task_id"] for x in lines["m"]] == ids["all"]
    assert lines["m"][0::2] == lines["part0"] and lines["m"][1::2] == lines["part1"]
    merged = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert merged["num_tasks"] == 5 and merged["shards"] == 2 and "shard" not in merged
    assert merged["success_rate"] == sum(x["won"] for x in lines["m"]) / 5
    assert (tmp_path / "m" / "trajectories.jsonl").read_text().count("\n") == 5
    for parts, msg in (([tmp_path / "part0"], "shards 1/2 are missing"), ([tmp_path / "part0"] * 2, "given twice"),
                       ([tmp_path / "all", tmp_path / "part0"], "not a shard"), ([tmp_path / "x"], "no finished serl eval")):
        assert main(["eval", "--merge", *map(str, parts), "--out", str(tmp_path / "bad")]) == 2
        assert msg in capsys.readouterr().err
    assert main(["eval", "--merge", str(tmp_path / "part0")]) == 2
    assert "needs --out DIR" in capsys.readouterr().err
    assert main(["eval", "--merge", str(tmp_path / "part0"), "--shard", "0/2", "--out", str(tmp_path / "bad")]) == 2
    assert "--out only" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    cut = tmp_path / "cut"  # a part whose trajectories file was cut mid-line
    cut.mkdir()
    (cut / "metrics.json").write_text((tmp_path / "part1" / "metrics.json").read_text())
    (cut / "trajectories.jsonl").write_text((tmp_path / "part1" / "trajectories.jsonl").read_text()[:50])
    assert main(["eval", "--merge", str(tmp_path / "part0"), str(cut), "--out", str(tmp_path / "bad")]) == 2
    assert "cannot be read" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_merge_shards_deals_tasks_back_in_order_by_hand():
    """Shard i of N holds tasks i, i+N, ...; a task's n episodes stay together; parts of other
    evaluations or with a ragged episode count are refused."""
    from serl.errors import ConfigError
    from serl.train.evaluate import merge_shards
    from serl.trajectory import Task, Trajectory

    def part(i, k, tasks, n=2, **meta):
        trajs = [Trajectory(uid=str(t), traj_uid=f"{t}/{e}", task=Task("alfworld", str(t), "x"), steps=[])
                 for t in range(i, tasks, k) for e in range(n)]
        return {"shard": f"{i}/{k}", "split": "s", "mode": "greedy", "model": "m", "num_tasks": len(trajs) // n,
                **meta}, trajs

    meta, trajs = merge_shards([part(2, 3, 7), part(0, 3, 7), part(1, 3, 7)])
    assert meta == {"split": "s", "mode": "greedy", "model": "m", "shards": 3}
    assert [t.traj_uid for t in trajs] == [f"{t}/{e}" for t in range(7) for e in range(2)]
    bad = [([part(0, 2, 4), part(1, 2, 4, model="other")], "model differ"),
           ([part(0, 2, 4), part(1, 3, 4)], "N differ"),
           ([part(0, 2, 4), part(1, 2, 4, n=1)], "with 2 episodes each"),
           ([part(0, 2, 4), part(1, 2, 7)], r"task counts \(\[2, 3\]\) are not 2 shards of one 5-task"),
           ([({**part(0, 1, 3)[0], "num_tasks": 2}, part(0, 1, 3)[1])], "are not its 2 tasks"),
           ([({**part(0, 2, 4)[0], "shard": "0-2"}, part(0, 2, 4)[1])], "no readable shard"),
           ([], "no parts")]
    for parts, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            merge_shards(parts)


def test_eval_stopped_after_a_chunk_goes_on_from_its_journal(tiny_model_dir, tmp_path, monkeypatch, capsys):
    # a stopped serl eval used to lose every task it had played (a 134-game ALFWorld panel ran out
    # of time at turn 17 of 50 on a GPU lease); now each finished chunk is journalled, and the same
    # command run again plays only the rest, to the same episodes as an unstopped run
    import serl.cli as cli
    from serl.utils import Journal

    overrides = [f"model.path={tiny_model_dir}", "data.max_response_length=8", "rollout.engine=hf",
                 "rollout.micro_batch_size=2"]
    argv = [*overrides, "env.max_steps=2", "--split", "valid_unseen", "--num-tasks", "4", "--greedy"]
    assert main(["eval", *argv, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "stopped"
    real = Journal.append

    def append_then_stop(self, *entries):
        real(self, *entries)
        raise cli.Terminated()

    monkeypatch.setattr(Journal, "append", append_then_stop)
    assert main(["eval", *argv, "--out", str(out)]) == 143
    journal = out / "trajectories.jsonl.partial"
    assert len(journal.read_text().splitlines()) == 1 + 2  # the header and the first chunk's 2 episodes
    assert not (out / "metrics.json").exists()
    assert "the same command again goes on" in capsys.readouterr().err
    monkeypatch.setattr(Journal, "append", real)
    # another config is refused, not mixed in
    assert main(["eval", *overrides, "env.max_steps=3", *argv[len(overrides) + 1:], "--out", str(out)]) == 2
    assert "other arguments" in capsys.readouterr().err
    # the engine's memory cannot change the episodes: a rerun with more of it goes on
    assert main(["eval", "rollout.gpu_memory_utilization=0.3", *argv, "--out", str(out)]) == 0
    assert "resuming" in capsys.readouterr().err and not journal.exists()

    def episodes(d):
        return [(t["task"]["task_id"], [s["action"] for s in t["steps"]])
                for t in map(json.loads, (d / "trajectories.jsonl").read_text().splitlines())]

    assert episodes(out) == episodes(tmp_path / "whole") and len(episodes(out)) == 4
    assert json.loads((out / "metrics.json").read_text())["num_tasks"] == 4


def test_evaluate_policy_refuses_finished_trajectories_of_other_tasks():
    from serl.configure import load_config
    from serl.train.evaluate import evaluate_policy
    from serl.trajectory import Task, Trajectory

    cfg = load_config("cpu", ["rollout.micro_batch_size=2"])
    other = Trajectory(uid="u", traj_uid="t", task=Task("alfworld", "not/a/panel/game", "pick_and_place_simple"),
                       task_text="", steps=[])
    with pytest.raises(ValueError, match="not whole chunks"):
        evaluate_policy(cfg, None, None, "valid_unseen", 4, greedy=True, done=[other, other])
    with pytest.raises(ValueError, match="not whole chunks"):  # half a chunk
        evaluate_policy(cfg, None, None, "valid_unseen", 4, greedy=True, done=[other])


def test_eval_builds_the_trainers_rollout_engine(tiny_model_dir, tmp_path, capsys, monkeypatch):
    # serl eval samples with the engine rollout.engine names (auto = vLLM where installed), built
    # with the trainer's settings: before, it always used the hf engine
    import serl.rollout.engine as engine_mod

    calls = []
    real = engine_mod.make_engine

    def spy(name, model, tokenizer, micro_batch_size, device, **options):
        calls.append((name, micro_batch_size, device, options))
        return real(name, model, tokenizer, micro_batch_size, device, **options)

    monkeypatch.setattr(engine_mod, "make_engine", spy)
    rc = main(["eval", f"model.path={tiny_model_dir}", "env.max_steps=1", "data.max_response_length=8",
               "data.max_prompt_length=700", "rollout.engine=hf", "rollout.micro_batch_size=2",
               "rollout.enable_prefix_caching=false", "--split", "valid_unseen", "--num-tasks", "1", "--greedy",
               "--seed", "3", "--out", str(tmp_path / "eval")])
    assert rc == 0
    [(name, mbs, device, options)] = calls
    assert (name, mbs, device) == ("hf", 2, "cpu")
    assert options["seed"] == 3 and options["max_model_len"] == 708 and options["model_path"] == str(tiny_model_dir)
    assert options["enable_prefix_caching"] is False and options["gpu_memory_utilization"] is None
    assert options["kv_cache_sequences"] == 1  # one greedy task: one sequence, below rollout.micro_batch_size=2
    assert "rollout engine hf (rollout.engine=hf, device cpu)" in capsys.readouterr().err


def test_eval_sizes_the_engine_for_its_largest_chunk():
    from serl.cli import _eval_sequences
    from serl.configure import load_config

    cfg = load_config("cpu", ["rollout.micro_batch_size=27", "rollout.val_n=4"])
    assert _eval_sequences(cfg, -1, greedy=True) == 27  # the whole split: chunks of 27
    assert _eval_sequences(cfg, 2, greedy=True) == 2
    assert _eval_sequences(cfg, 5, greedy=False) == 20  # 5 tasks × val_n 4
    assert _eval_sequences(cfg, 50, greedy=False) == 27


def test_eval_subset_round_robin_over_task_types():
    from serl.envs.base import Task
    from serl.train.evaluate import eval_subset

    tasks = [Task("alfworld", f"{ty}/{k}", ty) for ty in ("b", "a", "c") for k in range(3)]
    sub = eval_subset(tasks, 4)
    assert [t.task_id for t in sub] == ["a/0", "b/0", "c/0", "a/1"]
    assert eval_subset(tasks, -1) == tasks and eval_subset(tasks, 100) == tasks


def test_eval_on_a_math_split_prints_the_math_metrics(tiny_model_dir, tmp_path, capsys):
    assert main(["eval", "recipe=cpu_math", f"model.path={tiny_model_dir}", "env.num_workers=1",
                 "data.max_response_length=16", "env.math.max_turn_tokens=8", "--split", "gsm8k:test",
                 "--num-tasks", "2", "--greedy", "--out", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "serl eval: math gsm8k:test, 2 tasks, greedy" in out
    assert "tool_call_rate" in out and "stop/" in out and "admissible-action ratio" not in out
    saved = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert saved["num_tasks"] == 2 and saved["tool_call_rate"] == 0.0
