"""The text-environment protocol every serl environment implements.

Environments know nothing of LLMs: they take an action *string* and
return the raw observation, the admissible actions, the reward, ``done``/``won`` and the
immediate feedback (the engine's reply to the action). Prompts and parsing live in
:mod:`serl.agent`.

An environment is built from a :class:`Task` (which game / goal to play) so that the
``G`` rollouts of a group replay the identical task (as verl-agent's group environments do,
``langfengQ/verl-agent@574dd5b:agent_system/environments/env_manager.py``).

Environments are found by name through a registry of *entry points* (``name -> "module:Class"``,
as gymnasium's ``register(id, entry_point=...)``): :data:`ENV_ENTRY_POINTS`,
:func:`register_env`, :func:`get_env_class`. The env modules are imported only when an env class
is asked for, so this module stays a leaf (it imports nothing from the env modules) and
:func:`check_config` can check ``env.name`` without importing ALFWorld or WebShop. An env may
also register a check of its own config options (``"module:function"``, :data:`ENV_CONFIG_CHECKS`),
imported only when that env is the one configured. An env class hands out its scripted experts
for supervised cold-start rows the same way (:meth:`BaseTextEnv.make_expert`: the
``"module:function"`` factory its :attr:`~BaseTextEnv.expert_factory` names, imported on first use).
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

from serl.errors import ConfigError, EnvError  # noqa: F401  (EnvError re-exported)

if TYPE_CHECKING:
    from serl.config import EnvConfig


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

    @property
    def key(self) -> str:
        """``task_id`` without where the data lies: for a game path, its last three parts
        (``<task folder>/<trial>/game.tw-pddl``, unique within an ALFWorld split); otherwise
        ``task_id`` itself. Seeds drawn from it are the same on every machine, where the
        absolute path is not (a data root moved from ``/home/a`` to ``/ci`` must not change
        what a seeded expert does)."""
        parts = self.task_id.replace("\\", "/").split("/")
        return "/".join(parts[-3:]) if len(parts) > 1 else self.task_id


@dataclass
class StepResult:
    """What an environment returns from ``reset`` and ``step``.

    Attributes:
        observation: the raw observation *after* the action (at reset: the initial one).
            For ALFWorld the TextWorld banner is stripped. This is also the anchor text used by
            GiGPO / SERL anchor grouping (GiGPO, arXiv 2505.10978, "anchor states").
        admissible_actions: the actions the engine accepts now (for the prompt only; actions
            outside it are still sent to the engine, as in verl-agent).
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
    (see :mod:`serl.envs.pool`), and must not import torch or transformers. Subclass
    :class:`BaseTextEnv` to get the config hooks the trainer uses.
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



