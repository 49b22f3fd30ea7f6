"""SERL privileged contexts: what hindsight the teacher sees, per ``sampling_mode`` (serl.md §3–§5).

For every step row, a mode returns a :class:`PrivilegedContext` (ordered sections, each a header
and a content) or ``None`` (no context: the row is trained as plain GRPO, ``serl_mask = 0``).
The teacher's user message is the original step prompt + a blank line + the sections joined by
blank lines + a blank line + a one-line instruction to solve the task (serl.md §3.1).

Modes are registered in :data:`SAMPLING_MODES` under the original's names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from serl.trajectory import Group, Step, Trajectory, iter_steps

FEEDBACK_HEADER = "Feedback observed right after your action at this step:"
NEXT_OBS_HEADER = "The observation that followed this step:"
SOLVE_LINE = "Use the information above as hindsight and correctly solve the current task."

TRAJECTORY_FORMATS = {"response", "observation_action"}


@dataclass
class PrivilegedContext:
    """The privileged hindsight of one step row.

    Attributes:
        sections: ``(header, content)`` pairs in order; empty contents are never stored.
        sources: which kinds of hindsight are present (``"feedback"``, ``"next_observation"``,
            ``"future"``, ``"success"``, ``"anchor"``, ``"judge"``); used for the per-source
            reference-fraction metrics of serl.md §8.
    """

    sections: list[tuple[str, str]] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)

    def block(self) -> str:
        """The sections as text: header line + content, joined by blank lines."""
        return "\n\n".join(f"{h}\n{c}" for h, c in self.sections)


def teacher_user_message(prompt: str, block: str) -> str:
    """Teacher user message = prompt + blank line + privileged block + blank line + solve line."""
    return f"{prompt}\n\n{block}\n\n{SOLVE_LINE}"


@dataclass
class ContextInputs:
    """What a mode function may look at for one row: its group, trajectory and step."""

    group: Group
    trajectory: Trajectory
    step: Step
    cfg: object  # the algorithm.serl config section


ModeFn = Callable[[ContextInputs], Optional[PrivilegedContext]]
SAMPLING_MODES: dict[str, ModeFn] = {}
MODE_ALIASES: dict[str, str] = {"env_feedback": "immediate_feedback"}


def register_mode(name: str):
    """Decorator registering a ``sampling_mode`` builder."""

    def deco(fn: ModeFn) -> ModeFn:
        SAMPLING_MODES[name] = fn
        return fn

    return deco


def canonical_mode(name: str) -> str:
    """Map an alias of the original (e.g. ``env_feedback``) to its canonical mode name."""
    return MODE_ALIASES.get(name, name)


def _ctx(*parts: tuple[str, str, str]) -> Optional[PrivilegedContext]:
    """Build a context from ``(source, header, content)`` parts; None if any content is empty
    (step-level modes are conjunctive, serl.md §3.3)."""
    if any(not content.strip() for _, _, content in parts):
        return None
    return PrivilegedContext(sections=[(h, c) for _, h, c in parts], sources={s for s, _, _ in parts})


@register_mode("immediate_feedback")
def _immediate_feedback(x: ContextInputs) -> Optional[PrivilegedContext]:
    """F: the env's reply to this step's action (serl.md §3.3)."""
    return _ctx(("feedback", FEEDBACK_HEADER, x.step.feedback))


@register_mode("next_observation")
def _next_observation(x: ContextInputs) -> Optional[PrivilegedContext]:
    """N: the full templated prompt of the next step (serl.md §3.3, §10.10)."""
    return _ctx(("next_observation", NEXT_OBS_HEADER, x.step.next_prompt))


def build_privileged_contexts(groups: list[Group], cfg) -> list[Optional[PrivilegedContext]]:
    """One privileged context (or None) per step row, in :func:`serl.trajectory.iter_steps` order.

    Args:
        groups: the iteration's groups (all trajectories of each task).
        cfg: the ``algorithm.serl`` config section.

    Raises:
        KeyError: unknown ``sampling_mode`` (normally caught earlier by config validation).
    """
    mode = canonical_mode(cfg.sampling_mode)
    if mode not in SAMPLING_MODES:
        raise KeyError(f"unknown sampling_mode {cfg.sampling_mode!r}; valid: {sorted(SAMPLING_MODES)}")
    fn = SAMPLING_MODES[mode]
    return [fn(ContextInputs(g, t, s, cfg)) for g, t, s in iter_steps(groups)]
