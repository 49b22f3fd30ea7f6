"""Faults that must not lose work (issue 26), each probed on a real tiny run.

* ``kill -9`` of ``serl train`` mid-rollout, mid-update, mid-checkpoint write, between a
  checkpoint's rename and its ``latest`` pointer, and mid-way through a ``metrics.jsonl`` line:
  ``--resume`` continues from the last complete checkpoint, and ``metrics.jsonl`` ends with one
  complete line per iteration (a line of an iteration trained again after the resume is dropped
  first; a torn line is dropped and named). A kill before the first checkpoint: the resume says
  so in one line with the command that starts the run again, and that command works.
* ``serl report`` of a run whose last line is torn draws the rest and names the skipped line.
* Start-up errors in one line, before the model loads: a model that is not in the offline
  Hugging Face cache (with the command that fetches it), a missing ``model.path``,
  ``env.data_dir`` or ``sft.data``, a resume whose only checkpoint is truncated.

Run as a script, this file is the fault injector of those runs (test code, not a serl feature):
``python tests/test_faults.py PHASE:ITERATION serl-args...`` runs ``serl serl-args...`` in this
process and SIGKILLs it at the named point of the named iteration (1-based, verl's global step):

=========================  ==========================================================================
``rollout:N``              before the second generation call of iteration N (its first turn played)
``update:N``               right after the first optimizer step of iteration N (weights changed)
``checkpoint:N``           right after ``policy.safetensors`` of checkpoint N is written (temp folder)
``commit:N``               after checkpoint N is renamed into place, before ``latest`` names it
``metrics:N``              after half of iteration N's ``metrics.jsonl`` line is written (torn line)
``none``                   no kill
=========================  ==========================================================================
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serl.errors import CheckpointError

REPO = Path(__file__).resolve().parents[1]

#: a tiny ALFWorld run: 1 task x 2 episodes of 2 turns, 8-token replies, a checkpoint every iteration
TINY = ["trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.progress=false", "trainer.logger=[jsonl]",
        "env.max_steps=2", "env.rollout.n=2", "env.num_workers=1", "data.train_batch_size=1",
        "data.max_response_length=8", "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=4"]


# ---------------------------------------------------------------------------- the fault injector
def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install_kill(spec: str) -> None:
    """Patch serl so that this process SIGKILLs itself at ``spec`` (module docstring's table)."""
    if spec == "none":
        return
    phase, at = spec.split(":")
    at = int(at)
    if phase == "rollout":
        from serl.rollout.engine import HFEngine
        from serl.train.collect import TrainRollout

        collect, generate = TrainRollout.collect, HFEngine.generate
        seen = {"iteration": 0, "calls": 0}

        def collect_(self, state, *a, **k):
            seen.update(iteration=state.iteration + 1, calls=0)
            return collect(self, state, *a, **k)

        def generate_(self, *a, **k):
            seen["calls"] += 1
            if seen["iteration"] == at and seen["calls"] == 2:
                _die()
            return generate(self, *a, **k)

        TrainRollout.collect, HFEngine.generate = collect_, generate_
    elif phase == "update":
        from serl.train.update import PolicyUpdate

        run = PolicyUpdate.run

        def run_(self, batch, replay=(), step=1):
            if step == at:
                opt_step = self.optimizer.step

                def step_then_die(*a, **k):
                    opt_step(*a, **k)
                    _die()

                self.optimizer.step = step_then_die
            return run(self, batch, replay, step)

        PolicyUpdate.run = run_
    elif phase in ("checkpoint", "commit"):
        from serl.train import checkpoint

        save_file, write_text = checkpoint.save_file, checkpoint.atomic_write_text

        def save_file_(tensors, filename, *a, **k):
            save_file(tensors, filename, *a, **k)
            if phase == "checkpoint" and f".tmp_iter_{at:06d}_" in str(filename):
                _die()

        def write_text_(path, text):
            if phase == "commit" and Path(path).name == "latest" and text.strip() == f"iter_{at:06d}":
                _die()
            write_text(path, text)

        checkpoint.save_file, checkpoint.atomic_write_text = save_file_, write_text_
    elif phase == "metrics":
        from serl.train.metrics import MetricsLogger

        log = MetricsLogger.log

        def log_(self, iteration, metrics):
            if iteration == at and "episode/success_rate" in metrics:
                line = json.dumps({"iteration": iteration, **{k: float(v) for k, v in metrics.items()}}) + "\n"
                with open(self.path, "a") as f:
                    f.write(line[: len(line) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                _die()
            return log(self, iteration, metrics)

        MetricsLogger.log = log_
    else:
        raise SystemExit(f"unknown kill point {spec!r}")


# ---------------------------------------------------------------------------- helpers of the tests
def _serl(tmp_path: Path, kill: str, *argv: str) -> subprocess.CompletedProcess:
    """``serl argv`` in a subprocess that dies at ``kill``; its env marks it (and its env workers)
    with ``SERL_FAULT_TEST=<tmp_path>``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "SERL_FAULT_TEST": str(tmp_path)}
    return subprocess.run([sys.executable, __file__, kill, *argv], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)


def _killed(proc: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    # the env workers follow their killed parent (they would hold the run folder's lock)
    deadline = time.monotonic() + 20
    while _marked_processes(tmp_path):
        assert time.monotonic() < deadline, f"processes left after kill -9: {_marked_processes(tmp_path)}"
        time.sleep(0.2)


def _marked_processes(tmp_path: Path) -> list[int]:
    mark = f"SERL_FAULT_TEST={tmp_path}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        out.append(int(d.name))
            except OSError:
                continue
    return out


def _lines(run: Path) -> list[str]:
    return (run / "metrics.jsonl").read_text().splitlines()


def _iterations(run: Path) -> list[int]:
    """The iteration of each line of metrics.jsonl, every line a complete record of one
    iteration's training (policy updates so far = iteration: the state was carried)."""
    recs = [json.loads(x) for x in _lines(run)]
    for r in recs:
        assert r["training/update_step"] == r["iteration"], r
    return [r["iteration"] for r in recs]


def _latest(run: Path) -> str:
    return (run / "checkpoints" / "latest").read_text().strip()


def _one_error_line(text: str) -> str:
    assert "Traceback" not in text, text
    lines = [x for x in text.splitlines() if x.startswith("serl: error:")]
    assert len(lines) == 1, text
    return lines[0]


# ---------------------------------------------------------------------------- kill -9, then resume
def test_kill_9_at_any_phase_then_resume_loses_no_work(tiny_model_dir, tmp_path, capsys, caplog):
    run = tmp_path / "run"
    new = ["train", f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", "trainer.run_name=run", *TINY]
    resume = ["train", "--resume", str(run)]
    from serl.cli import main

    # killed while the first checkpoint is written: no complete checkpoint; the resume says so in
    # one line, before any model loads, with the command that starts the run again
    _killed(_serl(tmp_path, "checkpoint:1", *new), tmp_path)
    assert len(list((run / "checkpoints").glob(".tmp_iter_000001_*"))) == 1
    assert not (run / "checkpoints" / "latest").exists()
    line = _one_error_line(capsys.readouterr().err if main(resume) == 2 else "resume did not fail")
    assert f"no checkpoint in {run} yet" in line
    again = shlex.split(re.search(r"`(serl train [^`]+)`", line).group(1))[1:]

    # that command, killed mid-rollout of iteration 2 (env worker alive, mid-episode)
    _killed(_serl(tmp_path, "rollout:2", *again), tmp_path)
    assert len(list(tmp_path.glob("run.old-*"))) == 1  # the first attempt was moved aside, not deleted
    assert _iterations(run) == [1] and _latest(run) == "iter_000001"
    first = _lines(run)

    # resumed from 1; killed right after the first optimizer step of iteration 2
    _killed(_serl(tmp_path, "update:2", *resume), tmp_path)
    assert _lines(run) == first and _latest(run) == "iter_000001"

    # resumed from 1 (no line to drop: 2 was never logged); killed after checkpoint 2 is in
    # place, before `latest` names it
    p = _serl(tmp_path, "commit:2", *resume)
    _killed(p, tmp_path)
    assert "dropped" not in p.stderr, p.stderr[-3000:]
    assert _iterations(run) == [1, 2] and _lines(run)[0] == first[0] and _latest(run) == "iter_000001"
    assert (run / "checkpoints" / "iter_000002" / "state.pt").exists()

    # resumed from 1, the checkpoint `latest` names (2 was never committed): iteration 2's line is
    # dropped (it is trained again); killed half-way through iteration 3's metrics line
    p = _serl(tmp_path, "metrics:3", *resume)
    _killed(p, tmp_path)
    assert f"{run / 'metrics.jsonl'}: dropped 1 line(s) of iteration(s) 2, after the checkpoint's iteration 1" \
        in p.stderr, p.stderr[-3000:]
    lines = _lines(run)
    assert len(lines) == 3 and lines[0] == first[0] and _latest(run) == "iter_000002"
    assert [json.loads(x)["iteration"] for x in lines[:2]] == [1, 2] and not lines[2].endswith("}")
    second = lines[:2]

    # serl report draws the rest and names the skipped line
    caplog.set_level(logging.WARNING, logger="serl.report.data")
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped == [f"serl report: skipped {run / 'metrics.jsonl'} line 3: not a complete JSON record "
                       "(cut by a crash, or still being written); `serl train --resume` repairs it"]
    assert '"episode/success_rate"' in (tmp_path / "report.html").read_text()

    # resumed from 2: the torn line is dropped and named; the run finishes
    p = _serl(tmp_path, "none", *resume)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"{run / 'metrics.jsonl'}: dropped line 3, not a complete JSON record" in p.stderr
    assert _iterations(run) == [1, 2, 3] and _lines(run)[:2] == second and _latest(run) == "iter_000003"
    assert not list((run / "checkpoints").glob(".tmp_*"))
    assert sorted(x.name for x in (run / "checkpoints").glob("iter_*")) == ["iter_000002", "iter_000003"]


# ---------------------------------------------------------------------------- start-up errors in one line
def _run_cli(capsys, argv: list[str]) -> str:
    from serl.cli import main

    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    return _one_error_line(err)


def test_offline_model_not_in_the_cache_is_one_line_with_the_fetch_command(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    line = _run_cli(capsys, ["train", "model.path=HuggingFaceTB/SmolLM2-135M-Instruct",
                             f"trainer.output_dir={tmp_path}", "trainer.run_name=r"])
    assert "'HuggingFaceTB/SmolLM2-135M-Instruct' is not a local folder and not in the Hugging Face cache" in line
    assert str(tmp_path / "empty-hf-cache") in line
    assert "`HF_HUB_OFFLINE=0 hf download HuggingFaceTB/SmolLM2-135M-Instruct`" in line
    assert not (tmp_path / "r").exists()  # nothing written


def test_missing_model_data_and_sft_file_are_one_line_before_the_model_loads(tmp_path, capsys):
    nomodel = tmp_path / "nomodel"
    common = [f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]
    line = _run_cli(capsys, ["train", f"model.path={nomodel}", *common])
    assert f"model.path: '{nomodel}' does not exist; set model.path to a Hugging Face model folder" in line
    # the data is checked before the model (which does not exist either)
    line = _run_cli(capsys, ["train", f"model.path={nomodel}", "env.data_dir=/nonexistent", *common])
    assert "/nonexistent/json_2.1.1/train" in line and "serl data download alfworld" in line
    line = _run_cli(capsys, ["sft", f"model.path={nomodel}", f"sft.data={tmp_path / 'missing.jsonl'}", *common])
    assert f"SFT data file {tmp_path / 'missing.jsonl'} does not exist" in line and "serl data expert" in line
    assert not (tmp_path / "r").exists()


def _fake_checkpoint(run: Path, iteration: int) -> Path:
    """A checkpoint folder whose files are complete in form (a safetensors header covering the
    file, torch zip archives); check_resumable reads no tensor, so the contents do not matter."""
    import torch
    from safetensors.torch import save_file

    folder = run / "checkpoints" / f"iter_{iteration:06d}"
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(4)}, str(folder / "policy.safetensors"))
    torch.save({"step": 1}, folder / "optimizer.pt")
    torch.save({"iteration": iteration}, folder / "state.pt")
    (run / "checkpoints" / "latest").write_text(folder.name + "\n")
    return folder


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_resume_from_truncated_checkpoints_is_one_line_before_the_model_loads(tmp_path, capsys):
    from serl.config import to_yaml
    from serl.configure import load_config
    from serl.train.checkpoint import check_resumable

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config("cpu", [f"model.path={tmp_path / 'nomodel'}"])))
    one, two = _fake_checkpoint(run, 1), _fake_checkpoint(run, 2)
    _cut(two / "policy.safetensors")
    assert check_resumable(run) == one  # the older intact one is used (load_newest_intact warns then)
    _cut(one / "optimizer.pt")
    line = _run_cli(capsys, ["train", "--resume", str(run)])
    assert line.startswith(f"serl: error: no intact checkpoint in {run}: ")
    assert f"checkpoint file {two / 'policy.safetensors'} is truncated or damaged (SafetensorError" in line
    assert f"checkpoint file {one / 'optimizer.pt'} is truncated or damaged (BadZipFile" in line
    assert f"`serl train recipe={run / 'config.yaml'} trainer.output_dir={tmp_path} trainer.run_name=run " \
           "trainer.overwrite=true`" in line
    (one / "state.pt").unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint file {one / 'state.pt'} is missing"):
        check_resumable(run)


# ---------------------------------------------------------------------------- the repairs themselves
def test_truncate_after_drops_redone_and_torn_lines_naming_them(tmp_path, caplog):
    from serl.train.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, ["jsonl"])
    lines = ['{"iteration": 0, "val/success_rate": 0.5}', '{"iteration": 1, "a": 1.0}', '{"iteration": 2, "a"',
             '{"iteration": 2, "a": 2.0}', '{"iteration": 3, "a": 3.0}', '', '{"iteration": 4, "a": 4']
    logger.path.write_text("\n".join(lines))
    with caplog.at_level(logging.WARNING, logger="serl.train.metrics"):
        logger.truncate_after(2)
    assert logger.path.read_text() == "".join(x + "\n" for x in (lines[0], lines[1], lines[3]))
    assert [r.getMessage() for r in caplog.records] == [
        f"{logger.path}: dropped lines 3, 7, not a complete JSON record (cut by a crash while it was written)",
        f"{logger.path}: dropped 1 line(s) of iteration(s) 3, after the checkpoint's iteration 2 (they are trained again)"]
    # nothing to drop: the file is left as it is (not rewritten), and nothing is said
    caplog.clear()
    inode = logger.path.stat().st_ino
    logger.truncate_after(2)
    assert logger.path.stat().st_ino == inode and not caplog.records


def test_a_run_folder_holding_only_its_lock_is_reused(tmp_path):
    """A run killed between creating its folder and writing config.yaml leaves only ``.lock``:
    starting the run again is not refused as "already exists"."""
    from serl.train.run_dir import LOCK_NAME, check_new_run_dir, create_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text("12345\n")
    check_new_run_dir(run, overwrite=False)
    lock = create_run_dir(run, overwrite=False)
    try:
        assert [p.name for p in run.iterdir()] == [LOCK_NAME]
        assert not list(tmp_path.glob("run.old-*"))
    finally:
        lock.release()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    install_kill(sys.argv[1])
    from serl.cli import main as serl_main

    sys.exit(serl_main(sys.argv[2:]))
