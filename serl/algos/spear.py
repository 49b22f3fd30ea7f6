"""SPEAR: self-imitation replay buffer, advantage recalibration, schedules; the tool-call reward
(:mod:`serl.algos.tool_bonus`, re-exported here).

Paper: "Learn the Ropes, Then Trust the Wins" (arXiv 2509.22601).
Code: ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/`` (replay buffer and recalibration: verl/trainer/ppo/ray_trainer_hybrid.py; replay loss:
verl/workers/actor/dp_actor.py; tool-call reward: agent_system/reward_manager/episode.py).
Everything here is pure Python / torch on plain data, so the trainer owns when it is called
(in the original's order: consume a full buffer before the actor update, refill it after)
and checkpoints the buffer with :meth:`ReplayBuffer.state_dict`.

Units: rewards and advantages are in env reward units (ALFWorld/WebShop: 10 for a win, plus
the tool-call bonus in [0, 1], minus 0.1 per invalid action); steps are *global training
steps* (iterations, the verl ``global_steps`` counter, 1-based in the original loop).

Where the original's behaviour looks like a defect, the choice made here is documented
on the function that makes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from serl.algos.filters import group_reward_stats, largest_power_of_two_le
from serl.algos.tool_bonus import TOOLCALL_MODES, toolcall_bonus, toolcall_bonus_qwen3
from serl.errors import ConfigError

if TYPE_CHECKING:
    from serl.config import AlgorithmConfig, Config

__all__ = [
    "ReplayBuffer", "ReplayRow", "check_config", "group_reward_stats", "percentile", "recalibrate_advantages",
    "replay_coef", "toolcall_bonus", "toolcall_bonus_qwen3",
]

#: ``algorithm.spear.trajectory_staleness_reference`` values (:class:`ReplayBuffer`)
STALENESS_REFERENCES = ("newest_entry", "current_step")


def check_config(alg: "AlgorithmConfig") -> None:
    """Check the SPEAR names this module owns: ``algorithm.use_toolcall_reward``
    (:data:`TOOLCALL_MODES`) and ``algorithm.spear.trajectory_staleness_reference``
    (:data:`STALENESS_REFERENCES`). Called by :func:`serl.configure.check_config`.

    Raises:
        ConfigError: ``"algorithm.<key>: unknown ...; valid: [...]"`` for the first unknown name.
    """
    if alg.use_toolcall_reward not in TOOLCALL_MODES:
        raise ConfigError(f"algorithm.use_toolcall_reward: unknown mode {alg.use_toolcall_reward!r}; "
                          f"valid: {list(TOOLCALL_MODES)}")
    ref = alg.spear.trajectory_staleness_reference
    if ref not in STALENESS_REFERENCES:
        raise ConfigError(f"algorithm.spear.trajectory_staleness_reference: unknown reference {ref!r}; "
                          f"valid: {list(STALENESS_REFERENCES)}")


# --------------------------------------------------------------------------------------------
# Schedules (replay coefficient γ_t; the tool-call reward is :mod:`serl.algos.tool_bonus`)
# --------------------------------------------------------------------------------------------


def replay_coef(global_step: int, replay_loss_coef: float, max_replay_loss_steps: int) -> float:
    """Cosine-warmed replay loss coefficient γ_t (SPEAR, arXiv 2509.22601;
    ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/workers/actor/dp_actor.py``).

    ``γ_t = c · (1 − cos(π·t/T))/2`` for ``t <= T`` (rises from 0 to ``c``), ``c`` after;
    ``t`` = global step (not the number of replay updates), ``c`` =
    ``algorithm.spear.replay_loss_coef``, ``T`` = ``algorithm.spear.max_replay_loss_steps``
    (``T <= 0``: constant ``c``). The trainer multiplies each replay micro-batch loss by it.
    """
    if max_replay_loss_steps <= 0 or global_step > max_replay_loss_steps:
        return float(replay_loss_coef)
    return float(replay_loss_coef) * (1.0 - math.cos(math.pi * global_step / max_replay_loss_steps)) / 2.0


# --------------------------------------------------------------------------------------------
# Recalibration (ray_trainer_hybrid.py, weight_decay_trajectory_replay)
# --------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """``q``-th percentile with linear interpolation (``np.percentile`` default); ``q`` in [0, 100].

    Raises:
        ValueError: empty ``values``.
    """
    if len(values) == 0:
        raise ValueError("percentile of an empty list")
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    return float(torch.quantile(t, q / 100.0))


def recalibrate_advantages(
    rewards: torch.Tensor, baseline: float, std: float, norm_adv_by_std: bool
) -> torch.Tensor:
    """Off-policy advantage of replayed samples against the P50 baseline
    (``weight_decay_trajectory_replay`` <= 0; ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/ray_trainer_hybrid.py``).

    ``Ã = R − b``; with ``algorithm.norm_adv_by_std_in_grpo`` ``Ã = (R − b)/(s + 1e-6)``.

    Args:
        rewards: ``[n]`` stored scalar rewards (as collected: tool-call bonus included).
        baseline: ``b`` = P50 of the stored group means.
        std: ``s`` = P50 of the stored group stds.
        norm_adv_by_std: divide by ``s + 1e-6``.

    Returns:
        ``[n]`` float32 recalibrated advantages (one scalar per row; broadcast over tokens).
    """
    adv = rewards.to(torch.float32) - float(baseline)
    if norm_adv_by_std:
        adv = adv / (float(std) + 1e-6)
    return adv


# --------------------------------------------------------------------------------------------
# The replay buffer (TrajectoryBufferBatch in ray_trainer_hybrid.py)
# --------------------------------------------------------------------------------------------


@dataclass
class ReplayRow:
    """One step row as the trainer stored it for self-imitation replay (what SPEAR's
    ``TrajectoryBufferBatch`` stores per sample, ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/ray_trainer_hybrid.py``).
    Token tensors are 1-D and unpadded; the buffer keeps detached CPU copies.

    Attributes:
        prompt_ids: ``[prompt_len]`` long, the chat-templated prompt fed to the policy.
        response_ids: ``[resp_len]`` long, the sampled response.
        response_mask: ``[resp_len]`` float 0/1, after the Dr.BoT filters (a filtered row is
            all zero, so it has advantage 0 and is never admitted).
        old_log_probs: ``[resp_len]`` float, log-probs of ``response_ids`` under the policy
            that *collected* the row (behaviour policy): the replay ratio's denominator.
        advantages: ``[resp_len]`` float, the on-policy token advantages of the row (estimator
            output broadcast × ``response_mask``, before SERL's token weights). Admission reads
            their masked mean; decay-mode replay scales them.
        reward: the row's scalar score as fed to the advantage estimator (episode reward +
            tool-call bonus − invalid-action penalty), in reward units.
        uid: task-group id; traj_uid: trajectory id (baseline history statistics).
        step: global step at collection; set by :meth:`ReplayBuffer.add_step`.
        extra: any further per-row data the trainer needs at replay time (e.g. ``action_mask``
            for SERL), plain Python / tensors only, so checkpoints stay ``weights_only``-loadable.
    """

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    reward: float
    uid: Any
    traj_uid: Any
    step: int = -1
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``ValueError`` unless the four response tensors are 1-D and of equal length."""
        n = self.response_ids.shape[-1]
        for name in ("response_mask", "old_log_probs", "advantages"):
            t = getattr(self, name)
            if t.dim() != 1 or t.shape[0] != n:
                raise ValueError(f"ReplayRow.{name} has shape {tuple(t.shape)}, expected ({n},) like response_ids")
        if self.prompt_ids.dim() != 1 or self.response_ids.dim() != 1:
            raise ValueError("ReplayRow.prompt_ids and response_ids must be 1-D")

    def row_advantage(self) -> float:
        """Masked mean of ``advantages`` (the estimator's scalar for a broadcast row; 0 if the
        mask is empty)."""
        m = self.response_mask.to(torch.float32)
        denom = float(m.sum())
        if denom <= 0:
            return 0.0
        return float((self.advantages.to(torch.float32) * m).sum()) / denom

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "response_mask": self.response_mask,
            "old_log_probs": self.old_log_probs,
            "advantages": self.advantages,
            "reward": float(self.reward),
            "uid": self.uid,
            "traj_uid": self.traj_uid,
            "step": int(self.step),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReplayRow":
        return cls(**d)