class BaseTextEnv:
    """Default config hooks of a :class:`TextEnv`; serl's envs and users' envs subclass it.

    The trainer and the rollout reach env-specific behaviour only through these hooks, so a new
    environment needs no change outside its own module (and, for its prompt, ``serl.agent``):

    - :meth:`config_kwargs` / :meth:`from_config`: the constructor arguments taken from the
      ``env`` config section (plain picklable values: env worker processes build the env from
      them);
    - :meth:`tasks_from_config`: the tasks of a split;
    - :attr:`prompt_builder`: ``"module:function"`` of the step-prompt builder (see
      :mod:`serl.agent.prompts`), resolved lazily by :func:`serl.agent.prompts.get_prompt_builder`;
      the env itself never imports it (envs know nothing of LLMs); :attr:`turn_builder` likewise
      for the later turns of the conversation layout;
    - :meth:`episode_metrics`: extra evaluation metrics of finished episodes;
    - :meth:`make_expert`: the env's scripted expert of a task, for supervised cold-start rows
      (``serl data expert``, played by :mod:`serl.rollout.expert`), from the factory that
      :attr:`expert_factory` names (``"module:function"``, resolved lazily like
      :attr:`rollout_loop`), with :attr:`expert_names` and :attr:`expert_options` telling the
      command line which ``--expert`` names and options the env's experts take.

    A subclass must also implement ``reset``, ``step``, ``close`` (:class:`TextEnv`) and the
    classmethod ``list_tasks(split, data_dir=None, **kwargs) -> list[Task]``.
    """

    #: registry name, e.g. ``"alfworld"``
    name: str = ""
    #: ``"module:function"`` of the prompt builder in :mod:`serl.agent.prompts` ("" = none)
    prompt_builder: str = ""
    #: ``"module:function"`` of the later-turn builder of ``env.prompt_layout=conversation``
    #: (``build(observation, admissible_actions, step_count, turn_actions) -> str``; "" = the env
    #: has no conversation layout)
    turn_builder: str = ""
    #: the env's own episode step limit (its constructor's default; ALFWorld 50, WebShop 15)
    default_max_steps: int = 50
    #: ``"module:Class"`` of the rollout loop that plays this env (resolved by the trainer, never
    #: imported here): the step-row loop of verl-agent by default; the math env's tool loop
    #: (``serl.rollout.tool_loop:ToolAgentLoop``) builds one multi-turn row per trajectory
    rollout_loop: str = "serl.rollout.collector:Collector"
    #: prefixes of the admissible actions whose argument the policy writes itself (WebShop's
    #: ``search[``): ``rollout.action_selection=score`` cannot score them and keeps the sampled
    #: reply where one is admitted and chosen (serl.rollout.action_selection)
    free_text_actions: tuple[str, ...] = ()
    #: ``"module:function"`` of the env's expert factory, ``factory(task, seed, expert=None,
    #: **options)`` -> an expert (:meth:`make_expert`); resolved on first use, never imported here
    #: (the env module need not import its experts). "" = the env has no expert
    expert_factory: str = ""
    #: the names of the env's experts (:meth:`make_expert`'s ``expert``, ``serl data expert
    #: --expert``), the default first; () = one expert at most, asked for with ``expert=None``
    expert_names: tuple[str, ...] = ()
    #: the options the env's expert factory takes, each with the experts that take a value other
    #: than the option's default (ALFWorld: ``{"detours": ("walkthrough",), "think": ("sweep",)}``);
    #: :meth:`make_expert` refuses any other, and ``serl data expert`` checks its flags against it
    expert_options: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def config_kwargs(cls, env_cfg: "EnvConfig") -> dict[str, Any]:
        """Constructor keyword arguments from the ``env`` section: ``max_steps`` and ``data_dir``."""
        return {"max_steps": env_cfg.max_steps, "data_dir": env_cfg.data_dir}

    @classmethod
    def from_config(cls, env_cfg: "EnvConfig") -> "BaseTextEnv":
        """An env built from the ``env`` section (``cls(**cls.config_kwargs(env_cfg))``)."""
        return cls(**cls.config_kwargs(env_cfg))

    @classmethod
    def tasks_from_config(cls, env_cfg: "EnvConfig", split: str) -> list[Task]:
        """The tasks of ``split`` (``cls.list_tasks(split, env_cfg.data_dir)``).

        Raises:
            EnvError: as ``list_tasks`` (unknown split, missing data).
        """
        return cls.list_tasks(split, env_cfg.data_dir)  # type: ignore[attr-defined]

    @classmethod
    def preflight(cls, env_cfg: "EnvConfig") -> dict[str, str]:
        """Checks run once in the training process before any env worker starts, returning notes
        for the console and the run folder (``{}`` by default; the math env builds its sandbox
        and reports the isolation it has). Raise to stop the run with a clear message."""
        return {}

    @classmethod
    def episode_metrics(cls, trajectories: Sequence[Any]) -> dict[str, float]:
        """Env-specific evaluation metrics of finished episodes (none by default).
        ``trajectories`` are :class:`serl.trajectory.Trajectory` records; typed ``Any`` here because
        :mod:`serl.trajectory` imports this module (for :class:`Task`), and naming it back, even for
        type checking only, would make an import circle."""
        return {}

    @classmethod
    def make_expert(cls, task: Task, seed: int, expert: "str | None" = None, **options: Any) -> Any:
        """The env's scripted expert for ``task``, built by the factory :attr:`expert_factory`
        names: an object with ``act(env, result, step)`` returning ``(think, action)``,
        ``(think, action, weight)`` (weight 0: a reply kept as context only) or None (no action:
        the episode ends, given up), where ``env`` is an instance of this class in this process,
        ``result`` the :class:`StepResult` of the state and ``step`` its 0-based index; ``think``
        is drawn from templates with :func:`expert_rng` (no LLM). :mod:`serl.rollout.expert`
        plays it and builds the rows.

        Args:
            task: the task to play.
            seed: picks the think templates (and any random choice of the expert).
            expert: one of :attr:`expert_names` (None: the env's default).
            options: the expert's own options (:attr:`expert_options`), e.g. ALFWorld's
                ``detours`` and ``think``.

        Raises:
            EnvError: the env has no expert (``"no expert for env 'math'; valid: [...]"``), an
                option not in :attr:`expert_options`, or what the factory refuses (an unknown
                expert name, an option's value), or its entry point cannot be imported.
        """
        if not cls.expert_factory:
            raise EnvError(f"no expert for env {task.env_name!r}; valid: {sorted(expert_envs())}")
        unknown = [k for k in options if k not in cls.expert_options]
        if unknown:
            takers = {n: c.expert_options[unknown[0]] for n, c in expert_envs().items()
                      if unknown[0] in c.expert_options}
            raise EnvError(f"{unknown[0]}={options[unknown[0]]!r}: no {task.env_name} expert takes that option; "
                           f"it is for " + (", ".join(f"{n}'s {' or '.join(e)}" for n, e in takers.items()) or "none"))
        return load_entry_point(cls.expert_factory)(task, seed, expert, **options)


