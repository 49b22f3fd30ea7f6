"""experiments/learning.py's ALFWorld legs without a model: their options, the command lines of
their phases (``Experiment.serl`` replaced by :class:`learning_fakes.FakeSerl`: the cold start,
DAgger rounds, panels beside the rounds, the SFT-size legs) and their reports from synthetic
panels, checked by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "experiments"))  # the scripts import their siblings by name

import learning  # noqa: E402
import learning_stats as stats  # noqa: E402
from learning_fakes import FakeSerl, run_experiment, write_data  # noqa: E402
from learning_options import parse_args  # noqa: E402


def _alfworld_args(work, *extra):
    return parse_args(["--workdir", str(work), "--sft-model", str(work.parent / "start"), "--seeds", "0",
                       "--iterations", "4", "--eval-every", "4", "--algos", "grpo", "serl",
                       "--splits", "train", "valid_seen", *extra])


def test_alfworld_options_every_game_greedy_jobs_and_errors(tmp_path):
    a = _alfworld_args(tmp_path / "w", "--panel-per-type", "-1", "--panel-decoding", "greedy", "--jobs", "3",
                       "--train-seconds", "60")
    assert (a.panel_per_type, a.jobs, a.train_seconds) == (-1, 3, 60.0)
    assert learning.Experiment(a).panels(4) == [("train", "train", [], ["--greedy"]),
                                                ("valid_seen", "valid_seen", [], ["--greedy"])]
    assert parse_args(["--splits", "valid_seen"]).panel_decoding == "sampled"  # the default, as before
    for bad in (["--panel-per-type", "0"], ["--panel-per-type", "-2"], ["--jobs", "0"], ["--train-seconds", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_alfworld_jobs_and_train_seconds_label_the_panel_with_the_iteration_reached(tmp_path, monkeypatch):
    start = tmp_path / "start"
    start.mkdir()
    (start / "config.json").write_text("{}")
    work = tmp_path / "w"
    import learning_report
    monkeypatch.setattr(learning_report, "write_report", lambda *a: None)
    fake = FakeSerl(cap=3)  # every run stopped by --train-seconds after 3 of its 4 iterations
    run_experiment(_alfworld_args(work, "--panel-per-type", "-1", "--panel-decoding", "greedy", "--jobs", "3",
                        "--train-seconds", "60"), fake, monkeypatch)
    trains = [c for c in fake.calls if c[0] == "train"]
    assert len(trains) == 2 and all("trainer.total_training_steps=4" in c for c in trains)
    assert sorted(t for c, t in zip(fake.calls, fake.seconds) if c[0] == "train") == [60, 60]
    assert all(t == 0 for c, t in zip(fake.calls, fake.seconds) if c[0] == "eval")  # only training is capped
    evals = sorted(c[-1].split("/eval/")[1] for c in fake.calls if c[0] == "eval")
    assert evals == ["grpo_s0/it003_train", "grpo_s0/it003_valid_seen", "serl_s0/it003_train",
                     "serl_s0/it003_valid_seen", "sft/it000_train", "sft/it000_valid_seen"]
    for c in fake.calls:
        if c[0] == "eval":
            assert c[c.index("--num-tasks") + 1] == "-1" and "--greedy" in c


def _panel(work: Path, policy: str, it: int, split: str, won: list[bool]) -> None:
    out = work / "eval" / policy / f"it{it:03d}_{split}"
    write_data(out / "metrics.json", {"success_rate": sum(won) / len(won), "valid_action_ratio": 1.0,
                                  "admissible_action_ratio": 1.0, "num_tasks": len(won)})
    (out / "tasks.jsonl").write_text("".join(json.dumps({"task_id": f"{split}/g{i}", "won": w}) + "\n"
                                             for i, w in enumerate(won)))


def test_alfworld_report_pairs_each_run_end_with_the_start_by_hand(tmp_path):
    import learning_report as lr

    work = tmp_path / "w"
    T, F = True, False
    _panel(work, "sft", 0, "valid_seen", [T, T, F, F, F, F])
    _panel(work, "sft", 0, "valid_unseen", [F, F, F, F])
    _panel(work, "grpo_s0", 3, "valid_seen", [T, F, T, T, T, F])  # +3 (g2, g3, g4), -1 (g1)
    _panel(work, "grpo_s0", 3, "valid_unseen", [T, T, F, F])      # +2
    _panel(work, "grpo_s0", 1, "valid_seen", [F] * 6)             # an earlier point, not the end
    _panel(work, "serl_s0", 2, "valid_seen", [T, T, F, F, F, F])  # no valid_unseen yet: no end
    evals = stats.load_panel(work)
    splits = ["valid_seen", "valid_unseen"]
    ends = stats.run_ends(evals, ["grpo_s0", "serl_s0"], splits)
    assert ends == {"grpo_s0": 3}
    table = lr.paired_table(work, ["grpo", "serl"], [0], splits, ends, splits)
    assert "| grpo_s0 (iteration 3) | valid_seen (6) | 2 | 4 | 3 | 1 | 0.625 |" in table
    assert "| grpo_s0 (iteration 3) | valid_unseen (4) | 0 | 2 | 2 | 0 | 0.500 |" in table
    # pooled held-out: b = 5, c = 1: p = 2 * (1 + 6) / 64
    assert f"| grpo_s0 | held-out (valid_seen + valid_unseen) | 2 | 6 | 5 | 1 | {2 * 7 / 64:.3f} |" in table
    assert not [x for x in table if x.startswith("| serl")]
    # two seeds pooled: McNemar on the counts, and by task (g0 of valid_unseen up in both runs: net 2)
    _panel(work, "grpo_s1", 3, "valid_seen", [T, T, F, F, F, F])    # no change
    _panel(work, "grpo_s1", 3, "valid_unseen", [T, F, F, F])        # +1 (g0)
    ends = stats.run_ends(stats.load_panel(work), ["grpo_s0", "grpo_s1"], splits)
    table = lr.paired_table(work, ["grpo"], [0, 1], splits, ends, splits)
    assert f"| grpo, 2 runs pooled | held-out | | | 6 | 1 | {2 * 8 / 128:.3f} |" in table
    # nets: valid_seen g1 -1, g2 g3 g4 +1, valid_unseen g0 +2, g1 +1: |sum| 5 of weights 1,1,1,1,2,1
    assert f"| grpo, 2 runs by task | held-out | | | 5 | 1 | {stats.paired_counts_p([-1, 1, 1, 1, 2, 1]):.3f} |" in table
    # weights 1, 1, 1, 1, 1, 2 (sum 7): S >= 5 with all signs + or one weight-1 sign flipped (6 vectors), S <= -5 alike
    assert stats.paired_counts_p([-1, 1, 1, 1, 2, 1]) == 12 / 64
    final = lr.final_table(evals, ["grpo", "serl"], [0], splits, ends)
    assert "| grpo, iteration 3 | valid_seen | 0.667 ± 0.000 (n=1) | 1.000 ± 0.000 (n=1) | 1.000 ± 0.000 (n=1) |" in final
    assert "| serl | valid_seen | not evaluated yet | | |" in final


def test_alfworld_report_training_curves_by_hand():
    """Each seed's training success as a trailing moving average (window 2), per algorithm; a run
    with no metrics gives no curve."""
    import learning_report as lr

    train = {"grpo_s0": {1: {"episode/success_rate": 0.0}, 2: {"episode/success_rate": 1.0}, 3: {"x": 1}},
             "grpo_s1": {1: {"episode/success_rate": 0.5}}}
    assert lr.train_curves(train, ["grpo", "serl"], [0, 1], 2) == {"grpo": {0: [0.0, 0.5], 1: [0.5]}, "serl": {}}


def test_alfworld_train_pool_is_the_games_after_the_sft_ones_in_the_expert_order(tmp_path):
    """--train-pool SKIP:COUNT copies the COUNT train games after the first SKIP of `serl data
    expert --seed`'s order (the shipped fixture: 4 games of the recipe's two types) and the other
    panel splits' games of those types; later commands read that folder."""
    from serl.configure import load_config
    from serl.envs.base import list_tasks
    from serl.rollout.expert import pick_tasks

    data = REPO_ROOT / "serl" / "data" / "alfworld"
    a = parse_args(["--workdir", str(tmp_path / "w"), "--data-dir", str(data), "--sft-model", "x",
                    "--splits", "train", "valid_unseen", "--train-pool", "1:2", "--expert-seed", "3"])
    exp = learning.Experiment(a)
    exp.pool_data()
    out = tmp_path / "w" / "pool_data"
    assert a.data_dir == str(out) and f"env.data_dir={out}" in exp.common()
    order = pick_tasks(list_tasks(load_config("cpu_learn", [f"env.data_dir={data}"]).env, "train"), -1, 3)
    want = ["/".join(Path(t.task_id).parts[-3:-1]) for t in order[1:3]]
    assert (out / "POOL.txt").read_text().split() == want
    assert sorted("/".join(p.parts[-3:-1]) for p in (out / "json_2.1.1" / "train").glob("*/*/game.tw-pddl")) == sorted(want)
    unseen = sorted(p.name for p in (out / "json_2.1.1" / "valid_unseen").iterdir())
    assert unseen and all(n.split("-")[0] in ("look_at_obj_in_light", "pick_and_place_simple") for n in unseen)
    assert len(unseen) == len([p for p in (data / "json_2.1.1" / "valid_unseen").iterdir()
                               if p.name.split("-")[0] in ("look_at_obj_in_light", "pick_and_place_simple")])
    exp2 = learning.Experiment(parse_args(["--workdir", str(tmp_path / "w"), "--data-dir", str(data), "--sft-model",
                                           "x", "--splits", "train", "--train-pool", "1:2"]))
    exp2.pool_data()  # done once: a re-run reuses it
    assert (out / "POOL.txt").read_text().split() == want
    with pytest.raises(SystemExit):
        learning.Experiment(parse_args(["--workdir", str(tmp_path / "v"), "--data-dir", str(data), "--sft-model", "x",
                                        "--train-pool", "3:2"])).pool_data()  # 4 games only
    for bad in (["--train-pool", "2"], ["--train-pool", "-1:2"], ["--train-pool", "1:0"],
                ["--env", "math", "--data-dir", "d", "--train-pool", "1:2"], ["--train-pool", "1:2"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_alfworld_cold_start_alone_from_an_expert_file_with_a_compared_policy(tmp_path, monkeypatch):
    """``--expert-file`` (rows made beforehand) skips the expert command and is the SFT's data;
    ``--iterations 0`` trains nothing and evaluates the SFT start; ``--compare-model`` plays the same
    panels with its own overrides (with ``--jobs`` > 1 too)."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"task_id": "g0", "messages": []}) + "\n")
    work = tmp_path / "w"
    import learning_report
    monkeypatch.setattr(learning_report, "write_report", lambda *a: None)
    fake = FakeSerl()
    run_experiment(parse_args(["--workdir", str(work), "--expert-file", str(rows), "--iterations", "0", "--seeds", "0",
                     "--splits", "valid_unseen", "--panel-per-type", "-1", "--panel-decoding", "greedy", "--jobs", "2",
                     "--compare-model", "old-cold-start", "--compare-override", "env.prompt_layout=step"]),
         fake, monkeypatch)
    assert [c[0] for c in fake.calls if c[0] != "eval"] == ["sft"]  # no `serl data expert`, no `serl train`
    assert (work / "expert.jsonl").read_text() == rows.read_text()
    evals = {c[-1].split("/eval/")[1]: c for c in fake.calls if c[0] == "eval"}
    assert sorted(evals) == ["compare/it000_valid_unseen", "sft/it000_valid_unseen"]
    cmp = evals["compare/it000_valid_unseen"]
    assert "model.path=old-cold-start" in cmp and "env.prompt_layout=step" in cmp
    assert "env.prompt_layout=step" not in evals["sft/it000_valid_unseen"]
    with pytest.raises(SystemExit):
        parse_args(["--expert-file", str(tmp_path / "missing.jsonl")])
    with pytest.raises(SystemExit):
        parse_args(["--iterations", "-1"])


def test_eval_shards_play_each_panel_as_parts_side_by_side_then_merge_them(tmp_path, monkeypatch):
    """``--eval-shards 3``: each panel is three ``serl eval --shard i/3`` into ``OUT/shards/i``, then
    ``serl eval --merge`` of the three into ``OUT``; a re-run skips the finished parts."""
    import learning_report
    monkeypatch.setattr(learning_report, "write_report", lambda *a: None)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"task_id": "g0", "messages": []}) + "\n")
    work = tmp_path / "w"
    args = ["--workdir", str(work), "--expert-file", str(rows), "--iterations", "0", "--seeds", "0",
            "--splits", "valid_unseen", "--panel-per-type", "-1", "--eval-shards", "3"]
    # the second part fails once (a crashed process): the run stops, and the re-run plays only that part
    fake = FakeSerl(stop_at=lambda argv, i: "1/3" in argv)
    with pytest.raises(SystemExit):
        run_experiment(parse_args(args), fake, monkeypatch)
    out = work / "eval" / "sft" / "it000_valid_unseen"
    assert sorted(c[c.index("--shard") + 1] for c in fake.calls if "--shard" in c) == ["0/3", "2/3"]
    assert not (out / "metrics.json").exists()
    fake = FakeSerl()
    run_experiment(parse_args(args), fake, monkeypatch)
    evals = [c for c in fake.calls if c[0] == "eval"]
    assert len(evals) == 2 and evals[0][evals[0].index("--shard") + 1] == "1/3"
    assert evals[0][-1] == str(out / "shards" / "1") and "--num-tasks" in evals[0]
    assert evals[1] == ["eval", "--merge", *(str(out / "shards" / str(i)) for i in range(3)), "--out", str(out)]
    assert (out / "metrics.json").exists()  # the merged panel, where the report reads it
    with pytest.raises(SystemExit):
        parse_args(["--eval-shards", "0"])


def test_alfworld_dagger_rounds_play_label_aggregate_and_fine_tune(tmp_path, monkeypatch):
    """``--dagger-rounds 2`` from ``--sft-model``: each round plays train games with the planner at
    T = 1 from the previous round's model, makes rows, fine-tunes on --dagger-data plus every round's
    rows so far, and gets the start panels; the SFT start keeps its own panel, RL (none here) would
    start from round 2's model; a re-run does nothing."""
    import learning_report

    monkeypatch.setattr(learning_report, "write_report", lambda *a, **k: None)
    model = tmp_path / "cold"
    model.mkdir()
    (model / "config.json").write_text("{}")
    extra = tmp_path / "expert_rows.jsonl"
    extra.write_text('{"expert": 1}\n')
    work = tmp_path / "w"
    args = ["--workdir", str(work), "--sft-model", str(model), "--dagger-rounds", "2", "--dagger-tasks", "6",
            "--dagger-data", str(extra), "--dagger-keep-won", "--dagger-labels", "seen", "--dagger-override", "env.max_steps=20",
            "--iterations", "0", "--seeds", "0", "--splits", "valid_unseen", "--compare-model", "old"]
    fake = FakeSerl()
    run_experiment(parse_args(args), fake, monkeypatch)
    d1, d2 = work / "dagger" / "r1", work / "dagger" / "r2"
    m1, m2 = d1 / "sft" / "model", d2 / "sft" / "model"
    play = lambda m, r, d: ["eval", "recipe=cpu_learn", f"model.path={m}", "env.alfworld.expert=planner",  # noqa: E731
                            "rollout.val_temperature=1.0", "rollout.val_n=1", "env.max_steps=20", "--split", "train",
                            "--num-tasks", "6", "--seed", str(1000 + r), "--out", str(d / "play")]
    rows = lambda r, d: ["data", "dagger", str(d / "play" / "trajectories.jsonl"), "--out", str(d / "rows.jsonl"),  # noqa: E731
                         "--rows-per-episode", "2", "--keep-won", "--labels", "seen", "--seed", str(r)]
    calls = [c for c in fake.calls if not (c[0] == "eval" and "/eval/" in c[-1])]
    assert calls[0] == play(model, 1, d1) and calls[1] == rows(1, d1)
    assert calls[2][:5] == ["sft", "--data", str(d1 / "data.jsonl"), "recipe=cpu_learn", f"model.path={model}"]
    assert calls[3] == play(m1, 2, d2) and calls[4] == rows(2, d2)
    assert calls[5][:5] == ["sft", "--data", str(d2 / "data.jsonl"), "recipe=cpu_learn", f"model.path={m1}"]
    assert f"trainer.output_dir={d2}" in calls[5] and len(calls) == 6
    assert (d2 / "data.jsonl").read_text() == extra.read_text() + (d1 / "rows.jsonl").read_text() + (d2 / "rows.jsonl").read_text()
    panels = {c[-1].split("/eval/")[1]: c for c in fake.calls if c[0] == "eval" and "/eval/" in c[-1]}
    assert sorted(panels) == ["compare/it000_valid_unseen", "dagger1/it000_valid_unseen", "dagger2/it000_valid_unseen",
                              "sft/it000_valid_unseen"]
    assert f"model.path={m2}" in panels["dagger2/it000_valid_unseen"] and f"model.path={model}" in panels["sft/it000_valid_unseen"]
    assert json.loads((work / "start.json").read_text()) == {"model": str(m2), "source": "--sft-model+dagger2"}
    again = FakeSerl()
    run_experiment(parse_args(args), again, monkeypatch)
    assert again.calls == []
    with pytest.raises(SystemExit):
        parse_args(["--env", "math", "--dagger-rounds", "1"])


def test_alfworld_dagger_with_jobs_runs_the_start_panels_beside_the_rounds(tmp_path, monkeypatch):
    """With ``--jobs 2`` the SFT model's start panel does not wait for the DAgger round: the
    round's fine-tuning waits here until that panel has started (sequentially it never would)."""
    import threading

    import learning_report

    monkeypatch.setattr(learning_report, "write_report", lambda *a, **k: None)
    model = tmp_path / "cold"
    model.mkdir()
    (model / "config.json").write_text("{}")
    started, waited = threading.Event(), []

    class Beside(FakeSerl):
        def __call__(self, exp, *argv, seconds=0):
            if argv[0] == "eval" and "/eval/sft/" in argv[-1]:
                started.set()
            if argv[0] == "sft":
                waited.append(started.wait(10))
            return super().__call__(exp, *argv, seconds=seconds)

    fake = Beside()
    run_experiment(parse_args(["--workdir", str(tmp_path / "w"), "--sft-model", str(model), "--dagger-rounds", "1",
                     "--iterations", "0", "--seeds", "0", "--splits", "valid_unseen", "--jobs", "2"]), fake, monkeypatch)
    assert waited == [True]
    assert sorted(c[-1].split("/eval/")[1] for c in fake.calls if c[0] == "eval" and "/eval/" in c[-1]) == [
        "dagger1/it000_valid_unseen", "sft/it000_valid_unseen"]


def test_alfworld_report_start_policies_by_hand(tmp_path):
    """The start table: wins per task type, steps to win, loops among the lost (from actions.jsonl),
    and the SFT start against the compared model game by game."""
    from learning_report import is_loop, start_table

    def panel(policy, won, types, lengths, actions):
        out = tmp_path / "eval" / policy / "it000_valid_unseen"
        out.mkdir(parents=True)
        (out / "tasks.jsonl").write_text("".join(json.dumps({"task_id": f"g{i}", "won": w, "task_type": t, "length": n})
                                                 + "\n" for i, (w, t, n) in enumerate(zip(won, types, lengths))))
        (out / "actions.jsonl").write_text("".join(json.dumps({"actions": a}) + "\n" for a in actions))

    loop, wander = ["go to a", "take x from a"] * 3, [f"go to r{i}" for i in range(6)]
    panel("sft", [True, True, False, False], ["a", "b", "a", "b"], [4, 6, 6, 6], [["x"] * 4, ["y"] * 6, loop, wander])
    panel("compare", [False, True, False, False], ["a", "b", "a", "b"], [6, 8, 6, 6], [loop, ["y"] * 8, loop, loop])
    assert is_loop(loop) and not is_loop(wander) and not is_loop(["a"] * 5)
    lines = start_table(tmp_path, ["valid_unseen"])
    assert lines[2] == "| SFT start | valid_unseen | 2/4 | 1/2 | 1/2 | 5.0 | 1/2 | — | — | — |"
    assert lines[3] == "| compared model | valid_unseen | 1/4 | 0/2 | 1/2 | 8.0 | 3/3 | — | — | — |"
    assert lines[-1] == "| valid_unseen (4) | 1 | 0 | 1 |"  # one game only the SFT start wins: McNemar p = 1
    assert lines[-3] == "| panel | only the SFT start wins | only the compared model wins | McNemar p |"
    assert start_table(tmp_path, ["valid_seen"]) == []
    # a DAgger round's panel: a row of its own, paired with the SFT start before the compared model
    panel("dagger1", [True, True, True, False], ["a", "b", "a", "b"], [4, 5, 6, 6], [["x"] * 4, ["y"] * 5, ["z"] * 6, wander])
    lines = start_table(tmp_path, ["valid_unseen"])
    assert lines[3] == "| DAgger round 1 | valid_unseen | 3/4 | 2/2 | 1/2 | 5.0 | 0/1 | — | — | — |"
    i = lines.index("| panel | only the SFT start wins | only DAgger round 1 wins | McNemar p |")
    assert lines[i + 2] == "| valid_unseen (4) | 0 | 1 | 1 |" and lines[-1] == "| valid_unseen (4) | 1 | 0 | 1 |"
    # --base-eval's panel: the first row, and the SFT start paired with it first
    panel("base", [False, False, True, True], ["a", "b", "a", "b"], [6, 6, 3, 3], [loop, loop, ["x"] * 3, ["y"] * 3])
    lines = start_table(tmp_path, ["valid_unseen"])
    assert lines[2] == "| base model | valid_unseen | 2/4 | 1/2 | 1/2 | 3.0 | 2/2 | — | — | — |"
    i = lines.index("| panel | only the SFT start wins | only the base model wins | McNemar p |")
    assert lines[i + 2] == "| valid_unseen (4) | 2 | 2 | 1 |"


def test_sweep_agreement_by_hand(tmp_path):
    """A panel's moves against the sweep's rule: the first place of the first turn's list not yet
    arrived at (or open where the agent stands at a closed one)."""
    from learning_report import start_table, sweep_agreement

    from serl.trajectory import Step, Task, Trajectory, write_jsonl

    first = ["go to cabinet 1", "go to drawer 1", "go to shelf 1", "look"]

    def step(i, obs, adm, action):
        return Step(step_id=i, observation=obs, prompt="", prompt_ids=[], response_ids=[], response_text="",
                    action_mask=[], action=action, action_valid=True, admissible_actions=adm)

    agrees = [step(0, "You are in the middle of a room.", first, "go to cabinet 1"),         # the rule's first place
              step(1, "You arrive at cabinet 1. The cabinet 1 is closed.", ["open cabinet 1", "go to drawer 1"],
                   "open cabinet 1"),                                                       # closed where it stands
              step(2, "You open the cabinet 1. In it, you see nothing.", ["go to drawer 1", "go to shelf 1"],
                   "go to drawer 1"),                                                       # the next unvisited
              step(3, "You arrive at drawer 1. On it, you see a mug 1.", ["take mug 1 from drawer 1"],
                   "take mug 1 from drawer 1")]                                             # not a move
    strays = [step(0, "You are in the middle of a room.", first, "go to shelf 1"),             # not the first place
              step(1, "You arrive at shelf 1. On it, you see nothing.", first[:2], "go to cabinet 1")]  # it is now
    task = Task("alfworld", "g0", "look_at_obj_in_light")
    out = tmp_path / "eval" / "sft" / "it000_valid_unseen"
    out.mkdir(parents=True)
    write_jsonl(out / "trajectories.jsonl", [Trajectory(uid="a", traj_uid="a", task=task, task_text="", steps=agrees),
                                             Trajectory(uid="b", traj_uid="b", task=task, task_text="", steps=strays)])
    assert sweep_agreement(out / "trajectories.jsonl") == (4, 5)
    (out / "tasks.jsonl").write_text("".join(json.dumps({"task_id": f"g{i}", "won": False, "task_type": "a", "length": 2})
                                             + "\n" for i in range(2)))
    assert start_table(tmp_path, ["valid_unseen"])[2].endswith("| 4/5 (80%) | — | — |")
    # serl eval's metrics.json: the lost games that saw and that took the task's object
    (out / "metrics.json").write_text(json.dumps({"alfworld_lost_saw_object": 0.5, "alfworld_lost_took_object": 0.25}))
    assert start_table(tmp_path, ["valid_unseen"])[2].endswith("| 4/5 (80%) | 50% / 25% | — |")
    # and where the two decisions of a search were due, the share made (an eval without such states: "—")
    (out / "metrics.json").write_text(json.dumps({"alfworld_open_when_closed": 0.5}))
    assert start_table(tmp_path, ["valid_unseen"])[2].endswith("| 4/5 (80%) | — | 50% / — |")


@pytest.mark.parametrize("leg,extra,sft_settings,evals", [
    ("alfworld_sft_size", ["--expert-tasks", "60", "--data-dir", "DATA"],
     ["model.path=smollm2-135m-instruct", "model.lora.r=8", "sft.epochs=1", "sft.batch_size=4", "sft.lr=5e-4",
      "sft.warmup_steps=3"],
     {("sft", "valid_seen"), ("sft", "valid_unseen"), ("compare", "valid_seen"), ("compare", "valid_unseen")}),
    ("math_sft_size", ["--expert-rows", "2", "--panel-size", "3"],
     ["model.path=smollm2-135m-instruct", "model.lora.r=8", "sft.epochs=1", "sft.batch_size=8", "sft.lr=5e-4"],
     {(p, f"gsm8k-test_{d}") for p in ("base", "sft", "compare") for d in ("greedy", "avg4")}),
])
def test_sft_size_legs_run_the_retired_scripts_settings(leg, extra, sft_settings, evals, tmp_path, monkeypatch):
    """The cold-start size curves are legs now: one point = the leg plus its size; the SFT gets the
    settings of the scripts that made the published curves (later overrides win in serl), then every
    panel of the SFT and of the shipped cold start, greedy, and no RL."""
    fake = FakeSerl()
    import learning_report

    monkeypatch.setattr(learning_report, "write_report", lambda *a, **k: None)
    a = parse_args([f"@{REPO_ROOT / 'experiments' / 'legs' / (leg + '.args')}", "--workdir", str(tmp_path / "w"), *extra])
    run_experiment(a, fake, monkeypatch)
    (sft,) = [c for c in fake.calls if c[0] == "sft"]
    kv = dict(x.split("=", 1) for x in sft if "=" in x and not x.startswith("-"))  # the last value of a key wins
    assert [f"{k}={kv[k]}" for k in (s.split("=")[0] for s in sft_settings)] == sft_settings
    assert not [c for c in fake.calls if c[0] == "train"]
    got = {(Path(c[-1]).parent.name, Path(c[-1]).name.split("_", 1)[1]) for c in fake.calls if c[0] == "eval"}
    assert got == evals
    assert all("--greedy" in c for c in fake.calls if c[0] == "eval" and "avg" not in c[-1])


def test_alfworld_report_dagger_rounds_by_hand(tmp_path):
    """The DAgger table: per round, the train games won, the steps right by the planner, the rows."""
    from learning_report import dagger_table

    from serl.envs.base import Task
    from serl.trajectory import Step, Trajectory, write_jsonl

    def step(i, action, plan, won=False):
        return Step(step_id=i, observation="", prompt="", prompt_ids=[1], response_ids=[2], response_text="",
                    action_mask=[1], action=action, action_valid=True, won=won, done=won, info={"expert_plan": plan})

    won = Trajectory(uid="g", traj_uid="a", task=Task("alfworld", "g0", "look_at_obj_in_light"))
    won.extra["expert_plan0"] = ["go to desk 1", "use lamp 1"]
    won.steps = [step(0, "go to desk 1", ["use lamp 1"]), step(1, "use lamp 1", [], won=True)]  # right, right
    lost = Trajectory(uid="h", traj_uid="b", task=Task("alfworld", "g1", "look_at_obj_in_light"))
    lost.extra["expert_plan0"] = ["go to desk 1", "use lamp 1"]
    lost.steps = [step(0, "look", ["go to desk 1", "use lamp 1"]), step(1, "go to desk 1", ["use lamp 1"])]  # wrong, right
    d = tmp_path / "dagger" / "r1"
    (d / "play").mkdir(parents=True)
    write_jsonl(d / "play" / "trajectories.jsonl", [won, lost])
    (d / "rows.jsonl").write_text('{"source": "dagger"}\n{"source": "won"}\n')
    assert dagger_table(tmp_path)[2] == "| 1 | 1/2 | 3/4 (75%) | 1 | 1 |"
    assert dagger_table(tmp_path / "none") == []


def test_dagger_leg_plays_labels_fine_tunes_and_compares_without_rl(tmp_path, monkeypatch):
    """experiments/legs/alfworld_dagger.args: one round from the shipped conversation cold start
    (its play at T = 1, 20 steps, the planner on), the SFT with the leg's settings, then the round's
    model and the cold start on every held-out game greedily; no RL."""
    import learning_report

    monkeypatch.setattr(learning_report, "write_report", lambda *a, **k: None)
    cold = tmp_path / "cold"
    cold.mkdir()
    (cold / "config.json").write_text("{}")
    fake = FakeSerl()
    a = parse_args([f"@{REPO_ROOT / 'experiments' / 'legs' / 'alfworld_dagger.args'}", "--workdir", str(tmp_path / "w"),
                    "--sft-model", str(cold), "--data-dir", "DATA"])
    run_experiment(a, fake, monkeypatch)
    assert [c[0] for c in fake.calls if c[0] != "eval"] == ["data", "sft"]
    play = fake.calls[0]
    for x in ("recipe=cpu_conversation", "env.alfworld.expert=planner", "rollout.val_temperature=1.0", "env.max_steps=20"):
        assert x in play
    assert play[play.index("--num-tasks") + 1] == "120" and play[play.index("--split") + 1] == "train"
    rows = fake.calls[1]
    assert "--keep-won" in rows and rows[rows.index("--labels") + 1] == "seen"
    assert rows[rows.index("--rows-per-episode") + 1] == "4" and "--think" not in rows
    sweep = FakeSerl()
    run_experiment(parse_args([f"@{REPO_ROOT / 'experiments' / 'legs' / 'alfworld_dagger.args'}", "--workdir",
                               str(tmp_path / "ws"), "--sft-model", str(cold), "--data-dir", "DATA",
                               "--dagger-labels", "sweep", "--think", "state"]), sweep, monkeypatch)
    assert sweep.calls[1][sweep.calls[1].index("--labels"):][:2] == ["--labels", "sweep"]
    assert sweep.calls[1][sweep.calls[1].index("--think") + 1] == "state"
    (sft,) = [c for c in fake.calls if c[0] == "sft"]
    assert "sft.epochs=1" in sft and f"model.path={cold}" in sft
    got = {(Path(c[-1]).parent.name, Path(c[-1]).name) for c in fake.calls if c[0] == "eval" and "/eval/" in c[-1]}
    assert got == {(p, f"it000_{s}") for p in ("sft", "dagger1") for s in ("valid_seen", "valid_unseen")}
    assert all("--greedy" in c and c[c.index("--num-tasks") + 1] == "-1" for c in fake.calls if "/eval/" in c[-1])


def test_search_cold_start_leg_makes_the_experts_episodes_and_pairs_the_panels(tmp_path, monkeypatch):
    """experiments/legs/alfworld_search_coldstart.args with --expert sweep: the expert phase plays 300
    train games with that expert, the SFT starts from the recipe's model (the conversation cold
    start) with the leg's settings, and the SFT model and that start (--base-eval) play every
    valid_unseen game greedily; --expert is refused with --expert-file and outside ALFWorld."""
    import learning_report

    monkeypatch.setattr(learning_report, "write_report", lambda *a, **k: None)
    leg = f"@{REPO_ROOT / 'experiments' / 'legs' / 'alfworld_search_coldstart.args'}"
    fake = FakeSerl()
    run_experiment(parse_args([leg, "--expert", "sweep", "--workdir", str(tmp_path / "w"), "--data-dir", "DATA"]),
                   fake, monkeypatch)
    assert [c[0] for c in fake.calls if c[0] != "eval"] == ["data", "sft"]
    data = fake.calls[0]
    assert data[:3] == ["data", "expert", "alfworld"] and "recipe=cpu_conversation" in data
    assert [data[data.index(f) + 1] for f in ("--expert", "--num-tasks", "--seed", "--split")] == ["sweep", "300", "7", "train"]
    assert "--think" not in data  # the default: the task templates
    fake_state = FakeSerl()
    run_experiment(parse_args([leg, "--expert", "sweep", "--think", "state", "--workdir", str(tmp_path / "ws"),
                               "--data-dir", "DATA"]), fake_state, monkeypatch)
    assert fake_state.calls[0][fake_state.calls[0].index("--think") + 1] == "state"
    (sft,) = [c for c in fake.calls if c[0] == "sft"]
    assert "model.lora.r=8" in sft and "sft.micro_batch_size=1" in sft and not any(x.startswith("model.path=") for x in sft)
    got = {Path(c[-1]).parent.name for c in fake.calls if c[0] == "eval" and "/eval/" in c[-1]}
    assert got == {"sft", "base"} and all("--greedy" in c for c in fake.calls if c[0] == "eval")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    for bad in ([leg, "--expert", "sweep", "--expert-file", str(rows)], ["--env", "math", "--expert", "sweep"],
                [leg, "--expert", "search", "--think", "state"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
