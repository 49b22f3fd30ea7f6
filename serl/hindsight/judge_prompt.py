"""What the LLM judge reads: the chat messages asking for a "Trajectory Judge" critique.

The sections follow the original SERL judge (arXiv 2605.19447; run from
``OliverLeeXZ/SERL@5a2a85b:agent_system/multi_turn_rollout/rollout_loop.py``): the task, the
rollout rendered per ``trajectory_format``, an outcome summary, an optional successful reference
rollout, and a closing instruction. The wording is serl's own. Unlike the original, only a
trajectory's recorded (active) steps are judged. :mod:`serl.hindsight.judge` sends the messages.
"""

from __future__ import annotations

from typing import Optional

from serl.hindsight.rendering import render_steps
from serl.hindsight.success import SuccessRef
from serl.trajectory import Trajectory

SYSTEM_PROMPT = (
    "You review one rollout of an agent acting in a text environment and write a short, concrete "
    "critique called the Trajectory Judge; it will be shown to the agent as privileged guidance. "
    "Your first sentence must state plainly whether the rollout succeeded or failed. Then explain "
    "what went right or wrong with respect to the task goal, and end with the single most important "
    "lesson. Never answer with a placeholder such as 'none' or 'n/a'."
)
FINAL_INSTRUCTION = (
    "Write 2-4 plain sentences. The first sentence must say explicitly whether this rollout "
    "succeeded or failed."
)


def build_judge_messages(
    traj: Trajectory,
    *,
    trajectory_format: str = "response",
    remove_thinking: bool = True,
    max_steps: int = 0,
    include_feedback: bool = True,
    reference: Optional[SuccessRef] = None,
) -> list[dict[str, str]]:
    """Chat messages asking the judge to critique ``traj`` (the original's judge prompt structure).

    User message sections: the task (the first step's prompt), the current rollout rendered per
    ``trajectory_format`` (capped at ``max_steps``, 0 = all), an outcome summary (final success
    yes/no, episode reward with 4 decimals, episode length, the observation after the last action
    = the last step's ``next_prompt``, and with ``include_feedback`` the last immediate feedback),
    the optional reference rollout, and the closing instruction.

    Only the trajectory's recorded (active) steps are used; there are no post-termination rows
    (the original also rendered inactive post-termination rows).

    Raises:
        ValueError: ``traj`` has no steps, or an unknown format.
    """
    if not traj.steps:
        raise ValueError(f"trajectory {traj.traj_uid!r} has no steps to judge")
    last = traj.steps[-1]
    rollout = render_steps(traj.steps, trajectory_format, remove_thinking=remove_thinking, max_steps=max_steps)
    outcome = [
        f"Final success: {'yes' if traj.won else 'no'}",
        f"Episode reward: {traj.episode_reward:.4f}",
        f"Episode length: {traj.length} step(s)",
        f"Final observation after the last action:\n{last.next_prompt.strip() or '(none)'}",
    ]
    if include_feedback:
        outcome.append(f"Final immediate feedback: {last.feedback.strip() or '(none)'}")
    parts = [
        f"## Task\n{traj.steps[0].prompt}",
        f"## Current rollout\n{rollout}",
        "## Outcome\n" + "\n".join(outcome),
    ]
    if reference is not None:
        ref_text = render_steps(reference.steps, trajectory_format, remove_thinking=remove_thinking, max_steps=max_steps)
        label = "this same rollout" if reference.source == "self" else "another rollout of the same task"
        parts.append(f"## Reference: a successful rollout ({label})\n{ref_text}")
    parts.append(FINAL_INSTRUCTION)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]
