"""ALFWorld text environment on the real TextWorld PDDL engine (alfworld 0.4.2 wrappers).

One :class:`AlfWorldEnv` plays one game at a time. It drives TextWorld 1.7.0's PDDL engine
through alfworld's ``AlfredDemangler`` (object ids -> names such as ``apple 2``) and
``AlfredInfos`` wrappers, exactly as ALFWorld's own ``AlfredTWEnv`` does, but reads game files
directly, so the train split works without ``traj_data.json`` (as ``alfworld/alfworld`` 0.4.2 does).

Behaviour (as verl-agent's ALFWorld env, ``langfengQ/verl-agent@574dd5b:agent_system/environments``, and ``alfworld/alfworld`` 0.4.2):

* ``reset(task)`` loads ``task.task_id`` (a ``game.tw-pddl`` path) into one reused TextWorld env
  (``env.load``), and returns the first observation with the ``-= Welcome to TextWorld,
  ALFRED! =-`` banner stripped. The observation still ends with ``Your task is to: ...``.
  A reset costs about 0.85 s: fast-downward re-translates the PDDL every time (pitfall 6).
* ``step(action)`` sends the action string as is; an unknown or inadmissible command gets the
  engine's ``"Nothing happens."`` and still costs a step. Reward is ``10.0`` on the winning
  step, else ``0.0``; ``done`` is ``won or steps >= max_steps``. About 60 ms per step.
* ``expert_plan()`` / ``expert_action()``: the planner expert's plan / next command from the
  *current* state (any state the policy reached), computed only when asked
  (:mod:`serl.envs.alfworld_expert`); ``AlfWorldEnv(expert="planner")`` also puts the plan in
  every reset / step ``info["expert_plan"]``, so DAgger can label the states of a pool's envs.
* The scripted experts of ``serl data expert`` (walkthrough, planner, search, sweep, detours) are
  in :mod:`serl.envs.alfworld_experts`, handed out by :meth:`AlfWorldEnv.make_expert`.

Data layout: ``<data_dir>/json_2.1.1/<split>/<task-dir>/<trial>/game.tw-pddl``, ALFWorld's own.
:func:`resolve_data_dir` picks the folder (explicit argument > ``$SERL_DATA`` > the small
fixture shipped in ``serl/data/alfworld``).

alfworld and textworld are imported lazily inside the env, so ``import serl`` stays light and
the module can be imported without them installed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from serl.envs.alfworld_expert import EXPERT_KINDS, AlfWorldPlanner, PlannerError, PlannerStats  # noqa: F401
from serl.envs.base import BaseTextEnv, EnvError, StepResult, Task

#: the banner TextWorld puts in front of the first ALFWorld observation
BANNER = "-= Welcome to TextWorld, ALFRED! =-"
#: the sentence that introduces the task in the first observation
TASK_PREFIX = "Your task is to: "
#: reward of the winning step (verl-agent: ``10 * won``)
WIN_REWARD = 10.0
#: ALFWorld's own step limit (verl-agent: 50)
DEFAULT_MAX_STEPS = 50
#: the six ALFWorld task types (the task-folder prefixes)
TASK_TYPES = (
    "look_at_obj_in_light",
    "pick_and_place_simple",
    "pick_clean_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_two_obj_and_place",
)
#: folder of the game files inside a data folder (ALFWorld's layout)
JSON_DIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"

_HOW_TO_GET_DATA = (
    "Get the ALFWorld game files with `serl data download alfworld` (needs network), or point "
    "`--data-dir` / `env.data_dir` or the SERL_DATA environment variable at an existing folder "
    f"that contains `{JSON_DIR}/<split>/` (for example a copy of shared/data/alfworld)."
)


def fixture_data_dir() -> Path:
    """The small ALFWorld fixture shipped inside the package (``serl/data/alfworld``):
    2 games per task type in ``train`` and ``valid_unseen``."""
    return Path(__file__).resolve().parent.parent / "data" / "alfworld"


def _alfworld_root(path: Path) -> Path:
    """Accept either an ALFWorld data folder (holding ``json_2.1.1/``) or a serl data root
    holding ``alfworld/json_2.1.1/``; return the folder that holds ``json_2.1.1``. If neither
    exists, ``path`` itself is returned (callers then report the missing split clearly)."""
    if (path / JSON_DIR).is_dir():
        return path
    if (path / "alfworld" / JSON_DIR).is_dir():
        return path / "alfworld"
    return path


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Return the ALFWorld data folder (the one that contains ``json_2.1.1/``).

    Precedence: the explicit ``data_dir`` argument, then the ``SERL_DATA`` environment
    variable, then the fixture shipped with serl (:func:`fixture_data_dir`). Both the explicit
    folder and ``$SERL_DATA`` may be either the ALFWorld folder itself or a serl data root
    containing ``alfworld/`` (the layout ``serl data download alfworld`` writes).

    The folder is not required to exist here; :meth:`AlfWorldEnv.list_tasks` raises a clear
    :class:`~serl.envs.base.EnvError` when the split is missing.
    """
    if data_dir is not None and str(data_dir) != "":
        return _alfworld_root(Path(data_dir).expanduser().resolve())
    env_dir = os.environ.get("SERL_DATA")
    if env_dir:
        return _alfworld_root(Path(env_dir).expanduser().resolve())
    return fixture_data_dir()


