"""The hf engine's KV cache across calls (serl.rollout.turn_cache): a multi-turn conversation's
next turn prefills only what was appended, and samples what a fresh prefill samples."""

from __future__ import annotations

import pytest
import torch

from serl.rollout.engine import HFEngine, SamplingParams
from serl.rollout.turn_cache import MIN_REUSE, TurnCache, weights_version


def _conversations(n=3, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 200, (length + 3 * r,), generator=g).tolist() for r in range(n)]


def _play(engine, prompts, turns, params, appended):
    """``turns`` calls, each on the previous prompt + reply + ``appended`` (a tool turn)."""
    replies = []
    for _ in range(turns):
        out = engine.generate(prompts, params)
        replies.append(out)
        prompts = [p + r + appended for p, r in zip(prompts, out)]
    return replies


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    from serl.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(str(tiny_model_dir), torch.float32, "cpu").eval(), load_tokenizer(str(tiny_model_dir))


def test_later_turns_prefill_only_what_was_appended_and_sample_the_same(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    params = SamplingParams(max_new_tokens=6, do_sample=False)
    appended = [7, 8, 9, 10]
    want = _play(HFEngine(model, tok, 2, prefix_caching=False), _conversations(), 3, params, appended)
    fast = HFEngine(model, tok, 2)
    prefilled = []
    forward = model.forward

    def counting(**kw):  # the prefill forwards (logits of the last position only); decode steps are 1 token
        if kw.get("logits_to_keep") == 1 and kw["input_ids"].shape[1] > 1:
            prefilled.append(kw["input_ids"].shape[1])
        return forward(**kw)

    monkeypatch.setattr(model, "forward", counting)
    got = _play(fast, _conversations(), 3, params, appended)
    assert got == want
    # turn 1: each whole prompt but its last token; turns 2 and 3: only the reply's last token and
    # the appended tokens (the last of them is the decode's first step)
    first = [len(p) - 1 for p in _conversations()]
    assert sorted(prefilled[:3]) == sorted(first)
    assert prefilled[3:] == [1 + len(appended) - 1] * 6
    stats = fast.turn_cache.take_stats()
    assert stats["prefilled_tokens"] == sum(first) + 6 * len(appended)
    assert stats["reused_tokens"] > 0


def test_sampling_at_t1_matches_the_fresh_prefill(model_and_tok):
    model, tok = model_and_tok
    params = SamplingParams(max_new_tokens=5, do_sample=True, temperature=1.0, seed=3)
    want = _play(HFEngine(model, tok, 3, prefix_caching=False), _conversations(4, seed=1), 3, params, [11, 12])
    assert _play(HFEngine(model, tok, 3), _conversations(4, seed=1), 3, params, [11, 12]) == want


def test_changed_weights_or_a_reset_drop_the_kept_sequences(model_and_tok):
    model, tok = model_and_tok
    engine = HFEngine(model, tok, 4)
    engine.generate(_conversations(), SamplingParams(max_new_tokens=3, do_sample=False))
    assert len(engine.turn_cache) == 3
    before = weights_version(model)
    with torch.no_grad():
        p = next(model.parameters())
        p.add_(0.0)  # an in-place update, as an optimizer step
    assert weights_version(model) != before
    engine.turn_cache.begin(weights_version(model))
    assert len(engine.turn_cache) == 0
    engine.generate(_conversations(), SamplingParams(max_new_tokens=3, do_sample=False))
    engine.reset_prefix_cache()
    assert len(engine.turn_cache) == 0
    assert HFEngine(model, tok, 4, prefix_caching=False).turn_cache is None


def test_match_takes_the_longest_common_prefix():
    cache = TurnCache()
    cache.begin(0)
    kv = lambda n: [(torch.arange(n, dtype=torch.float32).view(1, n, 1), torch.zeros(1, n, 1))]  # noqa: E731
    a = list(range(100, 100 + 2 * MIN_REUSE))
    b = a[:MIN_REUSE] + [1] * MIN_REUSE
    cache.add(a, kv(len(a)))
    cache.add(b, kv(len(b)))
    cache.add([1] * (MIN_REUSE - 1), kv(MIN_REUSE - 1))  # too short to keep
    assert cache.match(a + [5]) == (0, None)  # not visible before the call commits
    cache.commit()
    assert len(cache) == 2
    n, layers = cache.match(a[: MIN_REUSE + 3] + [7, 7])
    assert n == MIN_REUSE + 3 and layers[0][0].shape[1] == len(a)
    assert cache.match(b + [3])[0] == len(b)
    assert cache.match([9] * 40) == (0, None)
    with pytest.raises(ValueError, match="positions"):
        cache.add(a, kv(3))


def test_engine_metrics_report_the_reused_share_and_reset(model_and_tok):
    from serl.rollout.engine import engine_metrics

    model, tok = model_and_tok
    engine = HFEngine(model, tok, 4)
    _play(engine, _conversations(), 2, SamplingParams(max_new_tokens=3, do_sample=False), [7, 8])
    m = engine_metrics(engine)
    first = sum(len(p) - 1 for p in _conversations())
    assert m["rollout/prefill_tokens"] == first + 3 * 2  # turn 2: the reply's last token + [7] per row
    assert 0 < m["rollout/prefill_reused_fraction"] < 1
    assert engine_metrics(engine) == {}  # counters zeroed by the read
    assert engine_metrics(object()) == {}


def _turn_cache_of(model, tok, prompts, reply_tokens=4):
    """An engine's turn cache after one greedy call on ``prompts`` (the previous turn)."""
    engine = HFEngine(model, tok, len(prompts))
    replies = engine.generate(prompts, SamplingParams(max_new_tokens=reply_tokens, do_sample=False))
    return engine.turn_cache, [p + r for p, r in zip(prompts, replies)]


def test_batched_prefill_gives_the_keys_and_values_of_the_per_prompt_prefill(model_and_tok, monkeypatch):
    from serl.rollout.prefill import prefilled_cache

    model, tok = model_and_tok
    cache, seqs = _turn_cache_of(model, tok, _conversations(3, length=30))
    cache.take_stats()
    g = torch.Generator().manual_seed(5)
    # next turns of different lengths (3, 9, 20 appended tokens), one prompt with no cached prefix
    # (40 tokens: it sets the group's window), a duplicate, and a one-token prompt
    prompts = [seqs[0] + [7, 8, 9], seqs[1] + torch.randint(5, 200, (9,), generator=g).tolist(),
               seqs[2] + torch.randint(5, 200, (20,), generator=g).tolist(),
               torch.randint(5, 200, (40,), generator=g).tolist(), seqs[0] + [7, 8, 9], [12]]
    width = max(map(len, prompts))
    want = prefilled_cache(model, prompts, width, 4, turn_cache=cache)
    stats = cache.take_stats()
    forwards = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **kw: forwards.append(tuple(kw["input_ids"].shape)) or forward(**kw))
    # the 40-token prompt's window holds the 20- and 9-token turns too; the 3-token one would
    # pad the group beyond twice its new tokens. With 60 positions a forward, each runs alone.
    for budget, shapes in ((10**6, [(3, 39), (1, 3)]), (60, [(1, 39), (1, 20), (1, 9), (1, 3)])):
        forwards.clear()
        got = prefilled_cache(model, prompts, width, 4, turn_cache=cache, batch_tokens=budget)
        assert forwards == shapes
        assert cache.take_stats() == stats  # the same reuse counted
        for a, b in zip(want.layers, got.layers):
            torch.testing.assert_close(b.keys, a.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(b.values, a.values, atol=1e-5, rtol=1e-4)


def test_batched_prefill_samples_what_the_per_prompt_prefill_samples(model_and_tok):
    model, tok = model_and_tok
    for params in (SamplingParams(max_new_tokens=6, do_sample=False),
                   SamplingParams(max_new_tokens=5, do_sample=True, temperature=1.0, seed=3)):
        want = _play(HFEngine(model, tok, 3), _conversations(4, seed=2), 3, params, [7, 8, 9, 10])
        got = _play(HFEngine(model, tok, 3, prefill_batch_tokens=4096), _conversations(4, seed=2), 3, params,
                    [7, 8, 9, 10])
        assert got == want


def test_prefill_groups_bound_padding_and_positions():
    from serl.rollout.prefill import _buckets

    # new parts 3, 9, 20, 40 tokens; whole prompts 43, 49, 60, 40. The 40-token part opens the
    # group; 20 joins (2 x 40 <= 2 x 60), 9 joins (3 x 40 <= 2 x 69), 3 does not (4 x 40 > 2 x 72)
    assert _buckets([3, 9, 20, 40], [43, 49, 60, 40], 10**6) == [[3, 2, 1], [0]]
    # at most 100 positions a forward: 40 with 60 or 60 with 49 would take 120; 49 and 43 fit (2 x 49)
    assert _buckets([3, 9, 20, 40], [43, 49, 60, 40], 100) == [[3], [2], [1, 0]]
    assert _buckets([5, 5, 5, 5], [50, 50, 50, 50], 150) == [[0, 1, 2], [3]]
    assert sorted(sum(_buckets([1, 2, 3], [9, 9, 9], 1), [])) == [0, 1, 2]
