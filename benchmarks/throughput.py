"""CPU throughput of the update, the teacher scoring and generation: three code paths side by
side in one run on the same rows, with the real SmolLM2-135M (the ``cpu`` recipe's model).

The paths, each on the same rows and from the same weights:

* ``former``: the code before the throughput work of issue 12: padded rows with an attention
  mask, the LM head over the last ``R+1`` positions of every row (``logits_to_keep``),
  consecutive scoring micro-batches of ``actor.ppo_micro_batch_size``, the per-parameter AdamW
  loop, gradient checkpointing on (the former default); generation = padded ``generate`` with
  transformers' ``sdpa`` attention in every decode step.
* ``padded``: the current code with ``model.use_remove_padding=false`` and
  ``rollout.unpadded_prefill=false``: response-only LM head, length-grouped scoring
  micro-batches, fused AdamW, ``model.gradient_checkpointing`` as configured (``auto``), serl's
  decode attention; padded rows and padded ``generate`` (the code before the packing work).
* ``current``: the defaults: packed rows (:func:`serl.train.batch.pack_rows`) in the update and
  the scoring, and the hf engine's unpadded, deduplicated prefill into a preallocated KV cache
  (:mod:`serl.rollout.prefill`).

Figures:

* **update** (GRPO loss with an entropy bonus, one optimizer step over ``--rows`` step rows in
  micro-batches of ``actor.ppo_micro_batch_size`` consecutive rows): (prompt + response) tokens
  per second, and MFU against this machine's GEMM peak in the training dtype, measured in the
  same run (model FLOPs: 6·N_body·T + attention + the LM head on response tokens; no
  recomputation counted);
* **teacher scoring** (inference mode, the teacher in the inference dtype, ``--score-rows``
  rows under their own prompts): rows per second;
* **generation** (the step prompts of the run's rollout, grouped by step as the rollout sent
  them, ``--gen-batch`` per ``generate`` call, sampled at T=1 with a fixed seed,
  ``data.max_response_length`` new tokens at most): sampled tokens per second.

Each figure is given per wall second and per CPU second of this process (``time.process_time``);
on an idle machine use the wall figures (2 threads); on a shared one run with one thread
(``trainer.num_threads=1``, ``OMP_NUM_THREADS=1``), where per CPU second equals wall throughput
on one dedicated core. ``--emulate-avx2`` caps torch, oneDNN and MKL at AVX2
(``benchmarks/cpu_kind.py``): float32, as on the CPU kind without native bf16; a proxy,
labelled as such. The CPU model, torch's CPU capability, the thread count and both dtypes are
printed and returned.

The rows come from a ``last_rollout.jsonl`` of a real ``serl train`` run (``--rollout``), else
synthetic rows with ALFWorld-like lengths (prompt 400–1100 tokens, response 30–55).

    PYTHONPATH=$PWD python benchmarks/throughput.py --rollout RUN/last_rollout.jsonl --rows 40 --score-rows 40
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_kind import emulate_avx2  # noqa: E402

EMULATED = emulate_avx2(sys.argv)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from limits import gemm_peak  # noqa: E402  (benchmarks/limits.py)

import serl.train.scoring as scoring_mod  # noqa: E402
import serl.train.update as update_mod  # noqa: E402
from serl.configure import load_config  # noqa: E402
from serl.rollout.engine import HFEngine, SamplingParams  # noqa: E402
from serl.train.batch import UpdateBatch, response_logprobs  # noqa: E402
from serl.train.grad_ckpt import set_checkpointing  # noqa: E402
from serl.train.trainer import Trainer  # noqa: E402
from serl.trajectory import Step  # noqa: E402
from serl.utils import cpu_model  # noqa: E402


def load_rows(path: str | None, n: int, seed: int, shuffle: bool = True) -> list[Step]:
    """``n`` step rows: from a ``last_rollout.jsonl`` (in file order, trajectory by trajectory as
    the update sees them, or shuffled), or synthetic."""
    rng = random.Random(seed)
    if path:
        steps = []
        with open(path) as f:
            for line in f:
                for s in json.loads(line)["steps"]:
                    steps.append(Step(step_id=s["step_id"], observation="", prompt="", prompt_ids=s["prompt_ids"],
                                      response_text="", response_ids=s["response_ids"], action="", action_valid=True,
                                      reward=0.0, done=False, won=False, action_mask=s["action_mask"]))
        if shuffle:
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
def code_path(tr: Trainer, label: str):
    """Switch ``tr`` to the code path ``label`` (``former``, ``padded`` or ``current``; see the
    module docstring) for the block; restores the defaults after it."""
    a, m, r = tr.cfg.actor, tr.cfg.model, tr.cfg.rollout
    saved = (update_mod.response_logprobs, scoring_mod.score_logprobs, a.log_prob_micro_batch_size_per_gpu,
             tr.optimizer, m.use_remove_padding, r.unpadded_prefill, tr.grad_ckpt.mode)
    if label in ("former", "padded"):
        m.use_remove_padding, r.unpadded_prefill = False, False
    if label == "former":
        update_mod.response_logprobs = functools.partial(response_logprobs, response_only=False)
        scoring_mod.score_logprobs = functools.partial(saved[1], bucket=False)
        a.log_prob_micro_batch_size_per_gpu = a.ppo_micro_batch_size
        tr.optimizer = torch.optim.AdamW(tr.policy.parameters(), lr=a.lr, weight_decay=a.weight_decay, foreach=False)
        tr.grad_ckpt.mode = True
        set_checkpointing(tr.grad_ckpt.modules, True)
    try:
        yield
    finally:
        (update_mod.response_logprobs, scoring_mod.score_logprobs, a.log_prob_micro_batch_size_per_gpu,
         tr.optimizer, m.use_remove_padding, r.unpadded_prefill, tr.grad_ckpt.mode) = saved


PATHS = ("former", "padded", "current")


def time_update(tr: Trainer, rows: list[Step], state) -> Clock:
    tr.policy.load_state_dict(state)
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(len(rows), generator=g)
    batch = UpdateBatch.from_steps(rows, adv, torch.ones(len(rows)))
    with Clock() as c:
        tr.update.run(batch, step=1)
    return c


def time_scoring(tr: Trainer, rows: list[Step]) -> Clock:
    batch = UpdateBatch.from_steps(rows, torch.zeros(len(rows)), torch.ones(len(rows)))
    with Clock() as c:
        tr.scorer.score(tr.teacher.model, batch)
    return c


def sdpa_copy(model):
    """A copy of ``model`` with transformers' plain ``sdpa`` attention (the former decode path)."""
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    return plain


