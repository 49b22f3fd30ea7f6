"""Every one of the 20 SERL sampling modes runs a training iteration (issue 4, "done when").

One real rollout of the tiny model on the ALFWorld fixture is collected once; each mode then runs
a full ``train_iteration`` on a copy of that batch (the collector is patched to replay it), so the
test exercises contexts → teacher prompts → teacher scoring → weighted update for all 20 modes
without 20 rollouts. The judge modes talk to a local OpenAI-compatible server.
"""

from __future__ import annotations

import copy

import pytest

from serl.hindsight.modes import MODE_NAMES
from serl.configure import load_config
from serl.rollout.collector import Collector
from serl.train.trainer import Trainer

from test_judge import FakeJudge  # the local OpenAI-compatible judge server of tests/test_judge.py


def test_all_twenty_mode_names():
    assert len(MODE_NAMES) == 20
    assert sum(m.startswith("anchor_") for m in MODE_NAMES) == 9
    assert sum(m.startswith("judge_") for m in MODE_NAMES) == 2


@pytest.fixture(scope="module")
def rollout_batch(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("modes")
    cfg = load_config("cpu", [f"model.path={tiny_model_dir}", "env.max_steps=3", "env.rollout.n=2",
                              "data.train_batch_size=2", "data.max_response_length=10",
                              "trainer.progress=false", "trainer.logger=[]", f"trainer.output_dir={out}",
                              "trainer.run_name=collect", "algorithm.serl.enable=false"])
    tr = Trainer(cfg)
    try:
        tr.train_iteration()
        groups = tr.last_groups
    finally:
        tr.close()
    # make the batch informative: one trajectory of each group "won" at its last step
    for g in groups:
        last = g.trajectories[0].steps[-1]
        last.won, last.done, last.reward = True, True, 10.0
    return groups


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_mode_runs_a_training_iteration(mode, tiny_model_dir, rollout_batch, tmp_path, monkeypatch):
    judge = FakeJudge("ok") if mode.startswith("judge_") else None
    try:
        overrides = [f"model.path={tiny_model_dir}", "env.max_steps=3", "env.rollout.n=2",
                     "data.train_batch_size=2", "data.max_response_length=10", "trainer.progress=false",
                     "trainer.logger=[]", f"trainer.output_dir={tmp_path}", "trainer.run_name=m",
                     f"algorithm.serl.sampling_mode={mode}"]
        if judge is not None:
            overrides += [f"algorithm.serl.judge_api_url={judge.url}", "algorithm.serl.judge_model=fake-judge-7b",
                          "algorithm.serl.judge_timeout=5"]
        tr = Trainer(load_config("cpu", overrides))
        monkeypatch.setattr(Collector, "collect", lambda self, *a, **k: copy.deepcopy(rollout_batch))
        # no env is stepped: the pool is never used
        monkeypatch.setattr("serl.train.env_pool.make_pool", lambda cfg, n: _NoPool())
        try:
            m = tr.train_iteration()
        finally:
            tr.close()
        assert tr.update_step == 1
        assert m["serl_action_mask/effective_lambda"] == pytest.approx(0.5)
        frac = m["serl/reprompt_sample_fraction"]
        if mode == "immediate_feedback" or mode.startswith("anchor_") and mode != "anchor_immediate_feedback":
            assert frac == 1.0, (mode, {k: v for k, v in m.items() if k.startswith("serl/")})  # every row has feedback / an anchor table
        if mode.startswith("judge_"):
            assert frac == 1.0 and m["serl/judge_failure_fraction"] == 0.0 and judge.requests
        if mode.startswith("successful_sample") and mode != "successful_sample_or_immediate_feedback":
            # conjunctive: only rows of a group with a *second* success (none here) or failed
            # trajectories whose group has a success get S
            assert 0.0 < frac < 1.0, mode
    finally:
        if judge is not None:
            judge.stop()


class _NoPool:
    def reset_async(self, tasks):
        pass

    def close(self):
        pass
