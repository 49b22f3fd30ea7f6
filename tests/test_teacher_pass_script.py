"""benchmarks/teacher_pass.py runs on the tiny model and a scripted run's last_rollout.jsonl: the
teacher pass with ``skip_zero_advantage_rows`` scores exactly the rows with advantage != 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT
from report_run import scripted_serl_run


def test_teacher_pass_script_on_a_scripted_run(tiny_model_dir, tmp_path):
    small = [f"model.path={tiny_model_dir}", "env.max_steps=3", "env.rollout.n=2", "data.train_batch_size=2",
             "data.max_response_length=40"]
    run = scripted_serl_run(tiny_model_dir, tmp_path, iterations=1, extra=tuple(small[1:]))
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "teacher_pass.py"), "--rollout",
           str(run / "last_rollout.jsonl"), "--repeats", "1", *small]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    rows = sum(len(json.loads(x)["steps"]) for x in (run / "last_rollout.jsonl").read_text().splitlines())
    assert res["rows"] == rows and res["all_rows_scored_rows"] == rows  # immediate feedback: every row has a context
    assert res["skip_zero_advantage_scored_rows"] == res["nonzero_advantage_rows"] <= rows
    assert res["all_rows_wall_s"] > 0 and res["skip_zero_advantage_wall_s"] > 0


def test_teacher_pass_script_compares_prefix_reuse_on_conversation_rows(tiny_model_dir, tmp_path):
    small = [f"model.path={tiny_model_dir}", "env.max_steps=3", "env.rollout.n=2", "data.train_batch_size=2",
             "data.max_response_length=40", "env.prompt_layout=conversation"]
    run = scripted_serl_run(tiny_model_dir, tmp_path, iterations=1, extra=tuple(small[1:]))
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "teacher_pass.py"), "--rollout",
           str(run / "last_rollout.jsonl"), "--repeats", "1", "--compare", "prefix_reuse", *small]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["whole_prompts_scored_rows"] == res["prefix_reuse_scored_rows"] > 0
    assert res["max_abs_logprob_diff"] < 1e-3 and res["prefix_reuse_wall_s"] > 0
    assert res["whole_prompts_prefix_reused_fraction"] == 0 < res["prefix_reuse_prefix_reused_fraction"] < 1
