"""experiments/learning.py runs end to end on the tiny model: expert rows from the shipped fixture,
SFT (LoRA), panel evaluation at the SFT start, 1 seed x 1 iteration of GRPO and of SERL with a
panel evaluation after it, and the report (LEARNING.md with its tables, and the PNG plot). The math
leg without a model: its options, the command lines of its phases (``Experiment.serl`` replaced by a
recorder) with resume and skip, and its report from synthetic files, checked by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "experiments"))  # the scripts import their siblings by name

import learning  # noqa: E402
import learning_math_report as lmr  # noqa: E402
import learning_stats as stats  # noqa: E402
from learning_fakes import FakeSerl, run_experiment, write_data  # noqa: E402
from learning_options import MATH_ALGOS, MATH_SFT_DEFAULTS, parse_args  # noqa: E402


def test_learning_script_end_to_end_on_the_tiny_model(tiny_model_dir, tmp_path):
    work = tmp_path / "learning"
    small = [f"model.path={tiny_model_dir}", "data.max_response_length=8", "env.max_steps=2",
             "trainer.progress=false", "rollout.micro_batch_size=4"]
    cmd = [sys.executable, str(REPO_ROOT / "experiments" / "learning.py"), "--workdir", str(work),
           "--expert-tasks", "2", "--seeds", "0", "--iterations", "1", "--eval-every", "1",
           "--panel-per-type", "1", "--splits", "valid_unseen", "--algos", "grpo", "serl",
           "--override", *small, "--sft-override", "sft.max_steps=2", "sft.batch_size=2"]
    # this checkout's serl, also where the installed one is another copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    rows = [json.loads(x) for x in (work / "expert.jsonl").read_text().splitlines()]
    assert rows and {x["task_type"] for x in rows} <= {"look_at_obj_in_light", "pick_and_place_simple"}
    assert (work / "sft" / "model" / "config.json").exists()
    for policy in ("sft/it000", "grpo_s0/it001", "serl_s0/it001"):
        m = json.loads((work / "eval" / f"{policy}_valid_unseen" / "metrics.json").read_text())
        assert m["num_tasks"] == 2 and 0.0 <= m["valid_action_ratio"] <= 1.0
    for algo in ("grpo", "serl"):
        cfg = (work / "rl" / f"{algo}_s0" / "config.yaml").read_text()
        assert f"enable: {'true' if algo == 'serl' else 'false'}" in cfg
        lines = (work / "rl" / f"{algo}_s0" / "metrics.jsonl").read_text().splitlines()
        assert "critic/advantages/nonzero_group_fraction" in json.loads(lines[0])
    md = (work / "LEARNING.md").read_text()
    assert "| SFT start | valid_unseen |" in md and "| serl, iteration 1 | valid_unseen |" in md
    assert "| grpo | 1 |" in md and "Wall time per phase" in md
    png = (work / "learning.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    # resumable: a second run finds every phase done and runs no serl command
    r2 = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r2.returncode == 0 and "+ serl " not in r2.stdout


def test_learning_script_webshop_leg_on_the_tiny_model(tiny_model_dir, tmp_path):
    """``--env webshop``: oracle rows on train goals, SFT, the panel = test goals 0..1 evaluated
    with its mean score, 1 seed x 1 iteration of GRPO and SERL, and the WebShop report."""
    work = tmp_path / "learning_webshop"
    small = [f"model.path={tiny_model_dir}", "data.max_response_length=8", "env.max_steps=2",
             "trainer.progress=false", "rollout.micro_batch_size=4"]
    cmd = [sys.executable, str(REPO_ROOT / "experiments" / "learning.py"), "--env", "webshop", "--workdir", str(work),
           "--expert-tasks", "2", "--seeds", "0", "--iterations", "1", "--eval-every", "1", "--panel-size", "2",
           "--algos", "grpo", "serl", "--override", *small, "--sft-override", "sft.max_steps=1", "sft.batch_size=2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "+ serl data expert webshop recipe=cpu_learn_webshop" in r.stdout and "--min-score 1.0" in r.stdout

    rows = [json.loads(x) for x in (work / "expert.jsonl").read_text().splitlines()]
    assert rows and {x["env"] for x in rows} == {"webshop"}
    assert all(x["task_score"] == 1.0 and int(x["task_id"]) >= 500 for x in rows)  # won train goals only
    for policy in ("sft/it000", "grpo_s0/it001", "serl_s0/it001"):
        d = work / "eval" / f"{policy}_test"
        m = json.loads((d / "metrics.json").read_text())
        assert m["num_tasks"] == 2 and 0.0 <= m["webshop_task_score"] <= 1.0
        ids = [json.loads(x)["task_id"] for x in (d / "tasks.jsonl").read_text().splitlines()]
        assert ids == ["0", "1"]  # the panel: the first test goals, in order
    for algo in ("grpo", "serl"):
        cfg = (work / "rl" / f"{algo}_s0" / "config.yaml").read_text()
        assert "name: webshop" in cfg and "history_length: 2" in cfg
    md = (work / "LEARNING.md").read_text()
    assert md.startswith("# Learning experiment: WebShop")
    assert "| policy | split | success | mean score | valid-action ratio |" in md
    assert "| SFT start | test |" in md and "| serl, iteration 1 | test |" in md and "| grpo | 1 |" in md
    assert "WebShop test goals 0–1" in md and "- test: `0`, `1`" in md
    assert (work / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    r2 = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r2.returncode == 0 and "+ serl " not in r2.stdout


# ---------------------------------------------------------------------------- the math leg (no model)
def test_math_options_defaults_and_errors():
    a = parse_args(["--env", "math"])
    assert (a.recipe, a.workdir, a.lora_r, a.iterations, a.eval_every) == ("cpu_math", "runs/learning_math", 0, 40, 20)
    assert a.algos == ["grpo", "spear", "serl"] and a.seeds == [0, 1, 2] and a.splits == ["gsm8k:test"]
    assert (a.panel_size, a.panel_avg_k, a.base_eval, a.expert_tasks, a.expert_rows) == (128, 4, True, -1, 1024)
    assert a.sft_defaults == MATH_SFT_DEFAULTS == ["sft.epochs=1", "sft.lr=5e-5", "sft.batch_size=8",
                                                   "sft.micro_batch_size=4"]
    b = parse_args(["--env", "math", "--no-base-eval", "--lora-r", "16", "--panel-avg-k", "0", "--algos", "spear"])
    assert (b.base_eval, b.lora_r, b.panel_avg_k, b.algos) == (False, 16, 0, ["spear"])
    old = parse_args([])  # ALFWorld keeps its original defaults
    assert (old.lora_r, old.algos, old.base_eval, old.sft_defaults, old.expert_rows) == (8, ["grpo", "serl"], False, [], None)
    for bad in (["--env", "math", "--algos", "serl_anchor"], ["--env", "math", "--panel-avg-k", "1"],
                ["--expert-rows", "5"], ["--env", "math", "--iterations", "30"], ["--env", "alfworld", "--algos", "spear"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_math_panel_avg_only_at_the_ends_by_default():
    """avg@k runs at iteration 0 and the last iteration (--panel-avg-at ends), greedy everywhere."""
    from learning_options import panel_labels

    a = parse_args(["--env", "math", "--iterations", "20", "--eval-every", "10"])
    assert a.panel_avg_at == "ends"
    both = [("gsm8k-test_greedy", "gsm8k:test", "greedy"), ("gsm8k-test_avg4", "gsm8k:test", "avg4")]
    assert panel_labels(a, 0) == both and panel_labels(a, 20) == both and panel_labels(a) == both
    assert panel_labels(a, 10) == both[:1]
    e = parse_args(["--env", "math", "--iterations", "20", "--eval-every", "10", "--panel-avg-at", "every"])
    assert panel_labels(e, 10) == both


def test_math_algorithms_load_as_configs():
    """Each math algorithm's overrides give a config serl accepts, with the switches said."""
    from serl.configure import check_config, load_config

    got = {}
    for name, ov in MATH_ALGOS.items():
        cfg = load_config("cpu_math", ov)
        check_config(cfg)
        alg = cfg.algorithm
        got[name] = (alg.spear.enable_trajectory_replay, alg.use_toolcall_reward, alg.serl.enable, alg.serl.sampling_mode,
                     alg.filter_groups.enable, alg.filter_groups.metric)
    assert got["grpo"][:3] == (False, "none", False) and got["grpo"][4] is False
    assert got["grpo_ds"][:3] == got["grpo"][:3] and got["grpo_ds"][4:] == (True, "won")
    assert got["spear"][:3] == (True, "cosine", False)
    assert got["serl"][:4] == (False, "none", True, "reference_solution")


