"""SPEAR replay buffer, recalibration, schedules and tool-call reward (SPEAR, arXiv 2509.22601)."""

import io
import math

import pytest
import torch
from torch.testing import assert_close

from serl.algos.spear import (
    ReplayBuffer,
    ReplayRow,
    percentile,
    recalibrate_advantages,
    replay_coef,
    toolcall_bonus,
    toolcall_bonus_qwen3,
)
from serl.configure import load_config
from serl.errors import ConfigError


def row(reward, adv, uid="u", traj="t", n=3, masked=False, extra=None):
    mask = torch.zeros(n) if masked else torch.ones(n)
    return ReplayRow(
        prompt_ids=torch.tensor([1, 2]),
        response_ids=torch.arange(n),
        response_mask=mask,
        old_log_probs=torch.full((n,), -0.5),
        advantages=torch.full((n,), float(adv)) * mask,
        reward=float(reward),
        uid=uid,
        traj_uid=traj,
        extra=extra or {},
    )


# ---- tool-call reward and replay coefficient --------------------------------------------


def test_toolcall_bonus_modes():
    assert toolcall_bonus(7, 3, "none", 200) == 0.0
    assert toolcall_bonus(3, 999, "constant", 200) == pytest.approx(0.3)
    assert toolcall_bonus(15, 0, "constant", 200) == 1.0  # saturates at 10 turns
    assert toolcall_bonus(4, 0, "cosine", 200) == pytest.approx(0.4)
    assert toolcall_bonus(4, 100, "cosine", 200) == pytest.approx(0.2)  # (1 + cos(π/2))/2 = 0.5
    assert toolcall_bonus(20, 50, "cosine", 200) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert toolcall_bonus(20, 200, "cosine", 200) == pytest.approx(0.0, abs=1e-12)
    assert toolcall_bonus(20, 201, "cosine", 200) == 0.0
    with pytest.raises(ValueError):
        toolcall_bonus(1, 0, "linear", 200)
    with pytest.raises(ValueError):
        toolcall_bonus(1, -1, "cosine", 200)
    with pytest.raises(ValueError):
        toolcall_bonus(1, 0, "cosine", 0)



def test_toolcall_bonus_qwen3_by_hand():
    """SPEAR's Qwen3 reward (reward.py ``…posneg_decay_qwen3``): wrong answers (score <= 0) get the
    Qwen2.5 bonus min(1, 0.1·k)·ratio, correct ones 1[k > 0]·ratio."""
    b = toolcall_bonus_qwen3
    # step 0 of the cosine schedule: ratio (1 + cos 0)/2 = 1
    assert b(0, 1.0, 0, "cosine", 200) == 0.0  # correct without a tool call: nothing
    assert b(0, -1.0, 0, "cosine", 200) == 0.0  # wrong without a tool call: 0.1·0
    assert b(1, 1.0, 0, "cosine", 200) == 1.0  # correct with one call: the full ratio
    assert b(3, 1.0, 0, "cosine", 200) == 1.0  # ... not 0.1 per call
    assert b(3, -1.0, 0, "cosine", 200) == pytest.approx(0.3)  # wrong: 0.1·3
    assert b(15, -1.0, 0, "cosine", 200) == 1.0  # wrong: saturates at 10 calls
    assert b(4, 0.0, 0, "cosine", 200) == pytest.approx(0.4)  # score 0 counts as wrong (<= 0)
    assert b(4, 10.0, 0, "cosine", 200) == 1.0  # an ALFWorld win (10) counts as correct
    # decay: t = 100 of T = 200 -> ratio (1 + cos(π/2))/2 = 0.5; t = 50 -> (1 + √2/2)/2 = 0.853553...
    assert b(3, 1.0, 100, "cosine", 200) == pytest.approx(0.5)
    assert b(3, -1.0, 100, "cosine", 200) == pytest.approx(0.15)
    assert b(2, 1.0, 50, "cosine", 200) == pytest.approx(0.8535533906)
    assert b(2, 1.0, 200, "cosine", 200) == pytest.approx(0.0, abs=1e-12)
    assert b(2, 1.0, 201, "cosine", 200) == 0.0 and b(2, -1.0, 201, "cosine", 200) == 0.0
    # constant schedule: ratio 1 at any step; none: 0
    assert b(2, 1.0, 999, "constant", 200) == 1.0
    assert b(2, -1.0, 999, "constant", 200) == pytest.approx(0.2)
    assert b(2, 1.0, 5, "none", 200) == 0.0
    for bad in [(-1, 1.0, 0, "cosine", 200), (1, float("nan"), 0, "cosine", 200), (1, 1.0, -1, "cosine", 200),
                (1, 1.0, 0, "cosine", 0), (1, 1.0, 0, "cosine_qwen3", 200)]:
        with pytest.raises(ValueError):
            b(*bad)