def task_type_of(gamefile: str | os.PathLike) -> str:
    """The task type of a game path: the task-folder name up to its first ``-``
    (``.../pick_heat_then_place_in_recep-Apple-None-Fridge-10/trial_.../game.tw-pddl`` ->
    ``pick_heat_then_place_in_recep``). Verified equal to ``traj_data.task_type``
    (as ``alfworld/alfworld`` 0.4.2 does)."""
    return Path(gamefile).parent.parent.name.split("-", 1)[0]


#: a closed place in an observation: ``You arrive at cabinet 3. The cabinet 3 is closed.``
_CLOSED = re.compile(r"The (.+?) is closed\.")


def target_object(gamefile: str | os.PathLike) -> str | None:
    """The object type a game's task names, lower-case as the engine names its instances: the
    task folder's second field (``.../pick_heat_then_place_in_recep-Apple-None-Fridge-10/trial_.../
    game.tw-pddl`` -> ``apple``, whose instances are ``apple 1``, ...). None where the folder's
    name is not ALFWorld's ``<type>-<Object>-<Parent>-<Receptacle>-<scene>``."""
    parts = Path(gamefile).parent.parent.name.split("-")
    return parts[1].lower() if len(parts) == 5 and parts[0] in TASK_TYPES else None


def _instance_pattern(obj: str) -> re.Pattern:
    """Matches an instance of object type ``obj`` in engine text (``apple`` -> ``apple 2``)."""
    return re.compile(rf"\b{re.escape(obj)} \d+")


def _read_game_json(path: Path) -> dict[str, Any]:
    """Parse a ``game.tw-pddl`` file; :class:`EnvError` if it is missing or not a game."""
    if not path.is_file():
        raise EnvError(f"ALFWorld game file not found: {path}. {_HOW_TO_GET_DATA}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnvError(
            f"ALFWorld game file {path} is unreadable or not valid JSON ({type(e).__name__}: {e}). "
            f"Re-download or re-copy it: {_HOW_TO_GET_DATA}"
        ) from e
    if not isinstance(data, dict):
        raise EnvError(f"ALFWorld game file {path} is not a JSON object; re-download or re-copy it.")
    return data


def walkthrough(task: Task | str | os.PathLike) -> list[str]:
    """The game's stored winning command list (the ``walkthrough`` key of ``game.tw-pddl``).

    Replayed from the initial state it wins the game (ALFWorld's handcoded expert, ``alfworld/alfworld`` 0.4.2); useful for
    demonstrations, SFT data and tests. ``task`` is a :class:`Task` or a game path.

    Raises:
        EnvError: the file is missing, corrupt, or has no ``walkthrough`` list.
    """
    path = Path(task.task_id if isinstance(task, Task) else task)
    data = _read_game_json(path)
    wt = data.get("walkthrough")
    if not isinstance(wt, list) or not all(isinstance(c, str) for c in wt):
        raise EnvError(
            f"ALFWorld game file {path} has no 'walkthrough' list of commands (it may be an older "
            "2.1.1 game file; serl expects ALFWorld 0.4's 2.1.2 game files)."
        )
    return list(wt)


