"""The rollout phase of an iteration: :class:`TrainRollout` plays ``env.rollout.n`` episodes of
the iteration's tasks and prefetches the next iteration's env resets.

The turn loop itself (prompts, sampling, parsing, env steps) is the env's rollout loop
(:func:`serl.train.env_pool.rollout_loop`: :class:`serl.rollout.collector.Collector` for step rows,
:class:`serl.rollout.tool_loop.ToolAgentLoop` for the math env); the env pool is
:mod:`serl.train.env_pool`.
"""

from __future__ import annotations

from serl.algos.dynamic_sampling import dynamic_sampling
from serl.config import Config
from serl.rollout.engine import SamplingParams, engine_metrics, release_engine_cache
from serl.train import env_pool
from serl.train.distributed import Distributed
from serl.train.state import TrainState
from serl.trajectory import Group


def train_sampling(cfg: Config) -> SamplingParams:
    """Training sampling: ``rollout.temperature`` / ``top_p`` / ``top_k``, always sampled."""
    r = cfg.rollout
    return SamplingParams(max_new_tokens=cfg.data.max_response_length, temperature=r.temperature,
                          top_p=r.top_p, top_k=r.top_k, do_sample=True)


class TrainRollout:
    """Owns the training env pool (created on first use, ``train_batch_size // N × env.rollout.n``
    envs on this rank) and plays each iteration's groups.

    Args:
        cfg: the run's config.
        dist: the process group (N > 1: each rank plays its share of the groups).
    """

    def __init__(self, cfg: Config, dist: Distributed):
        self.cfg, self.dist = cfg, dist
        self.num_envs = cfg.data.train_batch_size // dist.world_size * cfg.env.rollout.n  # this rank's envs
        self.pool = None
        #: the last ``collect``'s loop metrics (``rollout/*``, and ``tool/*`` for tool use)
        self.last_metrics: dict[str, float] = {}

    def collector(self, pool, engine, tokenizer):
        """The env's rollout loop (:func:`serl.train.env_pool.rollout_loop`)."""
        return env_pool.rollout_loop(self.cfg, pool, engine, tokenizer)

    def collect(self, state: TrainState, engine, tokenizer, pbar=None) -> list[Group]:
        """Play ``env.rollout.n`` episodes of ``data.train_batch_size`` tasks; returns the groups
        (every rank holds all of them). With ``algorithm.filter_groups.enable``, plays more batches
        of new tasks until enough groups have spread (:func:`serl.algos.dynamic_sampling.dynamic_sampling`;
        ``filter_groups/*`` metrics; the ``rollout/*`` loop metrics are the last batch's).

        Then, unless this is the last iteration, draws the next iteration's tasks and starts their
        env resets in the workers, to run while this update trains (ALFWorld's reset re-translates
        the PDDL: ~0.85 s of CPU per env).
        """
        c, fg = self.cfg, self.cfg.algorithm.filter_groups
        if self.pool is None:
            self.pool = env_pool.make_pool(c, self.num_envs)
        prefetched = state.pending_tasks is not None
        loop = self.collector(self.pool, engine, tokenizer)
        engine_metrics(engine)  # zero the engine's counters: an evaluation may have run since the last rollout

        def play_batch(k: int) -> list[Group]:
            tasks = state.draw_tasks(c.data.train_batch_size)  # batch 1: the prefetched tasks, if any
            reset_results = self.pool.reset_wait() if prefetched and k == 1 else None

            def progress(step, active):
                if pbar is not None:
                    pbar.set_postfix_str(f"rollout{f' batch {k}' if k > 1 else ''} turn {step}, {active} active")

            # N > 1: this rank plays its share of the groups; then every rank holds all of them
            groups = loop.collect(self.dist.share(tasks), c.env.rollout.n, train_sampling(c), progress,
                                  reset_results=reset_results)
            return self.dist.gather(groups)

        stats = None
        try:
            if fg.enable:
                groups, stats = dynamic_sampling(play_batch, c.data.train_batch_size, fg.max_num_gen_batches,
                                                 fg.metric, fg.trim)
            else:
                groups = play_batch(1)
        finally:
            release_engine_cache(engine)  # the hf engine's turn cache is not needed in the update
        self.last_metrics = {**loop.last_metrics, **engine_metrics(engine),
                             **(stats.as_metrics(len(groups)) if stats else {})}
        if state.iteration + 1 < c.trainer.total_training_steps:
            nxt = state.prefetch_tasks(c.data.train_batch_size)
            self.pool.reset_async([t for t in self.dist.share(nxt) for _ in range(c.env.rollout.n)])
        return groups

    def close(self) -> None:
        """Stop the env workers."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
