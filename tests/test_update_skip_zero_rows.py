"""``actor.skip_zero_advantage_rows``: the update leaves out the rows that train nothing and
takes the same optimizer steps (the tiny model, float32, one process)."""

from __future__ import annotations

import copy

import pytest
import torch

from serl.configure import load_config
from serl.errors import ConfigError
from serl.train.batch import UpdateBatch
from serl.train.trainer import Trainer
from serl.train.update import kept_loss_factor, trains_something
from serl.trajectory import Step


def _rows(n: int) -> list[Step]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        p = torch.randint(3, 4000, (6 + 3 * i,), generator=g).tolist()
        r = torch.randint(3, 4000, (2 + (5 * i) % 7,), generator=g).tolist()
        out.append(Step(step_id=0, observation="o", prompt="p", prompt_ids=p, response_text="r", response_ids=r,
                        action="a", action_valid=True, reward=0.0, done=False, won=False, action_mask=[1] * len(r)))
    return out


def _update(tiny_model_dir, tmp_path, rows, adv, skip: bool, extra: list[str], start=None):
    """One update of ``rows`` with advantages ``adv`` from parameters ``start`` (None: the loaded
    ones); returns (start, the gradients each optimizer step saw, metrics, the batch). Gradients,
    not parameters, are compared: AdamW's first step moves a parameter by about ±lr whatever the
    size of its gradient, so a gradient of 1e-12 against -1e-12 (float rounding) would differ by
    2·lr in the parameters."""
    overrides = [f"model.path={tiny_model_dir}", "env.rollout.n=2", "data.train_batch_size=2", "actor.lr=1e-3",
                 "actor.ppo_micro_batch_size=2", "actor.use_dynamic_bsz=false", "algorithm.serl.enable=false",
                 "model.train_dtype=float32", "model.dtype=float32", "model.gradient_checkpointing=false",
                 f"trainer.output_dir={tmp_path / ('skip' if skip else 'all')}", "trainer.run_name=run",
                 "trainer.progress=false", "trainer.logger=[]", f"actor.skip_zero_advantage_rows={str(skip).lower()}",
                 *extra]
    tr = Trainer(load_config("cpu", overrides))
    try:
        if start is None:
            start = copy.deepcopy(tr.policy.state_dict())
        tr.policy.load_state_dict(start)
        batch = UpdateBatch.from_steps(rows, adv, torch.ones(len(rows)))
        grads, step = [], tr.update._optimizer_step

        def record(prefix):
            grads.append({k: None if v.grad is None else v.grad.detach().clone()
                          for k, v in tr.policy.named_parameters() if v.requires_grad})
            return step(prefix)

        tr.update._optimizer_step = record
        m = tr.update.run(batch, step=1)
        return start, grads, m, batch
    finally:
        tr.close()


# rows 1-3 train nothing: micro-batch 1 (rows 0, 1) is partly left out, micro-batch 2 (2, 3) wholly
ADV = torch.tensor([1.0, 0.0, 0.0, 0.0, -0.5, 0.25])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_same_step_in_every_loss_mode(tiny_model_dir, tmp_path, mode):
    """One mini-batch of 6 rows, entropy_coeff 0, no KL: the parameters after the step equal those
    of the update over every row, whichever way the loss is aggregated."""
    rows = _rows(6)
    extra = ["actor.ppo_mini_batch_size=6", "actor.entropy_coeff=0", f"actor.loss_agg_mode={mode}"]
    start, g_all, m_all, _ = _update(tiny_model_dir, tmp_path, rows, ADV, False, extra)
    _, g_skip, m_skip, batch = _update(tiny_model_dir, tmp_path, rows, ADV, True, extra, start)
    assert len(g_all) == len(g_skip) == 1
    scale = max(float(v.abs().max()) for v in g_all[0].values())
    assert scale > 0
    for k, v in g_all[0].items():
        torch.testing.assert_close(g_skip[0][k], v, rtol=1e-4, atol=1e-5 * scale, msg=k)
    assert m_skip["actor/grad_norm"] == pytest.approx(m_all["actor/grad_norm"], rel=1e-4)
    assert [o is None for o in batch.old_log_probs] == [False, True, True, True, False, False]


