"""Checkpoints: damaged files name themselves, resume falls back to the newest intact one,
pruning by iteration number, stale temp folders, disk space."""

from __future__ import annotations

import errno
import re
import logging
from collections import namedtuple
from pathlib import Path

import pytest
import torch

import serl.train.checkpoint as ckpt
from serl.errors import CheckpointError
from serl.train.checkpoint import (list_checkpoints, load_checkpoint, load_newest_intact, load_policy_weights,
                                   remove_stale_tmp_dirs, save_checkpoint)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _save(run: Path, it: int, keep: int = 0, teacher: bool = True) -> dict[str, torch.Tensor]:
    """Checkpoint ``it`` of a model seeded with ``it`` (so each checkpoint's weights differ)."""
    m = _model(it)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.ones(1, 4)).sum().backward()
    opt.step()
    save_checkpoint(run, it, m, opt, {"update_step": it}, teacher=_model(100 + it) if teacher else None, keep=keep)
    return {k: v.clone() for k, v in m.state_dict().items()}


def _fresh():
    m = _model(999)
    return m, torch.optim.AdamW(m.parameters(), lr=0.1), _model(998)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("name", ["policy.safetensors", "teacher.safetensors", "optimizer.pt", "state.pt"])
def test_each_damaged_file_is_named_and_resume_falls_back(tmp_path, caplog, name):
    run = tmp_path / "run"
    w1 = _save(run, 1)
    _save(run, 2)
    bad = run / "checkpoints" / "iter_000002" / name
    _truncate(bad)
    m, opt, teacher = _fresh()
    with pytest.raises(CheckpointError, match=re.escape(str(bad))):
        load_checkpoint(bad.parent, m, opt, teacher=teacher)
    m, opt, teacher = _fresh()
    with caplog.at_level(logging.WARNING):
        folder, state = load_newest_intact(run, lambda f: load_checkpoint(f, m, opt, teacher=teacher))
    assert folder.name == "iter_000001" and state["iteration"] == 1 and state["update_step"] == 1
    for k, v in m.state_dict().items():
        assert torch.equal(v, w1[k]), k
    assert "falling back to the older iter_000001" in caplog.text and name in caplog.text


def test_missing_file_and_no_intact_checkpoint(tmp_path):
    run = tmp_path / "run"
    _save(run, 1, teacher=False)
    m, opt, teacher = _fresh()
    with pytest.raises(CheckpointError, match=r"teacher\.safetensors is missing but SERL is on"):
        load_checkpoint(run / "checkpoints" / "iter_000001", m, opt, teacher=teacher)
    _truncate(run / "checkpoints" / "iter_000001" / "state.pt")
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        load_newest_intact(run, lambda f: load_checkpoint(f, m, opt))
    with pytest.raises(CheckpointError, match="nothing to resume"):
        load_newest_intact(tmp_path / "empty", lambda f: None)


def test_eval_weights_fall_back_too(tmp_path):
    run = tmp_path / "run"
    w1 = _save(run, 1)
    _save(run, 2)
    _truncate(run / "checkpoints" / "iter_000002" / "policy.safetensors")
    m = _model(5)
    folder, _ = load_newest_intact(run, lambda f: load_policy_weights(f, m))
    assert folder.name == "iter_000001"
    assert all(torch.equal(v, w1[k]) for k, v in m.state_dict().items())


def test_pruning_by_iteration_keeps_what_it_just_wrote(tmp_path):
    """A run that went back to iteration 2 used to prune the checkpoint it had just written
    (names sorted after iter_3/iter_4), leaving ``latest`` pointing at nothing."""
    run = tmp_path / "run"
    for it in (1, 2, 3, 4):
        _save(run, it, keep=2)
    assert [p.name for p in list_checkpoints(run)] == ["iter_000003", "iter_000004"]
    _save(run, 2, keep=2)
    assert [p.name for p in list_checkpoints(run)] == ["iter_000002"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    # numbers past the zero padding sort by number, not by name
    for it in (999999, 1000000):
        _save(run, it, keep=2)
    assert [p.name for p in list_checkpoints(run)] == ["iter_999999", "iter_1000000"]


def test_stale_tmp_folders_are_removed(tmp_path):
    run = tmp_path / "run"
    _save(run, 1)
    stale = run / "checkpoints" / ".tmp_iter_000002_abcd"
    stale.mkdir()
    (stale / "policy.safetensors").write_bytes(b"x" * 100)
    assert remove_stale_tmp_dirs(run) == [stale]
    assert not stale.exists() and (run / "checkpoints" / "iter_000001").is_dir()


def test_save_refuses_when_the_disk_is_too_full(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _save(run, 1)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(CheckpointError, match=r"not enough disk space .* needs about .* MB, 1000 B free"):
        _save(run, 2)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001", "latest"]


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"),
                                 RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4352 vs 4246")])
def test_full_disk_during_the_write_is_said_in_words(tmp_path, monkeypatch, exc):
    run = tmp_path / "run"
    _save(run, 1)

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr(ckpt.torch, "save", fail)
    with pytest.raises(CheckpointError, match=r"the disk is full: could not write a checkpoint .* free"):
        _save(run, 2)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001", "latest"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_000001"
