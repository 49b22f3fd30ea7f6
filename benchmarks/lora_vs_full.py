"""Memory and time per training iteration: LoRA (``model.lora.r > 0``) vs full fine-tuning.

Each mode runs in its own child process (so peak RSS is that mode's alone): build a
:class:`~serl.train.trainer.Trainer` (SERL on, the KL reference on, so every frozen model
exists), run ``--iterations`` training iterations, and report

* ``peak_rss_mib``: the process's peak resident memory (``getrusage`` ``ru_maxrss``), model
  loading included;
* ``model_mib``: bytes of every distinct parameter/buffer tensor of the policy, its rollout copy,
  the teacher and the reference (shared tensors counted once: with LoRA they share one base);
* ``trainable_mib``, ``grad_mib``, ``optimizer_mib``: trainable parameters, their gradients and the
  AdamW state after the last iteration;
* ``iteration_s`` (mean over the iterations) and its ``update_s`` part.

    python benchmarks/lora_vs_full.py                       # tiny random model (2 layers, hidden 64)
    python benchmarks/lora_vs_full.py --real data.train_batch_size=1 env.rollout.n=2 env.max_steps=2
                                                            # the recipe's model (SmolLM2-135M)

Options: ``--real`` (the recipe's model instead of the tiny one), ``--lora-r N`` (default 8),
``--iterations N`` (default 1), ``recipe=NAME`` and any ``key=value`` overrides (both modes).
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
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = ROOT / "tests" / "fixtures" / "smollm2_tokenizer"
MIB = 1024 * 1024


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _models(tr) -> list:
    out = [tr.policy, tr.rollout_model]
    for holder in (tr.teacher, tr.ref):
        if holder is not None:
            out.append(getattr(holder.model, "peft_model", holder.model))
    return out


def measure(recipe: str, overrides: list[str], iterations: int) -> dict:
    """One mode in this process: build the trainer, run ``iterations`` iterations, measure."""
    from serl.configure import load_config
    from serl.train.trainer import Trainer

    out_dir = tempfile.mkdtemp(prefix="serl-lora-bench-")
    cfg = load_config(recipe, overrides + ["trainer.logger=[]", "trainer.progress=false",
                                           f"trainer.output_dir={out_dir}", "trainer.run_name=bench",
                                           f"trainer.total_training_steps={iterations}",
                                           "algorithm.serl.enable=true", "actor.use_kl_loss=true"])
    t0 = time.perf_counter()
    tr = Trainer(cfg)
    load_s = time.perf_counter() - t0
    times, updates = [], []
    try:
        for _ in range(iterations):
            t = time.perf_counter()
            m = tr.train_iteration()
            times.append(time.perf_counter() - t)
            updates.append(m["timing/update_s"])
        tensors = [t for mod in _models(tr) for t in list(mod.parameters()) + list(mod.buffers())]
        trainable = [p for p in tr.policy.parameters() if p.requires_grad]
        opt = [v for s in tr.optimizer.state.values() for v in s.values() if hasattr(v, "data_ptr")]
        return {
            "lora_r": cfg.model.lora.r, "model": cfg.model.path, "iterations": iterations,
            "load_s": round(load_s, 1),
            "iteration_s": round(sum(times) / len(times), 1), "update_s": round(sum(updates) / len(updates), 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "model_mib": round(_tensor_bytes(tensors) / MIB, 1),
            "trainable_params": sum(p.numel() for p in trainable),
            "trainable_mib": round(_tensor_bytes(trainable) / MIB, 2),
            "grad_mib": round(_tensor_bytes([p.grad for p in trainable]) / MIB, 2),
            "optimizer_mib": round(_tensor_bytes(opt) / MIB, 2),
        }
    finally:
        tr.close()


def main(argv: list[str]) -> list[dict]:
    ap = argparse.ArgumentParser(description="LoRA vs full fine-tuning: memory and time per iteration.")
    ap.add_argument("--real", action="store_true", help="the recipe's model instead of a tiny random one")
    ap.add_argument("--lora-r", type=int, default=8, help="LoRA rank of the LoRA run (default 8)")
    ap.add_argument("--iterations", type=int, default=1, help="training iterations per mode (default 1)")
    ap.add_argument("overrides", nargs="*", help="recipe=NAME (default cpu) and key=value overrides, both modes")
    args = ap.parse_args(argv)
    recipe = next((a.split("=", 1)[1] for a in args.overrides if a.startswith("recipe=")), "cpu")
    overrides = [a for a in args.overrides if not a.startswith("recipe=")]
    lora_r, iterations = args.lora_r, args.iterations
    if not args.real:
        from serl.models.tiny import build_tiny_model_dir

        model_dir = Path(tempfile.mkdtemp(prefix="serl-tiny-")) / "model"
        build_tiny_model_dir(model_dir, TOKENIZER_DIR)
        overrides = [f"model.path={model_dir}", "env.max_steps=2", "env.rollout.n=2", "data.train_batch_size=2",
                     "data.max_response_length=16"] + overrides
    results = []
    for r in (0, lora_r):
        args = [sys.executable, __file__, "--child", recipe, str(iterations), *overrides, f"model.lora.r={r}"]
        res = subprocess.run(args, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            sys.stderr.write(res.stderr[-4000:])
            raise SystemExit(f"the lora.r={r} run failed ({res.returncode})")
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    keys = list(results[0])
    print(f"{'':<18}" + "".join(f"{'full' if x['lora_r'] == 0 else 'lora r=' + str(x['lora_r']):>16}" for x in results))
    for k in keys[3:]:
        print(f"{k:<18}" + "".join(f"{x[k]!s:>16}" for x in results))
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2], sys.argv[4:], int(sys.argv[3]))))
    else:
        main(sys.argv[1:])
