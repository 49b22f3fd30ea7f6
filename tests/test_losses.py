"""Policy losses, loss aggregation and KL estimators on hand-computed tensors
(verl's core_algos.py: agg_loss, compute_policy_loss, kl_penalty; Clip-Cov/KL-Cov
arXiv 2505.22617; GPG as SPEAR's core_algos.py)."""

import math

import pytest
import torch
from torch.testing import assert_close

from serl.algos.losses import (
    POLICY_LOSS_REGISTRY,
    agg_loss,
    get_policy_loss_fn,
    kl_loss,
    kl_penalty,
    replay_loss_config,
)
from serl.config import ActorConfig
from serl.configure import load_config
from serl.errors import ConfigError


def t(xs):
    return torch.tensor(xs, dtype=torch.float32)


def actor(**kw):
    return ActorConfig(**kw)


# ---- aggregation (verl agg_loss) -----------------------------------------------------------

L = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 7 / 3),  # (1+2+4)/3
        ("seq-mean-token-sum", 3.5),  # (3 + 4)/2
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4)/2
        ("seq-mean-token-sum-norm", 7 / 3),  # 7 / L with L = 3, no division by B
    ],
)
def test_agg_modes(mode, expected):
    assert_close(agg_loss(L, M, mode), torch.tensor(expected))


def test_agg_sum_norm_constant_divisor_and_masked_rows():
    assert_close(agg_loss(L, M, "seq-mean-token-sum-norm", loss_scale_factor=7), torch.tensor(1.0))
    with pytest.raises(ValueError):
        agg_loss(L, M, "seq-mean-token-sum-norm", loss_scale_factor=0)
    # a filtered row (all-zero mask) contributes 0 and still counts in B; no NaN
    L3 = torch.cat([L, t([[7.0, 8.0, 9.0]])])
    M3 = torch.cat([M, t([[0.0, 0.0, 0.0]])])
    assert_close(agg_loss(L3, M3, "seq-mean-token-mean"), torch.tensor(5.5 / 3))
    assert_close(agg_loss(L3, M3, "seq-mean-token-sum"), torch.tensor(7 / 3))
    assert_close(agg_loss(L3, M3, "token-mean"), torch.tensor(7 / 3))
    with pytest.raises(ValueError):
        agg_loss(L, M, "sum")


# ---- vanilla PPO clip (verl compute_policy_loss) -------------------------------------------


def one_token(delta, adv):
    old = torch.zeros(1, 1)
    lp = torch.full((1, 1), float(delta), requires_grad=True)
    return lp, old, torch.full((1, 1), float(adv)), torch.ones(1, 1)


def test_vanilla_clip_higher():
    ppo = get_policy_loss_fn("vanilla")
    lp, old, a, m = one_token(math.log(1.5), 1.0)
    loss, met = ppo(old, lp, a, m, actor(clip_ratio_low=0.2, clip_ratio_high=0.28))
    assert_close(loss, torch.tensor(-1.28))  # max(-1.5, -1.28)
    assert met["pg_clipfrac"] == 1.0
    loss.backward()
    assert lp.grad.item() == 0.0  # clipped: no gradient
    lp, old, a, m = one_token(math.log(1.5), 1.0)
    loss, _ = ppo(old, lp, a, m, actor())  # symmetric 0.2
    assert_close(loss, torch.tensor(-1.2))
    # low side: A > 0 and r = 0.5 < 1 - ε: the unclipped term is the max (pessimistic)
    lp, old, a, m = one_token(math.log(0.5), 1.0)
    loss, met = ppo(old, lp, a, m, actor(clip_ratio_low=0.2, clip_ratio_high=0.28))
    assert_close(loss, torch.tensor(-0.5))
    assert met["pg_clipfrac"] == 0.0


def test_vanilla_dual_clip_negative_advantage():
    ppo = get_policy_loss_fn("vanilla")
    lp, old, a, m = one_token(math.log(5.0), -1.0)
    loss, met = ppo(old, lp, a, m, actor(clip_ratio_c=3.0))
    assert_close(loss, torch.tensor(3.0))  # min(max(5, 1.2), 3)
    assert met["pg_clipfrac_lower"] == 1.0
    loss.backward()
    assert lp.grad.item() == 0.0
    lp, old, a, m = one_token(math.log(5.0), -1.0)
    loss, met = ppo(old, lp, a, m, actor(clip_ratio_c=10.0))
    assert_close(loss, torch.tensor(5.0))
    assert met["pg_clipfrac_lower"] == 0.0
    # dual clip never applies to a positive advantage
    lp, old, a, m = one_token(math.log(5.0), 1.0)
    loss, _ = ppo(old, lp, a, m, actor(clip_ratio_c=3.0))
    assert_close(loss, torch.tensor(-1.2))


