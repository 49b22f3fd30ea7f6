"""Evaluation of a policy on a task split: :func:`evaluate_policy` (``serl eval``, and
``trainer.test_freq`` during training), and the fixed panel :func:`eval_subset`."""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

from serl.config import Config
from serl.envs.base import Task, get_env_class
from serl.errors import ConfigError
from serl.rollout.engine import SamplingParams, release_engine_cache
from serl.train import env_pool
from serl.train.metrics import success_by_type
from serl.train.sample_metrics import aggregate_sample_metrics
from serl.trajectory import Trajectory


def eval_subset(tasks: list[Task], num_tasks: Optional[int]) -> list[Task]:
    """The first ``num_tasks`` tasks in round-robin order over task types (each type's tasks in
    listing order), so a small panel covers every type; ``None`` or ``< 0`` = all tasks, in
    listing order. Deterministic: the same panel every call."""
    if num_tasks is None or num_tasks < 0 or num_tasks >= len(tasks):
        return list(tasks)
    by_type: dict[str, list[Task]] = {}
    for t in tasks:
        by_type.setdefault(t.task_type, []).append(t)
    queues = [list(v) for _, v in sorted(by_type.items())]
    out: list[Task] = []
    while len(out) < num_tasks:
        for q in queues:
            if q and len(out) < num_tasks:
                out.append(q.pop(0))
    return out


def eval_tasks(cfg: Config, split: str, num_tasks: int = -1, shard: tuple[int, int] = (0, 1)) -> list[Task]:
    """The tasks an evaluation plays: :func:`eval_subset` of ``split``'s tasks, then shard ``i`` of
    ``k`` keeps its tasks ``i, i + k, ...`` (``serl eval --shard i/k``).

    Raises:
        ConfigError: the shard holds no task (fewer tasks than shards).
    """
    tasks = eval_subset(env_pool.list_tasks(cfg, split), num_tasks)[shard[0]::shard[1]]
    if not tasks:
        raise ConfigError(f"--shard {shard[0]}/{shard[1]}: the {split!r} evaluation has fewer tasks than shards, "
                          f"so this shard holds none; use fewer shards or more --num-tasks")
    return tasks


def eval_sampling(cfg: Config, greedy: bool = False, seed: Optional[int] = None) -> SamplingParams:
    """Evaluation sampling: ``rollout.val_temperature`` and ``val_top_p`` (sampled when
    ``rollout.val_do_sample``, else greedy), or greedy; seeded with ``seed``."""
    r = cfg.rollout
    return SamplingParams(max_new_tokens=cfg.data.max_response_length, temperature=r.val_temperature,
                          top_p=r.top_p if r.val_top_p is None else r.val_top_p, top_k=r.top_k, do_sample=r.val_do_sample and not greedy, seed=seed)


