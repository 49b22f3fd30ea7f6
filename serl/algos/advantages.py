"""Advantage estimators over step rows, in a registry (verl ``core_algos`` style).

Every estimator has the signature::

    fn(data: AdvantageInput, cfg: AlgorithmConfig) -> torch.Tensor  # [rows]

and returns one advantage per step row; the trainer broadcasts it over the row's response
tokens (gigpo_grpo.md §2, "Broadcast"). Estimators are pure functions of tensors and integer
index arrays, so they are tested on hand-computed cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

ADVANTAGE_REGISTRY: dict[str, Callable] = {}


def register_advantage(name: str):
    """Decorator registering an advantage estimator under ``name`` (``algorithm.adv_estimator``)."""

    def deco(fn):
        ADVANTAGE_REGISTRY[name] = fn
        return fn

    return deco


def get_advantage_fn(name: str) -> Callable:
    """Return the estimator ``name``; raises ``KeyError`` listing the valid names."""
    if name not in ADVANTAGE_REGISTRY:
        raise KeyError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGE_REGISTRY)}")
    return ADVANTAGE_REGISTRY[name]


@dataclass
class AdvantageInput:
    """Per-row inputs of an advantage estimator (all tensors have shape ``[rows]``).

    Attributes:
        scores: scalar score of each row: the episode reward (+ shaping such as SPEAR's tool-call
            bonus) minus the invalid-action penalty of that row (gigpo_grpo.md §1, §4).
        group_index: integer id of the row's group (``uid``).
        traj_index: integer id of the row's trajectory (``traj_uid``).
        step_rewards: env reward of each row's own step, ``[rows]`` (GiGPO's discounted returns).
        step_index: 0-based step id of each row inside its trajectory.
        anchor_index: integer id of the row's anchor-state group (GiGPO), or None.
        invalid: bool, row's action failed the format check.
    """

    scores: torch.Tensor
    group_index: torch.Tensor
    traj_index: torch.Tensor
    step_rewards: Optional[torch.Tensor] = None
    step_index: Optional[torch.Tensor] = None
    anchor_index: Optional[torch.Tensor] = None
    invalid: Optional[torch.Tensor] = None


def group_mean_std(
    values: torch.Tensor, group_index: torch.Tensor, unit_index: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and unbiased std of ``values`` over the row's group.

    Args:
        values: ``[rows]`` float.
        group_index: ``[rows]`` int, the group of each row.
        unit_index: ``[rows]`` int or None. If given, each group's statistics use one value per
            distinct unit (the first row's value of each trajectory: episode-level GRPO);
            if None, every row counts (verl-agent ``compute_mean_std_cross_steps=True``).

    Returns:
        ``(mean, std)``, each ``[rows]``. A group with a single value gets mean 0 and std 1
        (verl ``compute_grpo_outcome_advantage``, gigpo_grpo.md §2).
    """
    mean = torch.zeros_like(values, dtype=torch.float32)
    std = torch.ones_like(values, dtype=torch.float32)
    for g in torch.unique(group_index):
        rows = (group_index == g).nonzero(as_tuple=True)[0]
        if unit_index is None:
            pool = values[rows].float()
        else:
            seen: dict[int, float] = {}
            for r in rows.tolist():
                seen.setdefault(int(unit_index[r]), float(values[r]))
            pool = torch.tensor(list(seen.values()), dtype=torch.float32)
        if pool.numel() > 1:
            mean[rows] = pool.mean()
            std[rows] = pool.std(unbiased=True)
    return mean, std


@register_advantage("grpo")
def grpo_advantage(data: AdvantageInput, cfg) -> torch.Tensor:
    """GRPO outcome advantage over step rows (gigpo_grpo.md §2, serl.md §2.1).

    ``A_i = (R_i - mean_g) / (std_g + 1e-6)`` with ``norm_adv_by_std_in_grpo``, else
    ``A_i = R_i - mean_g`` (Dr.GRPO). Statistics pool every step row of the group
    (``compute_mean_std_cross_steps=True``, the verl-agent default) or one value per trajectory.

    Args:
        data: ``scores``, ``group_index``, ``traj_index`` ``[rows]``.
        cfg: the ``algorithm`` config section.

    Returns:
        ``[rows]`` float32 advantages.
    """
    unit = None if cfg.compute_mean_std_cross_steps else data.traj_index
    mean, std = group_mean_std(data.scores.float(), data.group_index, unit)
    adv = data.scores.float() - mean
    if cfg.norm_adv_by_std_in_grpo:
        adv = adv / (std + 1e-6)
    return adv
