"""benchmarks/action_selection.py: both modes play the same shipped games on the tiny model and
the table gives each mode's seconds per step, with the candidates scored per step for ``score``."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT


def test_action_selection_script_times_both_modes(tiny_model_dir, tmp_path):
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "action_selection.py"), "--games", "2", "--steps", "2",
           "--set", f"model.path={tiny_model_dir}", "model.lora.r=0", "env.num_workers=1",
           "data.max_response_length=16"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {cells[1].strip(): cells for cells in (line.split("|") for line in r.stdout.splitlines())
            if len(cells) == 9 and cells[1].strip() in ("generate", "score")}
    assert set(rows) == {"generate", "score"}, r.stdout
    gen, score = rows["generate"], rows["score"]
    assert float(gen[4]) == 0.0 and float(gen[5]) == 0.0  # generate scores nothing
    assert float(score[4]) > 0.0 and float(score[5]) >= 1.0  # each scored step had candidates
    assert gen[7].strip() == score[7].strip() == "4"  # 2 games x 2 steps each (nobody wins in 2)
    assert "threads" in r.stdout.splitlines()[0]  # the CPU, threads and dtype head the figures
