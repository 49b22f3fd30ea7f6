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

**FSDP** (``trainer.strategy=fsdp``): the policy's parameters, gradients and AdamW moments are
sharded over the ranks with torch's FSDP2 ``fully_shard`` (one unit per decoder layer plus the
root; the PyTorch FSDP paper, arXiv 2304.11277). accelerate's ``FullyShardedDataParallelPlugin``
is not used: accelerate 1.15 honours it only on GPU launches (with ``Accelerator(cpu=True)`` the
run stays ``MULTI_CPU``, i.e. DDP), so it could not be tested here; accelerate still starts the
process group and gathers objects, and ``fully_shard`` is applied by :meth:`Distributed.prepare`.
A sharded forward is a collective call (it all-gathers each unit's parameters), so everything
that runs per rank on different data holds *full* parameters instead: the rollout model is an
unsharded copy (re-filled from the gathered parameters after each update,
:meth:`Distributed.full_parameters`), SERL's teacher and the KL reference are unsharded copies
as with DDP, and the old-log-prob pass (the one scoring pass of the sharded policy) runs on all
rows on every rank (:meth:`Distributed.sharded_map`). Checkpoints hold the full model and the
full optimizer state in the one-process format, gathered to rank 0
(:meth:`Distributed.checkpoint_state`) and loaded back into the shards on resume
(:meth:`Distributed.checkpoint_loaders`). The update's loss scale is DDP's (FSDP's
reduce-scatter also averages over the ranks), and every rank runs the same number of
forward/backward calls (:func:`deal_micro_batches` pads). Not supported: FSDP with LoRA.

Departures from one process, by design: the behaviour log-probs of the first PPO mini-batch
come from a scoring pass (one process takes the detached log-probs of its training forward:
the same values up to float rounding); clip-cov's random token choice draws from each rank's own
RNG (its covariance selection is per micro-batch in one process too, so it stays exact);
``actor.use_dynamic_bsz`` is exact as well (the micro-batches are built on the global
mini-batch). Tested (DDP and FSDP): CPU with gloo, 2 processes, the tiny model. CUDA/NCCL: untested.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Optional, Sequence, TypeVar

from serl.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from serl.config import Config
    from serl.train.metrics import MetricMeans

T = TypeVar("T")

log = logging.getLogger(__name__)

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


def launched_rank() -> int:
    """This process's rank among those a launcher started: the ``RANK`` environment variable,
    0 when unset (a single process, or the launcher's own process before it spawns ranks).

    Raises:
        ConfigError: ``RANK`` is set but not a non-negative integer.
    """
    raw = os.environ.get("RANK", "0")
    if not raw.strip().isdigit():
        raise ConfigError(f"RANK={raw!r} is not a non-negative integer; unset it, or start serl with "
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


def micro_loss_scale(micro_rows: float, mini_rows: float, world_size: int) -> float:
    """The factor on one micro-batch's loss so the all-reduced gradient equals one process's.

    One process accumulates ``Σ_k (b_k / B) · ∇ℓ_k`` over the micro-batches ``k`` of a PPO
    mini-batch of ``B`` rows (``b_k`` rows each, ``ℓ_k`` the micro-batch loss aggregated with
    ``actor.loss_agg_mode``; verl's ``loss / gradient_accumulation``,
    ``langfengQ/verl-agent@d0b9724:verl/workers/actor/dp_actor.py``). With N ranks each rank
    runs a subset of the *same* micro-batches, and DDP averages the ranks' gradients (divides
    their sum by N; FSDP's reduce-scatter does the same, torch's default gradient divide factor). So each micro-batch loss is scaled by ``b_k / B · N``: the global row count
    ``B`` of the mini-batch as normaliser (never the rank's own rows), times N to undo DDP's
    mean. Since every ``ℓ_k`` is aggregated on the same micro-batch as in one process, every
    ``loss_agg_mode`` (token-mean included) and the covariance selection of clip-cov / kl-cov
    stay exact. With ``actor.token_mean_scope=mini_batch`` and ``token-mean`` the counts are
    loss tokens instead of rows (``T_k / T · Σ m·l / T_k = Σ m·l / T``: the token-mean of the
    whole mini-batch, current verl's ``global_batch_info``, verl-project/verl#5366).

    Args:
        micro_rows: ``b_k`` >= 0 (rows, or loss tokens); mini_rows: ``B`` >= 1; world_size: N >= 1.

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
    exactly 0). Weight 1 = a real micro-batch. FSDP needs this as much as DDP: each sharded
    forward and backward is a collective (all-gather, reduce-scatter).

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


def merge_metric_means(parts: Sequence[tuple[dict[str, float], dict[str, float]]]) -> dict[str, float]:
    """``{key: mean}`` over the ``(sums, counts)`` of every rank's :class:`MetricMeans`: each key's
    sums and counts (weights) are added before dividing (a mean weighted by how often, or how
    heavily, each rank saw it). Keys keep first-seen order."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for s, c in parts:
        for k, v in s.items():
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0.0) + float(c[k])
    return {k: sums[k] / counts[k] for k in sums}


class Distributed:
    """The process group of one training run: this rank, N, accelerate's collectives, and the
    strategy of the update (``ddp`` or ``fsdp``, see the module docstring).

    ``Distributed()`` (no accelerator) is the one-process run: every method is then the identity
    or a no-op, so the trainer has one code path.

    Attributes:
        accelerator: the ``accelerate.Accelerator``; None with one process.
        world_size: N; rank: this process's index (0 = the main process, which writes).
        strategy: ``ddp`` or ``fsdp`` (``trainer.strategy``; ``ddp`` with one process).
    """

    def __init__(self, accelerator: Any = None, strategy: str = "ddp"):
        self.accelerator = accelerator
        self.world_size = int(accelerator.num_processes) if accelerator is not None else 1
        self.rank = int(accelerator.process_index) if accelerator is not None else 0
        self.strategy = strategy if self.world_size > 1 else "ddp"
        self._device = "cpu"

    @classmethod
    def setup(cls, cfg: "Config", device: str) -> "Distributed":
        """The run's process group: accelerate's (gloo on CPU) when a launcher started more than one
        process, else the one-process :class:`Distributed` (``trainer.strategy=fsdp`` with one
        process is then a plain one-process run, with a warning: there is nothing to shard).
        Raises :class:`ConfigError` (see :func:`check_world_size`) before any collective starts."""
        n = launched_world_size()
        check_world_size(cfg, n)
        if n == 1:
            if cfg.trainer.strategy == "fsdp":
                log.warning("trainer.strategy=fsdp with one process: nothing to shard, training runs as one "
                            "process (start N > 1 processes with accelerate launch / trainer.num_processes)")
            return cls()
        from accelerate import Accelerator

        dist = cls(Accelerator(cpu=str(device) == "cpu"), strategy=cfg.trainer.strategy)
        dist._device = "cpu" if str(device) == "cpu" else str(device).split(":")[0]
        return dist

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """True when the policy's parameters are sharded over the ranks (FSDP, N > 1)."""
        return self.enabled and self.strategy == "fsdp"

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
        """The model as the update trains it, and its optimizer. One process: both unchanged.
        DDP: ``accelerator.prepare`` (the wrapped model shares the parameters of ``model``).
        FSDP: ``model`` is sharded in place (:func:`shard_model`) and the optimizer's parameter
        groups point at the sharded parameters instead (``optimizer`` must have no state yet).

        Raises:
            ValueError: FSDP and ``optimizer`` already has state.
        """
        if not self.enabled:
            return model, optimizer
        if not self.sharded:
            return self.accelerator.prepare(model, optimizer)
        if optimizer.state:
            raise ValueError("FSDP: prepare the optimizer before its first step")
        names = {id(p): k for k, p in model.named_parameters()}
        shard_model(model, self._device, self.world_size)
        sharded = dict(model.named_parameters())
        for group in optimizer.param_groups:  # the same optimizer, on the sharded parameters
            group["params"] = [sharded[names[id(p)]] for p in group["params"]]
        return model, optimizer

    def sync_context(self, model, sync: bool) -> ContextManager:
        """No gradient communication unless ``sync`` (the last micro-step of a mini-batch, whose
        backward all-reduces, or with FSDP reduce-scatters, the accumulated gradients): DDP's
        ``accelerator.no_sync(model)``, FSDP2's ``set_requires_gradient_sync(False)``."""
        if not self.enabled or sync:
            return nullcontext()
        if self.sharded:
            return _no_gradient_sync(model)
        return self.accelerator.no_sync(model)

    def backward(self, loss) -> None:
        """``accelerator.backward(loss)`` (plain ``loss.backward()`` with one process)."""
        if self.enabled:
            self.accelerator.backward(loss)
        else:
            loss.backward()

    def clip_grad_norm(self, parameters, max_norm: float):
        """``torch.nn.utils.clip_grad_norm_``; returns the total norm before clipping as a plain
        0-dim tensor (with FSDP the norm of the sharded gradients is reduced over the ranks, so
        it is the full gradient's norm, as with one process)."""
        import torch

        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def reduce_means(self, means: "MetricMeans") -> dict[str, float]:
        """The update metrics averaged over all ranks' micro-steps (:func:`merge_metric_means`)."""
        if not self.enabled:
            return means.result()
        return merge_metric_means(self.gather_one(means.parts()))

    def sharded_map(self, fn: Callable[[list[int]], list[T]], n: int, model: Any = None) -> list[T]:
        """``fn`` over the positions ``0..n-1`` split round-robin over the ranks (rank ``r`` gets
        ``r, r+N, ...``), results gathered back into position order on every rank.

        ``model``: the module ``fn`` runs. If it is FSDP-sharded (its forward is a collective,
        and ranks with different rows would make different numbers of calls and deadlock),
        every rank runs ``fn`` on all positions instead (the same calls everywhere; the pass
        costs each rank what it costs one process), then reshards the model's parameters."""
        if not self.enabled:
            return fn(list(range(n)))
        if self.sharded and is_sharded(model):
            try:
                return fn(list(range(n)))
            finally:
                model.reshard()  # an inference forward leaves the root unit's parameters gathered
        mine = list(range(self.rank, n, self.world_size))
        got = self.gather_one((mine, fn(mine) if mine else []))
        out: list[Optional[T]] = [None] * n
        for idx, vals in got:
            for i, v in zip(idx, vals):
                out[i] = v
        return out  # type: ignore[return-value]

    # ---------------------------------------------------------------- full parameters (FSDP)
    def full_parameters(self, model) -> dict[str, Any]:
        """``{name: full tensor}`` of ``model``'s parameters on every rank (detached; for copying
        into the rollout model). FSDP: all-gathered (a collective: every rank must call it);
        otherwise the parameters themselves, no copy."""
        if not is_sharded(model):
            return {k: p.detach() for k, p in model.named_parameters()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))

    def checkpoint_state(self, model, optimizer) -> tuple[Any, Any]:
        """What :func:`~serl.train.checkpoint.save_checkpoint` reads as ``(policy, optimizer)``:
        unchanged unless ``model`` is FSDP-sharded; then the full model and optimizer state
        dicts, gathered to rank 0 now (a collective: every rank calls it; the other ranks get
        empty ones), as :class:`FullState` stand-ins. The optimizer state is in the one-process
        format (parameter indices as keys), so the checkpoint reads like any other
        (``torch.distributed.checkpoint.state_dict.get_model_state_dict`` /
        ``get_optimizer_state_dict`` with ``full_state_dict=True, cpu_offload=True``)."""
        if not is_sharded(model):
            return model, optimizer
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        tied = {k for k, _ in model.named_parameters(remove_duplicate=False)} - {k for k, _ in model.named_parameters()}
        # a tied parameter (LM head = embeddings) is stored once, as one process stores it
        model_sd = {k: v for k, v in get_model_state_dict(model, options=opts).items() if k not in tied}
        optim_sd = get_optimizer_state_dict(model, optimizer, options=opts)
        return FullState(model_sd), FullState(_optim_state_by_index(optim_sd, _param_names(model)))

    def checkpoint_loaders(self, model, optimizer) -> tuple[Any, Any]:
        """What :func:`~serl.train.checkpoint.load_checkpoint` loads into as ``(policy,
        optimizer)``: unchanged unless ``model`` is FSDP-sharded; then :class:`ShardedModelLoader`
        and :class:`ShardedOptimizerLoader`, which scatter the full state dicts of the files
        into the shards (collectives: every rank loads the same checkpoint)."""
        if not is_sharded(model):
            return model, optimizer
        return ShardedModelLoader(model), ShardedOptimizerLoader(model, optimizer)


