"""The math leg's report (``LEARNING_math.md``) and plot (``learning_math.png``) from the files of
``experiments/learning.py --env math`` (see its docstring).

Reads, all from the work folder: ``phases.json`` (wall time per phase), ``start.json`` (the RL
start: expert + SFT or ``--sft-model``), ``expert.jsonl`` / ``expert_pool.jsonl`` (row counts),
``sft/metrics.jsonl`` (``sft/loss``), ``eval/<policy>/it<NNN>_<label>/{metrics.json,tasks.jsonl}``
(panel evaluations: ``label`` = ``<split>_greedy`` or ``<split>_avg<k>``,
:func:`learning_options.panel_labels`), ``rl/<algo>_s<seed>/metrics.jsonl`` (one line per RL
iteration) and ``rl/<algo>_s<seed>/trace/<iteration>.jsonl`` (sampled trajectories,
:class:`serl.train.teacher_log.TraceWriter`), and ``NOTES.md`` (findings written by hand) if it
exists. A run counts as finished when its evaluation at ``--iterations`` exists on every panel;
the end-of-run table and the significance tests use finished seeds only and say which.

The keys read:

* ``serl eval`` ``metrics.json``: ``success_rate`` (greedy: panel accuracy), ``acc/mean@k``
  (avg@k) and ``acc/pass@k`` (:func:`serl.train.sample_metrics.aggregate_sample_metrics`),
  ``tool_call_rate`` and ``tool_calls_mean`` (:meth:`serl.envs.math.env.MathEnv.episode_metrics`);
  ``tasks.jsonl``: ``task_id`` and ``won`` per problem (the panel ids, the paired test);
* ``serl train`` ``metrics.jsonl`` (:data:`SIGNAL_KEYS`): ``episode/success_rate`` (training
  accuracy on the iteration's fresh problems, all groups), ``tool/trajectory_with_call_fraction``,
  ``critic/advantages/nonzero_group_fraction`` (groups kept by the std filter),
  ``timing/iteration_s`` and SERL's ``serl_action_mask/{weight_mean,weight_min,weight_max,
  delta_abs_mean,clipped_fraction}``, counted only on iterations where
  ``serl_action_mask/empty_target_batch`` is below 1 (otherwise the teacher scored no token and
  the weights are the placeholder 1; see :func:`learning_stats.serl_weight_stats` for the partly scored ones).

``python experiments/learning_report.py --env math --workdir DIR`` (or this file, with the same
options) rewrites both files of a partial experiment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_options import algos_for, command_line, panel_labels, split_description, split_label  # noqa: E402  (a sibling script: this folder is on sys.path)
from learning_stats import (_TIE, load_panel, load_train, mcnemar_p, mean_std, moving_average,  # noqa: E402
                            paired_counts_p, panel_won, permutation_p, run_ends, seed_band, serl_weight_stats, sign_flip_p)

#: metrics.jsonl keys of the per-step signal: (table header, key)
SIGNAL_KEYS = [("train accuracy", "episode/success_rate"), ("tool-call rate", "tool/trajectory_with_call_fraction"),
               ("groups with A ≠ 0", "critic/advantages/nonzero_group_fraction"), ("s / iteration", "timing/iteration_s")]


# ---------------------------------------------------------------------------- reading the work folder
def finished_ends(evals, args, labels: list[str]) -> dict[str, int]:
    """``{run: iteration}`` of the runs that ended: their end (:func:`learning_stats.run_ends` on
    the greedy panels, which every evaluation point has) where it is ``--iterations`` and every
    panel ``labels`` was evaluated there; with ``--train-seconds`` (runs stopped early) every run's
    end (its avg@k panels run at ``--iterations`` only)."""
    greedy = [lab for lab in labels if lab.endswith("_greedy")]
    ends = run_ends(evals, [f"{a}_s{x}" for a in args.algos for x in args.seeds], greedy)
    capped = bool(getattr(args, "train_seconds", 0))
    return {run: it for run, it in ends.items()
            if capped or (it == args.iterations and all((run, it, lab) in evals for lab in labels))}


def pick_examples(workdir: Path, algos: list[str], seeds: list[int]) -> dict[str, tuple[str, dict[str, Any]]]:
    """From the runs' trace files, the latest-iteration trajectory (ties: ``algos`` then ``seeds``
    order, then file order) that was solved with a tool call (``won`` and ``<tool_call>`` in its
    response) and the latest failed one: ``{"solved": (run, row), "failed": (run, row)}``, a key
    missing when no trace holds such a row."""
    files = []
    for ai, algo in enumerate(algos):
        for si, seed in enumerate(seeds):
            for f in (workdir / "rl" / f"{algo}_s{seed}" / "trace").glob("*.jsonl"):
                if f.stem.isdigit():
                    files.append((-int(f.stem), ai, si, f"{algo}_s{seed}", f))
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for *_, run, f in sorted(files):
        for line in f.read_text().split("\n"):
            r = json.loads(line) if line.strip() else None
            if r is None:
                continue
            if "solved" not in found and r.get("won") and "<tool_call>" in r.get("response", ""):
                found["solved"] = (run, r)
            if "failed" not in found and not r.get("won"):
                found["failed"] = (run, r)
        if len(found) == 2:
            break
    return found


# ---------------------------------------------------------------------------- report pieces
def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def panel_table(evals, args, split: str, finished: dict[str, list[int]]) -> list[str]:
    """Base, SFT start and each algorithm at each evaluation point on ``split``: greedy accuracy,
    avg@k, pass@k and the greedy tool-call rate (mean ± std over the seeds evaluated there; at the
    last iteration the finished seeds)."""
    k = args.panel_avg_k
    g = f"{split_label(split)}_greedy"
    s = f"{split_label(split)}_avg{k}"
    head = "| policy | iteration | greedy accuracy | " + (f"avg@{k} | pass@{k} | " if k else "") + "tool-call rate (greedy) |"
    lines = [head, "|---|---|---|" + ("---|---|" if k else "") + "---|"]

    def cells(ms_g: list[dict], ms_s: list[dict], single: bool) -> str:
        def col(ms, key):
            vals = [m[key] for m in ms if key in m]
            if single:
                return _fmt(vals[0]) if vals else "—"
            return mean_std(vals)
        out = [col(ms_g, "success_rate")]
        if k:
            out += [col(ms_s, f"acc/mean@{k}"), col(ms_s, f"acc/pass@{k}")]
        return " | ".join(out + [col(ms_g, "tool_call_rate")])

    for policy, name in (("base", "base model"), ("sft", "SFT start")):
        if (policy, 0, g) in evals:
            m = evals[(policy, 0, g)]
            n = int(m.get("num_tasks", 0))
            rest = cells([m], [evals[(policy, 0, s)]] if (policy, 0, s) in evals else [], True).split(" | ", 1)[1]
            lines.append(f"| {name} | 0 | {_fmt(m['success_rate'])} ({round(m['success_rate'] * n)}/{n}) | {rest} |")
    for algo in args.algos:
        for it in sorted({i for (p, i, lab) in evals if p.startswith(f"{algo}_s") and lab == g}):
            seeds = finished[algo] if it == args.iterations else args.seeds
            ms_g = [evals[(f"{algo}_s{x}", it, g)] for x in seeds if (f"{algo}_s{x}", it, g) in evals]
            ms_s = [evals[(f"{algo}_s{x}", it, s)] for x in seeds if (f"{algo}_s{x}", it, s) in evals]
            if ms_g:
                lines.append(f"| {algo} | {it} | " + cells(ms_g, ms_s, False) + " |")
    return lines


def significance(workdir: Path, evals, args, split: str, finished: dict[str, list[int]],
                 ends: Optional[dict[str, int]] = None) -> list[str]:
    """Per algorithm at the last iteration (finished seeds): greedy accuracy and avg@k vs the SFT
    start (exact sign-flip test over seeds) and vs GRPO (exact two-sample permutation test over
    seeds), and per problem vs the SFT start, pooled over seeds: McNemar on the pooled counts and
    the test with the problem as the unit (:func:`learning_stats.paired_counts_p`)."""
    g, s = f"{split_label(split)}_greedy", f"{split_label(split)}_avg{args.panel_avg_k}"
    metrics = [("greedy accuracy", g, "success_rate")]
    if args.panel_avg_k:
        metrics.append((f"avg@{args.panel_avg_k}", s, f"acc/mean@{args.panel_avg_k}"))
    ends = ends or {}

    def last(run: str) -> int:  # a run's end: --iterations, or where --train-seconds stopped it
        return ends.get(run, args.iterations)

    lines = ["| algorithm | metric | seeds above / equal / below the SFT start | mean Δ vs SFT | sign-flip p "
             "| Δ vs grpo | permutation p vs grpo |", "|---|---|---|---|---|---|---|"]
    sentences = []
    for algo in args.algos:
        for name, label, key in metrics:
            vals = [evals[(f"{algo}_s{x}", last(f"{algo}_s{x}"), label)][key] for x in finished[algo]
                    if (f"{algo}_s{x}", last(f"{algo}_s{x}"), label) in evals]
            if not vals or ("sft", 0, label) not in evals:
                continue
            ref = evals[("sft", 0, label)][key]
            d = [v - ref for v in vals]
            above, equal = sum(x > _TIE for x in d), sum(abs(x) <= _TIE for x in d)
            vs = "—", "—"
            if algo != "grpo" and "grpo" in args.algos and finished.get("grpo"):
                base = [evals[(f"grpo_s{x}", last(f"grpo_s{x}"), label)][key] for x in finished["grpo"]
                        if (f"grpo_s{x}", last(f"grpo_s{x}"), label) in evals]
                vs = f"{statistics.fmean(vals) - statistics.fmean(base):+.3f}", f"{permutation_p(vals, base):.3f}"
            lines.append(f"| {algo} | {name} | {above} / {equal} / {len(d) - above - equal} | "
                         f"{statistics.fmean(d):+.3f} | {sign_flip_p(d):.3f} | {vs[0]} | {vs[1]} |")
            if name == "greedy accuracy":
                sentences.append(f"{algo} ends above the SFT start's greedy accuracy in {above} of {len(d)} "
                                 f"finished seeds (mean Δ {statistics.fmean(d):+.3f}).")
    paired = []
    sft_won = panel_won(workdir, "sft", 0, g)
    for algo in args.algos:
        b = c = 0
        nets: dict[str, int] = {}
        for x in finished[algo]:
            won = panel_won(workdir, f"{algo}_s{x}", last(f"{algo}_s{x}"), g)
            b += sum(won[t] and not sft_won[t] for t in won if t in sft_won)
            c += sum(sft_won[t] and not won[t] for t in won if t in sft_won)
            for t in won:
                if t in sft_won:
                    nets[t] = nets.get(t, 0) + int(won[t]) - int(sft_won[t])
        if finished[algo] and sft_won:
            net = list(nets.values())
            paired.append(f"| {algo} | {len(finished[algo])} | {b} | {c} | {mcnemar_p(b, c):.3f} | "
                          f"{sum(n > 0 for n in net)} / {sum(n < 0 for n in net)} | {paired_counts_p(net):.3f} |")
    n = len(args.seeds)
    out = [*sentences, "", *lines, "",
           f"With {n} seeds the smallest possible sign-flip p is {2 / 2 ** n:.3f} and the smallest two-sample "
           f"permutation p is {2 / math.comb(2 * n, n):.3f}: across seeds alone, {n} seeds cannot reach p < 0.05.", ""]
    if paired:
        out += ["Per problem (greedy, paired with the SFT start's answer to the same problem, pooled over the "
                "finished seeds). The seeds share the SFT answers, so McNemar on the pooled counts overstates "
                "the evidence; the last two columns take the problem as the unit: the problems whose net "
                "change over the seeds is up / down, and the exact sign-flip p of those net changes "
                "(`learning_stats.paired_counts_p`; with one seed it is McNemar's):", "",
                "| algorithm | seeds | problems only RL solves | problems only SFT solves | exact McNemar p "
                "| problems up / down, net over seeds | by-problem p |",
                "|---|---|---|---|---|---|---|", *paired, ""]
    return out


def signal_table(train, algo: str, seeds: list[int], window: int) -> list[str]:
    """Per block of ``window`` iterations, the mean over seeds of each run's block mean of
    :data:`SIGNAL_KEYS` (training accuracy ± std over seeds), and SERL's weight statistics over the
    block's iterations whose teacher scored tokens (W mean, [min, max], mean |Δ| in nats, share at
    the clip bound: :func:`learning_stats.serl_weight_stats`)."""
    runs = {s: train[f"{algo}_s{s}"] for s in seeds if f"{algo}_s{s}" in train}
    if not runs:
        return []
    last = max(max(r) for r in runs.values() if r) if any(runs.values()) else 0
    head = ("| iterations | seeds | " + " | ".join(h for h, _ in SIGNAL_KEYS)
            + " | SERL W mean [min, max] | SERL mean abs Δ | SERL W at clip |")
    lines = [f"**{algo}**", "", head, "|---|---|" + "---|" * (len(SIGNAL_KEYS) + 3)]
    for start in range(1, last + 1, window):
        block = range(start, min(last, start + window - 1) + 1)
        per_seed = {s: [r[i] for i in block if i in r] for s, r in runs.items()}
        per_seed = {s: rows for s, rows in per_seed.items() if rows}
        cells = []
        for j, (_, key) in enumerate(SIGNAL_KEYS):
            means = [statistics.fmean(x[key] for x in rows if key in x) for rows in per_seed.values()
                     if any(key in x for x in rows)]
            if j == 0:
                cells.append(mean_std(means).rsplit(" (", 1)[0] if means else "—")
            else:
                cells.append(_fmt(statistics.fmean(means), 1 if key.startswith("timing") else 3) if means else "—")
        w = serl_weight_stats([x for rows in per_seed.values() for x in rows])
        if w:
            cells += [f"{_fmt(w['weight_mean'])} [{_fmt(w['weight_min'])}, {_fmt(w['weight_max'])}] "
                      f"({w['iterations']} it.)", _fmt(w["delta_abs_mean"], 4), _fmt(w["clipped_fraction"])]
        else:
            cells += ["—", "—", "—"]
        lines.append(f"| {block[0]}–{block[-1]} | {len(per_seed)} | " + " | ".join(cells) + " |")
    return lines + [""]


def plot_math(train, evals, args, path: Path) -> None:
    """Left: training accuracy vs iteration per algorithm (each seed's moving average over
    ``args.smooth_window`` iterations, then mean over seeds, band = min–max over seeds). Right: the
    first split's panel greedy accuracy (solid) and avg@k (dashed) vs iteration, mean over seeds
    with min–max bars, iteration 0 = the shared SFT start; the base model a dotted grey line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    split = split_label(args.splits[0])
    for ci, algo in enumerate(args.algos):
        color = f"C{ci}"
        per_seed = {}
        for s in args.seeds:
            run = train.get(f"{algo}_s{s}", {})
            its = sorted(i for i in run if "episode/success_rate" in run[i])
            if its:
                per_seed[s] = moving_average([run[i]["episode/success_rate"] for i in its], args.smooth_window)
        if per_seed:
            mean, lo, hi, _ = seed_band(per_seed)
            x = list(range(1, len(mean) + 1))
            ax.plot(x, mean, color=color, label=f"{algo} ({len(per_seed)} seed{'s' if len(per_seed) != 1 else ''})")
            ax.fill_between(x, lo, hi, color=color, alpha=0.2)
        for suffix, style in (("greedy", "-"), (f"avg{args.panel_avg_k}", "--")):
            label = f"{split}_{suffix}"
            key = "success_rate" if suffix == "greedy" else f"acc/mean@{args.panel_avg_k}"
            if suffix != "greedy" and not args.panel_avg_k:
                continue
            pts = [(0, [evals[("sft", 0, label)][key]])] if ("sft", 0, label) in evals else []
            for it in sorted({i for (p, i, lab) in evals if p.startswith(f"{algo}_s") and lab == label and i > 0}):
                vals = [evals[(f"{algo}_s{s}", it, label)][key] for s in args.seeds if (f"{algo}_s{s}", it, label) in evals]
                if vals:
                    pts.append((it, vals))
            if len(pts) > (1 if pts and pts[0][0] == 0 else 0):
                xs = [p[0] for p in pts]
                mu = [statistics.fmean(p[1]) for p in pts]
                err = [[m - min(p[1]) for m, p in zip(mu, pts)], [max(p[1]) - m for m, p in zip(mu, pts)]]
                ax2.errorbar(xs, mu, yerr=err, color=color, linestyle=style, marker="o", capsize=3,
                             label=f"{algo} {'greedy' if suffix == 'greedy' else f'avg@{args.panel_avg_k}'}")
    for suffix, style in (("greedy", ":"), (f"avg{args.panel_avg_k}", "-.")):
        if ("base", 0, f"{split}_{suffix}") in evals:
            m = evals[("base", 0, f"{split}_{suffix}")]
            ax2.axhline(m["success_rate"] if suffix == "greedy" else m.get(f"acc/mean@{args.panel_avg_k}", 0.0),
                        color="grey", linestyle=style, label=f"base {suffix}")
    ax.set_xlabel("RL iteration")
    ax.set_ylabel(f"training accuracy (moving average, {args.smooth_window} it.)")
    ax.set_title("training accuracy on each iteration's new problems")
    ax2.set_xlabel("RL iteration (0 = SFT start)")
    ax2.set_ylabel("panel accuracy")
    ax2.set_title("panel: " + split_description(args.splits[0], args.panel_size).removeprefix("the "))
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def _example(title: str, found: dict, key: str) -> list[str]:
    if key not in found:
        return [f"**{title}**: none in the traces yet.", ""]
    run, r = found[key]
    text = r.get("response", "")
    text = text if len(text) <= 3000 else text[:3000] + " …"
    return [f"**{title}** — `{run}`, iteration {r.get('iteration')}, problem `{r.get('task_id')}`, reward "
            f"{r.get('episode_reward')}, advantage {r.get('advantage', 0.0):.3f}:", "",
            "> " + str(r.get("task_text", "")).replace("\n", " "), "", "~~~~text", text.replace("~~~~", "~ ~ ~ ~"),
            "~~~~", ""]


