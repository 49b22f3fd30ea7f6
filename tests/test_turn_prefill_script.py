"""benchmarks/turn_prefill.py plays the same conversations with the per-row and the batched turn
prefill and reports both; in float32 on the tiny model the two send the same greedy replies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT


def test_turn_prefill_script_on_the_tiny_model(tiny_model_dir, tmp_path):
    out = tmp_path / "res.json"
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "turn_prefill.py"), "--model", str(tiny_model_dir),
           "--device", "cpu", "--dtype", "float32", "--rows", "3", "--turns", "3", "--first", "40",
           "--append", "12", "--new-tokens", "4", "--budget", "4096", "--repeats", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["settings"]) == {"0", "4096"}
    for s in res["settings"].values():
        assert len(s["generate_s"]) == 1 and 0 < s["prefill_s"][0] < s["generate_s"][0]
    assert res["replies_equal"] == [9, 9]
    assert "replies equal between the settings" in r.stdout and not r.stderr.strip()
