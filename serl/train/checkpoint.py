"""Atomic checkpoints: ``<run>/checkpoints/iter_<N>/`` with a ``latest`` pointer.

A checkpoint folder holds ``policy.safetensors``, ``teacher.safetensors`` (if SERL is on, in the
teacher's own inference dtype; left out when the teacher equals the policy cast to that dtype,
e.g. right after a teacher sync: ``state.pt`` then says so and loading rebuilds it),
``optimizer.pt``, and ``state.pt`` (update counter, iteration, data cursor, RNG states, SERL
context-builder and replay-buffer state). It is written to a hidden temp folder, fsynced, and
renamed into place; ``latest`` is then replaced atomically. An interrupted save leaves the
previous checkpoint and pointer intact, and a ``.tmp_*`` folder that the next start removes
(:func:`remove_stale_tmp_dirs`). A save first checks the free disk space against an estimate of
the bytes it writes; a full disk is reported in words (:class:`CheckpointError`).

Loading: every failure to read a file of a checkpoint is a :class:`CheckpointError` naming the
file; :func:`load_newest_intact` falls back from a damaged checkpoint to the next older one and
says so. Old checkpoints are pruned by iteration number. :func:`check_resumable` looks at the
files of a run's checkpoints before any model loads (no tensor is read), so a resume with no
checkpoint, or only truncated ones, stops in one line naming the file and the fix.
"""

from __future__ import annotations

from serl.errors import CheckpointError  # noqa: F401  (re-exported)

import errno
import logging
import os
import random
import re
import shlex
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from serl.models.loading import check_state_dict_keys as _check_keys
from serl.utils import atomic_write_text

log = logging.getLogger(__name__)

T = TypeVar("T")

#: bytes added to a save's estimate (state.pt, file headers, file-system slack)
SAVE_MARGIN_BYTES = 16 * 2**20
_ITER_DIR = re.compile(r"^iter_(\d+)$")



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
        keep: keep the newest ``keep`` checkpoints by iteration number (0 = all); see
            :func:`prune_checkpoints`.

    Returns:
        The checkpoint folder.

    Raises:
        CheckpointError: not enough free disk space (checked before writing), or a write failed
            (a full disk is said in words, with the free space); the previous checkpoint and
            ``latest`` are then untouched.
    """
    ck_root = Path(run_dir) / "checkpoints"
    ck_root.mkdir(parents=True, exist_ok=True)
    check_free_space(ck_root, estimate_checkpoint_bytes(policy, optimizer, teacher))
    final = ck_root / f"iter_{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(dir=ck_root, prefix=f".tmp_iter_{iteration:06d}_"))
    try:
        try:
            _write_checkpoint_files(tmp, iteration, policy, optimizer, state, teacher)
        except (OSError, RuntimeError) as e:
            raise _write_error(e, ck_root) from e
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ck_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(ck_root / "latest", final.name + "\n")
    prune_checkpoints(ck_root, final, keep)
    return final


def _write_checkpoint_files(tmp: Path, iteration: int, policy, optimizer, state: dict[str, Any], teacher) -> None:
    """The files of one checkpoint into ``tmp``, fsynced."""
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


# ---------------------------------------------------------------------- disk space


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def estimate_checkpoint_bytes(policy, optimizer, teacher=None) -> int:
    """Bytes a :func:`save_checkpoint` writes, estimated from the tensors: the policy's and the
    teacher's state dicts (tied weights once) and every tensor in the optimizer state (AdamW:
    two fp32 moments per parameter), plus :data:`SAVE_MARGIN_BYTES`."""
    total = SAVE_MARGIN_BYTES
    for model in (policy, teacher):
        if model is not None:
            total += sum(t.numel() * t.element_size() for t in _state_dict_for_save(model).values())
    for per_param in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in per_param.values() if torch.is_tensor(v))
    return total


def check_free_space(folder: Path, need: int) -> None:
    """Raises :class:`CheckpointError` when the file system of ``folder`` has less than
    ``need`` bytes free (``shutil.disk_usage``), saying how much is needed and free."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise CheckpointError(f"not enough disk space to save a checkpoint in {folder}: it needs about "
                              f"{_fmt_bytes(need)}, {_fmt_bytes(free)} free. Free some space (old runs, "
                              "trainer.max_checkpoints_to_keep) or set trainer.output_dir elsewhere")


def _write_error(e: BaseException, ck_root: Path) -> CheckpointError:
    """A write failure as a :class:`CheckpointError`; a full disk (``ENOSPC``, or torch's
    "unexpected pos" / "file write failed" when the disk filled up) is named as such."""
    try:
        free = _fmt_bytes(shutil.disk_usage(ck_root).free)
    except OSError:
        free = "unknown"
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    full = getattr(e, "errno", None) == errno.ENOSPC or any(
        k in str(e) for k in ("unexpected pos", "file write failed", "No space left"))
    if full:
        return CheckpointError(f"the disk is full: could not write a checkpoint in {ck_root} ({free} free; "
                               f"{text}). The previous checkpoint is intact; free some space and resume")
    return CheckpointError(f"could not write a checkpoint in {ck_root} ({free} free): {text}")


