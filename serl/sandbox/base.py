"""The sandbox interface: :class:`ExecutionResult`, the :class:`Sandbox` protocol, and
:class:`BaseSandbox`, which gives every backend bounded concurrency, ``run_many`` and counters.

A backend implements one method, :meth:`BaseSandbox._execute` (run one program, return an
:class:`ExecutionResult`); the base class wraps it so that :meth:`~BaseSandbox.run` never raises
into the rollout loop. In SPEAR's original a crash inside the executor returned ``None`` and the
whole rollout batch failed on ``len(None)``
(``TencentYoutuResearch/SPEAR@7e8431513165640b4b1f78d09ebaae8807ee4f85:verl/verl/tools/sandbox_fusion_tools.py``,
``ExecutionWorker.execute``); here any exception of a backend becomes a result of status
``"api_error"``, is logged with its traceback, and is counted in :meth:`~BaseSandbox.stats`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, Protocol, Sequence, runtime_checkable

from serl.errors import SandboxError  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout", "killed", "api_error"]
#: every status a result can have, in the order :meth:`BaseSandbox.stats` lists them
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "killed", "api_error")
#: how many recent call durations :meth:`BaseSandbox.stats` keeps for its percentiles
_DURATION_WINDOW = 10_000


@dataclass(frozen=True)
class ExecutionResult:
    """What one program run produced.

    Attributes:
        status: ``"ok"`` (exit code 0); ``"error"`` (nonzero exit, e.g. an uncaught exception);
            ``"timeout"`` (the wall-clock or the backend's time limit was hit);
            ``"killed"`` (ended by a signal or a resource limit: CPU time, memory — a
            ``MemoryError`` counts —, processes); ``"api_error"`` (the backend could not run the
            code at all: server unreachable, bad reply, sandbox set-up failure).
        stdout: the program's standard output, decoded as UTF-8 (invalid bytes replaced), cut at
            the backend's cap.
        stderr: its standard error, likewise.
        return_code: the exit code; negative ``-N`` when ended by signal ``N``; ``None`` when the
            code did not run to an exit (timeout, api error).
        wall_s: seconds from the call to the result, as measured by the caller's side.
        stdout_truncated: ``stdout`` was cut at the capture cap (the rest was discarded).
        stderr_truncated: likewise for ``stderr``.
        message: the backend's own one-line note (why it was killed, the HTTP error): for logs,
            never shown to the model in the original message mode.
        attempts: HTTP attempts made (SandboxFusion retries on 504); 1 for the local backend.
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    return_code: int | None = None
    wall_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    message: str = ""
    attempts: int = 1

    @property
    def finished(self) -> bool:
        """The code ran to an exit (SandboxFusion's ``run_result.status == "Finished"``): status
        ``ok``, ``error`` or ``killed``."""
        return self.status in ("ok", "error", "killed")


@runtime_checkable
class Sandbox(Protocol):
    """What the rollout needs from a code sandbox."""

    def run(self, code: str) -> ExecutionResult:
        """Run one Python program; never raises for what the program does."""
        ...

    def run_many(self, codes: Sequence[str]) -> list[ExecutionResult]:
        """Run several programs, at most the sandbox's concurrency at a time; results in order."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters for metrics (see :meth:`BaseSandbox.stats`)."""
        ...

    def close(self) -> None:
        """Release the sandbox's resources; idempotent."""
        ...


def _percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (``0 < q <= 1``) of an ascending list; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values), max(1, math.ceil(q * len(sorted_values))))
    return sorted_values[rank - 1]


class BaseSandbox:
    """Bounded concurrency, ``run_many``, counters and the never-raise guarantee for a backend.

    Args:
        max_concurrency: programs running at once across all threads calling :meth:`run`
            (default: the number of CPU cores). Raises :class:`SandboxError` if below 1.
    """

    backend = "base"

    def __init__(self, max_concurrency: int | None = None):
        n = (os.cpu_count() or 1) if max_concurrency is None else int(max_concurrency)
        if n < 1:
            raise SandboxError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = n
        self._slots = threading.BoundedSemaphore(n)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STATUSES, 0)
        self._calls = 0
        self._total_s = 0.0
        self._retries = 0
        self._durations: deque[float] = deque(maxlen=_DURATION_WINDOW)
        self._closed = False

    def _execute(self, code: str) -> ExecutionResult:
        """Run one program (the backend's work). May raise: :meth:`run` turns it into a result."""
        raise NotImplementedError

    def run(self, code: str) -> ExecutionResult:
        """Run one Python program and return what it did.

        Blocks while ``max_concurrency`` programs are already running. Never raises for the
        program or the backend: an exception inside the backend is logged and returned as status
        ``"api_error"`` (``message`` holds its type and text).

        Raises:
            SandboxError: the sandbox was closed.
            TypeError: ``code`` is not a ``str``.
        """
        if self._closed:
            raise SandboxError(f"{type(self).__name__} is closed")
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        start = time.monotonic()
        with self._slots:
            try:
                result = self._execute(code)
            except Exception as e:  # the documented result: api_error, never a raise into the run loop
                log.exception("%s backend failed on a program; returned as api_error", self.backend)
                result = ExecutionResult("api_error", message=f"{type(e).__name__}: {e}",
                                         wall_s=time.monotonic() - start)
        self._record(result, time.monotonic() - start)
        return result

    def run_many(self, codes: Sequence[str]) -> list[ExecutionResult]:
        """Run ``codes`` with at most ``max_concurrency`` at a time; results in the input order.

        Raises:
            SandboxError: the sandbox was closed.
            TypeError: an element is not a ``str`` (before anything runs).
        """
        codes = list(codes)
        for c in codes:
            if not isinstance(c, str):
                raise TypeError(f"code must be a str, got {type(c).__name__}")
        if len(codes) <= 1:
            return [self.run(c) for c in codes]
        with ThreadPoolExecutor(max_workers=min(len(codes), self.max_concurrency),
                                thread_name_prefix="serl-sandbox") as pool:
            return list(pool.map(self.run, codes))

    def _record(self, result: ExecutionResult, seconds: float) -> None:
        with self._lock:
            self._calls += 1
            self._counts[result.status] = self._counts.get(result.status, 0) + 1
            self._total_s += seconds
            self._retries += max(0, result.attempts - 1)
            self._durations.append(seconds)

    def stats(self) -> dict[str, float]:
        """Counters since construction, for the run's metrics.

        Returns:
            ``calls``; one ``status/<s>`` count per status of :data:`STATUSES`; ``retries``
            (HTTP retries, SandboxFusion only); ``total_s`` (seconds spent in calls, waiting for
            a slot included); ``p50_ms`` and ``p99_ms`` (nearest-rank percentiles of the last
            10,000 call durations, in milliseconds; 0.0 before the first call).
        """
        with self._lock:
            durations = sorted(self._durations)
            out: dict[str, float] = {"calls": self._calls}
            out.update({f"status/{s}": self._counts.get(s, 0) for s in STATUSES})
            out.update(retries=self._retries, total_s=self._total_s,
                       p50_ms=1000 * _percentile(durations, 0.5), p99_ms=1000 * _percentile(durations, 0.99))
        return out

    def close(self) -> None:
        """Mark the sandbox closed (later :meth:`run` calls raise); idempotent."""
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
