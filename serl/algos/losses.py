"""Policy losses in a registry, the loss aggregation and the reference-KL estimators, with verl's
argument order and names (``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``).

Every registered policy loss has the signature::

    fn(old_log_prob, log_prob, advantages, response_mask, config) -> (loss: Tensor[], metrics: dict)

with ``old_log_prob``/``log_prob``/``advantages``/``response_mask`` of shape ``[batch, resp_len]``
(log-probs in nats) and ``config`` the ``actor`` config (``loss_agg_mode``, clip ratios, ...). The
first four arguments are verl's ``compute_policy_loss(old_log_prob, log_prob, advantages,
response_mask, ...)``; serl passes the loss parameters as one config object where verl passes
``cliprange*`` / ``loss_agg_mode`` keywords, and returns the metrics as a dict (``pg_clipfrac``,
``pg_clipfrac_lower``, ``ppo_kl``) where verl returns a tuple. :func:`compute_policy_loss` is the
verl-shaped PPO loss itself, keyword for keyword. ``advantages`` are per-token: SERL's selective
weights (and any other token weighting) are applied to them *before* the loss sees them, so every
loss composes with SERL.

Registered: ``vanilla`` (PPO clip, clip-higher, dual clip), ``clip_cov``, ``kl_cov`` (Clip-Cov /
KL-Cov, arXiv 2505.22617) and ``gpg`` (as SPEAR, arXiv 2509.22601, code
``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/core_algos.py``). A SPEAR replay
mini-batch calls the same function with ``replay_loss_config(config)`` (the ``*_replay``
parameters). The reference-KL estimators are :func:`kl_penalty` / :func:`kl_loss`, the aggregation
:func:`agg_loss` (both verl's names and argument order).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable, Optional

import torch

from serl.errors import ConfigError

if TYPE_CHECKING:
    from serl.config import ActorConfig

POLICY_LOSS_REGISTRY: dict[str, Callable] = {}

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def register_policy_loss(name: str):
    """Decorator registering a policy loss under ``name`` (``actor.policy_loss``)."""

    def deco(fn):
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return deco


def get_policy_loss_fn(name: str) -> Callable:
    """Return the policy loss ``name``; raises ``KeyError`` listing the valid names."""
    if name not in POLICY_LOSS_REGISTRY:
        raise KeyError(f"unknown policy loss {name!r}; valid: {sorted(POLICY_LOSS_REGISTRY)}")
    return POLICY_LOSS_REGISTRY[name]


#: policy losses whose per-token loss is exactly 0 where the advantage is 0, each token on its
#: own (so ``actor.skip_zero_advantage_rows`` leaves their gradient unchanged); Clip-Cov and
#: KL-Cov pick their tokens from statistics over the whole micro-batch
ZERO_ADVANTAGE_ZERO_LOSS = ("gpg", "vanilla")


def check_config(actor: "ActorConfig") -> None:
    """Check the ``actor`` names this module owns: ``policy_loss`` (in the registry),
    ``loss_agg_mode`` (:data:`AGG_MODES`) and ``kl_loss_type`` (:data:`KL_TYPES`). Called by
    :func:`serl.configure.check_config`.

    Raises:
        ConfigError: ``"actor.<key>: unknown ...; valid: [...]"`` for the first unknown name.
    """
    if actor.policy_loss not in POLICY_LOSS_REGISTRY:
        raise ConfigError(f"actor.policy_loss: unknown policy loss {actor.policy_loss!r}; "
                          f"valid: {sorted(POLICY_LOSS_REGISTRY)}")
    if actor.skip_zero_advantage_rows and actor.policy_loss not in ZERO_ADVANTAGE_ZERO_LOSS:
        raise ConfigError(f"actor.skip_zero_advantage_rows: policy loss {actor.policy_loss!r} needs every row "
                          f"(its token selection is over the whole micro-batch); it works with "
                          f"{sorted(ZERO_ADVANTAGE_ZERO_LOSS)}")
    if actor.loss_agg_mode not in AGG_MODES:
        raise ConfigError(f"actor.loss_agg_mode: unknown mode {actor.loss_agg_mode!r}; valid: {list(AGG_MODES)}")
    if actor.kl_loss_type not in KL_TYPES:
        raise ConfigError(f"actor.kl_loss_type: unknown estimator {actor.kl_loss_type!r}; valid: {list(KL_TYPES)}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask``; 0 when the mask is empty. Shapes broadcast."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate a per-token loss to a scalar: verl's ``agg_loss(loss_mat, loss_mask, loss_agg_mode)``
    (``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``; the ``-norm`` mode is Dr.GRPO's,
    arXiv 2503.20783).

    Args:
        loss_mat: ``[batch, resp_len]`` per-token loss.
        loss_mask: ``[batch, resp_len]`` 1 for response tokens.
        loss_agg_mode:
            ``token-mean``: Σ m·l / Σ m;
            ``seq-mean-token-sum``: mean_i Σ_t m·l;
            ``seq-mean-token-mean``: mean_i (Σ_t m·l / Σ_t m);
            ``seq-mean-token-sum-norm``: Σ m·l / L with L = ``resp_len`` (the constant padded
            length, as verl: Dr.GRPO's fixed normaliser; no division by the batch size).
        loss_scale_factor: the ``L`` of ``seq-mean-token-sum-norm`` (``actor.loss_scale_factor``);
            None = ``loss_mat.shape[-1]``. Set it to ``data.max_response_length`` when the
            trainer pads each micro-batch only to its longest response, so the divisor stays
            constant (verl always pads to ``max_response_length``).

    Rows whose mask is all zero (Dr.BoT-filtered rows) contribute 0 in every mode and still
    count in ``B`` for the ``seq-mean-*`` modes. The original's ``seq-mean-token-mean`` gives
    0/0 = NaN for such a row (a departure: here their token-mean is 0).

    Returns:
        A 0-dim tensor.

    Raises:
        ValueError: unknown mode, or ``loss_scale_factor <= 0``.
    """
    m = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return (loss_mat * m).sum() / m.sum().clamp_min(1.0)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * m).sum(-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return ((loss_mat * m).sum(-1) / m.sum(-1).clamp_min(1.0)).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is not None and loss_scale_factor <= 0:
            raise ValueError(f"loss_scale_factor must be > 0, got {loss_scale_factor}")
        denom = loss_mat.shape[-1] if loss_scale_factor is None else float(loss_scale_factor)
        return (loss_mat * m).sum() / denom
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(AGG_MODES)}")


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: Optional[float] = None,
    cliprange_low: Optional[float] = None,
    cliprange_high: Optional[float] = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    *,
    loss_scale_factor: Optional[float] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with decoupled clip range and dual clip: verl's
    ``compute_policy_loss`` (``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``).

    ``r = exp(clamp(logπ − logπ_old, −20, 20))``;
    ``L_clip = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))``;
    for ``A < 0``: ``L = min(L_clip, −A·c)`` (dual clip, Ye et al. 2019, arXiv 1912.09729), else
    ``L = L_clip``; aggregated with :func:`agg_loss`.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``[batch, resp_len]``.
        cliprange: ε, the fallback of ``cliprange_low`` / ``cliprange_high`` when those are None.
        clip_ratio_c: the dual-clip bound ``c`` (> 1).
        loss_agg_mode: see :func:`agg_loss`; loss_scale_factor: its ``L`` (a serl addition).

    Returns:
        ``(loss, metrics)`` with ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` (verl
        returns the same three values as a tuple ``(pg_loss, pg_clipfrac, ppo_kl,
        pg_clipfrac_lower)``).
    """
    eps_low = cliprange if cliprange_low is None else cliprange_low
    eps_high = cliprange if cliprange_high is None else cliprange_high
    neg_kl = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = torch.exp(neg_kl)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clip_loss = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_ratio_c
    dual = torch.minimum(loss3, clip_loss)
    loss_mat = torch.where(advantages < 0, dual, clip_loss)
    loss = agg_loss(loss_mat, response_mask, loss_agg_mode, loss_scale_factor=loss_scale_factor)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss2 > loss1).float(), response_mask).item(),
            "pg_clipfrac_lower": masked_mean(((clip_loss > loss3) & (advantages < 0)).float(), response_mask).item(),
            "ppo_kl": masked_mean(-neg_kl, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("vanilla")
def ppo_clip_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The registered ``vanilla`` loss: :func:`compute_policy_loss` with the ``actor`` config's
    ``clip_ratio``, ``clip_ratio_low/high``, ``clip_ratio_c``, ``loss_agg_mode`` and
    ``loss_scale_factor``. Tensors ``[batch, resp_len]``; returns ``(loss, metrics)``."""
    return compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=config.clip_ratio,
                               cliprange_low=config.clip_ratio_low, cliprange_high=config.clip_ratio_high,
                               clip_ratio_c=config.clip_ratio_c, loss_agg_mode=config.loss_agg_mode,
                               loss_scale_factor=_scale(config))


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy ``H = logsumexp(z) − Σ softmax(z)·z``; ``[..., vocab] -> [...]``."""
    logits = logits.float()
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(-1)


# --------------------------------------------------------------------------------------------
# Helpers shared by the losses
# --------------------------------------------------------------------------------------------


def _scale(config) -> Optional[float]:
    """``actor.loss_scale_factor`` (None if the config has no such key)."""
    return getattr(config, "loss_scale_factor", None)


def _clip_eps(config) -> tuple[float, float]:
    """``(ε_low, ε_high)``: ``clip_ratio_low/high``, each falling back to ``clip_ratio``."""
    eps_low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    eps_high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    return float(eps_low), float(eps_high)


#: the original code's values when a ``*_replay`` key is None
#: (``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/core_algos.py``)
REPLAY_FALLBACKS = {"clip_cov_ratio": 0.002, "clip_cov_lb": 1.0, "clip_cov_ub": 40.0, "kl_cov_ratio": 0.8}


def replay_loss_config(cfg: "ActorConfig") -> "ActorConfig":
    """The ``actor`` config a SPEAR *replay* mini-batch's loss uses (arXiv 2509.22601).

    A shallow copy of ``cfg`` in which ``clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub`` and
    ``kl_cov_ratio`` take the values of their ``*_replay`` keys, or the original code's
    fallbacks (0.002, 1.0, 40.0, 0.8) when those are None. Everything else (clip ratios,
    ``ppo_kl_coef``, ``loss_agg_mode``) is shared with on-policy. Pass the result as ``config`` to
    any registered loss: this is the original's ``is_replay=True`` without a new argument.
    """
    out = copy.copy(cfg)
    for key, fallback in REPLAY_FALLBACKS.items():
        v = getattr(cfg, f"{key}_replay")  # actor.<key>_replay
        setattr(out, key, fallback if v is None else v)
    return out


# --------------------------------------------------------------------------------------------
# KL to the reference policy (verl ``kl_penalty``)
# --------------------------------------------------------------------------------------------

KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (Schulman's k1/k2/k3).

    - ``kl`` / ``k1``: ``logπ − logπ_ref``;
    - ``abs``: ``|logπ − logπ_ref|``;
    - ``mse`` / ``k2``: ``½ (logπ − logπ_ref)²``;
    - ``low_var_kl`` / ``k3``: with ``x = logπ_ref − logπ``, ``e^x − x − 1`` clamped to
      [−10, 10], as verl (``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``;
      Schulman, "Approximating KL divergence", 2020).

    Args:
        logprob, ref_logprob: ``[batch, resp_len]`` log-probs (nats) of the sampled tokens.
        kl_penalty: one of :data:`KL_TYPES` (``actor.kl_loss_type``); verl's argument name.

    Returns:
        ``[batch, resp_len]`` per-token estimate in nats (not masked).

    Raises:
        ValueError: unknown ``kl_penalty``.
    """
    kl_type = kl_penalty
    if kl_type in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_type == "abs":
        return (logprob - ref_logprob).abs()
    if kl_type in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_type in ("low_var_kl", "k3"):
        x = ref_logprob - logprob
        return torch.clamp(torch.exp(x) - x - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl_loss_type {kl_type!r}; valid: {list(KL_TYPES)}")


def kl_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_type: str,
    loss_agg_mode: str,
    *,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """``agg(kl_penalty(logπ, logπ_ref))``: the reference-KL loss the trainer adds as
    ``actor.kl_loss_coef · kl_loss`` when ``actor.use_kl_loss`` (on-policy mini-batches only;
    SPEAR replay gets no reference KL, as the original). Shapes ``[batch, resp_len]``; 0-dim result.
    """
    kld = kl_penalty(logprob, ref_logprob, kl_type)
    return agg_loss(kld, response_mask, loss_agg_mode, loss_scale_factor=loss_scale_factor)


# --------------------------------------------------------------------------------------------
# Clip-Cov, KL-Cov (arXiv 2505.22617) and GPG (as in SPEAR's core_algos.py)
# --------------------------------------------------------------------------------------------


@register_policy_loss("clip_cov")
def clip_cov_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config,
    *,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: PPO clip, plus the gradient cut on random high-covariance tokens (arXiv 2505.22617;
    ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/core_algos.py``).

    With ``r = exp(clamp(logπ − logπ_old, −20, 20))`` (the clamp as ``vanilla``; the original
    has none here, identical inside the range):

    - ``L1 = −A·r``, ``L2 = −A·clip(r, 1−ε_low, 1+ε_high)``; tokens with ``L2 > L1`` are
      "already clipped by PPO";
    - ``cov_t = (A_t − mean_m(A)) · (logπ_t − mean_m(logπ))`` over the micro-batch (masked
      means, detached);
    - candidates: valid, not already clipped, ``clip_cov_lb < cov_t < clip_cov_ub``;
    - ``k = max(⌊clip_cov_ratio · Σm⌋, 1)``; ``min(k, #candidates)`` candidates chosen
      **uniformly at random** (``generator``), not top-k, get their loss multiplied by 0;
    - ``L = max(L1, L2) · corr`` — no dual clip in this mode.

    Args:
        old_log_prob: ``[batch, resp_len]`` behaviour log-probs (stored ones for replay).
        log_prob: ``[batch, resp_len]`` current log-probs (with grad).
        advantages: ``[batch, resp_len]`` per-token advantages (SERL weights already applied).
        response_mask: ``[batch, resp_len]`` 0/1.
        config: the ``actor`` config (``clip_ratio*``, ``clip_cov_ratio``, ``clip_cov_lb``,
            ``clip_cov_ub``, ``loss_agg_mode``, ``loss_scale_factor``); for replay pass
            :func:`replay_loss_config` ``(config)``.
        generator: RNG of the random token choice (None = torch's global RNG).

    Returns:
        ``(loss, metrics)``: ``pg_clipfrac`` = share of valid tokens whose gradient was cut,
        ``pg_clipfrac_lower`` = 0, ``ppo_kl`` = mean(logπ_old − logπ).

    Raises:
        ValueError: ``clip_cov_ratio <= 0``.
    """
    ratio_k = float(config.clip_cov_ratio)
    if ratio_k <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {ratio_k}")
    lb, ub = float(config.clip_cov_lb), float(config.clip_cov_ub)
    eps_low, eps_high = _clip_eps(config)
    neg_kl = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = torch.exp(neg_kl)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    valid = response_mask > 0
    with torch.no_grad():
        clipped_by_ppo = (loss2 > loss1) & valid
        lp = log_prob.detach()
        cov = (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))
        cand = (cov > lb) & (cov < ub) & valid & ~clipped_by_ppo
        idx = torch.nonzero(cand)
        k = max(int(ratio_k * float(response_mask.sum())), 1)
        corr = torch.ones_like(loss1)
        if idx.shape[0] > 0:
            perm = torch.randperm(idx.shape[0], generator=generator)[: min(k, idx.shape[0])]
            pick = idx[perm.to(idx.device)]
            corr[pick[:, 0], pick[:, 1]] = 0.0
    loss_mat = torch.maximum(loss1, loss2) * corr
    loss = agg_loss(loss_mat, response_mask, config.loss_agg_mode, loss_scale_factor=_scale(config))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((corr == 0).float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-neg_kl, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("kl_cov")
def kl_cov_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: unclipped policy gradient plus a |Δlogπ| penalty on the top-covariance tokens
    (arXiv 2505.22617; ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/core_algos.py``).

    ``L_t = −A_t·r_t`` with ``r = exp(clamp(logπ − logπ_old, −20, 20))`` and **no ratio
    clipping**; over the ``N`` valid tokens of the micro-batch
    ``cov_t = (A_t − mean A)(logπ_t − mean logπ)`` (detached), and the top
    ``k = max(1, ⌊N · kl_cov_ratio⌋)`` tokens by ``cov_t`` get
    ``L_t = −A_t·r_t + β·|logπ_t − logπ_old,t|`` with ``β = actor.ppo_kl_coef``.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``[batch, resp_len]``.
        config: the ``actor`` config (``kl_cov_ratio``, ``ppo_kl_coef``, ``loss_agg_mode``); for
            replay pass :func:`replay_loss_config` ``(config)``.

    Returns:
        ``(loss, metrics)``: ``ppo_kl`` = mean |Δlogπ| (as the original reports),
        ``pg_clipfrac`` = share of valid tokens penalised, ``pg_clipfrac_lower`` = 0.

    Raises:
        ValueError: ``kl_cov_ratio <= 0``.
    """
    ratio_k = float(config.kl_cov_ratio)
    if ratio_k <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {ratio_k}")
    beta = float(config.ppo_kl_coef)
    diff = log_prob - old_log_prob
    ratio = torch.exp(torch.clamp(diff, -20.0, 20.0))
    abs_kl = diff.abs()
    base = -advantages * ratio
    valid = response_mask > 0
    with torch.no_grad():
        sel = torch.zeros_like(valid)
        flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        n_valid = flat_valid.numel()
        if n_valid > 0:
            a = advantages.detach().reshape(-1)[flat_valid].float()
            lp = log_prob.detach().reshape(-1)[flat_valid].float()
            cov = (a - a.mean()) * (lp - lp.mean())
            k = max(1, int(n_valid * ratio_k))
            top = torch.topk(cov, min(k, n_valid), largest=True).indices
            sel.reshape(-1)[flat_valid[top]] = True
    loss_mat = torch.where(sel, base + beta * abs_kl, base)
    loss = agg_loss(loss_mat, response_mask, config.loss_agg_mode, loss_scale_factor=_scale(config))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(sel.float(), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(abs_kl, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("gpg")
def gpg_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: plain policy gradient ``L_t = −logπ_t · A_t`` — no ratio, no clipping; the old
    log-probs are not used in the loss (GPG, arXiv 2504.02546; as
    ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/core_algos.py``).

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``[batch, resp_len]``.
        config: the ``actor`` config (``loss_agg_mode``, ``loss_scale_factor``).

    Returns:
        ``(loss, metrics)``: ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0; ``ppo_kl`` =
        mean(logπ_old − logπ) for monitoring only.
    """
    loss_mat = -log_prob * advantages
    loss = agg_loss(loss_mat, response_mask, config.loss_agg_mode, loss_scale_factor=_scale(config))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": 0.0,
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(old_log_prob - log_prob.detach(), response_mask).item(),
        }
    return loss, metrics
