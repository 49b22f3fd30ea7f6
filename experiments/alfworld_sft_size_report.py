"""The table of ``experiments/alfworld_sft_size_gpu.sh``'s results: for each cold start (the shipped
adapter and an SFT on the first N expert games), its SFT size and loss, and its panel wins per split,
greedy and sampled, with how often a lost episode loops, and an exact McNemar test of its greedy wins
against the shipped adapter's on the same games.

    python experiments/alfworld_sft_size_report.py RESULTS_DIR [--md OUT.md]

RESULTS_DIR is the unpacked ``results.tar.gz`` (``eval/<model>_<greedy|sampled>_<split>/`` with
``tasks.jsonl`` and ``actions.jsonl``; ``sft/games_<N>/`` with ``metrics.jsonl`` and
``model/serl_sft.json``).

A lost episode **loops** when it ran at least ``LOOP_MIN_STEPS`` steps and used at most
``LOOP_MAX_DISTINCT`` distinct actions (the measure of the issue that asked for this curve: "half the
episodes loop on <= 3 distinct actions"); ``repeat3`` counts lost episodes that sent one action three
times in a row.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_stats import mcnemar_p  # noqa: E402  (a sibling script)

LOOP_MIN_STEPS = 6
LOOP_MAX_DISTINCT = 3
SPLITS = ("valid_seen", "valid_unseen")
_EVAL_DIR = re.compile(r"^(?P<model>.+)_(?P<label>greedy|sampled)_(?P<split>valid_seen|valid_unseen)$")


def loops(actions: list[str], won: bool) -> bool:
    """True when a lost episode of ``len(actions)`` steps (>= ``LOOP_MIN_STEPS``) used at most
    ``LOOP_MAX_DISTINCT`` distinct actions. A won episode never loops."""
    return not won and len(actions) >= LOOP_MIN_STEPS and len(set(actions)) <= LOOP_MAX_DISTINCT


def repeats(actions: list[str], won: bool, times: int = 3) -> bool:
    """True when a lost episode sent one action ``times`` times in a row."""
    return not won and any(len(set(actions[i:i + times])) == 1 for i in range(len(actions) - times + 1))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_panels(results: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """``{(model, label, split): {"won": {task_id: bool}, "episodes": [actions.jsonl rows],
    "admissible": float}}`` for every eval folder that finished (has ``tasks.jsonl``);
    ``episodes`` is None where the folder has no ``actions.jsonl`` (the table then shows no loop
    counts rather than 0 of 0)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for d in sorted((results / "eval").iterdir()):
        m = _EVAL_DIR.match(d.name)
        if not m or not (d / "tasks.jsonl").exists():
            continue
        tasks = _jsonl(d / "tasks.jsonl")
        episodes = _jsonl(d / "actions.jsonl") if (d / "actions.jsonl").exists() else None
        metrics = json.loads((d / "metrics.json").read_text()) if (d / "metrics.json").exists() else {}
        out[(m["model"], m["label"], m["split"])] = {
            "won": {t["task_id"]: bool(t["won"]) for t in tasks}, "episodes": episodes,
            "admissible": metrics.get("admissible_action_ratio")}
    return out


def sft_info(results: Path, model: str) -> dict[str, Any]:
    """Rows, optimizer steps and the first and last logged loss of ``sft/<model>``; {} for the
    shipped adapter (no folder)."""
    d = results / "sft" / model
    if not (d / "metrics.jsonl").exists():
        return {}
    losses = [r["sft/loss"] for r in _jsonl(d / "metrics.jsonl") if "sft/loss" in r]
    meta = json.loads((d / "model" / "serl_sft.json").read_text()) if (d / "model" / "serl_sft.json").exists() else {}
    return {"rows": meta.get("num_rows"), "steps": meta.get("optimizer_steps", len(losses)),
            "loss": (losses[0], losses[-1]) if losses else None}


def _model_order(name: str) -> tuple[int, int]:
    if name == "shipped":
        return (0, 0)
    n = name.removeprefix("games_")
    return (1, 10 ** 9 if n == "all" else int(n)) if n.isdigit() or n == "all" else (2, 0)


def table(panels: dict[tuple[str, str, str], dict[str, Any]], results: Path) -> list[str]:
    """The markdown table, one row per (model, decoding)."""
    lines = ["| cold start | SFT rows / steps | loss first → last | decoding | valid_seen won | valid_unseen won | "
             "total | loops / lost | repeat ×3 / lost | admissible | McNemar p vs shipped |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    models = sorted({k[0] for k in panels}, key=_model_order)
    for model in models:
        info = sft_info(results, model)
        # "shipped": the adapter serl shipped at the commit that ran the script (its README says how it was made)
        size = "—" if model == "shipped" else f"{info.get('rows')} / {info.get('steps')}"
        loss = f"{info['loss'][0]:.2f} → {info['loss'][1]:.2f}" if info.get("loss") else "—"
        for label in ("greedy", "sampled"):
            got = [panels.get((model, label, s)) for s in SPLITS]
            if not all(got):
                continue
            wins = [sum(p["won"].values()) for p in got]
            games = [len(p["won"]) for p in got]
            if any(p["episodes"] is None for p in got):
                loop_cell = rep_cell = "—"
            else:
                eps = [e for p in got for e in p["episodes"]]
                lost = [e for e in eps if not e["won"]]
                loop_cell = f"{sum(loops(e['actions'], e['won']) for e in eps)}/{len(lost)}"
                rep_cell = f"{sum(repeats(e['actions'], e['won']) for e in eps)}/{len(lost)}"
            adm = [p["admissible"] for p in got if p["admissible"] is not None]
            p_val = "—"
            ref = [panels.get(("shipped", label, s)) for s in SPLITS]
            if model != "shipped" and all(ref):
                b = c = 0
                for mine, theirs in zip(got, ref):
                    for task, won in mine["won"].items():
                        other = theirs["won"].get(task)
                        b += bool(won and other is False)
                        c += bool(not won and other is True)
                p_val = f"{mcnemar_p(b, c):.2g} (+{b} / −{c})"
            lines.append(
                f"| {model} | {size} | {loss} | {label} | {wins[0]}/{games[0]} | {wins[1]}/{games[1]} | "
                f"**{sum(wins)}/{sum(games)}** | {loop_cell} | {rep_cell} | "
                f"{'/'.join(f'{a:.2f}' for a in adm)} | {p_val} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="the unpacked results.tar.gz of alfworld_sft_size_gpu.sh")
    ap.add_argument("--md", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    if not (args.results / "eval").is_dir():
        sys.exit(f"{args.results}: no eval/ folder (unpack results.tar.gz of alfworld_sft_size_gpu.sh there)")
    text = "\n".join(table(load_panels(args.results), args.results)) + "\n"
    print(text, end="")
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
