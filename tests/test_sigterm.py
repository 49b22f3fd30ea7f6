"""SIGTERM (what schedulers send) ends ``serl train`` like Ctrl-C: a message, a clean exit,
env workers stopped, no half-written checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _children(pid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_training_cleanly(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "serl.cli", "train", f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}",
           "trainer.run_name=run", "trainer.total_training_steps=1000", "trainer.save_freq=1",
           "trainer.progress=false", "trainer.logger=[jsonl]", "env.max_steps=2", "env.rollout.n=2",
           "env.num_workers=2", "data.train_batch_size=2", "data.max_response_length=8",
           "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=4"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 400
        metrics, latest_ptr = run / "metrics.jsonl", run / "checkpoints" / "latest"
        while not latest_ptr.exists():  # the first checkpoint is written: iteration 2 runs
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no iteration finished in time"
            time.sleep(0.5)
        workers = _children(proc.pid)
        assert workers, "the env workers should be running"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "serl: terminated (SIGTERM)" in err and "Traceback" not in err
    time.sleep(1.0)
    assert not [w for w in workers if _alive(w)], "env workers left running"
    ck = run / "checkpoints"
    assert not list(ck.glob(".tmp_*")), "a half-written checkpoint was left behind"
    latest = ck / latest_ptr.read_text().strip()
    assert {"policy.safetensors", "optimizer.pt", "state.pt"} <= {p.name for p in latest.iterdir()}
    for line in metrics.read_text().splitlines():
        json.loads(line)  # no half-written line


def test_a_stopped_command_without_checkpoints_does_not_point_at_resume(monkeypatch, capsys):
    import serl.cli as cli

    def stopped(args):
        raise cli.Terminated()

    monkeypatch.setattr(cli, "cmd_report", stopped)
    assert cli.main(["report", "runs/x"]) == 143
    err = capsys.readouterr().err
    assert "serl: terminated (SIGTERM)" in err and "serl report has nothing to resume" in err and "--resume" not in err
    monkeypatch.setattr(cli, "cmd_eval", stopped)  # serl eval keeps a journal of its finished chunks
    assert cli.main(["eval"]) == 143
    err = capsys.readouterr().err
    assert "the same command again goes on from them" in err and "--resume" not in err
    import serl.cli_data as cli_data  # serl data expert journals each finished episode (not math's)

    monkeypatch.setattr(cli_data, "cmd_data_expert", stopped)
    assert cli.main(["data", "expert", "alfworld", "--out", "x.jsonl"]) == 143
    assert "kept its finished episodes in x.jsonl.partial" in capsys.readouterr().err
    assert cli.main(["data", "expert", "math", "--out", "x.jsonl"]) == 143
    assert "serl data has nothing to resume" in capsys.readouterr().err
    monkeypatch.setattr(cli, "cmd_sft", stopped)
    assert cli.main(["sft"]) == 143
    assert "resume with --resume RUN_DIR" in capsys.readouterr().err