def _math_args(work, *extra):
    return parse_args(["--env", "math", "--workdir", str(work), "--seeds", "0", "1", "--iterations", "4",
                       "--eval-every", "2", "--panel-size", "3", "--algos", "grpo", "serl", "--expert-rows", "2", *extra])


def test_math_phase_command_lines_resume_and_skip(tmp_path, monkeypatch):
    work = tmp_path / "w"
    # interrupted at grpo seed 0's second chunk (a resume of a run that has a checkpoint)
    first = FakeSerl(stop_at=lambda argv, n: argv[:2] == ["train", "--resume"])
    with pytest.raises(SystemExit):
        run_experiment(_math_args(work), first, monkeypatch)
    sft, pool = work / "sft" / "model", work / "expert_pool.jsonl"
    ev = lambda p, it, lab: str(work / "eval" / p / f"it{it:03d}_gsm8k-test_{lab}")  # noqa: E731
    panel = ["--split", "gsm8k:test", "--num-tasks", "3"]
    want = [
        ["data", "expert", "math", "recipe=cpu_math", "--split", "gsm8k:train", "--num-tasks", "-1", "--seed", "0",
         "--out", str(pool)],
        ["sft", "--data", str(work / "expert.jsonl"), "recipe=cpu_math", "model.path=smollm2-135m-instruct", "model.lora.r=0", *MATH_SFT_DEFAULTS,
         f"trainer.output_dir={work}", "trainer.run_name=sft", "trainer.overwrite=true"],
        ["eval", "recipe=cpu_math", "model.path=smollm2-135m-instruct", *panel, "--greedy", "--seed", "1000", "--out",
         ev("base", 0, "greedy")],
        ["eval", "recipe=cpu_math", "model.path=smollm2-135m-instruct", "rollout.val_n=4", *panel, "--seed", "1000", "--out", ev("base", 0, "avg4")],
        ["eval", "recipe=cpu_math", f"model.path={sft}", *panel, "--greedy", "--seed", "1000", "--out", ev("sft", 0, "greedy")],
        ["eval", "recipe=cpu_math", f"model.path={sft}", "rollout.val_n=4", *panel, "--seed", "1000", "--out",
         ev("sft", 0, "avg4")],
        ["train", "recipe=cpu_math", *MATH_ALGOS["grpo"], f"model.path={sft}", "seed=0", f"trainer.output_dir={work / 'rl'}",
         "trainer.run_name=grpo_s0", "trainer.total_training_steps=2", "trainer.max_checkpoints_to_keep=1",
         "trainer.overwrite=true"],
        ["eval", "--run", str(work / "rl" / "grpo_s0"), *panel, "--greedy", "--seed", "1000", "--out",
         ev("grpo_s0", 2, "greedy")],  # avg@4 only at the ends (--panel-avg-at ends): iterations 0 and 4
    ]
    assert first.calls[: len(want)] == want
    serl_train = first.calls[len(want)]
    assert serl_train[0] == "train" and "algorithm.serl.sampling_mode=reference_solution" in serl_train
    assert len(first.calls) == len(want) + 2  # serl_s0: train + its greedy eval, then the interruption
    assert [json.loads(x)["uid"] for x in (work / "expert.jsonl").read_text().splitlines()] == ["p0", "p1"]
    assert json.loads((work / "start.json").read_text()) == {"model": str(sft), "source": "expert+sft"}

    second = FakeSerl()  # the same command again: continues where it stopped, redoes nothing finished
    run_experiment(_math_args(work), second, monkeypatch)
    assert second.calls[0] == ["train", "--resume", str(work / "rl" / "grpo_s0"), "trainer.total_training_steps=4"]
    assert not [c for c in second.calls if c[0] in ("data", "sft") or "it000" in c[-1] or "it002_" in c[-1] and "_s0" in c[-1]]
    trains = [c for c in second.calls if c[0] == "train"]
    # seed 0: both algorithms resume to 4; seed 1: both start (to 2), then resume (to 4)
    assert len(trains) == 6 and [c[1] == "--resume" for c in trains] == [True, True, False, False, True, True]
    for p in ("grpo_s0", "grpo_s1", "serl_s0", "serl_s1"):
        for it, lab in ((2, "greedy"), (4, "greedy"), (4, "avg4")):
            assert (Path(ev(p, it, lab)) / "metrics.json").exists()
        assert not Path(ev(p, 2, "avg4")).exists()
    third = FakeSerl()
    run_experiment(_math_args(work), third, monkeypatch)
    assert third.calls == []