def test_a_mini_batch_with_no_row_that_trains_still_steps_adam(tiny_model_dir, tmp_path):
    """Mini-batches of 2: the second (rows 2, 3) trains nothing, yet AdamW's step on its zero
    gradient moves the parameters (momentum), as in the update over every row; the rows outside
    the first mini-batch get old log-probs from the scoring pass only where they train."""
    rows = _rows(6)
    extra = ["actor.ppo_mini_batch_size=2", "actor.entropy_coeff=0"]
    start, g_all, _, _ = _update(tiny_model_dir, tmp_path, rows, ADV, False, extra)
    _, g_skip, _, batch = _update(tiny_model_dir, tmp_path, rows, ADV, True, extra, start)
    assert len(g_all) == len(g_skip) == 3
    for i in (0, 2):  # the mini-batches with a row that trains: the same gradients
        scale = max(float(v.abs().max()) for v in g_all[i].values())
        for k, v in g_all[i].items():
            torch.testing.assert_close(g_skip[i][k], v, rtol=1e-4, atol=1e-5 * scale, msg=k)
    for k, v in g_all[1].items():  # rows 2, 3: a zero gradient, which AdamW steps on in both
        assert g_skip[1][k] is not None and not g_skip[1][k].any() and not v.any(), k
    assert [o is None for o in batch.old_log_probs] == [False, True, True, True, False, False]


def test_with_an_entropy_bonus_the_left_out_rows_bonus_is_dropped(tiny_model_dir, tmp_path):
    """entropy_coeff != 0: the rows left out no longer add their entropy bonus (the documented
    departure), so the step differs from the update over every row."""
    rows = _rows(6)
    extra = ["actor.ppo_mini_batch_size=6", "actor.entropy_coeff=0.5"]
    start, g_all, _, _ = _update(tiny_model_dir, tmp_path, rows, ADV, False, extra)
    _, g_skip, _, _ = _update(tiny_model_dir, tmp_path, rows, ADV, True, extra, start)
    scale = max(float(v.abs().max()) for v in g_all[0].values())
    assert any(not torch.allclose(g_skip[0][k], v, rtol=1e-3, atol=1e-3 * scale) for k, v in g_all[0].items())


def test_trains_something_and_the_kept_loss_factor_by_hand():
    rows = _rows(3)  # responses of 2, 7 and 5 tokens
    batch = UpdateBatch.from_steps(rows, torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0]))
    assert [len(r) for r in batch.response_ids] == [2, 7, 5]
    assert trains_something(batch) == [False, True, False]  # row 2 is masked out (Dr.BoT)
    keep = [1]
    assert kept_loss_factor(batch, keep, "token-mean", None) == pytest.approx(7 / 9)  # masked row: 0 tokens
    assert kept_loss_factor(batch, keep, "seq-mean-token-sum", None) == pytest.approx(1 / 3)
    assert kept_loss_factor(batch, keep, "seq-mean-token-mean", None) == pytest.approx(1 / 3)
    assert kept_loss_factor(batch, keep, "seq-mean-token-sum-norm", None) == 1.0  # the longest row is kept
    assert kept_loss_factor(batch, [0], "seq-mean-token-sum-norm", None) == pytest.approx(2 / 7)
    assert kept_loss_factor(batch, [0], "seq-mean-token-sum-norm", 96.0) == 1.0
    with pytest.raises(ValueError, match="no row"):
        kept_loss_factor(batch, [], "token-mean", None)
    with pytest.raises(ValueError, match="unknown"):
        kept_loss_factor(batch, keep, "mean", None)


@pytest.mark.parametrize("overrides,key", [
    (["trainer.num_processes=2", "data.train_batch_size=2"], "one process"),
    (["algorithm.spear.enable_trajectory_replay=true"], "enable_trajectory_replay"),
    (["actor.policy_loss=clip_cov"], "needs every row"),
])
def test_settings_it_cannot_run_with_are_config_errors(overrides, key):
    with pytest.raises(ConfigError, match="actor.skip_zero_advantage_rows") as e:
        load_config("cpu", ["actor.skip_zero_advantage_rows=true", *overrides])
    assert key in str(e.value)