# -------------------------------------------------------------------- FSDP helpers


def is_sharded(model: Any) -> bool:
    """True if ``model`` is an FSDP2 module (``torch.distributed.fsdp.FSDPModule``)."""
    if model is None:
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model, device: str, world_size: int) -> None:
    """Shard ``model`` in place over ``world_size`` ranks with torch's FSDP2 ``fully_shard``: one
    FSDP unit per transformer block (the classes of ``model._no_split_modules``, e.g.
    ``LlamaDecoderLayer``), then the root (embeddings, final norm and a tied LM head stay in one
    unit: torch refuses a parameter shared by two units). Parameters, gradients and optimizer
    state are sharded along dim 0 (Shard(0) DTensors) on a 1-D ``device`` mesh; full-precision
    parameters, no offload. ``model`` keeps its class's methods and parameter names. A
    collective: every rank calls it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device, (world_size,))
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # gather and free every unit once now, outside inference mode: the buffers of the gathered
    # parameters are allocated at the first gather and reused, and if that happened inside
    # torch.inference_mode (the old-log-prob pass) a later training forward could not write them
    for unit in [m for m in model.modules() if isinstance(m, FSDPModule)]:
        unit.unshard()
        unit.reshard()


@contextmanager
def _no_gradient_sync(model) -> Iterator[None]:
    """FSDP2: accumulate unsharded gradients locally (no reduce-scatter) inside the block."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _param_names(model) -> list[str]:
    """The names of ``model``'s trainable parameters in ``model.parameters()`` order: the order of
    the optimizer's parameter indices (the optimizer is built on that list)."""
    return [k for k, p in model.named_parameters() if p.requires_grad]


