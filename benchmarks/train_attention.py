"""Causal self-attention of one training row on a CPU, forward and backward, against a GEMM of the
same model: why a long packed row (ALFWorld's conversation layout) costs more per FLOP than short
rows (docs/benchmarks/environments.md, "ALFWorld prompt layouts").

One row of ``L`` positions with SmolLM2-135M's attention shape (9 heads of 64; the update runs one
``sdpa`` call per packed row, ``serl.models.attention``), three ways:

* ``flash``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, PyTorch's CPU
  flash kernel (what the update runs);
* ``math``: the same call restricted to PyTorch's math backend;
* ``matmul``: ``softmax(QKᵀ·scale + causal mask)·V`` with the scores in float32;
* ``blockwise``: the same in blocks of ``--block`` query positions (each against the keys up to
  its last one), the softmax in float32, the backward recomputing each block's probabilities from
  the forward's log-sum-exp (FlashAttention's schedule, arXiv 2205.14135 Alg. 1–2, in PyTorch
  ops): no ``[L, L]`` tensor and half the causal work skipped.

Each is timed forward and backward (best of ``--repeats``), and its rate given in causal GFLOP/s
(``4·H·D·L²/2`` a forward: ``QKᵀ`` and ``AV`` over the lower triangle). For scale, a ``[L, 576] ×
[576, 1536]`` GEMM (the MLP's up projection) in the same dtype, forward only. Printed first: the
CPU model and torch's CPU capability. ::

    python benchmarks/train_attention.py                       # L = 512, 2048, 4096; bf16 and float32
    python benchmarks/train_attention.py --lengths 1024 --dtypes float32
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from serl.utils import cpu_kind

HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE = 9, 64, 576, 1536  # SmolLM2-135M


def flash(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def math_backend(q, k, v):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def matmul(q, k, v):
    L = q.shape[2]
    scores = (q @ k.transpose(-1, -2)).float() * HEAD_DIM ** -0.5
    scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, -1).to(q.dtype) @ v


class _Blockwise(torch.autograd.Function):
    """Causal attention of one row ``[H, L, D]`` in query blocks (the module docstring's ``blockwise``)."""

    @staticmethod
    def _probs(q, k, s, e, scale, lse=None):
        """Block ``s:e``'s scores against keys ``:e`` (float32, future masked), softmaxed (or, given
        ``lse``, exponentiated against it); returns the probabilities ``[H, e-s, e]`` and the lse."""
        scores = torch.bmm(q[:, s:e], k[:, :e].transpose(1, 2)).float().mul_(scale)
        scores[..., s:e].masked_fill_(torch.ones(e - s, e - s, dtype=torch.bool).triu_(1), float("-inf"))
        if lse is None:
            lse = torch.logsumexp(scores, -1, keepdim=True)
        return scores.sub_(lse).exp_(), lse

    @staticmethod
    def forward(ctx, q, k, v, block):
        H, L, D = q.shape
        out, lse = torch.empty_like(q), torch.empty(H, L, 1)
        for s in range(0, L, block):
            e = min(L, s + block)
            p, lse[:, s:e] = _Blockwise._probs(q, k, s, e, D ** -0.5)
            out[:, s:e] = torch.bmm(p.to(v.dtype), v[:, :e])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        H, L, D = q.shape
        delta = (dout.float() * out.float()).sum(-1, keepdim=True)
        dq, dk, dv = torch.empty_like(q), torch.zeros(H, L, D), torch.zeros(H, L, D)
        for s in range(0, L, ctx.block):
            e = min(L, s + ctx.block)
            p, _ = _Blockwise._probs(q, k, s, e, D ** -0.5, lse[:, s:e])
            do = dout[:, s:e].contiguous()
            dv[:, :e] += torch.bmm(p.to(do.dtype).transpose(1, 2), do).float()
            ds = torch.bmm(do, v[:, :e].transpose(1, 2)).float().sub_(delta[:, s:e]).mul_(p).mul_(D ** -0.5).to(q.dtype)
            dq[:, s:e] = torch.bmm(ds, k[:, :e])
            dk[:, :e] += torch.bmm(ds.transpose(1, 2), q[:, s:e]).float()
        return dq, dk.to(k.dtype), dv.to(v.dtype), None


def blockwise(q, k, v, block: int = 128):
    return _Blockwise.apply(q[0], k[0], v[0], block)[None]


def time_attention(fn, L: int, dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """Best forward and backward seconds of ``fn`` on one random ``[1, H, L, D]`` row."""
    q, k, v = (torch.randn(1, HEADS, L, HEAD_DIM, dtype=dtype, requires_grad=True) for _ in range(3))
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(q, k, v)
        t1 = time.perf_counter()
        out.float().sum().backward()
        t2 = time.perf_counter()
        best = (min(best[0], t1 - t0), min(best[1], t2 - t1))
    return best


def time_gemm(L: int, dtype: torch.dtype, repeats: int) -> float:
    x, w = torch.randn(L, HIDDEN, dtype=dtype), torch.randn(HIDDEN, INTERMEDIATE, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x @ w
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="512,2048,4096")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block", type=int, default=128, help="query positions per block of blockwise")
    args = ap.parse_args(argv)
    print(f"CPU: {cpu_kind()}; torch {torch.__version__} (CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}); threads {torch.get_num_threads()}", flush=True)
    for L in (int(x) for x in args.lengths.split(",")):
        flops = 4 * HEADS * HEAD_DIM * L * L / 2
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            g = time_gemm(L, dtype, args.repeats)
            print(f"L={L} {name}: GEMM [L,576]x[576,1536] {g * 1e3:.1f} ms = {2 * L * HIDDEN * INTERMEDIATE / g / 1e9:.0f} GFLOP/s",
                  flush=True)
            ways = (("flash", flash), ("math", math_backend), ("matmul", matmul),
                    ("blockwise", lambda q, k, v: blockwise(q, k, v, args.block)))
            for label, fn in ways:
                f, b = time_attention(fn, L, dtype, args.repeats)
                print(f"L={L} {name} {label:>9}: forward {f * 1e3:.1f} ms ({flops / f / 1e9:.0f} causal GFLOP/s), "
                      f"backward {b * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
