"""serl's one-token decode attention gives transformers' sdpa results (CPU, bf16)."""

from __future__ import annotations

import copy

import pytest
import torch

from serl.models.attention import (SERL_ATTENTION, _decode_attention, attend_somewhere, serl_attention_forward,
                                   use_serl_attention)
from serl.models.loading import load_causal_lm, load_tokenizer
from serl.rollout.engine import HFEngine, SamplingParams
from serl.train.batch import collate, response_logprobs


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "all_true", "per_head"])
def test_decode_attention_matches_sdpa(mask_kind):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    B, H, KV, L, D = 3, 6, 2, 37, 16
    q, k, v = (torch.randn(*s, generator=g) for s in ((B, H, 1, D), (B, KV, L, D), (B, KV, L, D)))
    mask = None
    if mask_kind != "none":
        keep = torch.ones(B, 1, 1, L, dtype=torch.bool)
        keep[0, ..., :5] = False  # row 0 left-padded
        keep[2, ..., :11] = False
        if mask_kind == "all_true":  # no padding in the batch: the mask is skipped
            keep = torch.ones(B, 1, 1, L, dtype=torch.bool)
        if mask_kind == "per_head":  # a mask per query head ([B, H, 1, L]) is grouped per key/value head
            keep = keep.expand(B, H, 1, L).clone()
            keep[1, 3, :, :7] = False
        mask = keep if mask_kind != "float" else torch.zeros(B, 1, 1, L).masked_fill(~keep, float("-inf"))
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = H // KV, True
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=D ** -0.5)
    out = _decode_attention(q, k, v, mask, D ** -0.5)
    assert out.shape == (B, 1, H, D)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # bf16 inputs take the grouped-matmul path in the registered function; within bf16 rounding
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    fast, _ = serl_attention_forward(module, qb, kb, vb, mask if mask is None or mask.dtype == torch.bool
                                     else mask.bfloat16(), scaling=D ** -0.5)
    assert fast.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), ref, atol=3e-2, rtol=3e-2)


def test_loaded_models_use_serl_attention_and_greedy_tokens_equal_sdpa(tiny_model_dir, tmp_path):
    model = load_causal_lm(str(tiny_model_dir), torch.bfloat16, "cpu")
    assert model.config._attn_implementation == SERL_ATTENTION
    model.save_pretrained(tmp_path / "saved")  # the switch is not written into the saved config
    assert SERL_ATTENTION not in (tmp_path / "saved" / "config.json").read_text()
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    tok = load_tokenizer(str(tiny_model_dir))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (9, 23, 17, 30)]  # left padding
    params = SamplingParams(max_new_tokens=12, do_sample=False)
    fast = HFEngine(model, tok, 4).generate(prompts, params)
    ref = HFEngine(plain, tok, 4).generate(prompts, params)
    assert fast == ref
    assert sum(len(r) for r in fast) > 4


def test_use_serl_attention_leaves_other_attention_kinds(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="eager")
    assert not use_serl_attention(model)
    assert model.config._attn_implementation == "eager"


def test_attend_somewhere_unmasks_only_fully_masked_rows():
    m = torch.tensor([[[[False, False, False], [True, False, False], [True, True, False]]]])
    assert attend_somewhere(m).tolist() == [[[[True, True, True], [True, False, False], [True, True, False]]]]
    assert m[0, 0, 0].tolist() == [False, False, False]  # the input is not modified
    lo = torch.finfo(torch.float32).min
    f = torch.tensor([[[[lo, lo], [0.0, lo]], [[float("-inf"), float("-inf")], [lo, 0.0]]]])  # [1, 2, 2, 2]
    assert attend_somewhere(f).tolist() == [[[[0.0, 0.0], [0.0, lo]], [[0.0, 0.0], [lo, 0.0]]]]


def test_padded_training_forward_passes_no_fully_masked_row_and_keeps_log_probs(tiny_model_dir, monkeypatch):
    """A left-padded batch: every mask row reaching sdpa attends somewhere (CUDA's memory-efficient
    backward gives NaN gradients otherwise), and the response log-probs and gradients equal eager
    attention's, which never had fully masked rows to begin with."""
    import transformers.integrations.sdpa_attention as sdpa_mod

    seen = []
    real = sdpa_mod.sdpa_attention_forward

    def spy(module, q, k, v, mask, **kw):
        if mask is not None:
            seen.append(bool(mask.any(dim=-1).all()) if mask.dtype == torch.bool else
                        bool((mask.amax(dim=-1) > torch.finfo(mask.dtype).min).all()))
        return real(module, q, k, v, mask, **kw)

    monkeypatch.setattr(sdpa_mod, "sdpa_attention_forward", spy)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (30, 7, 19)]
    responses = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (5, 9, 2)]
    batch = collate(prompts, responses, pad_id=0)
    out = {}
    for impl in (SERL_ATTENTION, "eager"):
        model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
        model.set_attn_implementation(impl)
        lp, _ = response_logprobs(model, batch, remove_padding=False)  # the padded path
        (lp * batch.response_mask).sum().backward()
        out[impl] = (lp * batch.response_mask, torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert seen and all(seen)
    torch.testing.assert_close(out[SERL_ATTENTION][0], out["eager"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[SERL_ATTENTION][1], out["eager"][1], atol=1e-5, rtol=1e-4)