def _jsonl_len(path: Path) -> int:
    return sum(1 for x in path.read_text().split("\n") if x.strip()) if path.exists() else 0


def sft_settings(workdir: Path, args: argparse.Namespace) -> str:
    """The SFT run's LoRA rank and ``sft.*`` settings as ``key=value`` words: those its
    ``sft/config.yaml`` recorded (what ran), else those the command line asks for."""
    cfg_file = workdir / "sft" / "config.yaml"
    if cfg_file.exists():
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(cfg_file)
        keys = ["epochs", "lr", "batch_size", "micro_batch_size", "lr_scheduler", "warmup_steps"]
        return " ".join([f"model.lora.r={cfg.model.lora.r}", *(f"sft.{k}={cfg.sft[k]}" for k in keys if k in cfg.sft)])
    sft_args = {a.split("=", 1)[0]: a for a in args.sft_defaults + args.sft_override}  # the override wins
    return " ".join([f"model.lora.r={args.lora_r}", *sft_args.values()])


def settings_lines(workdir: Path, args: argparse.Namespace) -> list[str]:
    """The RL start (expert rows and SFT, or ``--sft-model``), the algorithms and the panel."""
    start = json.loads((workdir / "start.json").read_text()) if (workdir / "start.json").exists() else None
    if start and start["source"] == "--sft-model":
        first = f"RL starts from an existing SFT model (`--sft-model`): `{start['model']}`."
    else:
        sft = [json.loads(x) for x in (workdir / "sft" / "metrics.jsonl").read_text().split("\n") if x.strip()] \
            if (workdir / "sft" / "metrics.jsonl").exists() else []
        loss = [x["sft/loss"] for x in sft if "sft/loss" in x]
        first = (f"Cold start: {_jsonl_len(workdir / 'expert.jsonl')} expert rows (the first of the "
                 f"{_jsonl_len(workdir / 'expert_pool.jsonl')} that `serl data expert math` kept of "
                 f"{'all' if args.expert_tasks < 0 else args.expert_tasks} GSM8K train problems drawn with seed "
                 f"{args.expert_seed}), `serl sft` with {sft_settings(workdir, args)}"
                 + (f": {len(loss)} optimizer steps, loss {loss[0]:.3f} → {loss[-1]:.3f}." if loss else "."))
    table = algos_for("math")
    algos = "; ".join(f"`{a}`: " + " ".join(table[a]) for a in args.algos)
    return [first, "",
            f"RL: recipe `{args.recipe}`, {args.iterations} iterations per run, seeds {args.seeds}, panel evaluation "
            f"every {args.eval_every}; " + (f"train overrides {' '.join(args.train_override)}; " if args.train_override else "")
            + f"algorithms {algos}.", "",
            f"Panel: {'; '.join(split_description(x, args.panel_size) for x in args.splits)}, greedy"
            + (f" and {args.panel_avg_k} sampled answers per problem (avg@{args.panel_avg_k}, seed {args.eval_seed})"
               if args.panel_avg_k else "") + ".", ""]


