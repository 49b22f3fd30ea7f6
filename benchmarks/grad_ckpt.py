"""One update of the real SmolLM2-135M with activation checkpointing on, off and auto, on the same rows.

Each mode runs in its own child process (so its peak RSS is its own): load the ``cpu`` recipe's
model, one short warm-up update, then one timed update (GRPO loss, one optimizer step, every row
in one micro-batch) over ``--rows`` step rows of a real ``last_rollout.jsonl`` (``--rollout``;
else synthetic rows of ~750 tokens). Reported per mode: CPU seconds of the process for the update
(``time.process_time``), (prompt + response) tokens per CPU-second, the peak RSS of the child,
the share of micro-batches checkpointed and, under ``auto``, the activation estimate and budget.
Run it with one thread on a shared machine (per CPU-second figures then hold up under contention):

    nice -n 19 env OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/grad_ckpt.py \\
        --rollout RUN/last_rollout.jsonl --rows 2 trainer.num_threads=1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODES = ("on", "off", "auto")


def child(args) -> dict:
    import torch

    from serl.configure import load_config
    from serl.models.memory import model_activation_bytes
    from serl.train.batch import UpdateBatch
    from serl.train.trainer import Trainer
    from throughput import cpu_model, load_rows

    value = {"on": "true", "off": "false", "auto": "auto"}[args.child]
    n = args.rows
    cfg = load_config("cpu", args.overrides + [
        "trainer.logger=[]", "trainer.progress=false", f"trainer.output_dir={tempfile.mkdtemp(prefix='serl-gc-')}",
        "trainer.run_name=bench", "algorithm.serl.enable=false", "actor.use_kl_loss=false",
        f"actor.ppo_mini_batch_size={n}", f"actor.ppo_micro_batch_size={n}", f"actor.ppo_max_token_len_per_gpu={10**6}",
        f"model.gradient_checkpointing={value}"])
    tr = Trainer(cfg)
    try:
        rows = load_rows(args.rollout, n + 1, seed=0)
        warm, rows = rows[:1], rows[1:]
        warm[0].prompt_ids = warm[0].prompt_ids[:64]
        tr.update.run(UpdateBatch.from_steps(warm, torch.ones(1), torch.ones(1)), step=1)  # oneDNN warm-up
        batch = UpdateBatch.from_steps(rows, torch.randn(n, generator=torch.Generator().manual_seed(0)), torch.ones(n))
        b = batch.collate(tr.tokenizer.pad_token_id)
        est = model_activation_bytes(tr.policy.config, *b.input_ids.shape, int(b.response_mask.sum()),
                                     2 if tr.models.autocast_dtype else 4)
        w, c = time.perf_counter(), time.process_time()
        m = tr.update.run(batch, step=1)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in rows)
        return {"mode": args.child, "cpu": cpu_model(), "train_dtype": str(tr.models.autocast_dtype or torch.float32),
                "threads": torch.get_num_threads(), "rows": n, "padded_shape": list(b.input_ids.shape),
                "tokens": tokens, "update_cpu_s": cpu, "update_wall_s": wall, "tokens_per_cpu_s": tokens / cpu,
                "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                "grad_ckpt_fraction": m["perf/grad_ckpt_fraction"], "estimate_gb": est / 2**30,
                "budget_gb": tr.grad_ckpt.budget / 2**30 if value == "auto" else None}
    finally:
        tr.close()


def main(argv: list[str]) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollout", help="a last_rollout.jsonl of a serl train run (default: synthetic rows)")
    ap.add_argument("--rows", type=int, default=2, help="step rows of the update (one micro-batch)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of on,off,auto")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return []
    out = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--rows", str(args.rows)]
        cmd += (["--rollout", args.rollout] if args.rollout else []) + args.overrides
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"mode {mode} failed (exit {proc.returncode})")
        r = json.loads(lines[-1][len("RESULT "):])
        out.append(r)
        print(f"{mode:4s}: {r['update_cpu_s']:.1f} CPU-s, {r['tokens_per_cpu_s']:.1f} tok/CPU-s (wall "
              f"{r['update_wall_s']:.0f} s), peak RSS {r['peak_rss_gb']:.2f} GB, checkpointed "
              f"{r['grad_ckpt_fraction']:.0%}, estimate {r['estimate_gb']:.2f} GB"
              + (f", budget {r['budget_gb']:.2f} GB" if r["budget_gb"] is not None else ""), flush=True)
    if out:
        print(f"CPU {out[0]['cpu']}, train dtype {out[0]['train_dtype']}, {out[0]['threads']} thread(s), "
              f"{out[0]['rows']} rows padded to {out[0]['padded_shape']}, {out[0]['tokens']} tokens")
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
