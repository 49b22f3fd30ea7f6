"""The text-environment protocol every serl environment implements.

Environments know nothing of LLMs (DESIGN.md, "Principles"): they take an action *string* and
return the raw observation, the admissible actions, the reward, ``done``/``won`` and the
immediate feedback (the engine's reply to the action). Prompts and parsing live in
:mod:`serl.agent`.

An environment is built from a :class:`Task` (which game / goal to play) so that the
``G`` rollouts of a group replay the identical task (environments.md §1, "Group environments").
"""

from __future__ import annotations

from serl.errors import EnvError  # noqa: F401  (re-exported)

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Task:
    """One playable task: an ALFWorld game file or a WebShop goal.

    Attributes:
        env_name: registry name of the environment (``"alfworld"``, ``"webshop"``).
        task_id: what identifies the task inside that environment: the ALFWorld
            ``game.tw-pddl`` path, or the WebShop goal index as a string.
        task_type: the category used for per-type success metrics (ALFWorld: the task-folder
            prefix, e.g. ``"pick_heat_then_place_in_recep"``; WebShop: ``"webshop"``).
        seed: seed for any randomness inside the task (e.g. WebShop's hidden prices).
            All members of a group share it.
    """

    env_name: str
    task_id: str
    task_type: str
    seed: int = 0


@dataclass
class StepResult:
    """What an environment returns from ``reset`` and ``step``.

    Attributes:
        observation: the raw observation *after* the action (at reset: the initial one).
            For ALFWorld the TextWorld banner is stripped. This is also the anchor text used by
            GiGPO / SERL anchor grouping (gigpo_grpo.md §3.3).
        admissible_actions: the actions the engine accepts now (for the prompt only; actions
            outside it are still sent to the engine, environments.md §3).
        reward: env reward of this step (ALFWorld ``10 * won``; WebShop 10 iff the purchase
            scores 1.0). 0.0 at reset.
        done: the episode has ended (won, bought, or the env's own step limit).
        won: the task was solved at this step.
        feedback: the immediate feedback, i.e. the engine's reply to the action
            (``"Nothing happens."``, ``"You pick up ..."``). Empty at reset.
        task: the natural-language task / instruction of the episode.
        info: extra env-specific fields (e.g. ``gamefile``, ``task_score``, ``invalid_click``).
    """

    observation: str
    admissible_actions: list[str]
    reward: float = 0.0
    done: bool = False
    won: bool = False
    feedback: str = ""
    task: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TextEnv(Protocol):
    """A single-episode-at-a-time multi-turn text environment (Gymnasium-style).

    Implementations must be picklable-constructible in a worker process from keyword arguments
    (see :mod:`serl.envs.pool`), and must not import torch or transformers.
    """

    #: registry name, e.g. ``"alfworld"``
    name: str
    #: the env's own episode step limit (ALFWorld 50, WebShop 15)
    max_steps: int

    def reset(self, task: Task) -> StepResult:
        """Start ``task`` from its initial state. Raises ``EnvError`` on a missing/corrupt task."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply ``action`` (any string; inadmissible ones are no-ops reported by the env)."""
        ...

    def close(self) -> None:
        """Release engine resources."""
        ...




# --------------------------------------------------------------------------------------------
# Registry: name -> (env class, task lister). Environments register themselves on import.
# --------------------------------------------------------------------------------------------

ENV_REGISTRY: dict[str, type] = {}


def register_env(name: str):
    """Class decorator adding an environment class to :data:`ENV_REGISTRY` under ``name``.

    The class must implement :class:`TextEnv` and a classmethod
    ``list_tasks(split: str, data_dir: str | None, **kwargs) -> list[Task]``.
    """

    def deco(cls):
        ENV_REGISTRY[name] = cls
        cls.name = name
        return cls

    return deco


def get_env_class(name: str) -> type:
    """Return the env class registered as ``name``; raises ``KeyError`` listing the valid names."""
    # Import the built-in environments lazily so `import serl` stays light.
    if name not in ENV_REGISTRY:
        if name == "alfworld":
            from serl.envs import alfworld  # noqa: F401
        elif name == "webshop":
            from serl.envs import webshop  # noqa: F401
    if name not in ENV_REGISTRY:
        raise KeyError(f"unknown env.name {name!r}; valid: {sorted(set(ENV_REGISTRY) | {'alfworld', 'webshop'})}")
    return ENV_REGISTRY[name]
