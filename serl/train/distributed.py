"""Multi-process (data-parallel) training with Hugging Face accelerate: every distributed concern
of ``serl train`` lives here.

``accelerate launch --multi_gpu --num_processes N -m serl.cli train ...`` (on CPU too: accelerate's
``--multi_gpu`` is its torchrun launcher; ``torchrun --nproc_per_node N -m serl.cli train`` works
the same), or ``serl train trainer.num_processes=N`` (which re-launches itself that way), starts N ranks of the same trainer.
accelerate sets up the process group (gloo on CPU, NCCL on CUDA), wraps the policy in torch's
``DistributedDataParallel`` (``accelerator.prepare``) and gathers Python objects
(``accelerate.utils.gather_object``); serl has no communication code of its own. One process
(no launcher, ``WORLD_SIZE`` unset or 1) never imports accelerate and runs exactly as before.

How an iteration is split (verl-agent dispatches one global batch from a driver to its workers,
``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/ray_trainer.py``; serl has no driver, so every
rank holds the global batch instead):

* **rollout**: every rank draws the *same* ``data.train_batch_size`` tasks (same
  ``TaskSampler`` seed and cursor) and plays its contiguous share of ``train_batch_size / N`` task
  groups in its own env pool (``train_batch_size / N × env.rollout.n`` envs). A group never spans
  ranks. Each rank samples with its own seed (``seed + rank``).
* the groups are then **gathered** to every rank (rank order = task order), so every rank holds
  the global batch: rewards, the Dr.BoT and group-std filters, advantages (GRPO/GiGPO group and
  step-group statistics), SPEAR's replay buffer, SERL's contexts and the metrics of the rollout
  are computed on the whole batch, identically on every rank (the filters' and replay's draws
  come from a generator seeded with ``seed`` on every rank), exactly as one process would.
* the **frozen-model passes** (SERL teacher, KL reference, old log-probs) are sharded: rank
  ``r`` scores rows ``r, r+N, ...`` and the results are gathered.
* **update**: every rank splits the global batch into the same PPO mini-batches and each
  mini-batch into the same micro-batches as one process would; the micro-batches are dealt
  round-robin to the ranks (:func:`deal_micro_batches`). DDP all-reduces the gradients once per
  mini-batch (``no_sync`` on the other micro-steps). See :func:`micro_loss_scale` for why this is
  exact.
* rank 0 alone writes the run folder (lock, ``config.yaml``, metrics, traces, teacher logs,
  checkpoints); the others wait at a barrier around each checkpoint. Update metrics are reduced
  across ranks (:func:`merge_metric_means`).

Departures from one process, by design: the behaviour log-probs of the first PPO mini-batch
come from a scoring pass (one process takes the detached log-probs of its training forward:
the same values up to float rounding); clip-cov's random token choice draws from each rank's own
RNG (its covariance selection is per micro-batch in one process too, so it stays exact);
``actor.use_dynamic_bsz`` is exact as well (the micro-batches are built on the global
mini-batch). Tested: CPU with gloo, 2 processes. CUDA/NCCL: untested.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, Sequence, TypeVar

from serl.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from serl.config import Config
    from serl.train.metrics import MetricMeans

T = TypeVar("T")

#: the trainer-state key of the number of processes a checkpoint was written by
WORLD_SIZE_KEY = "world_size"


def launched_world_size() -> int:
    """The number of processes a launcher (``accelerate launch``, ``torchrun``) started: the
    ``WORLD_SIZE`` environment variable, 1 when unset.

    Raises:
        ConfigError: ``WORLD_SIZE`` is set but not a positive integer.
    """
    raw = os.environ.get("WORLD_SIZE", "1")
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError(f"WORLD_SIZE={raw!r} is not a positive integer; unset it, or start serl with "
                          "`accelerate launch` / `torchrun`, which set it")
    return int(raw)


def check_world_size(cfg: "Config", world_size: int) -> None:
    """Raise :class:`ConfigError` unless ``cfg`` can run on ``world_size`` processes.

    ``data.train_batch_size`` must be divisible by ``world_size`` (each rank plays whole task
    groups); ``trainer.num_processes`` must be 1 (= as launched) or equal ``world_size``.
    """
    n = int(world_size)
    if cfg.trainer.num_processes not in (1, n):
        raise ConfigError(f"trainer.num_processes: {cfg.trainer.num_processes}, but the launcher started {n} "
                          "processes; set it to 1 (= as launched) or to the launcher's --num_processes")
    if cfg.data.train_batch_size % n:
        raise ConfigError(f"data.train_batch_size: {cfg.data.train_batch_size} task groups cannot be split over "
                          f"{n} processes (each rank plays whole groups); make it a multiple of {n}")


def check_checkpoint_world_size(state: dict[str, Any], world_size: int, folder: Any = "") -> None:
    """Raise :class:`CheckpointError` unless the checkpoint ``state`` was written by a run of
    ``world_size`` processes (a checkpoint without the key is a one-process run's).

    A resume must keep N: the per-rank sampling RNG states and each rank's share of the task
    groups depend on it.
    """
    saved = int(state.get(WORLD_SIZE_KEY, 1))
    if saved != int(world_size):
        raise CheckpointError(f"cannot resume {folder}: the checkpoint was written by {saved} process(es) but this "
                              f"run has {world_size}; resume with the same number of processes "
                              f"(accelerate launch --num_processes {saved} ...)")


def micro_loss_scale(micro_rows: int, mini_rows: int, world_size: int) -> float:
    """The factor on one micro-batch's loss so the all-reduced gradient equals one process's.

    One process accumulates ``Σ_k (b_k / B) · ∇ℓ_k`` over the micro-batches ``k`` of a PPO
    mini-batch of ``B`` rows (``b_k`` rows each, ``ℓ_k`` the micro-batch loss aggregated with
    ``actor.loss_agg_mode``; verl's ``loss / gradient_accumulation``,
    ``langfengQ/verl-agent@d0b9724:verl/workers/actor/dp_actor.py``). With N ranks each rank
    runs a subset of the *same* micro-batches, and DDP averages the ranks' gradients (divides
    their sum by N). So each micro-batch loss is scaled by ``b_k / B · N``: the global row count
    ``B`` of the mini-batch as normaliser (never the rank's own rows), times N to undo DDP's
    mean. Since every ``ℓ_k`` is aggregated on the same micro-batch as in one process, every
    ``loss_agg_mode`` (token-mean included) and the covariance selection of clip-cov / kl-cov
    stay exact.

    Args:
        micro_rows: ``b_k`` >= 0; mini_rows: ``B`` >= 1; world_size: N >= 1.

    Raises:
        ValueError: ``mini_rows`` < 1 or ``world_size`` < 1.
    """
    if mini_rows < 1 or world_size < 1:
        raise ValueError(f"mini_rows and world_size must be >= 1, got {mini_rows}, {world_size}")
    return micro_rows / mini_rows * world_size


def deal_micro_batches(micros: Sequence[T], rank: int, world_size: int) -> list[tuple[T, float]]:
    """This rank's micro-batches of one mini-batch, as ``(micro, weight)`` pairs.

    Micro-batch ``k`` goes to rank ``k mod N``. Every rank gets ``⌈K/N⌉`` micro-steps, so all
    ranks run the same number of backward passes (DDP's all-reduce is collective): a rank with
    fewer real micro-batches repeats ``micros[0]`` with weight 0 (its gradient contribution is
    exactly 0). Weight 1 = a real micro-batch.

    Raises:
        ValueError: no micro-batches, or ``rank`` not in ``[0, world_size)``.
    """
    if not micros:
        raise ValueError("no micro-batches to deal")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, {world_size})")
    mine = [(m, 1.0) for m in list(micros)[rank::world_size]]
    steps = -(-len(micros) // world_size)
    return mine + [(micros[0], 0.0)] * (steps - len(mine))


def merge_metric_means(parts: Sequence[tuple[dict[str, float], dict[str, int]]]) -> dict[str, float]:
    """``{key: mean}`` over the ``(sums, counts)`` of every rank's :class:`MetricMeans`: each key's
    sums and counts are added before dividing (a mean weighted by how often each rank saw it).
    Keys keep first-seen order."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for s, c in parts:
        for k, v in s.items():
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + int(c[k])
    return {k: sums[k] / counts[k] for k in sums}


class Distributed:
    """The process group of one training run: this rank, N, and accelerate's collectives.

    ``Distributed()`` (no accelerator) is the one-process run: every method is then the identity
    or a no-op, so the trainer has one code path.

    Attributes:
        accelerator: the ``accelerate.Accelerator``; None with one process.
        world_size: N; rank: this process's index (0 = the main process, which writes).
    """

    def __init__(self, accelerator: Any = None):
        self.accelerator = accelerator
        self.world_size = int(accelerator.num_processes) if accelerator is not None else 1
        self.rank = int(accelerator.process_index) if accelerator is not None else 0

    @classmethod
    def setup(cls, cfg: "Config", device: str) -> "Distributed":
        """The run's process group: accelerate's (gloo on CPU) when a launcher started more than one
        process, else the one-process :class:`Distributed`. Raises :class:`ConfigError` (see
        :func:`check_world_size`) before any collective starts."""
        n = launched_world_size()
        check_world_size(cfg, n)
        if n == 1:
            return cls()
        from accelerate import Accelerator

        return cls(Accelerator(cpu=str(device) == "cpu"))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of ``items`` (``len(items)`` divisible by N)."""
        k = len(items) // self.world_size
        if k * self.world_size != len(items):
            raise ValueError(f"{len(items)} items cannot be split over {self.world_size} ranks")
        return list(items[self.rank * k : (self.rank + 1) * k])

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's ``items`` concatenated in rank order, on every rank (pickled; CPU objects)."""
        if not self.enabled:
            return items
        from accelerate.utils import gather_object

        return list(gather_object(list(items)))

    def gather_one(self, item: T) -> list[T]:
        """``[item of rank 0, item of rank 1, ...]`` on every rank."""
        return self.gather([item])

    def barrier(self) -> None:
        """Wait until every rank gets here (no-op with one process)."""
        if self.enabled:
            self.accelerator.wait_for_everyone()

    def prepare(self, model, optimizer) -> tuple[Any, Any]:
        """``accelerator.prepare``: the model wrapped for training (DDP) and the optimizer; with one
        process both unchanged. The wrapped model shares the parameters of ``model``."""
        if not self.enabled:
            return model, optimizer
        return self.accelerator.prepare(model, optimizer)

    def sync_context(self, model, sync: bool) -> ContextManager:
        """``accelerator.no_sync(model)`` unless ``sync`` (the last micro-step of a mini-batch, whose
        backward all-reduces the accumulated gradients)."""
        if not self.enabled or sync:
            return nullcontext()
        return self.accelerator.no_sync(model)

    def backward(self, loss) -> None:
        """``accelerator.backward(loss)`` (plain ``loss.backward()`` with one process)."""
        if self.enabled:
            self.accelerator.backward(loss)
        else:
            loss.backward()

    def reduce_means(self, means: "MetricMeans") -> dict[str, float]:
        """The update metrics averaged over all ranks' micro-steps (:func:`merge_metric_means`)."""
        if not self.enabled:
            return means.result()
        return merge_metric_means(self.gather_one(means.parts()))

    def sharded_map(self, fn: Callable[[list[int]], list[T]], n: int) -> list[T]:
        """``fn`` over the positions ``0..n-1`` split round-robin over the ranks (rank ``r`` gets
        ``r, r+N, ...``), results gathered back into position order on every rank."""
        if not self.enabled:
            return fn(list(range(n)))
        mine = list(range(self.rank, n, self.world_size))
        got = self.gather_one((mine, fn(mine) if mine else []))
        out: list[Optional[T]] = [None] * n
        for idx, vals in got:
            for i, v in zip(idx, vals):
                out[i] = v
        return out  # type: ignore[return-value]
