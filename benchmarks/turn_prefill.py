"""The ``hf`` engine's turn prefill, one forward per row against batched (``rollout.prefill_batch_tokens``).

A multi-turn rollout calls the engine once per turn with every conversation so far; the turn
cache (``serl.rollout.turn_cache``) holds each row's keys and values from the turn before, so a
turn prefills only what it appended. This script plays the same synthetic conversations with
``prefill_batch_tokens=0`` (one prefill forward per row) and with ``--budget`` (the new tokens of
all rows in a few padded forwards over their cached prefixes), interleaved in one process, and
prints per setting the seconds in the prefill (``serl.rollout.prefill.prefilled_cache``), in the
whole ``generate`` calls, and the greedy replies' agreement with the first setting's.

The model is SmolLM2-135M's shape with random weights (``--shape``; no download) or a model folder
(``--model``); every turn appends ``--append`` random tokens to each row's reply, as an env's
observation would, and the replies run to ``--new-tokens`` (a random model rarely writes its eos).

    python benchmarks/turn_prefill.py --rows 70 --turns 20                       # a GPU panel's shape
    python benchmarks/turn_prefill.py --rows 8 --turns 8 --device cpu             # serl train's default
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_iteration import SHAPES, build_random_model  # noqa: E402  (a sibling script)

TOKENIZER = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smollm2_tokenizer"


def play(engine, args, seed: int) -> tuple[list[list[list[int]]], float, float]:
    """``args.turns`` generate calls on ``args.rows`` conversations; returns the replies per turn,
    the seconds in the prefill and in the generate calls (device synchronised)."""
    import serl.rollout.prefill as prefill_mod
    from serl.rollout.engine import SamplingParams

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(100, 40000, (args.first + r,), generator=g).tolist() for r in range(args.rows)]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    spent = {"prefill": 0.0}
    original = prefill_mod.prefilled_cache

    def timed(*a, **kw):
        sync()
        t0 = time.perf_counter()
        out = original(*a, **kw)
        sync()
        spent["prefill"] += time.perf_counter() - t0
        return out

    prefill_mod.prefilled_cache = timed
    replies, total = [], 0.0
    try:
        for _ in range(args.turns):
            sync()
            t0 = time.perf_counter()
            out = engine.generate(prompts, SamplingParams(max_new_tokens=args.new_tokens, do_sample=False))
            sync()
            total += time.perf_counter() - t0
            replies.append(out)
            prompts = [p + r + torch.randint(100, 40000, (args.append,), generator=g).tolist()
                       for p, r in zip(prompts, out)]
    finally:
        prefill_mod.prefilled_cache = original
    return replies, spent["prefill"], total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (default: --shape with random weights)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", type=int, default=70, help="conversations (one generate call holds them all)")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--first", type=int, default=500, help="tokens of the first prompt (ALFWorld's first turn: ~500)")
    ap.add_argument("--append", type=int, default=120, help="tokens appended after each reply (an observation)")
    ap.add_argument("--new-tokens", type=int, default=10, help="tokens per reply")
    ap.add_argument("--budget", type=int, default=262144, help="prefill_batch_tokens of the batched setting")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of both settings, interleaved")
    ap.add_argument("--out", help="also write the results here as JSON")
    args = ap.parse_args()

    from serl.models.loading import load_causal_lm, load_tokenizer
    from serl.rollout.engine import HFEngine

    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            from serl.models.loading import hf_progress_bars

            with hf_progress_bars(False):
                build_random_model(args.shape, TOKENIZER, Path(tmp) / "model")
        path = args.model or str(Path(tmp) / "model")
        model = load_causal_lm(path, getattr(torch, args.dtype), args.device).eval()
        tok = load_tokenizer(path)
    from serl.utils import cpu_model

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_model()
    print(f"{where}, {args.dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"{args.rows} rows x {args.turns} turns ({args.first} + {args.append}/turn tokens, {args.new_tokens} new)")
    # the batched setting first, and each round printed as it ends: a run stopped early still tells
    settings = [args.budget, 0]
    result = {"device": where, "dtype": args.dtype, "rows": args.rows, "turns": args.turns,
              "settings": {s: {"prefill_s": [], "generate_s": []} for s in settings}}
    first: dict[int, list] = {}
    play(HFEngine(model, tok, args.rows, prefill_batch_tokens=args.budget),
         argparse.Namespace(**{**vars(args), "turns": 2}), seed=1)  # warm-up
    print(f"{'prefill_batch_tokens':>22} | round | prefill s | generate s | s / turn")
    for k in range(args.repeats):
        for s in settings:
            replies, pre, total = play(HFEngine(model, tok, args.rows, prefill_batch_tokens=s), args, seed=0)
            result["settings"][s]["prefill_s"].append(pre)
            result["settings"][s]["generate_s"].append(total)
            first.setdefault(s, replies)
            print(f"{s:>22} | {k + 1:>5} | {pre:9.2f} | {total:10.2f} | {total / args.turns:.3f}", flush=True)
    same = sum(a == b for ta, tb in zip(first[0], first[args.budget]) for a, b in zip(ta, tb))
    n = args.rows * args.turns
    print(f"replies equal between the settings (greedy; ties break by rounding): {same} of {n}")
    result["replies_equal"] = [same, n]
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