def strip_banner(text: str) -> str:
    """Remove TextWorld's ``-= Welcome to TextWorld, ALFRED! =-`` banner and the blank lines
    after it from the start of an observation."""
    stripped = text.lstrip()
    if stripped.startswith(BANNER):
        return stripped[len(BANNER):].lstrip()
    return text.strip()


def extract_task(observation: str) -> str:
    """The task sentence: the text after ``"Your task is to: "`` (verl-agent's extraction,
    ``langfengQ/verl-agent@574dd5b:agent_system/environments``), stripped; ``""`` if the observation has none."""
    idx = observation.find(TASK_PREFIX)
    if idx < 0:
        return ""
    return observation[idx + len(TASK_PREFIX):].strip()


#: the keys of ``env.alfworld`` (:func:`check_config`)
ALFWORLD_OPTIONS = ("expert",)


def check_config(env_cfg: Any) -> None:
    """Check ``env.alfworld`` (registered as the ``alfworld`` env's config check): its keys are
    :data:`ALFWORLD_OPTIONS`, ``expert`` is null or one of :data:`EXPERT_KINDS`. Imports no engine.

    Raises:
        ConfigError: naming ``env.alfworld`` or ``env.alfworld.expert``.
    """
    from serl.errors import ConfigError

    opts = env_cfg.alfworld
    unknown = sorted(set(opts) - set(ALFWORLD_OPTIONS))
    if unknown:
        raise ConfigError(f"env.alfworld: unknown option(s) {unknown}; valid: {list(ALFWORLD_OPTIONS)}")
    expert = opts.get("expert")
    if expert is not None and expert not in EXPERT_KINDS:
        raise ConfigError(f"env.alfworld.expert: must be null or one of {list(EXPERT_KINDS)}, got {expert!r}")


def is_loop(actions: Sequence[str]) -> bool:
    """A lost episode counted as a loop: at least 6 steps with at most 3 distinct actions (serl's
    definition: the shipped cold start's failure, one inadmissible ``take`` sent until the step
    limit, and cycles between two or three actions)."""
    return len(actions) >= 6 and len(set(actions)) <= 3


