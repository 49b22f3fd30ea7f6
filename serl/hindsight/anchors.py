"""Anchor states and the per-group view the modes look things up in.

Anchor modes (SERL, arXiv 2605.19447, ``OliverLeeXZ/SERL@5a2a85b:recipe/serl/privileged_context.py``)
cluster the rows of one group by their raw observation (:attr:`serl.trajectory.Step.observation`,
the prompt if missing), across trajectories *and* step indices, and show the teacher a table of
the actions tried from the row's state with their outcomes. The clustering itself is shared with
GiGPO's anchor states (:func:`serl.algos.anchor_states.anchor_groups`).

:class:`GroupView` also chooses the successful sample S of a row (see :mod:`serl.hindsight.success`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from serl.algos.anchor_states import anchor_groups
from serl.hindsight.rendering import (
    FAILED_CONTINUATION,
    NO_CONTINUATION,
    SUCCESS_CONTINUATION,
    action_key,
    future_steps,
    render_steps,
)
from serl.hindsight.success import SuccessBuffer, SuccessRef, is_successful, task_key
from serl.trajectory import Group, Step, Trajectory

if TYPE_CHECKING:
    from serl.config import SerlConfig


def anchor_clusters(
    observations: Sequence[str],
    step_ids: Sequence[int],
    similarity_thresh: Optional[float] = None,
    backend: str = "rapidfuzz",
) -> list[int]:
    """Cluster the rows of ONE group by their anchor observation.

    A thin wrapper over :func:`serl.algos.anchor_states.anchor_groups` (shared with GiGPO) with
    SERL's visiting order.

    Args:
        observations: the anchor text of each row, in batch order.
        step_ids: each row's step id (the similarity pass visits rows in (step_id, batch
            index) order, as the original).
        similarity_thresh: None = exact equality of the text (the original's default). A float
            strictly in (0, 1) = greedy clustering: a row joins the first existing cluster whose
            representative (its first member) is at least this similar, else it seeds a new one.
        backend: ``rapidfuzz`` (default, serl's): ``fuzz.ratio / 100`` = ``2·LCS / (len a + len b)``;
            ``difflib``: the original's ``SequenceMatcher(None, a, b).ratio()`` (slower; its scores
            are <= rapidfuzz's, so a pair near the threshold may cluster differently).

    Returns:
        A cluster id per row (equal ids = same anchor state).

    Raises:
        ValueError: threshold outside (0, 1) or unknown backend.
    """
    return anchor_groups(
        list(observations), [0] * len(observations), similarity_thresh, order=list(step_ids), backend=backend
    )


@dataclass
class Row:
    """One step row of a group: its trajectory, step, batch index and the trajectory's success."""

    traj: Trajectory
    step: Step
    batch_index: int
    success: bool

    @property
    def ret(self) -> float:
        """The row's return: its trajectory's episode reward."""
        return self.traj.episode_reward


class GroupView:
    """What the modes may look up about one group: its rows, success choice and anchors.

    Built once per group per :meth:`serl.hindsight.builder.SerlContextBuilder.build`; anchors
    are computed lazily, renderings are cached.

    Args:
        group: the group.
        cfg: the ``algorithm.serl`` section.
        first_batch_index: batch index of the group's first row.
        buffer: the success buffer (``success_source=buffer``), or None.
    """

    def __init__(self, group: Group, cfg: SerlConfig, first_batch_index: int, buffer: Optional[SuccessBuffer] = None):
        self.group = group
        self.cfg = cfg
        self.buffer = buffer
        thr = float(cfg.success_reward_threshold)
        self.success = {t.traj_uid: is_successful(t, thr) for t in group.trajectories}
        self.rows: list[Row] = []
        bi = first_batch_index
        for t in group.trajectories:
            for s in t.steps:
                self.rows.append(Row(t, s, bi, self.success[t.traj_uid]))
                bi += 1
        self._anchor_ids: Optional[list[int]] = None
        self._members: dict[int, list[Row]] = {}
        self._cache: dict[tuple, Any] = {}
        self._row_pos = {id(r.step): k for k, r in enumerate(self.rows)}

    def success_for(self, traj: Trajectory, *, allow_self: bool = False) -> Optional[SuccessRef]:
        """The successful sample S for rows of ``traj``: the first successful trajectory of the
        group in group order, skipping ``traj`` itself when ``dont_reprompt_on_self_success``
        (the original's rule); else, with ``success_source=buffer``, the newest success of this
        task from an earlier iteration (serl's extension); else (``allow_self``, judge reference
        only) ``traj`` itself if it succeeded; else None."""
        skip_self = bool(self.cfg.dont_reprompt_on_self_success)
        for t in self.group.trajectories:
            if skip_self and t is traj:
                continue
            if self.success[t.traj_uid] and t.steps:
                return SuccessRef(steps=t.steps, traj_uid=t.traj_uid, source="group")
        if self.buffer is not None and self.cfg.success_source == "buffer":
            ref = self.buffer.newest(task_key(traj))
            if ref is not None:
                return ref
        if allow_self and self.success.get(traj.traj_uid) and traj.steps:
            return SuccessRef(steps=traj.steps, traj_uid=traj.traj_uid, source="self")
        return None

    def success_text(self, traj: Trajectory) -> tuple[str, Optional[SuccessRef]]:
        """The rendered S of ``traj``'s rows (``""`` if none) and its reference; cached per trajectory."""

        def make() -> tuple[str, Optional[SuccessRef]]:
            ref = self.success_for(traj)
            if ref is None:
                return "", None
            text = render_steps(
                ref.steps,
                self.cfg.trajectory_format,
                remove_thinking=self.cfg.remove_thinking_from_demonstration,
                max_steps=self.cfg.max_traj_context_steps,
            )
            return text, ref

        return self.cached(("success", traj.traj_uid), make)

    def future_text(self, traj: Trajectory, step: Step) -> str:
        """The rendered rest of ``traj`` after ``step`` (U), capped at ``max_future_context_steps``."""
        return render_steps(
            future_steps(traj, step),
            self.cfg.trajectory_format,
            remove_thinking=self.cfg.remove_thinking_from_demonstration,
            max_steps=self.cfg.max_future_context_steps,
        )

    def anchor_members(self, step: Step) -> list[Row]:
        """The rows of the group in ``step``'s anchor cluster (itself included), batch order."""
        if self._anchor_ids is None:
            obs = [r.step.observation or r.step.prompt for r in self.rows]
            thr = float(self.cfg.anchor_similarity_thresh) if self.cfg.anchor_enable_similarity else None
            backend = self.cfg.anchor_similarity_backend
            self._anchor_ids = anchor_clusters(obs, [r.step.step_id for r in self.rows], thr, backend)
        cid = self._anchor_ids[self._row_pos[id(step)]]
        if cid not in self._members:
            self._members[cid] = [r for r, c in zip(self.rows, self._anchor_ids) if c == cid]
        return self._members[cid]

    def cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        """Memoise a per-group value (e.g. an anchor table shared by all rows of a cluster)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def _outcome(r: Row) -> str:
    return f"{'success' if r.success else 'failure'}, reward {r.ret:.4f}"


def best_row(rows: list[Row]) -> Row:
    """Highest return; ties -> smallest step id, then smallest batch index (the original's rule)."""
    return max(rows, key=lambda r: (r.ret, -r.step.step_id, -r.batch_index))


def worst_row(rows: list[Row]) -> Row:
    """Lowest return; ties -> largest step id, then largest batch index (the original's rule)."""
    return min(rows, key=lambda r: (r.ret, -r.step.step_id, -r.batch_index))


def rows_by_action(members: list[Row]) -> "OrderedDict[str, list[Row]]":
    """The rows of an anchor cluster grouped by :func:`~serl.hindsight.rendering.action_key`,
    actions in order of first appearance (batch order)."""
    out: "OrderedDict[str, list[Row]]" = OrderedDict()
    for r in sorted(members, key=lambda r: r.batch_index):
        out.setdefault(action_key(r.step.response_text), []).append(r)
    return out


def anchor_table(
    actions: "OrderedDict[str, list[Row]]", view: GroupView, *, feedback: bool, next_obs: bool, future: bool
) -> tuple[str, set[str]]:
    """The anchor table: one block per distinct action tried from the state.

    Per action: the action, times tried, successes k/n, mean return (4 decimals), best and
    worst outcome; with ``feedback`` / ``next_obs`` the feedback / next observation after the
    best outcome (and after the worst if different); with ``future`` the continuation of the
    best successful and of the worst failed row (:data:`NO_CONTINUATION` if that row ended
    its rollout).

    Returns:
        ``(text, sources)``: the blocks joined by blank lines and the hindsight sources shown.
    """
    blocks, sources = [], {"anchor"}
    for key, rows in actions.items():
        n = len(rows)
        k = sum(r.success for r in rows)
        mean = sum(r.ret for r in rows) / n
        best, worst = best_row(rows), worst_row(rows)
        lines = [
            f"Action: {key}",
            f"Tried {n} time(s); succeeded {k}/{n}; mean return {mean:.4f}.",
            f"Best outcome: {_outcome(best)}.",
            f"Worst outcome: {_outcome(worst)}.",
        ]
        for wanted, attr, label, src in (
            (feedback, "feedback", "Feedback", "feedback"),
            (next_obs, "next_prompt", "Next observation", "next_observation"),
        ):
            if not wanted:
                continue
            b, w = getattr(best.step, attr).strip(), getattr(worst.step, attr).strip()
            if b:
                lines.append(f"{label} after the best outcome:\n{b}")
                sources.add(src)
            if w and w != b:
                lines.append(f"{label} after the worst outcome:\n{w}")
                sources.add(src)
        if future:
            succ = [r for r in rows if r.success]
            fail = [r for r in rows if not r.success]
            for subset, pick, label in ((succ, best_row, SUCCESS_CONTINUATION), (fail, worst_row, FAILED_CONTINUATION)):
                if not subset:
                    continue
                r = pick(subset)
                text = view.future_text(r.traj, r.step)
                if text:
                    sources.add("future")
                lines.append(f"{label}\n{text or NO_CONTINUATION}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks), sources
