"""From an iteration's trajectories to its training rows and their advantages.

:func:`step_table` lays the groups out as rows (verl-agent's step rows: one row per step, its
prompt and its response) with the per-row scalars; :func:`filter_rows` applies SPEAR's Dr.BoT
filters; :func:`compute_advantages` asks the estimator registry (:mod:`serl.algos.advantages`).
The row layout is the seam a new trajectory layout plugs into (docs/ARCHITECTURE.md, "Seams").
Not here: the log-probs of the rows (:mod:`serl.train.scoring`) and the update
(:mod:`serl.train.update`).
"""

from __future__ import annotations

from typing import Callable

import torch

from serl.algos.advantages import discounted_step_returns, invalid_action_penalty, prepare_advantage_input
from serl.algos.filters import apply_response_filters, enabled_filters, group_std_filter, response_flags
from serl.algos.spear import toolcall_bonus
from serl.config import Config
from serl.train.batch import StepTable
from serl.train.metrics import advantage_signal_metrics
from serl.trajectory import Group, iter_steps


def step_table(groups: list[Group], step: int, cfg: Config) -> StepTable:
    """Every step row of ``groups`` (``iter_steps`` order) with its scalars, before any filter.

    * ``score_raw`` = episode reward + ``toolcall_bonus(k, step)`` of the row's trajectory, ``k`` =
      :attr:`~serl.trajectory.Trajectory.num_tool_calls` (SPEAR, arXiv 2509.22601; 0 with
      ``algorithm.use_toolcall_reward=none``; the ``*_qwen3`` modes also read the episode reward);
    * ``penalty`` = ``actor.invalid_action_penalty_coef`` on a malformed action (as verl-agent);
    * ``step_returns`` = GiGPO's discounted ``R_t`` with ``algorithm.gamma`` from the raw env
      rewards — here, before the std filter can drop a trajectory's rewarded last step
      (``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``);
    * ``row_mask`` all ones (the response filters come next).

    ``step`` is the 1-based global step of the tool-call bonus's schedule.
    """
    a, alg = cfg.actor, cfg.algorithm
    uids, traj_uids, g_idx, t_idx, score_raw, bonus_col, invalid = [], [], [], [], [], [], []
    gids: dict[str, int] = {}
    tids: dict[str, int] = {}
    bonus_of: dict[str, float] = {}
    rows = []
    for g, t, s in iter_steps(groups):
        if t.traj_uid not in bonus_of:
            bonus_of[t.traj_uid] = toolcall_bonus(t.num_tool_calls, step, alg.use_toolcall_reward,
                                                  alg.max_toolcall_steps, outcome_score=t.episode_reward)
        rows.append(s)
        uids.append(g.uid)
        traj_uids.append(t.traj_uid)
        g_idx.append(gids.setdefault(g.uid, len(gids)))
        t_idx.append(tids.setdefault(t.traj_uid, len(tids)))
        score_raw.append(t.episode_reward + bonus_of[t.traj_uid])
        bonus_col.append(bonus_of[t.traj_uid])
        invalid.append(not s.action_valid)
    n = len(rows)
    traj_index = torch.tensor(t_idx, dtype=torch.long)
    step_rewards = torch.tensor([s.reward for s in rows], dtype=torch.float32)
    step_index = torch.tensor([s.step_id for s in rows], dtype=torch.long)
    invalid_t = torch.tensor(invalid, dtype=torch.bool)
    return StepTable(
        rows=rows, index=torch.arange(n), uids=uids, traj_uids=traj_uids,
        group_index=torch.tensor(g_idx, dtype=torch.long), traj_index=traj_index,
        score_raw=torch.tensor(score_raw, dtype=torch.float32),
        penalty=invalid_action_penalty(invalid_t, a.invalid_action_penalty_coef, a.use_invalid_action_penalty),
        invalid=invalid_t, bonus=torch.tensor(bonus_col, dtype=torch.float32),
        step_rewards=step_rewards, step_index=step_index,
        step_returns=discounted_step_returns(step_rewards, traj_index, alg.gamma, step_index),
        row_mask=torch.ones(n, dtype=torch.float32),
    )


def filter_rows(table: StepTable, cfg: Config, generator: torch.Generator, metrics: dict[str, float]) -> StepTable:
    """The rows that train this iteration (SPEAR's ``fit`` order: filters before advantages).

    1. Dr.BoT response filters (``algorithm.filter_*_responses``, as SPEAR): a flagged row's
       ``row_mask`` becomes 0 — it stays in the batch and in the group statistics;
    2. group std filter (``rollout.rollout_filter_ratio`` / ``_type``, as SPEAR) on the score
       before the invalid-action penalty; 1.0 keeps every row. Its power-of-two trim
       (``rollout.rollout_filter_trim_pow2``) draws from ``generator``.

    Adds the ``filter/*`` and std-filter metrics to ``metrics``; returns ``table`` or its subset.
    """
    enabled = enabled_filters(cfg.algorithm)
    if any(enabled.values()):
        flags = response_flags([s.response_ids for s in table.rows], [s.response_text for s in table.rows],
                               cfg.data.max_response_length)
        row_mask, filter_metrics = apply_response_filters(table.row_mask.unsqueeze(-1), flags, enabled)
        table.row_mask = row_mask.squeeze(-1)
        metrics.update(filter_metrics)
    keep, std_metrics = group_std_filter(table.score_raw.tolist(), table.group_index.tolist(),
                                         table.traj_index.tolist(), cfg.rollout.rollout_filter_ratio,
                                         cfg.rollout.rollout_filter_type, generator=generator,
                                         trim_to_power_of_two=cfg.rollout.rollout_filter_trim_pow2)
    metrics.update(std_metrics)
    if len(keep) == len(table):
        return table
    return table.select(keep.tolist())


def compute_advantages(table: StepTable, cfg: Config, adv_fn: Callable, metrics: dict[str, float]) -> torch.Tensor:
    """One advantage per row from ``adv_fn`` (the ``algorithm.adv_estimator`` of the registry:
    GRPO arXiv 2402.03300, GiGPO arXiv 2505.10978, ...); returns ``[rows]`` float32.

    The estimator's ``prepare`` hook runs first (:func:`serl.algos.advantages.prepare_advantage_input`;
    GiGPO clusters its anchor states there once, for the estimator and for its ``gigpo/*``
    metrics). Adds the ``critic/*`` metrics.
    """
    alg = cfg.algorithm
    data = table.advantage_input()
    metrics.update(prepare_advantage_input(alg.adv_estimator, data, alg))
    adv = adv_fn(data, alg)
    metrics.update({"critic/score/mean": data.scores.mean().item(),
                    "critic/advantages/mean": adv.mean().item(),
                    "critic/advantages/max": adv.max().item(), "critic/advantages/min": adv.min().item()})
    metrics.update(advantage_signal_metrics(adv, data.group_index))
    if alg.use_toolcall_reward != "none":
        metrics["critic/toolcall_bonus/mean"] = table.bonus.mean().item()
    return adv