def wall_time_lines(phases: dict[str, float], train, algos: list[str]) -> list[str]:
    """The wall-time table: ``phases.json`` (seconds per phase, added when a phase's command ends,
    so a command stopped by the end of a session adds nothing) beside, for each RL phase, the sum of
    its runs' ``timing/iteration_s`` (every finished iteration, whichever session ran it)."""
    def iterations(algo: str) -> str:
        it = [m.get("timing/iteration_s", 0.0) for run, its in train.items() if run.startswith(f"{algo}_s")
              for m in its.values()]
        return f"{sum(it) / 60:.1f} ({len(it)} iteration{'' if len(it) == 1 else 's'})" if it else "—"

    names = [*phases, *(f"rl/{a}" for a in algos if f"rl/{a}" not in phases)]
    rows = [f"| {k} | {phases[k] / 60:.1f} | " if k in phases else f"| {k} | — | " for k in names]
    rows = [r + (iterations(k[3:]) if k.startswith("rl/") else "—") + " |" for r, k in zip(rows, names)]
    return ["## Wall time per phase", "",
            "`phases.json` adds a phase's time when its command ends, so the part of a command that a session's "
            "end stopped is missing from it; the RL iterations' own times (`timing/iteration_s`) count every "
            "finished iteration.", "",
            "| phase | minutes (phases.json) | minutes (sum of RL iteration times) |", "|---|---|---|", *rows, ""]