def _optim_state_by_index(sd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name (torch.distributed.checkpoint's format)
    in ``torch.optim.Optimizer.state_dict``'s format (parameter indices); ``{}`` stays ``{}``
    (the ranks other than 0)."""
    if not sd:
        return {}
    idx = {k: i for i, k in enumerate(names)}
    groups = [{**g, "params": [idx[k] for k in g["params"]]} for g in sd["param_groups"]]
    return {"state": {idx[k]: v for k, v in sd["state"].items()}, "param_groups": groups}


def _optim_state_by_name(sd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of :func:`_optim_state_by_index`.

    Raises:
        CheckpointError: an index outside the model's parameters (another model's optimizer)."""
    try:
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
        return {"state": {names[i]: v for i, v in sd["state"].items()}, "param_groups": groups}
    except (IndexError, KeyError, TypeError) as e:
        raise CheckpointError(f"the optimizer state does not match the model's {len(names)} parameters: {e!r}") from e


class FullState:
    """A gathered full state dict standing in for a model or an optimizer when a checkpoint is
    written: ``state_dict()`` returns it, ``state`` is its ``"state"`` entry (an optimizer's
    per-parameter tensors, for the disk-space estimate)."""

    def __init__(self, sd: dict[str, Any]):
        self._sd = sd
        self.state = sd.get("state", {}) if isinstance(sd.get("state"), dict) else {}

    def state_dict(self) -> dict[str, Any]:
        return self._sd


class ShardedModelLoader:
    """Loads a full state dict into an FSDP-sharded model: ``load_state_dict(sd, strict)``
    (``set_model_state_dict`` with ``full_state_dict=True``; each rank keeps its shard) and
    ``state_dict()`` (the full one, gathered on every rank). Both are collectives."""

    def __init__(self, model):
        self.model = model
        self._tied_weights_keys = getattr(model, "_tied_weights_keys", None)

    def load_state_dict(self, sd: dict[str, Any], strict: bool = True):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        return set_model_state_dict(self.model, sd, options=StateDictOptions(full_state_dict=True, strict=strict))

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))


class ShardedOptimizerLoader:
    """Loads a one-process optimizer state dict (parameter indices) into the optimizer of an
    FSDP-sharded model (``set_optimizer_state_dict`` with ``full_state_dict=True``; a collective)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        by_name = _optim_state_by_name(sd, _param_names(self.model))
        set_optimizer_state_dict(self.model, self.optimizer, by_name, options=StateDictOptions(full_state_dict=True))
