"""Distribution of ALFWorld expert-plan lengths (walkthrough steps) per task type and split.

Reads the ``walkthrough`` list of every ``game.tw-pddl`` that :meth:`AlfWorldEnv.list_tasks`
lists (movable / Sliced trials skipped, as ALFWorld does); no env is started. Prints one
Markdown table: games, min / median / p90 / max walkthrough length per task type and split.
The expert trajectory of a game (``serl data expert alfworld``) has exactly that many steps.

    python benchmarks/expert_plan_lengths.py                      # shipped fixture + shared data
    python benchmarks/expert_plan_lengths.py --data-dir DIR --splits train valid_seen
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir, walkthrough
from serl.errors import EnvError

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """The full ALFWorld data next to the checkout (``../shared/data/alfworld``, also looked for
    one level higher for a git worktree), or None."""
    for base in (REPO.parent, REPO.parent.parent):
        d = base / "shared" / "data" / "alfworld"
        if d.is_dir():
            return d
    return None


def percentile(values: list[int], q: float) -> int:
    """Nearest-rank percentile ``q`` in (0, 100] of a non-empty list."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def plan_lengths(data_dir: Path, split: str) -> dict[str, list[int]]:
    """``{task_type: [walkthrough length per game]}`` of one split; raises EnvError if absent."""
    out: dict[str, list[int]] = defaultdict(list)
    for task in AlfWorldEnv.list_tasks(split, data_dir):
        out[task.task_type].append(len(walkthrough(task)))
    return dict(out)


def table(rows: list[tuple[str, str, list[int]]]) -> str:
    lines = ["| data | split | task type | games | min | median | p90 | max |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for source, split, ttype, lens in rows:
        lines.append(f"| {source} | {split} | {ttype} | {len(lens)} | {min(lens)} | "
                     f"{statistics.median(lens):g} | {percentile(lens, 90)} | {max(lens)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", action="append", help="ALFWorld data folder(s) (default: fixture and shared data)")
    p.add_argument("--splits", nargs="+", default=["train", "valid_seen", "valid_unseen"])
    args = p.parse_args(argv)
    dirs = [Path(d) for d in args.data_dir] if args.data_dir else [fixture_data_dir(), shared_data_dir()]
    dirs = [d for d in dirs if d is not None]
    rows = []
    t0 = time.perf_counter()
    for d in dirs:
        source = "fixture" if d == fixture_data_dir() else ("shared" if d == shared_data_dir() else str(d))
        for split in args.splits:
            try:
                per_type = plan_lengths(d, split)
            except EnvError:
                print(f"({source}: no split {split!r}, skipped)", file=sys.stderr)
                continue
            for ttype in sorted(per_type):
                rows.append((source, split, ttype, per_type[ttype]))
            rows.append((source, split, "all", [n for v in per_type.values() for n in v]))
    print(table(rows))
    print(f"\n({sum(len(r[3]) for r in rows if r[2] == 'all')} games read in {time.perf_counter() - t0:.1f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
