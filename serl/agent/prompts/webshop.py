"""WebShop step prompt (``langfengQ/verl-agent@574dd5b:agent_system/environments/prompts/webshop.py``), in our own words with the original's structure.

Both variants open with the role line and the task ("Your task is to: <instruction>"). The
first step (or ``history_length <= 0``) then gives the current observation; later steps add the
step count and the last ``history_length`` (observation, action) pairs before it. Then come the
admissible actions, one per line, each single-quoted and followed by a comma, inside ``[`` ``]``,
and the ``<think>`` / ``<action>`` contract. When the history variant is longer than
:data:`MAX_PROMPT_CHARS` characters, the no-history variant is used for that step (verl-agent).

Conversation layout (``env.prompt_layout=conversation``, serl's; as ALFWorld's,
:mod:`serl.agent.prompts.alfworld`): the first user turn is the step layout's first prompt, every
later step one user turn appended to the same chat after the policy's reply (:func:`build_turn`):
the step number, the new page and, unless ``turn_actions=none``, its admissible actions. WebShop
has no action that every page admits (ALFWorld's ``go to``/``look``/``inventory``), so ``state``
lists the same as ``all``; with ``none`` the page text still names its buttons and items.

The observation is the env's ``StepResult.observation``: WebShop's page text after the
instruction, each ``[SEP]`` segment single-quoted. Action parsing for WebShop falls back to the
last 20 characters of a response without ``<action>`` tags (``serl.agent.parsing``).
"""

from __future__ import annotations

from serl.agent.prompts import format_history

#: above this many characters the history variant is replaced by the no-history one
MAX_PROMPT_CHARS = 13000

ROLE = "You are an expert autonomous agent shopping in the WebShop e-commerce environment."
CONTRACT = (
    "Now it is your turn to take one action for the current step.\n"
    "First reason step by step about the current situation and about which admissible action best "
    "moves you towards the shopping goal; this reasoning MUST be enclosed in <think> </think> tags.\n"
    "Then choose exactly one admissible action for the current step and give it within "
    "<action> </action> tags."
)


def format_admissible(actions: list[str]) -> str:
    """One action per line, single-quoted and followed by a comma (as the original)."""
    return "\n".join(f"'{a}'," for a in actions)


def _no_history(task_text: str, observation: str, actions: str) -> str:
    return (
        f"{ROLE}\nYour task is to: {task_text}.\n"
        f"Your current observation is: {observation}.\n"
        f"Your admissible actions of the current situation are:\n[\n{actions}\n].\n\n{CONTRACT}"
    )


def build_prompt(
    task_text: str,
    observation: str,
    admissible_actions: list[str],
    history: list[tuple[str, str]],
    step_count: int,
    history_length: int,
) -> str:
    """The user-message text of one WebShop step; see the module docstring.

    Args:
        task_text: the instruction (``StepResult.task``).
        observation: the current observation (``StepResult.observation``).
        admissible_actions: ``StepResult.admissible_actions``.
        history: every earlier (observation, action) pair of the episode, oldest first.
        step_count: steps already taken (0 at the first step).
        history_length: how many recent pairs to show.
    """
    actions = format_admissible(admissible_actions)
    if step_count == 0 or history_length <= 0 or not history:
        return _no_history(task_text, observation, actions)
    shown = min(history_length, len(history))
    prompt = (
        f"{ROLE}\nYour task is to: {task_text}.\n"
        f"Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
        f"{shown} observations and the corresponding actions you took:\n"
        f"{format_history(history, history_length, step_count)}\n"
        f"You are now at step {step_count + 1} and your current observation is: {observation}.\n"
        f"Your admissible actions of the current situation are:\n[\n{actions}\n].\n\n{CONTRACT}"
    )
    if len(prompt) > MAX_PROMPT_CHARS:
        return _no_history(task_text, observation, actions)
    return prompt


def build_turn(observation: str, admissible_actions: list[str], step_count: int, turn_actions: str) -> str:
    """The user turn of a later step in the conversation layout (see the module docstring).

    Args:
        observation: the page after the previous action (``StepResult.observation``).
        admissible_actions: the actions the page admits.
        step_count: steps already taken (>= 1).
        turn_actions: ``all`` or ``state`` (the page's actions, listed as the first turn lists
            them) or ``none``.

    Raises:
        ValueError: unknown ``turn_actions``.
    """
    if turn_actions not in ("all", "state", "none"):
        raise ValueError(f"unknown turn_actions {turn_actions!r}; valid: ['all', 'state', 'none']")
    listed = admissible_actions if turn_actions != "none" else []
    actions = f"\nAdmissible actions:\n[\n{format_admissible(listed)}\n]" if listed else ""
    return f"Step {step_count + 1}. Observation: {observation}{actions}"
