"""Metric sinks (JSONL + TensorBoard), the running means of the update's metrics, and the
rollout metrics (episode success, length and reward statistics of an iteration)."""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from pathlib import Path
import sys
import uuid
from typing import Iterable, Optional

import torch

from serl.errors import ConfigError
from serl.trajectory import Group
from serl.utils import atomic_write_text, jsonl_lines

log = logging.getLogger(__name__)


class MetricMeans:
    """The (weighted) mean of each metric over the dicts added (micro-batches, optimizer steps); a
    key missing from some dicts is averaged over those that have it. Keys keep first-seen order."""

    def __init__(self):
        self._sums: dict[str, float] = {}
        self._counts: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float = 1.0) -> None:
        """Add one dict of scalars with ``weight`` (1: a plain mean; the update weights its
        micro-steps by their loss tokens under ``actor.token_mean_scope=mini_batch``). A dict of
        weight 0 adds nothing."""
        if weight <= 0:
            return
        for k, v in metrics.items():
            self._sums[k] = self._sums.get(k, 0.0) + weight * float(v)
            self._counts[k] = self._counts.get(k, 0.0) + weight

    def result(self) -> dict[str, float]:
        """``{key: mean}``."""
        return {k: self._sums[k] / self._counts[k] for k in self._sums}

    def parts(self) -> tuple[dict[str, float], dict[str, float]]:
        """``(sums, counts)`` per key (copies), to merge the means of several processes
        (:func:`serl.train.distributed.merge_metric_means`)."""
        return dict(self._sums), dict(self._counts)


#: the metrics of the one-line ``console`` sink, with their short names
CONSOLE_KEYS = {"episode/success_rate": "success", "episode/reward/mean": "reward",
                "episode/valid_action_ratio": "valid", "critic/advantages/nonzero_fraction": "adv!=0",
                "serl_action_mask/weight_mean": "W", "actor/pg_loss": "pg_loss", "timing/iteration_s": "s",
                "val/success_rate": "val_success"}


