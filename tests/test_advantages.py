"""Advantage estimators on hand-computed cases (GRPO arXiv 2402.03300, GiGPO arXiv 2505.10978)."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from serl.algos.advantages import (
    ADVANTAGE_REGISTRY,
    AdvantageInput,
    anchor_group_sizes,
    anchor_groups,
    discounted_step_returns,
    get_advantage_fn,
    gigpo_step_returns,
    invalid_action_penalty,
    prepare_advantage_input,
)
from serl.config import AlgorithmConfig, ConfigError, GiGPOConfig
from serl.configure import load_config


def cfg(**kw):
    gigpo = kw.pop("gigpo", {})
    c = AlgorithmConfig(**kw)
    c.gigpo = GiGPOConfig(**gigpo)
    return c


def t(xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype)


# group 0: trajectory 0 has two rows (won, score 10), trajectory 1 one row (score 0);
# group 1: a single row (score 5)
BASIC = AdvantageInput(
    scores=t([10.0, 10.0, 0.0, 5.0]),
    group_index=t([0, 0, 0, 1], torch.long),
    traj_index=t([0, 0, 1, 2], torch.long),
)


def test_registry_names():
    assert {"grpo", "drgrpo", "rloo", "reinforce_plus_plus_baseline", "gigpo"} <= set(ADVANTAGE_REGISTRY)
    with pytest.raises(KeyError):
        get_advantage_fn("nope")


def test_grpo_pooled_with_std():
    # pool [10, 10, 0]: mean 20/3, unbiased std sqrt(100/3); singleton group: mean 0, std 1
    adv = get_advantage_fn("grpo")(BASIC, cfg(norm_adv_by_std_in_grpo=True, compute_mean_std_cross_steps=True))
    s = math.sqrt(100 / 3) + 1e-6
    assert_close(adv, t([(10 / 3) / s, (10 / 3) / s, (-20 / 3) / s, 5 / (1 + 1e-6)]))
    assert_close(adv[:3], t([1 / math.sqrt(3), 1 / math.sqrt(3), -2 / math.sqrt(3)]), rtol=1e-5, atol=1e-5)


def test_grpo_pooled_without_std():
    adv = get_advantage_fn("grpo")(BASIC, cfg(norm_adv_by_std_in_grpo=False))
    assert_close(adv, t([10 / 3, 10 / 3, -20 / 3, 5.0]))


def test_grpo_per_trajectory_with_and_without_std():
    # one value per trajectory: pool [10, 0]: mean 5, std sqrt(50)
    c = cfg(norm_adv_by_std_in_grpo=False, compute_mean_std_cross_steps=False)
    assert_close(get_advantage_fn("grpo")(BASIC, c), t([5.0, 5.0, -5.0, 5.0]))
    c.norm_adv_by_std_in_grpo = True
    s = math.sqrt(50) + 1e-6
    assert_close(get_advantage_fn("grpo")(BASIC, c), t([5 / s, 5 / s, -5 / s, 5 / (1 + 1e-6)]))


def test_drgrpo_ignores_std_flag():
    adv = get_advantage_fn("drgrpo")(BASIC, cfg(norm_adv_by_std_in_grpo=True))
    assert_close(adv, t([10 / 3, 10 / 3, -20 / 3, 5.0]))


def test_rloo_pooled_and_per_trajectory():
    # pooled n=3: 3/2 (R - 20/3) = R - mean of the two others
    adv = get_advantage_fn("rloo")(BASIC, cfg())
    assert_close(adv, t([5.0, 5.0, -10.0, 5.0]))
    adv = get_advantage_fn("rloo")(BASIC, cfg(compute_mean_std_cross_steps=False))
    assert_close(adv, t([10.0, 10.0, -10.0, 5.0]))


def test_reinforce_plus_plus_baseline_row_and_token_weights():
    data = AdvantageInput(
        scores=t([2.0, 0.0, 4.0, 0.0]),
        group_index=t([0, 0, 1, 1], torch.long),
        traj_index=t([0, 1, 2, 3], torch.long),
    )
    fn = get_advantage_fn("reinforce_plus_plus_baseline")
    # x = [1, -1, 2, -2], mean 0, unbiased var 10/3
    assert_close(fn(data, cfg()), t([1, -1, 2, -2]) / math.sqrt(10 / 3 + 1e-8))
    # token weights [3,1,1,1]: W=6, mean 1/3, var = 102/45 (·W/(W-1) applied)
    data.response_length = t([3, 1, 1, 1])
    expected = (t([1, -1, 2, -2]) - 1 / 3) / math.sqrt(102 / 45 + 1e-8)
    assert_close(fn(data, cfg()), expected)


def test_discounted_step_returns_order_and_errors():
    rewards = t([10.0, 0.0, 0.0, 1.0])
    traj = t([0, 0, 0, 1], torch.long)
    steps = t([2, 0, 1, 0], torch.long)  # rows of trajectory 0 are out of order
    assert_close(discounted_step_returns(rewards, traj, 0.5, steps), t([10.0, 2.5, 5.0, 1.0]))
    assert_close(discounted_step_returns(t([0.0, 0.0, 10.0]), t([0, 0, 0], torch.long), 0.5), t([2.5, 5.0, 10.0]))
    with pytest.raises(ValueError):
        discounted_step_returns(rewards, traj, 0.5, t([0, 0, 1, 0], torch.long))
    with pytest.raises(ValueError):
        discounted_step_returns(rewards, traj, 1.5)


def test_anchor_groups_exact():
    assert anchor_groups(["a", "b", "a", "a"], [0, 0, 0, 1]) == [0, 1, 0, 2]
    # hashable non-strings (e.g. a flattened image) work in exact mode
    assert anchor_groups([(1, 2), (1, 2), (3,)], [5, 5, 5]) == [0, 0, 1]
    assert anchor_group_sizes([0, 1, 0, 2]) == [2, 1, 1]


def test_anchor_groups_similarity_both_backends():
    obs = ["You arrive at cabinet 1.", "You arrive at cabinet 2.", "Nothing happens.", "You arrive at cabinet 1."]
    # 2·23/48 = 0.9583 >= 0.95 under both scores
    for backend in ("rapidfuzz", "difflib"):
        assert anchor_groups(obs, [0, 0, 0, 1], 0.95, backend=backend) == [0, 0, 1, 2]
        assert anchor_groups(obs, [0, 0, 0, 0], 0.96, backend=backend) == [0, 1, 2, 0]


def test_anchor_groups_rapidfuzz_scores_lcs_difflib_does_not():
    # LCS ratio 10/14 = 0.714; Ratcliff/Obershelp 8/14 = 0.571
    assert anchor_groups(["babaabb", "abbbabb"], [0, 0], 0.65, backend="rapidfuzz") == [0, 0]
    assert anchor_groups(["babaabb", "abbbabb"], [0, 0], 0.65, backend="difflib") == [0, 1]


def test_anchor_groups_greedy_order():
    a, b, c = "abcdefghij", "abcdefghiX", "abcdefghXX"  # a~b 0.9, b~c 0.9, a~c 0.8
    assert anchor_groups([a, c, b], [0, 0, 0], 0.85) == [0, 1, 0]
    # visiting c first makes c the representative that b joins
    assert anchor_groups([a, c, b], [0, 0, 0], 0.85, order=[1, 0, 2]) == [1, 0, 0]


def test_anchor_groups_errors():
    with pytest.raises(ValueError):
        anchor_groups(["a"], [0], 1.0)
    with pytest.raises(ValueError):
        anchor_groups(["a"], [0], 0.0)
    with pytest.raises(ValueError):
        anchor_groups(["a", "b"], [0])
    with pytest.raises(TypeError):
        anchor_groups([(1,)], [0], 0.5)
    with pytest.raises(ValueError):
        anchor_groups(["a"], [0], 0.5, backend="levenshtein")


def worked_example():
    """The GiGPO paper's Fig. 3 case (arXiv 2505.10978): four trajectories reach the same search
    page; two succeed 2 and 4 steps later (r = 1), two fail. γ = 0.95."""
    obs, traj, rew, score, step = [], [], [], [], []
    plans = [("a", 2, 1.0), ("b", 4, 1.0), ("c", 1, 0.0), ("d", 1, 0.0)]
    for ti, (name, extra, r) in enumerate(plans):
        for k in range(extra + 1):
            obs.append("the search page" if k == 0 else f"{name}{k}")
            traj.append(ti)
            step.append(k)
            rew.append(r if k == extra else 0.0)
            score.append(r)
    n = len(obs)
    return AdvantageInput(
        scores=t(score),
        group_index=torch.zeros(n, dtype=torch.long),
        traj_index=t(traj, torch.long),
        step_rewards=t(rew),
        step_index=t(step, torch.long),
        anchor_obs=obs,
    )


PAGE_ROWS = [0, 3, 8, 10]  # the shared-page row of trajectories a, b, c, d


def test_gigpo_worked_example_mean_norm():
    data = worked_example()
    c = cfg(gamma=0.95, compute_mean_std_cross_steps=False, gigpo={"mode": "mean_norm", "step_advantage_w": 1.0})
    adv = get_advantage_fn("gigpo")(data, c)
    # step returns 0.95^2 = 0.9025, 0.95^4 = 0.81450625, 0, 0; mean 0.4292515625
    mu = (0.9025 + 0.81450625) / 4
    assert_close(adv[PAGE_ROWS], t([0.5 + 0.9025 - mu, 0.5 + 0.81450625 - mu, -0.5 - mu, -0.5 - mu]))
    assert_close(adv[PAGE_ROWS], t([0.9732484375, 0.8852546875, -0.9292515625, -0.9292515625]))
    # the paper example's rounded figures: +0.97, +0.89, -0.93, -0.93
    assert [round(x, 2) for x in adv[PAGE_ROWS].tolist()] == [0.97, 0.89, -0.93, -0.93]
    # every other state is a singleton: A^S = 0, only the episode term remains
    others = [i for i in range(len(adv)) if i not in PAGE_ROWS]
    assert_close(adv[others], t([0.5, 0.5, 0.5, 0.5, 0.5, 0.5, -0.5, -0.5]))


def test_gigpo_worked_example_mean_std_norm_and_weight():
    data = worked_example()
    c = cfg(gamma=0.95, compute_mean_std_cross_steps=False, gigpo={"mode": "mean_std_norm", "step_advantage_w": 0.5})
    adv = get_advantage_fn("gigpo")(data, c)
    ep = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # pool [1,1,0,0]: std sqrt(1/3)
    v = [0.9025, 0.81450625, 0.0, 0.0]
    mu = sum(v) / 4
    sd = math.sqrt(sum((x - mu) ** 2 for x in v) / 3) + 1e-6
    expected = [ep + 0.5 * (v[0] - mu) / sd, ep + 0.5 * (v[1] - mu) / sd, -ep + 0.5 * (-mu) / sd, -ep + 0.5 * (-mu) / sd]
    assert_close(adv[PAGE_ROWS], t(expected))


def test_gigpo_invalid_penalty_enters_step_return_and_precomputed_returns():
    data = worked_example()
    returns = discounted_step_returns(data.step_rewards, data.traj_index, 0.95, data.step_index)
    penalty = invalid_action_penalty(torch.tensor([i == 8 for i in range(len(returns))]), 0.1)
    assert_close(penalty.sum(), torch.tensor(0.1))
    data.penalty = penalty
    got = gigpo_step_returns(data, 0.95)
    assert_close(got[PAGE_ROWS], t([0.9025, 0.81450625, -0.1, 0.0]))
    # precomputed returns win over step_rewards (which are zeroed here to prove it)
    data2 = worked_example()
    data2.step_returns = returns
    data2.step_rewards = torch.zeros_like(returns)
    c = cfg(gamma=0.95, compute_mean_std_cross_steps=False)
    assert_close(get_advantage_fn("gigpo")(data2, c), get_advantage_fn("gigpo")(worked_example(), c))
    data2.penalty = penalty
    adv = get_advantage_fn("gigpo")(data2, c)
    mu = (0.9025 + 0.81450625 - 0.1) / 4
    assert_close(adv[8], torch.tensor(-0.5 + (-0.1 - mu)))
    assert_close(invalid_action_penalty(torch.tensor([True]), 0.1, enabled=False), t([0.0]))


def test_gigpo_anchor_index_equals_anchor_obs_and_similarity():
    data = worked_example()
    c = cfg(gamma=0.95)
    by_obs = get_advantage_fn("gigpo")(data, c)
    data.anchor_index = torch.tensor(anchor_groups(data.anchor_obs, [0] * len(data.anchor_obs)))
    assert_close(get_advantage_fn("gigpo")(data, c), by_obs)
    # similarity: "a1"/"b1"/... are 0.5-similar (one shared char of two), so with thresh 0.4
    # every one-step-later state of a, b, c, d joins one cluster
    data = worked_example()
    c = cfg(gamma=0.95, gigpo={"enable_similarity": True, "similarity_thresh": 0.4})
    ids = anchor_groups(data.anchor_obs, [0] * len(data.anchor_obs), 0.4)
    assert ids[1] == ids[4] == ids[9] == ids[11]
    data.anchor_index = None
    adv_sim = get_advantage_fn("gigpo")(data, c)
    data.anchor_index = torch.tensor(ids)
    assert_close(adv_sim, get_advantage_fn("gigpo")(data, c))


def test_prepare_hook_clusters_once_and_gives_the_step_group_metrics():
    data = worked_example()  # 12 rows: the shared page (4 rows) + 8 states seen once
    m = prepare_advantage_input("gigpo", data, cfg(gamma=0.95))
    assert m == {"gigpo/step_groups": 9.0, "gigpo/size1_group_fraction": pytest.approx(8 / 9),
                 "gigpo/mean_group_size": pytest.approx(12 / 9)}
    assert data.anchor_index[PAGE_ROWS].unique().numel() == 1 and data.anchor_index.unique().numel() == 9
    clustered = get_advantage_fn("gigpo")(data, cfg(gamma=0.95))  # reuses data.anchor_index
    data.anchor_obs = None
    assert_close(get_advantage_fn("gigpo")(data, cfg(gamma=0.95)), clustered)
    grpo = worked_example()
    assert prepare_advantage_input("grpo", grpo, cfg()) == {} and grpo.anchor_index is None


def test_gigpo_cross_steps_episode_term_matches_grpo_without_std():
    data = worked_example()
    c = cfg(gamma=0.95, norm_adv_by_std_in_grpo=False, gigpo={"step_advantage_w": 0.0})
    assert_close(get_advantage_fn("gigpo")(data, c), get_advantage_fn("grpo")(data, c))


def test_gigpo_errors():
    data = worked_example()
    with pytest.raises(ValueError):
        get_advantage_fn("gigpo")(data, cfg(gigpo={"mode": "median"}))
    data.anchor_obs = None
    with pytest.raises(ValueError, match="anchor"):
        get_advantage_fn("gigpo")(data, cfg())
    data = worked_example()
    data.step_rewards = None
    with pytest.raises(ValueError, match="step_r"):
        get_advantage_fn("gigpo")(data, cfg())
    data = worked_example()
    data.anchor_obs = data.anchor_obs[:-1]
    with pytest.raises(ValueError, match="rows"):
        get_advantage_fn("gigpo")(data, cfg())


def test_config_defaults_and_validation():
    c = load_config(None)
    assert c.algorithm.adv_estimator == "grpo" and c.actor.policy_loss == "vanilla"
    assert c.algorithm.gamma == 1.0 and c.algorithm.gigpo.mode == "mean_norm"
    with pytest.raises(ConfigError, match="algorithm.gigpo.mode"):
        load_config(None, ["algorithm.gigpo.mode=median"])
    with pytest.raises(ConfigError, match="similarity_thresh"):
        load_config(None, ["algorithm.gigpo.similarity_thresh=1.0"])
    assert load_config(None, ["algorithm.adv_estimator=gigpo", "algorithm.gamma=0.95"]).algorithm.gamma == 0.95


def test_estimators_accept_namespace_config():
    ns = SimpleNamespace(compute_mean_std_cross_steps=True, norm_adv_by_std_in_grpo=False)
    assert_close(get_advantage_fn("grpo")(BASIC, ns), t([10 / 3, 10 / 3, -20 / 3, 5.0]))


def test_identical_scores_give_exactly_zero_advantage():
    # seven rows of one group, all scored -0.1 (every action malformed, no win). By hand: mean
    # -0.1, std 0, so A = 0 / (0 + 1e-6) = 0 exactly. A float32 mean of seven -0.1 misses -0.1
    # by ~1e-8, which the division by 1e-6 used to turn into A ≈ 0.0074 (0.0147 for other n).
    n = 7
    data = AdvantageInput(scores=torch.full((n,), -0.1), group_index=torch.zeros(n, dtype=torch.long),
                          traj_index=torch.arange(n), step_rewards=torch.zeros(n),
                          step_index=torch.zeros(n, dtype=torch.long), anchor_obs=["same room"] * n)
    zero = torch.zeros(n)
    for name, c in [("grpo", cfg()), ("grpo", cfg(compute_mean_std_cross_steps=False)), ("drgrpo", cfg()),
                    ("rloo", cfg()), ("gigpo", cfg(gigpo={"mode": "mean_std_norm"})), ("gigpo", cfg())]:
        adv = get_advantage_fn(name)(data, c)
        assert torch.equal(adv, zero), (name, adv)
        assert adv.dtype == torch.float32
    # GiGPO's step term alone: identical step returns (all -0.1 after the penalty) in one anchor group
    data.penalty = torch.full((n,), 0.1)
    data.scores = torch.linspace(0.0, 1.0, n)
    c = cfg(gigpo={"mode": "mean_std_norm"})
    ep_only = get_advantage_fn("gigpo")(data, cfg(gigpo={"mode": "mean_std_norm", "step_advantage_w": 0.0}))
    assert torch.equal(get_advantage_fn("gigpo")(data, c), ep_only)
    # REINFORCE++-baseline: every x_i = 0, so the whitened advantage is 0 too
    data.scores = torch.full((n,), -0.1)
    assert torch.equal(get_advantage_fn("reinforce_plus_plus_baseline")(data, cfg()), zero)
