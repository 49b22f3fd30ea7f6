"""Per-environment prompt templates (after verl-agent's,
``langfengQ/verl-agent@574dd5b:agent_system/environments/prompts/``).

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


def _env_builder(env_name: str, attribute: str, missing: str) -> Callable:
    """The function the env class registered as ``env_name`` names in ``attribute``
    (``"module:function"``), imported now; ConfigError ``missing`` when it names none."""
    from serl.envs.base import get_env_class, load_entry_point
    from serl.errors import ConfigError

    entry_point = getattr(get_env_class(env_name), attribute, "")
    if not entry_point:
        raise ConfigError(missing)
    return load_entry_point(entry_point)


def get_prompt_builder(env_name: str) -> PromptBuilder:
    """The prompt builder of the env registered as ``env_name``.

    The env class names it by entry point (its ``prompt_builder`` attribute, e.g.
    ``"serl.agent.prompts.webshop:build_prompt"``), imported here on first use, so the env
    modules never import prompt code and a user's env can bring its own builder.

    Raises:
        ConfigError: ``env_name`` is not registered, or its env class names no prompt builder.
        EnvError: the entry point cannot be imported.
    """
    return _env_builder(env_name, "prompt_builder", f"env {env_name!r} names no prompt builder: set its class "
                        "attribute prompt_builder = 'module:function'")


def get_turn_builder(env_name: str) -> Callable[[str, list, int, str], str]:
    """The later-turn builder of ``env.prompt_layout=conversation`` for the env registered as
    ``env_name`` (its class's ``turn_builder`` entry point, e.g.
    ``"serl.agent.prompts.alfworld:build_turn"``), imported on first use.

    Raises:
        ConfigError: ``env_name`` is not registered, or its env class names no turn builder (it
            has no conversation layout).
        EnvError: the entry point cannot be imported.
    """
    return _env_builder(env_name, "turn_builder", f"env.prompt_layout: env {env_name!r} has no conversation layout "
                        "(its class names no turn_builder = 'module:function'); use env.prompt_layout=step")


def format_history(history: list[tuple[str, str]], history_length: int, step_count: int) -> str:
    """The memory block: the last ``history_length`` records, one line each, as
    ``[Observation k: '<obs>', Action k: '<act>']`` with k the 1-based step number
    (verl-agent ``SimpleMemory.fetch``,
    ``langfengQ/verl-agent@574dd5b:agent_system/memory/memory.py``)."""
    if history_length <= 0:
        return ""
    recent = history[-history_length:]
    first = step_count - len(recent) + 1
    return "\n".join(
        f"[Observation {first + i}: '{obs}', Action {first + i}: '{act}']" for i, (obs, act) in enumerate(recent)
    )