def time_generation(engine: HFEngine, calls: list[list[list[int]]], max_new_tokens: int) -> tuple[Clock, int]:
    """Clock of the ``generate`` calls (each a list of prompts), sampled at T=1 with seeds 0, 1, ...;
    returns it and the sampled tokens."""
    engine.generate(calls[0][:1], SamplingParams(max_new_tokens=2, do_sample=False))  # warm-up
    n = 0
    with Clock() as c:
        for k, prompts in enumerate(calls):
            out = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=k))
            n += sum(len(x) for x in out)
    return c, n


def generation_calls(rows: list[Step], batch: int) -> list[list[list[int]]]:
    """The prompts of ``rows`` grouped by step id (the rollout's calls), in calls of ``batch``."""
    by_step: dict[int, list[list[int]]] = {}
    for s in rows:
        by_step.setdefault(s.step_id, []).append(s.prompt_ids)
    return [ps[k : k + batch] for _, ps in sorted(by_step.items()) for k in range(0, len(ps), batch)]


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollout", help="a last_rollout.jsonl of a serl train run (default: synthetic rows)")
    ap.add_argument("--rows", type=int, default=8, help="step rows of the update (the first ones, in file order)")
    ap.add_argument("--score-rows", type=int, default=16, help="rows of the teacher scoring pass")
    ap.add_argument("--gen-rows", type=int, default=40, help="step rows whose prompts are generated from")
    ap.add_argument("--gen-batch", type=int, default=8, help="prompts per generate call")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {', '.join(PATHS)}")
    ap.add_argument("--skip", default="", help="comma-separated phases not to time: update, scoring, generation")
    ap.add_argument("--emulate-avx2", action="store_true", help="cap the CPU at AVX2 (see benchmarks/cpu_kind.py)")
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
    paths = [p for p in args.paths.split(",") if p]
    if not paths or any(p not in PATHS for p in paths):
        raise SystemExit(f"--paths: choose from {', '.join(PATHS)}, got {args.paths!r}")
    skip = {p for p in args.skip.split(",") if p}
    ordered = load_rows(args.rollout, max(args.rows, args.score_rows, args.gen_rows), seed=0, shuffle=False)
    upd, score_rows = ordered[: args.rows], ordered[: args.score_rows]
    calls = generation_calls(ordered[: args.gen_rows], args.gen_batch)
    train_dtype = tr.models.autocast_dtype or torch.float32
    res = {"cpu": cpu_model(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "emulated_avx2": EMULATED, "threads": torch.get_num_threads(), "train_dtype": str(train_dtype),
           "infer_dtype": str(tr.models.infer_dtype), "gradient_checkpointing": tr.cfg.model.gradient_checkpointing,
           "rows_source": args.rollout or "synthetic", "update_rows": len(upd),
           "update_tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in upd),
           "score_rows": len(score_rows), "generate_calls": len(calls)}
    res["gemm_peak_flops"] = gemm_peak(train_dtype)
    print(f"CPU {res['cpu']} ({res['torch_cpu_capability']}{', AVX2 emulated' if EMULATED else ''}), "
          f"{res['threads']} threads; train dtype {train_dtype} (fp32 master + autocast), inference dtype "
          f"{tr.models.infer_dtype}; GEMM peak {res['gemm_peak_flops'] / 1e9:.1f} GFLOP/s in {train_dtype}",
          file=sys.stderr)
    flops = update_flops(tr.policy, upd)
    state = copy.deepcopy(tr.policy.state_dict())
    time_scoring(tr, score_rows[:2])  # warm-up (oneDNN kernels)
    former_model = sdpa_copy(tr.rollout_model) if "former" in paths and "generation" not in skip else None
    for label in paths:
        with code_path(tr, label):
            if "update" not in skip:
                cu = time_update(tr, upd, state)
                res.update({f"{label}_update_wall_s": cu.wall, f"{label}_update_cpu_s": cu.cpu,
                            f"{label}_update_tokens_per_s": res["update_tokens"] / cu.wall,
                            f"{label}_update_tokens_per_cpu_s": res["update_tokens"] / cu.cpu,
                            f"{label}_update_mfu": flops / cu.wall / res["gemm_peak_flops"]})
                print(f"{label}: update {res[f'{label}_update_tokens_per_s']:.1f} tok/s wall "
                      f"({res[f'{label}_update_tokens_per_cpu_s']:.1f} tok/CPU-s; MFU "
                      f"{res[f'{label}_update_mfu']:.3f})", file=sys.stderr)
            if "scoring" not in skip:
                cs = time_scoring(tr, score_rows)
                res.update({f"{label}_teacher_wall_s": cs.wall, f"{label}_teacher_cpu_s": cs.cpu,
                            f"{label}_teacher_rows_per_s": len(score_rows) / cs.wall,
                            f"{label}_teacher_rows_per_cpu_s": len(score_rows) / cs.cpu})
                print(f"{label}: teacher scoring {res[f'{label}_teacher_rows_per_s']:.2f} rows/s wall "
                      f"({res[f'{label}_teacher_rows_per_cpu_s']:.2f} rows/CPU-s)", file=sys.stderr)
            if "generation" not in skip:
                model = former_model if label == "former" else tr.rollout_model
                eng = HFEngine(model, tr.tokenizer, args.gen_batch, unpadded_prefill=tr.cfg.rollout.unpadded_prefill)
                cg, n = time_generation(eng, calls, tr.cfg.data.max_response_length)
                res.update({f"{label}_generation_tokens": n, f"{label}_generation_wall_s": cg.wall,
                            f"{label}_generation_cpu_s": cg.cpu, f"{label}_generation_tokens_per_s": n / cg.wall,
                            f"{label}_generation_tokens_per_cpu_s": n / cg.cpu})
                print(f"{label}: generation {n} sampled tokens, {n / cg.wall:.1f} tok/s wall "
                      f"({n / cg.cpu:.1f} tok/CPU-s)", file=sys.stderr)
    for fig in ("update_tokens_per_s", "teacher_rows_per_s", "generation_tokens_per_s"):
        for a, b in (("current", "former"), ("current", "padded")):
            if f"{a}_{fig}" in res and f"{b}_{fig}" in res:
                res[f"{fig}_{a}_over_{b}"] = res[f"{a}_{fig}"] / res[f"{b}_{fig}"]
    print(", ".join(f"{k} {v:.2f}" for k, v in res.items() if "_over_" in k), file=sys.stderr)
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
