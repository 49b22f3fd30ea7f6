"""The journal that makes ``serl data expert`` resumable: one JSON line per finished expert episode,
appended (and fsynced) as it ends, so that a stopped run loses at most the episode in flight.

File ``<out>.partial``: a header line ``{"journal": {...}}`` naming the command's arguments (a
rerun with other arguments is refused rather than mixed in), then one line per episode: its task
id and type, outcome, step count, whether it was kept, and its rows. A last line cut by a kill is
dropped when the journal is opened. Once every task is played, :meth:`ExpertJournal.rows` gives the
kept rows in task order and :meth:`ExpertJournal.summary` the counts over every episode, resumed
ones included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serl.rollout.expert import ExpertEpisode, ExpertSummary
from serl.utils import Journal


class ExpertJournal(Journal):
    """Append-only record of one ``serl data expert`` run's finished episodes
    (:class:`serl.utils.Journal`: header, fsynced appends, a cut last line dropped).

    Args:
        path: the journal file (``<out>.partial``); created if missing.
        header: the command's arguments; must equal the header of an existing journal.

    Raises:
        ConfigError: ``path`` holds the journal of a command with other arguments, or is not a
            journal.
    """

    def __init__(self, path: str | Path, header: dict[str, Any]):
        super().__init__(path, header, "serl data expert")

    def done(self) -> set[str]:
        """Task ids already played."""
        return {e["task_id"] for e in self.entries}

    def record(self, ep: ExpertEpisode, kept: bool) -> None:
        """Record one finished episode (its rows only if ``kept``), flushed and fsynced."""
        self.append({"task_id": ep.task.task_id, "task_type": ep.task.task_type, "won": bool(ep.won),
                     "gave_up": bool(ep.gave_up), "task_score": float(ep.task_score), "steps": int(ep.steps),
                     "kept": bool(kept), "rows": ep.rows if kept else []})

    def summary(self) -> ExpertSummary:
        """The counts of :func:`serl.rollout.expert.collect_expert` over every recorded episode."""
        s = ExpertSummary()
        for e in self.entries:
            s.add(e["task_type"], e["won"], e["gave_up"], e["task_score"], e["steps"], e["rows"] if e["kept"] else None)
        return s

    def rows(self, task_ids: list[str]) -> list[dict[str, Any]]:
        """The kept rows in the order of ``task_ids`` (each episode's rows in step order).

        Raises:
            KeyError: a task of ``task_ids`` has not been played.
        """
        by_id = {e["task_id"]: e for e in self.entries}
        missing = [t for t in task_ids if t not in by_id]
        if missing:
            raise KeyError(f"{len(missing)} tasks not played yet, e.g. {missing[0]}")
        return [r for t in task_ids for r in by_id[t]["rows"]]
