"""benchmarks/learning.py runs end to end on the tiny model: expert rows from the shipped fixture,
SFT (LoRA), panel evaluation at the SFT start, 1 seed x 1 iteration of GRPO and of SERL with a
panel evaluation after it, and the report (LEARNING.md with its tables, and the PNG plot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT


def test_learning_script_end_to_end_on_the_tiny_model(tiny_model_dir, tmp_path):
    work = tmp_path / "learning"
    small = [f"model.path={tiny_model_dir}", "data.max_response_length=8", "env.max_steps=2",
             "trainer.progress=false", "rollout.micro_batch_size=4"]
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "learning.py"), "--workdir", str(work),
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
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "learning.py"), "--env", "webshop", "--workdir", str(work),
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