def expert_rng(seed: int, task_key: str, step: int) -> random.Random:
    """The random draw of an expert reply's think template at step ``step`` (0-based) of a task:
    ``random.Random(f"serl-expert/{seed}/{task_key}/{step}")``, so a row depends only on the seed,
    the task (``Task.key``: the same on every machine) and the step, not on the order tasks are
    played in."""
    return random.Random(f"serl-expert/{seed}/{task_key}/{step}")


# --------------------------------------------------------------------------------------------
# Registry: name -> "module:Class" entry point, imported lazily.
# --------------------------------------------------------------------------------------------

#: the environments serl knows, as ``name -> "module:Class"``; :func:`register_env` adds more
ENV_ENTRY_POINTS: dict[str, str] = {
    "alfworld": "serl.envs.alfworld:AlfWorldEnv",
    "webshop": "serl.envs.webshop.env:WebShopEnv",
    "math": "serl.envs.math.env:MathEnv",
}
#: the training rows of each env's rollout loop, when not ``"step"`` (one row per env step,
#: verl-agent's layout; GiGPO's anchor states need it): ``"trajectory"`` = one row per trajectory
#: with tool outputs masked, as verl's agent loop. Read by the config check without importing
#: the env; :func:`register_env` sets it
ENV_ROW_LAYOUTS: dict[str, str] = {"math": "trajectory"}
ROW_LAYOUTS = ("step", "trajectory")
#: each env's check of its own options, as ``name -> "module:function"``; the function takes the
#: ``env`` config section and raises :class:`ConfigError` naming the key (``env.webshop.<key>``).
#: Kept light: a config check must not import the env itself. An env without one has none
ENV_CONFIG_CHECKS: dict[str, str] = {
    "alfworld": "serl.envs.alfworld:check_config",
    "webshop": "serl.envs.webshop.options:check_config",
    "math": "serl.envs.math.options:check_config",
}


def _check_entry_point(entry_point: str) -> tuple[str, str]:
    module, sep, attr = entry_point.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"env entry point {entry_point!r} must look like 'package.module:ClassName'")
    return module, attr


def load_entry_point(entry_point: str) -> Any:
    """Import ``"package.module:Name"`` and return ``Name`` (dots in ``Name`` walk attributes).

    Raises:
        ConfigError: ``entry_point`` is not of the form ``module:Name``.
        EnvError: the module cannot be imported or has no such attribute.
    """
    module, attr = _check_entry_point(entry_point)
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise EnvError(f"cannot load entry point {entry_point!r}: {type(e).__name__}: {e}") from e
    return obj