# ---------------------------------------------------------------------- listing, pruning, stale files


def checkpoint_iteration(folder: Path) -> int | None:
    """The iteration of a checkpoint folder ``iter_<N>``, or None for another name."""
    m = _ITER_DIR.match(Path(folder).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The ``iter_<N>`` folders of ``<run_dir>/checkpoints``, by iteration number (oldest first)."""
    ck_root = Path(run_dir) / "checkpoints"
    if not ck_root.is_dir():
        return []
    found = [(checkpoint_iteration(p), p) for p in ck_root.iterdir() if p.is_dir()]
    return [p for n, p in sorted((n, p) for n, p in found if n is not None)]


def prune_checkpoints(ck_root: Path, current: Path, keep: int) -> list[Path]:
    """Delete old checkpoints by iteration number: keep ``current`` (just written) and the newest
    ``keep - 1`` older ones; those *newer* than ``current`` (left by a run that fell back to an
    older checkpoint) are superseded and go too. ``keep = 0`` keeps all. Each folder is first
    renamed to a ``.tmp_*`` name, so an interrupted deletion never leaves a half checkpoint
    under an ``iter_*`` name. Returns the deleted folders."""
    if keep <= 0:
        return []
    n_cur = checkpoint_iteration(current)
    others = [p for p in list_checkpoints(ck_root.parent) if p != current]
    older = [p for p in others if checkpoint_iteration(p) < n_cur]
    doomed = [p for p in others if checkpoint_iteration(p) > n_cur] + older[: max(0, len(older) - (keep - 1))]
    for p in doomed:
        trash = ck_root / f".tmp_prune_{p.name}"
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(p, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


def remove_stale_tmp_dirs(run_dir: Path) -> list[Path]:
    """Delete the ``.tmp_*`` folders an interrupted save or prune left in ``<run_dir>/checkpoints``
    (call it while holding the run's lock, so no live save is touched). Returns them."""
    ck_root = Path(run_dir) / "checkpoints"
    stale = sorted(p for p in ck_root.glob(".tmp_*") if p.is_dir()) if ck_root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    if stale:
        log.warning("removed %d unfinished checkpoint folder(s) left by an interrupted save: %s",
                    len(stale), ", ".join(p.name for p in stale))
    return stale


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


def _read(path: Path, reader: Callable[[Path], T], what: str = "") -> T:
    """``reader(path)``; any failure (missing, truncated, corrupt, wrong format) becomes a
    :class:`CheckpointError` naming the file."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing{what}")
    try:
        return reader(path)
    except CheckpointError:
        raise
    except Exception as e:  # safetensors, pickle, zip and torch errors: all "unreadable file"
        text = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"checkpoint file {path} is damaged or unreadable ({type(e).__name__}: {text})") from e


def _load_weights(model, path: Path, what: str = "") -> None:
    """Load a safetensors file into ``model``; every failure names ``path``."""
    sd = _read(path, lambda p: load_file(str(p)), what)
    try:
        missing, unexpected = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise CheckpointError(f"{path} does not match the model: {str(e).splitlines()[0]}") from e
    _check_keys(model, missing, unexpected, path)


def load_policy_weights(folder: Path, model) -> None:
    """Load ``<folder>/policy.safetensors`` into ``model`` (``serl eval --run``).

    Raises:
        CheckpointError: the file is missing, damaged, or does not match the model.
    """
    _load_weights(model, Path(folder) / "policy.safetensors")


def load_checkpoint(folder: Path, policy, optimizer=None, teacher=None) -> dict[str, Any]:
    """Restore weights (and optimizer, teacher, RNG) from ``folder``; returns the trainer state.

    Raises:
        CheckpointError: a file of the checkpoint (``state.pt``, ``policy.safetensors``,
            ``teacher.safetensors``, ``optimizer.pt``) is missing, damaged or does not match;
            the message names the file. ``state.pt`` is read first, the RNG state set last.
    """
    folder = Path(folder)
    state = _read(folder / "state.pt", lambda p: torch.load(p, weights_only=False))
    if not isinstance(state, dict) or "rng" not in state or "iteration" not in state:
        raise CheckpointError(f"checkpoint file {folder / 'state.pt'} is not a serl trainer state")
    _load_weights(policy, folder / "policy.safetensors")
    if teacher is not None:
        if state.get("teacher_from_policy") and not (folder / "teacher.safetensors").exists():
            _copy_cast(policy, teacher)  # the teacher equalled the cast policy: rebuilt, not stored
        else:
            _load_weights(teacher, folder / "teacher.safetensors", " but SERL is on (its teacher is checkpointed)")
    if optimizer is not None:
        opt_sd = _read(folder / "optimizer.pt", lambda p: torch.load(p, weights_only=False))
        try:
            optimizer.load_state_dict(opt_sd)
        except (ValueError, KeyError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"checkpoint file {folder / 'optimizer.pt'} does not match the optimizer: {e}") from e
    try:
        set_rng_state(state["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint file {folder / 'state.pt'} has a bad RNG state: {e}") from e
    return state


def resume_candidates(run_dir: Path) -> list[Path]:
    """Checkpoints to try on resume, best first: the one ``latest`` names, then the older ones by
    iteration number, newest first (without a readable pointer: all, newest first)."""
    ck_root = Path(run_dir) / "checkpoints"
    all_ck = list_checkpoints(run_dir)
    ptr = ck_root / "latest"
    try:
        named = ck_root / ptr.read_text().strip()
    except OSError:
        return all_ck[::-1]
    n = checkpoint_iteration(named)
    if n is None:
        return all_ck[::-1]
    return [named] + [p for p in all_ck[::-1] if checkpoint_iteration(p) < n]


def load_newest_intact(run_dir: Path, load: Callable[[Path], T]) -> tuple[Path, T]:
    """``load(folder)`` on the newest checkpoint of ``run_dir`` that loads; a damaged one
    (``load`` raised :class:`CheckpointError`) is reported with a warning and the next older
    one is tried. ``load`` must overwrite everything it restores (a failed attempt may have
    loaded part of a checkpoint).

    Returns:
        ``(folder, load(folder))`` of the checkpoint used.

    Raises:
        CheckpointError: no checkpoint at all, or none that loads (listing each one's error).
    """
    cands = resume_candidates(run_dir)
    if not cands:
        raise CheckpointError(f"no checkpoint in {run_dir} (no {Path(run_dir) / 'checkpoints' / 'iter_*'}); "
                              "nothing to resume")
    errors = []
    for i, folder in enumerate(cands):
        try:
            out = load(folder)
        except CheckpointError as e:
            errors.append(f"{folder.name}: {e}")
            nxt = cands[i + 1].name if i + 1 < len(cands) else None
            log.warning("checkpoint %s cannot be loaded (%s); %s", folder, e,
                        f"falling back to the older {nxt}" if nxt else "no older checkpoint left")
            continue
        if errors:
            log.warning("using %s, the newest intact checkpoint of %s", folder, run_dir)
        return folder, out
    raise CheckpointError(f"no intact checkpoint in {run_dir}: " + "; ".join(errors))


# ---------------------------------------------------------------------- before a resume loads anything

#: the files every ``serl train`` checkpoint has (``teacher.safetensors`` only with SERL on)
CHECKPOINT_FILES = ("state.pt", "policy.safetensors", "optimizer.pt")


def check_file_complete(path: Path) -> None:
    """Raise :class:`CheckpointError` naming ``path`` when a checkpoint file is missing or visibly
    cut short, without reading its tensors: a ``.safetensors`` file whose header does not cover
    the file exactly, or a torch ``.pt`` zip archive without its central directory (written last,
    so a truncated file lacks it). Damage inside a complete-looking file is found when it loads."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt"):
                pass
        else:
            with zipfile.ZipFile(path):
                pass
    except (SafetensorError, zipfile.BadZipFile, OSError, ValueError) as e:
        text = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"checkpoint file {path} is truncated or damaged ({type(e).__name__}: {text})") from e


def restart_command(run_dir: Path) -> str:
    """The command that starts the run of ``run_dir`` again from iteration 0 with its saved
    config (the old folder is moved aside, not deleted: ``trainer.overwrite``)."""
    run_dir = Path(run_dir)
    return (f"serl train recipe={shlex.quote(str(run_dir / 'config.yaml'))} "
            f"trainer.output_dir={shlex.quote(str(run_dir.parent))} trainer.run_name={shlex.quote(run_dir.name)} "
            "trainer.overwrite=true")


def check_resumable(run_dir: Path) -> Path:
    """The start-up check of ``serl train --resume``, before any model loads: some checkpoint of
    ``run_dir`` has all its files, complete (:func:`check_file_complete`). A damaged newer one
    behind an intact older one is not an error here (:func:`load_newest_intact` falls back and
    says so).

    Returns:
        The newest checkpoint folder (of :func:`resume_candidates`) whose files look complete.

    Raises:
        CheckpointError: no checkpoint at all (the run stopped before its first save), or none
            whose files are complete; the message names each damaged file and the command that
            starts the run again (:func:`restart_command`).
    """
    run_dir = Path(run_dir)
    cands = resume_candidates(run_dir)
    again = restart_command(run_dir)
    if not cands:
        raise CheckpointError(f"no checkpoint in {run_dir} yet (the run stopped before its first save; "
                              f"trainer.save_freq sets how often it saves), so nothing to resume: start it again "
                              f"with `{again}`")
    errors = []
    for folder in cands:
        names = CHECKPOINT_FILES + (("teacher.safetensors",) if (folder / "teacher.safetensors").exists() else ())
        try:
            for name in names:
                check_file_complete(folder / name)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        return folder
    raise CheckpointError(f"no intact checkpoint in {run_dir}: {'; '.join(errors)}. Put back a copy of the "
                          f"file, or start the run again with `{again}`")
