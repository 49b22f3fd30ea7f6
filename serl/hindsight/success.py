"""Success references: which successful rollout ("S") a row's context may show.

The original (SERL, arXiv 2605.19447, ``OliverLeeXZ/SERL@5a2a85b:recipe/serl/privileged_context.py``)
takes S only from the row's own group: the first successful trajectory of the same task in the
same iteration. serl adds an optional per-task buffer of successes from *earlier* iterations
(``algorithm.serl.success_source=buffer``, :class:`SuccessBuffer`); this is serl's extension,
not in the original.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

from serl.hindsight.rendering import SlimStep, StepLike
from serl.trajectory import Group, Trajectory

#: accepted ``algorithm.serl.success_source`` values
SUCCESS_SOURCES = ("group", "buffer")


@dataclass
class SuccessRef:
    """The successful sample S chosen for a row.

    Attributes:
        steps: the steps of the successful trajectory, in order.
        traj_uid: its trajectory id.
        source: ``"group"`` (another rollout of the same group, the original's rule),
            ``"buffer"`` (an earlier iteration, serl's extension) or ``"self"`` (the row's own
            trajectory; only used as the judge reference of
            ``judge_current_traj_on_successful_sample``).
    """

    steps: Sequence[StepLike]
    traj_uid: str
    source: str


def is_successful(traj: Trajectory, success_reward_threshold: float = 1.0) -> bool:
    """A trajectory succeeded if the env reported ``won`` at its last step; fallback: its
    episode reward reaches ``success_reward_threshold`` (> 0), as the original's
    ``rollout_success`` fallback."""
    if traj.won:
        return True
    return success_reward_threshold > 0 and traj.episode_reward >= success_reward_threshold


def task_key(traj_or_group: Trajectory | Group) -> str:
    """Identity of a task across iterations: ``"<env_name>/<task_id>"``."""
    t = traj_or_group.task
    return f"{t.env_name}/{t.task_id}"


class SuccessBuffer:
    """Per-task store of successful trajectories seen in earlier iterations (``success_source=buffer``).

    Bounded: at most ``per_task`` trajectories per task (the newest kept) and ``max_tasks``
    tasks (the task least recently given a success is evicted first). Steps are stored slim
    (:class:`~serl.hindsight.rendering.SlimStep`); the full prompt is kept only when
    ``keep_prompts`` (needed by the ``observation_action`` format), so the buffer stays small
    in checkpoints.

    Raises:
        ValueError: ``per_task`` or ``max_tasks`` below 1.
    """

    def __init__(self, per_task: int = 1, max_tasks: int = 4096, keep_prompts: bool = False):
        if per_task < 1 or max_tasks < 1:
            raise ValueError("SuccessBuffer: per_task and max_tasks must be >= 1")
        self.per_task = per_task
        self.max_tasks = max_tasks
        self.keep_prompts = keep_prompts
        self._data: "OrderedDict[str, list[dict]]" = OrderedDict()

    def __len__(self) -> int:
        """Number of tasks with at least one stored success."""
        return len(self._data)

    def add(self, traj: Trajectory) -> None:
        """Store a successful trajectory under its task (a trajectory already stored is skipped)."""
        key = task_key(traj)
        entries = self._data.pop(key, [])
        if any(e["traj_uid"] == traj.traj_uid for e in entries):
            self._data[key] = entries
            return
        entries.append(
            {
                "traj_uid": traj.traj_uid,
                "steps": [
                    {
                        "step_id": s.step_id,
                        "prompt": s.prompt if self.keep_prompts else "",
                        "response_text": s.response_text,
                    }
                    for s in traj.steps
                ],
            }
        )
        self._data[key] = entries[-self.per_task :]
        while len(self._data) > self.max_tasks:
            self._data.popitem(last=False)

    def newest(self, key: str) -> Optional[SuccessRef]:
        """The newest stored success of task ``key`` (see :func:`task_key`), or None."""
        entries = self._data.get(key)
        if not entries:
            return None
        e = entries[-1]
        return SuccessRef(steps=[SlimStep(**s) for s in e["steps"]], traj_uid=e["traj_uid"], source="buffer")

    def state_dict(self) -> dict:
        """Plain JSON-able data: ``{"tasks": [[key, [entry, ...]], ...]}`` in eviction order."""
        return {"tasks": [[k, [dict(e, steps=[dict(s) for s in e["steps"]]) for e in v]] for k, v in self._data.items()]}

    def load_state_dict(self, d: dict) -> None:
        """Replace the contents with :meth:`state_dict` output (bounds re-applied)."""
        self._data = OrderedDict()
        for key, entries in d.get("tasks", []):
            self._data[key] = [dict(e) for e in entries][-self.per_task :]
        while len(self._data) > self.max_tasks:
            self._data.popitem(last=False)
