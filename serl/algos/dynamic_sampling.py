"""Dynamic sampling (DAPO, arXiv 2503.14476, Sec. 3.2): keep sampling groups until the batch holds
enough groups whose episodes differ, so that every group in the update carries a non-zero
group-relative advantage.

A group whose ``G`` episodes all score the same (all won, or all lost) has advantage 0 under GRPO,
so it costs a rollout and an update and teaches nothing. verl-agent's ``algorithm.filter_groups``
(``langfengQ/verl-agent``: ``agent_system/multi_turn_rollout/rollout_loop.py``,
``dynamic_multi_turn_loop`` and ``utils.filter_group_data``) plays a batch of
``data.train_batch_size`` tasks, drops the groups whose episode rewards are all identical, and plays
another batch until ``train_batch_size × env.rollout.n`` episodes are kept or
``max_num_gen_batches`` batches were played; the last batch is kept whole (unfiltered), and the
kept groups are not trimmed, so an update can hold more than ``train_batch_size`` groups.

Here (:func:`dynamic_sampling`), as there, with two switches:

* ``metric`` names what must differ within a group (:data:`FILTER_METRICS`): ``episode_reward``
  (verl-agent's) or ``won`` (DAPO's accuracy metric ``acc``);
* ``trim``: keep only the first ``train_batch_size`` groups, as verl's DAPO recipe does
  (``batch[:traj_bsz]``), so every update has the same size; verl-agent keeps them all (default).

Departures, both documented: each extra batch plays *new* tasks (verl-agent re-plays its batch of
prompts, whose ALFWorld resets draw new games anyway; DAPO draws the next prompts); and a group of
one episode is kept (DAPO's ``len(vals) == 1``; verl-agent would drop every such group, so
:mod:`serl.config` refuses ``env.rollout.n < 2`` with this switch on instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from serl.errors import ConfigError
from serl.trajectory import Group, Trajectory

#: metric name -> the per-episode value that must vary within a kept group
FILTER_METRICS: dict[str, Callable[[Trajectory], float]] = {
    "episode_reward": lambda t: float(t.episode_reward),
    "won": lambda t: float(t.won),
}


def check_config(metric: str) -> None:
    """Raises :class:`ConfigError` naming ``algorithm.filter_groups.metric`` when it is unknown."""
    if metric not in FILTER_METRICS:
        raise ConfigError(f"algorithm.filter_groups.metric: unknown metric {metric!r}; valid: {sorted(FILTER_METRICS)}")


def group_has_signal(values: list[float]) -> bool:
    """True when a group's per-episode ``values`` are not all identical, or it has one episode.

    Exact comparison, as verl-agent's ``np.all(group_rewards == group_rewards[0])`` (DAPO's
    ``np.std(vals) > 0`` is the same test).
    """
    return len(values) <= 1 or any(v != values[0] for v in values[1:])


def filter_groups(groups: list[Group], metric: str = "episode_reward") -> tuple[list[Group], list[Group]]:
    """Split ``groups`` into ``(kept, dropped)``: kept are those whose episodes differ in
    ``metric`` (:func:`group_has_signal`); both keep the input order.

    Raises:
        ConfigError: unknown ``metric``.
    """
    check_config(metric)
    value = FILTER_METRICS[metric]
    kept, dropped = [], []
    for g in groups:
        (kept if group_has_signal([value(t) for t in g.trajectories]) else dropped).append(g)
    return kept, dropped


@dataclass
class DynamicSamplingStats:
    """What one :func:`dynamic_sampling` call did (logged as ``filter_groups/*``)."""

    #: batches played (1 .. max_num_gen_batches)
    num_gen_batches: int = 0
    #: groups dropped for having no spread in the metric
    dropped_groups: int = 0
    #: groups with spread that the trim left out
    trimmed_groups: int = 0
    #: 1 when the cap was reached: the last batch went in unfiltered
    capped: int = 0
    #: groups without spread that the unfiltered last batch let in
    unfiltered_groups: int = 0

    def as_metrics(self, kept: int) -> dict[str, float]:
        """``filter_groups/*`` metrics, with ``kept`` the groups handed to the update."""
        return {"filter_groups/num_gen_batches": float(self.num_gen_batches),
                "filter_groups/kept_groups": float(kept),
                "filter_groups/dropped_groups": float(self.dropped_groups),
                "filter_groups/trimmed_groups": float(self.trimmed_groups),
                "filter_groups/capped": float(self.capped),
                "filter_groups/unfiltered_groups": float(self.unfiltered_groups)}


def dynamic_sampling(play_batch: Callable[[int], list[Group]], target_groups: int, max_num_gen_batches: int,
                     metric: str = "episode_reward", trim: bool = False) -> tuple[list[Group], DynamicSamplingStats]:
    """Play batches until ``target_groups`` groups with spread are kept (verl-agent's
    ``dynamic_multi_turn_loop``, see the module docstring).

    Args:
        play_batch: plays one batch of ``target_groups`` new tasks; called with the 1-based batch
            number, returns their groups.
        target_groups: groups the update wants (``data.train_batch_size``).
        max_num_gen_batches: the cap on batches; the batch that reaches it is kept whole (its
            groups without spread too), so the update is never empty.
        metric: a key of :data:`FILTER_METRICS`.
        trim: keep only the first ``target_groups`` groups (verl's DAPO recipe); else all kept.

    Returns:
        ``(groups, stats)``: the kept groups in play order.

    Raises:
        ConfigError: ``target_groups`` or ``max_num_gen_batches`` < 1, or an unknown ``metric``.
    """
    check_config(metric)
    if target_groups < 1 or max_num_gen_batches < 1:
        raise ConfigError(f"dynamic sampling needs target_groups >= 1 and algorithm.filter_groups.max_num_gen_batches "
                          f">= 1, got {target_groups} and {max_num_gen_batches}")
    stats = DynamicSamplingStats()
    kept: list[Group] = []
    while len(kept) < target_groups and stats.num_gen_batches < max_num_gen_batches:
        stats.num_gen_batches += 1
        groups = play_batch(stats.num_gen_batches)
        good, bad = filter_groups(groups, metric)
        if stats.num_gen_batches == max_num_gen_batches:  # the last try goes in whole
            stats.capped, stats.unfiltered_groups = 1, len(bad)
            kept += groups
        else:
            stats.dropped_groups += len(bad)
            kept += good
    if trim and len(kept) > target_groups:
        stats.trimmed_groups = len(kept) - target_groups
        kept = kept[:target_groups]
    return kept, stats
