"""Run folders: no reuse without --resume, overwrite moves aside, one process per folder (lock),
start-up errors in one line before any model loads and without leaving a folder behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from serl.cli import main
from serl.errors import ConfigError, SerlError
from serl.train.run_dir import RunLock, check_new_run_dir, check_output_dir, lock_holder

REPO = Path(__file__).resolve().parents[1]


def _one_line_error(capsys, rc: int) -> str:
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.startswith("serl: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_output_dir_that_is_a_file_fails_in_one_line_before_any_model_loads(tmp_path, capsys):
    f = tmp_path / "out"
    f.write_text("not a folder")
    # model.path points nowhere: reaching the model loader would be a different error
    rc = main(["train", f"trainer.output_dir={f}", "trainer.run_name=r", f"model.path={tmp_path / 'nomodel'}"])
    line = _one_line_error(capsys, rc)
    assert "trainer.output_dir" in line and "regular file" in line
    rc = main(["train", f"trainer.output_dir={f / 'sub'}", "trainer.run_name=r", f"model.path={tmp_path / 'nomodel'}"])
    assert "regular file" in _one_line_error(capsys, rc)


def test_unwritable_output_dir_is_named():
    # /proc refuses new entries even for root (chmod does not stop root)
    with pytest.raises(ConfigError, match=r"^trainer\.output_dir: cannot write to /proc/serl-runs"):
        check_output_dir(Path("/proc/serl-runs"))


def test_recipe_with_a_yaml_syntax_error_fails_in_one_line(tmp_path, capsys):
    bad = tmp_path / "mine.yaml"
    bad.write_text("defaults: [cpu]\nactor:\n  lr: [1e-5\n")
    line = _one_line_error(capsys, main(["train", f"recipe={bad}"]))
    assert "mine.yaml" in line and "YAML syntax error at line" in line


def test_existing_run_folder_is_refused_without_resume(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    rc = main(["train", f"trainer.output_dir={tmp_path}", "trainer.run_name=run", f"model.path={tmp_path / 'x'}"])
    line = _one_line_error(capsys, rc)
    assert "already exists" in line and "--resume" in line and "trainer.overwrite=true" in line
    assert (run / "metrics.jsonl").read_text() == '{"iteration": 1}\n'
    check_new_run_dir(tmp_path / "absent", overwrite=False)  # fine
    (tmp_path / "empty").mkdir()
    check_new_run_dir(tmp_path / "empty", overwrite=False)  # fine too


def test_failed_start_leaves_no_run_folder(tmp_path, capsys):
    rc = main(["train", f"trainer.output_dir={tmp_path / 'runs'}", "trainer.run_name=r",
               f"model.path={tmp_path / 'nomodel'}"])
    assert rc == 2 and "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "runs" / "r").exists()


_HOLDER = textwrap.dedent("""
    import sys, time
    from serl.train.run_dir import RunLock
    lock = RunLock.acquire(sys.argv[1])
    print("locked", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin
""")


def _hold_lock(run: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_second_process_on_the_same_folder_stops_naming_the_pid(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    holder = _hold_lock(run)
    try:
        with pytest.raises(SerlError, match=rf"in use by another serl process \(PID {holder.pid}\)"):
            RunLock.acquire(run)
        assert lock_holder(run) == str(holder.pid)
        with pytest.raises(SerlError, match=rf"PID {holder.pid}"):
            check_new_run_dir(run, overwrite=True)  # overwrite never moves a live run aside
        line = _one_line_error(capsys, main(["train", "--resume", str(run)]))
        assert f"PID {holder.pid}" in line
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # the lock died with its process (no stale lock), and is shared inside one process
    assert lock_holder(run) is None
    a, b = RunLock.acquire(run), RunLock.acquire(run)
    a.release()
    a.release()  # idempotent
    b.release()
    holder = _hold_lock(run)  # free again for another process
    holder.stdin.close()
    holder.wait(timeout=30)


def test_only_rank_0_probes_the_lock_of_a_resumed_folder(tmp_path, capsys, monkeypatch):
    """Under ``accelerate launch`` every rank runs ``serl train --resume``: were each to probe the
    folder's lock, one rank would find another's probe and refuse (a CI failure of stop 30)."""
    import serl.cli
    import serl.train.trainer

    class Reached(Exception):
        pass

    def trainer(*a, **k):
        raise Reached

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    monkeypatch.setattr(serl.cli, "check_train_data", lambda cfg: None)
    monkeypatch.setattr(serl.train.trainer, "Trainer", trainer)
    holder = _hold_lock(run)  # stands for rank 0's probe, holding the lock right now
    try:
        monkeypatch.setenv("RANK", "1")
        with pytest.raises(Reached):  # rank 1 leaves the lock to rank 0 and goes on to its Trainer
            main(["train", "--resume", str(run)])
        monkeypatch.setenv("RANK", "0")
        assert f"PID {holder.pid}" in _one_line_error(capsys, main(["train", "--resume", str(run)]))
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_overwrite_moves_the_old_run_aside(tiny_model_dir, tmp_path, caplog):
    from serl.configure import load_config
    from serl.train.trainer import Trainer

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 4}\n')
    cfg = load_config("cpu", [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", "trainer.run_name=run",
                              "trainer.overwrite=true", "trainer.progress=false", "env.rollout.n=2",
                              "data.train_batch_size=1"])
    tr = Trainer(cfg)
    try:
        old = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
        assert len(old) == 1 and (old[0] / "metrics.jsonl").read_text() == '{"iteration": 4}\n'
        assert (run / "config.yaml").exists() and not (run / "metrics.jsonl").exists()
        assert "moved the old run folder" in caplog.text
        assert lock_holder(run) is None  # held by this very process
    finally:
        tr.close()
