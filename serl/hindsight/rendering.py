"""Text rendering of the hindsight contexts: section headers, step renderings, the teacher message.

A leaf module: it imports only the standard library and :mod:`serl.trajectory`, so the teacher
(:mod:`serl.models.teacher`) and the teacher log can build the teacher's user message without
pulling in the mode registry, the judge client or torch.

Original: SERL (arXiv 2605.19447), ``OliverLeeXZ/SERL@5a2a85b:recipe/serl/privileged_context.py``.
The headers are serl's own words with the original's structure (one header line + content per
section; the sections, then a one-line instruction to solve the task).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from serl.trajectory import Step, Trajectory

# --- Section headers and instruction line (serl's own words, the original's structure).
FEEDBACK_HEADER = "Feedback observed right after your action at this step:"
NEXT_OBS_HEADER = "The observation that followed this step:"
FUTURE_HEADER = "What happened later in this same rollout, after this step:"
SUCCESS_HEADER = "A rollout of this same task that succeeded, for reference:"
ANCHOR_HEADER = (
    "Actions that were tried from this same state in rollouts of this task, and how each turned out:"
)
ANCHOR_FEEDBACK_HEADER = "Feedback observed after each action tried from this same state (action, feedback):"
JUDGE_HEADER = "Trajectory Judge:"
REFERENCE_HEADER = "A reference solution of this task, for reference:"
SOLVE_LINE = "Use the information above as hindsight and correctly solve the current task."

SUCCESS_CONTINUATION = "What followed this action in a rollout that succeeded:"
FAILED_CONTINUATION = "What followed this action in a rollout that failed:"
#: anchor-table placeholder for a row that was the last step of its rollout
NO_CONTINUATION = "(the rollout ended with this action; nothing followed it)"
#: action key of a response whose action text is blank
EMPTY_ACTION = "(empty action)"

#: every accepted ``trajectory_format`` name -> canonical name (the original's names and aliases)
TRAJECTORY_FORMATS: dict[str, str] = {
    "response": "response",
    "action": "response",
    "actions": "response",
    "action_series": "response",
    "observation_action": "observation_action",
    "obs_action": "observation_action",
    "observation-action": "observation_action",
}


@dataclass
class PrivilegedContext:
    """The privileged hindsight of one step row.

    Attributes:
        sections: ``(header, content)`` pairs in order; empty contents are never stored.
        sources: which kinds of hindsight are present (``"feedback"``, ``"next_observation"``,
            ``"future"``, ``"success"``, ``"anchor"``, ``"judge"``); used for the per-source
            ``serl/*_reference_fraction`` metrics.
        info: extra facts about the context for metrics and the teacher log, e.g.
            ``success_source`` (``"group"``/``"buffer"``/``"self"``), ``anchor_group_size``,
            ``anchor_action_count``.
    """

    sections: list[tuple[str, str]] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)
    info: dict[str, Any] = field(default_factory=dict)

    def block(self) -> str:
        """The sections as text: header line + content, joined by blank lines."""
        return "\n\n".join(f"{h}\n{c}" for h, c in self.sections)


def teacher_user_message(prompt: str, block: str) -> str:
    """Teacher user message = prompt + blank line + privileged block + blank line + solve line
    (the original's wrapper, ``privileged_context.py``)."""
    return f"{prompt}\n\n{block}\n\n{SOLVE_LINE}"


class StepLike(Protocol):
    """What trajectory rendering needs from a step (a :class:`~serl.trajectory.Step` or a buffered copy)."""

    step_id: int
    prompt: str
    response_text: str


@dataclass
class SlimStep:
    """A step as kept in the success buffer: only what rendering needs (JSON-able)."""

    step_id: int
    prompt: str
    response_text: str


_THINK_RE = re.compile(r"<think\b[^>]*>.*?</think>\s*", re.IGNORECASE | re.DOTALL)
_ACTION_RE = re.compile(r"<action\b[^>]*>(.*?)</action>", re.IGNORECASE | re.DOTALL)


def strip_thinking(text: str) -> str:
    """Remove every ``<think>…</think>`` block and the whitespace after it (the original's
    ``remove_thinking_from_demonstration``); what remains is essentially the
    ``<action>…</action>`` part, tags kept."""
    return _THINK_RE.sub("", text).strip()


def action_key(response_text: str) -> str:
    """The anchor-table key of a response: thinking removed, then the inner text of the first
    ``<action>…</action>`` (the whole remaining text if there is none), whitespace collapsed and
    lower-cased; :data:`EMPTY_ACTION` if blank."""
    text = strip_thinking(response_text)
    m = _ACTION_RE.search(text)
    if m:
        text = m.group(1)
    key = " ".join(text.split()).lower()
    return key or EMPTY_ACTION


def canonical_format(name: str) -> str:
    """Canonical ``trajectory_format`` for ``name`` or an alias.

    Raises:
        ValueError: unknown name (the message lists the valid names).
    """
    if name not in TRAJECTORY_FORMATS:
        raise ValueError(f"unknown trajectory_format {name!r}; valid: {sorted(TRAJECTORY_FORMATS)}")
    return TRAJECTORY_FORMATS[name]


def render_steps(
    steps: Sequence[StepLike], trajectory_format: str, *, remove_thinking: bool = True, max_steps: int = 0
) -> str:
    """Render steps as text per ``trajectory_format`` (the original's ``TRAJECTORY_FORMAT``).

    ``response``: per step ``"Step k"`` / ``"Response:"`` / the response.
    ``observation_action``: per step ``"Step k"`` / ``"Observation:"`` / the full step prompt /
    ``"Action:"`` / the response. ``k`` is the 0-based step id. Steps are joined by blank lines.

    Args:
        steps: the steps to render, in order.
        trajectory_format: a name or alias of :data:`TRAJECTORY_FORMATS`.
        remove_thinking: strip ``<think>`` blocks from responses.
        max_steps: keep only the first ``max_steps`` steps (0 = all); when steps are dropped a
            note saying how many is appended.

    Returns:
        The text; ``""`` for no steps.

    Raises:
        ValueError: unknown format.
    """
    fmt = canonical_format(trajectory_format)
    shown = list(steps[:max_steps]) if max_steps > 0 else list(steps)
    blocks = []
    for s in shown:
        resp = strip_thinking(s.response_text) if remove_thinking else s.response_text.strip()
        if fmt == "response":
            blocks.append(f"Step {s.step_id}\nResponse:\n{resp}")
        else:
            blocks.append(f"Step {s.step_id}\nObservation:\n{s.prompt}\nAction:\n{resp}")
    dropped = len(steps) - len(shown)
    if dropped > 0:
        blocks.append(f"({dropped} more step(s) not shown)")
    return "\n\n".join(blocks)


def future_steps(traj: Trajectory, step: Step) -> list[Step]:
    """The steps of ``traj`` after ``step`` (step id greater than ``step``'s), in order."""
    return [s for s in traj.steps if s.step_id > step.step_id]
