"""Policy losses in a registry, and the one loss-aggregation function (verl ``core_algos``).

Every policy loss has the signature::

    fn(logprob, old_logprob, advantages, response_mask, cfg) -> (loss: Tensor[], metrics: dict)

with ``logprob``/``old_logprob``/``advantages``/``response_mask`` of shape ``[batch, resp_len]``.
``advantages`` are per-token: SERL's selective weights (and any other token weighting) are
applied to them *before* the loss sees them, so every loss composes with SERL.
"""

from __future__ import annotations

from typing import Callable

import torch

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


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask``; 0 when the mask is empty. Shapes broadcast."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate a per-token loss to a scalar (gigpo_grpo.md §6.1).

    Args:
        loss_mat: ``[batch, resp_len]`` per-token loss.
        loss_mask: ``[batch, resp_len]`` 1 for response tokens.
        loss_agg_mode:
            ``token-mean``: Σ m·l / Σ m;
            ``seq-mean-token-sum``: mean_i Σ_t m·l;
            ``seq-mean-token-mean``: mean_i (Σ_t m·l / Σ_t m);
            ``seq-mean-token-sum-norm``: Σ m·l / L with L = ``resp_len`` (the constant padded
            length, as verl: Dr.GRPO's fixed normaliser; no division by the batch size).

    Raises:
        ValueError: unknown mode.
    """
    m = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return (loss_mat * m).sum() / m.sum().clamp_min(1.0)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * m).sum(-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return ((loss_mat * m).sum(-1) / m.sum(-1).clamp_min(1.0)).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return (loss_mat * m).sum() / loss_mat.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(AGG_MODES)}")


@register_policy_loss("vanilla")
def ppo_clip_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with decoupled clip range and dual clip (gigpo_grpo.md §6.2).

    ``r = exp(clamp(logπ − logπ_old, −20, 20))``;
    ``L_clip = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))``;
    for ``A < 0``: ``L = min(L_clip, −A·c)`` (dual clip, Ye et al. 2019), else ``L = L_clip``.

    Args:
        logprob, old_logprob, advantages, response_mask: ``[batch, resp_len]``.
        cfg: the ``actor`` config (``clip_ratio``, ``clip_ratio_low/high``, ``clip_ratio_c``,
            ``loss_agg_mode``).

    Returns:
        ``(loss, metrics)`` with ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl``.
    """
    eps_low = cfg.clip_ratio if cfg.clip_ratio_low is None else cfg.clip_ratio_low
    eps_high = cfg.clip_ratio if cfg.clip_ratio_high is None else cfg.clip_ratio_high
    c = cfg.clip_ratio_c
    neg_kl = torch.clamp(logprob - old_logprob, -20.0, 20.0)
    ratio = torch.exp(neg_kl)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clip_loss = torch.maximum(loss1, loss2)
    loss3 = -advantages * c
    dual = torch.minimum(loss3, clip_loss)
    loss_mat = torch.where(advantages < 0, dual, clip_loss)
    loss = agg_loss(loss_mat, response_mask, cfg.loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss2 > loss1).float(), response_mask).item(),
            "pg_clipfrac_lower": masked_mean(((clip_loss > loss3) & (advantages < 0)).float(), response_mask).item(),
            "ppo_kl": masked_mean(-neg_kl, response_mask).item(),
        }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy ``H = logsumexp(z) − Σ softmax(z)·z``; ``[..., vocab] -> [...]``."""
    logits = logits.float()
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(-1)