def test_math_sft_model_option_skips_expert_and_sft(tmp_path, monkeypatch):
    model = tmp_path / "my_sft"
    model.mkdir()
    (model / "config.json").write_text("{}")
    work = tmp_path / "w"
    fake = FakeSerl()
    run_experiment(_math_args(work, "--sft-model", str(model), "--no-base-eval", "--panel-avg-k", "0"), fake, monkeypatch)
    assert [c[0] for c in fake.calls][:2] == ["eval", "train"] and not [c for c in fake.calls if c[0] in ("data", "sft")]
    assert fake.calls[0][:2] == ["eval", "recipe=cpu_math"] and f"model.path={model}" in fake.calls[0]
    assert f"model.path={model}" in fake.calls[1]
    assert json.loads((work / "start.json").read_text()) == {"model": str(model), "source": "--sft-model"}
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="use another --workdir"):
        run_experiment(_math_args(work, "--sft-model", str(other)), FakeSerl(), monkeypatch)
    with pytest.raises(SystemExit, match="no config.json"):
        run_experiment(_math_args(tmp_path / "w2", "--sft-model", str(tmp_path)), FakeSerl(), monkeypatch)


# ---------------------------------------------------------------------------- the math report
def test_math_report_statistics_by_hand():
    assert stats.moving_average([0.0, 1.0, 2.0, 3.0], 2) == [0.0, 0.5, 1.5, 2.5]
    assert stats.moving_average([4.0, 2.0], 1) == [4.0, 2.0]
    with pytest.raises(ValueError, match="window"):
        stats.moving_average([1.0], 0)
    assert stats.seed_band({0: [1.0, 2.0, 3.0], 1: [3.0, 4.0]}) == ([2.0, 3.0, 3.0], [1.0, 2.0, 3.0], [3.0, 4.0, 3.0], [2, 2, 1])
    assert stats.mean_std([0.25, 0.5, 0.75]) == "0.500 ± 0.250 (n=3)" and stats.mean_std([]) == "—"
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == 0.25  # |sum| 6 is reached by 2 of the 8 sign vectors
    assert stats.sign_flip_p([0.0, 0.25, 0.5]) == 0.5  # sums ±0.25 ± 0.5 (× 2 for the 0): |.| >= 0.75 in 4 of 8
    assert stats.sign_flip_p([1.0, -1.0]) == 1.0
    assert stats.permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1)  # 2 of C(6,3) = 20 splits
    assert stats.permutation_p([0.75, 0.75, 1.0], [0.25, 0.5, 0.75]) == pytest.approx(0.3)  # 6 of 20
    assert stats.mcnemar_p(0, 5) == 0.0625 and stats.mcnemar_p(1, 1) == 1.0 and stats.mcnemar_p(0, 0) == 1.0
    assert stats.mcnemar_p(8, 1) == pytest.approx(2 * 10 / 512)
    # by task: one run (nets ±1) is McNemar; [3, 3]: sums ±6 and 0 (twice), |.| >= 6 in 2 of 4
    assert stats.paired_counts_p([1] * 8 + [-1, 0, 0]) == stats.mcnemar_p(8, 1)
    assert stats.paired_counts_p([3, 3]) == 0.5 and stats.paired_counts_p([2, 1, 1]) == 0.25
    assert stats.paired_counts_p([2, -1]) == 1.0 and stats.paired_counts_p([0, 0]) == 1.0
    # the same 6 up / 0 down as pooled counts: McNemar says 0.031, the tasks (two, each up 3 times) 0.5
    assert stats.mcnemar_p(6, 0) == 0.03125
    for bad in (lambda: stats.sign_flip_p([]), lambda: stats.permutation_p([], [1.0]), lambda: stats.mcnemar_p(-1, 2),
                lambda: stats.paired_counts_p([1.0])):
        with pytest.raises(ValueError):
            bad()