def register_env(name: str, entry_point: "str | type | None" = None,
                 config_check: "str | None" = None, row_layout: str = "step") -> Callable[[type], type]:
    """Register an environment under ``name`` (as gymnasium's ``register(id, entry_point=...)``).

    ``register_env("mygame", "my_pkg.envs:MyGameEnv")`` registers by entry point: the module is
    imported only when the env is used, and env worker processes import it themselves, so it
    must be importable there (on ``sys.path``). Passing a class registers that class's own
    module and name. Without ``entry_point``, returns a class decorator doing the same. The
    class should subclass :class:`BaseTextEnv`. Registering an existing name replaces it
    (its config check too).

    ``config_check`` (optional): ``"module:function"`` of a check of the env's own config
    options, ``function(env_cfg)`` raising :class:`ConfigError` that names the key; run by
    :func:`check_config` when a config names this env, imported only then (keep its module
    light: no env engine, no search index).

    ``row_layout``: the rows the env's ``rollout_loop`` produces, ``"step"`` or ``"trajectory"``
    (:data:`ENV_ROW_LAYOUTS`).

    Raises:
        ConfigError: an empty name, an entry point or config check not of the form
            ``module:Name``, or an unknown row layout.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"env name must be a non-empty string, got {name!r}")
    if row_layout not in ROW_LAYOUTS:
        raise ConfigError(f"row_layout must be one of {list(ROW_LAYOUTS)}, got {row_layout!r}")
    if config_check is not None:
        _check_entry_point(config_check)

    def deco(cls: type) -> type:
        ENV_ENTRY_POINTS[name] = f"{cls.__module__}:{cls.__qualname__}"
        _set_config_check(name, config_check)
        _set_row_layout(name, row_layout)
        _LOADED.pop(name, None)
        return cls

    if entry_point is None:
        return deco
    if isinstance(entry_point, type):
        deco(entry_point)
    else:
        _check_entry_point(entry_point)
        ENV_ENTRY_POINTS[name] = entry_point
        _set_config_check(name, config_check)
        _set_row_layout(name, row_layout)
        _LOADED.pop(name, None)
    return deco


def _set_row_layout(name: str, row_layout: str) -> None:
    if row_layout == "step":
        ENV_ROW_LAYOUTS.pop(name, None)
    else:
        ENV_ROW_LAYOUTS[name] = row_layout


def row_layout(name: str) -> str:
    """The row layout of the env registered as ``name`` (:data:`ENV_ROW_LAYOUTS`; ``"step"`` by
    default), without importing it."""
    return ENV_ROW_LAYOUTS.get(name, "step")


def _set_config_check(name: str, config_check: "str | None") -> None:
    if config_check is None:
        ENV_CONFIG_CHECKS.pop(name, None)
    else:
        ENV_CONFIG_CHECKS[name] = config_check


_LOADED: dict[str, type] = {}


def env_names() -> list[str]:
    """The registered env names, sorted."""
    return sorted(ENV_ENTRY_POINTS)


def env_entry_point(name: str) -> str:
    """The ``"module:Class"`` entry point of the env registered as ``name``.

    Raises:
        ConfigError: ``name`` is not registered; the message lists the valid names.
    """
    try:
        return ENV_ENTRY_POINTS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"env.name: unknown env {name!r}; valid: {env_names()}") from None


def check_config(env_cfg: "EnvConfig") -> None:
    """Check the ``env`` names this registry owns: ``env.name`` must be a registered env (checked
    against :data:`ENV_ENTRY_POINTS`, without importing the env modules); then the env's own
    options are checked by its registered config check (:data:`ENV_CONFIG_CHECKS`, imported
    now, e.g. ``env.webshop.*`` for WebShop). Called by :func:`serl.configure.check_config`.

    Raises:
        ConfigError: ``"env.name: unknown env ...; valid: [...]"``, or the env's own check's
            error naming ``env.<key>``.
        EnvError: the registered config check cannot be imported.
    """
    if env_cfg.name not in ENV_ENTRY_POINTS:
        raise ConfigError(f"env.name: unknown env {env_cfg.name!r}; valid: {env_names()}")
    entry = ENV_CONFIG_CHECKS.get(env_cfg.name)
    if entry:
        load_entry_point(entry)(env_cfg)


def get_env_class(name: str) -> type:
    """The env class registered as ``name``, importing its module on first use.

    Raises:
        ConfigError: ``name`` is not registered; the message lists the valid names.
        EnvError: its entry point cannot be imported, or is not a class.
    """
    if name not in _LOADED:
        cls = load_entry_point(env_entry_point(name))
        if not isinstance(cls, type):
            raise EnvError(f"env entry point {ENV_ENTRY_POINTS[name]!r} of {name!r} is not a class")
        _LOADED[name] = cls
    return _LOADED[name]


def expert_envs() -> dict[str, type]:
    """The registered envs that have an expert (:attr:`BaseTextEnv.expert_factory`), name -> class,
    by name. Imports every registered env class; one that cannot be imported is left out."""
    found = {}
    for name in env_names():
        try:
            cls = get_env_class(name)
        except (ConfigError, EnvError):
            continue
        if getattr(cls, "expert_factory", ""):
            found[name] = cls
    return found


def list_tasks(env_cfg: "EnvConfig", split: str) -> list[Task]:
    """The tasks of ``split`` of the ``env_cfg.name`` env (its ``tasks_from_config`` hook),
    restricted to ``env_cfg.task_types`` when that list is not empty (order kept).

    Raises:
        ConfigError: unknown env name.
        EnvError: as the env's ``list_tasks`` (unknown split, missing data), or a type in
            ``env.task_types`` that has no task in ``split`` (the message lists the types present).
    """
    tasks = get_env_class(env_cfg.name).tasks_from_config(env_cfg, split)
    wanted = list(env_cfg.task_types)
    if not wanted:
        return tasks
    present = sorted({t.task_type for t in tasks})
    missing = [w for w in wanted if w not in present]
    if missing:
        raise EnvError(f"env.task_types: no task of type {missing} in split {split!r}; types present: {present}")
    return [t for t in tasks if t.task_type in wanted]
