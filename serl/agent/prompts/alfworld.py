"""ALFWorld step prompt (``langfengQ/verl-agent@574dd5b:agent_system/environments/prompts/alfworld.py``), in our own words with the original's structure.

Step layout (``env.prompt_layout=step``, :func:`build_prompt`). First step: role line, current observation (which contains "Your task is to: ..."), the
admissible actions (single-quoted, joined by newline + space, ``help`` removed), and the
``<think>`` / ``<action>`` contract. Later steps add the task, the step count and the last
``history_length`` (observation, action) pairs.

Conversation layout (``env.prompt_layout=conversation``, serl's): the first user turn is the step
layout's first prompt; every later step is one short user turn (:func:`build_turn`) appended to
the same chat after the policy's reply: the step number, the env's reply and the admissible actions that
``turn_actions`` selects (:func:`turn_action_list`); the contract is stated once, in the first
turn (a reminder per turn would cost ~20 tokens a step, 1,000 in a 50-step episode).
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


#: commands the first turn lists that stay the same all episode (``go to`` all receptacles but the one the
#: agent is at): ``state`` leaves them out of later turns
_CONSTANT_PREFIXES = ("go to ", "look", "inventory", "help")


def turn_action_list(actions: list[str], turn_actions: str) -> list[str]:
    """The admissible actions a later conversation turn lists.

    Args:
        actions: the env's admissible actions now.
        turn_actions: ``all`` (every action but ``help``), ``state`` (also without ``go to X``,
            ``look`` and ``inventory``, which ALFWorld admits at every step of an episode, ``go to``
            every receptacle but the one the agent is at, and the first turn lists) or ``none``.

    Raises:
        ValueError: unknown ``turn_actions``.
    """
    if turn_actions == "all":
        return [a for a in actions if a != "help"]
    if turn_actions == "state":
        return [a for a in actions if not a.startswith(_CONSTANT_PREFIXES)]
    if turn_actions == "none":
        return []
    raise ValueError(f"unknown turn_actions {turn_actions!r}; valid: ['all', 'state', 'none']")


def build_turn(observation: str, admissible_actions: list[str], step_count: int, turn_actions: str) -> str:
    """The user turn of a later step in the conversation layout (see the module docstring).

    Args:
        observation: the env's reply to the previous action.
        admissible_actions: the actions the env admits now.
        step_count: steps already taken (>= 1).
        turn_actions: which actions to list (:func:`turn_action_list`).
    """
    listed = turn_action_list(admissible_actions, turn_actions)
    label = "Admissible actions" + (" besides go to, look and inventory" if turn_actions == "state" else "")
    actions = f"\n{label}: [{format_admissible(listed)}]" if listed else ""
    return f"Step {step_count + 1}. Observation: {observation}{actions}"