def test_serl_weight_stats_by_hand():
    """Iterations whose teacher scored nothing (empty_target_batch 1) are left out; a partly scored
    one's W mean is taken over its scored micro-batches: (0.9 - 0.5) / (1 - 0.5) = 0.8."""
    m = "serl_action_mask/"
    unscored = {m + "empty_target_batch": 1.0, m + "weight_mean": 1.0}
    half = {m + "empty_target_batch": 0.5, m + "weight_mean": 0.9, m + "weight_min": 0.7, m + "weight_max": 1.1,
            m + "delta_abs_mean": 0.02, m + "clipped_fraction": 0.1}
    full = {m + "empty_target_batch": 0.0, m + "weight_mean": 1.2, m + "weight_min": 0.9, m + "weight_max": 1.3,
            m + "delta_abs_mean": 0.04, m + "clipped_fraction": 0.3}
    w = stats.serl_weight_stats([unscored, half, full, {"episode/success_rate": 0.5}])
    assert w == pytest.approx({"iterations": 2, "weight_mean": 1.0, "weight_min": 0.7, "weight_max": 1.3,
                               "delta_abs_mean": 0.03, "clipped_fraction": 0.2})
    assert stats.serl_weight_stats([unscored]) is None and stats.serl_weight_stats([]) is None


