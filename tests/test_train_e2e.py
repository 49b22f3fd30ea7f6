"""One SERL training iteration end to end: tiny random model, real ALFWorld fixture games."""

from __future__ import annotations

import json

import pytest
import torch

from serl.configure import load_config
from serl.train.checkpoint import latest_checkpoint
from serl.train.trainer import Trainer


def _cfg(model_dir, out, **extra):
    overrides = [
        f"model.path={model_dir}",
        "model.lora.r=0",  # full fine-tuning (tests/test_lora_train.py covers the cpu recipe's LoRA)
        "env.max_steps=2",
        "env.rollout.n=2",
        "env.num_workers=2",
        "data.train_batch_size=2",
        "data.max_response_length=12",
        "actor.lr=1e-3",
        "actor.ppo_mini_batch_size=4",  # several mini-batches: exercises precomputed old log-probs
        "actor.ppo_micro_batch_size=2",
        "trainer.total_training_steps=1",
        f"trainer.output_dir={out}",
        "trainer.run_name=run",
        "trainer.progress=false",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config("cpu", overrides)


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_one_iteration_then_resume(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path)  # teacher_sync_interval = 10
    tr = Trainer(cfg)
    before = _params(tr.policy)
    teacher_before = _params(tr.teacher.model)
    metrics = tr.train_iteration()
    after = _params(tr.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    # the teacher is frozen: one update < teacher_sync_interval, so it is bit-identical
    assert tr.update_step == 1 and "serl/teacher_synced" not in metrics
    for k, v in _params(tr.teacher.model).items():
        assert torch.equal(v, teacher_before[k]), k
    # the rollout copy follows the policy
    for k, v in tr.rollout_model.named_parameters():
        assert torch.equal(v, after[k].to(v.dtype)), k
    for key in ("episode/success_rate", "actor/pg_loss", "serl_action_mask/effective_lambda",
                "serl/reprompt_sample_fraction", "critic/advantages/mean", "timing/update_s"):
        assert key in metrics, key
    assert metrics["serl_action_mask/effective_lambda"] == pytest.approx(0.5)
    assert metrics["episode/num_trajectories"] == 4
    # make the teacher differ from the base model, so the resume check below is meaningful
    tr.teacher.sync_from(tr.policy)
    tr.logger.log(tr.iteration, metrics)
    ck = tr.save()
    teacher_saved = _params(tr.teacher.model)
    assert any(not torch.equal(teacher_saved[k], teacher_before[k]) for k in teacher_saved)
    tr.close()

    run_dir = tmp_path / "run"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["iteration"] == 1
    assert (run_dir / "config.yaml").exists()
    assert any((run_dir / "tensorboard").iterdir())
    assert latest_checkpoint(run_dir) == ck
    # the teacher was just synced: it equals the policy cast to its dtype, so it is not stored twice
    assert {p.name for p in ck.iterdir()} >= {"policy.safetensors", "optimizer.pt", "state.pt"}
    assert not (ck / "teacher.safetensors").exists()

    # resume: counters, teacher (θ1, not the base model) and policy are restored
    cfg2 = _cfg(tiny_model_dir, tmp_path, **{"trainer.total_training_steps": 2})
    tr2 = Trainer(cfg2, run_dir=run_dir, resume=True)
    try:
        assert tr2.iteration == 1 and tr2.update_step == 1
        for k, v in _params(tr2.teacher.model).items():
            assert torch.equal(v, teacher_saved[k]), k
        for k, v in _params(tr2.policy).items():
            assert torch.equal(v, after[k]), k
        assert tr2.state.sampler.state_dict() == tr.state_dict()["sampler"]
    finally:
        tr2.close()


def test_serl_off_trains_plain_grpo_without_teacher(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path, **{"algorithm.serl.enable": "false"})
    tr = Trainer(cfg)
    try:
        assert tr.teacher is None
        m = tr.train_iteration()
        assert "serl_action_mask/effective_lambda" not in m
        assert tr.update_step == 1
    finally:
        tr.close()


def _two_iterations(tr: Trainer) -> list[dict]:
    out = []
    for _ in range(2):
        m = tr.train_iteration()
        tr.logger.log(tr.iteration, m)
        out.append(m)
    return out


def _comparable(m: dict) -> dict:
    """The metrics of an iteration without wall-clock timings and throughputs."""
    return {k: v for k, v in m.items() if not k.startswith(("timing/", "throughput/"))}


def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(tiny_model_dir, tmp_path):
    """2 iterations straight == 1 iteration, save, resume in a new Trainer, 1 iteration: the same
    policy parameters (torch.equal) and the same metrics. SERL on, with the reference KL, an
    entropy bonus, several mini-batches (precomputed old log-probs) and two PPO epochs."""
    extra = {"trainer.total_training_steps": 2, "actor.use_kl_loss": "true", "actor.kl_loss_coef": 0.1,
             "actor.entropy_coeff": 0.01, "actor.ppo_epochs": 2}
    straight = Trainer(_cfg(tiny_model_dir, tmp_path / "a", **extra))
    try:
        ms = _two_iterations(straight)
        p_straight = _params(straight.policy)
    finally:
        straight.close()

    first = Trainer(_cfg(tiny_model_dir, tmp_path / "b", **extra))
    try:
        m1 = first.train_iteration()
        first.logger.log(first.iteration, m1)
        first.save()
    finally:
        first.close()
    resumed = Trainer(_cfg(tiny_model_dir, tmp_path / "b", **extra), run_dir=tmp_path / "b" / "run", resume=True)
    try:
        m2 = resumed.train_iteration()
        p_resumed = _params(resumed.policy)
    finally:
        resumed.close()

    assert "actor/kl_loss" in m2 and "actor/entropy" in m2 and "serl_action_mask/effective_lambda" in m2
    assert _comparable(ms[0]) == _comparable(m1)
    assert _comparable(ms[1]) == _comparable(m2)
    assert p_straight.keys() == p_resumed.keys()
    for k, v in p_straight.items():
        assert torch.equal(v, p_resumed[k]), k


def _scripted_iteration(tiny_model_dir, out, skip: bool, zero_rows: int):
    """One SERL iteration with scripted replies (tests/report_run.py) whose first ``zero_rows``
    step rows get advantage 0; returns (parameter step, metrics, rows the teacher scored,
    rows with A != 0)."""
    from report_run import ScriptedPolicyEngine

    cfg = _cfg(tiny_model_dir, out, **{"env.max_steps": 3, "data.max_response_length": 40,
                                       "actor.log_prob_micro_batch_size_per_gpu": 1,  # a row's scores alone
                                       "algorithm.serl.skip_zero_advantage_rows": str(skip).lower()})
    import serl.train.trainer as trainer_mod

    tr = Trainer(cfg)
    advantages, score, scored, nonzero = trainer_mod.compute_advantages, tr.scorer.score, [], []
    try:
        tr.engine = ScriptedPolicyEngine(tr.tokenizer)

        def zeroed(table, cfg, adv_fn, metrics):
            adv = advantages(table, cfg, adv_fn, metrics).clone()
            adv[:zero_rows] = 0.0
            nonzero.append(int((adv != 0).sum()))
            return adv

        def spy(model, batch, label=None, *args, **kwargs):
            if label == "teacher":
                scored.append(len(batch))
            return score(model, batch, label, *args, **kwargs)

        trainer_mod.compute_advantages, tr.scorer.score = zeroed, spy
        before = _params(tr.policy)
        m = tr.train_iteration()
        return {k: v - before[k] for k, v in _params(tr.policy).items()}, m, sum(scored), nonzero[0]
    finally:
        trainer_mod.compute_advantages = advantages
        tr.close()


def test_skipping_zero_advantage_rows_in_the_teacher_pass_leaves_the_update_unchanged(tiny_model_dir, tmp_path):
    """``algorithm.serl.skip_zero_advantage_rows``: the teacher scores only the rows with A != 0,
    and the update is bit-identical to the one of scoring every row (the original). Rows are
    scored one by one here, so that a row's teacher log-probs do not depend on its batch-mates'
    padding."""
    d_all, m_all, n_all, nonzero = _scripted_iteration(tiny_model_dir, tmp_path / "all", False, zero_rows=3)
    d_skip, m_skip, n_skip, nonzero_skip = _scripted_iteration(tiny_model_dir, tmp_path / "skip", True, zero_rows=3)
    rows = m_all["episode/num_step_rows"]
    assert nonzero_skip == nonzero and m_skip["episode/num_step_rows"] == rows  # the same rollout
    assert 0 < nonzero <= rows - 3  # some rows train, and at least the 3 zeroed ones do not
    assert n_all == rows and m_all["serl/teacher_scored_fraction"] == 1.0
    assert n_skip == nonzero and m_skip["serl/teacher_scored_fraction"] == pytest.approx(nonzero / rows)
    assert m_skip["actor/pg_loss"] == m_all["actor/pg_loss"]
    assert any(bool(v.abs().max() > 0) for v in d_all.values())
    for k in d_all:  # the same parameter step
        assert torch.equal(d_skip[k], d_all[k]), k