def test_toolcall_bonus_modes_qwen3_read_the_outcome():
    # algorithm.use_toolcall_reward=<schedule>_qwen3 -> toolcall_bonus_qwen3 with that schedule
    assert toolcall_bonus(3, 100, "cosine_qwen3", 200, outcome_score=1.0) == pytest.approx(0.5)
    assert toolcall_bonus(3, 100, "cosine_qwen3", 200, outcome_score=-1.0) == pytest.approx(0.15)
    assert toolcall_bonus(0, 0, "constant_qwen3", 200, outcome_score=1.0) == 0.0
    assert toolcall_bonus(1, 7, "constant_qwen3", 200, outcome_score=1.0) == 1.0
    # the Qwen2.5 modes ignore the outcome
    assert toolcall_bonus(3, 100, "cosine", 200, outcome_score=1.0) == pytest.approx(0.15)
    with pytest.raises(ValueError, match="needs the episode's outcome score"):
        toolcall_bonus(3, 100, "cosine_qwen3", 200)


def test_step_table_adds_the_qwen3_bonus_by_outcome():
    from serl.envs.base import Task
    from serl.train.rows import step_table
    from serl.trajectory import Group, Step, Trajectory

    def traj(name, reward, calls):
        s = Step(step_id=0, observation="q", prompt="q", prompt_ids=[1], response_ids=[2], response_text="a",
                 action_mask=[1], action="a", action_valid=True, reward=reward, done=True)
        return Trajectory(uid="g", traj_uid=name, task=Task("math", "t", "gsm8k"), steps=[s], extra={"tool_calls": calls})

    g = Group(uid="g", task=Task("math", "t", "gsm8k"),
              trajectories=[traj("a", 1.0, 2), traj("b", -1.0, 2), traj("c", 1.0, 0)])
    cfg = load_config(None, ["algorithm.use_toolcall_reward=cosine_qwen3", "algorithm.max_toolcall_steps=200"])
    t = step_table([g], 100, cfg)  # ratio 0.5
    assert t.bonus.tolist() == pytest.approx([0.5, 0.1, 0.0])
    assert t.score_raw.tolist() == pytest.approx([1.5, -0.9, 1.0])
    cfg = load_config(None, ["algorithm.use_toolcall_reward=cosine", "algorithm.max_toolcall_steps=200"])
    assert step_table([g], 100, cfg).bonus.tolist() == pytest.approx([0.1, 0.1, 0.0])

def test_replay_coef_cosine_warmup():
    assert replay_coef(0, 1.0, 200) == 0.0
    assert replay_coef(100, 1.0, 200) == pytest.approx(0.5)
    assert replay_coef(50, 1.0, 200) == pytest.approx((1 - math.cos(math.pi / 4)) / 2)
    assert replay_coef(200, 1.0, 200) == pytest.approx(1.0)
    assert replay_coef(300, 0.001, 200) == 0.001
    assert replay_coef(5, 0.3, 0) == 0.3


