"""The update batch (select / split / replay rows / old log-probs) and the one scoring loop."""

from __future__ import annotations

import pytest
import torch

from serl.algos.spear import ReplayRow
from serl.models.loading import load_causal_lm
from serl.train.batch import UpdateBatch, collate, length_buckets, pack_rows, pad_rows, response_logprobs
from serl.train.scoring import score_logprobs
from serl.trajectory import Step


def _step(prompt, response, action_mask):
    return Step(step_id=0, observation="o", prompt="p", prompt_ids=prompt, response_text="r",
                response_ids=response, action="a", action_valid=True, reward=0.0, done=False, won=False,
                action_mask=action_mask)


def _batch():
    steps = [_step([1, 2, 3], [4, 5], [0, 1]), _step([6], [7, 8, 9], [1, 1, 0]), _step([2, 2], [3], [1])]
    return UpdateBatch.from_steps(steps, torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 0.0, 1.0]))


def test_on_policy_rows_broadcast_advantage_and_row_mask():
    b = _batch()
    assert len(b) == 3 and b.index == [0, 1, 2] and b.old_log_probs == [None] * 3
    assert torch.equal(b.padded("advantages", 3), torch.tensor([[0.5, 0.5, 0], [-1, -1, -1], [2, 0, 0]]))
    assert torch.equal(b.padded("response_masks", 3), torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]]))
    rb = b.collate(pad_id=0)
    assert torch.equal(rb.action_mask, torch.tensor([[0.0, 1, 0], [1, 1, 0], [1, 0, 0]]))