class AlfWorldEnv(BaseTextEnv):
    """One ALFWorld game at a time, on TextWorld's PDDL engine (see the module docstring).

    Args:
        max_steps: the episode step limit (verl-agent: 50). ``done`` becomes True when
            the number of ``step`` calls since ``reset`` reaches it.
        data_dir: the data folder used to resolve relative game paths and to set
            ``ALFWORLD_DATA`` (when unset) before alfworld is imported (``alfworld/alfworld`` 0.4.2 otherwise sets it itself);
            see :func:`resolve_data_dir`.

        expert: ``None`` (default: no expert work on any step) or ``"planner"``: every reset and
            step that does not end the episode also asks the planner expert
            (:meth:`expert_plan`) and puts its plan in ``info["expert_plan"]`` (a list of
            commands, the first being the expert's action). :meth:`expert_plan` works either way.

    Every constructor argument is a plain picklable value, so :class:`serl.envs.pool.EnvPool`
    can build the env inside a worker process. The engine (about 80-140 MB RSS) is created at
    the first ``reset`` and reused for every later game via ``env.load``.
    """

    name = "alfworld"
    prompt_builder = "serl.agent.prompts.alfworld:build_prompt"
    turn_builder = "serl.agent.prompts.alfworld:build_turn"
    default_max_steps = DEFAULT_MAX_STEPS
    #: the scripted experts of ``serl data expert alfworld`` (:mod:`serl.envs.alfworld_experts`)
    expert_factory = "serl.envs.alfworld_experts:make_expert"
    expert_names = ("walkthrough", "planner", "search", "sweep")
    expert_options = {"detours": ("walkthrough",), "think": ("sweep",)}

    @classmethod
    def config_kwargs(cls, env_cfg: Any) -> dict[str, Any]:
        """``max_steps``, ``data_dir`` and ``env.alfworld``'s ``expert`` (:func:`check_config`)."""
        return {**super().config_kwargs(env_cfg), **dict(env_cfg.alfworld)}

    def __init__(self, max_steps: int = DEFAULT_MAX_STEPS, data_dir: str | os.PathLike | None = None,
                 expert: str | None = None):
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if expert is not None and expert not in EXPERT_KINDS:
            raise ValueError(f"expert must be None or one of {list(EXPERT_KINDS)}, got {expert!r}")
        self.max_steps = int(max_steps)
        self.expert = expert
        self._planner = AlfWorldPlanner()  # holds only the plan cache; plans only when asked
        self._admissible: list[str] = []  # admissible commands of the current state
        self.data_dir = resolve_data_dir(data_dir)
        self._tw_env = None  # the wrapped TextWorld env, created at the first reset
        self._gamefile: str | None = None  # game of the current episode (None: no episode)
        self._task_text = ""
        self._steps = 0
        self._done = True

    # -- engine --------------------------------------------------------------------------
    def _import_engine(self):
        """Import textworld and alfworld's wrappers, setting ``ALFWORLD_DATA`` first."""
        # alfworld.info overwrites ALFWORLD_DATA with ~/.cache/alfworld (and creates it) if it is
        # unset at import time (``alfworld/alfworld`` 0.4.2). Our game paths are absolute, so the
        # variable only has to point somewhere sensible.
        os.environ.setdefault("ALFWORLD_DATA", str(self.data_dir))
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        except ImportError as e:
            raise EnvError(
                f"the ALFWorld env needs alfworld==0.4.2 (which brings textworld 1.7.0): {e}. "
                "Install it with `pip install alfworld==0.4.2` (needs g++, cmake and make to build "
                "fast-downward-textworld)."
            ) from e
        return textworld, AlfredDemangler, AlfredInfos

    def _resolve_gamefile(self, task_id: str) -> Path:
        path = Path(task_id).expanduser()
        if not path.is_absolute():
            path = self.data_dir / path
        return path

    def _load(self, path: Path) -> None:
        """Load ``path`` into the (reused) engine; :class:`EnvError` if it cannot be loaded."""
        # Parse the JSON ourselves first: a clear error for missing / non-JSON files.
        _read_game_json(path)
        textworld, AlfredDemangler, AlfredInfos = self._import_engine()
        try:
            if self._tw_env is None:
                infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
                self._tw_env = textworld.start(
                    str(path), request_infos=infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos]
                )
            else:
                self._tw_env.load(str(path))
        except Exception as e:
            # A half-loaded engine would silently replay the previous game on reset(): drop it,
            # the next reset builds a fresh one.
            self._drop_engine()
            raise EnvError(
                f"ALFWorld game file {path} could not be loaded by TextWorld ({type(e).__name__}: "
                f"{str(e)[:300]}). The file is probably corrupt or not an ALFWorld 2.1.2 game; "
                f"re-download or re-copy it. {_HOW_TO_GET_DATA}"
            ) from e

    def _drop_engine(self) -> None:
        env, self._tw_env = self._tw_env, None
        if env is not None:
            env.close()

    # -- TextEnv -------------------------------------------------------------------------
    def reset(self, task: Task) -> StepResult:
        """Start the game ``task.task_id`` (a ``game.tw-pddl`` path, absolute or relative to
        ``data_dir``) from its initial state.

        Returns a :class:`StepResult` with the banner-stripped first observation, the task
        sentence in ``task``, the admissible commands, ``reward=0``, and
        ``info={"gamefile": <absolute path>, "task_type": ..., "steps": 0}`` (plus
        ``"expert_plan"`` with ``expert="planner"``).

        Raises:
            EnvError: wrong ``task.env_name``, missing or corrupt game file, or alfworld not
                installed; with ``expert="planner"``, :class:`PlannerError` as :meth:`expert_plan`.
        """
        if task.env_name != self.name:
            raise EnvError(f"AlfWorldEnv got a task for env {task.env_name!r} ({task.task_id}); expected 'alfworld'.")
        self._gamefile = None
        self._done = True
        path = self._resolve_gamefile(task.task_id)
        self._load(path)
        try:
            state = self._tw_env.reset()
        except Exception as e:
            self._drop_engine()
            raise EnvError(
                f"TextWorld failed to reset ALFWorld game {path} ({type(e).__name__}: {str(e)[:300]}). "
                "The game file is probably corrupt; re-download or re-copy it."
            ) from e
        self._gamefile = str(path)
        self._steps = 0
        self._done = False
        self._planner.reset()
        self._admissible = list(state["admissible_commands"] or [])
        observation = strip_banner(state.feedback or "")
        self._task_text = extract_task(observation)
        info = {"gamefile": self._gamefile, "task_type": task.task_type, "steps": 0}
        if self.expert is not None:
            info["expert_plan"] = self.expert_plan()
        return StepResult(
            observation=observation,
            admissible_actions=list(self._admissible),
            reward=0.0,
            done=False,
            won=False,
            feedback="",
            task=self._task_text,
            info=info,
        )

    def step(self, action: str) -> StepResult:
        """Send ``action`` to the engine (as is; inadmissible commands give ``"Nothing
        happens."`` and cost a step).

        Returns a :class:`StepResult` whose ``observation`` and ``feedback`` are both the engine's
        reply, ``reward`` 10.0 on the winning step else 0.0, ``won``, ``done = won or
        steps >= max_steps``, and ``info={"gamefile", "steps"}`` (plus ``"expert_plan"`` with
        ``expert="planner"`` while the episode goes on).

        Raises:
            EnvError: no episode is running (``reset`` not called, it failed, or the episode is
                already done).
            TypeError: ``action`` is not a string.
            PlannerError: with ``expert="planner"``, as :meth:`expert_plan`.
        """
        if self._gamefile is None or self._tw_env is None:
            raise EnvError("AlfWorldEnv.step() called with no game loaded; call reset(task) first.")
        if self._done:
            raise EnvError(
                f"AlfWorldEnv.step() called after the episode of {self._gamefile} ended "
                f"(step {self._steps}/{self.max_steps}); call reset(task) to start a new one."
            )
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        # The engine applies a command iff it is one of the state's admissible commands
        # (textworld 1.7.0, PddlEnv.step); the planner's plan cache needs to know which.
        applied = action.strip() in self._admissible
        state, _score, engine_done = self._tw_env.step(action)
        self._steps += 1
        self._planner.observe(action, applied)
        self._admissible = list(state["admissible_commands"] or [])
        won = bool(state["won"])
        done = won or bool(engine_done) or self._steps >= self.max_steps
        self._done = done
        feedback = (state.feedback or "").strip()
        # extra.gamefile is only set at reset (in ``alfworld/alfworld`` 0.4.2): use our own copy.
        info: dict[str, Any] = {"gamefile": self._gamefile, "steps": self._steps}
        if self.expert is not None and not done:
            info["expert_plan"] = self.expert_plan()
        return StepResult(
            observation=feedback,
            admissible_actions=list(self._admissible),
            reward=WIN_REWARD if won else 0.0,
            done=done,
            won=won,
            feedback=feedback,
            task=self._task_text,
            info=info,
        )

    # -- expert --------------------------------------------------------------------------
    def expert_plan(self) -> list[str]:
        """The planner expert's plan from the current state: admissible commands, first to last,
        that win the game if taken in order (``[]`` once the game is won). Computed only when
        asked: fast-downward on the relevant sub-problem of the current state (about 0.1 s), or
        the rest of the previous plan while the actions taken follow it (no search); see
        :mod:`serl.envs.alfworld_expert` (after ALFWorld's planner expert, ``alfworld/alfworld``
        0.4.2 ``AlfredExpert(expert_type="planner")``, and textworld 1.7.0's ``policy_commands``).
        Works after the episode ended too (e.g. to label the last state).

        Raises:
            EnvError: no game is loaded (``reset`` not called or failed).
            PlannerError: fast-downward found no plan or failed, or its next command is not
                admissible; the message names the game and the actions since the reset.
        """
        if self._gamefile is None or self._tw_env is None:
            raise EnvError("AlfWorldEnv.expert_plan() called with no game loaded; call reset(task) first.")
        return self._planner.plan(self._tw_env, self._gamefile, self._admissible)

    def expert_action(self) -> str:
        """The planner expert's next command from the current state (``expert_plan()[0]``).

        Raises:
            EnvError: no game is loaded, or the game is already won (no action is needed).
            PlannerError: as :meth:`expert_plan`.
        """
        plan = self.expert_plan()
        if not plan:
            raise EnvError(f"AlfWorldEnv.expert_action(): ALFWorld game {self._gamefile} is already won; "
                           "no expert action is needed.")
        return plan[0]

    @property
    def expert_stats(self) -> PlannerStats:
        """The planner expert's counts since this env was built (calls, searches, fallbacks to the
        full problem, seconds per search); ``expert_stats.as_dict()`` for a summary."""
        return self._planner.stats

    @property
    def expert_last_call(self):
        """What the last :meth:`expert_plan` call did (:class:`~serl.envs.alfworld_expert.PlanCall`:
        answered from the cache or searched, its seconds, a fallback), or None."""
        return self._planner.last_call

    def close(self) -> None:
        """Close the TextWorld engine (idempotent); a later ``reset`` starts a new one."""
        self._gamefile = None
        self._done = True
        self._planner.reset()
        self._drop_engine()

    # -- tasks ---------------------------------------------------------------------------
    @classmethod
    def list_tasks(cls, split: str, data_dir: str | os.PathLike | None = None, **kwargs: Any) -> list[Task]:
        """All games of ``split`` (``train``, ``valid_seen``, ``valid_unseen``, ``valid_train``).

        Globs ``<data_dir>/json_2.1.1/<split>/*/*/game.tw-pddl``, sorted by path (deterministic),
        skipping games whose path below the split folder contains ``movable`` or ``Sliced`` as ALFWorld does
        (``alfworld/alfworld`` 0.4.2). ``task_id`` is the absolute game path and ``task_type`` the
        task-folder prefix (:func:`task_type_of`). The ``solvable`` flag is not read (it is true
        for every game of ALFWorld 0.4's data) so listing stays fast.
        ``data_dir`` follows :func:`resolve_data_dir`. Extra keyword arguments are accepted
        for interface compatibility and ignored.

        Raises:
            EnvError: the split folder does not exist or holds no games; the message names the
                folder that was searched and how to get the data.
        """
        root = resolve_data_dir(data_dir)
        folder = root / JSON_DIR / split
        if not folder.is_dir():
            source = "the data_dir argument" if data_dir else ("$SERL_DATA" if os.environ.get("SERL_DATA") else "serl's bundled fixture")
            also = "" if root.name == "alfworld" else f" (and {root / 'alfworld' / JSON_DIR} does not exist either)"
            raise EnvError(
                f"ALFWorld split {split!r} not found: looked in {folder}{also}; the data folder came from "
                f"{source}. {_HOW_TO_GET_DATA}"
            )
        # Like ALFWorld, skip movable / Sliced trials; look only below the split folder so a
        # data path that happens to contain those words does not hide every game.
        games = [
            p
            for p in sorted(folder.glob(f"*/*/{GAME_FILE}"))
            if not any(w in str(p.relative_to(folder)) for w in ("movable", "Sliced"))
        ]
        if not games:
            raise EnvError(f"ALFWorld split folder {folder} holds no */*/{GAME_FILE} files. {_HOW_TO_GET_DATA}")
        return [Task(env_name="alfworld", task_id=str(p), task_type=task_type_of(p)) for p in games]

    # -- metrics -------------------------------------------------------------------------
    @classmethod
    def episode_metrics(cls, trajectories: Sequence[Any]) -> dict[str, float]:
        """How episodes were won and lost, beside the success rate (serl's, for ALFWorld's reports):
        ``alfworld_steps_to_win``, the mean steps of the won episodes; over the lost ones,
        ``alfworld_loop_rate`` (the share that loop, :func:`is_loop`), ``alfworld_repeat_rate``
        (the share of their steps whose action repeats the step before) and
        ``alfworld_receptacles_visited`` (the mean number of distinct places they sent ``go to``:
        a room has about 13–27), and where they stopped on the way to the task's object
        (:func:`target_object`; over the lost episodes whose game path names it):
        ``alfworld_lost_saw_object``, the share in which an observation after an action names an
        instance of it (``apple 2``), and ``alfworld_lost_took_object``, the share that picked one
        up (the engine's ``You pick up the apple 2 from ...``). So a lost game is a search that
        never found the object, a find not taken, or a failure after the take. Over every episode,
        at the states of two decisions a searching agent must make (:meth:`_state_metrics`):
        ``alfworld_open_when_closed``, the share of states with a closed place in front of the
        agent, before its object was named, whose action opens that place; and
        ``alfworld_take_when_takeable``, the share of states where a ``take`` of the task's object
        is admissible whose action is one. A key is absent when no episode is won, or none is lost
        (or, for the object keys, none names its object; for the last two, no such state)."""
        won = [t for t in trajectories if t.won]
        lost = [[s.action for s in t.steps] for t in trajectories if not t.won]
        out: dict[str, float] = {}
        if won:
            out["alfworld_steps_to_win"] = sum(len(t.steps) for t in won) / len(won)
        if lost:
            out["alfworld_loop_rate"] = sum(is_loop(a) for a in lost) / len(lost)
            out["alfworld_repeat_rate"] = sum(sum(x == y for x, y in zip(a, a[1:])) for a in lost) / \
                max(1, sum(len(a) for a in lost))
            out["alfworld_receptacles_visited"] = sum(len({x[6:] for x in a if x.startswith("go to ")})
                                                      for a in lost) / len(lost)
        lost_episodes = [t for t in trajectories if not t.won]
        return {**out, **cls._object_metrics(lost_episodes), **cls._state_metrics(trajectories)}

    @staticmethod
    def _state_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
        """``alfworld_open_when_closed`` and ``alfworld_take_when_takeable`` (:meth:`episode_metrics`).
        A closed place in front: the state's observation says ``The R is closed.`` and ``open R``
        is admissible, and no observation up to it names an instance of the task's object
        (:func:`target_object`; ``apple 2``); the action opens it if it is ``open R``. A takeable
        object: an admissible action starts with ``take <object> ``. Steps without admissible
        actions count for neither."""
        closed = opened = takeable = took = 0
        for t in trajectories:
            obj = target_object(t.task.task_id)
            instance = _instance_pattern(obj) if obj else None
            seen = False
            for s in t.steps:
                obs, action, allowed = s.observation or "", s.action or "", s.admissible_actions or []
                seen = seen or bool(instance and instance.search(obs))
                if obj and any(a.startswith(f"take {obj} ") for a in allowed):
                    takeable += 1
                    took += action.startswith(f"take {obj} ")
                elif not seen and (m := _CLOSED.search(obs)) and f"open {m.group(1)}" in allowed:
                    closed += 1
                    opened += action == f"open {m.group(1)}"
        out = {"alfworld_open_when_closed": opened / closed} if closed else {}
        return {**out, **({"alfworld_take_when_takeable": took / takeable} if takeable else {})}

    @staticmethod
    def _object_metrics(lost: Sequence[Any]) -> dict[str, float]:
        """``alfworld_lost_saw_object`` and ``alfworld_lost_took_object`` (:meth:`episode_metrics`):
        the share of the lost episodes whose task names an object (:func:`target_object`) in which
        some feedback names an instance of it, and in which the agent picked one up."""
        named = [(t, target_object(t.task.task_id)) for t in lost]
        named = [(t, obj) for t, obj in named if obj]
        if not named:
            return {}
        saw = took = 0
        for t, obj in named:
            instance = _instance_pattern(obj)
            saw += any(instance.search(s.feedback or "") for s in t.steps)
            took += any((s.feedback or "").startswith(f"You pick up the {obj} ") for s in t.steps)
        return {"alfworld_lost_saw_object": saw / len(named), "alfworld_lost_took_object": took / len(named)}
