"""ALFWorld step prompt (``langfengQ/verl-agent@574dd5b:agent_system/environments/prompts/alfworld.py``), in our own words with the original's structure.

First step: role line, current observation (which contains "Your task is to: ..."), the
admissible actions (single-quoted, joined by newline + space, ``help`` removed), and the
``<think>`` / ``<action>`` contract. Later steps add the task, the step count and the last
``history_length`` (observation, action) pairs.
"""

from __future__ import annotations

from serl.agent.prompts import format_history

ROLE = "You are an expert agent operating in the ALFRED embodied environment."
CONTRACT = (
    "Now it is your turn to take an action.\n"
    "First reason step by step about the current situation; this reasoning MUST be enclosed in "
    "<think> </think> tags.\n"
    "Then choose exactly one admissible action for the current step and give it within "
    "<action> </action> tags."
)


def format_admissible(actions: list[str]) -> str:
    """Single-quote each action, drop ``help``, join by newline + space (as the original)."""
    return "\n ".join(f"'{a}'" for a in actions if a != "help")


def build_prompt(
    task_text: str,
    observation: str,
    admissible_actions: list[str],
    history: list[tuple[str, str]],
    step_count: int,
    history_length: int,
) -> str:
    """The user-message text of one ALFWorld step; see the module docstring."""
    actions = format_admissible(admissible_actions)
    if step_count == 0 or history_length <= 0 or not history:
        return (
            f"{ROLE}\nYour current observation is: {observation}\n"
            f"Your admissible actions of the current situation are: [{actions}].\n\n{CONTRACT}"
        )
    shown = min(history_length, len(history))
    return (
        f"{ROLE} Your task is to: {task_text}\n"
        f"Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
        f"{shown} observations and the corresponding actions you took:\n"
        f"{format_history(history, history_length, step_count)}\n"
        f"You are now at step {step_count + 1} and your current observation is: {observation}\n"
        f"Your admissible actions of the current situation are: [{actions}].\n\n{CONTRACT}"
    )