def _synthetic_math_workdir(work: Path) -> None:
    """4 panel problems; SFT solves problem 0; grpo ends at 1/4, 2/4, 3/4 greedy, serl at 3/4, 3/4, 4/4."""
    write_data(work / "phases.json", {"expert": 60.0, "sft": 600.0, "eval": 120.0, "rl/grpo": 300.0})
    write_data(work / "start.json", {"model": str(work / "sft" / "model"), "source": "expert+sft"})
    write_data(work / "expert_pool.jsonl", [{"uid": i} for i in range(5)])
    write_data(work / "expert.jsonl", [{"uid": i} for i in range(2)])
    write_data(work / "sft" / "metrics.jsonl", [{"iteration": 1, "sft/loss": 2.0}, {"iteration": 2, "sft/loss": 1.0}])
    ids = [f"gsm8k-test-{i:05d}" for i in range(4)]

    def ev(policy, it, solved, avg, tool=1.0):
        d = work / "eval" / policy / f"it{it:03d}_gsm8k-test_greedy"
        write_data(d / "metrics.json", {"success_rate": len(solved) / 4, "num_tasks": 4, "tool_call_rate": tool})
        write_data(d / "tasks.jsonl", [{"task_id": t, "won": i in solved} for i, t in enumerate(ids)])
        write_data(work / "eval" / policy / f"it{it:03d}_gsm8k-test_avg4" / "metrics.json",
               {"success_rate": avg, "acc/mean@4": avg, "acc/pass@4": min(1.0, 2 * avg), "num_tasks": 4, "tool_call_rate": tool})

    ev("base", 0, set(), 0.0, tool=0.0)
    ev("sft", 0, {0}, 0.25)
    for s, end in enumerate(({0}, {0, 1}, {0, 1, 2})):
        ev(f"grpo_s{s}", 2, {0}, 0.25)
        ev(f"grpo_s{s}", 4, end, 0.25 * (s + 1))
    for s, end in enumerate(({0, 1, 2}, {1, 2, 3}, {0, 1, 2, 3})):
        ev(f"serl_s{s}", 2, {0}, 0.5)
        ev(f"serl_s{s}", 4, end, 0.75)
    acc = {"grpo": [[0.0, 0.5, 0.5, 1.0], [0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]],
           "serl": [[0.5, 0.5, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0], [0.0, 0.5, 0.5, 1.0]]}
    for algo, runs in acc.items():
        for s, curve in enumerate(runs):
            rows = []
            for i, a in enumerate(curve, start=1):
                r = {"iteration": i, "episode/success_rate": a, "tool/trajectory_with_call_fraction": 1.0,
                     "critic/advantages/nonzero_group_fraction": 0.5, "timing/iteration_s": 60.0}
                if algo == "serl":
                    # iteration 1: no micro-batch scored; 3: half of them (W 1.02 there, 1 logged for the rest)
                    e = {1: 1.0, 3: 0.5}.get(i, 0.0)
                    r.update({"serl_action_mask/empty_target_batch": e,
                              "serl_action_mask/weight_mean": e + (1 - e) * 1.02,
                              "serl_action_mask/weight_min": 0.8 + 0.01 * i, "serl_action_mask/weight_max": 1.2 - 0.01 * i,
                              "serl_action_mask/delta_abs_mean": 0.01 * i, "serl_action_mask/clipped_fraction": 0.1})
                rows.append(r)
            write_data(work / "rl" / f"{algo}_s{s}" / "metrics.jsonl", rows)
    write_data(work / "rl" / "grpo_s0" / "trace" / "4.jsonl",
           [{"iteration": 4, "task_id": "gsm8k-train-00001", "task_text": "How many?", "won": True, "episode_reward": 1.0,
             "response": "It is \\boxed{3}", "advantage": 0.5},
            {"iteration": 4, "task_id": "gsm8k-train-00002", "task_text": "How much?", "won": False, "episode_reward": -1.0,
             "response": "I give up", "advantage": -0.5}])
    write_data(work / "rl" / "serl_s1" / "trace" / "4.jsonl",
           [{"iteration": 4, "task_id": "gsm8k-train-00003", "task_text": "Twice 4?", "won": True, "episode_reward": 1.0,
             "response": '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(2*4)"}}\n</tool_call>'
                         "user\n<tool_response>\n8\n</tool_response>\nThe answer is \\boxed{8}", "advantage": 0.75}])
    write_data(work / "rl" / "serl_s0" / "trace" / "2.jsonl",
           [{"iteration": 2, "task_id": "gsm8k-train-00009", "task_text": "Old", "won": True, "episode_reward": 1.0,
             "response": "<tool_call>x</tool_call>", "advantage": 1.0}])


