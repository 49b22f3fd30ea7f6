"""This machine's limits, measured, for benchmarks that print their figures beside them: the bf16 /
float32 GEMM peak and the memory read bandwidth (used by ``throughput.py`` and ``math_rollout.py``).
Import it after any environment setting that must precede ``torch`` (``cpu_kind.emulate_avx2``,
the OpenMP policy)."""

from __future__ import annotations

import time

import torch


def gemm_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP per wall second of an ``n×n @ n×n`` matmul in ``dtype`` with torch's current
    threads (``2 n³`` FLOP a matmul): this machine's GEMM peak as the update sees it."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def read_bandwidth(mib: int = 512, reps: int = 5) -> float:
    """Best bytes per second of summing a ``mib`` MiB float32 tensor (a streaming read)."""
    x = torch.ones(mib * 2**18)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best
