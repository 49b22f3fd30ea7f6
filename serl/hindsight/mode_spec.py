"""ModeSpec: what one ``sampling_mode`` shows (which hindsight parts, at which granularity).

Holds only the :class:`ModeSpec` record. The mode registry and the 20 built-in modes are in
:mod:`serl.hindsight.modes` (which re-exports :class:`ModeSpec`), the functions that build a
context from a spec in :mod:`serl.hindsight.contexts`. It lives apart so that both can name it:
``modes`` imports ``contexts``, so ``contexts`` must not import ``modes`` back. Imports nothing
from serl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ModeSpec:
    """What a ``sampling_mode`` shows (see the tables in ``docs/concepts/serl-modes.md``).

    Attributes:
        name: the canonical mode name.
        granularity: ``"step"``, ``"anchor"`` or ``"trajectory"`` (judge).
        success, feedback, next_observation, future: parts used (S, F, N, U).
        feedback_only_without_success: the ``*_or_immediate_feedback`` modes: F only if no S.
        judge: None, ``"current"`` or ``"on_successful_sample"``.
        reference: the task's reference solution (R, ``Step.info["reference"]``; serl's, for the
            math env: the original's modes do not have it).
    """

    name: str
    granularity: str
    success: bool = False
    feedback: bool = False
    next_observation: bool = False
    future: bool = False
    feedback_only_without_success: bool = False
    judge: Optional[str] = None
    reference: bool = False

    @property
    def sources(self) -> set[str]:
        """Sources this mode can produce (which reference-fraction metrics it logs)."""
        flags = {
            "success": self.success,
            "feedback": self.feedback or self.feedback_only_without_success,
            "next_observation": self.next_observation,
            "future": self.future,
            "anchor": self.granularity == "anchor",
            "judge": bool(self.judge),
            "reference": self.reference,
        }
        return {name for name, on in flags.items() if on}

    @property
    def fallback(self) -> str:
        """One-line description of what happens when a part is missing (for the docs table)."""
        if self.judge:
            return "no context if the judge fails or answers nothing"
        if self.granularity == "anchor":
            if self.name == "anchor_immediate_feedback":
                return "no context if no action in the anchor group has feedback"
            if self.feedback_only_without_success:
                return "always a table; feedback lines only if no S; S appended if found"
            return "always a table (the row is in its own group); S appended if found" if self.success else "always a table"
        if self.feedback_only_without_success:
            return "S if found, else F"
        return "no context unless every part exists (conjunctive)"