def test_math_report_from_synthetic_files(tmp_path):
    work = tmp_path / "w"
    _synthetic_math_workdir(work)
    args = parse_args(["--env", "math", "--workdir", str(work), "--iterations", "4", "--eval-every", "2",
                       "--panel-size", "4", "--algos", "grpo", "serl", "--smooth-window", "2"])
    md_path = lmr.write_math_report(work, args, json.loads((work / "phases.json").read_text()), "Test CPU")
    md = md_path.read_text()
    assert md_path == work / "LEARNING_math.md" and md.startswith("# Learning experiment: math")
    assert "Machine: Test CPU" in md and "Status: complete." in md and "| sft | 10.0 |" in md
    assert "Cold start: 2 expert rows (the first of the 5" in md and "loss 2.000 → 1.000" in md
    assert "| base model | 0 | 0.000 (0/4) | 0.000 | 0.000 | 0.000 |" in md
    assert "| SFT start | 0 | 0.250 (1/4) | 0.250 | 0.500 | 1.000 |" in md
    # grpo ends at 1/4, 2/4, 3/4: mean 0.5, sample std 0.25; serl at 3/4, 3/4, 1: 0.833 ± 0.144
    assert "| grpo | 4 | 0.500 ± 0.250 (n=3) | 0.500 ± 0.250 (n=3) |" in md
    assert "| serl | 4 | 0.833 ± 0.144 (n=3) | 0.750 ± 0.000 (n=3) |" in md
    assert "| serl | 2 | 0.250 ± 0.000 (n=3) | 0.500 ± 0.000 (n=3) |" in md
    # vs SFT (0.25): grpo Δ = 0, 0.25, 0.5 -> sign-flip p 0.5; serl Δ all > 0 -> p 0.25; serl vs grpo: p 0.3
    assert "| grpo | greedy accuracy | 2 / 1 / 0 | +0.250 | 0.500 | — | — |" in md
    assert "| serl | greedy accuracy | 3 / 0 / 0 | +0.583 | 0.250 | +0.333 | 0.300 |" in md
    # per problem: serl solves 2 + 3 + 3 problems the SFT start misses, and misses problem 0 once
    # by problem, net over the seeds: problem 0 -1 (lost by seed 1), 1 and 2 +3, 3 +2: |sum| 7 of weights
    # 1, 3, 3, 2 is reached by all signs + and by the 1 flipped, and their negatives: 4 of 16
    assert "| serl | 3 | 8 | 1 | 0.039 | 3 / 1 | 0.250 |" in md
    # signal per 2 iterations: grpo seed means (0.25, 0, 0.5) -> 0.250 ± 0.250; (0.75, 0.5, 0.5) -> 0.583 ± 0.144
    assert "| 1–2 | 3 | 0.250 ± 0.250 | 1.000 | 0.500 | 60.0 | — | — | — |" in md
    assert "| 3–4 | 3 | 0.583 ± 0.144 | 1.000 | 0.500 | 60.0 | — | — | — |" in md
    # serl block 1–2: only iteration 2 was scored (3 seeds): W 1.02 in [0.82, 1.18], |Δ| 0.02
    assert "| 1.020 [0.820, 1.180] (3 it.) | 0.0200 | 0.100 |" in md
    # block 3–4: iteration 3 (half its micro-batches scored) counts, its W mean undiluted: 1.02
    assert "| 1.020 [0.830, 1.170] (6 it.) | 0.0350 | 0.100 |" in md
    assert "`serl_s1`, iteration 4, problem `gsm8k-train-00003`" in md  # solved with a tool call, latest iteration
    assert "**Failed** — `grpo_s0`, iteration 4" in md
    assert "`gsm8k-test-00000`, `gsm8k-test-00001`, `gsm8k-test-00002`, `gsm8k-test-00003`" in md
    assert (work / "learning_math.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a partial experiment: serl seed 2 has no end point yet -> the end rows use seeds 0 and 1, and say so
    (work / "eval" / "serl_s2" / "it004_gsm8k-test_avg4" / "metrics.json").unlink()
    md = lmr.write_math_report(work, args, {}, "Test CPU").read_text()
    assert "Status: **partial**" in md and "serl: seeds [0, 1] finished; in progress serl_s2 (4 it.)" in md
    assert "| serl | 4 | 0.750 ± 0.000 (n=2) |" in md and "| serl | 3 | 6 | 1 |" not in md and "| serl | 2 | 5 | 1 |" in md


def test_math_report_script_rewrites_a_partial_workdir(tmp_path):
    """``learning_report.py --env math`` (a subprocess, as a user runs it) writes the math report."""
    work = tmp_path / "w"
    _synthetic_math_workdir(work)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(REPO_ROOT / "experiments" / "learning_report.py"), "--env", "math",
                        "--workdir", str(work), "--iterations", "4", "--eval-every", "2", "--algos", "grpo", "serl",
                        "--report-md", str(tmp_path / "out.md"), "--report-png", str(tmp_path / "out.png")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    md = (tmp_path / "out.md").read_text()
    assert md.startswith("# Learning experiment: math") and r.stderr == ""
    assert "Command: `python experiments/learning_report.py --env math --workdir " in md  # the script that ran
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_math_report_states_the_sft_settings_that_ran(tmp_path):
    """The report reads the SFT run's recorded config, not the command line that made the report."""
    args = _math_args(tmp_path)  # asks for full fine-tuning at lr 5e-5
    assert lmr.sft_settings(tmp_path, args) == "model.lora.r=0 " + " ".join(MATH_SFT_DEFAULTS)
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.yaml").write_text(
        "model:\n  lora:\n    r: 8\nsft:\n  epochs: 1\n  lr: 0.0005\n  batch_size: 8\n  micro_batch_size: 4\n")
    assert lmr.sft_settings(tmp_path, args) == \
        "model.lora.r=8 sft.epochs=1 sft.lr=0.0005 sft.batch_size=8 sft.micro_batch_size=4"


