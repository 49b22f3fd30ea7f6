"""LEARNING.md and learning.png from the outputs of ``benchmarks/learning.py`` (see its docstring).

Reads ``<workdir>/eval/<policy>/it<NNN>_<split>/{metrics.json,trajectories.jsonl}`` (panel
evaluations), ``<workdir>/rl/<algo>_s<seed>/metrics.jsonl`` (training metrics) and
``<workdir>/phases.json`` (wall time per phase), and ``<workdir>/NOTES.md`` (the findings, written
by hand, shown at the top) if it exists; writes ``LEARNING.md`` and ``learning.png``
into the workdir, or where ``--report-md`` / ``--report-png`` say. ``python benchmarks/learning_report.py --workdir DIR`` rewrites them
from whatever runs have finished so far.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any


def mean_std(values: list[float]) -> str:
    """``"0.250 ± 0.050 (n=3)"``; the std is the sample std over seeds (0 for one value)."""
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f} (n={len(values)})"


def load_evals(workdir: Path) -> dict[tuple[str, int, str], dict[str, Any]]:
    """``{(policy, iteration, split): metrics}`` of every finished panel evaluation."""
    out = {}
    for f in sorted((workdir / "eval").glob("*/it*_*/metrics.json")):
        it, split = f.parent.name[2:].split("_", 1)
        out[(f.parent.parent.name, int(it), split)] = json.loads(f.read_text())
    return out


def panel_ids(workdir: Path) -> dict[str, list[str]]:
    """The task ids of the panel per split (from the SFT-start evaluation's trajectories)."""
    out: dict[str, list[str]] = {}
    for f in sorted((workdir / "eval" / "sft").glob("it000_*/trajectories.jsonl")):
        split = f.parent.name.split("_", 1)[1]
        ids = [json.loads(line)["task"]["task_id"] for line in f.read_text().splitlines() if line.strip()]
        out[split] = ["/".join(Path(i).parts[-3:-1]) for i in ids]
    return out


def train_metrics(workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """``{run name: [metrics line per iteration]}`` of every RL run."""
    out = {}
    for f in sorted((workdir / "rl").glob("*/metrics.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        by_it: dict[int, dict[str, Any]] = {}
        for r in rows:  # one line per iteration (val/ lines merge into their iteration)
            by_it.setdefault(int(r.get("iteration", r.get("step", 0))), {}).update(r)
        out[f.parent.name] = [by_it[k] for k in sorted(by_it)]
    return out


def curves(evals, algos, seeds, splits) -> dict[str, dict[int, list[float]]]:
    """``{algo: {iteration: [panel success per seed]}}``, averaged over the splits; the SFT start
    is iteration 0 of every algorithm."""
    out: dict[str, dict[int, list[float]]] = {}
    sft = [evals[("sft", 0, s)]["success_rate"] for s in splits if ("sft", 0, s) in evals]
    for algo in algos:
        c: dict[int, list[float]] = {0: [statistics.mean(sft)]} if sft else {}  # one shared start
        its = sorted({it for (p, it, _s) in evals if p.startswith(f"{algo}_s")})
        for it in its:
            vals = []
            for seed in seeds:
                per_split = [evals[(f"{algo}_s{seed}", it, s)]["success_rate"] for s in splits
                             if (f"{algo}_s{seed}", it, s) in evals]
                if len(per_split) == len(splits):
                    vals.append(statistics.mean(per_split))
            if vals:
                c[it] = vals
        out[algo] = c
    return out


def plot(curve: dict[str, dict[int, list[float]]], path: Path) -> None:
    """Panel success vs iteration, one line per algorithm (mean over seeds, band = ± std)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for algo, c in curve.items():
        its = sorted(c)
        if not its:
            continue
        mu = [statistics.mean(c[i]) for i in its]
        sd = [statistics.stdev(c[i]) if len(c[i]) > 1 else 0.0 for i in its]
        n = max([len(c[i]) for i in its if i > 0], default=0)
        ax.plot(its, mu, marker="o", label=f"{algo} ({n} seed{'s' if n != 1 else ''})")
        ax.fill_between(its, [m - s for m, s in zip(mu, sd)], [m + s for m, s in zip(mu, sd)], alpha=0.2)
    ax.set_xlabel("RL iteration (0 = SFT start)")
    ax.set_ylabel("panel success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("ALFWorld panel success vs iteration")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def final_table(evals, algos, seeds, splits, last_it) -> list[str]:
    lines = ["| policy | split | success | valid-action ratio | admissible-action ratio |", "|---|---|---|---|---|"]
    for split in splits:
        if ("sft", 0, split) in evals:
            m = evals[("sft", 0, split)]
            lines.append(f"| SFT start | {split} | {m['success_rate']:.3f} | {m.get('valid_action_ratio', float('nan')):.3f} | "
                         f"{m.get('admissible_action_ratio', float('nan')):.3f} |")
        for algo in algos:
            ms = [evals[(f"{algo}_s{s}", last_it, split)] for s in seeds if (f"{algo}_s{s}", last_it, split) in evals]
            if not ms:
                lines.append(f"| {algo} | {split} | not evaluated yet | | |")
                continue
            lines.append(f"| {algo}, iteration {last_it} | {split} | {mean_std([m['success_rate'] for m in ms])} | "
                         f"{mean_std([m.get('valid_action_ratio', float('nan')) for m in ms])} | "
                         f"{mean_std([m.get('admissible_action_ratio', float('nan')) for m in ms])} |")
    return lines


def signal_table(train, algos, seeds) -> list[str]:
    """Per iteration: fraction of groups with a non-zero advantage, training success and valid-action
    ratio, each the mean over seeds."""
    key = "critic/advantages/nonzero_group_fraction"
    lines = ["| algo | iteration | groups with A ≠ 0 | train success | train valid-action ratio |",
             "|---|---|---|---|---|"]
    for algo in algos:
        runs = [train.get(f"{algo}_s{s}", []) for s in seeds]
        for i in range(max((len(r) for r in runs), default=0)):
            rows = [r[i] for r in runs if i < len(r)]
            f = [x[key] for x in rows if key in x]
            lines.append(f"| {algo} | {i + 1} | {mean_std(f)} | {mean_std([x.get('episode/success_rate', 0) for x in rows])} | "
                         f"{mean_std([x.get('episode/valid_action_ratio', 0) for x in rows])} |")
    return lines


def write_report(workdir: Path, args: argparse.Namespace, phases: dict[str, float], cpu: str) -> Path:
    """Write ``LEARNING.md`` and ``learning.png`` into ``workdir``; returns the Markdown path."""
    import torch

    from serl.models.loading import pick_dtype

    evals, train = load_evals(workdir), train_metrics(workdir)
    curve = curves(evals, args.algos, args.seeds, args.splits)
    out = Path(args.report_md).resolve() if args.report_md else workdir / "LEARNING.md"
    png = Path(args.report_png).resolve() if args.report_png else workdir / "learning.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(curve, png)
    last_it = max([it for c in curve.values() for it in c] or [0])
    panel = panel_ids(workdir)
    md = [
        "# Learning experiment", "",
        "Command: `python benchmarks/learning.py " + " ".join(sys.argv[1:]) + "`", "",
        f"Machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"dtype {pick_dtype('auto', 'cpu')} (serl's `auto` rule on this CPU).", "",
        f"Settings: recipe `{args.recipe}`, {args.expert_tasks} expert games, SFT LoRA r={args.lora_r}, "
        f"algorithms {args.algos}, seeds {args.seeds}, {args.iterations} iterations evaluated every "
        f"{args.eval_every}, panel {args.panel_per_type} tasks per type on {args.splits}, eval seed {args.eval_seed}.", "",
        *(["## Findings", "", (workdir / "NOTES.md").read_text().strip(), ""] if (workdir / "NOTES.md").exists() else []),
        "## Wall time per phase", "", "| phase | minutes |", "|---|---|",
        *[f"| {k} | {v / 60:.1f} |" for k, v in phases.items()], "",
        "## Panel success and valid-action ratio (mean ± std over seeds)", "",
        *final_table(evals, args.algos, args.seeds, args.splits, last_it), "",
        f"![panel success vs iteration]({os.path.relpath(png, out.parent)})", "",
        "## Learning signal per iteration", "", *signal_table(train, args.algos, args.seeds), "",
        "## Panel", "", *[f"- {s}: " + ", ".join(f"`{i}`" for i in ids) for s, ids in panel.items()], "",
    ]
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(md))
    os.replace(tmp, out)
    print(f"learning: wrote {out} and {png}")
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from learning import cpu_model, parse_args

    a = parse_args(sys.argv[1:])
    w = Path(a.workdir).resolve()
    ph = json.loads((w / "phases.json").read_text()) if (w / "phases.json").exists() else {}
    write_report(w, a, ph, cpu_model())
