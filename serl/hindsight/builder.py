"""The stateful entry point: one privileged context (or None) per step row of an iteration.

:class:`SerlContextBuilder` holds what spans iterations: the success buffer of
``success_source=buffer`` (serl's extension) and the judge client of the judge modes;
:func:`build_privileged_contexts` is a stateless wrapper around it. Original: SERL
(arXiv 2605.19447), ``OliverLeeXZ/SERL@5a2a85b:recipe/serl/privileged_context.py`` (contexts) and
``agent_system/multi_turn_rollout/rollout_loop.py`` (judge calls).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

from serl.errors import JudgeError
from serl.hindsight.anchors import GroupView
from serl.hindsight.judge import JudgeClient
from serl.hindsight.judge_prompt import build_judge_messages
from serl.hindsight.modes import MODE_SPECS, SAMPLING_MODES, ContextInputs, resolve_mode
from serl.hindsight.rendering import PrivilegedContext, canonical_format
from serl.hindsight.success import SuccessBuffer
from serl.trajectory import Group

if TYPE_CHECKING:
    from serl.config import SerlConfig

log = logging.getLogger(__name__)

#: context source -> the ``serl/*`` metric names of its reference fraction
_SOURCE_METRICS = {
    "success": ["serl/success_reference_fraction"],
    "feedback": ["serl/feedback_reference_fraction"],
    "next_observation": ["serl/next_observation_reference_fraction", "serl/next_state_reference_fraction"],
    "future": ["serl/future_reference_fraction"],
    "anchor": ["serl/anchor_reference_fraction"],
    "judge": ["serl/traj_judge_reference_fraction"],
    "reference": ["serl/reference_solution_reference_fraction"],
}


class SerlContextBuilder:
    """Builds the privileged contexts of each iteration; holds the state that spans iterations.

    State: the success buffer (``success_source=buffer``) and the judge client (judge modes,
    created on first use). Call :meth:`build` once per training iteration while λ_eff > 0, on
    the iteration's groups, before the teacher forward; then :meth:`metrics` for logging.
    Checkpoint :meth:`state_dict`.

    Args:
        cfg: the ``algorithm.serl`` config section, already checked by
            :meth:`serl.config.SerlConfig.validate` and :func:`serl.hindsight.modes.check_config`
            (:func:`serl.configure.load_config` does both).
        judge_client: a :class:`~serl.hindsight.judge.JudgeClient` to use instead of one built
            from ``cfg`` (tests, sharing).

    Raises:
        ValueError: unknown ``sampling_mode`` or ``trajectory_format`` (a config that skipped
            validation).
    """

    def __init__(self, cfg: SerlConfig, *, judge_client: Optional[JudgeClient] = None):
        self.cfg = cfg
        self.mode = resolve_mode(cfg.sampling_mode)
        self.spec = MODE_SPECS[self.mode]
        self.buffer: Optional[SuccessBuffer] = None
        if cfg.success_source == "buffer":
            self.buffer = SuccessBuffer(
                cfg.success_buffer_per_task,
                cfg.success_buffer_max_tasks,
                keep_prompts=canonical_format(cfg.trajectory_format) == "observation_action",
            )
        self._judge = judge_client
        self._metrics: dict[str, float] = {}

    # -- judge ---------------------------------------------------------------------------------

    def _judge_client(self) -> JudgeClient:
        if self._judge is None:
            self._judge = JudgeClient.from_config(self.cfg)
        return self._judge

    def _judge_requests(self, groups: list[Group], views: list[GroupView]) -> tuple[list, list]:
        """The non-empty trajectories of ``groups`` and one judge request (chat messages) each."""
        cfg = self.cfg
        trajs, requests = [], []
        for g, view in zip(groups, views):
            for t in g.trajectories:
                if not t.steps:
                    continue
                ref = view.success_for(t, allow_self=True) if self.spec.judge == "on_successful_sample" else None
                requests.append(
                    build_judge_messages(
                        t,
                        trajectory_format=cfg.trajectory_format,
                        remove_thinking=cfg.remove_thinking_from_demonstration,
                        max_steps=cfg.max_traj_context_steps,
                        include_feedback=cfg.judge_include_feedback,
                        reference=ref,
                    )
                )
                trajs.append(t)
        return trajs, requests

    def _run_judge(self, groups: list[Group], views: list[GroupView]) -> tuple[dict[str, Optional[str]], dict]:
        """Judge every non-empty trajectory once. Returns ``({traj_uid: text or None}, stats)``.

        Raises:
            serl.errors.JudgeError: a failed request with ``judge_request_strict=true``.
        """
        cfg = self.cfg
        trajs, requests = self._judge_requests(groups, views)
        t0 = time.monotonic()
        results = self._judge_client().judge_many(requests) if requests else []
        failed = [r for r in results if r.error is not None]
        empty = [r for r in results if r.error is None and r.text is None]
        if failed:
            msg = f"LLM judge failed for {len(failed)}/{len(results)} trajectories (first error: {failed[0].error})"
            if cfg.judge_request_strict:
                raise JudgeError(
                    msg + ". Check that an OpenAI-compatible server answers at "
                    f"algorithm.serl.judge_api_url={cfg.judge_api_url!r}, or set "
                    "algorithm.serl.judge_request_strict=false to train those rows without context."
                )
            log.warning("%s; those trajectories get no privileged context this iteration "
                        "(judge_request_strict=false).", msg)
        texts: dict[str, Optional[str]] = {}
        for t, r in zip(trajs, results):
            texts[t.traj_uid] = r.text
            t.extra["serl_judge"] = r.text
        n = max(1, len(results))
        stats = {
            "serl/judge_requests": float(len(results)),
            "serl/judge_failure_fraction": len(failed) / n,
            "serl/judge_empty_fraction": len(empty) / n,
            "serl/judge_seconds": time.monotonic() - t0,
        }
        return texts, stats

    # -- main ----------------------------------------------------------------------------------

    def build(self, groups: list[Group], *, evaluation: bool = False) -> list[Optional[PrivilegedContext]]:
        """One context (or None) per step row, in :func:`serl.trajectory.iter_steps` order.

        Judge modes call the judge once per trajectory (never on ``evaluation`` rollouts unless
        ``judge_on_validation``; then those rows get None) and store the critique in
        ``trajectory.extra["serl_judge"]``. After a training build (``evaluation=False``) the
        groups' successful trajectories are added to the success buffer (``success_source=buffer``),
        so the buffer only ever offers successes from *earlier* iterations.

        Raises:
            serl.errors.JudgeError: judge failure with ``judge_request_strict=true``.
        """
        views, bi = [], 0
        for g in groups:
            views.append(GroupView(g, self.cfg, bi, self.buffer))
            bi += len(views[-1].rows)
        judge_texts: dict[str, Optional[str]] = {}
        judge_stats: dict[str, float] = {}
        if self.spec.judge and (not evaluation or self.cfg.judge_on_validation):
            judge_texts, judge_stats = self._run_judge(groups, views)
        fn = SAMPLING_MODES[self.mode]
        contexts: list[Optional[PrivilegedContext]] = []
        for g, view in zip(groups, views):
            for r in view.rows:
                x = ContextInputs(g, r.traj, r.step, self.cfg, view, judge_texts.get(r.traj.traj_uid))
                contexts.append(fn(x))
        self._metrics = self._compute_metrics(contexts, judge_stats)
        if self.buffer is not None and not evaluation:
            for g, view in zip(groups, views):
                for t in g.trajectories:
                    if view.success[t.traj_uid] and t.steps:
                        self.buffer.add(t)
        return contexts

    def _compute_metrics(self, contexts: list[Optional[PrivilegedContext]], judge_stats: dict) -> dict[str, float]:
        n = len(contexts)
        if n == 0:
            return dict(judge_stats)
        have = [c for c in contexts if c is not None]
        m = {"serl/reprompt_sample_fraction": len(have) / n, "serl/context_available_fraction": len(have) / n}
        for src in sorted(self.spec.sources):
            frac = sum(src in c.sources for c in have) / n
            for key in _SOURCE_METRICS[src]:
                m[key] = frac
        if "success" in self.spec.sources and self.buffer is not None:
            m["serl/success_buffer_reference_fraction"] = sum(c.info.get("success_source") == "buffer" for c in have) / n
            m["serl/success_buffer_tasks"] = float(len(self.buffer))
        anchor = [c for c in have if "anchor_group_size" in c.info]
        if anchor:
            m["serl/anchor_group_size_mean"] = sum(c.info["anchor_group_size"] for c in anchor) / len(anchor)
            m["serl/anchor_action_count_mean"] = sum(c.info["anchor_action_count"] for c in anchor) / len(anchor)
        m.update(judge_stats)
        return m

    def metrics(self) -> dict[str, float]:
        """The ``serl/*`` context metrics of the last :meth:`build` (fractions in [0, 1]).

        Always: ``serl/reprompt_sample_fraction`` = ``serl/context_available_fraction`` (rows
        with a context / rows). Per source the mode can produce (logged even when 0, unlike the
        original, which logged only non-zero counts): ``serl/success_reference_fraction``,
        ``serl/feedback_reference_fraction``, ``serl/next_observation_reference_fraction`` (+ the
        duplicate ``serl/next_state_reference_fraction``), ``serl/future_reference_fraction``,
        ``serl/anchor_reference_fraction``, ``serl/traj_judge_reference_fraction`` (rows whose
        context contains that source / all rows). Anchor modes: ``serl/anchor_group_size_mean``,
        ``serl/anchor_action_count_mean`` (over rows with an anchor context). Buffer:
        ``serl/success_buffer_reference_fraction``, ``serl/success_buffer_tasks``. Judge:
        ``serl/judge_requests``, ``serl/judge_failure_fraction``, ``serl/judge_empty_fraction``,
        ``serl/judge_seconds`` (seconds).
        """
        return dict(self._metrics)

    def state_dict(self) -> dict:
        """Plain JSON-able state for checkpoints: ``{"version": 1, "success_buffer": ... or None}``."""
        return {"version": 1, "success_buffer": self.buffer.state_dict() if self.buffer is not None else None}

    def load_state_dict(self, d: dict) -> None:
        """Restore :meth:`state_dict` output. A buffer saved by a run with ``success_source=buffer``
        is ignored (with a log line) when this run does not use the buffer."""
        saved = d.get("success_buffer")
        if saved is None:
            return
        if self.buffer is None:
            log.info("serl context state: ignoring a saved success buffer (success_source != buffer)")
            return
        self.buffer.load_state_dict(saved)

    def close(self) -> None:
        """Release the judge client's connections (if one was created here)."""
        if self._judge is not None and hasattr(self._judge, "close"):
            self._judge.close()


def build_privileged_contexts(groups: list[Group], cfg: SerlConfig) -> list[Optional[PrivilegedContext]]:
    """Stateless wrapper: one context (or None) per step row, in :func:`serl.trajectory.iter_steps`
    order, with a fresh :class:`SerlContextBuilder` (no buffer carried across calls).

    Raises:
        ValueError: unknown ``sampling_mode`` (a config that skipped validation).
    """
    builder = SerlContextBuilder(cfg)
    try:
        return builder.build(groups)
    finally:
        builder.close()