def test_math_report_wall_time_counts_every_finished_iteration():
    """phases.json misses what a session's end stopped; the iteration times do not."""
    train = {"grpo_s0": {1: {"timing/iteration_s": 60.0}, 2: {"timing/iteration_s": 120.0}},
             "grpo_s1": {1: {"timing/iteration_s": 30.0}}, "serl_s0": {1: {"timing/iteration_s": 90.0}}}
    lines = lmr.wall_time_lines({"expert": 120.0, "rl/grpo": 60.0}, train, ["grpo", "serl"])
    assert lines[-4:] == ["| expert | 2.0 | — |", "| rl/grpo | 1.0 | 3.5 (3 iterations) |",
                          "| rl/serl | — | 1.5 (1 iteration) |", ""]


def test_math_panel_of_the_few_step_problems(tmp_path, monkeypatch):
    """--splits gsm8k:test@2 gsm8k:test: the first panel is every test problem of at most 2 solution
    steps (serl eval with the train-split filter pointed at the test split), the second the first
    --panel-size problems."""
    from learning_options import split_description, split_label, split_spec

    assert split_spec("gsm8k:test@2") == ("gsm8k:test", 2) and split_spec("gsm8k:test") == ("gsm8k:test", 0)
    assert split_label("gsm8k:test@2") == "gsm8k-test-le2"
    assert split_description("gsm8k:test@1", 9) == "every problem of gsm8k:test with at most 1 calculator step"
    for bad in ("gsm8k:test@0", "gsm8k:test@x"):
        with pytest.raises(ValueError):
            split_spec(bad)
        with pytest.raises(SystemExit):
            _math_args(tmp_path, "--splits", bad)
    with pytest.raises(SystemExit):
        parse_args(["--splits", "valid_seen@2"])  # ALFWorld has no solution steps
    start = tmp_path / "start"
    start.mkdir()
    (start / "config.json").write_text("{}")
    fake = FakeSerl()
    args = _math_args(tmp_path / "w", "--sft-model", str(start), "--no-base-eval", "--panel-avg-k", "0",
                      "--seeds", "0", "--algos", "grpo", "--iterations", "2", "--splits", "gsm8k:test@2", "gsm8k:test")
    run_experiment(args, fake, monkeypatch)
    evals = [c for c in fake.calls if c[0] == "eval" and "/sft/" in c[-1]]
    assert evals[0] == ["eval", "recipe=cpu_math", f"model.path={start}", "env.train_split=gsm8k:test",
                        "env.math.max_solution_steps=2", "--split", "gsm8k:test", "--num-tasks", "-1", "--greedy",
                        "--seed", "1000", "--out", str(tmp_path / "w" / "eval" / "sft" / "it000_gsm8k-test-le2_greedy")]
    assert evals[1][3:6] == ["--split", "gsm8k:test", "--num-tasks"] and evals[1][6] == "3"