# ---- Clip-Cov (arXiv 2505.22617) ----------------------------------------------------------

A4 = t([[3.0, 1.0, -1.0, -3.0]])
LP4 = [-0.5, -1.0, -1.5, -2.0]  # mean -1.25 -> cov = A·(lp - mean) = [2.25, 0.25, 0.25, 2.25]


def cov_case():
    lp = torch.tensor([LP4], requires_grad=True)
    return lp, lp.detach().clone(), A4.clone(), torch.ones(1, 4)


def test_clip_cov_zeroes_tokens_in_the_band_only():
    loss_fn = get_policy_loss_fn("clip_cov")
    lp, old, a, m = cov_case()
    # band (1, 5) holds tokens 0 and 3; k = max(int(0.5·4), 1) = 2 -> both cut
    loss, met = loss_fn(old, lp, a, m, actor(clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0))
    assert_close(loss, torch.tensor(0.0))  # (-1 + 1)/4
    assert met["pg_clipfrac"] == 0.5
    loss.backward()
    assert_close(lp.grad, t([[0.0, -1 / 4, 1 / 4, 0.0]]))  # d(-A·r)/dlogπ = -A·r / N
    # band (2.5, 5) is empty -> plain PPO loss
    lp, old, a, m = cov_case()
    loss, met = loss_fn(old, lp, a, m, actor(clip_cov_ratio=0.5, clip_cov_lb=2.5, clip_cov_ub=5.0))
    assert_close(loss, torch.tensor(0.0))
    assert met["pg_clipfrac"] == 0.0
    loss.backward()
    assert_close(lp.grad, t([[-3 / 4, -1 / 4, 1 / 4, 3 / 4]]))
    # ub is exclusive: band (0.2, 2.25) excludes the 2.25 tokens
    lp, old, a, m = cov_case()
    _, met = loss_fn(old, lp, a, m, actor(clip_cov_ratio=1.0, clip_cov_lb=0.2, clip_cov_ub=2.25))
    assert met["pg_clipfrac"] == 0.5  # tokens 1 and 2


def test_clip_cov_random_choice_of_k_and_ppo_clipped_excluded():
    loss_fn = get_policy_loss_fn("clip_cov")
    seen = set()
    for seed in range(20):
        lp, old, a, m = cov_case()
        g = torch.Generator().manual_seed(seed)
        # k = max(int(0.25·4), 1) = 1 of the two candidates, uniformly at random
        loss, met = loss_fn(old, lp, a, m, actor(clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=5.0), generator=g)
        loss.backward()
        cut = [i for i in range(4) if lp.grad[0, i].item() == 0.0]
        assert len(cut) == 1 and cut[0] in (0, 3) and met["pg_clipfrac"] == 0.25
        assert_close(loss, torch.tensor(0.75 if cut[0] == 0 else -0.75))
        seen.add(cut[0])
    assert seen == {0, 3}
    # token 0 already clipped by PPO (A > 0, r = 2 > 1.28) is no candidate: only token 3 is cut
    lp, old, a, m = cov_case()
    old = old - t([[math.log(2.0), 0.0, 0.0, 0.0]])
    loss, met = loss_fn(old, lp, a, m, actor(clip_cov_ratio=0.5, clip_ratio_high=0.28))
    # tokens: 0 -> max(-6, -3·1.28) = -3.84; 1 -> -1; 2 -> 1; 3 -> cut
    assert_close(loss, torch.tensor((-3.84 - 1 + 1) / 4))
    assert met["pg_clipfrac"] == 0.25
    # no dual clip: A < 0 with a huge ratio is not capped at -A·c
    lp, old, a, m = one_token(math.log(5.0), -1.0)
    loss, _ = loss_fn(old, lp, a, m, actor(clip_ratio_c=3.0, clip_cov_lb=100.0, clip_cov_ub=200.0))
    assert_close(loss, torch.tensor(5.0))