class MetricsLogger:
    """Appends one JSON line per iteration to ``<run>/metrics.jsonl`` (flushed and fsynced, so a
    crash loses at most the line being written) and mirrors scalars to TensorBoard, the console
    and Weights & Biases (verl's ``trainer.logger`` sinks).

    Args:
        run_dir: the run folder.
        sinks: any of ``jsonl``, ``tensorboard``, ``console`` (one line per logged record on
            stderr), ``wandb``.
        project: the W&B project; run_name: the W&B run name (default: the run folder's name).
        config: the run's config as a plain dict, for W&B.

    Raises:
        ConfigError: ``wandb`` is asked for but the ``wandb`` package is not installed.
    """

    def __init__(self, run_dir: Path, sinks: Iterable[str], project: str = "serl", run_name: Optional[str] = None,
                 config: Optional[dict] = None):
        self.run_dir = Path(run_dir)
        self.sinks = set(sinks)
        self.path = self.run_dir / "metrics.jsonl"
        self.tb = None
        if "tensorboard" in self.sinks:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        self.wandb = _wandb_run(self.run_dir, project, run_name or self.run_dir.name, config) \
            if "wandb" in self.sinks else None

    def truncate_after(self, iteration: int) -> None:
        """On resume, repair ``metrics.jsonl`` before the first new line: drop the lines of
        iterations after the checkpoint's ``iteration`` (they are trained again, so each would
        otherwise appear twice) and any line that is not a complete JSON record (a crash cut it
        while it was written). Each kind of dropped line is named in one warning (file and line
        numbers); the file is rewritten atomically, and only if a line was dropped."""
        if not self.path.exists():
            return
        keep, torn, redone = [], [], []
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for n, line, rec, _ in jsonl_lines(f):
                if not isinstance(rec, dict):
                    torn.append(n)
                elif rec.get("iteration", 0) > iteration:
                    redone.append(rec.get("iteration"))
                else:
                    keep.append(line if line.endswith("\n") else line + "\n")
        if torn:
            log.warning("%s: dropped line%s %s, not a complete JSON record (cut by a crash while it was written)",
                        self.path, "s" if len(torn) > 1 else "", ", ".join(map(str, torn)))
        if redone:
            log.warning("%s: dropped %d line(s) of iteration(s) %s, after the checkpoint's iteration %d "
                        "(they are trained again)", self.path, len(redone),
                        ", ".join(map(str, sorted(set(redone)))), iteration)
        if torn or redone:
            atomic_write_text(self.path, "".join(keep))

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        rec = {"iteration": iteration, **{k: float(v) for k, v in metrics.items()}}
        if "jsonl" in self.sinks:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
        if self.tb is not None:
            for k, v in rec.items():
                if k != "iteration":
                    self.tb.add_scalar(k, v, iteration)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in rec.items() if k != "iteration"}, step=iteration)
        if "console" in self.sinks:
            parts = [f"{short} {rec[k]:.3g}" for k, short in CONSOLE_KEYS.items() if k in rec]
            print(f"serl iteration {iteration}: " + ", ".join(parts), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def _wandb_run(run_dir: Path, project: str, name: str, config: Optional[dict]):
    """A W&B run writing under ``run_dir`` (its id kept in ``<run_dir>/wandb_run_id``, so a resumed
    serl run continues the same W&B run); honours ``WANDB_MODE`` (e.g. ``offline``) and ``WANDB_DIR``."""
    try:
        import wandb
    except ImportError as e:
        raise ConfigError("trainer.logger: wandb needs the wandb package (pip install 'serl[wandb]')") from e
    id_file = run_dir / "wandb_run_id"
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    run_dir.mkdir(parents=True, exist_ok=True)
    id_file.write_text(run_id + "\n")
    return wandb.init(project=project, name=name, id=run_id, resume="allow", config=config or {},
                      dir=os.environ.get("WANDB_DIR", str(run_dir)))


def rollout_metrics(groups: list[Group], prefix: str = "episode") -> dict[str, float]:
    """Success, reward, length, valid-action ratio and per-task-type success of a set of groups
    (verl-agent's ``episode/*`` metrics)."""
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {}
    steps = [s for t in trajs for s in t.steps]
    rewards = [t.episode_reward for t in trajs]
    lengths = [t.length for t in trajs]
    m = {
        f"{prefix}/success_rate": sum(t.won for t in trajs) / len(trajs),
        f"{prefix}/reward/mean": sum(rewards) / len(rewards),
        f"{prefix}/reward/max": max(rewards),
        f"{prefix}/reward/min": min(rewards),
        f"{prefix}/length/mean": sum(lengths) / len(lengths),
        f"{prefix}/length/max": max(lengths),
        f"{prefix}/length/min": min(lengths),
        f"{prefix}/valid_action_ratio": sum(s.action_valid for s in steps) / max(1, len(steps)),
        # the action is one the env listed as admissible (ALFWorld; WebShop lists clickables)
        f"{prefix}/admissible_action_ratio": sum(s.action in s.admissible_actions for s in steps) / max(1, len(steps)),
        f"{prefix}/num_trajectories": len(trajs),
        f"{prefix}/num_step_rows": len(steps),
        "response_length/mean": sum(len(s.response_ids) for s in steps) / max(1, len(steps)),
        "prompt_length/mean": sum(len(s.prompt_ids) for s in steps) / max(1, len(steps)),
    }
    m.update({f"{prefix}/{k}_success_rate": v for k, v in success_by_type(trajs).items()})
    return m


def success_by_type(trajectories) -> dict[str, float]:
    """Success rate per ``task.task_type``."""
    won: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        won[t.task.task_type].append(t.won)
    return {k: sum(v) / len(v) for k, v in sorted(won.items())}


def advantage_signal_metrics(advantages: torch.Tensor, group_index: torch.Tensor) -> dict[str, float]:
    """How much learning signal a batch carries: the fraction of rows, and of task groups, whose
    advantage is not exactly 0. A group whose G rollouts all scored the same gives every row
    advantage 0 under GRPO, so no gradient (and SERL has nothing to re-weight). The groups counted
    are those in the update batch, i.e. after ``rollout.rollout_filter_ratio``'s filter, so 1.0
    means that every kept group carried signal, not every sampled one.

    Args:
        advantages: ``[rows]`` one advantage per step row.
        group_index: ``[rows]`` integer group id of each row.

    Returns:
        ``critic/advantages/nonzero_fraction`` and ``critic/advantages/nonzero_group_fraction``.
    """
    nonzero = advantages != 0
    groups = set(group_index.tolist())
    signal = set(group_index[nonzero].tolist())
    return {"critic/advantages/nonzero_fraction": int(nonzero.sum()) / max(1, len(advantages)),
            "critic/advantages/nonzero_group_fraction": len(signal) / max(1, len(groups))}


def signal_summary(records: Iterable[dict]) -> dict[str, float]:
    """How much of a whole run carried learning signal, from its per-iteration metrics records
    (``metrics.jsonl`` lines, as :class:`MetricsLogger` writes them).

    Args:
        records: dicts with ``critic/advantages/nonzero_group_fraction`` (records without it, e.g.
            evaluation-only lines, are skipped).

    Returns:
        ``iterations`` (records counted), ``iterations_with_signal`` (those whose fraction is > 0)
        and ``group_fraction`` (the mean over those records of the fraction of kept groups whose
        advantage is not all 0; NaN when no record has it). ``iterations_with_signal == 0`` with
        ``iterations > 0`` means the run computed only zero gradients from its policy-gradient loss.
    """
    fractions = [float(r["critic/advantages/nonzero_group_fraction"]) for r in records
                 if "critic/advantages/nonzero_group_fraction" in r]
    return {"iterations": float(len(fractions)),
            "iterations_with_signal": float(sum(f > 0 for f in fractions)),
            "group_fraction": sum(fractions) / len(fractions) if fractions else float("nan")}
