"""Per-environment prompt templates (environments.md §2).

A prompt builder turns the env's raw state and the agent's memory into the single user-message
text of one step. Signature::

    build(task_text, observation, admissible_actions, history, step_count, history_length) -> str

``history`` holds every earlier ``(observation the agent saw, action it took)`` pair of the
episode, oldest first; the builder shows the last ``history_length`` of them. ``step_count``
is the number of steps already taken (0 at the first step).
"""

from __future__ import annotations

from typing import Callable

PromptBuilder = Callable[[str, str, list, list, int, int], str]


def get_prompt_builder(env_name: str) -> PromptBuilder:
    """Return the prompt builder of ``env_name``; raises ``KeyError`` for an unknown env."""
    if env_name == "alfworld":
        from serl.agent.prompts.alfworld import build_prompt

        return build_prompt
    if env_name == "webshop":
        from serl.agent.prompts.webshop import build_prompt

        return build_prompt
    raise KeyError(f"no prompt template for env {env_name!r}; valid: ['alfworld', 'webshop']")


def format_history(history: list[tuple[str, str]], history_length: int, step_count: int) -> str:
    """The memory block: the last ``history_length`` records, one line each, as
    ``[Observation k: '<obs>', Action k: '<act>']`` with k the 1-based step number
    (verl-agent ``SimpleMemory.fetch``, environments.md §1)."""
    if history_length <= 0:
        return ""
    recent = history[-history_length:]
    first = step_count - len(recent) + 1
    return "\n".join(
        f"[Observation {first + i}: '{obs}', Action {first + i}: '{act}']" for i, (obs, act) in enumerate(recent)
    )
