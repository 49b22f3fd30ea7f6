"""serl.models.casting.to_dtype: a bf16 copy keeps the rotary frequencies in float32, so the rollout
copy, the teacher and a checkpoint loaded for evaluation compute what ``from_pretrained(dtype=bf16)``
computes (the eval model) rather than a model whose positions rotate slightly differently."""

from __future__ import annotations

import copy

import torch

from serl.configure import load_config
from serl.models.casting import to_dtype
from serl.models.loading import load_causal_lm
from serl.models.lora import apply_lora, merged_copy
from serl.models.teacher import Teacher


def _rope_buffers(model) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers() if n.endswith("inv_freq")}


def test_from_pretrained_keeps_inv_freq_float32_and_to_dtype_matches_it(tiny_model_dir):
    loaded = load_causal_lm(str(tiny_model_dir), torch.bfloat16, "cpu")
    fp32 = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    rope = _rope_buffers(loaded)
    assert rope and all(b.dtype == torch.float32 for b in rope.values())
    plain_to = copy.deepcopy(fp32).to(torch.bfloat16)  # what the copies did before
    cast = to_dtype(copy.deepcopy(fp32), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in cast.parameters())
    for name, b in _rope_buffers(cast).items():
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, rope[name], rtol=0, atol=0)
        assert not torch.equal(_rope_buffers(plain_to)[name].float(), rope[name])  # bf16 rounding changes them
    ids = torch.randint(5, 200, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = loaded(input_ids=ids).logits
        torch.testing.assert_close(cast(input_ids=ids).logits, want, rtol=0, atol=0)


def test_rollout_copy_and_teacher_keep_inv_freq_float32(tiny_model_dir):
    cfg = load_config("cpu", ["model.lora.r=4"])
    policy = apply_lora(load_causal_lm(str(tiny_model_dir), torch.float32, "cpu"), cfg.model.lora).eval()
    for model in (merged_copy(policy, torch.bfloat16),
                  Teacher(load_causal_lm(str(tiny_model_dir), torch.float32, "cpu"), torch.bfloat16).model):
        rope = _rope_buffers(model)
        assert rope and all(b.dtype == torch.float32 for b in rope.values())
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
