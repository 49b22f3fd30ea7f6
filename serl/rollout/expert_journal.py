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

import json
import os
from pathlib import Path
from typing import Any

from serl.errors import ConfigError
from serl.rollout.expert import ExpertEpisode, ExpertSummary


class ExpertJournal:
    """Append-only record of one ``serl data expert`` run's finished episodes.

    Args:
        path: the journal file (``<out>.partial``); created if missing.
        header: the command's arguments; must equal the header of an existing journal.

    Raises:
        ConfigError: ``path`` holds the journal of a command with other arguments, or is not a
            journal.
    """

    def __init__(self, path: str | Path, header: dict[str, Any]):
        self.path = Path(path)
        self.header = json.loads(json.dumps(header))  # as it reads back (tuples as lists)
        self.entries: list[dict[str, Any]] = []
        if self.path.exists():
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(json.dumps({"journal": self.header}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def _load(self) -> None:
        data = self.path.read_bytes()
        good, lines = 0, []  # byte offset after the last complete, parseable line
        for raw in data.splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break
            try:
                lines.append(json.loads(raw))
            except ValueError:
                break
            good += len(raw)
        if not lines or not isinstance(lines[0], dict) or "journal" not in lines[0]:
            raise ConfigError(f"{self.path} is not a serl data expert journal; move it away or pick another --out")
        if lines[0]["journal"] != self.header:
            raise ConfigError(f"{self.path} holds a run with other arguments ({lines[0]['journal']}); rerun that "
                              "command to finish it, or delete the file to start over")
        if good < len(data):  # a line cut by a kill: drop it, so that appends start on a line of their own
            with open(self.path, "r+b") as f:
                f.truncate(good)
        self.entries = lines[1:]

    def done(self) -> set[str]:
        """Task ids already played."""
        return {e["task_id"] for e in self.entries}

    def append(self, ep: ExpertEpisode, kept: bool) -> None:
        """Record one finished episode (its rows only if ``kept``), flushed and fsynced."""
        entry = {"task_id": ep.task.task_id, "task_type": ep.task.task_type, "won": bool(ep.won),
                 "gave_up": bool(ep.gave_up), "task_score": float(ep.task_score), "steps": int(ep.steps),
                 "kept": bool(kept), "rows": ep.rows if kept else []}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.entries.append(entry)

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

    def remove(self) -> None:
        """Delete the journal (after its rows were written out)."""
        self.path.unlink(missing_ok=True)
