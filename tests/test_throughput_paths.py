"""The faster update / scoring / generation paths give the results of the former ones (tiny model)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import serl.train.scoring as scoring_mod
import serl.train.update as update_mod
from serl.configure import load_config
from serl.rollout.engine import ENGINE_REGISTRY, HFEngine, SamplingParams, make_engine, resolve_engine_name
from serl.train.batch import UpdateBatch, response_logprobs
from serl.train.trainer import Trainer
from serl.trajectory import Step


def _cfg(model_dir, out, **extra):
    overrides = [f"model.path={model_dir}", "env.rollout.n=2", "data.train_batch_size=2", "actor.lr=1e-3",
                 "actor.ppo_mini_batch_size=3", "actor.ppo_micro_batch_size=2", "actor.use_kl_loss=true",
                 "actor.kl_loss_coef=0.1", "actor.entropy_coeff=0.01", "algorithm.serl.enable=false",
                 "model.train_dtype=float32", "model.dtype=float32", f"trainer.output_dir={out}",
                 "trainer.run_name=run", "trainer.progress=false", "trainer.logger=[]"]
    return load_config("cpu", overrides + [f"{k}={v}" for k, v in extra.items()])


def _rows(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p = torch.randint(3, 4000, (int(torch.randint(4, 20, (1,), generator=g)),), generator=g).tolist()
        r = torch.randint(3, 4000, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        rows.append(Step(step_id=0, observation="o", prompt="p", prompt_ids=p, response_text="r", response_ids=r,
                         action="a", action_valid=True, reward=0.0, done=False, won=False, action_mask=[1] * len(r)))
    return rows


def _update_once(tr: Trainer, rows) -> dict[str, torch.Tensor]:
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75])[: len(rows)]
    batch = UpdateBatch.from_steps(rows, adv, torch.ones(len(rows)))
    batch.ref_log_probs = tr.scorer.score(tr.ref.model, batch)
    tr.update.run(batch, step=1)
    return {k: v.detach().clone() for k, v in tr.policy.named_parameters()}


def test_one_update_matches_the_former_path(tiny_model_dir, tmp_path, monkeypatch):
    """Packed rows (``model.use_remove_padding``), the response-only LM head, length-grouped
    scoring micro-batches and fused AdamW against the former path (padded rows,
    ``logits_to_keep``, consecutive micro-batches of ppo_micro_batch_size, the per-parameter AdamW
    loop): the same parameters after one update with two mini-batches (precomputed old
    log-probs), the reference KL and an entropy bonus."""
    tr = Trainer(_cfg(tiny_model_dir, tmp_path))
    try:
        assert tr.optimizer.defaults.get("fused") or tr.optimizer.defaults.get("foreach")
        p0 = copy.deepcopy(tr.policy.state_dict())
        new = _update_once(tr, _rows())

        tr.policy.load_state_dict(p0)
        tr.optimizer = torch.optim.AdamW(tr.policy.parameters(), lr=tr.cfg.actor.lr,
                                         weight_decay=tr.cfg.actor.weight_decay, foreach=False)
        tr.cfg.actor.log_prob_micro_batch_size_per_gpu = tr.cfg.actor.ppo_micro_batch_size
        tr.cfg.model.use_remove_padding = False
        monkeypatch.setattr(update_mod, "response_logprobs", functools.partial(response_logprobs, response_only=False))
        score = scoring_mod.score_logprobs
        monkeypatch.setattr(scoring_mod, "score_logprobs", functools.partial(score, bucket=False))
        old = _update_once(tr, _rows())
    finally:
        tr.close()
    moved = max((new[k] - p0[k]).abs().max().item() for k in new)
    assert moved > 1e-4  # the update did something
    # Adam divides by sqrt(v): on an element whose gradient is ~0, float rounding can move the
    # step by a visible share of lr (1e-3); allow 1/10 of a step per element, and require the
    # mean difference to be at rounding level
    for k in new:
        torch.testing.assert_close(new[k], old[k], atol=1e-4, rtol=0)
        assert (new[k] - old[k]).abs().mean().item() < 1e-6, k


def test_dynamic_bsz_micro_batches_cover_the_mini_batch_by_length(tiny_model_dir, tmp_path):
    tr = Trainer(_cfg(tiny_model_dir, tmp_path, **{"actor.use_dynamic_bsz": "true",
                                                   "actor.ppo_max_token_len_per_gpu": 30}))
    try:
        rows = _rows()
        mini = UpdateBatch.from_steps(rows, torch.zeros(5), torch.ones(5))
        micros = tr.update.micro_batches(mini)
        assert sorted(i for m in micros for i in m.index) == list(range(5))
        for m in micros:
            width = max(len(p) + len(r) for p, r in zip(m.prompt_ids, m.response_ids))
            assert len(m) <= 2 and (len(m) == 1 or len(m) * width <= 30)
        lens = [max(len(p) + len(r) for p, r in zip(m.prompt_ids, m.response_ids)) for m in micros]
        assert lens == sorted(lens)
        tr.cfg.actor.use_dynamic_bsz = False
        assert [m.index for m in tr.update.micro_batches(mini)] == [[0, 1], [2, 3], [4]]
    finally:
        tr.close()


def test_auto_engine_resolves_to_a_registered_engine(tiny_model_dir):
    assert resolve_engine_name("auto", "cpu") == "hf" and "hf" in ENGINE_REGISTRY
    with pytest.raises(ValueError, match="unknown rollout engine"):
        resolve_engine_name("sglang", "cpu")
    from serl.models.loading import load_causal_lm, load_tokenizer

    eng, name = make_engine("auto", load_causal_lm(str(tiny_model_dir), torch.float32, "cpu"),
                            load_tokenizer(str(tiny_model_dir)), 4, "cpu")
    assert name == "hf" and isinstance(eng, HFEngine) and eng.micro_batch_size == 4


def test_static_cache_greedy_tokens_equal_plain_generate(tiny_model_dir):
    from serl.models.loading import load_causal_lm, load_tokenizer

    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    tok = load_tokenizer(str(tiny_model_dir))
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    params = SamplingParams(max_new_tokens=12, do_sample=False)
    plain = HFEngine(model, tok, 2).generate(prompts, params)
    static = HFEngine(model, tok, 2, cache_implementation="static").generate(prompts, params)
    assert static == plain and all(len(r) > 0 for r in plain)
    with pytest.raises(ValueError, match="static"):
        HFEngine(model, tok, compile_decode=True)


def _prompts():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (30, 7, 19, 1, 12)]
    return prompts + [list(prompts[1]), list(prompts[2])]  # a group's shared first prompts


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=12, do_sample=False),
                                    SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)],
                         ids=["greedy", "sampled"])
def test_unpadded_prefill_gives_the_tokens_of_padded_generate(tiny_model_dir, params):
    """The hf engine's prefill (each distinct prompt once, unpadded, into a preallocated cache)
    against ``generate`` on the padded batch, float32: the same tokens, greedy and seeded
    sampling (the same RNG draws), over micro-batches with a one-token prompt and duplicates."""
    from serl.models.loading import load_causal_lm, load_tokenizer

    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    tok = load_tokenizer(str(tiny_model_dir))
    padded = HFEngine(model, tok, 4, unpadded_prefill=False)
    fast = HFEngine(model, tok, 4)
    assert fast.unpadded_prefill and not padded.unpadded_prefill
    want = padded.generate(_prompts(), params)
    assert fast.generate(_prompts(), params) == want and all(len(r) == 12 for r in want)
    assert HFEngine(model, tok, 4, prefix_caching=False).generate(_prompts(), params) == want
    # an EOS ends a row early and the other rows go on: the rows trimmed as plain generate's
    eos = want[0][3]
    model.generation_config.eos_token_id = eos
    try:
        want = HFEngine(model, tok, 4, unpadded_prefill=False).generate(_prompts(), params)
        assert HFEngine(model, tok, 4).generate(_prompts(), params) == want
        assert any(r[-1] == eos and len(r) < 12 for r in want) and any(len(r) == 12 for r in want)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id


def test_prefilled_cache_runs_each_distinct_prompt_once_and_right_aligns_it(tiny_model_dir, monkeypatch):
    from serl.models.loading import load_causal_lm
    from serl.rollout.prefill import PreallocatedLayer, prefilled_cache

    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu").eval()
    prompts = [[5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [11], [5, 6, 7, 3, 4]]
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **kw: calls.append(kw["input_ids"].tolist()) or forward(**kw))
    cache = prefilled_cache(model, prompts, width=5, new_tokens=3)
    assert calls == [[[5, 6, 7]], [[9]], [[5, 6, 7, 3]]]  # [5,6,7,8] once; [11] has nothing to prefill
    assert cache.get_seq_length() == 4 and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    for layer_idx in (0, len(cache.layers) - 1):
        k, v = cache.layers[layer_idx].keys, cache.layers[layer_idx].values  # [5, KV, 4, D]
        for r, p in enumerate(prompts):
            n = len(p) - 1  # the row's head sits in the last n of the 4 columns, zeros before it
            assert torch.equal(k[r, :, : 4 - n], torch.zeros_like(k[r, :, : 4 - n]))
            if n:
                ref = forward(input_ids=torch.tensor([p[:-1]]), use_cache=True).past_key_values.layers[layer_idx]
                torch.testing.assert_close(k[r, :, 4 - n :], ref.keys[0])
                torch.testing.assert_close(v[r, :, 4 - n :], ref.values[0])
    calls.clear()
    prefilled_cache(model, prompts, width=5, new_tokens=3, dedup=False)
    assert len(calls) == 4
    with pytest.raises(ValueError, match="1 … 4"):
        prefilled_cache(model, [[1, 2, 3, 4, 5]], width=4, new_tokens=1)
    with pytest.raises(ValueError, match="one token"):
        prefilled_cache(model, [[1], [2]], width=1, new_tokens=1)


def test_preallocated_layer_writes_in_place_until_full():
    from serl.rollout.prefill import PreallocatedLayer

    layer = PreallocatedLayer(torch.zeros(2, 1, 4, 3), torch.zeros(2, 1, 4, 3), length=2)
    assert layer.get_seq_length() == 2
    k, v = layer.update(torch.ones(2, 1, 1, 3), 2 * torch.ones(2, 1, 1, 3))
    assert k.shape == (2, 1, 3, 3) and torch.equal(k[:, :, 2], torch.ones(2, 1, 3)) and layer.get_seq_length() == 3
    assert k.data_ptr() == layer._key_buffer.data_ptr()  # a view: no copy of the cache
    layer.update(torch.ones(2, 1, 1, 3), torch.ones(2, 1, 1, 3))
    with pytest.raises(RuntimeError, match="full"):
        layer.update(torch.ones(2, 1, 1, 3), torch.ones(2, 1, 1, 3))
    with pytest.raises(NotImplementedError):
        layer.crop(-1)


def test_models_with_sliding_window_layers_keep_plain_generate():
    from types import SimpleNamespace

    from serl.rollout.prefill import supports_prefilled_cache

    def model(**cfg):
        return SimpleNamespace(config=SimpleNamespace(**cfg))

    assert supports_prefilled_cache(model(layer_types=["full_attention"] * 2))
    assert supports_prefilled_cache(model(sliding_window=4096, use_sliding_window=False))
    assert not supports_prefilled_cache(model(layer_types=["full_attention", "sliding_attention"]))
    assert not supports_prefilled_cache(model(sliding_window=4096))
