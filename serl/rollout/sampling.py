"""SamplingParams: the sampling settings of one rollout ``generate`` call.

Holds only :class:`SamplingParams`, the small value type every rollout engine takes. It lives
apart from :mod:`serl.rollout.engine` (which re-exports it, so ``from serl.rollout.engine import
SamplingParams`` keeps working) so that engine implementations such as
:mod:`serl.rollout.vllm_engine`, which :mod:`serl.rollout.engine` itself imports, can name it
without importing :mod:`serl.rollout.engine` back. Not here: the engines, their registry and
:func:`serl.rollout.engine.sample`. This module imports nothing from serl.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    """Sampling settings of one ``generate`` call.

    Attributes:
        max_new_tokens: response length cap (tokens).
        temperature: > 0; ignored when ``do_sample`` is False (greedy).
        top_p: nucleus mass in (0, 1].
        top_k: -1 = off.
        do_sample: False = greedy decoding.
        seed: if set, the torch RNG is seeded before sampling (reproducible evaluation).
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    seed: int | None = None
