"""Small shared helpers: atomic file writes, seeding, CPU thread policy."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: str | Path, write_fn: Callable[[str], None]) -> None:
    """Write a file atomically: ``write_fn(tmp_path)`` writes a temp file in the same folder,
    which is fsynced and renamed over ``path``. A crash leaves the old file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_fn(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""

    def _w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, _w)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch RNGs."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def configure_cpu_threads(num_threads: int | None) -> int:
    """Apply serl's CPU thread policy and return the torch thread count.

    OpenMP spin-waiting makes HF generation up to 40x slower when env workers share the cores,
    so ``OMP_WAIT_POLICY=PASSIVE`` is set (effective only before torch initialises OpenMP, which
    is why :mod:`serl.cli` also sets it before importing torch). ``num_threads`` of ``None`` or
    ``0`` means all cores.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    n = num_threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (e.g. ``"AMD EPYC"``), or the platform's
    machine string where that file is absent (macOS, Windows)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # no /proc: fall back to the platform string below
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_kind() -> str:
    """The CPU model and the instruction set torch's CPU kernels use here, e.g.
    ``"AMD EPYC (torch CPU capability AVX512)"``: what a time or a dtype choice depends on."""
    import torch

    return f"{cpu_model()} (torch CPU capability {torch.backends.cpu.get_cpu_capability()})"
