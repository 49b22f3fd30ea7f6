"""SERL's selective token weights, the λ schedule, and the teacher sync rule.

Paper: "What and When to Distill: Selective Hindsight Distillation for Multi-Turn Agents"
(arXiv 2605.19447); code ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/core_algos.py``
(``compute_serl_action_mask_reweighted_advantages``) and the actor worker's update loop
(``verl/workers/actor/dp_actor.py``). The privileged contexts the teacher sees are built in
:mod:`serl.hindsight`; ``algorithm.serl`` is checked by :meth:`serl.config.SerlConfig.validate`
and :func:`serl.hindsight.modes.check_config`.
"""

from __future__ import annotations

from typing import Sequence

import torch


def effective_lambda(update_step: int, mixing_lambda: float, lambda_decay_steps: int) -> float:
    """λ_eff(u) = λ0 · max(0, 1 − u / D); D = 0 means constant λ0 (the original's linear decay).

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
    (``u % teacher_sync_interval == 0``; a hard copy, no EMA, as the original). Interval <= 0
    means never."""
    return teacher_sync_interval > 0 and completed_updates > 0 and completed_updates % teacher_sync_interval == 0


def serl_token_weights(
    advantages: torch.Tensor,
    student_logprob: torch.Tensor,
    teacher_logprob: torch.Tensor,
    selected: torch.Tensor,
    lam: float,
    weight_clip: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Selective, sign-aware token weights W (``compute_serl_action_mask_reweighted_advantages``,
    ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/core_algos.py``).

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
        ``(W, metrics)``; ``W`` is ``[batch, resp_len]`` float32 in [1−λc, 1+λc]. Metrics are the
        original's ``serl_action_mask/*`` values (``weight_mean/max/min`` of the clipped w and
        ``delta_abs_mean`` over selected tokens, ``clipped_fraction``, ``empty_target_batch``).
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


def teacher_rows(has_context: Sequence[bool], advantages: torch.Tensor, row_mask: torch.Tensor,
                 skip_zero_advantage_rows: bool = True) -> list[int]:
    """The rows whose teacher log-probs can change the update: the indices the teacher scores.

    A row's SERL term is ``A·W`` on its tokens (:func:`serl_token_weights`). Where ``A = 0``
    exactly, ``sign(A) = 0``, so ``s = 0``, ``w = 1`` and ``W = 1``; and ``A·W = 0`` whatever the
    teacher's log-probs. Where the Dr.BoT row mask is 0, the row's tokens are masked out of the
    loss. In both cases the teacher forward pass of that row is wasted work. The original
    (``OliverLeeXZ/SERL@5a2a85b:verl/workers/actor/dp_actor.py``, ``update_policy``) runs the
    teacher over every row of each micro-batch that has a context. With
    ``skip_zero_advantage_rows`` those rows are left out. The loss and the gradients are
    unchanged; the ``serl_action_mask/*`` weight metrics then cover only the scored rows. Early
    in sparse-reward training most groups have all-equal rewards, and this skips most of the
    teacher's work.

    Args:
        has_context: per row, whether the row has a privileged teacher prompt.
        advantages: ``[rows]`` the rows' advantages (only ``== 0`` is tested: no tolerance).
        row_mask: ``[rows]`` 0/1 Dr.BoT row mask (0: the row trains nothing).
        skip_zero_advantage_rows: False = every row with a context (the original).

    Returns:
        The ascending row indices to score.

    Raises:
        ValueError: the three per-row inputs differ in length.
    """
    n = len(has_context)
    if advantages.shape != (n,) or row_mask.shape != (n,):
        raise ValueError(f"has_context has {n} rows, advantages {tuple(advantages.shape)}, "
                         f"row_mask {tuple(row_mask.shape)}: expected ({n},) each")
    if not skip_zero_advantage_rows:
        return [i for i in range(n) if has_context[i]]
    trains = ((advantages != 0) & (row_mask != 0)).tolist()
    return [i for i in range(n) if has_context[i] and trains[i]]
