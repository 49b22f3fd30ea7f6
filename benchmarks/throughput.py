"""CPU throughput of the update, the teacher scoring and generation: the former code path and
the current one, side by side in one run on the same batch, with the real SmolLM2-135M.

* **update** (GRPO loss, one optimizer step over ``--rows`` step rows): former = LM head over the
  last ``R+1`` positions of every row (``logits_to_keep``), consecutive micro-batches of
  ``actor.ppo_micro_batch_size``, the per-parameter AdamW loop; current = LM head on response
  tokens only, micro-batches grouped by length (``actor.use_dynamic_bsz``), fused AdamW.
  Reported as (prompt + response) tokens/s and as MFU against this machine's measured GEMM peak
  in the training dtype (model FLOPs: 6·N_body·T + attention + the LM head on response tokens).
* **teacher scoring** (inference mode, the teacher in the inference dtype): former = consecutive
  micro-batches of ``actor.ppo_micro_batch_size`` and the ``logits_to_keep`` head; current =
  micro-batches of ``actor.log_prob_micro_batch_size_per_gpu`` grouped by length, response-only
  head. Rows/s. The rows are scored under their own prompts (the teacher's privileged prompts
  are longer; the comparison is the same for both paths).
* **generation** (``rollout.micro_batch_size`` = ``--gen-batch`` prompts, sampled, T=1): HF
  ``generate`` with the dynamic KV cache; former = transformers' ``sdpa`` attention in every
  step, current = serl's decode attention (:mod:`serl.models.attention`: one-token queries as
  grouped matmuls); ``--compile`` adds a static cache with a ``torch.compile``\\ d decode step.
  Sampled tokens/s, and each run split into its prefill (a ``max_new_tokens=1`` call) and the
  CPU milliseconds per decode step.

Every figure is given per wall second and per CPU second of this process (``time.process_time``).
On a shared machine run it with one thread (``trainer.num_threads=1``, ``OMP_NUM_THREADS=1``):
per CPU second then equals wall throughput on one dedicated core, and holds up under contention.

The rows come from a ``last_rollout.jsonl`` of a real ``serl train`` run (``--rollout``), else
synthetic rows with ALFWorld-like lengths (prompt 400–1100 tokens, response 30–55).

    OMP_NUM_THREADS=1 python benchmarks/throughput.py --rollout RUN/last_rollout.jsonl trainer.num_threads=1
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import serl.train.trainer as trainer_mod  # noqa: E402
from serl.config import load_config  # noqa: E402
from serl.rollout.engine import HFEngine, SamplingParams  # noqa: E402
from serl.train.batch import UpdateBatch, response_logprobs  # noqa: E402
from serl.train.trainer import Trainer  # noqa: E402
from serl.trajectory import Step  # noqa: E402


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def load_rows(path: str | None, n: int, seed: int) -> list[Step]:
    """``n`` step rows: from a ``last_rollout.jsonl`` (spread over its trajectories), or synthetic."""
    rng = random.Random(seed)
    if path:
        steps = []
        with open(path) as f:
            for line in f:
                for s in json.loads(line)["steps"]:
                    steps.append(Step(step_id=s["step_id"], observation="", prompt="", prompt_ids=s["prompt_ids"],
                                      response_text="", response_ids=s["response_ids"], action="", action_valid=True,
                                      reward=0.0, done=False, won=False, action_mask=s["action_mask"]))
        rng.shuffle(steps)
        return steps[:n]
    out = []
    for _ in range(n):
        p = [rng.randrange(3, 49000) for _ in range(rng.randint(400, 1100))]
        r = [rng.randrange(3, 49000) for _ in range(rng.randint(30, 55))]
        out.append(Step(step_id=0, observation="", prompt="", prompt_ids=p, response_text="", response_ids=r,
                        action="", action_valid=True, reward=0.0, done=False, won=False, action_mask=[1] * len(r)))
    return out


class Clock:
    """Wall and process-CPU seconds of a block: ``with Clock() as c: ...; c.wall, c.cpu``."""

    def __enter__(self):
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self._w, time.process_time() - self._c
        return False


def gemm_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP per CPU second of an ``n×n @ n×n`` matmul in ``dtype`` (per thread-second: with
    one thread, the peak of one core)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        with Clock() as c:
            torch.matmul(a, b)
        best = min(best, c.cpu)
    return 2 * n ** 3 / best


def update_flops(model, rows: list[Step]) -> float:
    """Model FLOPs of one forward+backward over ``rows`` (no recomputation counted)."""
    cfg = model.config
    emb = model.get_input_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - emb  # tied head: counted on its own below
    flops = 0.0
    for s in rows:
        t, r = len(s.prompt_ids) + len(s.response_ids), len(s.response_ids)
        flops += 6 * body * t + 6 * cfg.num_hidden_layers * t * t * cfg.hidden_size + 6 * emb * r
    return flops


@contextlib.contextmanager
def former_path(tr: Trainer):
    """The code path before the throughput work: ``logits_to_keep`` head, consecutive
    micro-batches of ``ppo_micro_batch_size`` for the update and the scoring, per-parameter AdamW."""
    a = tr.cfg.actor
    m = tr.cfg.model
    saved = (trainer_mod.response_logprobs, trainer_mod.score_logprobs, a.log_prob_micro_batch_size_per_gpu,
             a.use_dynamic_bsz, tr.optimizer, m.use_remove_padding)
    trainer_mod.response_logprobs = functools.partial(response_logprobs, response_only=False)
    trainer_mod.score_logprobs = functools.partial(saved[1], bucket=False)
    a.log_prob_micro_batch_size_per_gpu, a.use_dynamic_bsz, m.use_remove_padding = a.ppo_micro_batch_size, False, False
    tr.optimizer = torch.optim.AdamW(tr.policy.parameters(), lr=a.lr, weight_decay=a.weight_decay, foreach=False)
    try:
        yield
    finally:
        (trainer_mod.response_logprobs, trainer_mod.score_logprobs, a.log_prob_micro_batch_size_per_gpu,
         a.use_dynamic_bsz, tr.optimizer, m.use_remove_padding) = saved


def time_update(tr: Trainer, rows: list[Step], state) -> Clock:
    tr.policy.load_state_dict(state)
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(len(rows), generator=g)
    batch = UpdateBatch.from_steps(rows, adv, torch.ones(len(rows)))
    with Clock() as c:
        tr._update(batch, step=1)
    return c


def time_scoring(tr: Trainer, rows: list[Step]) -> Clock:
    batch = UpdateBatch.from_steps(rows, torch.zeros(len(rows)), torch.ones(len(rows)))
    with Clock() as c:
        tr._score(tr.teacher.model, batch)
    return c


def time_generation(engine: HFEngine, prompts: list[list[int]], new_tokens: int) -> tuple[Clock, int, int]:
    """Clock of one sampled ``generate``, its sampled tokens and its longest response (= steps)."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, do_sample=True, seed=0)
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=2, do_sample=False))  # warm-up
    with Clock() as c:
        out = engine.generate(prompts, params)
    return c, sum(len(r) for r in out), max(len(r) for r in out)


