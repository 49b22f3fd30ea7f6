"""Issue 5 end to end: every recipe runs a training iteration on the tiny model; GiGPO's anchor
path on a real rollout; the reference-KL loss; SPEAR's buffer filling, replay steps and resume.

One real iteration of the ``gigpo`` recipe (ALFWorld fixture games in env workers) is run once
per module. Its rollout is then made informative — the first trajectory of each group wins at
its last step with well-formed, short responses — and every other test trains on a copy of that
batch (the collector is patched to return it), so each recipe costs one update, not one rollout.
In that batch the losing rows are the tiny random model's own: 12 tokens (= the response cap,
overlong) without an ``<action>`` block (incomplete), so Dr.BoT's filters mask exactly them.
"""

from __future__ import annotations

import copy

import pytest
import torch

from serl.algos.spear import replay_coef
from serl.configure import load_config
from serl.rollout.collector import Collector
from serl.train.batch import collate, response_logprobs
from serl.train.trainer import Trainer

RECIPES = ["grpo", "gigpo", "drbot", "spear", "gigpo_drbot", "gigpo_spear", "serl_gigpo"]
WIN_TEXT = "<action>look</action>"  # 7 tokens: under the 12-token cap, complete (Dr.BoT's incomplete filter)


def _cfg(recipe, model_dir, out, run="run", **extra):
    overrides = [
        f"model.path={model_dir}",
        "model.lora.r=0",  # full fine-tuning, as every recipe but cpu (LoRA since issue 26)
        "env.max_steps=2",
        "env.rollout.n=2",
        "env.num_workers=2",
        "data.train_batch_size=2",
        "data.max_response_length=12",
        "actor.lr=1e-3",
        "actor.ppo_mini_batch_size=4",
        "actor.ppo_micro_batch_size=2",
        "trainer.total_training_steps=1",
        f"trainer.output_dir={out}",
        f"trainer.run_name={run}",
        "trainer.progress=false",
        "trainer.logger=[jsonl]",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(recipe, overrides)


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _changed(before, model) -> bool:
    return any(not torch.equal(before[k], v) for k, v in model.named_parameters())


class _NoPool:
    """Stands in for the env pool when the collector is patched (no env is stepped)."""

    def reset_async(self, tasks):
        pass

    def reset_wait(self):
        return None

    def close(self):
        pass


@pytest.fixture(scope="module")
def real_gigpo_run(tiny_model_dir, tmp_path_factory):
    """One real ``gigpo`` iteration: returns ``(groups, metrics, parameters_changed)``."""
    tr = Trainer(_cfg("gigpo", tiny_model_dir, tmp_path_factory.mktemp("real")))
    try:
        before = _params(tr.policy)
        metrics = tr.train_iteration()
        return tr.last_groups, metrics, _changed(before, tr.policy)
    finally:
        tr.close()


@pytest.fixture(scope="module")
def winning_batch(real_gigpo_run, tokenizer):
    """The real rollout with the first trajectory of each group turned into a short, well-formed
    win (10 at its last step); the other trajectories are left as sampled."""
    groups = copy.deepcopy(real_gigpo_run[0])
    win_ids = tokenizer(WIN_TEXT, add_special_tokens=False).input_ids
    assert len(win_ids) < 12
    for g in groups:
        winner = g.trajectories[0]
        for s in winner.steps:
            s.response_ids, s.response_text, s.action_valid = list(win_ids), WIN_TEXT, True
            s.action_mask = [0] * 3 + [1] * (len(win_ids) - 6) + [0] * 3  # "look"
        last = winner.steps[-1]
        last.won, last.done, last.reward = True, True, 10.0
    return groups


@pytest.fixture
def replay_rollout(winning_batch, monkeypatch):
    """Every ``collect`` returns a fresh copy of the winning batch; no env pool is started."""
    monkeypatch.setattr(Collector, "collect", lambda self, *a, **k: copy.deepcopy(winning_batch))
    monkeypatch.setattr("serl.train.env_pool.make_pool", lambda cfg, n: _NoPool())
    return winning_batch


def _losing_rows(groups) -> int:
    return sum(t.length for g in groups for t in g.trajectories[1:])


# ------------------------------------------------------------------------------ real rollout


def test_gigpo_recipe_real_rollout_groups_anchor_states(real_gigpo_run):
    groups, m, changed = real_gigpo_run
    assert changed and m["training/update_step"] == 1
    rows = [s for g in groups for t in g.trajectories for s in t.steps]
    assert m["episode/num_step_rows"] == len(rows)
    # the G envs of a group start from the same observation, so step 0 forms an anchor group of
    # size G = 2 in each task group: not every anchor group is a singleton
    assert m["gigpo/step_groups"] < len(rows)
    assert m["gigpo/size1_group_fraction"] < 1.0
    assert m["gigpo/mean_group_size"] == pytest.approx(len(rows) / m["gigpo/step_groups"])
    assert all(torch.isfinite(torch.tensor(m[k])) for k in ("actor/pg_loss", "critic/advantages/mean"))


# ------------------------------------------------------------------------------ every recipe


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_one_iteration(recipe, tiny_model_dir, tmp_path, replay_rollout):
    cfg = _cfg(recipe, tiny_model_dir, tmp_path)
    tr = Trainer(cfg)
    try:
        before = _params(tr.policy)
        m = tr.train_iteration()
    finally:
        tr.close()
    assert tr.update_step == 1 and _changed(before, tr.policy)
    assert torch.isfinite(torch.tensor(m["actor/pg_loss"]))
    assert tr.ref is None  # no recipe turns the KL loss on
    a = cfg.algorithm
    # GiGPO: anchor groups over the raw observations
    assert ("gigpo/step_groups" in m) == (a.adv_estimator == "gigpo")
    # SERL only where the recipe says so
    assert ("serl_action_mask/effective_lambda" in m) == a.serl.enable
    # Dr.BoT: the four filters mask the random model's rows (overlong + incomplete), not the wins
    filters_on = a.filter_incomplete_responses
    assert ("filter/masked_rows" in m) == filters_on
    if filters_on:
        assert m["filter/masked_rows"] == m["filter/incomplete_responses"] == _losing_rows(replay_rollout)
        assert cfg.actor.loss_scale_factor == 12.0  # ${data.max_response_length}
        assert cfg.actor.loss_agg_mode == "seq-mean-token-sum-norm"
    # the group std filter: 0.75 of 2 groups keeps 1; 1.0 keeps both
    expected_groups = 1 if cfg.rollout.rollout_filter_ratio < 1 else 2
    assert m["rollout/kept_groups"] == expected_groups
    # SPEAR: the wins have a positive advantage and are admitted; nothing to replay yet
    if a.spear.enable_trajectory_replay:
        assert cfg.actor.policy_loss == "clip_cov"
        assert m["replay/rows_seen"] == m["rollout/kept_rows"]  # the buffer sees the filtered batch
        assert m["replay/admitted"] >= 1 and m["replay/num_rows"] == m["replay/admitted"]
        assert "replay/pg_loss" not in m
        assert all(r.reward > 9 for _, rows in tr.state.replay_buffer.entries for r in rows)
    else:
        assert not any(k.startswith("replay/") for k in m)


@pytest.mark.parametrize("recipe", ["drbot", "gigpo_drbot"])
def test_drbot_filters_mask_rows_without_dropping_them(recipe, tiny_model_dir, tmp_path, real_gigpo_run, monkeypatch):
    """The unmodified real rollout: every row is the random model's (overlong and incomplete), so
    every row is masked. The rows stay in the batch and the statistics, but nothing trains: the
    policy-loss and entropy gradients are exactly zero."""
    groups = real_gigpo_run[0]
    monkeypatch.setattr(Collector, "collect", lambda self, *a, **k: copy.deepcopy(groups))
    monkeypatch.setattr("serl.train.env_pool.make_pool", lambda cfg, n: _NoPool())
    # std filter off, so every row reaches the update
    tr = Trainer(_cfg(recipe, tiny_model_dir, tmp_path, **{"rollout.rollout_filter_ratio": 1.0}))
    try:
        m = tr.train_iteration()
    finally:
        tr.close()
    n_rows = sum(t.length for g in groups for t in g.trajectories)
    assert m["filter/masked_rows"] == m["rollout/kept_rows"] == m["episode/num_step_rows"] == n_rows
    assert m["actor/grad_norm"] == 0.0 and m["actor/pg_loss"] == 0.0 and m["actor/entropy"] == 0.0


def test_recipes_scale_spear_schedules_with_the_run_length():
    for recipe in ("spear", "gigpo_spear"):
        c = load_config(recipe, ["trainer.total_training_steps=40"])
        assert c.algorithm.max_toolcall_steps == c.algorithm.spear.max_replay_loss_steps == 40
        assert c.algorithm.use_toolcall_reward == "cosine" and c.algorithm.spear.weight_decay_trajectory_replay == -1
        assert (c.actor.clip_cov_ratio_replay, c.actor.clip_cov_lb_replay, c.actor.clip_cov_ub_replay) == (0.02, 2.0, 60.0)
    g = load_config("gigpo_spear")
    assert (g.algorithm.adv_estimator, g.algorithm.gamma, g.algorithm.gigpo.mode) == ("gigpo", 0.95, "mean_std_norm")
    assert load_config("cpu").algorithm.serl.enable and load_config("cpu").algorithm.adv_estimator == "grpo"


# ------------------------------------------------------------------------------ KL loss


def test_kl_loss_against_frozen_reference(tiny_model_dir, tmp_path, replay_rollout):
    def run(coef):
        tr = Trainer(_cfg("grpo", tiny_model_dir, tmp_path, run=f"kl{coef}", **{
            "actor.use_kl_loss": "true", "actor.kl_loss_coef": coef, "actor.ppo_mini_batch_size": 2}))
        try:
            init = _params(tr.policy)
            ref_before = _params(tr.ref.model)
            m = tr.train_iteration()
            # the reference is θ0 in the inference dtype, frozen through the update
            for k, v in tr.ref.model.named_parameters():
                assert torch.equal(v, ref_before[k]) and torch.equal(v, init[k].to(v.dtype)), k
                assert not v.requires_grad
            return m, _params(tr.policy)
        finally:
            tr.close()

    m_kl, p_kl = run(1.0)
    m_0, p_0 = run(0.0)
    # later mini-batches see a policy that moved away from θ0: a positive k3 estimate
    assert m_kl["actor/kl_loss"] > 0 and m_kl["actor/kl_coef"] == 1.0
    # the KL term changes the gradient: same data, same start, different weights
    assert any(not torch.equal(p_kl[k], p_0[k]) for k in p_kl)
    # without use_kl_loss there is no reference model and no KL metric
    tr = Trainer(_cfg("grpo", tiny_model_dir, tmp_path, run="nokl"))
    try:
        assert tr.ref is None
    finally:
        tr.close()


# ------------------------------------------------------------------------------ SPEAR replay


def _buffer_equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    if sa["reward_mean_history"] != sb["reward_mean_history"] or sa["reward_std_history"] != sb["reward_std_history"]:
        return False
    if [e["step"] for e in sa["entries"]] != [e["step"] for e in sb["entries"]]:
        return False
    for ea, eb in zip(sa["entries"], sb["entries"]):
        if len(ea["rows"]) != len(eb["rows"]):
            return False
        for ra, rb in zip(ea["rows"], eb["rows"]):
            for k, v in ra.items():
                w = rb[k]
                if isinstance(v, torch.Tensor):
                    if not torch.equal(v, w):
                        return False
                elif k == "extra":
                    if v.keys() != w.keys() or not all(torch.equal(v[x], w[x]) for x in v):
                        return False
                elif v != w:
                    return False
    return True


def test_spear_buffer_fills_replays_and_resumes_with_the_same_buffer(tiny_model_dir, tmp_path, replay_rollout):
    # buffer size 1: full as soon as 2 rows above the P50 baseline are stored (the two wins)
    extra = {"algorithm.spear.trajectory_buffer_size": 1, "trainer.total_training_steps": 3}
    cfg = _cfg("spear", tiny_model_dir, tmp_path, **extra)
    a = Trainer(cfg)
    b = None
    try:
        theta0 = copy.deepcopy(a.policy)
        m1 = a.train_iteration()
        buf = a.state.replay_buffer
        assert m1["replay/admitted"] >= 2 and buf.is_full() and "replay/pg_loss" not in m1
        # stored rows: the behaviour log-probs of the sampled tokens (θ0), the advantage on every
        # unmasked token, the score as the estimator saw it
        row = buf.entries[0][1][0]
        assert row.step == 1 and row.reward > 9 and float(row.response_mask.min()) == 1.0
        assert torch.all(row.advantages > 0)
        bt = collate([row.prompt_ids.tolist()], [row.response_ids.tolist()], a.tokenizer.pad_token_id)
        with torch.no_grad(), a.models.autocast():
            lp0, _ = response_logprobs(theta0, bt, cfg.rollout.temperature)
        torch.testing.assert_close(row.old_log_probs, lp0[0].float(), atol=2e-2, rtol=0)
        a.save()

        # resume: the same buffer rows and baseline history, the same generator state
        b = Trainer(cfg, run_dir=tmp_path / "run", resume=True)
        assert b.iteration == 1 and _buffer_equal(a.state.replay_buffer, b.state.replay_buffer)
        assert torch.equal(a.state.generator.get_state(), b.state.generator.get_state())
        assert b.state.replay_buffer.is_full()

        # step 2 on both: the full buffer is consumed into replay mini-batches, identically
        ma, mb = a.train_iteration(), b.train_iteration()
        for m in (ma, mb):
            assert m["replay/candidates"] == m1["replay/num_rows"]
            assert m["replay/used"] == 1 and m["replay/rows"] == 1  # min(pow2 <= kept, buffer size 1)
            assert m["replay/coef"] == pytest.approx(replay_coef(2, 1.0, 3))
            assert m["replay/grad_norm"] > 0 and "replay/pg_loss" in m
        for k in ("replay/baseline_p50", "replay/pg_loss", "replay/grad_norm", "actor/pg_loss"):
            assert ma[k] == mb[k], k
        pa = _params(a.policy)
        for k, v in b.policy.named_parameters():
            assert torch.equal(v, pa[k]), k
        # consumed, then refilled with step 2's admissions only
        assert [s for s, _ in a.state.replay_buffer.entries] == [2]
        assert _buffer_equal(a.state.replay_buffer, b.state.replay_buffer)
    finally:
        a.close()
        if b is not None:
            b.close()


def test_spear_replay_coefficient_zero_before_warmup_changes_nothing_but_runs(tiny_model_dir, tmp_path,
                                                                                replay_rollout):
    """With c = 0 the replay loss is zero (γ_t = 0), yet the replay mini-batch still runs its own
    optimizer step after the on-policy ones, as the original does."""
    extra = {"algorithm.spear.trajectory_buffer_size": 1, "algorithm.spear.replay_loss_coef": 0.0,
             "trainer.total_training_steps": 2}
    tr = Trainer(_cfg("spear", tiny_model_dir, tmp_path, **extra))
    try:
        tr.train_iteration()
        m = tr.train_iteration()
    finally:
        tr.close()
    assert m["replay/coef"] == 0.0 and m["replay/grad_norm"] == 0.0 and m["replay/rows"] == 1