def write_math_report(workdir: Path, args: argparse.Namespace, phases: dict[str, float], cpu: str) -> Path:
    """Write the math report (``args.report_md`` or ``<workdir>/LEARNING_math.md``) and its plot
    (``args.report_png`` or ``<workdir>/learning_math.png``) from the files of ``workdir``; returns
    the Markdown path."""
    import torch

    from serl.models.loading import pick_dtype

    evals, train = load_panel(workdir), load_train(workdir)
    labels = [lab for lab, _, _ in panel_labels(args)]
    ends = finished_ends(evals, args, labels)
    finished = {a: [x for x in args.seeds if f"{a}_s{x}" in ends] for a in args.algos}
    out = Path(args.report_md).resolve() if args.report_md else workdir / "LEARNING_math.md"
    png = Path(args.report_png).resolve() if args.report_png else workdir / "learning_math.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    plot_math(train, evals, args, png)
    status = []
    for a in args.algos:
        partial = [f"{a}_s{s} ({max(train[f'{a}_s{s}'], default=0)} it.)" for s in args.seeds
                   if s not in finished[a] and f"{a}_s{s}" in train]
        status.append(f"{a}: seeds {finished[a] or 'none'} finished"
                      + (f"; in progress {', '.join(partial)}" if partial else ""))
    complete = all(len(finished[a]) == len(args.seeds) for a in args.algos)
    ids = list(panel_won(workdir, "sft", 0, f"{split_label(args.splits[0])}_greedy"))  # panel order
    md = ["# Learning experiment: math (GSM8K with a code interpreter)", "",
          f"Command: `{command_line()}`", "",
          f"Machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, dtype "
          f"{pick_dtype('auto', 'cpu')} (serl's `auto` rule on this CPU).", "",
          *settings_lines(workdir, args),
          ("Status: complete." if complete else "Status: **partial** — the end-of-run rows and the tests use the "
           "finished seeds only.") + " " + "; ".join(status) + ".", "",
          *(["## Findings", "", (workdir / "NOTES.md").read_text().strip(), ""] if (workdir / "NOTES.md").exists() else []),
          *wall_time_lines(phases, train, args.algos)]
    for split in args.splits:
        md += [f"## Panel: {split} (mean ± std over seeds)", "", *panel_table(evals, args, split, finished), "",
               f"### Significance at each run's end (iteration {', '.join(str(i) for i in sorted(set(ends.values()))) or args.iterations})",
               "", *significance(workdir, evals, args, split, finished, ends)]
    md += [f"![training accuracy and panel accuracy vs iteration]({os.path.relpath(png, out.parent)})", "",
           f"Left: training accuracy on each iteration's new GSM8K train problems, each seed's moving average "
           f"over {args.smooth_window} iterations, then the mean over seeds; band: min–max over seeds. Right: "
           f"panel accuracy, mean over seeds with min–max bars; iteration 0 is the shared SFT start.", "",
           f"## Learning signal per {args.smooth_window} iterations (mean over seeds)", "",
           "Train accuracy: `episode/success_rate` (all groups); tool-call rate: `tool/trajectory_with_call_fraction`; "
           "groups with A ≠ 0: `critic/advantages/nonzero_group_fraction` (over the groups the std filter kept; with "
           "SPEAR's tool bonus a group of all-wrong answers can carry an advantage); SERL: `serl_action_mask/*` over "
           "the iterations whose teacher scored tokens.", ""]
    for a in args.algos:
        md += signal_table(train, a, args.seeds, args.smooth_window)
    found = pick_examples(workdir, args.algos, args.seeds)
    md += ["## Example trajectories (from the runs' traces)", "",
           *_example("Solved with a tool call", found, "solved"), *_example("Failed", found, "failed"),
           "## Panel ids", "", f"{args.splits[0]}: " + (", ".join(f"`{i}`" for i in ids) if ids else "not evaluated yet"), ""]
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(md))
    os.replace(tmp, out)
    print(f"learning: wrote {out} and {png}")
    return out


if __name__ == "__main__":
    from learning_options import parse_args

    from serl.utils import cpu_model

    a = parse_args(sys.argv[1:])
    w = Path(a.workdir).resolve()
    write_math_report(w, a, json.loads((w / "phases.json").read_text()) if (w / "phases.json").exists() else {}, cpu_model())
