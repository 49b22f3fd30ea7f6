"""What ``serl report`` shows, read from a run folder (files only; the trainer is never imported).

A run folder (``serl train``) holds ``config.yaml``, ``metrics.jsonl`` (one record per iteration,
``val/*`` records for evaluations during training), ``trace/<iteration>.jsonl`` (the sampled
trajectory trace, :class:`serl.train.teacher_log.TraceWriter`), ``last_rollout.jsonl`` and
``eval_<split>/`` folders of ``serl eval`` (``metrics.json``, ``tasks.jsonl``).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Optional

import yaml

from serl.errors import SerlError
from serl.utils import jsonl_lines

log = logging.getLogger(__name__)

#: traced iterations shown by default (the newest); ``--iteration N`` picks one
DEFAULT_TRACE_ITERATIONS = 8

#: the curve panels: (title, regex over metric keys); a key goes to the first panel it matches
PANELS: list[tuple[str, str]] = [
    ("Success rate", r"^(episode|val)/success_rate$"),
    ("Success rate by task type", r"^episode/.+_success_rate$"),
    ("Eval success by task type", r"^val/.+_success_rate$"),
    ("Reward", r"^(episode/reward/mean|critic/score/mean|val/webshop_task_score)$"),
    ("Valid-action ratio", r"^(episode|val)/(valid|admissible)_action_ratio$"),
    ("Advantages", r"^critic/advantages/(mean|max|min|nonzero_fraction|nonzero_group_fraction)$"),
    ("SERL λ and weights W", r"^serl_action_mask/(effective_lambda|weight_mean|weight_max|weight_min|clipped_fraction)$"),
    ("SERL context fraction", r"^serl/(reprompt_sample_fraction|teacher_scored_fraction|action_token_fraction|context_dropped_by_length_fraction)$"),
    ("Entropy", r"^(actor|replay)/entropy$"),
    ("KL", r"^(actor|replay)/(kl_loss|ppo_kl)$"),
    ("Episode length", r"^episode/length/mean$"),
    ("Timings (s)", r"^timing/(rollout|teacher|update|reference|iteration)_s$"),
]


class ReportError(SerlError):
    """A folder is not a serl run folder, or a requested iteration has no trace."""


def read_jsonl(path: Path) -> list[dict]:
    """The JSON records (objects) of ``path``, one a line. A line that is not one (cut by a crash
    while it was written, or still being written by a live run) is skipped, with one warning
    naming the file and its line number; the page draws the rest."""
    out = []
    for n, _, rec, _ in jsonl_lines(path.read_text(encoding="utf-8", errors="replace")):
        if isinstance(rec, dict):
            out.append(rec)
        else:
            fix = "; `serl train --resume` repairs it" if path.name == "metrics.jsonl" else ""
            log.warning("serl report: skipped %s line %d: not a complete JSON record (cut by a crash, or still "
                        "being written)%s", path, n, fix)
    return out


def metric_series(records: list[dict]) -> dict[str, list[list[float]]]:
    """``{key: [[iteration, value], ...]}`` of the numeric metrics of ``metrics.jsonl`` records
    (NaN and infinities dropped; a later record of the same iteration wins, as after a resume)."""
    by_key: dict[str, dict[int, float]] = {}
    for r in records:
        it = int(r.get("iteration", 0))
        for k, v in r.items():
            if k != "iteration" and isinstance(v, (int, float)) and v == v and abs(v) != float("inf"):
                by_key.setdefault(k, {})[it] = float(v)
    return {k: [[i, v] for i, v in sorted(d.items())] for k, d in by_key.items()}


def panels(runs: list[dict]) -> list[dict]:
    """The curve panels of :data:`PANELS` that have data: ``[{"title", "series": [{"run", "key",
    "points"}]}]``, one series per run and metric key."""
    out = []
    taken: set[str] = set()
    for title, pattern in PANELS:
        series = []
        for run in runs:
            for key in sorted(run["metrics"]):
                if key not in taken and re.search(pattern, key):
                    series.append({"run": run["name"], "key": key, "points": run["metrics"][key]})
        taken.update(s["key"] for s in series)
        if series:
            out.append({"title": title, "series": series})
    return out


def group_trajectories(rows: list[dict], source: str) -> list[dict]:
    """Trace rows (one step each) grouped into trajectories, steps in order."""
    trajs: dict[tuple, dict] = {}
    for r in rows:
        key = (r.get("iteration"), r["traj_uid"])
        if key not in trajs:
            trajs[key] = {k: r.get(k) for k in ("iteration", "traj_uid", "uid", "task_id", "task_type", "task_text",
                                                "won", "episode_reward", "length")}
            trajs[key].update(source=source, steps=[], has_context=False)
        t = trajs[key]
        t["steps"].append({k: v for k, v in r.items() if k not in t})
        t["has_context"] = t["has_context"] or bool((r.get("serl") or {}).get("has_context"))
    for t in trajs.values():
        t["steps"].sort(key=lambda s: s.get("step_id", 0))
    return list(trajs.values())


def rollout_trajectories(path: Path, iteration: int) -> list[dict]:
    """``last_rollout.jsonl`` (full trajectories, no advantages or weights) as trace-like
    trajectories: the fallback of runs written before the trace existed."""
    rows = []
    for t in read_jsonl(path):
        won = bool(t["steps"]) and bool(t["steps"][-1].get("won"))
        for s in t["steps"]:
            rows.append({"iteration": iteration, "traj_uid": t["traj_uid"], "uid": t["uid"],
                         "task_id": t["task"]["task_id"], "task_type": t["task"]["task_type"],
                         "task_text": t.get("task_text", ""), "won": won,
                         "episode_reward": sum(x.get("reward", 0.0) for x in t["steps"]), "length": len(t["steps"]),
                         "step_id": s["step_id"], "observation": s["observation"], "response": s["response_text"],
                         "action": s["action"], "action_valid": s["action_valid"], "reward": s.get("reward", 0.0),
                         "feedback": s.get("feedback", ""), "advantage": None, "tokens": None, "serl": None})
    return group_trajectories(rows, "last_rollout")


def trace_iterations(run_dir: Path) -> list[int]:
    """The iterations that have a trace file, ascending."""
    d = run_dir / "trace"
    return sorted(int(p.stem) for p in d.glob("*.jsonl") if p.stem.isdigit()) if d.is_dir() else []


def load_trajectories(run_dir: Path, iteration: Optional[int] = None) -> list[dict]:
    """The traced trajectories of ``iteration`` (None: the newest :data:`DEFAULT_TRACE_ITERATIONS`
    traced iterations, newest first); with no trace at all, those of ``last_rollout.jsonl``.

    Raises:
        ReportError: ``iteration`` has no trace file.
    """
    its = trace_iterations(run_dir)
    if iteration is not None:
        if iteration not in its:
            raise ReportError(f"{run_dir}: no trace of iteration {iteration} (traced: {its or 'none'}; "
                              "trainer.trace_freq sets how often the trainer records one)")
        its = [iteration]
    elif not its:
        last = run_dir / "last_rollout.jsonl"
        return rollout_trajectories(last, -1) if last.exists() else []
    out = []
    for it in sorted(its, reverse=True)[:DEFAULT_TRACE_ITERATIONS]:
        out.extend(group_trajectories(read_jsonl(run_dir / "trace" / f"{it}.jsonl"), "trace"))
    return out


def load_evals(run_dir: Path) -> list[dict]:
    """The ``serl eval`` results in ``run_dir/eval_*``: ``[{"name", "metrics", "tasks"}]``."""
    out = []
    for d in sorted(run_dir.glob("eval_*")):
        if not (d / "metrics.json").exists():
            continue
        tasks = read_jsonl(d / "tasks.jsonl") if (d / "tasks.jsonl").exists() else []
        out.append({"name": d.name, "metrics": json.loads((d / "metrics.json").read_text()), "tasks": tasks})
    return out


def config_summary(cfg: dict) -> dict[str, Any]:
    """The few config values the page's header shows."""
    alg, env = cfg.get("algorithm", {}), cfg.get("env", {})
    serl = alg.get("serl", {})
    return {"env": env.get("name"), "adv_estimator": alg.get("adv_estimator"),
            "serl": bool(serl.get("enable")), "sampling_mode": serl.get("sampling_mode") if serl.get("enable") else None,
            "model": cfg.get("model", {}).get("path"), "group_size": env.get("rollout", {}).get("n"),
            "train_batch_size": cfg.get("data", {}).get("train_batch_size"),
            "total_training_steps": cfg.get("trainer", {}).get("total_training_steps")}