def _stored_copy(row: ReplayRow, step: int) -> ReplayRow:
    def c(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu").clone()

    extra = {k: (c(v) if isinstance(v, torch.Tensor) else v) for k, v in row.extra.items()}
    return ReplayRow(
        prompt_ids=c(row.prompt_ids),
        response_ids=c(row.response_ids),
        response_mask=c(row.response_mask),
        old_log_probs=c(row.old_log_probs),
        advantages=c(row.advantages),
        reward=float(row.reward),
        uid=row.uid,
        traj_uid=row.traj_uid,
        step=int(step),
        extra=extra,
    )


class ReplayBuffer:
    """SPEAR's self-imitation buffer of positive-advantage step rows (``TrajectoryBufferBatch``,
    ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/ray_trainer_hybrid.py``).

    Life cycle per training step (as the original's ``fit``)::

        if buf.is_full():                                  # before the actor update
            replay_rows, m = buf.consume(generator)        # recalibrated, sampled, buffer emptied
        ... on-policy update, then replay mini-batches ...
        buf.update(rows_of_this_step, global_step)         # remove_old() + add_step()

    Modes (``weight_decay_trajectory_replay`` = ``w``):

    - P50 (``w <= 0`` or ``w > 1``; SPEAR scripts use −1): replay advantages are recalibrated
      against the median of the baseline history; the buffer size counts only rows whose
      reward exceeds that median.
    - decay (``0 < w <= 1``): replay advantages are the stored ones × ``w``; the size counts
      every stored row.

    Deliberate differences from the original, each reproducing it by default:

    - ``score_threshold`` (``trajectory_score_threshold``) is live: a row is admitted when its
      advantage is ``> score_threshold``. The original ignores the key and admits ``> 0``;
      the default 0.0 reproduces that.
    - ``tolerate_steps`` is used as given; the original capped it at 10 (the yaml default is
      10 and the scripts use 5, so their behaviour is unchanged).
    - ``staleness_reference="current_step"`` measures age against the current global step;
      the default ``newest_entry`` is the original (age vs the newest stored entry, so entries
      can outlive ``tolerate_steps`` when no row is admitted for a while).
    - a replay batch of ``n`` candidates uses ``min(largest power of two <= n, buffer_size)``
      rows, so ``n = 1`` gives 1 row (the original's helper returned 0 for ``n <= 1``).
    """

    def __init__(
        self,
        buffer_size: int = 2048,
        baseline_buffer_size: int = 10240,
        tolerate_steps: int = 10,
        weight_decay: float = 0.1,
        norm_adv_by_std: bool = False,
        score_threshold: float = 0.0,
        staleness_reference: str = "newest_entry",
        keep_strictly_positive: bool = False,
    ) -> None:
        self.keep_strictly_positive = bool(keep_strictly_positive)
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
        if baseline_buffer_size < 1:
            raise ValueError(f"baseline_buffer_size must be >= 1, got {baseline_buffer_size}")
        if tolerate_steps < 0:
            raise ValueError(f"tolerate_steps must be >= 0, got {tolerate_steps}")
        if staleness_reference not in STALENESS_REFERENCES:
            raise ValueError(f"staleness_reference must be one of {STALENESS_REFERENCES}, got {staleness_reference!r}")
        self.buffer_size = int(buffer_size)
        self.baseline_buffer_size = int(baseline_buffer_size)
        self.tolerate_steps = int(tolerate_steps)
        self.weight_decay = float(weight_decay)
        self.norm_adv_by_std = bool(norm_adv_by_std)
        self.score_threshold = float(score_threshold)
        self.staleness_reference = staleness_reference
        #: ``[(global_step, [ReplayRow, ...]), ...]`` oldest first: one entry per admitting step
        self.entries: list[tuple[int, list[ReplayRow]]] = []
        #: FIFO baseline history ``[(global_step, [g_mean per group]), ...]`` and the same for g_std
        self.reward_mean_history: list[tuple[int, list[float]]] = []
        self.reward_std_history: list[tuple[int, list[float]]] = []

    @classmethod
    def from_config(cls, cfg: Config) -> "ReplayBuffer":
        """Build from the top-level :class:`serl.config.Config` (``algorithm.spear.*`` and
        ``algorithm.norm_adv_by_std_in_grpo``)."""
        s = cfg.algorithm.spear
        return cls(
            buffer_size=s.trajectory_buffer_size,
            baseline_buffer_size=s.baseline_buffer_size,
            tolerate_steps=s.trajectory_tolerate_steps,
            weight_decay=s.weight_decay_trajectory_replay,
            norm_adv_by_std=cfg.algorithm.norm_adv_by_std_in_grpo,
            score_threshold=s.trajectory_score_threshold,
            staleness_reference=s.trajectory_staleness_reference,
            keep_strictly_positive=s.replay_keep_strictly_positive,
        )

    # ---- queries ------------------------------------------------------------------------

    @property
    def p50_mode(self) -> bool:
        """True for P50 recalibration (``w <= 0`` or ``w > 1``), False for decay mode."""
        return self.weight_decay <= 0.0 or self.weight_decay > 1.0

    def num_rows(self) -> int:
        """Number of stored rows (all entries)."""
        return sum(len(rows) for _, rows in self.entries)

    def baseline(self) -> Optional[tuple[float, float]]:
        """``(b, s)`` = P50 of all stored group means and of all stored group stds, or None
        before any history."""
        means = [v for _, vals in self.reward_mean_history for v in vals]
        stds = [v for _, vals in self.reward_std_history for v in vals]
        if not means:
            return None
        return percentile(means, 50), percentile(stds, 50)

    def size(self) -> int:
        """The counted size of the "full" test (the original's ``is_full_capacity``).

        P50 mode: stored rows whose reward is ``> b`` (P50 of the history); before any history,
        rows above the mean reward of their own entry. Decay mode: every stored row.
        """
        if not self.p50_mode:
            return self.num_rows()
        base = self.baseline()
        count = 0
        for _, rows in self.entries:
            if not rows:
                continue
            rewards = [r.reward for r in rows]
            ref = base[0] if base is not None else sum(rewards) / len(rewards)
            count += sum(1 for x in rewards if x > ref)
        return count

    def is_full(self) -> bool:
        """True when :meth:`size` > 1.5 × ``buffer_size`` (as the original)."""
        return self.size() > 1.5 * self.buffer_size

    # ---- updates ------------------------------------------------------------------------

    def remove_old(self, current_step: Optional[int] = None) -> int:
        """Drop stale entries (the original's ``remove_old``): keep entries whose step is within
        ``tolerate_steps`` of the reference step — the newest entry's step (original) or
        ``current_step`` (``staleness_reference="current_step"``).

        Returns:
            The number of rows dropped.

        Raises:
            ValueError: ``current_step`` missing in ``current_step`` mode.
        """
        if self.staleness_reference == "current_step" and current_step is None:
            raise ValueError("remove_old needs current_step with staleness_reference='current_step'")
        if not self.entries:
            return 0
        ref = int(current_step) if self.staleness_reference == "current_step" else self.entries[-1][0]
        before = self.num_rows()
        self.entries = [(s, rows) for s, rows in self.entries if abs(s - ref) <= self.tolerate_steps]
        return before - self.num_rows()

    def add_step(self, rows: Sequence[ReplayRow], global_step: int) -> dict[str, float]:
        """Record one training step: baseline history, then admission (the original's ``update_batch``).

        1. Group statistics of *all* given rows (:func:`group_reward_stats`) are appended to the
           FIFO history, after popping the oldest steps while more than
           ``baseline_buffer_size`` group means are stored (so the history may exceed the size
           by one step's groups, as the original).
        2. Rows whose :meth:`ReplayRow.row_advantage` is ``> score_threshold`` are stored (as
           detached CPU copies) as one entry tagged ``global_step``; a row that records its tool
           calls (``extra["tool_calls"]``, the math env's rows) also needs >= 1 of them, as
           SPEAR's math trainer admits only samples whose messages hold a tool call
           (``TencentYoutuResearch/SPEAR@7e84315:verl/verl/trainer/ppo/ray_trainer_hybrid.py``,
           ``TrajectoryBufferBatch.update_batch``; commented out in its verl-agent tree).

        Args:
            rows: the step rows of this training step, after the filters (the std filter's
                dropped groups excluded, masked rows included).
            global_step: the current global step.

        Returns:
            Metrics: ``replay/admitted``, ``replay/rows_seen``, ``replay/num_rows``,
            ``replay/size``.
        """
        for r in rows:
            r.validate()
        if rows:
            means, stds = group_reward_stats([r.reward for r in rows], [r.uid for r in rows],
                                             [r.traj_uid for r in rows])
            while (sum(len(v) for _, v in self.reward_mean_history) > self.baseline_buffer_size
                   and self.reward_mean_history):
                self.reward_mean_history.pop(0)
                self.reward_std_history.pop(0)
            self.reward_mean_history.append((int(global_step), means))
            self.reward_std_history.append((int(global_step), stds))
        admitted = [_stored_copy(r, global_step) for r in rows
                    if r.row_advantage() > self.score_threshold and int(r.extra.get("tool_calls", 1)) >= 1]
        if admitted:
            self.entries.append((int(global_step), admitted))
        return {
            "replay/admitted": float(len(admitted)),
            "replay/rows_seen": float(len(rows)),
            "replay/num_rows": float(self.num_rows()),
            "replay/size": float(self.size()),
        }

    def update(self, rows: Sequence[ReplayRow], global_step: int) -> dict[str, float]:
        """:meth:`remove_old` then :meth:`add_step`: the original's after-update calls."""
        dropped = self.remove_old(global_step)
        metrics = self.add_step(rows, global_step)
        metrics["replay/dropped_stale"] = float(dropped)
        return metrics

    def reset(self) -> None:
        """Empty the stored rows (the baseline history is kept, as the original)."""
        self.entries = []

    def consume(self, generator: Optional[torch.Generator] = None) -> tuple[list[ReplayRow], dict[str, float]]:
        """Turn the whole buffer into one replay batch and empty it (the original's consumption of a
        full buffer, then ``reset_buffer``).

        1. All stored rows, oldest entry first.
        2. P50 mode: ``Ã`` = :func:`recalibrate_advantages` of the stored rewards against
           :meth:`baseline`; rows with ``Ã < 0`` are dropped (``>= 0`` kept; ``> 0`` with
           ``keep_strictly_positive``, SPEAR's math tree); each kept row's
           ``advantages`` become ``Ã · response_mask``. Decay mode: ``advantages · w``, all kept.
           (Under GiGPO too the replay advantage is this scalar; no step term is recomputed.)
        3. ``min(largest power of two <= n, buffer_size)`` rows are drawn uniformly without
           replacement (``torch.randperm`` with ``generator``), kept in buffer order.
        4. The buffer is emptied (:meth:`reset`).

        Returns:
            ``(rows, metrics)``: new :class:`ReplayRow` objects (the stored ones are not
            modified); metrics ``replay/candidates``, ``replay/kept``, ``replay/used`` and, in
            P50 mode, ``replay/baseline_p50``, ``replay/std_p50``, ``replay/mean_p95``,
            ``replay/std_p95``.

        Raises:
            RuntimeError: P50 mode with an empty baseline history (rows cannot exist without
                one when they came through :meth:`add_step`).
        """
        rows = [r for _, entry in self.entries for r in entry]
        metrics: dict[str, float] = {"replay/candidates": float(len(rows))}
        if self.p50_mode and rows:
            base = self.baseline()
            if base is None:
                raise RuntimeError("P50 recalibration needs a baseline history; call add_step first")
            b, s = base
            rewards = torch.tensor([r.reward for r in rows], dtype=torch.float32)
            adv = recalibrate_advantages(rewards, b, s, self.norm_adv_by_std)
            kept = [
                replace(r, advantages=float(a) * r.response_mask.to(torch.float32))
                for r, a in zip(rows, adv.tolist())
                if a > 0 or (a == 0 and not self.keep_strictly_positive)
            ]
            means = [v for _, vals in self.reward_mean_history for v in vals]
            stds = [v for _, vals in self.reward_std_history for v in vals]
            metrics.update({
                "replay/baseline_p50": b,
                "replay/std_p50": s,
                "replay/mean_p95": percentile(means, 95),
                "replay/std_p95": percentile(stds, 95),
            })
        else:
            kept = [replace(r, advantages=r.advantages.to(torch.float32) * self.weight_decay) for r in rows]
        n_used = min(largest_power_of_two_le(len(kept)), self.buffer_size)
        idx = sorted(torch.randperm(len(kept), generator=generator)[:n_used].tolist()) if kept else []
        used = [kept[i] for i in idx]
        metrics["replay/kept"] = float(len(kept))
        metrics["replay/used"] = float(len(used))
        self.reset()
        return used, metrics

    # ---- checkpoint ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain dict (lists, numbers, strings, CPU tensors) for ``torch.save``; loadable with
        ``torch.load(weights_only=True)`` when the rows' ``extra`` is plain too."""
        return {
            "version": 1,
            "entries": [{"step": s, "rows": [r.to_dict() for r in rows]} for s, rows in self.entries],
            "reward_mean_history": [[s, list(v)] for s, v in self.reward_mean_history],
            "reward_std_history": [[s, list(v)] for s, v in self.reward_std_history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore rows and history saved by :meth:`state_dict`; settings (sizes, mode) come from
        the constructor, i.e. from the resumed run's config.

        Raises:
            KeyError: a key is missing; ValueError: unknown version or inconsistent history.
        """
        if state.get("version") != 1:
            raise ValueError(f"unsupported replay buffer state version {state.get('version')!r}")
        entries = [(int(e["step"]), [ReplayRow.from_dict(d) for d in e["rows"]]) for e in state["entries"]]
        means = [(int(s), [float(x) for x in v]) for s, v in state["reward_mean_history"]]
        stds = [(int(s), [float(x) for x in v]) for s, v in state["reward_std_history"]]
        if len(means) != len(stds):
            raise ValueError("reward_mean_history and reward_std_history differ in length")
        self.entries, self.reward_mean_history, self.reward_std_history = entries, means, stds