def sdpa_copy(model):
    """A copy of ``model`` with transformers' plain ``sdpa`` attention (the former decode path)."""
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    return plain


def run_generation(tr: Trainer, args, prompts: list[list[int]]) -> dict:
    """Former (``sdpa`` attention) vs current (serl's decode attention) HF generation on the same
    prompts, each split into the prefill (``max_new_tokens=1``) and the decode steps."""
    res: dict = {}
    variants = [("former", sdpa_copy(tr.rollout_model), {}), ("current", tr.rollout_model, {})]
    if args.compile:
        variants.append(("static_compiled", tr.rollout_model, {"cache_implementation": "static",
                                                               "compile_decode": True}))
    for label, model, kw in variants:
        eng = HFEngine(model, tr.tokenizer, args.gen_batch, **kw)
        c1, _, _ = time_generation(eng, prompts, 1)
        c, n, longest = time_generation(eng, prompts, args.gen_tokens)
        steps = max(1, longest - 1)  # decode steps after the prefill's first token
        res.update({f"generation_{label}_tokens": n, f"generation_{label}_wall_s": c.wall,
                    f"generation_{label}_cpu_s": c.cpu, f"generation_{label}_tokens_per_cpu_s": n / c.cpu,
                    f"generation_{label}_prefill_cpu_s": c1.cpu,
                    f"generation_{label}_decode_ms_per_step": 1000 * (c.cpu - c1.cpu) / steps})
        print(f"generation {label}: {n} tokens, {n / c.cpu:.2f} tok/CPU-s (wall {c.wall:.0f} s); prefill "
              f"{c1.cpu:.1f} CPU-s, decode {res[f'generation_{label}_decode_ms_per_step']:.0f} ms/step",
              file=sys.stderr)
    return res


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollout", help="a last_rollout.jsonl of a serl train run (default: synthetic rows)")
    ap.add_argument("--rows", type=int, default=8, help="step rows of the update")
    ap.add_argument("--score-rows", type=int, default=16, help="rows of the teacher scoring pass")
    ap.add_argument("--gen-batch", type=int, default=8, help="prompts per generate call")
    ap.add_argument("--gen-tokens", type=int, default=32, help="max new tokens per prompt")
    ap.add_argument("--compile", action="store_true", help="also time a static cache + torch.compile decode")
    ap.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = ap.parse_args(argv)
    cfg = load_config("cpu", args.overrides + ["trainer.logger=[]", "trainer.progress=false",
                                               f"trainer.output_dir={tempfile.mkdtemp(prefix='serl-throughput-')}", "trainer.run_name=bench",
                                               "algorithm.serl.enable=true"])
    tr = Trainer(cfg)
    try:
        res = run(tr, args)
    finally:
        tr.close()
    print(json.dumps(res))
    return res


