"""Hindsight contexts for SERL: what privileged hindsight the teacher sees for each step row.

SERL (arXiv 2605.19447, ``OliverLeeXZ/SERL@5a2a85b:recipe/serl/privileged_context.py``) scores the
student's own tokens under a teacher prompt = the step prompt + hindsight about that step. One
concern per module; imports flow one way (``rendering <- success <- anchors <- modes``,
``rendering <- judge``, all of them ``<- builder``):

* :mod:`~serl.hindsight.rendering` (a leaf): headers, step rendering, the teacher message.
* :mod:`~serl.hindsight.success`: successful-sample references and the success buffer.
* :mod:`~serl.hindsight.anchors`: anchor clusters, the per-group view, anchor tables.
* :mod:`~serl.hindsight.mode_spec` (a leaf): :class:`ModeSpec`, what a mode shows.
* :mod:`~serl.hindsight.contexts`: the mode functions, a row's context from its :class:`ModeSpec`.
* :mod:`~serl.hindsight.modes`: the ``sampling_mode`` registry (re-exports :class:`ModeSpec`).
* :mod:`~serl.hindsight.judge`: the OpenAI-compatible LLM judge client.
* :mod:`~serl.hindsight.builder`: :class:`SerlContextBuilder`, the trainer's entry point.

The names below are loaded on first access, so ``import serl.hindsight.rendering`` stays light
(no torch, no HTTP client). Nothing here imports :mod:`serl.config` at run time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "rendering": ["PrivilegedContext", "TRAJECTORY_FORMATS", "SOLVE_LINE", "canonical_format", "render_steps",
                  "strip_thinking", "teacher_user_message"],
    "success": ["SUCCESS_SOURCES", "SuccessBuffer", "SuccessRef", "is_successful"],
    "anchors": ["GroupView", "anchor_clusters"],
    "modes": ["MODE_ALIASES", "MODE_NAMES", "MODE_SPECS", "SAMPLING_MODES", "ContextInputs", "ModeSpec",
              "canonical_mode", "register_mode", "resolve_mode"],
    "judge": ["JudgeClient", "JudgeResult", "resolve_api_key"],
    "judge_prompt": ["build_judge_messages"],
    "builder": ["SerlContextBuilder", "build_privileged_contexts"],
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)

if TYPE_CHECKING:
    from serl.hindsight.anchors import GroupView, anchor_clusters
    from serl.hindsight.builder import SerlContextBuilder, build_privileged_contexts
    from serl.hindsight.judge import JudgeClient, JudgeResult, resolve_api_key
    from serl.hindsight.judge_prompt import build_judge_messages
    from serl.hindsight.modes import (
        MODE_ALIASES, MODE_NAMES, MODE_SPECS, SAMPLING_MODES, ContextInputs, ModeSpec, canonical_mode,
        register_mode, resolve_mode,
    )
    from serl.hindsight.rendering import (
        SOLVE_LINE, TRAJECTORY_FORMATS, PrivilegedContext, canonical_format, render_steps, strip_thinking,
        teacher_user_message,
    )
    from serl.hindsight.success import SUCCESS_SOURCES, SuccessBuffer, SuccessRef, is_successful


def __getattr__(name: str) -> Any:
    """Load an exported name from its submodule on first access (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'serl.hindsight' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"serl.hindsight.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
