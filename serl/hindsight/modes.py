"""The ``sampling_mode`` registry: what hindsight each mode shows, and the built-in modes.

For every step row a mode returns a :class:`~serl.hindsight.rendering.PrivilegedContext` or
``None`` (no context: the row is trained as plain GRPO, ``serl_mask = 0``). The original's 20
names are registered (SERL, arXiv 2605.19447,
``OliverLeeXZ/SERL@5a2a85b:recipe/serl/privileged_context.py``; table in ``docs/concepts/serl-modes.md``;
the functions are in :mod:`serl.hindsight.contexts`; :class:`ModeSpec` is in
:mod:`serl.hindsight.mode_spec` and re-exported here):

* 9 **step-level** modes built from four parts of the row's own rollout: F = immediate feedback
  (:attr:`Step.feedback`), N = next observation (:attr:`Step.next_prompt`), U = the rest of this
  rollout after the step, S = a successful rollout of the same task. They are *conjunctive*: a
  row gets a context only if every listed part exists, except
  ``successful_sample_or_immediate_feedback`` (S, else F).
* 9 **anchor** modes (:mod:`serl.hindsight.anchors`): a table of the actions tried from the
  row's state across the group; S is appended when one exists. Not conjunctive.
* 2 **judge** modes: an LLM judge (:mod:`serl.hindsight.judge`) critiques each trajectory
  once; every row of that trajectory gets the critique.

:func:`register_mode` adds a mode; :func:`check_config` checks ``algorithm.serl.sampling_mode``
against :data:`SAMPLING_MODES` (and the keys that depend on the mode) when a config is loaded
(:func:`serl.configure.check_config`).
"""

from __future__ import annotations

import itertools
from functools import partial
import math
from typing import TYPE_CHECKING, Callable, Optional

from serl.errors import ConfigError
from serl.hindsight.contexts import ContextInputs, anchor_context, judge_context, step_context
from serl.hindsight.mode_spec import ModeSpec
from serl.hindsight.rendering import TRAJECTORY_FORMATS, PrivilegedContext
from serl.hindsight.success import SUCCESS_SOURCES

if TYPE_CHECKING:
    from serl.config import SerlConfig

__all__ = ["MODE_ALIASES", "MODE_NAMES", "MODE_SPECS", "SAMPLING_MODES", "ContextInputs", "ModeFn", "ModeSpec",
           "canonical_mode", "check_config", "register_mode", "resolve_mode"]


ModeFn = Callable[[ContextInputs], Optional[PrivilegedContext]]
#: canonical mode name -> mode function
SAMPLING_MODES: dict[str, ModeFn] = {}
#: canonical mode name -> its :class:`ModeSpec`
MODE_SPECS: dict[str, ModeSpec] = {}
#: alias of the original -> canonical mode name
MODE_ALIASES: dict[str, str] = {}


def register_mode(name: str, spec: Optional[ModeSpec] = None):
    """Decorator registering a ``sampling_mode`` function (and its :class:`ModeSpec`)."""

    def deco(fn: ModeFn) -> ModeFn:
        SAMPLING_MODES[name] = fn
        MODE_SPECS[name] = spec or ModeSpec(name, "step")
        return fn

    return deco


def canonical_mode(name: str) -> str:
    """Map an alias of the original (e.g. ``env_feedback``) to its canonical mode name; an
    unknown name is returned unchanged (see :func:`resolve_mode` for a checking version)."""
    return MODE_ALIASES.get(name, name)


def resolve_mode(name: str) -> str:
    """Canonical mode name of ``name`` or an alias.

    Raises:
        ValueError: unknown name (the message lists the valid names and aliases).
    """
    mode = canonical_mode(name)
    if mode not in SAMPLING_MODES:
        raise ValueError(
            f"unknown sampling_mode {name!r}; valid: {sorted(SAMPLING_MODES)} "
            f"(aliases: {sorted(MODE_ALIASES)})"
        )
    return mode


def _builtin_specs() -> list[ModeSpec]:
    """The original's 20 modes, in documentation order."""
    step_modes = [
        ModeSpec("immediate_feedback", "step", feedback=True),
        ModeSpec("next_observation", "step", next_observation=True),
        ModeSpec("future_trajectory", "step", future=True),
        ModeSpec("successful_sample_or_immediate_feedback", "step", success=True, feedback_only_without_success=True),
        ModeSpec("successful_sample_immediate_feedback", "step", success=True, feedback=True),
        ModeSpec("successful_sample_next_observation", "step", success=True, next_observation=True),
        ModeSpec("successful_sample_future_trajectory", "step", success=True, future=True),
        ModeSpec("successful_sample_future_trajectory_immediate_feedback", "step", success=True, future=True, feedback=True),
        ModeSpec(
            "successful_sample_future_trajectory_next_observation", "step", success=True, future=True, next_observation=True
        ),
    ]
    anchor_modes = [ModeSpec("anchor_immediate_feedback", "anchor", feedback=True)] + [
        ModeSpec("anchor_" + s.name, "anchor", success=s.success, feedback=s.feedback,
                 next_observation=s.next_observation, future=s.future,
                 feedback_only_without_success=s.feedback_only_without_success)
        for s in step_modes[1:]
    ]
    judge_modes = [
        ModeSpec("judge_current_traj", "trajectory", judge="current"),
        ModeSpec("judge_current_traj_on_successful_sample", "trajectory", judge="on_successful_sample"),
    ]
    return step_modes + anchor_modes + judge_modes


