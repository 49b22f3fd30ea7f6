"""Decode steps with transformers' ``sdpa`` attention vs serl's decode attention, A/B in one
process on the same KV cache (alternating, twice), SmolLM2-135M (the ``cpu`` recipe's model) in
bf16, batch 8 of real prompts cut to 680 tokens. Prints CPU milliseconds per decode step.

    OMP_NUM_THREADS=1 python benchmarks/decode_attention_ab.py RUN/last_rollout.jsonl

``--prealloc B L``: serl's decode attention as it was before 2026-11-26 (``former``: the
preallocated cache's strided key and value handed to ``matmul``, the mask expanded per head) vs
now (``current``: one explicit copy of each, the ``[B, 1, 1, L]`` mask broadcast, an all-true
mask skipped), on the hf engine's own path (:func:`serl.rollout.prefill.prefilled_cache`), ``B``
left-padded random prompts of up to ``L`` tokens, the machine's threads; wall milliseconds per
decode step, alternating, twice each:

    python benchmarks/decode_attention_ab.py --prealloc 16 400
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


def former_decode_attention(query, key, value, attention_mask, scaling):
    """serl's decode attention before 2026-11-26 (``serl.models.attention._decode_attention``)."""
    B, H, _, D = query.shape
    KV, L = key.shape[1], key.shape[2]
    q = query.reshape(B, KV, H // KV, D)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scaling
    if attention_mask is not None:
        m = attention_mask.expand(B, H, 1, L).reshape(B, KV, H // KV, L)
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
    out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous()


def prealloc_ab(batch: int, width: int, steps: int = 12) -> dict[str, float]:
    import serl.models.attention as attention
    from serl.rollout.prefill import CACHE_ARG, prefilled_cache
    from serl.utils import cpu_kind

    m = load_causal_lm(resolve_model_path("smollm2-135m-alfworld-sft"), torch.bfloat16, "cpu").eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (width - 7 * (r % 5),), generator=g).tolist() for r in range(batch)]
    am = torch.zeros(batch, width + steps, dtype=torch.long)
    for r, p in enumerate(prompts):
        am[r, width - len(p):] = 1
    current, res = attention._decode_attention, {"former": [], "current": []}
    try:
        with torch.inference_mode():
            for _ in range(2):
                for name, fn in (("former", former_decode_attention), ("current", current)):
                    attention._decode_attention = fn
                    cache = prefilled_cache(m, prompts, width, steps)
                    nxt = torch.tensor([p[-1] for p in prompts])[:, None]
                    pos = torch.tensor([len(p) - 1 for p in prompts])[:, None]
                    for s in range(steps):
                        t = time.perf_counter()
                        nxt = m(input_ids=nxt, attention_mask=am[:, : width + s], position_ids=pos + s, use_cache=True,
                                logits_to_keep=1, **{CACHE_ARG: cache}).logits[:, -1].argmax(-1, keepdim=True)
                        if s >= 2:
                            res[name].append(1000 * (time.perf_counter() - t))
    finally:
        attention._decode_attention = current
    out = {k: sum(v) / len(v) for k, v in res.items()}
    print(f"{cpu_kind()}; bf16; {torch.get_num_threads()} threads; batch {batch}, prompts of up to {width} tokens: "
          f"former {out['former']:.1f} ms/step, current {out['current']:.1f} ms/step "
          f"({out['former'] / out['current']:.2f}x)")
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--prealloc":
        prealloc_ab(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main(sys.argv[1])