def test_replay_loss_config_fallbacks_and_overrides():
    base = actor()
    r = replay_loss_config(base)
    assert (r.clip_cov_ratio, r.clip_cov_lb, r.clip_cov_ub, r.kl_cov_ratio) == (0.002, 1.0, 40.0, 0.8)
    assert (base.clip_cov_ratio, base.clip_cov_ub) == (0.0002, 5.0)  # untouched
    r = replay_loss_config(actor(clip_cov_ratio_replay=0.02, clip_cov_lb_replay=2.0, clip_cov_ub_replay=60.0))
    assert (r.clip_cov_ratio, r.clip_cov_lb, r.clip_cov_ub) == (0.02, 2.0, 60.0)
    # the replay band (2, 60) cuts both 2.25 tokens of the covariance case at ratio 0.5
    lp, old, a, m = cov_case()
    loss, met = get_policy_loss_fn("clip_cov")(old, lp, a, m, replay_loss_config(actor(clip_cov_ratio_replay=0.5, clip_cov_lb_replay=2.0, clip_cov_ub_replay=60.0)))
    assert met["pg_clipfrac"] == 0.5


# ---- KL-Cov and GPG ---------------------------------------------------------------------


def kl_cov_case():
    lp = torch.tensor([[-0.5, -1.0, -1.5, -2.5]], requires_grad=True)
    # mean -1.375 -> cov = A·(lp - mean) = [2.625, 0.375, 0.125, 3.375]
    delta = t([[0.1, 0.2, 0.3, 0.4]])
    return lp, lp.detach() - delta, A4.clone(), torch.ones(1, 4)


def test_kl_cov_penalises_top_covariance_tokens():
    fn = get_policy_loss_fn("kl_cov")
    base = [-3 * math.exp(0.1), -1 * math.exp(0.2), 1 * math.exp(0.3), 3 * math.exp(0.4)]
    lp, old, a, m = kl_cov_case()
    loss, met = fn(old, lp, a, m, actor(kl_cov_ratio=0.25, ppo_kl_coef=0.5))  # k = 1: token 3
    assert_close(loss, torch.tensor((sum(base) + 0.5 * 0.4) / 4))
    assert_close(torch.tensor(met["ppo_kl"]), torch.tensor(0.25))
    assert met["pg_clipfrac"] == 0.25
    lp, old, a, m = kl_cov_case()
    loss, _ = fn(old, lp, a, m, actor(kl_cov_ratio=0.5, ppo_kl_coef=0.5))  # k = 2: tokens 3, 0
    assert_close(loss, torch.tensor((sum(base) + 0.5 * (0.4 + 0.1)) / 4))
    loss.backward()
    # no clipping: every token has the -A·r gradient; tokens 0 and 3 add β·sign(Δ) = +0.5
    expected = [(-3 * math.exp(0.1) + 0.5) / 4, -math.exp(0.2) / 4, math.exp(0.3) / 4, (3 * math.exp(0.4) + 0.5) / 4]
    assert_close(lp.grad, t([expected]))
    # statistics use valid tokens only: masking token 1 moves the top covariance from token 3
    # to token 0. Valid A = [3, -1, -3] (mean -1/3), lp = [-0.5, -1.5, -2.5] (mean -1.5):
    # cov = [10/3, 0, 8/3] -> k = max(1, int(3·0.25)) = 1 -> token 0
    lp, old, a, m = kl_cov_case()
    m[0, 1] = 0
    loss, _ = fn(old, lp, a, m, actor(kl_cov_ratio=0.25, ppo_kl_coef=0.5))
    assert_close(loss, torch.tensor((base[0] + 0.5 * 0.1 + base[2] + base[3]) / 3))


def test_gpg_and_serl_weights_compose():
    fn = get_policy_loss_fn("gpg")
    lp = torch.tensor([[-0.5, -1.0, -1.5, -2.0]], requires_grad=True)
    m = t([[1.0, 1.0, 1.0, 0.0]])
    W = t([[1.1, 0.9, 1.0, 1.0]])  # SERL token weights scale the advantage before the loss
    loss, met = fn(lp.detach() + 0.3, lp, A4 * W, m, actor())
    # -lp·A·W over valid tokens: (0.5·3.3 + 1.0·0.9 - 1.5·1)/3
    assert_close(loss, torch.tensor((1.65 + 0.9 - 1.5) / 3))
    assert met["pg_clipfrac"] == 0.0 and met["ppo_kl"] == pytest.approx(0.3)
    loss.backward()
    assert_close(lp.grad, t([[-3.3 / 3, -0.9 / 3, 1 / 3, 0.0]]))


