"""SERL: the λ schedule, the selective token weights, and the teacher sync rule.

Paper: "What and When to Distill: Selective Hindsight Distillation for Multi-Turn Agents"
(arXiv 2605.19447). Spec: serl.md §2.2 (weights), §6 (teacher). The privileged contexts the
teacher sees are built in :mod:`serl.algos.serl_context`.
"""

from __future__ import annotations

import torch


def effective_lambda(update_step: int, mixing_lambda: float, lambda_decay_steps: int) -> float:
    """λ_eff(u) = λ0 · max(0, 1 − u / D); D = 0 means constant λ0 (serl.md §2.2).

    Args:
        update_step: u, the number of completed policy updates (0 for the first update).
        mixing_lambda: λ0 in [0, 1].
        lambda_decay_steps: D >= 0.
    """
    if lambda_decay_steps <= 0:
        return float(mixing_lambda)
    return float(mixing_lambda) * max(0.0, 1.0 - update_step / lambda_decay_steps)


def teacher_needs_sync(completed_updates: int, teacher_sync_interval: int) -> bool:
    """True when, after ``completed_updates`` updates, the teacher gets a hard copy of the policy
    (``u % teacher_sync_interval == 0``; serl.md §6). Interval <= 0 means never."""
    return teacher_sync_interval > 0 and completed_updates > 0 and completed_updates % teacher_sync_interval == 0


def serl_token_weights(
    advantages: torch.Tensor,
    student_logprob: torch.Tensor,
    teacher_logprob: torch.Tensor,
    selected: torch.Tensor,
    lam: float,
    weight_clip: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Selective, sign-aware token weights W (serl.md §2.2, ``compute_serl_action_mask_reweighted_advantages``).

    Δ = log π_T(y_t | privileged prompt) − log π_θ(y_t | prompt) (detached);
    s = clamp(sign(A)·Δ, −20, 20); w = clamp(exp(s), 1−c, 1+c);
    W = (1−λ) + λ·w on selected tokens, 1 elsewhere. The caller multiplies the advantage by W.

    Args:
        advantages: ``[batch, resp_len]`` (or ``[batch, 1]``) GRPO advantages; only the sign is used.
        student_logprob: ``[batch, resp_len]`` log-probs of the sampled tokens under the student.
        teacher_logprob: ``[batch, resp_len]`` the same tokens under the teacher with hindsight.
        selected: ``[batch, resp_len]`` bool: response ∧ row has context ∧ action token.
        lam: λ_eff in [0, 1].
        weight_clip: c.

    Returns:
        ``(W, metrics)``; ``W`` is ``[batch, resp_len]`` float32 in [1−λc, 1+λc]. Metrics follow
        serl.md §8 (``weight_mean/max/min``, ``delta_abs_mean`` over selected tokens,
        ``clipped_fraction``, ``empty_target_batch``).
    """
    with torch.no_grad():
        delta = (teacher_logprob.float() - student_logprob.float()).detach()
        sign = torch.sign(advantages.float()).expand_as(delta)
        s = torch.clamp(sign * delta, -20.0, 20.0)
        w = torch.clamp(torch.exp(s), 1.0 - weight_clip, 1.0 + weight_clip)
        sel = selected.bool()
        W = torch.where(sel, (1.0 - lam) + lam * w, torch.ones_like(w))
        n = int(sel.sum())
        if n == 0:
            metrics = {"weight_mean": 1.0, "weight_max": 1.0, "weight_min": 1.0, "delta_abs_mean": 0.0,
                       "clipped_fraction": 0.0, "empty_target_batch": 1.0}
        else:
            ws = w[sel]
            at_bound = (ws <= 1.0 - weight_clip + 1e-6) | (ws >= 1.0 + weight_clip - 1e-6)
            metrics = {
                "weight_mean": ws.mean().item(),
                "weight_max": ws.max().item(),
                "weight_min": ws.min().item(),
                "delta_abs_mean": delta[sel].abs().mean().item(),
                "clipped_fraction": at_bound.float().mean().item(),
                "empty_target_batch": 0.0,
            }
    return W, metrics


def validate_serl_config(cfg) -> None:
    """Check the ``algorithm.serl`` section; raises ``ConfigError`` naming the bad key."""
    from serl.algos.serl_context import SAMPLING_MODES, TRAJECTORY_FORMATS, canonical_mode
    from serl.config import ConfigError

    if not 0.0 <= cfg.mixing_lambda <= 1.0:
        raise ConfigError(f"algorithm.serl.mixing_lambda: must be in [0, 1], got {cfg.mixing_lambda}")
    if cfg.lambda_decay_steps < 0:
        raise ConfigError("algorithm.serl.lambda_decay_steps: must be >= 0")
    if not 0.0 <= cfg.weight_clip < 1.0:
        raise ConfigError(f"algorithm.serl.weight_clip: must be in [0, 1), got {cfg.weight_clip}")
    if canonical_mode(cfg.sampling_mode) not in SAMPLING_MODES:
        raise ConfigError(
            f"algorithm.serl.sampling_mode: unknown mode {cfg.sampling_mode!r}; valid: {sorted(SAMPLING_MODES)}"
        )
    if cfg.trajectory_format not in TRAJECTORY_FORMATS:
        raise ConfigError(
            f"algorithm.serl.trajectory_format: unknown format {cfg.trajectory_format!r}; valid: {sorted(TRAJECTORY_FORMATS)}"
        )
    if cfg.reprompt_truncation not in ("privileged", "right"):
        raise ConfigError("algorithm.serl.reprompt_truncation: must be 'privileged' or 'right'")
    if cfg.student_logprob not in ("current", "old"):
        raise ConfigError("algorithm.serl.student_logprob: must be 'current' or 'old'")
