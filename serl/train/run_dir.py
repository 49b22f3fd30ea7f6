"""Run folders: start-up checks, the per-run lock, and ``trainer.overwrite``.

A run writes to ``<trainer.output_dir>/<run_name>``. The rules (all before anything is written):

* ``trainer.output_dir`` must be a folder that exists or can be created, and writable
  (:func:`check_output_dir`); else one :class:`~serl.errors.ConfigError` naming the key.
* A new run (no ``--resume``) refuses an existing non-empty run folder, so a finished run is
  never mixed with a new one (:func:`check_new_run_dir`). With ``trainer.overwrite=true`` the old
  folder is moved aside to ``<run_name>.old-<YYYYmmdd-HHMMSS>`` (never deleted), unless another
  process holds its lock.
* The folder of a new run is created only after the start-up checks passed
  (:func:`create_run_dir`), so a failed start leaves no empty folder behind.
* While a run lives it holds an exclusive ``fcntl.flock`` on ``<run>/.lock`` (the file holds the
  PID): a second process on the same folder stops with one line naming that PID
  (:class:`RunLock`). The kernel drops the lock when the process exits, even on ``kill -9``,
  so a stale lock file never blocks a resume. Inside one process the lock is shared (counted).
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Optional

from serl.errors import CheckpointError, ConfigError, SerlError

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"

# lock files held by this process: resolved run folder -> [fd, count]
_HELD: dict[Path, list[int]] = {}


def check_output_dir(output_dir: Path, key: str = "trainer.output_dir") -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``output_dir`` is (or can be created as)
    a writable folder: not a regular file, no regular file on its path, and its nearest existing
    ancestor accepts a new entry (checked by creating and removing a temporary folder there)."""
    p = Path(output_dir).expanduser()
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        what = "is a regular file" if probe == p else f"cannot be created: {probe} is a regular file"
        raise ConfigError(f"{key}: {p} {what}, not a folder; set {key} to a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".serl-write-test-", dir=probe))
    except OSError as e:
        raise ConfigError(f"{key}: cannot write to {p} ({e.strerror or e}); set {key} to a writable folder") from None


def _is_nonempty_dir(p: Path) -> bool:
    """True if ``p`` is a folder holding anything but a lock file: a folder that a run killed
    right after creating it left with only its ``.lock`` counts as empty (a live holder of that
    lock is still found when the new run takes it)."""
    return p.is_dir() and any(c.name != LOCK_NAME for c in p.iterdir())


def check_new_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Start-up check of a new run's folder (nothing is written).

    Raises:
        ConfigError: ``run_dir`` is a regular file; or it is a non-empty folder and
            ``overwrite`` is false (the message says how to resume or overwrite).
        SerlError: ``overwrite`` is true but another process holds the folder's lock.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"trainer.run_name: {run_dir} is a regular file, not a run folder")
    if not _is_nonempty_dir(run_dir):
        return
    if not overwrite:
        raise ConfigError(f"trainer.run_name: the run folder {run_dir} already exists and is not empty; "
                          f"continue it with `--resume {run_dir}`, pick another trainer.run_name, or set "
                          "trainer.overwrite=true to move the old folder aside")
    holder = lock_holder(run_dir)
    if holder is not None:
        raise SerlError(f"run folder {run_dir} is in use by another serl process (PID {holder or 'unknown'}); "
                        "trainer.overwrite=true does not move a running run aside")


def move_aside(run_dir: Path) -> Path:
    """Rename ``run_dir`` to ``<name>.old-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... if taken), with
    a warning naming both; returns the new path."""
    run_dir = Path(run_dir)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    dest = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    k = 2
    while dest.exists():
        dest = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{k}")
        k += 1
    os.replace(run_dir, dest)
    log.warning("trainer.overwrite=true: moved the old run folder %s to %s", run_dir, dest)
    return dest


def create_run_dir(run_dir: Path, overwrite: bool) -> "RunLock":
    """Create a new run's folder once the start-up checks passed, and lock it.

    Re-checks the folder (it may have appeared meanwhile), moves a non-empty one aside when
    ``overwrite`` is set, creates it and takes its lock.

    Raises:
        ConfigError, SerlError: as :func:`check_new_run_dir`, or the lock is taken.
    """
    run_dir = Path(run_dir)
    check_new_run_dir(run_dir, overwrite)
    if _is_nonempty_dir(run_dir):
        move_aside(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock.acquire(run_dir)
    if any(p.name != LOCK_NAME for p in run_dir.iterdir()):  # another process got in first
        lock.release()
        raise ConfigError(f"trainer.run_name: the run folder {run_dir} was filled by another process meanwhile")
    return lock


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool, what: str = "run") -> Optional["RunLock"]:
    """The start-up check of a run folder, before any model loads (``serl train`` and ``serl sft``).

    Resume: the folder must exist; it is locked now and the lock returned. New run:
    its parent must be writable and the folder empty or absent (or ``overwrite``); nothing is
    written and None is returned (create it later with :func:`create_run_dir`).

    Raises:
        CheckpointError: ``resume`` and ``run_dir`` is not a folder.
        ConfigError, SerlError: as :func:`check_output_dir`, :func:`check_new_run_dir` and
            :meth:`RunLock.acquire`.
    """
    run_dir = Path(run_dir)
    if resume:
        if not run_dir.is_dir():
            raise CheckpointError(f"cannot resume: {run_dir} is not a {what} folder")
        return RunLock.acquire(run_dir)
    check_output_dir(run_dir.parent)
    check_new_run_dir(run_dir, overwrite)
    return None


def lock_holder(run_dir: Path) -> Optional[str]:
    """None if nobody holds ``<run_dir>/.lock``; else the PID written in it (``""`` if unreadable).
    Always None for a lock held by this process."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    if not path.exists() or run_dir.resolve() in _HELD:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 64, 0).decode(errors="replace").strip()
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/.lock`` for the life of a run (see the module
    docstring). Use :meth:`acquire`; :meth:`release` is idempotent."""

    def __init__(self, run_dir: Path, key: Path):
        self.run_dir = run_dir
        self._key: Optional[Path] = key

    @classmethod
    def acquire(cls, run_dir: Path) -> "RunLock":
        """Lock ``run_dir`` (which must exist) and write this PID into the lock file.

        Raises:
            SerlError: another process holds the lock; the message names its PID.
        """
        run_dir = Path(run_dir)
        key = run_dir.resolve()
        if key in _HELD:
            _HELD[key][1] += 1
            return cls(run_dir, key)
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SerlError(f"run folder {run_dir} is in use by another serl process (PID {pid}); "
                            "wait for it to end, or stop it, before using this folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[key] = [fd, 1]
        return cls(run_dir, key)

    def release(self) -> None:
        """Drop this handle; the lock itself goes with the process's last handle."""
        if self._key is None:
            return
        key, self._key = self._key, None
        entry = _HELD.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[key]
            os.close(entry[0])  # closing the descriptor releases the flock