def test_all_losses_share_the_signature_and_aggregation():
    lp = torch.tensor([[-0.5, -1.0, -1.5, -2.0]])
    for name, fn in POLICY_LOSS_REGISTRY.items():
        loss, met = fn(lp.clone(), lp, A4, torch.ones(1, 4), actor(loss_agg_mode="seq-mean-token-sum"))
        assert loss.dim() == 0 and {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} <= set(met), name
    assert {"vanilla", "clip_cov", "kl_cov", "gpg"} <= set(POLICY_LOSS_REGISTRY)
    # at ratio 1 vanilla = -A summed per sequence (seq-mean-token-sum over 1 row)
    loss, _ = POLICY_LOSS_REGISTRY["vanilla"](lp.clone(), lp, A4, torch.ones(1, 4), actor(loss_agg_mode="seq-mean-token-sum"))
    assert_close(loss, torch.tensor(0.0))
    loss, _ = POLICY_LOSS_REGISTRY["vanilla"](lp.clone(), lp, A4, torch.ones(1, 4),
                                              actor(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=8.0))
    assert_close(loss, torch.tensor(0.0))
    loss, _ = POLICY_LOSS_REGISTRY["vanilla"](lp.clone(), lp, t([[1.0, 1.0, 1.0, 1.0]]), torch.ones(1, 4),
                                              actor(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=8.0))
    assert_close(loss, torch.tensor(-0.5))


def test_losses_take_verls_argument_order():
    """old_log_prob first, as verl's compute_policy_loss: swapping the two changes the ratio."""
    import inspect

    from serl.algos.losses import compute_policy_loss

    for name, fn in POLICY_LOSS_REGISTRY.items():
        assert list(inspect.signature(fn).parameters)[:5] == [
            "old_log_prob", "log_prob", "advantages", "response_mask", "config"], name
    assert list(inspect.signature(compute_policy_loss).parameters)[:9] == [
        "old_log_prob", "log_prob", "advantages", "response_mask", "cliprange", "cliprange_low",
        "cliprange_high", "clip_ratio_c", "loss_agg_mode"]
    old, lp = t([[0.0]]), t([[math.log(1.5)]])
    loss, met = compute_policy_loss(old, lp, t([[1.0]]), torch.ones(1, 1), cliprange=0.2, cliprange_high=0.28)
    assert_close(loss, torch.tensor(-1.28))  # r = 1.5 clipped at 1.28
    assert_close(torch.tensor(met["ppo_kl"]), torch.tensor(-math.log(1.5)))
    loss, _ = compute_policy_loss(lp, old, t([[1.0]]), torch.ones(1, 1), cliprange=0.2)
    assert_close(loss, torch.tensor(-1 / 1.5))  # r = 1/1.5 < 0.8, A > 0: max(-r, -0.8) = -r


# ---- KL estimators (verl kl_penalty) ------------------------------------------------------


def test_kl_estimators():
    lp, ref = t([[-1.0]]), t([[-1.5]])
    assert_close(kl_penalty(lp, ref, "k1"), t([[0.5]]))
    assert_close(kl_penalty(lp, ref, "kl"), t([[0.5]]))
    assert_close(kl_penalty(t([[-1.5]]), t([[-1.0]]), "abs"), t([[0.5]]))
    assert_close(kl_penalty(lp, ref, "k2"), t([[0.125]]))
    assert_close(kl_penalty(lp, ref, "mse"), t([[0.125]]))
    k3 = math.exp(-0.5) + 0.5 - 1
    assert_close(kl_penalty(lp, ref, "k3"), t([[k3]]))
    assert_close(kl_penalty(lp, ref, "low_var_kl"), t([[k3]]))
    assert_close(kl_penalty(t([[0.0]]), t([[20.0]]), "low_var_kl"), t([[10.0]]))  # clamp
    with pytest.raises(ValueError):
        kl_penalty(lp, ref, "full")
    m = t([[1.0, 1.0, 0.0]])
    got = kl_loss(t([[-1.0, -2.0, 0.0]]), t([[-1.5, -2.0, 5.0]]), m, "k1", "token-mean")
    assert_close(got, torch.tensor(0.25))


def test_loss_config_validation():
    with pytest.raises(ConfigError, match="actor.kl_loss_type"):
        load_config(None, ["actor.kl_loss_type=k9"])
    with pytest.raises(ConfigError, match="actor.clip_cov_lb"):
        load_config(None, ["actor.clip_cov_lb=6.0"])
    with pytest.raises(ConfigError, match="actor.loss_scale_factor"):
        load_config(None, ["actor.loss_scale_factor=0"])
    c = load_config(None, ["actor.policy_loss=clip_cov", "actor.clip_cov_ratio_replay=0.02"])
    assert c.actor.clip_cov_ratio_replay == 0.02
