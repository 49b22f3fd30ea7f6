"""SPEAR's intrinsic tool-call reward (arXiv 2509.22601), ``algorithm.use_toolcall_reward``.

Pure functions of a trajectory's tool calls, its outcome and the global step; the trainer adds
the result to the episode reward (:func:`serl.train.rows.step_table`). Sources:
``TencentYoutuResearch/SPEAR@7e84315:verl-agent/agent_system/reward_manager/episode.py``
(ALFWorld, WebShop) and ``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/reward.py`` (math:
``…posneg_decay`` for Qwen2.5, ``…posneg_decay_qwen3`` for Qwen3). Re-exported by
:mod:`serl.algos.spear`.
"""

from __future__ import annotations

import math
from typing import Optional

__all__ = ["TOOLCALL_MODES", "TOOLCALL_SCHEDULES", "toolcall_bonus", "toolcall_bonus_qwen3", "toolcall_ratio"]

#: ``algorithm.use_toolcall_reward`` values (:func:`toolcall_bonus`); ``<schedule>_qwen3`` is
#: SPEAR's Qwen3 reward with that schedule (:func:`toolcall_bonus_qwen3`)
TOOLCALL_MODES = ("none", "constant", "cosine", "constant_qwen3", "cosine_qwen3")
#: the schedules of the bonus (the original's ``use_toolcall_reward`` values)
TOOLCALL_SCHEDULES = ("none", "constant", "cosine")


def toolcall_ratio(global_step: int, schedule: str, max_toolcall_steps: int) -> float:
    """The schedule factor of the tool-call bonus at global step ``t`` (SPEAR's
    ``res_toolcall_ratio``, ``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/reward.py``):
    ``none`` 0, ``constant`` 1, ``cosine`` ``(1 + cos(π·t/T))/2`` for ``t <= T`` and 0 after
    (``T`` = ``algorithm.max_toolcall_steps``); never below 0.

    Raises:
        ValueError: unknown ``schedule``, negative ``global_step``, or ``T <= 0`` with ``cosine``.
    """
    if schedule not in TOOLCALL_SCHEDULES:
        raise ValueError(f"tool-call bonus schedule: unknown {schedule!r}; valid: {list(TOOLCALL_SCHEDULES)}")
    if global_step < 0:
        raise ValueError(f"global_step must be >= 0, got {global_step}")
    if schedule == "none":
        return 0.0
    if schedule == "constant":
        return 1.0
    if max_toolcall_steps <= 0:
        raise ValueError(f"algorithm.max_toolcall_steps must be > 0 for cosine, got {max_toolcall_steps}")
    if global_step > max_toolcall_steps:
        return 0.0
    return max(0.0, (1.0 + math.cos(math.pi * global_step / max_toolcall_steps)) / 2.0)