def test_math_report_runs_stopped_by_train_seconds_end_where_they_stopped(tmp_path):
    """With --train-seconds a run's end is its last greedy panel (no avg@k there): serl seed 2 stopped
    at iteration 3, solving problems 1, 2, 3 (SFT: 0), and its row and tests use that point."""
    work = tmp_path / "w"
    _synthetic_math_workdir(work)
    import shutil
    shutil.rmtree(work / "eval" / "serl_s2" / "it004_gsm8k-test_greedy")
    shutil.rmtree(work / "eval" / "serl_s2" / "it004_gsm8k-test_avg4")
    d = work / "eval" / "serl_s2" / "it003_gsm8k-test_greedy"
    write_data(d / "metrics.json", {"success_rate": 0.75, "num_tasks": 4, "tool_call_rate": 1.0})
    write_data(d / "tasks.jsonl", [{"task_id": f"gsm8k-test-{i:05d}", "won": i > 0} for i in range(4)])
    base = ["--env", "math", "--workdir", str(work), "--iterations", "4", "--eval-every", "2", "--panel-size", "4",
            "--algos", "grpo", "serl", "--smooth-window", "2"]
    md = lmr.write_math_report(work, parse_args(base + ["--train-seconds", "60"]), {}, "Test CPU").read_text()
    assert "Status: complete." in md and "### Significance at each run's end (iteration 3, 4)" in md
    assert "| serl | 3 | 0.750 ± 0.000 (n=1) |" in md
    # serl per problem: seeds 0, 1 as before (2 + 3 only-RL, 1 only-SFT) plus seed 2 at it. 3 (+3, -1)
    assert "| serl | 3 | 8 | 2 | 0.109 |" in md
    without = lmr.write_math_report(work, parse_args(base), {}, "Test CPU").read_text()  # no cap: seed 2 unfinished
    assert "Status: **partial**" in without and "| serl | 2 | 5 | 1 |" in without


# ---------------------------------------------------------------------------- the null control
def test_null_update_keeps_each_layers_update_size_in_a_new_direction(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    import null_update

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, generator=g), torch.randn(4, 2, generator=g)
    state = {"m.q.lora_A.weight": a, "m.q.lora_B.weight": b, "m.norm.weight": torch.ones(3)}
    new, scales = null_update.random_direction(state, seed=1)
    assert len(scales) == 1 and new["m.q.lora_A.weight"] is a and new["m.norm.weight"] is state["m.norm.weight"]
    nb = new["m.q.lora_B.weight"]
    assert torch.allclose(nb.abs(), b.abs() * scales[0])          # the same entries up to sign, rescaled
    assert not torch.equal(torch.sign(nb), torch.sign(b))          # some signs flipped (seed 1)
    assert torch.allclose((nb @ a).norm(), (b @ a).norm())         # ||ΔW||_F kept
    assert torch.equal(null_update.random_direction(state, 1)[0]["m.q.lora_B.weight"], nb)  # seeded
    with pytest.raises(ValueError, match="no lora_B"):
        null_update.random_direction({"w": a}, 0)
    with pytest.raises(ValueError, match="lora_A"):
        null_update.random_direction({"m.lora_B.w": b}, 0)

    run = tmp_path / "run"
    (run / "checkpoints" / "iter_000002").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "checkpoints" / "latest").write_text("iter_000002\n")
    save_file(state, str(run / "checkpoints" / "iter_000002" / "policy.safetensors"))
    torch.save({"iteration": 2}, run / "checkpoints" / "iter_000002" / "state.pt")
    out = tmp_path / "null"
    assert null_update.write_null_run(run, out, 1) == scales
    written = load_file(str(out / "checkpoints" / "iter_000002" / "policy.safetensors"))
    assert torch.equal(written["m.q.lora_B.weight"], nb) and (out / "config.yaml").read_text() == "seed: 0\n"
    assert (out / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        null_update.write_null_run(tmp_path / "null" / "checkpoints", tmp_path / "x", 1)