# ---- recalibration primitives -----------------------------------------------------------


def test_percentile_and_recalibration():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(list(range(11)), 95) == pytest.approx(9.5)
    with pytest.raises(ValueError):
        percentile([], 50)
    r = torch.tensor([10.0, 7.5, 5.0])
    assert_close(recalibrate_advantages(r, 7.5, 2.5, False), torch.tensor([2.5, 0.0, -2.5]))
    assert_close(recalibrate_advantages(r, 7.5, 2.5, True), torch.tensor([2.5, 0.0, -2.5]) / (2.5 + 1e-6))


# ---- admission, staleness, size ---------------------------------------------------------


def test_admission_of_rows_that_record_tool_calls_needs_one():
    buf = ReplayBuffer(weight_decay=0.5)
    rows = [row(1, 1.0, traj="a", extra={"tool_calls": 0}), row(1, 1.0, traj="b", extra={"tool_calls": 2}),
            row(1, 1.0, traj="c"), row(-1, -1.0, traj="d", extra={"tool_calls": 3})]
    met = buf.add_step(rows, global_step=1)
    # SPEAR's math trainer: a positive advantage and >= 1 tool call; rows without the count (ALFWorld) as before
    assert met["replay/admitted"] == 2.0 and [r.traj_uid for r in buf.entries[0][1]] == ["b", "c"]


def test_admission_positive_advantage_only_and_stored_copies():
    buf = ReplayBuffer(weight_decay=0.5)
    rows = [row(10, 1.0), row(0, -1.0), row(10, 0.0), row(10, 2.0, masked=True), row(10, 0.5)]
    met = buf.add_step(rows, global_step=1)
    assert met["replay/admitted"] == 2.0 and buf.num_rows() == 2
    stored = buf.entries[0][1]
    assert [r.step for r in stored] == [1, 1] and [r.reward for r in stored] == [10.0, 10.0]
    rows[0].advantages.fill_(-9.0)  # the trainer reusing its tensors does not touch the buffer
    assert stored[0].advantages.tolist() == [1.0, 1.0, 1.0]
    # a live threshold (the original's dead trajectory_score_threshold)
    buf = ReplayBuffer(score_threshold=0.75)
    buf.add_step(rows[1:], global_step=1)
    assert buf.num_rows() == 0
    buf.add_step([row(10, 1.0)], global_step=2)
    assert buf.num_rows() == 1
    with pytest.raises(ValueError):
        bad = row(1, 1.0)
        bad.old_log_probs = torch.zeros(5)
        buf.add_step([bad], global_step=3)


def test_staleness_newest_entry_and_current_step():
    buf = ReplayBuffer(tolerate_steps=5, weight_decay=0.5)
    for step in (1, 3, 9):
        buf.add_step([row(10, 1.0)], step)
    assert buf.remove_old() == 2  # newest entry 9: |3 - 9| = 6 > 5
    assert [s for s, _ in buf.entries] == [9]
    # the original's reference is the newest entry: a gap without admissions keeps old rows
    buf = ReplayBuffer(tolerate_steps=5, weight_decay=0.5)
    buf.add_step([row(10, 1.0)], 1)
    assert buf.remove_old(current_step=20) == 0 and buf.num_rows() == 1
    strict = ReplayBuffer(tolerate_steps=5, weight_decay=0.5, staleness_reference="current_step")
    strict.add_step([row(10, 1.0)], 1)
    assert strict.remove_old(current_step=6) == 0 and strict.remove_old(current_step=7) == 1
    with pytest.raises(ValueError):
        strict.remove_old()
    # tolerate_steps above 10 is honoured (the original capped it at 10)
    wide = ReplayBuffer(tolerate_steps=15, weight_decay=0.5)
    wide.add_step([row(10, 1.0)], 1)
    wide.add_step([row(10, 1.0)], 15)
    assert wide.remove_old() == 0 and wide.num_rows() == 2


