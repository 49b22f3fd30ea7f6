"""Small shared helpers: atomic file writes, JSON lines, resumable journals, seeding, CPU thread policy."""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from serl.errors import ConfigError


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


class Journal:
    """An append-only JSON-lines file that makes a long command resumable: a header line
    ``{"journal": header}`` naming the command's arguments, then one line per finished unit of work
    (an episode, a chunk's trajectory), each appended, flushed and fsynced, so a stopped run loses at
    most the unit in flight. A last line cut by a kill is dropped when the journal is opened.
    ``serl data expert`` (:class:`serl.rollout.expert_journal.ExpertJournal`) and ``serl eval`` keep one.

    Args:
        path: the journal file; created (with its header) if missing.
        header: the command's arguments (JSON-serialisable); must equal an existing journal's.
        what: the command, for error messages (e.g. ``serl eval``).
        keep: keep what :meth:`append` writes in :attr:`entries` too; False for a caller that
            holds its units itself (``serl eval``: a 134-game conversation panel's trajectories
            are ~0.5 GB of JSON, kept once, not twice). :attr:`entries` always holds what the
            journal held when opened.

    Raises:
        ConfigError: ``path`` holds the journal of a run with other arguments, or is not a
            journal of ``what``.
    """

    def __init__(self, path: str | Path, header: dict[str, Any], what: str, keep: bool = True):
        self.path, self.what, self.keep = Path(path), what, keep
        self.header = json.loads(json.dumps(header))  # as it reads back (tuples as lists)
        self.entries: list[dict[str, Any]] = []
        if self.path.exists():
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write("w", {"journal": self.header, "command": what})

    def _load(self) -> None:
        data = self.path.read_bytes()
        good, lines = 0, []  # byte offset after the last complete, parseable line
        for raw in data.splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break
            try:
                lines.append(json.loads(raw))
            except ValueError:
                break
            good += len(raw)
        if not lines or not isinstance(lines[0], dict) or "journal" not in lines[0] or \
                lines[0].get("command", self.what) != self.what:
            raise ConfigError(f"{self.path} is not a {self.what} journal; move it away or pick another --out")
        if lines[0]["journal"] != self.header:
            raise ConfigError(f"{self.path} holds a run with other arguments ({lines[0]['journal']}); rerun that "
                              "command to finish it, or delete the file to start over")
        if good < len(data):  # a line cut by a kill: drop it, so that appends start on a line of their own
            with open(self.path, "r+b") as f:
                f.truncate(good)
        self.entries = lines[1:]

    def _write(self, mode: str, *records: dict[str, Any]) -> list[str]:
        lines = [json.dumps(r, ensure_ascii=False) for r in records]
        with open(self.path, mode, encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        return lines

    def append(self, *entries: dict[str, Any]) -> None:
        """Record finished units of work (one line each, written together, flushed and fsynced);
        with ``keep``, :attr:`entries` gets them as they read back (encoded once)."""
        lines = self._write("a", *entries)
        if self.keep:
            self.entries.extend(json.loads(line) for line in lines)

    def remove(self) -> None:
        """Delete the journal (once its results are written out)."""
        self.path.unlink(missing_ok=True)


def jsonl_lines(lines: str | Iterable[str]) -> Iterator[tuple[int, str, Any, Optional[str]]]:
    """Each non-blank line of JSON-lines text, parsed: ``(number, line, value, error)``.

    ``lines`` is the whole text (split at ``\n`` only) or its lines (a text file object). Never
    ``str.splitlines()``: it also splits at U+2028, U+0085 and other separators that
    ``json.dumps(..., ensure_ascii=False)`` writes raw inside a string, and so cuts a record in two.
    ``number`` counts every line from 1 (blank ones too, so it matches an editor's); ``line`` is the
    text as given; ``value`` is the parsed JSON value, None when the line does not parse; ``error``
    is the parser's message then, else None. What a bad line or a non-object means is the caller's:
    loaders of data refuse it with the file and line, readers of a run's own logs skip it (a crash
    can cut the last line).
    """
    if isinstance(lines, str):
        lines = lines.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, line, json.loads(line), None
        except json.JSONDecodeError as e:
            yield number, line, None, str(e)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch RNGs."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


#: how many times an idle OpenMP thread of torch's (GNU libgomp) spins before it sleeps
#: (``GOMP_SPINCOUNT``; libgomp's default is 300,000 spins, 0 with ``OMP_WAIT_POLICY=PASSIVE``)
OPENMP_SPINCOUNT = "10000"


def use_openmp_policy() -> None:
    """Set serl's OpenMP wait policy for this process (see :func:`configure_cpu_threads`):
    ``GOMP_SPINCOUNT`` = :data:`OPENMP_SPINCOUNT`, unless the user set ``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT``. Effective only before torch is imported (libgomp reads it once)."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPINCOUNT)


def configure_cpu_threads(num_threads: int | None) -> int:
    """Apply serl's CPU thread policy and return the torch thread count.

    OpenMP threads waiting for work: spinning long (libgomp's default, or
    ``OMP_WAIT_POLICY=ACTIVE``) steals the cores of env workers that run beside the model (HF
    generation was seen up to 40x slower so); never spinning (``PASSIVE``, serl's setting before
    2026-11-26) puts every thread to sleep between the ~400 small operators of a decode step, which
    made a batch-16 bf16 decode step 1.7x slower (65 vs 39 ms, BENCHMARKS.md "Rollouts at the
    hardware's pace"). So an idle thread spins :data:`OPENMP_SPINCOUNT` times (microseconds), then
    sleeps (``GOMP_SPINCOUNT``; set only when the user set no ``OMP_WAIT_POLICY``, and effective
    only before torch initialises OpenMP, which is why :mod:`serl.cli` sets it before importing
    torch). ``num_threads`` of ``None`` or ``0`` means all cores.
    """
    use_openmp_policy()
    import torch

    n = num_threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


#: glibc's ``mallopt`` parameter number of the mmap threshold (``M_MMAP_THRESHOLD`` in malloc.h)
M_MMAP_THRESHOLD = -3
#: the threshold serl fixes for a float32 update on CPU, 4 MiB: low enough that an update's
#: activations and logits come and go through mmap, high enough that decoding's many small buffers
#: do not (16 MiB kept most of the growth; 128 KiB slowed decoding; BENCHMARKS.md, "The default
#: run's memory")
MMAP_THRESHOLD_BYTES = 4 * 2**20


def mmap_threshold_for(float32_cpu_update: bool) -> int:
    """The glibc mmap threshold (bytes) serl sets for a run: ``SERL_MALLOC_MMAP_THRESHOLD`` when set
    (``0`` = none), else :data:`MMAP_THRESHOLD_BYTES` when the update runs in float32 on CPU, else 0
    (glibc's dynamic threshold is kept).

    Why: glibc raises its mmap threshold to the size of each mmap-ed block that is freed, up to
    32 MiB (``DEFAULT_MMAP_THRESHOLD_MAX``; ``man 3 mallopt``, M_MMAP_THRESHOLD), so after the first
    large tensors are freed, every later buffer under 32 MiB comes from the heap, whose freed holes
    stay resident. One float32 forward/backward of SmolLM2-135M with LoRA and activation
    checkpointing (4 rows × 1,270 tokens, the ``cpu`` recipe's micro-batch) then peaks 5.7–6.1 GiB
    above its start, against 1.6–1.8 GiB with the threshold fixed at 4 MiB, for 14–19% more update
    time (``benchmarks/mmap_threshold.py``). With bf16 autocast serl keeps glibc's faster default:
    the default ``serl train`` (one conversation per episode) peaks at 5.7 GiB so and at 3.8 GiB with
    ``SERL_MALLOC_MMAP_THRESHOLD=4194304``, for 10% more wall time (its update 1.3x slower; AMD
    EPYC, 2026-11-28).

    Raises:
        ConfigError (a ``ValueError``): ``SERL_MALLOC_MMAP_THRESHOLD`` is not a non-negative integer;
            ``serl`` then stops with one line naming the variable.
    """
    env = os.environ.get("SERL_MALLOC_MMAP_THRESHOLD")
    if env is not None:
        if not env.strip().isdigit():
            raise ConfigError(f"SERL_MALLOC_MMAP_THRESHOLD={env!r}: expected a byte count >= 0 (0 = glibc's default); "
                              "unset it or set e.g. 4194304")
        return int(env)
    return MMAP_THRESHOLD_BYTES if float32_cpu_update else 0


def fix_mmap_threshold(threshold: int) -> int:
    """Fix glibc's mmap threshold at ``threshold`` bytes (``mallopt(M_MMAP_THRESHOLD)``, which also
    turns glibc's dynamic adjustment off, as ``MALLOC_MMAP_THRESHOLD_`` in the environment would;
    glibc ``malloc/malloc.c``, ``do_set_mmap_threshold``), so that every freed buffer above it goes
    back to the operating system at once. Affects the allocations made after the call.

    Returns:
        The threshold set, or 0 when ``threshold`` is 0, there is no glibc (macOS, Windows, musl) or
        glibc refuses the value (``mallopt`` returns 0).
    """
    import ctypes
    import ctypes.util
    import platform

    if threshold <= 0 or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return 0
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return threshold if libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)) else 0


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
