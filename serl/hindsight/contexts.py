"""The built-in mode functions: how a ``sampling_mode`` turns one step row into a context.

Each function takes the mode's :class:`~serl.hindsight.mode_spec.ModeSpec` and the row's
:class:`ContextInputs` and returns a :class:`~serl.hindsight.rendering.PrivilegedContext` or None
(no context). :mod:`serl.hindsight.modes` binds them to the 20 mode names. Original: SERL
(arXiv 2605.19447), ``OliverLeeXZ/SERL@5a2a85b:recipe/serl/privileged_context.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from serl.hindsight.anchors import GroupView, anchor_table, rows_by_action
from serl.hindsight.rendering import (
    ANCHOR_FEEDBACK_HEADER,
    ANCHOR_HEADER,
    FEEDBACK_HEADER,
    FUTURE_HEADER,
    JUDGE_HEADER,
    NEXT_OBS_HEADER,
    REFERENCE_HEADER,
    SUCCESS_HEADER,
    PrivilegedContext,
)
from serl.trajectory import Group, Step, Trajectory

if TYPE_CHECKING:
    from serl.config import SerlConfig
    from serl.hindsight.mode_spec import ModeSpec


@dataclass
class ContextInputs:
    """What a mode function may look at for one row.

    Attributes:
        group, trajectory, step: the row.
        cfg: the ``algorithm.serl`` config section.
        view: the group's :class:`~serl.hindsight.anchors.GroupView`; built on demand if None.
        judge_text: the judge's critique of ``trajectory`` (judge modes), None if none.
    """

    group: Group
    trajectory: Trajectory
    step: Step
    cfg: SerlConfig
    view: Optional[GroupView] = None
    judge_text: Optional[str] = None

    def __post_init__(self) -> None:
        if self.view is None:
            self.view = GroupView(self.group, self.cfg, 0)


def _conjunctive(*parts: tuple[str, str, str]) -> Optional[PrivilegedContext]:
    """Context from ``(source, header, content)`` parts; None if any content is empty."""
    if any(not content.strip() for _, _, content in parts):
        return None
    return PrivilegedContext(sections=[(h, c) for _, h, c in parts], sources={s for s, _, _ in parts})


def step_context(spec: ModeSpec, x: ContextInputs) -> Optional[PrivilegedContext]:
    """Step-level modes: the parts of ``spec`` in the order S, U, F, N, R (R: serl's reference
    solution, ``Step.info["reference"]``).

    Conjunctive (the original's rule): None unless every part exists; the
    ``*_or_immediate_feedback`` mode shows S if found, else F.
    """
    parts: list[tuple[str, str, str]] = []
    ref = None
    if spec.success:
        s_text, ref = x.view.success_text(x.trajectory)
        if spec.feedback_only_without_success:
            parts = [("success", SUCCESS_HEADER, s_text) if s_text else ("feedback", FEEDBACK_HEADER, x.step.feedback)]
            return _with_success_source(_conjunctive(*parts), ref)
        parts.append(("success", SUCCESS_HEADER, s_text))
    if spec.future:
        parts.append(("future", FUTURE_HEADER, x.view.future_text(x.trajectory, x.step)))
    if spec.feedback:
        parts.append(("feedback", FEEDBACK_HEADER, x.step.feedback))
    if spec.next_observation:
        parts.append(("next_observation", NEXT_OBS_HEADER, x.step.next_prompt))
    if spec.reference:
        parts.append(("reference", REFERENCE_HEADER, str(x.step.info.get("reference") or "")))
    return _with_success_source(_conjunctive(*parts), ref)


def _with_success_source(ctx: Optional[PrivilegedContext], ref) -> Optional[PrivilegedContext]:
    """Record where S came from (``info["success_source"]``) on a context that exists."""
    if ctx is not None and ref is not None:
        ctx.info["success_source"] = ref.source
    return ctx


def _anchor_feedback_lines(actions) -> list[str]:
    """``"<action>, <feedback>"`` per distinct (action, feedback) pair, first-appearance order."""
    lines = []
    for key, rows in actions.items():
        seen: list[str] = []
        for r in rows:
            fb = " ".join(r.step.feedback.split())
            if fb and fb not in seen:
                seen.append(fb)
        lines.extend(f"{key}, {fb}" for fb in seen)
    return lines


def anchor_context(spec: ModeSpec, x: ContextInputs) -> Optional[PrivilegedContext]:
    """Anchor modes: the table of actions tried from the row's anchor state, + S if found.

    Not conjunctive: the row is in its own anchor cluster, so a table always exists, except in
    ``anchor_immediate_feedback`` (one ``action, feedback`` line per distinct pair; None if no
    action has feedback). ``info`` gets ``anchor_group_size`` and ``anchor_action_count``.
    """
    members = x.view.anchor_members(x.step)
    actions = x.view.cached(("actions", id(members)), lambda: rows_by_action(members))
    info = {"anchor_group_size": len(members), "anchor_action_count": len(actions)}
    if spec.name == "anchor_immediate_feedback":
        lines = _anchor_feedback_lines(actions)
        if not lines:
            return None
        return PrivilegedContext([(ANCHOR_FEEDBACK_HEADER, "\n".join(lines))], {"anchor", "feedback"}, info)
    s_text, ref = x.view.success_text(x.trajectory) if spec.success else ("", None)
    with_feedback = spec.feedback or (spec.feedback_only_without_success and not s_text)
    table, sources = x.view.cached(
        ("table", id(members), with_feedback),
        lambda: anchor_table(actions, x.view, feedback=with_feedback, next_obs=spec.next_observation, future=spec.future),
    )
    ctx = PrivilegedContext([(ANCHOR_HEADER, table)], set(sources), info)
    if s_text:
        ctx.sections.append((SUCCESS_HEADER, s_text))
        ctx.sources.add("success")
        ctx.info["success_source"] = ref.source
    return ctx


def judge_context(spec: ModeSpec, x: ContextInputs) -> Optional[PrivilegedContext]:
    """Judge modes: one "Trajectory Judge" section with the critique, None without one."""
    if not x.judge_text:
        return None
    return PrivilegedContext([(JUDGE_HEADER, x.judge_text)], {"judge"})
