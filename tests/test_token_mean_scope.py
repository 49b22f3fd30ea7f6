"""``actor.token_mean_scope``: with ``mini_batch`` a token-mean loss averages over every loss
token of the mini-batch, so the gradient does not depend on the micro-batch size; with
``micro_batch`` (verl-agent's) it does (the tiny model, float32, one process)."""

from __future__ import annotations

import pytest
import torch

from serl.configure import load_config
from serl.errors import ConfigError
from serl.train.batch import UpdateBatch
from serl.train.update import loss_count
from tests.test_update_skip_zero_rows import ADV, _rows, _update


def _grad(tiny_model_dir, tmp_path, rows, adv, scope: str, micro: int, start=None, extra=()):
    start, grads, metrics, _ = _update(
        tiny_model_dir, tmp_path / f"{scope}{micro}", rows, adv, False,
        ["actor.ppo_mini_batch_size=6", "actor.entropy_coeff=0.01", f"actor.token_mean_scope={scope}",
         f"actor.ppo_micro_batch_size={micro}", *extra], start)
    assert len(grads) == 1
    return start, grads[0], metrics


def _close(a: dict, b: dict) -> bool:
    scale = max(float(v.abs().max()) for v in a.values())
    assert scale > 0
    return all(torch.allclose(b[k], v, rtol=1e-4, atol=1e-5 * scale) for k, v in a.items())


def test_mini_batch_scope_gives_one_gradient_whatever_the_micro_batch_size(tiny_model_dir, tmp_path):
    """Six rows of 2-8 response tokens, one optimizer step, entropy bonus on: micro-batches of 1,
    2 and 4 rows give the gradient of the one micro-batch of all 6 (where both scopes agree);
    under micro_batch scope a micro-batch of 1 row gives another gradient (every row weighted
    alike, whatever its length)."""
    rows = _rows(6)
    assert len({len(r.response_ids) for r in rows}) > 2  # lengths differ, or the scopes would agree
    start, whole, m_whole = _grad(tiny_model_dir, tmp_path, rows, ADV, "mini_batch", 6)
    _, whole_micro, _ = _grad(tiny_model_dir, tmp_path, rows, ADV, "micro_batch", 6, start)
    assert _close(whole, whole_micro)
    for micro in (1, 2, 4):
        _, g, m = _grad(tiny_model_dir, tmp_path, rows, ADV, "mini_batch", micro, start)
        assert _close(whole, g), micro
        # the metrics, micro-steps weighted by their tokens, are the mini-batch's token-means too
        for key in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl"):
            assert m[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-7), (micro, key)
    _, per_row, m_row = _grad(tiny_model_dir, tmp_path, rows, ADV, "micro_batch", 1, start)
    assert not _close(whole, per_row)
    assert m_row["actor/pg_loss"] != pytest.approx(m_whole["actor/pg_loss"], rel=1e-3)  # a mean of row means


def test_mini_batch_scope_with_rows_left_out(tiny_model_dir, tmp_path):
    """``actor.skip_zero_advantage_rows`` composes with it: rows 1-3 train nothing and are left
    out, the gradient is still the whole mini-batch's (entropy 0: the left-out rows add nothing)."""
    rows = _rows(6)
    extra = ["actor.entropy_coeff=0"]
    start, whole, _, _ = _update(tiny_model_dir, tmp_path / "all", rows, ADV, False,
                                 ["actor.ppo_mini_batch_size=6", "actor.ppo_micro_batch_size=6",
                                  "actor.token_mean_scope=mini_batch", *extra])
    _, grads, _, _ = _update(tiny_model_dir, tmp_path / "skip", rows, ADV, True,
                             ["actor.ppo_mini_batch_size=6", "actor.ppo_micro_batch_size=1",
                              "actor.token_mean_scope=mini_batch", *extra], start)
    assert _close(whole[0], grads[0])


def test_loss_count_by_hand():
    rows = _rows(3)  # responses of 2, 7 and 5 tokens; row 2 masked out (Dr.BoT)
    batch = UpdateBatch.from_steps(rows, torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0]))
    assert batch.loss_tokens() == [2.0, 7.0, 0.0]
    assert loss_count(batch, "token-mean", "mini_batch") == 9.0
    assert loss_count(batch, "token-mean", "micro_batch") == 3.0
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert loss_count(batch, mode, "mini_batch") == 3.0  # rows in both scopes


def test_an_unknown_scope_is_a_config_error():
    with pytest.raises(ConfigError, match="actor.token_mean_scope.*'global'"):
        load_config("cpu", ["actor.token_mean_scope=global"])