def run(tr: Trainer, args) -> dict:
    rows = load_rows(args.rollout, max(args.rows, args.score_rows, args.gen_batch), seed=0)
    upd, score_rows = rows[: args.rows], rows[: args.score_rows]
    train_dtype = tr.autocast_dtype or torch.float32
    res = {"cpu": cpu_model(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "train_dtype": str(train_dtype), "infer_dtype": str(tr.infer_dtype),
           "gradient_checkpointing": tr.cfg.model.gradient_checkpointing, "rows_source": args.rollout or "synthetic",
           "update_rows": len(upd), "update_tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in upd)}
    res["gemm_peak_flops"] = gemm_peak(train_dtype)
    print(f"CPU {res['cpu']} ({res['torch_cpu_capability']}), {res['threads']} threads; train dtype "
          f"{train_dtype} (fp32 master + autocast), inference dtype {tr.infer_dtype}; GEMM peak "
          f"{res['gemm_peak_flops'] / 1e9:.1f} GFLOP per CPU-s in {train_dtype}", file=sys.stderr)
    flops = update_flops(tr.policy, upd)
    state = copy.deepcopy(tr.policy.state_dict())
    time_scoring(tr, score_rows[:2])  # warm-up (oneDNN kernels)
    for label, ctx in (("former", former_path(tr)), ("current", contextlib.nullcontext())):
        with ctx:
            if label == "current":
                tr.cfg.actor.use_dynamic_bsz = True
            cu = time_update(tr, upd, state)
            cs = time_scoring(tr, score_rows)
        res.update({f"{label}_update_wall_s": cu.wall, f"{label}_update_cpu_s": cu.cpu,
                    f"{label}_update_tokens_per_cpu_s": res["update_tokens"] / cu.cpu,
                    f"{label}_update_tokens_per_wall_s": res["update_tokens"] / cu.wall,
                    f"{label}_update_mfu": flops / cu.cpu / res["gemm_peak_flops"],
                    f"{label}_teacher_wall_s": cs.wall, f"{label}_teacher_cpu_s": cs.cpu,
                    f"{label}_teacher_rows_per_cpu_s": len(score_rows) / cs.cpu})
        print(f"{label}: update {res[f'{label}_update_tokens_per_cpu_s']:.1f} tok/CPU-s (MFU "
              f"{res[f'{label}_update_mfu']:.3f}; wall {cu.wall:.0f} s), teacher scoring "
              f"{res[f'{label}_teacher_rows_per_cpu_s']:.2f} rows/CPU-s (wall {cs.wall:.0f} s)", file=sys.stderr)
    prompts = [s.prompt_ids for s in rows[: args.gen_batch]]
    res.update(run_generation(tr, args, prompts))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