def toolcall_bonus(num_tool_calls: int, global_step: int, mode: str, max_toolcall_steps: int,
                   outcome_score: Optional[float] = None) -> float:
    """Intrinsic tool-call reward of one trajectory (``algorithm.use_toolcall_reward``;
    ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/agent_system/reward_manager/episode.py``).

    ``bonus_raw = min(1, 0.1 · k)``, ``k`` the trajectory's tool calls (it saturates at 10), then

    - ``none``: 0;
    - ``constant``: ``bonus_raw``;
    - ``cosine``: ``bonus_raw · (1 + cos(π·t/T))/2`` for ``t <= T``, 0 for ``t > T``
      (``t`` = global step, ``T`` = ``algorithm.max_toolcall_steps``);
    - ``constant_qwen3`` / ``cosine_qwen3``: SPEAR's Qwen3 reward with that schedule, which
      depends on the outcome (:func:`toolcall_bonus_qwen3`; needs ``outcome_score``).

    The trainer adds it to the episode reward of *every* step row of the trajectory (so it
    enters the GRPO/GiGPO episode advantage, the std filter and the replay rewards), never to
    GiGPO's step returns. Except in the ``*_qwen3`` modes it is added to correct and wrong
    answers alike (SPEAR's math reward ``…posneg_decay``,
    ``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/reward.py``).

    Args:
        num_tool_calls: ``k`` >= 0: in ALFWorld and WebShop every env step (SPEAR's verl-agent
            counts each env interaction as one call); in math the tool-calling assistant turns
            whose call parsed (:attr:`serl.trajectory.Trajectory.num_tool_calls`).
        global_step: ``t`` >= 0.
        mode: one of :data:`TOOLCALL_MODES`.
        max_toolcall_steps: ``T`` > 0 (only read by the cosine modes).
        outcome_score: the episode reward before the bonus (read only by the ``*_qwen3`` modes).

    Returns:
        The bonus in reward units, in [0, 1].

    Raises:
        ValueError: unknown mode, negative ``global_step`` / ``num_tool_calls``, ``T <= 0``
            with a cosine mode, or no ``outcome_score`` with a ``*_qwen3`` mode.
    """
    if mode not in TOOLCALL_MODES:
        raise ValueError(f"algorithm.use_toolcall_reward: unknown mode {mode!r}; valid: {list(TOOLCALL_MODES)}")
    if num_tool_calls < 0:
        raise ValueError(f"num_tool_calls must be >= 0, got {num_tool_calls}")
    if mode.endswith("_qwen3"):
        if outcome_score is None:
            raise ValueError(f"algorithm.use_toolcall_reward={mode} needs the episode's outcome score")
        return toolcall_bonus_qwen3(num_tool_calls, outcome_score, global_step, mode.removesuffix("_qwen3"),
                                    max_toolcall_steps)
    ratio = toolcall_ratio(global_step, mode, max_toolcall_steps)
    return min(1.0, 0.1 * num_tool_calls) * ratio if ratio > 0.0 else 0.0


def toolcall_bonus_qwen3(num_tool_calls: int, outcome_score: float, global_step: int, schedule: str,
                         max_toolcall_steps: int) -> float:
    """SPEAR's tool-call bonus for Qwen3 (``algorithm.use_toolcall_reward=<schedule>_qwen3``): the
    reward function ``default_compute_score_enforce_toolcall_posneg_decay_qwen3`` of
    ``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/reward.py``, which every
    ``recipe/spear/run_qwen3-32b_*.sh`` script uses (arXiv 2509.22601).

    With ``k`` the tool calls, ``s`` the outcome score and ``r`` = :func:`toolcall_ratio`::

        s <= 0 (wrong):   bonus = min(1, 0.1·k) · r          (the Qwen2.5 bonus)
        s >  0 (correct): bonus = 1[k > 0] · r               (a full +r for any tool use)

    So at step 1 of a cosine schedule a correct answer that called the tool once scores about
    ``1 + 1`` where the Qwen2.5 reward gives ``1 + 0.1``, and a correct answer without a call
    gets nothing.

    Args:
        num_tool_calls: ``k`` >= 0 (:attr:`serl.trajectory.Trajectory.num_tool_calls`).
        outcome_score: ``s``, the episode reward before the bonus (math: +1 right, −1 wrong).
        global_step: ``t`` >= 0.
        schedule: ``none`` | ``constant`` | ``cosine``.
        max_toolcall_steps: ``T`` > 0 (only read by ``cosine``).

    Returns:
        The bonus in reward units, in [0, 1].

    Raises:
        ValueError: unknown ``schedule``, negative ``num_tool_calls`` / ``global_step``, a
            non-finite ``outcome_score``, or ``T <= 0`` with ``cosine``.
    """
    if num_tool_calls < 0:
        raise ValueError(f"num_tool_calls must be >= 0, got {num_tool_calls}")
    if not math.isfinite(outcome_score):
        raise ValueError(f"outcome_score must be finite, got {outcome_score}")
    ratio = toolcall_ratio(global_step, schedule, max_toolcall_steps)
    if ratio == 0.0:
        return 0.0
    if outcome_score <= 0:
        return min(1.0, 0.1 * num_tool_calls) * ratio
    return ratio if num_tool_calls > 0 else 0.0