def test_update_is_remove_old_then_add():
    buf = ReplayBuffer(tolerate_steps=2, weight_decay=0.5)
    buf.update([row(10, 1.0)], 1)
    buf.update([row(10, 1.0)], 2)
    met = buf.update([row(10, 1.0)], 5)  # newest entry before insertion is 2: step 1 and 2 kept
    assert met["replay/dropped_stale"] == 0.0 and buf.num_rows() == 3
    met = buf.update([row(10, 1.0)], 6)  # newest 5: drops 1 and 2
    assert met["replay/dropped_stale"] == 2.0 and [s for s, _ in buf.entries] == [5, 6]


def step_rows(step_rewards):
    """Rows of one training step from ``{uid: {traj: [rewards of its steps]}}``, all admitted."""
    return [row(r, 1.0, uid=u, traj=tr) for u, trajs in step_rewards.items() for tr, rs in trajs.items() for r in rs]


def test_baseline_history_fifo_and_p50_size():
    buf = ReplayBuffer(buffer_size=2, baseline_buffer_size=2, weight_decay=-1)
    # group u1: trajectories [10, 10] -> 10 and [0] -> 0: g_mean 5, g_std 5; u2: 10, 10: 10, 0
    buf.add_step(step_rows({"u1": {"t1": [10, 10], "t2": [0]}, "u2": {"t3": [10], "t4": [10]}}), 1)
    assert buf.reward_mean_history == [(1, [5.0, 10.0])] and buf.reward_std_history == [(1, [5.0, 0.0])]
    assert buf.baseline() == (7.5, 2.5)
    # P50 counts rows with reward > 7.5: four of the five rows
    assert buf.size() == 4 and buf.is_full()  # 4 > 1.5 · 2
    buf.add_step(step_rows({"u3": {"t5": [6]}}), 2)
    buf.add_step(step_rows({"u4": {"t6": [8]}}), 3)  # 3 stored means > 2: step 1 is popped first
    assert [s for s, _ in buf.reward_mean_history] == [2, 3]
    assert buf.baseline() == (7.0, 0.0)
    decay = ReplayBuffer(buffer_size=2, weight_decay=0.5)
    decay.add_step([row(0, 1.0), row(0, 1.0), row(0, 1.0)], 1)
    assert decay.size() == 3 and not decay.is_full()  # full means strictly > 1.5 · 2
    decay.add_step([row(0, 1.0)], 2)
    assert decay.size() == 4 and decay.is_full()


def test_p50_size_before_any_history_uses_entry_mean():
    buf = ReplayBuffer(weight_decay=-1)
    buf.entries = [(1, [row(10, 1.0), row(2, 1.0), row(3, 1.0)])]  # a restored pre-history state
    assert buf.size() == 1  # only 10 > mean 5


# ---- consumption -----------------------------------------------------------------------


