"""benchmarks/throughput.py runs its three code paths on the tiny model and a scripted run's
last_rollout.jsonl, and reports every figure with its ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT
from report_run import scripted_serl_run


def test_throughput_script_on_a_scripted_run(tiny_model_dir, tmp_path):
    small = [f"model.path={tiny_model_dir}", "env.max_steps=3", "env.rollout.n=2", "data.train_batch_size=2",
             "data.max_response_length=8"]
    run = scripted_serl_run(tiny_model_dir, tmp_path, iterations=1, extra=("env.max_steps=3", "env.rollout.n=2",
                                                                          "data.train_batch_size=2",
                                                                          "data.max_response_length=40"))
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "throughput.py"), "--rollout", str(run / "last_rollout.jsonl"),
           "--rows", "4", "--score-rows", "4", "--gen-rows", "6", "--gen-batch", "4", *small]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["update_rows"] == 4 and res["score_rows"] == 4 and res["generate_calls"] >= 2
    for path in ("former", "padded", "current"):
        assert res[f"{path}_update_tokens_per_s"] > 0 and 0 < res[f"{path}_update_mfu"]
        assert res[f"{path}_teacher_rows_per_s"] > 0 and res[f"{path}_generation_tokens"] > 0
    assert res["update_tokens_per_s_current_over_former"] > 0 and res["generation_tokens_per_s_current_over_padded"] > 0