def load_run(run_dir: str | Path, iteration: Optional[int] = None) -> dict[str, Any]:
    """Everything the page shows of one run folder.

    Returns:
        ``{"name", "path", "config", "metrics" {key: [[iteration, value]]}, "evals", "trajectories"}``.

    Raises:
        ReportError: not a run folder (no ``config.yaml`` nor ``metrics.jsonl``), or no trace of
            ``iteration``.
    """
    run_dir = Path(run_dir)
    cfg_path, m_path = run_dir / "config.yaml", run_dir / "metrics.jsonl"
    if not run_dir.is_dir() or not (cfg_path.exists() or m_path.exists()):
        raise ReportError(f"{run_dir} is not a serl run folder (no config.yaml or metrics.jsonl)")
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
    return {"name": run_dir.name, "path": str(run_dir.resolve()), "config": config_summary(cfg or {}),
            "metrics": metric_series(read_jsonl(m_path)) if m_path.exists() else {},
            "evals": load_evals(run_dir), "trajectories": load_trajectories(run_dir, iteration)}


def report_data(run_dirs: list[str | Path], iteration: Optional[int] = None) -> dict[str, Any]:
    """The page's data: ``{"runs": [load_run(...)], "panels": panels(runs)}``; run names are made
    unique (``name``, ``name (2)``) when folders share a name.

    Raises:
        ReportError: no folder given, or as :func:`load_run`.
    """
    if not run_dirs:
        raise ReportError("serl report needs at least one run folder")
    runs, seen = [], {}
    for d in run_dirs:
        run = load_run(d, iteration)
        n = seen[run["name"]] = seen.get(run["name"], 0) + 1
        if n > 1:
            run["name"] = f"{run['name']} ({n})"
        runs.append(run)
    return {"runs": runs, "panels": panels(runs)}
