"""The SERL teacher log: sampled per-row JSONL of student and teacher texts (SERL, arXiv 2605.19447;
the original writes them in ``fit`` of ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/ray_trainer.py``).

Opt-in (``algorithm.serl.dump_teacher_log``, default off: a departure, the original wrote every row
of every step, which is large). Every ``teacher_log_every_n_steps`` iterations, up to
``teacher_log_sample_rows`` rows (a uniform sample seeded by the iteration; 0 = all rows) are
written, in batch order, to ``<run_dir>/teacher/<iteration>.jsonl``, atomically. Text fields are
cut to ``teacher_log_max_text_chars`` characters (0 = no cap) with a note of what was cut.

Rows are plain dicts; :func:`teacher_log_row` makes the standard one from a step row and its
:class:`~serl.hindsight.rendering.PrivilegedContext`. The trainer may add fields (e.g. token
weights); any JSON-able value is kept.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from serl.hindsight.rendering import PrivilegedContext, teacher_user_message
from serl.trajectory import Group, Step, Trajectory
from serl.utils import atomic_write_text

if TYPE_CHECKING:
    from serl.config import SerlConfig

LOG_DIR = "teacher"


def teacher_log_row(
    group: Group,
    traj: Trajectory,
    step: Step,
    ctx: Optional[PrivilegedContext],
    *,
    mode: str,
    teacher_prompt: Optional[str] = None,
) -> dict[str, Any]:
    """The standard teacher-log row of one step row.

    Args:
        group, traj, step: the row.
        ctx: its privileged context (None: no context, the teacher prompt is the student prompt).
        mode: the ``sampling_mode`` in use.
        teacher_prompt: the teacher user message actually scored (e.g. after truncation); default
            :func:`~serl.hindsight.rendering.teacher_user_message` of the prompt and the block.

    Returns:
        ``{"uid", "traj_uid", "task_id", "step_id", "mode", "has_context", "sources",
        "section_headers", "student_prompt", "teacher_prompt", "response", "episode_reward",
        "won"}``; ``sources`` and ``section_headers`` describe the context (empty if None).
    """
    if teacher_prompt is None:
        teacher_prompt = step.prompt if ctx is None else teacher_user_message(step.prompt, ctx.block())
    return {
        "uid": group.uid,
        "traj_uid": traj.traj_uid,
        "task_id": traj.task.task_id,
        "step_id": step.step_id,
        "mode": mode,
        "has_context": ctx is not None,
        "sources": sorted(ctx.sources) if ctx is not None else [],
        "section_headers": [h for h, _ in ctx.sections] if ctx is not None else [],
        "student_prompt": step.prompt,
        "teacher_prompt": teacher_prompt,
        "response": step.response_text,
        "episode_reward": traj.episode_reward,
        "won": traj.won,
    }


def _cut(value: Any, max_chars: int) -> Any:
    if max_chars > 0 and isinstance(value, str) and len(value) > max_chars:
        return value[:max_chars] + f" [... {len(value) - max_chars} more chars cut]"
    return value


class TeacherLogWriter:
    """Writes the sampled teacher log of an iteration (see the module docstring).

    Args:
        run_dir: the run folder; files go to ``<run_dir>/teacher/<iteration>.jsonl``.
        cfg: the ``algorithm.serl`` section (``dump_teacher_log``, ``teacher_log_every_n_steps``,
            ``teacher_log_sample_rows``, ``teacher_log_max_text_chars``).
    """

    def __init__(self, run_dir: str | Path, cfg: "SerlConfig"):
        self.dir = Path(run_dir) / LOG_DIR
        self.enabled = bool(cfg.dump_teacher_log)
        self.every = max(1, int(cfg.teacher_log_every_n_steps))
        self.sample_rows = max(0, int(cfg.teacher_log_sample_rows))
        self.max_chars = max(0, int(cfg.teacher_log_max_text_chars))

    def should_write(self, iteration: int) -> bool:
        """True when the log is on and ``iteration % teacher_log_every_n_steps == 0``."""
        return self.enabled and iteration % self.every == 0

    def path(self, iteration: int) -> Path:
        return self.dir / f"{iteration}.jsonl"

    def write(self, iteration: int, rows: list[dict]) -> Optional[Path]:
        """Write a sample of ``rows`` for ``iteration``; returns the file, or None if nothing was
        written (log off, not this iteration, or no rows). Each written row gets an
        ``"iteration"`` and a ``"row"`` (its index in ``rows``) field.

        Raises:
            TypeError: a row is not JSON-serialisable.
        """
        if not self.should_write(iteration) or not rows:
            return None
        idx = list(range(len(rows)))
        if self.sample_rows and len(rows) > self.sample_rows:
            idx = sorted(random.Random(iteration).sample(idx, self.sample_rows))
        lines = []
        for i in idx:
            row = {"iteration": iteration, "row": i}
            row.update({k: _cut(v, self.max_chars) for k, v in rows[i].items()})
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        path = self.path(iteration)
        atomic_write_text(path, "".join(lines))
        return path
