"""LEARNING.md and learning.png from the outputs of ``experiments/learning.py`` (see its docstring).

Reads ``<workdir>/eval/<policy>/it<NNN>_<split>/{metrics.json,trajectories.jsonl}`` (panel
evaluations), ``<workdir>/rl/<algo>_s<seed>/metrics.jsonl`` (training metrics) and
``<workdir>/phases.json`` (wall time per phase), and ``<workdir>/NOTES.md`` (the findings, written
by hand, shown at the top) if it exists; writes ``LEARNING.md`` and ``learning.png``
into the workdir, or where ``--report-md`` / ``--report-png`` say. ``python experiments/learning_report.py --workdir DIR`` rewrites them
from whatever runs have finished so far.

The one report generator of every leg (the same options as ``learning.py``): ``--env alfworld``
(the default) and ``--env webshop`` are written here; ``--env math``'s sections (avg@k panels,
tool calls, seed tests) live in ``learning_math_report.py``, to which :func:`write_report` hands
over. The statistics and readers they share are ``learning_stats.py``.

The WebShop report titles itself "WebShop", lists the panel's test goals, and gives per policy
the success rate (score exactly 1.0), the mean WebShop score in [0, 1] (``webshop_task_score``,
WebShop's own metric, arXiv 2207.01206) and the valid-action ratio; its plot has a panel with the
mean score. WebShop lists a search as ``search[<your query>]``, so the admissible-action ratio is
left out there (a real query is never "listed").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_options import command_line  # noqa: E402
from learning_stats import (load_panel, load_train, mcnemar_p, mean_std, moving_average, paired_counts_p,  # noqa: E402
                            panel_won, run_ends, seed_band, serl_weight_stats)

from serl.envs.alfworld import is_loop  # noqa: E402
from serl.utils import cpu_model  # noqa: E402


def panel_ids(workdir: Path, env: str = "alfworld") -> dict[str, list[str]]:
    """The task ids of the panel per split (from the SFT-start evaluation's trajectories):
    ALFWorld ``<task folder>/<trial>``, WebShop the goal index."""
    out: dict[str, list[str]] = {}
    for f in sorted((workdir / "eval" / "sft").glob("it000_*/trajectories.jsonl")):
        split = f.parent.name.split("_", 1)[1]
        ids = [json.loads(line)["task"]["task_id"] for line in f.read_text().split("\n") if line.strip()]
        out[split] = [str(i) for i in ids] if env == "webshop" else ["/".join(Path(i).parts[-3:-1]) for i in ids]
    return out


def curves(evals, algos, seeds, splits, key: str = "success_rate") -> dict[str, dict[int, list[float]]]:
    """``{algo: {iteration: [panel metric per seed]}}`` of metric ``key`` (default the success
    rate), averaged over the splits; the SFT start is iteration 0 of every algorithm."""
    out: dict[str, dict[int, list[float]]] = {}
    sft = [evals[("sft", 0, s)][key] for s in splits if ("sft", 0, s) in evals]
    for algo in algos:
        c: dict[int, list[float]] = {0: [statistics.mean(sft)]} if sft else {}  # one shared start
        its = sorted({it for (p, it, _s) in evals if p.startswith(f"{algo}_s")})
        for it in its:
            vals = []
            for seed in seeds:
                per_split = [evals[(f"{algo}_s{seed}", it, s)][key] for s in splits
                             if (f"{algo}_s{seed}", it, s) in evals]
                if len(per_split) == len(splits):
                    vals.append(statistics.mean(per_split))
            if vals:
                c[it] = vals
        out[algo] = c
    return out


def train_curves(train, algos, seeds, window: int) -> dict[str, dict[int, list[float]]]:
    """``{algo: {seed: [training success per iteration, trailing moving average over window]}}``
    (``episode/success_rate`` of each run's ``metrics.jsonl``; :func:`learning_stats.moving_average`)."""
    out: dict[str, dict[int, list[float]]] = {}
    for algo in algos:
        per_seed = {}
        for seed in seeds:
            run = train.get(f"{algo}_s{seed}", {})
            its = sorted(i for i in run if "episode/success_rate" in run[i])
            if its:
                per_seed[seed] = moving_average([run[i]["episode/success_rate"] for i in its], window)
        out[algo] = per_seed
    return out


def plot(curve: dict[str, dict[int, list[float]]], path: Path, env: str = "alfworld",
         score: dict[str, dict[int, list[float]]] | None = None,
         train: dict[str, dict[int, list[float]]] | None = None, window: int = 1) -> None:
    """Panel success vs iteration, one line per algorithm (mean over seeds, band = ± std); with
    ``score`` (WebShop) a panel of the mean score the same way; with ``train`` (:func:`train_curves`)
    a first panel of training success (mean over seeds of each seed's moving average over
    ``window`` iterations, band = min–max over seeds: :func:`learning_stats.seed_band`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = {"webshop": "WebShop", "alfworld": "ALFWorld"}.get(env, env)
    n = 1 + (score is not None) + (train is not None)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), dpi=120, squeeze=False)
    axes = list(axes[0])
    if train is not None:
        ax = axes.pop(0)
        for ci, (algo, per_seed) in enumerate(train.items()):
            if not per_seed:
                continue
            mean, lo, hi, _ = seed_band(per_seed)
            x = list(range(1, len(mean) + 1))
            ax.plot(x, mean, color=f"C{ci}", label=f"{algo} ({len(per_seed)} seed{'s' if len(per_seed) != 1 else ''})")
            ax.fill_between(x, lo, hi, color=f"C{ci}", alpha=0.2)
        ax.set_xlabel("RL iteration")
        ax.set_ylabel(f"training success (moving average, {window} it.)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        ax.set_title(f"{name} training success (band: min–max over seeds)")
    _curve_axes(axes[0], curve, "panel success rate" + (" (score = 1)" if score is not None else ""),
                f"{name} panel success vs iteration")
    if score is not None:
        _curve_axes(axes[1], score, "panel mean score", f"{name} panel mean score vs iteration")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def _curve_axes(ax, curve: dict[str, dict[int, list[float]]], ylabel: str, title: str) -> None:
    """One metric vs iteration on ``ax``: per algorithm the mean over seeds and a ± std band (the
    algorithm's colour is its position in ``curve``, as in the training panel)."""
    for ci, (algo, c) in enumerate(curve.items()):
        its = sorted(c)
        if not its:
            continue
        mu = [statistics.mean(c[i]) for i in its]
        sd = [statistics.stdev(c[i]) if len(c[i]) > 1 else 0.0 for i in its]
        n = max([len(c[i]) for i in its if i > 0], default=0)
        ax.plot(its, mu, marker="o", color=f"C{ci}", label=f"{algo} ({n} seed{'s' if n != 1 else ''})")
        ax.fill_between(its, [m - s for m, s in zip(mu, sd)], [m + s for m, s in zip(mu, sd)], color=f"C{ci}", alpha=0.2)
    ax.set_xlabel("RL iteration (0 = SFT start)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # no curve yet (no panel, or --iterations 0 without a start panel)
        ax.legend()
    ax.set_title(title)


#: the columns of the final table per env: (header, metrics.json key); success is always first
FINAL_COLUMNS = {
    "alfworld": [("valid-action ratio", "valid_action_ratio"), ("admissible-action ratio", "admissible_action_ratio")],
    "webshop": [("mean score", "webshop_task_score"), ("valid-action ratio", "valid_action_ratio")],
}


def final_table(evals, algos, seeds, splits, ends: dict[str, int], env: str = "alfworld") -> list[str]:
    """Success and the env's :data:`FINAL_COLUMNS` per policy, at the SFT start and at each run's
    end (:func:`run_ends`; mean ± std over seeds). WebShop's success is score = 1."""
    cols = FINAL_COLUMNS[env]
    lines = ["| policy | split | success | " + " | ".join(h for h, _ in cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    for split in splits:
        if ("sft", 0, split) in evals:
            m = evals[("sft", 0, split)]
            lines.append(f"| SFT start | {split} | {m['success_rate']:.3f} | "
                         + " | ".join(f"{m.get(k, float('nan')):.3f}" for _, k in cols) + " |")
        for algo in algos:
            runs = [f"{algo}_s{s}" for s in seeds if f"{algo}_s{s}" in ends]
            ms = [evals[(r, ends[r], split)] for r in runs]
            if not ms:
                lines.append(f"| {algo} | {split} | not evaluated yet |" + " |" * len(cols))
                continue
            at = ", ".join(str(i) for i in sorted({ends[r] for r in runs}))
            lines.append(f"| {algo}, iteration {at} | {split} | {mean_std([m['success_rate'] for m in ms])} | "
                         + " | ".join(mean_std([m.get(k, float('nan')) for m in ms]) for _, k in cols) + " |")
    return lines


def paired_table(workdir: Path, algos, seeds, splits, ends: dict[str, int], held_out: list[str]) -> list[str]:
    """Per run and split, the panel games won at its end vs at the SFT start, paired game by game:
    games only the end wins (b), games only the start wins (c) and the exact McNemar p
    (:func:`learning_stats.mcnemar_p`); then the held-out splits ``held_out`` pooled, and per
    algorithm every run pooled: McNemar on the pooled counts (the runs share the start's answers,
    so that p overstates the evidence) and the test with the task as the unit
    (:func:`learning_stats.paired_counts_p`: "by task", its columns the tasks that moved up and
    down on net)."""
    start = {x: panel_won(workdir, "sft", 0, x) for x in splits}
    lines = ["| run | panel | start won | end won | only the end wins | only the start wins | McNemar p |",
             "|---|---|---|---|---|---|---|"]
    for algo in algos:
        total = [0, 0]
        nets: dict[tuple[str, str], int] = {}
        runs = [f"{algo}_s{s}" for s in seeds if f"{algo}_s{s}" in ends]
        for run in runs:
            pooled = [0, 0, 0, 0]
            for x in splits:
                end = panel_won(workdir, run, ends[run], x)
                both = [t for t in end if t in start[x]]
                if not both:
                    continue
                b = sum(end[t] and not start[x][t] for t in both)
                c = sum(start[x][t] and not end[t] for t in both)
                won = (sum(start[x][t] for t in both), sum(end[t] for t in both))
                lines.append(f"| {run} (iteration {ends[run]}) | {x} ({len(both)}) | {won[0]} | {won[1]} | {b} | {c} "
                             f"| {mcnemar_p(b, c):.3f} |")
                if x in held_out:
                    pooled = [pooled[0] + won[0], pooled[1] + won[1], pooled[2] + b, pooled[3] + c]
                    for t in both:
                        nets[(x, t)] = nets.get((x, t), 0) + int(end[t]) - int(start[x][t])
            if len(held_out) > 1:
                lines.append(f"| {run} | held-out ({' + '.join(held_out)}) | {pooled[0]} | {pooled[1]} | {pooled[2]} "
                             f"| {pooled[3]} | {mcnemar_p(pooled[2], pooled[3]):.3f} |")
            total = [total[0] + pooled[2], total[1] + pooled[3]]
        if len(runs) > 1:
            lines.append(f"| {algo}, {len(runs)} runs pooled | held-out | | | {total[0]} | {total[1]} "
                         f"| {mcnemar_p(total[0], total[1]):.3f} |")
            net = list(nets.values())
            lines.append(f"| {algo}, {len(runs)} runs by task | held-out | | | {sum(n > 0 for n in net)} "
                         f"| {sum(n < 0 for n in net)} | {paired_counts_p(net):.3f} |")
    return lines


def _panel_rows(workdir: Path, policy: str, label: str) -> list[dict]:
    """One start panel's per-task lines (``tasks.jsonl``) with their ``actions`` joined in from
    ``actions.jsonl`` (a GPU lease's) or ``trajectories.jsonl`` when either is there."""
    d = workdir / "eval" / policy / f"it000_{label}"
    if not (d / "tasks.jsonl").exists():
        return []
    rows = [json.loads(x) for x in (d / "tasks.jsonl").read_text().split("\n") if x.strip()]
    src = d / "actions.jsonl" if (d / "actions.jsonl").exists() else d / "trajectories.jsonl"
    if src.exists():
        acts = [json.loads(x) for x in src.read_text().split("\n") if x.strip()]
        acts = [a["actions"] if "actions" in a else [s["action"] for s in a["steps"]] for a in acts]
        if len(acts) == len(rows):
            for r, a in zip(rows, acts):
                r["actions"] = a
    return rows


def sweep_agreement(trajectories: Path) -> tuple[int, int]:
    """Of a panel's ``go to`` / ``open`` steps, how many are the sweep expert's search step from
    that state (``serl data expert alfworld --expert sweep``: the first place of the first turn's
    ``go to`` list not yet visited, :func:`serl.envs.alfworld_experts.search.search_step` with
    ``places``), read off each step's observations and admissible actions. Returns ``(agreeing,
    steps)``. Every move counts, also those after the object is found, where the expert follows the
    planner: a measure to compare policies on the same games, not one whose ceiling is 1."""
    import random

    from serl.envs.alfworld_experts.search import search_step
    from serl.trajectory import read_jsonl

    agree = moves = 0
    for t in read_jsonl(trajectories):
        places = [a[len("go to "):] for a in t.steps[0].admissible_actions if a.startswith("go to ")] if t.steps else []
        seen: list[str] = []
        for s in t.steps:
            seen.append(s.observation)
            if s.action.startswith(("go to ", "open ")):
                moves += 1
                agree += s.action == search_step("\n".join(seen), s.admissible_actions, random.Random(0), places)
    return agree, moves


def _sweep_cell(workdir: Path, policy: str, label: str) -> str:
    f = workdir / "eval" / policy / f"it000_{label}" / "trajectories.jsonl"
    if not f.exists():
        return "—"
    agree, moves = sweep_agreement(f)
    return f"{agree}/{moves} ({agree / moves:.0%})" if moves else "0/0"


def _object_cell(workdir: Path, policy: str, label: str) -> str:
    f = workdir / "eval" / policy / f"it000_{label}" / "metrics.json"
    m = json.loads(f.read_text()) if f.exists() else {}
    if "alfworld_lost_saw_object" not in m:
        return "—"
    return f"{m['alfworld_lost_saw_object']:.0%} / {m['alfworld_lost_took_object']:.0%}"


def _decision_cell(workdir: Path, policy: str, label: str) -> str:
    f = workdir / "eval" / policy / f"it000_{label}" / "metrics.json"
    m = json.loads(f.read_text()) if f.exists() else {}
    keys = ("alfworld_open_when_closed", "alfworld_take_when_takeable")
    return " / ".join(f"{m[k]:.0%}" if k in m else "—" for k in keys) if any(k in m for k in keys) else "—"


def start_table(workdir: Path, splits: list[str]) -> list[str]:
    """The start policies (the base model with ``--base-eval``, the SFT start, each DAgger round,
    and ``--compare-model`` as ``compare``) on every panel split: games won, success per task
    type, mean steps of the won games, loops among the lost (:func:`serl.envs.alfworld.is_loop`),
    the moves that are the sweep expert's (:func:`sweep_agreement`; from ``trajectories.jsonl``,
    "—" without it), the lost games that saw and that took the task's object (``serl eval``'s
    ``alfworld_lost_saw_object`` and ``alfworld_lost_took_object`` in ``metrics.json``, "—"
    without them), the opens of a closed place and the takes of the object where each is due
    (``alfworld_open_when_closed``, ``alfworld_take_when_takeable``, "—" without them); then the
    SFT start against each other policy, paired game by game (exact McNemar,
    :func:`learning_stats.mcnemar_p`), per split and pooled. Empty without start panels."""
    rounds = sorted((d.name for d in (workdir / "eval").glob("dagger*") if d.name[6:].isdigit()), key=lambda n: int(n[6:]))
    names = {"base": "base model", "sft": "SFT start", **{r: f"DAgger round {r[6:]}" for r in rounds},
             "compare": "compared model"}
    panels = {(p, x): _panel_rows(workdir, p, x) for p in names for x in splits}
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        return []
    types = sorted({r.get("task_type", "") for v in panels.values() for r in v})
    lines = ["| policy | split | won | " + " | ".join(types) + " | steps to win | loops / lost | sweep's moves | lost: saw / took the object "
             "| opens a closed place / takes the object, where due |",
             "|---|---|---|" + "---|" * len(types) + "---|---|---|---|---|"]
    for (p, x), rows in panels.items():
        won = [r for r in rows if r["won"]]
        per = [f"{sum(r['won'] for r in rows if r.get('task_type') == t)}/{sum(r.get('task_type') == t for r in rows)}"
               for t in types]
        lost = [r for r in rows if not r["won"]]
        loops = f"{sum(is_loop(r['actions']) for r in lost)}/{len(lost)}" if all("actions" in r for r in lost) else "—"
        steps = f"{statistics.mean(r['length'] for r in won):.1f}" if won else "—"
        lines.append(f"| {names[p]} | {x} | {len(won)}/{len(rows)} | " + " | ".join(per)
                     + f" | {steps} | {loops} | {_sweep_cell(workdir, p, x)} | {_object_cell(workdir, p, x)}"
                     f" | {_decision_cell(workdir, p, x)} |")
    for other in [p for p in names if p != "sft"]:
        pairs, total = [], [0, 0]
        for x in splits:
            a, b = ({r["task_id"]: r["won"] for r in panels.get((p, x), [])} for p in ("sft", other))
            both = [t for t in a if t in b]
            if both:
                only_sft, only_cmp = sum(a[t] and not b[t] for t in both), sum(b[t] and not a[t] for t in both)
                total = [total[0] + only_sft, total[1] + only_cmp]
                pairs.append(f"| {x} ({len(both)}) | {only_sft} | {only_cmp} | {mcnemar_p(only_sft, only_cmp):.2g} |")
        if pairs:
            who = {"compare": "the compared model", "base": "the base model"}.get(other, names[other])
            lines += ["", f"| panel | only the SFT start wins | only {who} wins | McNemar p |", "|---|---|---|---|", *pairs]
            if len(pairs) > 1:
                lines.append(f"| pooled | {total[0]} | {total[1]} | {mcnemar_p(*total):.2g} |")
    return lines


def dagger_table(workdir: Path) -> list[str]:
    """Per DAgger round (``dagger/r<R>``): the train games its policy played, won, the share of
    steps right by the planner (:func:`serl.rollout.dagger.step_labels`) and the rows made, by
    source; empty without rounds."""
    from serl.rollout.dagger import DaggerSummary
    from serl.trajectory import read_jsonl

    lines = []
    for d in sorted((workdir / "dagger").glob("r*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1):
        f = d / "play" / "trajectories.jsonl"
        if not f.exists():
            continue
        s = DaggerSummary()
        for t in read_jsonl(f):
            s.add(t, [])
        rows = [json.loads(x) for x in (d / "rows.jsonl").read_text().splitlines() if x.strip()] if (d / "rows.jsonl").exists() else []
        lines.append(f"| {d.name[1:]} | {s.won}/{s.episodes} | {s.right}/{s.labelled} ({s.right / max(1, s.labelled):.0%}) | "
                     f"{sum(r.get('source') == 'dagger' for r in rows)} | {sum(r.get('source') == 'won' for r in rows)} |")
    if not lines:
        return []
    return ["| round | train games won (T = 1) | steps right by the planner | rows: labelled states | rows: won episodes |",
            "|---|---|---|---|---|", *lines]


def signal_table(train, algos, seeds, env: str = "alfworld") -> list[str]:
    """Per iteration: fraction of groups with a non-zero advantage, training success and valid-action
    ratio, each the mean over seeds, and where SERL's teacher scored tokens its weights W (mean
    [min, max] and mean |log-prob gap| in nats over the seeds: :func:`learning_stats.serl_weight_stats`)."""
    key = "critic/advantages/nonzero_group_fraction"
    ws = env == "webshop"  # also the step rows and prompt tokens per iteration (the cost estimate's inputs)
    lines = ["| algo | iteration | groups with A ≠ 0 | train success | train valid-action ratio |"
             + (" step rows | prompt tokens (mean) |" if ws else "") + " SERL W mean [min, max] | SERL mean abs Δ |",
             "|---|---|---|---|---|" + ("---|---|" if ws else "") + "---|---|"]
    for algo in algos:
        runs = [[r[i] for i in sorted(r)] for r in (train.get(f"{algo}_s{s}", {}) for s in seeds)]
        for i in range(max((len(r) for r in runs), default=0)):
            rows = [r[i] for r in runs if i < len(r)]
            f = [x[key] for x in rows if key in x]
            extra = (f" {mean_std([x.get('episode/num_step_rows', 0) for x in rows])} | "
                     f"{mean_std([x.get('prompt_length/mean', 0) for x in rows])} |") if ws else ""
            w = serl_weight_stats(rows)
            serl = (f" {w['weight_mean']:.3f} [{w['weight_min']:.3f}, {w['weight_max']:.3f}] | {w['delta_abs_mean']:.4f} |"
                    if w else " — | — |")
            lines.append(f"| {algo} | {i + 1} | {mean_std(f)} | {mean_std([x.get('episode/success_rate', 0) for x in rows])} | "
                         f"{mean_std([x.get('episode/valid_action_ratio', 0) for x in rows])} |" + extra + serl)
    return lines


def settings_line(args: argparse.Namespace) -> str:
    """The experiment's settings in one sentence (the ALFWorld wording is the original report's)."""
    if getattr(args, "env", "alfworld") == "webshop":
        return (f"Settings: recipe `{args.recipe}`, {args.expert_tasks} expert train goals (oracle episodes with "
                f"score ≥ {args.expert_min_score} kept), SFT LoRA r={args.lora_r}, algorithms {args.algos}, "
                f"seeds {args.seeds}, {args.iterations} iterations evaluated every {args.eval_every}, panel = "
                f"WebShop test goals 0–{args.panel_size - 1} on {args.splits}, eval seed {args.eval_seed}.")
    start = (f"RL from `--sft-model {args.sft_model}`" if getattr(args, "sft_model", None)
             else f"{args.expert_tasks} expert games, SFT LoRA r={args.lora_r}")
    per_type = "every task" if args.panel_per_type < 0 else f"{args.panel_per_type} tasks per type"
    extra = "".join(f"; {name} `{' '.join(v)}`" for name, v in (("overrides", getattr(args, "override", [])),
                    ("train overrides", getattr(args, "train_override", []))) if v)
    return (f"Settings: recipe `{args.recipe}`, {start}, algorithms {args.algos}, seeds {args.seeds}, "
            f"{args.iterations} iterations evaluated every {args.eval_every}"
            + (f" (each serl train call capped at {args.train_seconds:g} s)" if getattr(args, "train_seconds", 0) else "")
            + f", panel {per_type} on {args.splits}, {getattr(args, 'panel_decoding', 'sampled')}, eval seed "
            f"{args.eval_seed}{extra}.")


def write_report(workdir: Path, args: argparse.Namespace, phases: dict[str, float], cpu: str) -> Path:
    """Write ``LEARNING.md`` and ``learning.png`` into ``workdir`` (or ``args.report_md`` /
    ``args.report_png``) for the leg ``args.env`` (``alfworld`` when absent); returns the Markdown path."""
    import torch

    from serl.models.loading import pick_dtype

    env = getattr(args, "env", "alfworld")
    if env == "math":  # its own sections (learning_math_report imports nothing from this module)
        from learning_math_report import write_math_report

        return write_math_report(workdir, args, phases, cpu)
    ws = env == "webshop"
    evals, train = load_panel(workdir), load_train(workdir)
    curve = curves(evals, args.algos, args.seeds, args.splits)
    out = Path(args.report_md).resolve() if args.report_md else workdir / "LEARNING.md"
    png = Path(args.report_png).resolve() if args.report_png else workdir / "learning.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    window = getattr(args, "smooth_window", 1)
    plot(curve, png, env, curves(evals, args.algos, args.seeds, args.splits, "webshop_task_score") if ws else None,
         train_curves(train, args.algos, args.seeds, window), window)
    ends = run_ends(evals, [f"{a}_s{x}" for a in args.algos for x in args.seeds], args.splits)
    panel = panel_ids(workdir, env)
    table = final_table(evals, args.algos, args.seeds, args.splits, ends, "webshop" if ws else "alfworld")
    held_out = [x for x in args.splits if x != "train"]  # a train-split panel is the RL games themselves
    paired = paired_table(workdir, args.algos, args.seeds, args.splits, ends, held_out)
    start = start_table(workdir, args.splits)
    dagger = dagger_table(workdir)
    machine = (workdir / "machine.txt").read_text().strip() if (workdir / "machine.txt").exists() else (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"dtype {pick_dtype('auto', 'cpu')} (serl's `auto` rule on this CPU)")
    md = [
        "# Learning experiment" + (": WebShop" if ws else ""), "",
        f"Command: `{command_line()}`", "",
        f"Machine: {machine}.", "",
        settings_line(args), "",
        *(["## Findings", "", (workdir / "NOTES.md").read_text().strip(), ""] if (workdir / "NOTES.md").exists() else []),
        "## Wall time per phase", "", "| phase | minutes |", "|---|---|",
        *[f"| {k} | {v / 60:.1f} |" for k, v in phases.items()], "",
        "## Panel success" + (", mean score" if ws else "") + " and valid-action ratio (mean ± std over seeds)", "",
        *table, "",
        f"![training success and panel success vs iteration]({os.path.relpath(png, out.parent)})", "",
        f"Left: training success on each iteration's games, each seed's moving average over "
        f"{getattr(args, 'smooth_window', 1)} iterations, then the mean over seeds; band: min–max over seeds. "
        "Right: panel success averaged over the panel's splits, mean over seeds, band ± std; iteration 0 is the "
        "shared SFT start.", "",
        *(["## DAgger rounds", "", "The policy of each round plays train games at T = 1 (the round's start: the SFT "
           "model, then the previous round's); the planner labels every step; its wrong states become the rows of "
           "the round's fine-tuning (`serl data dagger`).", "", *dagger, ""] if dagger else []),
        *(["## The start policies on the panel", "", *start, ""] if start else []),
        "## Paired per game: each run's end vs the SFT start", "",
        "A `train` panel holds the RL runs' own games (a fixed pool); the other splits are held out.", "",
        *paired, "",
        "## Learning signal per iteration", "", *signal_table(train, args.algos, args.seeds, env), "",
        "## Panel", "", *[f"- {s}: " + ", ".join(f"`{i}`" for i in ids) for s, ids in panel.items()], "",
    ]
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(md))
    os.replace(tmp, out)
    print(f"learning: wrote {out} and {png}")
    return out


if __name__ == "__main__":
    from learning_options import parse_args

    a = parse_args(sys.argv[1:])
    w = Path(a.workdir).resolve()
    write_report(w, a, json.loads((w / "phases.json").read_text()) if (w / "phases.json").exists() else {}, cpu_model())