def _register_builtin_modes() -> None:
    builders = {"step": step_context, "anchor": anchor_context, "trajectory": judge_context}
    for spec in _builtin_specs():
        register_mode(spec.name, spec)(partial(builders[spec.granularity], spec))
    # Aliases: the original's synonyms ``env_feedback`` (for immediate_feedback) and
    # ``successful_trajectory`` (for successful_sample), plus ``next_state`` (next_observation,
    # cf. the duplicate ``serl/next_state_reference_fraction`` metric), in every combination.
    subs = [("immediate_feedback", "env_feedback"), ("successful_sample", "successful_trajectory"),
            ("next_observation", "next_state")]
    for name in list(SAMPLING_MODES):
        for mask in itertools.product([False, True], repeat=len(subs)):
            alias = name
            for use, (old, new) in zip(mask, subs):
                if use:
                    alias = alias.replace(old, new)
            if alias != name:
                MODE_ALIASES[alias] = name


_register_builtin_modes()

#: the 20 canonical mode names, in documentation order
MODE_NAMES: tuple[str, ...] = tuple(SAMPLING_MODES)

#: serl's modes for one-row-per-trajectory envs (the math env), not in the original: the
#: teacher sees a successful sibling rollout of the same task (S alone; the original has S only
#: combined with other parts) or the task's reference solution (R, ``Step.info["reference"]``)
for _spec in (ModeSpec("successful_sample", "step", success=True),
              ModeSpec("reference_solution", "step", reference=True)):
    register_mode(_spec.name, _spec)(partial(step_context, _spec))
#: the modes SERL supports on rows holding a whole trajectory (``serl.envs.base.row_layout``
#: ``trajectory``): the others need per-step feedback, next observations or anchor states
TRAJECTORY_ROW_MODES = ("successful_sample", "reference_solution")


def check_config(serl_cfg: "SerlConfig") -> None:
    """Check the ``algorithm.serl`` keys that depend on the hindsight registries:
    ``sampling_mode`` (a name or alias of :data:`SAMPLING_MODES`), ``trajectory_format``
    (:data:`~serl.hindsight.rendering.TRAJECTORY_FORMATS`), ``success_source``
    (:data:`~serl.hindsight.success.SUCCESS_SOURCES`) and, for a judge mode
    (:attr:`ModeSpec.judge`), the ``judge_*`` settings. The mode-independent ranges are checked by
    :meth:`serl.config.SerlConfig.validate`. Called by :func:`serl.configure.check_config`, before
    any model loads.

    Raises:
        ConfigError: the first bad value; the message names the full key (``algorithm.serl.<key>``).
    """

    def check(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"algorithm.serl.{key}: {msg}")

    c = serl_cfg
    try:
        mode = resolve_mode(c.sampling_mode)
    except ValueError as e:
        raise ConfigError(f"algorithm.serl.sampling_mode: {e}") from None
    check(c.trajectory_format in TRAJECTORY_FORMATS, "trajectory_format",
          f"unknown format {c.trajectory_format!r}; valid: {sorted(TRAJECTORY_FORMATS)}")
    check(c.success_source in SUCCESS_SOURCES, "success_source",
          f"must be one of {list(SUCCESS_SOURCES)}, got {c.success_source!r}")
    if MODE_SPECS[mode].judge:
        check(c.judge_api_url.startswith(("http://", "https://")), "judge_api_url",
              f"must be an http(s) URL such as http://localhost:8000/v1, got {c.judge_api_url!r}")
        check(c.judge_timeout > 0, "judge_timeout", "must be > 0 seconds")
        check(c.judge_batch_timeout > 0, "judge_batch_timeout", "must be > 0 seconds")
        check(c.judge_request_retries >= 0, "judge_request_retries", "must be >= 0")
        check(c.judge_max_concurrency >= 1, "judge_max_concurrency", "must be >= 1")
        check(c.judge_max_tokens >= 1, "judge_max_tokens", "must be >= 1")
        check(c.judge_retry_max_tokens >= 1, "judge_retry_max_tokens", "must be >= 1")
        check(math.isfinite(c.judge_temperature) and c.judge_temperature >= 0, "judge_temperature",
              f"must be finite and >= 0, got {c.judge_temperature}")