def test_consume_p50_recalibrates_filters_samples_and_empties():
    buf = ReplayBuffer(buffer_size=2048, weight_decay=-1, norm_adv_by_std=False)
    rows = step_rows({"u1": {"t1": [10, 10], "t2": [0]}, "u2": {"t3": [10], "t4": [10]}})
    rows[2] = row(0, 0.5, uid="u1", traj="t2")  # admitted, but Ã = 0 - 7.5 < 0 at replay
    buf.add_step(rows, 1)
    assert buf.num_rows() == 5
    out, met = buf.consume(torch.Generator().manual_seed(0))
    assert met["replay/candidates"] == 5.0 and met["replay/kept"] == 4.0 and met["replay/used"] == 4.0
    assert met["replay/baseline_p50"] == 7.5 and met["replay/std_p50"] == 2.5
    assert all(r.advantages.tolist() == [2.5, 2.5, 2.5] for r in out)
    assert buf.num_rows() == 0 and buf.reward_mean_history  # emptied; history kept
    # std normalisation and a power-of-two cut: 3 non-negative candidates -> 2 used
    buf = ReplayBuffer(weight_decay=-1, norm_adv_by_std=True)
    buf.add_step(step_rows({"u1": {"t1": [10, 10], "t2": [0]}, "u2": {"t3": [10], "t4": [10]}})[:4], 1)
    out, met = buf.consume(torch.Generator().manual_seed(0))
    assert met["replay/kept"] == 3.0 and len(out) == 2
    assert_close(out[0].advantages, torch.full((3,), 2.5 / (2.5 + 1e-6)))
    # masked tokens keep advantage 0 after recalibration
    buf = ReplayBuffer(weight_decay=-1)
    r = row(10, 1.0)
    r.response_mask = torch.tensor([1.0, 1.0, 0.0])
    buf.add_step([r, row(0, -1.0)], 1)
    out, _ = buf.consume()
    # one trajectory with rows 10 and 0: history [5] -> b = 5, Ã = 10 - 5
    assert out[0].advantages.tolist() == [5.0, 5.0, 0.0]


def test_consume_keeps_zero_recalibrated_advantage():
    # groups u1 (trajectories 10 and 0: mean 5) and u2 (8 and 9: mean 8.5) -> b = 6.75; the
    # row rewarded exactly 6.75 has Ã = 0 and is kept (>= 0), the 5.0 row (Ã < 0) is dropped
    buf = ReplayBuffer(weight_decay=-1)
    buf.add_step([row(10, 1.0, "u1", "a"), row(0, -1.0, "u1", "b"), row(8, 1.0, "u2", "c"), row(9, 1.0, "u2", "d")], 1)
    assert buf.baseline() == (6.75, 2.75)  # stds 5 and 0.5
    buf.entries[0][1].append(row(6.75, 1.0, "u3", "e"))
    buf.entries[0][1].append(row(5.0, 1.0, "u3", "f"))
    out, met = buf.consume(torch.Generator().manual_seed(0))
    assert met["replay/kept"] == 4.0 and len(out) == 4
    assert sorted(r.advantages[0].item() for r in out) == [0.0, 1.25, 2.25, 3.25]


def test_consume_keep_strictly_positive_drops_zero_recalibrated_advantage():
    # the same rows as above; SPEAR's math tree keeps only Ã > 0, so the 6.75 row goes too
    buf = ReplayBuffer(weight_decay=-1, keep_strictly_positive=True)
    buf.add_step([row(10, 1.0, "u1", "a"), row(0, -1.0, "u1", "b"), row(8, 1.0, "u2", "c"), row(9, 1.0, "u2", "d")], 1)
    buf.entries[0][1].append(row(6.75, 1.0, "u3", "e"))
    out, met = buf.consume(torch.Generator().manual_seed(0))
    assert met["replay/kept"] == 3.0  # a = 0 dropped; then 2 (a power of two) of the 3 are drawn
    assert len(out) == 2 and {r.advantages[0].item() for r in out} <= {1.25, 2.25, 3.25}


def test_consume_cap_decay_mode_and_empty():
    buf = ReplayBuffer(buffer_size=2, weight_decay=0.5)
    buf.add_step([row(1, 2.0, traj=f"t{i}") for i in range(7)], 1)
    out, met = buf.consume(torch.Generator().manual_seed(1))
    assert len(out) == 2 and met["replay/kept"] == 7.0  # min(4, buffer_size 2)
    assert all(r.advantages.tolist() == [1.0, 1.0, 1.0] for r in out)  # 2.0 · 0.5
    assert [r.traj_uid for r in out] == sorted(r.traj_uid for r in out)  # buffer order kept
    out, met = buf.consume()
    assert out == [] and met["replay/used"] == 0.0
    one = ReplayBuffer(weight_decay=0.5)
    one.add_step([row(1, 2.0)], 1)
    assert len(one.consume()[0]) == 1  # 1 is a power of two (the original drew 0)