def evaluate_policy(cfg: Config, engine, tokenizer, split: str, num_tasks: int = -1, greedy: bool = False,
                    seed: Optional[int] = 0, progress: bool = True, done: Sequence[Trajectory] = (),
                    on_chunk: Optional[Callable[[list[Trajectory]], None]] = None,
                    shard: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Success rate overall and per task type on ``split``: ``rollout.val_n`` episodes per task
    when sampling (one when ``greedy``).

    ``num_tasks >= 0`` evaluates a fixed subset taken round-robin over task types
    (:func:`eval_subset`); ``shard = (i, k)`` keeps its tasks ``i, i + k, ...`` (``serl eval
    --shard i/k``: k processes evaluate the subset together). Tasks are played in chunks of about ``rollout.micro_batch_size`` envs.
    Sampling is greedy or seeded (``seed`` reseeds torch before each chunk), so a run is
    reproducible. Returns ``{"metrics": {success_rate, <type>_success_rate, ...},
    "trajectories": [...]}`` (task order, a task's ``val_n`` episodes together); with
    ``val_n > 1`` the metrics also hold verl's ``acc/mean@n``, ``acc/best@k/*``, ``acc/maj@k/*``
    and ``acc/pass@k`` (:func:`serl.train.sample_metrics.aggregate_sample_metrics`).

    Resuming (``serl eval`` keeps a journal of finished chunks): ``done`` holds a stopped
    evaluation's trajectories of its first whole chunks, in order; their tasks are not played
    again, and every later chunk holds the same tasks and seed as it would have, so a resumed
    evaluation plays what an unstopped one plays. ``on_chunk`` gets each newly played chunk's
    trajectories as soon as the chunk ends.

    Raises:
        ConfigError: ``shard`` holds no task.
        ValueError: ``done`` is not whole chunks of this evaluation's first tasks (another split,
            ``num_tasks``, ``rollout.micro_batch_size`` or ``rollout.val_n``).
    """
    tasks = eval_tasks(cfg, split, num_tasks, shard)
    n = 1 if greedy else cfg.rollout.val_n
    chunk = max(1, min(cfg.rollout.micro_batch_size // n, len(tasks)))
    played = _finished_tasks(tasks, done, chunk, n)
    trajs: list[Trajectory] = list(done)
    if played < len(tasks):
        trajs += _play_chunks(cfg, engine, tokenizer, split, tasks[played:], chunk, n, played, greedy, seed,
                              progress, on_chunk)
    return {"metrics": eval_metrics(cfg.env.name, trajs, n), "trajectories": trajs}


def _finished_tasks(tasks: list[Task], done: Sequence[Trajectory], chunk: int, n: int) -> int:
    """How many of ``tasks`` the finished trajectories ``done`` played (``n`` each, whole chunks of
    ``chunk`` tasks from the start); raises ``ValueError`` when they are not that."""
    played = len(done) // n
    if len(done) % n or played > len(tasks) or (played % chunk and played != len(tasks)) or \
            [t.task.task_id for t in done] != [t.task_id for t in tasks[:played] for _ in range(n)]:
        raise ValueError(f"the {len(done)} finished trajectories are not whole chunks of {chunk} tasks × {n} "
                         f"episodes from the start of this evaluation's {len(tasks)} tasks")
    return played


def _play_chunks(cfg: Config, engine, tokenizer, split: str, tasks: list[Task], chunk: int, n: int, first: int,
                 greedy: bool, seed: Optional[int], progress: bool,
                 on_chunk: Optional[Callable[[list[Trajectory]], None]]) -> list[Trajectory]:
    """Play ``tasks`` (the evaluation's tasks from index ``first`` on) in chunks of ``chunk`` envs ×
    ``n`` episodes, seeding each chunk with ``seed`` + its first task's index; see
    :func:`evaluate_policy`."""
    from tqdm.auto import tqdm

    trajs: list[Trajectory] = []
    pool = env_pool.make_pool(cfg, chunk * n)
    try:
        collector = env_pool.rollout_loop(cfg, pool, engine, tokenizer)
        with tqdm(total=first + len(tasks), initial=first, desc=f"serl eval {split}", unit="task",
                  disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
            for i in range(0, len(tasks), chunk):
                part = tasks[i : i + chunk]
                padded = part + [part[-1]] * (chunk - len(part))  # the pool has a fixed size

                def step_progress(step, active, _bar=bar):
                    _bar.set_postfix_str(f"turn {step}, {active} active")

                params = eval_sampling(cfg, greedy, None if seed is None else seed + first + i)
                groups = collector.collect(padded, n, params, step_progress)
                new = [t for g in groups[: len(part)] for t in g.trajectories]
                trajs.extend(new)
                if on_chunk is not None:
                    on_chunk(new)
                bar.update(len(part))
    finally:
        pool.close()
        release_engine_cache(engine)
    return trajs


def eval_metrics(env_name: str, trajs: list[Trajectory], n: int = 1) -> dict[str, float]:
    """Success rate (over all episodes: mean@n), valid and admissible action ratios, per-type
    success and the env's own episode metrics (environment ``env_name``) of the evaluation episodes ``trajs``; with ``n > 1``
    episodes per task (consecutive in ``trajs``), the sample metrics of
    :func:`~serl.train.sample_metrics.aggregate_sample_metrics`, a sample's answer being its last
    step's ``info["pred"]`` (the math env's extracted answer; None elsewhere, and then no ``maj@k``,
    which would read 0 for want of answers)."""
    steps = [s for t in trajs for s in t.steps]
    metrics = {"success_rate": sum(t.won for t in trajs) / max(1, len(trajs)), "num_tasks": len(trajs) // n,
               "valid_action_ratio": sum(s.action_valid for s in steps) / max(1, len(steps)),
               "admissible_action_ratio": sum(s.action in s.admissible_actions for s in steps) / max(1, len(steps))}
    metrics.update({f"{k}_success_rate": v for k, v in success_by_type(trajs).items()})
    metrics.update(get_env_class(env_name).episode_metrics(trajs))
    if n > 1 and trajs:
        records = [(trajs[i].task.task_id, trajs[i].task.task_type,
                    [(t.won, t.steps[-1].info.get("pred") if t.steps else None) for t in trajs[i : i + n]])
                   for i in range(0, len(trajs), n)]
        agg = aggregate_sample_metrics(records)
        if all(pred is None for _, _, samples in records for _, pred in samples):  # no answers to vote on
            agg = {k: v for k, v in agg.items() if "/maj@" not in k}  # (ALFWorld, WebShop): no maj@k
        metrics.update(agg)
    return metrics


def merge_shards(parts: Sequence[tuple[dict[str, Any], list[Trajectory]]]) -> tuple[dict[str, Any], list[Trajectory]]:
    """One evaluation from its parts played by ``serl eval --shard I/N`` (``serl eval --merge``).

    Args:
        parts: per part, in any order, its ``metrics.json`` (``shard`` ``"I/N"``, ``split``,
            ``mode``, ``model``, ``num_tasks``, ``adapter`` if one was merged) and its trajectories
            as written (task order, a task's episodes together).

    Returns:
        ``({"split", "mode", "model"[, "adapter"], "shards": N}, trajectories)``: the trajectories
        in the whole evaluation's task order (its task ``j`` is part ``j mod N``'s task
        ``j div N``, as :func:`eval_tasks` deals them), for :func:`eval_metrics`.

    Raises:
        ConfigError: a part that is not a shard; parts of different evaluations (split, decoding,
            model, adapter or N differ, or task counts that one evaluation's shards cannot have);
            a shard missing or given twice; a part whose trajectories are not ``num_tasks`` tasks
            with the same number of episodes each.
    """
    keys = ("split", "mode", "model", "adapter")
    if not parts:
        raise ConfigError("serl eval --merge: no parts given")
    first, by_shard, n = parts[0][0], {}, None
    for meta, trajs in parts:
        diff = [key for key in keys if meta.get(key) != first.get(key)]
        if diff:
            raise ConfigError(f"serl eval --merge: the parts are not one evaluation ({', '.join(diff)} differ)")
        i, k, groups = _shard_groups(meta, trajs, n)
        if i in by_shard:
            raise ConfigError(f"serl eval --merge: shard {i}/{k} is given twice")
        by_shard[i], n = (k, groups), len(groups[0])
    total = by_shard[next(iter(by_shard))][0]
    if any(k != total for k, _ in by_shard.values()):
        raise ConfigError("serl eval --merge: the parts are not one evaluation (N differ)")
    missing = sorted(set(range(total)) - set(by_shard))
    if missing:
        raise ConfigError(f"serl eval --merge: shards {', '.join(f'{i}/{total}' for i in missing)} are missing")
    tasks = sum(len(g) for _, g in by_shard.values())
    if any(len(by_shard[i][1]) != len(range(i, tasks, total)) for i in range(total)):
        raise ConfigError(f"serl eval --merge: the parts' task counts ({[len(by_shard[i][1]) for i in range(total)]}) "
                          f"are not {total} shards of one {tasks}-task evaluation")
    order = [by_shard[j % total][1][j // total] for j in range(tasks)]
    return {**{key: first[key] for key in keys if key in first}, "shards": total}, [t for g in order for t in g]


def _shard_groups(meta: dict[str, Any], trajs: list[Trajectory], n: Optional[int]) -> tuple[int, int, list]:
    """``(I, N, per-task groups of episodes)`` of one ``serl eval --shard I/N`` part; ``n``: the
    episodes per task of the parts before (None for the first). Raises ConfigError (see
    :func:`merge_shards`)."""
    if "shard" not in meta:
        raise ConfigError(f"serl eval --merge: a part played the whole {meta.get('split')!r} evaluation, not a "
                          "shard (its metrics.json has no 'shard')")
    try:
        i, k = (int(x) for x in str(meta["shard"]).split("/"))
        tasks = int(meta["num_tasks"])
    except (KeyError, TypeError, ValueError) as e:  # a hand-edited or cut metrics.json
        raise ConfigError(f"serl eval --merge: a part's metrics.json has no readable shard 'I/N' and num_tasks "
                          f"({meta.get('shard')!r}, {meta.get('num_tasks')!r}); re-run that part") from e
    per = len(trajs) // max(1, tasks)
    groups = [trajs[j * per:(j + 1) * per] for j in range(tasks)]
    if tasks == 0 or per * tasks != len(trajs) or (n is not None and per != n) or \
            any(len({t.task.task_id for t in g}) != 1 for g in groups):
        raise ConfigError(f"serl eval --merge: shard {i}/{k}'s {len(trajs)} trajectories are not its {tasks} "
                          f"tasks with {n or per} episodes each")
    return i, k, groups
