"""Moved: ALFWorld's searching planner expert is :mod:`serl.envs.alfworld_experts.search` (an env's
experts sit with the env). This module re-exports its names for the scripts that still import them
from here (``experiments/learning_report.py``); new code imports the env module."""

from __future__ import annotations

from serl.envs.alfworld_experts.search import (SEARCH_ORDERS, SWEEP_THINK, THINK_MODES,  # noqa: F401
                                               AlfWorldSearchExpert, arrived_at, fetched_object, label_is_seen,
                                               object_type, search_step, state_think, sweep_step)