def test_consume_draw_is_seeded():
    def draw(seed):
        buf = ReplayBuffer(weight_decay=0.5)
        buf.add_step([row(1, 1.0, traj=f"t{i}") for i in range(6)], 1)
        return [r.traj_uid for r in buf.consume(torch.Generator().manual_seed(seed))[0]]

    assert draw(3) == draw(3) and len(draw(3)) == 4


# ---- checkpoint round trip ---------------------------------------------------------------


def test_state_dict_round_trip_weights_only():
    buf = ReplayBuffer(buffer_size=4, weight_decay=-1, tolerate_steps=5)
    buf.add_step(step_rows({"u1": {"t1": [10, 10], "t2": [0]}}), 1)
    extra_row = row(10, 1.0, uid="u2", traj="t9", extra={"action_mask": torch.tensor([0, 1, 1]), "note": "x"})
    buf.add_step([extra_row, row(0, -1.0, uid="u2", traj="t8")], 2)
    f = io.BytesIO()
    torch.save(buf.state_dict(), f)
    f.seek(0)
    state = torch.load(f, weights_only=True)
    restored = ReplayBuffer(buffer_size=4, weight_decay=-1, tolerate_steps=5)
    restored.load_state_dict(state)
    assert restored.reward_mean_history == buf.reward_mean_history
    assert restored.reward_std_history == buf.reward_std_history
    assert [s for s, _ in restored.entries] == [1, 2] and restored.num_rows() == buf.num_rows() == 4
    for (_, a_rows), (_, b_rows) in zip(buf.entries, restored.entries):
        for a, b in zip(a_rows, b_rows):
            assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.old_log_probs, b.old_log_probs)
            assert (a.reward, a.uid, a.traj_uid, a.step) == (b.reward, b.uid, b.traj_uid, b.step)
    assert torch.equal(restored.entries[1][1][0].extra["action_mask"], torch.tensor([0, 1, 1]))
    assert restored.size() == buf.size()
    a, ma = buf.consume(torch.Generator().manual_seed(7))
    b, mb = restored.consume(torch.Generator().manual_seed(7))
    assert ma == mb and [r.traj_uid for r in a] == [r.traj_uid for r in b]
    with pytest.raises(ValueError):
        restored.load_state_dict({"version": 2})
    with pytest.raises(KeyError):
        restored.load_state_dict({"version": 1})


# ---- config --------------------------------------------------------------------------------


def test_from_config_and_validation():
    cfg = load_config(None, [
        "algorithm.spear.enable_trajectory_replay=true", "algorithm.spear.weight_decay_trajectory_replay=-1",
        "algorithm.spear.trajectory_tolerate_steps=5", "algorithm.norm_adv_by_std_in_grpo=false",
        "algorithm.use_toolcall_reward=cosine", "algorithm.max_toolcall_steps=200",
    ])
    buf = ReplayBuffer.from_config(cfg)
    assert buf.p50_mode and buf.tolerate_steps == 5 and not buf.norm_adv_by_std and buf.score_threshold == 0.0
    with pytest.raises(ConfigError, match="algorithm.use_toolcall_reward: unknown mode 'linear'; valid: "
                                          r"\['none', 'constant', 'cosine', 'constant_qwen3', 'cosine_qwen3'\]"):
        load_config(None, ["algorithm.use_toolcall_reward=linear"])
    assert load_config(None, ["algorithm.use_toolcall_reward=cosine_qwen3"]).algorithm.use_toolcall_reward == \
        "cosine_qwen3"
    with pytest.raises(ConfigError, match="trajectory_staleness_reference"):
        load_config(None, ["algorithm.spear.trajectory_staleness_reference=oldest"])
    with pytest.raises(ConfigError, match="rollout.rollout_filter_ratio"):
        load_config(None, ["rollout.rollout_filter_ratio=0"])
