"""Decode steps with transformers' ``sdpa`` attention vs serl's decode attention, A/B in one
process on the same KV cache (alternating, twice), SmolLM2-135M (the ``cpu`` recipe's model) in
bf16, batch 8 of real prompts cut to 680 tokens. Prints CPU milliseconds per decode step.

    OMP_NUM_THREADS=1 python benchmarks/decode_attention_ab.py RUN/last_rollout.jsonl
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from serl.models.loading import load_causal_lm, resolve_model_path  # noqa: E402


def main(rollout: str, batch: int = 8, width: int = 680, steps: int = 8) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    m = load_causal_lm(resolve_model_path("smollm2-135m-alfworld-sft"), torch.bfloat16, "cpu").eval()
    prompts = [s["prompt_ids"] for line in open(rollout) for s in json.loads(line)["steps"]]
    prompts = [p for p in prompts if len(p) >= width][:batch]
    ids = torch.tensor([p[-width:] for p in prompts])
    am = torch.ones_like(ids)
    res: dict[str, list[float]] = {}
    with torch.inference_mode():
        cache = DynamicCache(config=m.config)
        first = m(input_ids=ids, attention_mask=am, past_key_values=cache, use_cache=True,
                  logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(2):
            for impl in ("sdpa", "serl_sdpa"):
                m.set_attn_implementation(impl)
                c, nxt, amk = copy.deepcopy(cache), first, am
                t = time.process_time()
                for _ in range(steps):
                    amk = torch.cat([amk, torch.ones(len(prompts), 1, dtype=torch.long)], 1)
                    nxt = m(input_ids=nxt, attention_mask=amk, past_key_values=c,
                            use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
                res.setdefault(impl, []).append(1000 * (time.process_time() - t) / steps)
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main(sys.argv[1])