def test_a_rows_loss_mask_zeroes_the_inserted_tokens_and_the_replay_mask():
    """A multi-turn row (assistant turn, tool output, assistant turn): the tool-output tokens
    (loss mask 0) train nothing, and a Dr.BoT-masked row stays all zero."""
    from serl.train.batch import StepTable
    from serl.train.replay import store_replay_rows

    turns = _step([1, 2], [4, 5, 6, 7, 8], [0] * 5)
    turns.loss_mask = [1, 1, 0, 0, 1]
    plain = _step([3], [9, 9], [0, 0])
    b = UpdateBatch.from_steps([turns, plain, turns], torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.0, 1.0, 0.0]))
    assert torch.equal(b.padded("response_masks", 5),
                       torch.tensor([[1.0, 1, 0, 0, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]))
    assert plain.trained_mask() == [1, 1] and turns.trained_mask() == [1, 1, 0, 0, 1]
    turns_bad = _step([1], [4, 5], [0, 0])
    turns_bad.loss_mask = [1]
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 response tokens"):
        turns_bad.trained_mask()

    class Buffer:  # records what SPEAR's buffer is offered
        def update(self, rows, step):
            self.rows = rows
            return {}

    table = StepTable(rows=[turns, plain], index=torch.arange(2), uids=["u", "u"], traj_uids=["a", "b"],
                      group_index=torch.zeros(2, dtype=torch.long), traj_index=torch.arange(2),
                      score_raw=torch.ones(2), penalty=torch.zeros(2), invalid=torch.zeros(2, dtype=torch.bool),
                      bonus=torch.zeros(2), step_rewards=torch.ones(2), step_index=torch.zeros(2, dtype=torch.long),
                      step_returns=torch.ones(2), row_mask=torch.tensor([1.0, 0.0]))
    buf = Buffer()
    store_replay_rows(buf, table, torch.tensor([0.5, 2.0]), [torch.zeros(5), torch.zeros(2)], 1, {})
    assert torch.equal(buf.rows[0].response_mask, torch.tensor([1.0, 1, 0, 0, 1]))
    assert torch.equal(buf.rows[0].advantages, torch.tensor([0.5, 0.5, 0, 0, 0.5]))
    assert torch.equal(buf.rows[1].response_mask, torch.zeros(2))


def test_select_split_and_fill_old_log_probs_follow_the_root_index():
    b = _batch()
    parts = b.split(2)
    assert [p.index for p in parts] == [[0, 1], [2]] and parts[1].response_ids == [[3]]
    sub = b.select([2, 0])
    assert sub.index == [2, 0] and sub.prompt_ids == [[2, 2], [1, 2, 3]] and sub.teacher_log_probs is None
    b.fill_old_log_probs(sub.index, [torch.tensor([-1.0]), torch.tensor([-2.0, -3.0])])
    b.fill_old_log_probs([0], [torch.tensor([9.0, 9.0])])  # a row that has them keeps them
    assert b.old_log_probs[1] is None
    assert torch.equal(b.padded("old_log_probs", 2), torch.tensor([[-2.0, -3.0], [0, 0], [-1, 0]]))
    with pytest.raises(ValueError):
        b.split(0)
    with pytest.raises(ValueError, match="old_log_probs has 2 rows, expected 3"):
        UpdateBatch([[1]] * 3, [[2]] * 3, [torch.ones(1)] * 3, [torch.ones(1)] * 3, [None] * 2)
    with pytest.raises(ValueError, match="wide"):
        pad_rows([torch.ones(3)], 2)


def test_replay_batch_carries_stored_rows_and_its_coefficient():
    row = ReplayRow(prompt_ids=torch.tensor([1, 2]), response_ids=torch.tensor([3, 4]),
                    response_mask=torch.tensor([1.0, 1.0]), old_log_probs=torch.tensor([-0.5, -0.7]),
                    advantages=torch.tensor([0.3, 0.3]), reward=1.0, uid="u", traj_uid="t")
    r = UpdateBatch.from_replay_rows([row], loss_coef=0.25)
    assert r.prefix == "replay" and r.loss_coef == 0.25 and r.prompt_ids == [[1, 2]] and r.response_ids == [[3, 4]]
    assert r.teacher_log_probs is None and r.ref_log_probs is None and r.has_context is None
    assert torch.equal(r.old_log_probs[0], row.old_log_probs)
    assert len(UpdateBatch.from_replay_rows([], 0.0).split(4)) == 0


def test_score_logprobs_matches_one_forward_and_takes_given_prompts(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu", False)
    b = _batch()
    seen = []
    out = score_logprobs(model, b, 2, pad_id=0, temperature=0.7, progress=lambda k, n: seen.append((k, n)))
    assert seen == [(0, 3), (2, 3)] and [o.shape[0] for o in out] == [2, 3, 1]
    # rows grouped by length (lengths 5, 4, 3): row 2 and row 1 share the first micro-batch
    with torch.no_grad():
        ref, _ = response_logprobs(model, collate([b.prompt_ids[2], b.prompt_ids[1]],
                                                  [b.response_ids[2], b.response_ids[1]], 0), 0.7)
    assert torch.equal(out[1], ref[1, :3]) and torch.equal(out[2], ref[0, :1])
    # consecutive micro-batches give the same log-probs in the same row order
    plain = score_logprobs(model, b, 2, pad_id=0, temperature=0.7, bucket=False)
    for x, y in zip(out, plain):
        assert torch.allclose(x, y, atol=1e-5)
    # another prompt (SERL's teacher prompt) for the same response changes the scores
    other = score_logprobs(model, b.select([1]), 1, pad_id=0, temperature=0.7, prompt_ids=[[5, 5, 5, 5]])
    assert other[0].shape == out[1].shape and not torch.equal(other[0], out[1])
    with pytest.raises(ValueError, match="prompts"):
        score_logprobs(model, b, 2, pad_id=0, prompt_ids=[[1]])


def test_advantage_signal_metrics_count_rows_and_groups_with_nonzero_advantage():
    import torch

    from serl.train.metrics import advantage_signal_metrics

    adv = torch.tensor([0.0, 0.0, 0.5, -0.5, 0.0, 0.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    m = advantage_signal_metrics(adv, group)
    assert m["critic/advantages/nonzero_fraction"] == 2 / 6
    assert m["critic/advantages/nonzero_group_fraction"] == 1 / 3


def test_length_buckets_group_rows_by_length_within_rows_and_token_budget():
    assert length_buckets([5, 1, 4, 2, 3], 2) == [[1, 3], [4, 2], [0]]
    # the padded size rows × longest row stays within the budget; a too-long row goes alone
    assert length_buckets([3, 3, 3, 10, 4], 8, max_tokens=12) == [[0, 1, 2], [4], [3]]
    assert length_buckets([], 4) == []
    with pytest.raises(ValueError, match="max_rows"):
        length_buckets([1], 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_response_only_logits_equal_full_logits(tiny_model_dir, dtype):
    """The LM head on response positions only gives the log-probs and entropies of the
    ``logits_to_keep`` path: policy (with gradient, fp32 weights under bf16 autocast), and the
    frozen teacher / reference scoring (inference mode, the model in its inference dtype)."""
    model = load_causal_lm(str(tiny_model_dir), dtype, "cpu", False)
    rb = collate([[5, 6, 7, 8, 9], [10, 11], [3, 4, 5]], [[1, 2, 3], [4], [7, 8, 9, 10]], 2)
    mask = rb.response_mask.bool()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():  # teacher / reference / old log-probs
        a, _ = response_logprobs(model, rb, 0.7)
        c, _ = response_logprobs(model, rb, 0.7, response_only=False)
    assert torch.allclose(a[mask], c[mask], atol=tol) and not torch.equal(a[mask], torch.zeros_like(a[mask]))
    if dtype == torch.float32:  # the policy: gradient, entropy, autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a, ea = response_logprobs(model, rb, 1.0, with_entropy=True)
            c, ec = response_logprobs(model, rb, 1.0, with_entropy=True, response_only=False)
        assert a.requires_grad and torch.allclose(a[mask], c[mask], atol=1e-4)
        assert torch.allclose(ea[mask], ec[mask], atol=1e-3)
        ga = torch.autograd.grad((a * rb.response_mask).sum(), model.model.embed_tokens.weight)[0]
        gc = torch.autograd.grad((c * rb.response_mask).sum(), model.model.embed_tokens.weight)[0]
        assert torch.allclose(ga, gc, atol=1e-4)


def test_pack_rows_concatenates_real_tokens_and_points_at_the_predicting_positions():
    rb = collate([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0)  # [2, 3 + 3], left-padded prompts
    p = pack_rows(rb)
    assert p.input_ids.tolist() == [[5, 6, 7, 1, 2, 8, 3, 4, 9]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert p.cu_seq_lens.tolist() == [0, 5, 9] and p.cu_seq_lens.dtype == torch.int32 and p.max_length == 5
    # row 0: token 1 is predicted by packed position 2 (7), token 2 by 3; row 1: 3 by 5 (8), 4 by 6, 9 by 7
    assert p.predict_index.tolist() == [2, 3, 5, 6, 7]
    assert p.input_ids[0, p.predict_index + 1].tolist() == rb.responses[rb.response_mask.bool()].tolist()
    assert set(p.attention_kwargs()) == {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
    with pytest.raises(ValueError, match="prompt token"):
        pack_rows(collate([[]], [[1]], pad_id=0))


@pytest.mark.parametrize("impl", ["serl_sdpa", "eager"])
def test_packed_rows_give_the_padded_log_probs_entropies_and_gradients(tiny_model_dir, impl):
    """``remove_padding`` (one packed sequence, each row attending only to itself) against the
    padded batch with its attention mask, in float32: serl's attention (one sdpa call per row) and
    eager attention (transformers' block-diagonal mask from the restarting positions); the
    response-only head and the ``logits_to_keep`` path through the model itself; with a gradient
    and in inference mode."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (30, 7, 19, 1)]
    responses = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (5, 9, 2, 4)]
    rb = collate(prompts, responses, pad_id=0)
    mask = rb.response_mask.bool()
    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    model.set_attn_implementation(impl)
    params = [p for p in model.parameters()]
    out = {}
    for remove_padding in (False, True):
        for response_only in (True, False):
            lp, ent = response_logprobs(model, rb, 0.7, with_entropy=True, response_only=response_only,
                                        remove_padding=remove_padding)
            grads = torch.autograd.grad((lp * rb.response_mask).sum() + (ent * rb.response_mask).sum(), params)
            with torch.inference_mode():
                lp_inf, _ = response_logprobs(model, rb, 0.7, response_only=response_only, remove_padding=remove_padding)
            out[remove_padding, response_only] = (lp[mask], ent[mask], torch.cat([x.flatten() for x in grads]), lp_inf[mask])
    ref = out[False, True]
    assert not torch.equal(ref[0], torch.zeros_like(ref[0]))
    for key, got in out.items():
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m: f"{key}: {m}")


def test_collate_logit_masks_keep_only_trained_positions_but_never_a_whole_row():
    b = collate([[1, 2], [3]], [[4, 5, 6], [7, 8]], 0,
                logit_masks=[torch.tensor([1.0, 0.0, 1.0]), torch.zeros(2)])
    assert b.response_mask.tolist() == [[1, 0, 1], [1, 1, 0]]  # row 2: all-zero mask keeps its tokens
    assert b.attention_mask[:, 2:].tolist() == [[1, 1, 1], [1, 1, 0]]  # the model still reads every token
