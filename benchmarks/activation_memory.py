"""The activation-memory estimate of ``model.gradient_checkpointing=auto`` against the measured
peak of one forward+backward without checkpointing, on SmolLM2-135M's shape (random weights).

Measured = allocator peak during the forward+backward minus what is still allocated after it
(the gradients): on CUDA ``torch.cuda.max_memory_allocated``; on CPU the profiler's ``[memory]``
events (as tests/test_grad_ckpt.py does on a small model). The LM head runs on ``--kept``
positions per row (serl's response-only head). Prints one line per (dtype, rows, seq) with the
ratio estimate / measured, which should be in [1, 2].

    python benchmarks/activation_memory.py               # CUDA if available, else CPU
    python benchmarks/activation_memory.py --device cpu --shapes 1x256,2x512
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from serl.models.memory import model_activation_bytes

#: SmolLM2-135M's architecture (HuggingFaceTB/SmolLM2-135M-Instruct config.json)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)


def measure(model, rows: int, seq: int, kept: int, autocast: bool, device: str) -> int:
    ids = torch.randint(3, 40000, (rows, seq), device=device)
    mask = torch.ones(rows, seq, dtype=torch.long, device=device)
    mask[0, :3] = 0
    ctx = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast)

    def step():
        with ctx:
            hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            lp = torch.log_softmax(model.lm_head(hidden[:, -kept:]).float(), -1)
        lp[..., 0].sum().backward()

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            events = json.load(open(f.name))["traceEvents"]
        mem = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0),
                     key=lambda e: e["ts"])
        total = [e["args"]["Total Allocated"] for e in mem]
        peak, after = max(total), total[-1]
    model.zero_grad(set_to_none=True)
    return peak - after


def main(argv: list[str]) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="1x512,2x1024,4x1136,8x1136,4x2048", help="ROWSxSEQ,...")
    ap.add_argument("--kept", type=int, default=48, help="logit positions per row")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(attn_implementation="sdpa", **SMOLLM2_135M)).to(args.device).train()
    out = []
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    for autocast in (True, False):
        for shape in args.shapes.split(","):
            rows, seq = (int(x) for x in shape.split("x"))
            measured = measure(model, rows, seq, args.kept, autocast, args.device)
            est = model_activation_bytes(model.config, rows, seq, rows * args.kept, 2 if autocast else 4)
            r = {"device": name, "dtype": "bf16-autocast" if autocast else "float32", "rows": rows, "seq": seq,
                 "measured_gb": measured / 2**30, "estimate_gb": est / 2**30, "ratio": est / measured}
            out.append(r)
            print(f"{r['device']} {r['dtype']:13s} {rows}x{seq}: measured {r['measured_gb']:.2f} GiB, "
                  f"estimate {r['estimate_gb']:.2f} GiB, ratio {r['ratio']:.2f}", flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
