"""Atomic checkpoints: ``<run>/checkpoints/iter_<N>/`` with a ``latest`` pointer.

A checkpoint folder holds ``policy.safetensors``, ``teacher.safetensors`` (if SERL is on, in the
teacher's own inference dtype; left out when the teacher equals the policy cast to that dtype,
e.g. right after a teacher sync: ``state.pt`` then says so and loading rebuilds it),
``optimizer.pt``, and ``state.pt`` (update counter, iteration, data cursor, RNG states, SERL
context-builder and replay-buffer state). It is written to a hidden temp folder, fsynced, and
renamed into place; ``latest`` is then replaced atomically. An interrupted save leaves the
previous checkpoint and pointer intact.
"""

from __future__ import annotations

from serl.errors import CheckpointError  # noqa: F401  (re-exported)

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from serl.utils import atomic_write_text




def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _state_dict_for_save(model) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, tied weights stored once (safetensors refuses shared storage)."""
    out, seen = {}, set()
    for k, v in model.state_dict().items():
        ptr = v.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[k] = v.detach().cpu().contiguous()
    return out


@torch.no_grad()
def _equals_cast_policy(teacher, policy) -> bool:
    """True if every teacher tensor equals the policy's tensor cast to the teacher's dtype."""
    src = policy.state_dict()
    for k, v in teacher.state_dict().items():
        if k not in src or src[k].shape != v.shape or not torch.equal(src[k].to(v.dtype), v):
            return False
    return True


@torch.no_grad()
def _copy_cast(policy, teacher) -> None:
    """The teacher's tensors := the policy's, cast to the teacher's dtype."""
    src = policy.state_dict()
    for k, v in teacher.state_dict().items():
        v.copy_(src[k].to(v.dtype))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, iteration: int, policy, optimizer, state: dict[str, Any],
                    teacher=None, keep: int = 2) -> Path:
    """Write ``<run_dir>/checkpoints/iter_<iteration>`` atomically and point ``latest`` at it.

    Args:
        run_dir: the run folder.
        iteration: completed training iterations.
        policy: the trained model.
        optimizer: its optimizer.
        state: picklable trainer state (counters, cursor, RNG, buffers).
        teacher: the SERL teacher model, or None.
        keep: keep the newest ``keep`` checkpoints (0 = all).

    Returns:
        The checkpoint folder.
    """
    ck_root = Path(run_dir) / "checkpoints"
    ck_root.mkdir(parents=True, exist_ok=True)
    final = ck_root / f"iter_{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(dir=ck_root, prefix=f".tmp_iter_{iteration:06d}_"))
    try:
        save_file(_state_dict_for_save(policy), str(tmp / "policy.safetensors"))
        teacher_from_policy = teacher is not None and _equals_cast_policy(teacher, policy)
        if teacher is not None and not teacher_from_policy:
            save_file(_state_dict_for_save(teacher), str(tmp / "teacher.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({**state, "iteration": iteration, "rng": rng_state(), "teacher_from_policy": teacher_from_policy},
                   tmp / "state.pt")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ck_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(ck_root / "latest", final.name + "\n")
    if keep > 0:
        old = sorted(p for p in ck_root.glob("iter_*") if p.is_dir())[:-keep]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path:
    """The checkpoint folder named by ``<run_dir>/checkpoints/latest``.

    Raises:
        CheckpointError: no checkpoint, or the pointer names a missing folder.
    """
    ck_root = Path(run_dir) / "checkpoints"
    ptr = ck_root / "latest"
    if not ptr.exists():
        raise CheckpointError(f"no checkpoint in {run_dir} (missing {ptr}); nothing to resume")
    folder = ck_root / ptr.read_text().strip()
    if not (folder / "state.pt").exists():
        raise CheckpointError(f"{ptr} points at {folder}, which is incomplete or missing")
    return folder


def load_checkpoint(folder: Path, policy, optimizer=None, teacher=None) -> dict[str, Any]:
    """Restore weights (and optimizer, teacher, RNG) from ``folder``; returns the trainer state."""
    folder = Path(folder)
    try:
        missing, unexpected = policy.load_state_dict(load_file(str(folder / "policy.safetensors")), strict=False)
        _check_keys(policy, missing, unexpected, folder / "policy.safetensors")
        state = torch.load(folder / "state.pt", weights_only=False)
        if teacher is not None:
            tf = folder / "teacher.safetensors"
            if state.get("teacher_from_policy") and not tf.exists():
                _copy_cast(policy, teacher)
            elif not tf.exists():
                raise CheckpointError(f"{folder} has no teacher.safetensors but SERL is on")
            else:
                missing, unexpected = teacher.load_state_dict(load_file(str(tf)), strict=False)
                _check_keys(teacher, missing, unexpected, tf)
        if optimizer is not None:
            optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
    except (OSError, RuntimeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"could not read checkpoint {folder}: {e}") from e
    set_rng_state(state["rng"])
    return state


def _check_keys(model, missing, unexpected, path) -> None:
    """Tied weights are saved once, so a key missing from the file is fine iff it is tied."""
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if isinstance(getattr(model, "_tied_weights_keys", None), dict):
        tied = set(model._tied_weights_keys)
    real_missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise CheckpointError(f"{path} does not match the model: missing {real_missing[:5]}, unexpected {unexpected[:5]}")
