"""The training loop: rollout → rewards → filters → advantages → SERL weights → PPO update
(+ SPEAR replay) → sync → save.

One iteration, readable top to bottom in :meth:`Trainer.train_iteration`, in the order of SPEAR's
hybrid trainer (arXiv 2509.22601; ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/ray_trainer_hybrid.py``
``fit``; ``step`` = the 1-based global step, verl's ``global_steps``):

1. draw ``train_batch_size`` tasks; play ``env.rollout.n`` episodes of each (step rows);
2. per row: GiGPO's discounted step return from the raw env rewards, on all rows before any
   filter (arXiv 2505.10978; ``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``); the score =
   episode reward + SPEAR's tool-call bonus; the Dr.BoT response filters mask flagged rows and
   the group std filter drops whole groups (both as SPEAR's ``ray_trainer_hybrid.py``);
3. score − ``invalid_action_penalty_coef`` per malformed action (as verl-agent), advantages
   from the registry (``algorithm.adv_estimator``: GRPO arXiv 2402.03300, GiGPO), one per row;
4. SPEAR: a full replay buffer becomes this step's replay batch, with recalibrated advantages;
5. the :class:`~serl.train.batch.UpdateBatch` of the rows; SERL (arXiv 2605.19447), while
   λ_eff(u) > 0: privileged contexts per row, teacher log-probs of the student's own response
   tokens (one inference pass per iteration: the teacher is frozen during the update, as
   ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/ray_trainer.py``); with ``actor.use_kl_loss``
   the frozen reference model's log-probs (verl's ``use_kl_loss``);
6. update: PPO mini-batches of rows (one optimizer step each; gradient accumulation over
   micro-batches; SERL's weights on action tokens; entropy bonus; reference KL), then the replay
   mini-batches with their own optimizer steps (as SPEAR's ``update_actor``);
7. SPEAR: drop stale buffer entries, admit this step's positive-advantage rows;
8. u += 1; hard-sync the teacher every ``teacher_sync_interval`` updates; metrics; checkpoint.

Departures from the original, all documented in README "Deviations": no duplicated padding
rows, action masks on sampled ids, teacher-prompt truncation keeps the chat template's end,
the teacher and λ schedule are checkpointed, and the old log-probs of the first mini-batch
are the detached current log-probs (exact: no parameter has changed yet), which saves one
forward pass over those rows.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import yaml

from serl.algos.advantages import (anchor_group_sizes, discounted_step_returns, get_advantage_fn,
                                   gigpo_anchor_index, invalid_action_penalty)
from serl.algos.filters import apply_response_filters, enabled_filters, group_std_filter, response_flags
from serl.algos.losses import agg_loss, get_policy_loss_fn, kl_loss, replay_loss_config
from serl.algos.selective_weights import effective_lambda, serl_token_weights, teacher_needs_sync, teacher_rows
from serl.algos.spear import ReplayBuffer, ReplayRow, replay_coef, toolcall_bonus
from serl.config import Config, config_from_yaml, to_yaml
from serl.errors import CheckpointError, ConfigError
from serl.envs.base import Task, get_env_class
from serl.envs.base import list_tasks as env_list_tasks
from serl.hindsight.builder import SerlContextBuilder
from serl.models.loading import (load_causal_lm, load_tokenizer, pick_device, pick_dtype,
                                 resolve_model_path)
from serl.models.lora import POLICY_ADAPTER, AdapterView, apply_lora
from serl.models.teacher import AdapterReference, AdapterTeacher, Teacher, teacher_prompt_ids
from serl.rollout.collector import Collector
from serl.rollout.engine import (SamplingParams, default_memory_share, logprob_gap_metrics, make_engine,
                                 sync_engine_weights)
from serl.train.batch import (RowBatch, StepTable, UpdateBatch, length_buckets, pad_rows, response_logprobs,
                              score_logprobs)
from serl.train.checkpoint import (load_checkpoint, load_newest_intact, remove_stale_tmp_dirs, rng_state,
                                   save_checkpoint, set_rng_state)
from serl.train.grad_ckpt import GradCheckpointing, prepare_checkpointing
from serl.train.distributed import WORLD_SIZE_KEY, Distributed, check_checkpoint_world_size, deal_micro_batches, micro_loss_scale
from serl.train.run_dir import RunLock, check_run_dir, create_run_dir
from serl.train.metrics import (MetricMeans, MetricsLogger, advantage_signal_metrics, rollout_metrics,
                                success_by_type)
from serl.train.teacher_log import (TeacherLogWriter, TraceWriter, serl_trace_fields, teacher_log_row,
                                    token_char_spans, trace_row, trace_sample)
from serl.trajectory import Group, Step, Trajectory, iter_steps, write_jsonl
from serl.utils import atomic_write_text, configure_cpu_threads, set_seed

log = logging.getLogger(__name__)


class TaskSampler:
    """Deterministic task order: the train tasks shuffled once per epoch with ``seed + epoch``.

    The cursor ``(epoch, position)`` is checkpointed so a resumed run draws the same tasks.
    """

    def __init__(self, tasks: list[Task], seed: int):
        if not tasks:
            raise ValueError("no training tasks found")
        self.tasks = tasks
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(self.seed + epoch).shuffle(order)
        return order

    def draw(self, k: int) -> list[Task]:
        out = []
        for _ in range(k):
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._shuffled(self.epoch)
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, d: dict[str, int]) -> None:
        self.epoch, self.pos = int(d["epoch"]), int(d["pos"])
        self._order = self._shuffled(self.epoch)


def make_adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (decoupled weight decay, arXiv 1711.05101) in its fastest implementation here: the
    fused kernel (one kernel over all parameters; CPU and CUDA in torch >= 2.4), else the
    multi-tensor ``foreach`` one; same update as the per-parameter loop up to float rounding."""
    params = list(params)
    for impl in ({"fused": True}, {"foreach": True}):
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **impl)
        except (RuntimeError, TypeError, ValueError):
            continue
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def default_run_name(cfg: Config) -> str:
    algo = cfg.algorithm.adv_estimator + ("-serl" if cfg.algorithm.serl.enable else "")
    return f"{cfg.env.name}-{algo}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def make_pool(cfg: Config, num_envs: int):
    """The env pool of ``num_envs`` envs of ``cfg.env.name``, as ``cfg.env.pool`` says: an
    :class:`~serl.envs.pool.EnvPool` (worker processes; ``env.num_workers=0`` = one per CPU
    core) or a :class:`~serl.envs.ray_pool.RayEnvPool` (Ray actors at ``env.ray_address``;
    ``env.num_workers=0`` = one per CPU of the Ray cluster). The one place training and evaluation get a
    pool. Raises ImportError (with the install command) for ``ray`` without Ray installed."""
    import os

    if cfg.env.pool == "ray":
        from serl.envs.ray_pool import RayEnvPool

        return RayEnvPool(cfg.env.name, num_envs=num_envs, num_workers=cfg.env.num_workers,
                          env_kwargs=env_kwargs(cfg), timeout=cfg.env.worker_timeout, address=cfg.env.ray_address)
    from serl.envs.pool import EnvPool

    workers = cfg.env.num_workers or (os.cpu_count() or 1)
    workers = max(1, min(workers, num_envs))
    return EnvPool(cfg.env.name, num_envs=num_envs, num_workers=workers, env_kwargs=env_kwargs(cfg),
                   timeout=cfg.env.worker_timeout)


def env_kwargs(cfg: Config) -> dict[str, Any]:
    """Constructor arguments of the ``cfg.env.name`` env (its ``config_kwargs`` hook)."""
    return get_env_class(cfg.env.name).config_kwargs(cfg.env)


def list_tasks(cfg: Config, split: str) -> list[Task]:
    """The tasks of ``split`` of the ``cfg.env.name`` env, restricted to ``env.task_types``
    (:func:`serl.envs.base.list_tasks`)."""
    return env_list_tasks(cfg.env, split)


class Trainer:
    """Owns the models, the env pool and the run folder of one training run.

    The run folder (:mod:`serl.train.run_dir`): a new run checks it before any model loads
    (refusing a non-empty one unless ``trainer.overwrite``) and creates and locks it only once
    the models, envs and tasks are ready; a resumed run locks it first. The lock is held until
    :meth:`close`.

    Args:
        cfg: the resolved config.
        run_dir: the run folder; None = ``<trainer.output_dir>/<run_name>``.
        resume: restore the newest intact checkpoint of ``run_dir``.

    Raises:
        serl.models.loading.ModelLoadError, serl.envs.base.EnvError, ConfigError, CheckpointError,
        SerlError (the run folder is locked by another process): at start-up.
    """

    def __init__(self, cfg: Config, run_dir: Optional[Path] = None, resume: bool = False):
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.trainer.output_dir) / (
            cfg.trainer.run_name or default_run_name(cfg))
        # the process group (one process: no accelerate); rank 0 alone writes the run folder,
        # whose name (a default one has a timestamp) all ranks take from rank 0
        self.dist = Distributed.setup(cfg, pick_device(cfg.trainer.device))
        self.run_dir = Path(self.dist.gather_one(str(self.run_dir))[0])
        self._run_lock: Optional[RunLock] = self._check_run_dir(resume)
        try:
            self._start(resume)
        except BaseException:
            self._release_run_dir()
            raise

    def _check_run_dir(self, resume: bool) -> Optional[RunLock]:
        """Start-up checks of the run folder, before any model loads. Resume: the folder must
        exist; it is locked now and stale ``.tmp_*`` checkpoint folders are removed. New run:
        ``trainer.output_dir`` must be writable and the folder empty or absent (or
        ``trainer.overwrite``); nothing is written yet (see :meth:`_start`)."""
        if resume and not self.dist.is_main:  # rank 0 alone locks (and cleans) a resumed folder
            if not self.run_dir.is_dir():
                raise CheckpointError(f"cannot resume: {self.run_dir} is not a run folder")
            lock = None
        else:
            lock = check_run_dir(self.run_dir, resume, self.cfg.trainer.overwrite)
        if lock is not None:
            remove_stale_tmp_dirs(self.run_dir)
        self.dist.barrier()  # no rank reads a checkpoint while rank 0 cleans up / creates the folder
        return lock

    def _release_run_dir(self) -> None:
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _start(self, resume: bool) -> None:
        """Models, algorithms, tasks; then the new run's folder (created and locked) and its
        ``config.yaml``, the metric sinks, and a resume's checkpoint."""
        cfg = self.cfg
        configure_cpu_threads(cfg.trainer.num_threads)
        set_seed(cfg.seed)
        self.device = pick_device(cfg.trainer.device)
        self._load_models()
        sharing = self.dist.world_size if self.device == "cpu" else 1  # ranks sharing the RAM, or one GPU each
        self.grad_ckpt = GradCheckpointing(self.policy, cfg.model.gradient_checkpointing, cfg.trainer.activation_memory_gb,
                                           self.device, sharing, 2 if self.autocast_dtype else 4)
        self.context_builder = SerlContextBuilder(cfg.algorithm.serl) if self.teacher else None
        self.teacher_log = TeacherLogWriter(self.run_dir, cfg.algorithm.serl)
        self.trace = TraceWriter(self.run_dir, cfg.trainer)
        self._row_contexts: list = []  # the kept rows' privileged contexts of this iteration (SERL)
        self.optimizer = make_adamw([p for p in self.policy.parameters() if p.requires_grad], cfg.actor.lr, cfg.actor.weight_decay)
        self._prepare_distributed()
        self.engine, engine_name = make_engine(cfg.rollout.engine, self.rollout_model, self.tokenizer,
                                               cfg.rollout.micro_batch_size, self.device, **self._engine_options())
        print(f"serl: rollout engine {engine_name} (rollout.engine={cfg.rollout.engine}, device {self.device})",
              file=sys.stderr)

        self._build_algorithms()

        # ---- data and envs
        self.sampler = TaskSampler(list_tasks(cfg, cfg.env.train_split), cfg.seed)
        self.num_envs = cfg.data.train_batch_size // self.dist.world_size * cfg.env.rollout.n  # this rank's envs
        self.pool = None
        # tasks whose env resets run in the workers while the previous update trains
        self._pending_tasks: Optional[list[Task]] = None
        self._sampler_state_before_pending = self.sampler.state_dict()

        # ---- state
        self.iteration = 0
        self.update_step = 0  # u: completed policy updates (λ schedule, teacher sync phase)
        if not resume and self.dist.is_main:  # every start-up check passed: now the folder may exist
            self._run_lock = create_run_dir(self.run_dir, cfg.trainer.overwrite)
            atomic_write_text(self.run_dir / "config.yaml", to_yaml(cfg))
        sinks = cfg.trainer.logger if self.dist.is_main else []
        self.logger = MetricsLogger(self.run_dir, sinks, project=cfg.trainer.project_name,
                                    config=yaml.safe_load(to_yaml(cfg)) if "wandb" in sinks else None)
        if resume:
            self._resume()

    def _prepare_distributed(self) -> None:
        """``self.train_model``: the policy as the update's forward passes see it (DDP-wrapped by
        ``accelerator.prepare`` with N > 1; the policy itself with one process; same parameters).
        With N > 1: only rank 0 writes traces and teacher logs, and each rank samples rollouts
        with its own seed ``seed + rank`` (the models were loaded under ``seed`` on every rank).
        FSDP (``trainer.strategy=fsdp``): the policy is sharded in place, and the rollout model
        is an unsharded copy even in float32 (:meth:`_unshared_rollout_model`)."""
        self._unshared_rollout_model()
        self.train_model, self.optimizer = self.dist.prepare(self.policy, self.optimizer)
        if not self.dist.enabled:
            return
        set_seed(self.cfg.seed + self.dist.rank)
        if not self.dist.is_main:
            self.teacher_log.enabled = False
            self.trace.every = 0

    def _unshared_rollout_model(self) -> None:
        """FSDP: generation runs per rank for different numbers of decode steps, so it must not
        run the sharded policy (each sharded forward is a collective): a policy that is its own
        rollout model (float32 inference) gets a full copy, taken before sharding."""
        if self.dist.sharded and self.rollout_model is self.policy:
            self.rollout_model = Teacher(self.policy, self.infer_dtype).model

    def _full_policy(self):
        """The policy with full parameters, as a module: the policy itself, or with FSDP its
        rollout copy (re-filled after every update, in the inference dtype, which is also the
        teacher's: copying from it equals copying from the policy)."""
        return self.rollout_model if self.dist.sharded else self.policy

    def _engine_options(self) -> dict[str, Any]:
        """The settings of the rollout engine (:func:`~serl.rollout.engine.make_engine`)."""
        r = self.cfg.rollout
        return dict(model_path=self.model_path, dtype=self.infer_dtype, unpadded_prefill=r.unpadded_prefill,
                    gpu_memory_utilization=(r.gpu_memory_utilization if r.gpu_memory_utilization is not None
                                            else default_memory_share(self.device)),
                    enable_prefix_caching=r.enable_prefix_caching,
                    max_model_len=self.cfg.data.max_prompt_length + self.cfg.data.max_response_length,
                    seed=self.cfg.seed)

    def _build_algorithms(self) -> None:
        """The advantage estimator, the policy loss and its per-batch-kind parameters, SPEAR's
        replay buffer and the generator of the std filter's and the replay batch's draws."""
        cfg = self.cfg
        self.adv_fn = get_advantage_fn(cfg.algorithm.adv_estimator)
        self.loss_fn = get_policy_loss_fn(cfg.actor.policy_loss)
        # the loss parameters of each batch kind (UpdateBatch.prefix): SPEAR's replay rows take
        # the *_replay ones (TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/core_algos.py)
        self.loss_cfgs = {"actor": cfg.actor, "replay": replay_loss_config(cfg.actor)}
        spear = cfg.algorithm.spear
        self.replay_buffer = ReplayBuffer.from_config(cfg) if spear.enable_trajectory_replay else None
        # draws of the std filter's power-of-two trim and of the replay batch; checkpointed
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def _load_models(self) -> None:
        """The tokenizer, the fp32 policy (master weights), its rollout copy, SERL's teacher and
        the KL reference (:meth:`_load_lora_models` with ``model.lora.r > 0``)."""
        cfg = self.cfg
        self.model_path = path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
        self.tokenizer = load_tokenizer(path)
        self.infer_dtype = pick_dtype(cfg.model.dtype, self.device)
        train_dtype = pick_dtype(cfg.model.train_dtype, self.device)
        # fp32 master weights; bf16 training = autocast
        self.autocast_dtype = train_dtype if train_dtype != torch.float32 else None
        if cfg.model.lora.r > 0:
            self._load_lora_models(path)
            return
        self.policy = self._load_policy_base(path, torch.float32)
        if self.infer_dtype != torch.float32:
            # a bf16 copy for sampling, re-synced after every update (fast batched bf16 generate)
            self.rollout_model = Teacher(self.policy, self.infer_dtype).model
        else:
            self.rollout_model = self.policy
        self.teacher = Teacher(self.policy, self.infer_dtype) if cfg.algorithm.serl.enable else None
        # the KL reference: a frozen copy of the initial policy θ0 (verl's ``ref``). Built
        # before a resume loads the checkpoint, so it is θ0 on resume too; never saved.
        self.ref = Teacher(self.policy, self.infer_dtype) if cfg.actor.use_kl_loss else None

    def _load_policy_base(self, path: str, dtype: torch.dtype):
        """The model of ``path`` (with ``model.adapter`` merged) in ``dtype`` on the device,
        activation checkpointing installed unless ``model.gradient_checkpointing=false`` (``auto``
        switches it per micro-batch, :class:`~serl.train.grad_ckpt.GradCheckpointing`), no KV cache
        in training forwards."""
        cfg = self.cfg
        model = load_causal_lm(path, dtype, self.device, cfg.model.trust_remote_code, cfg.model.adapter)
        prepare_checkpointing(model, cfg.model.gradient_checkpointing)  # on, off or per micro-batch
        model.config.use_cache = False
        return model

    def _load_lora_models(self, path: str) -> None:
        """LoRA (``model.lora.r > 0``, PEFT): one base model in memory. The policy trains its
        float32 adapter only; the frozen base is held in the inference dtype when training
        autocasts to that dtype anyway (bf16 on CPUs with native bf16), else in float32. The
        policy itself samples the rollouts (no copy); SERL's teacher is a second adapter
        (:class:`AdapterTeacher`), the KL reference the base with adapters disabled
        (:class:`AdapterReference`). serl's design; verl's LoRA trains the same way (frozen base)."""
        cfg = self.cfg
        base_dtype = self.infer_dtype if self.autocast_dtype == self.infer_dtype else torch.float32
        self.policy = apply_lora(self._load_policy_base(path, base_dtype), cfg.model.lora)
        self.policy.eval()  # train mode only inside the update (get_peft_model leaves it in train mode)
        self.rollout_model = self.policy
        self.teacher = AdapterTeacher(self.policy) if cfg.algorithm.serl.enable else None
        self.ref = AdapterReference(self.policy) if cfg.actor.use_kl_loss else None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        # the cursor *before* any prefetched draw, so a resumed run draws those tasks again
        sampler = self._sampler_state_before_pending if self._pending_tasks else self.sampler.state_dict()
        state = {"update_step": self.update_step, "sampler": sampler, "generator": self.generator.get_state(),
                 WORLD_SIZE_KEY: self.dist.world_size}
        if self.dist.enabled:  # every rank's sampling RNG (collective: all ranks call state_dict)
            state["rank_rng"] = self.dist.gather_one(rng_state())
        if self.context_builder is not None:
            state["serl_context"] = self.context_builder.state_dict()
        if self.replay_buffer is not None:
            state["replay_buffer"] = self.replay_buffer.state_dict()
        return state

    def _checkpointed_models(self) -> tuple[Any, Any]:
        """What a checkpoint holds of the models: ``(policy, teacher or None)``; with LoRA the
        policy adapter and the teacher adapter only (:class:`AdapterView`), never the base."""
        teacher = self.teacher.model if self.teacher else None
        if self.cfg.model.lora.r > 0:
            return AdapterView(self.policy, POLICY_ADAPTER), teacher
        return self.policy, teacher

    def save(self) -> Path:
        """Write a checkpoint (rank 0; the other ranks wait for it) and return its folder.
        With N > 1 every rank must call it (the state gathers each rank's RNG)."""
        policy, teacher = self._checkpointed_models()
        policy, optimizer = self.dist.checkpoint_state(policy, self.optimizer)  # FSDP: gathered to rank 0
        state = self.state_dict()
        path = None
        if self.dist.is_main:
            path = save_checkpoint(self.run_dir, self.iteration, policy, optimizer, state,
                                   teacher=teacher, keep=self.cfg.trainer.max_checkpoints_to_keep)
        return self.dist.gather_one(path)[0]  # also the barrier: rank 0 has written it

    def _resume(self) -> None:
        """Restore the newest intact checkpoint (a damaged newer one is reported and skipped)."""
        policy, teacher = self._checkpointed_models()
        policy, optimizer = self.dist.checkpoint_loaders(policy, self.optimizer)  # FSDP: into the shards
        folder, state = load_newest_intact(
            self.run_dir, lambda f: load_checkpoint(f, policy, optimizer, teacher=teacher))
        check_checkpoint_world_size(state, self.dist.world_size, folder)
        if "rank_rng" in state:
            set_rng_state(state["rank_rng"][self.dist.rank])
        self.iteration = int(state["iteration"])
        self.update_step = int(state["update_step"])
        self.sampler.load_state_dict(state["sampler"])
        if self.context_builder is not None and "serl_context" in state:
            self.context_builder.load_state_dict(state["serl_context"])
        if "generator" in state:
            self.generator.set_state(state["generator"])
        if self.replay_buffer is not None:
            if "replay_buffer" in state:
                self.replay_buffer.load_state_dict(state["replay_buffer"])
            else:  # e.g. a GRPO run resumed with SPEAR switched on
                log.warning("checkpoint %s has no replay buffer: SPEAR replay starts empty", folder)
        self._sync_rollout_model()
        if self.dist.is_main:
            self.logger.truncate_after(self.iteration)
        log.info("resumed %s at iteration %d (update %d)", folder, self.iteration, self.update_step)

    @torch.no_grad()
    def _sync_rollout_model(self) -> None:
        """Copy the policy into the rollout model (if it is a copy), then let the engine take
        the weights (vLLM: pushed in memory, :func:`~serl.rollout.engine.sync_engine_weights`)."""
        if self.rollout_model is not self.policy:
            src = self.dist.full_parameters(self.policy)  # FSDP: all-gathered
            for name, p in self.rollout_model.named_parameters():
                p.copy_(src[name].detach().to(p.dtype))
        sync_engine_weights(self.engine)

    # ------------------------------------------------------------------ rollout
    def _collector(self, pool) -> Collector:
        c = self.cfg
        return Collector(pool, self.engine, self.tokenizer, c.env.name, c.env.history_length,
                         c.env.max_steps, c.data.max_prompt_length)

    def _sampling(self, evaluation: bool, greedy: bool = False, seed: Optional[int] = None) -> SamplingParams:
        r = self.cfg.rollout
        if evaluation:
            return SamplingParams(max_new_tokens=self.cfg.data.max_response_length,
                                  temperature=r.val_temperature, top_p=r.top_p, top_k=r.top_k,
                                  do_sample=r.val_do_sample and not greedy, seed=seed)
        return SamplingParams(max_new_tokens=self.cfg.data.max_response_length, temperature=r.temperature,
                              top_p=r.top_p, top_k=r.top_k, do_sample=True)

    # ------------------------------------------------------------------ one iteration
    def train_iteration(self, pbar=None) -> dict[str, float]:
        """Run one rollout + update (the order of the module docstring); returns the iteration's metrics."""
        step = self.iteration + 1  # the 1-based global step of the schedules (verl's global_steps)
        t0 = time.time()

        # ---- 1. rollout (the next iteration's env resets start in the background)
        groups = self._rollout(pbar)
        timing = {"timing/rollout_s": time.time() - t0}
        metrics: dict[str, float] = rollout_metrics(groups)

        # ---- 2. scores, step returns, Dr.BoT response filters, group std filter
        table = self._filtered_rows(groups, step, metrics)

        # ---- 3. invalid-action penalty and advantages
        adv = self._advantages(table, metrics)  # [rows]

        # ---- 4. SPEAR: a full buffer becomes this step's replay batch (and is emptied)
        replay = self._take_replay_batch(metrics)

        # ---- 5. the update batch and its frozen-model log-probs: SERL teacher, KL reference
        batch = self._update_batch(groups, table, adv, metrics, timing, pbar)

        # ---- 6. update: on-policy mini-batches, then replay mini-batches
        t2 = time.time()
        if pbar is not None:
            pbar.set_postfix_str(f"update on {len(batch)} step rows" + (f" + {len(replay)} replay rows" if replay else ""))
        metrics.update(self._update(batch, replay, step))
        timing["timing/update_s"] = time.time() - t2
        metrics.update(logprob_gap_metrics([s.rollout_log_probs for s in table.rows], batch.old_log_probs))

        # ---- 7. SPEAR: drop stale entries, admit this step's positive-advantage rows
        self._store_replay_rows(table, adv, batch.old_log_probs, step, metrics)
        t3 = time.time()
        self._write_trace(groups, table, adv, batch)  # serl report's sampled trajectories
        timing["timing/trace_s"] = time.time() - t3

        # ---- 8. counters, rollout-copy and teacher sync
        self._after_update(metrics)
        metrics.update(self._timing_metrics(table.rows, timing, t0))
        self._last_groups = groups
        return metrics

    def _timing_metrics(self, rows: list[Step], timing: dict[str, float], t0: float) -> dict[str, float]:
        """Wall-clock seconds of the iteration's phases, update counter and token throughput."""
        t_update = timing["timing/update_s"]
        return {
            "timing/rollout_s": timing["timing/rollout_s"], "timing/teacher_s": timing["timing/teacher_s"],
            "timing/update_s": t_update, "timing/reference_s": timing["timing/reference_s"],
            "timing/trace_s": timing["timing/trace_s"],
            "timing/iteration_s": time.time() - t0, "training/update_step": self.update_step,
            "throughput/update_tokens_per_s": sum(len(s.prompt_ids) + len(s.response_ids) for s in rows) / max(t_update, 1e-9),
            "throughput/response_tokens": sum(len(s.response_ids) for s in rows),
        }

    def _after_update(self, metrics: dict[str, float]) -> None:
        """u += 1; copy the policy into the rollout model; hard-sync SERL's teacher every
        ``teacher_sync_interval`` updates (as SERL's trainer); iteration += 1."""
        self.update_step += 1
        self._sync_rollout_model()
        if self.teacher is not None and teacher_needs_sync(self.update_step, self.cfg.algorithm.serl.teacher_sync_interval):
            self.teacher.sync_from(self._full_policy())
            metrics["serl/teacher_synced"] = 1.0
        self.iteration += 1

    def _rollout(self, pbar) -> list[Group]:
        """Play ``env.rollout.n`` episodes of ``train_batch_size`` tasks; returns the groups.

        Then, unless this is the last iteration, draws the next iteration's tasks and starts their
        env resets in the workers, to run while this update trains (ALFWorld's reset re-translates
        the PDDL: ~0.85 s of CPU per env).
        """
        c = self.cfg
        if self.pool is None:
            self.pool = make_pool(c, self.num_envs)
        if self._pending_tasks is not None:
            tasks, self._pending_tasks = self._pending_tasks, None
            reset_results = self.pool.reset_wait()
        else:
            tasks, reset_results = self.sampler.draw(c.data.train_batch_size), None

        def progress(step, active):
            if pbar is not None:
                pbar.set_postfix_str(f"rollout step {step}/{c.env.max_steps}, {active} active")

        # N > 1: this rank plays its share of the groups; then every rank holds all of them
        groups = self._collector(self.pool).collect(self.dist.share(tasks), c.env.rollout.n, self._sampling(False),
                                                    progress, reset_results=reset_results)
        groups = self.dist.gather(groups)
        if self.iteration + 1 < c.trainer.total_training_steps:
            self._sampler_state_before_pending = self.sampler.state_dict()
            self._pending_tasks = self.sampler.draw(c.data.train_batch_size)
            self.pool.reset_async([t for t in self.dist.share(self._pending_tasks) for _ in range(c.env.rollout.n)])
        return groups

    def _step_table(self, groups: list[Group], step: int) -> StepTable:
        """Every step row of ``groups`` (``iter_steps`` order) with its scalars, before any filter.

        * ``score_raw`` = episode reward + ``toolcall_bonus(L, step)`` of the row's trajectory
          (SPEAR, arXiv 2509.22601; 0 with ``algorithm.use_toolcall_reward=none``);
        * ``penalty`` = ``actor.invalid_action_penalty_coef`` on a malformed action (as verl-agent);
        * ``step_returns`` = GiGPO's discounted ``R_t`` with ``algorithm.gamma`` from the raw env
          rewards — here, before the std filter can drop a trajectory's rewarded last step
          (``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``);
        * ``row_mask`` all ones (the response filters come next).
        """
        a, alg = self.cfg.actor, self.cfg.algorithm
        uids, traj_uids, g_idx, t_idx, score_raw, bonus_col, invalid = [], [], [], [], [], [], []
        gids: dict[str, int] = {}
        tids: dict[str, int] = {}
        bonus_of: dict[str, float] = {}
        rows = []
        for g, t, s in iter_steps(groups):
            if t.traj_uid not in bonus_of:
                bonus_of[t.traj_uid] = toolcall_bonus(t.length, step, alg.use_toolcall_reward, alg.max_toolcall_steps)
            rows.append(s)
            uids.append(g.uid)
            traj_uids.append(t.traj_uid)
            g_idx.append(gids.setdefault(g.uid, len(gids)))
            t_idx.append(tids.setdefault(t.traj_uid, len(tids)))
            score_raw.append(t.episode_reward + bonus_of[t.traj_uid])
            bonus_col.append(bonus_of[t.traj_uid])
            invalid.append(not s.action_valid)
        n = len(rows)
        traj_index = torch.tensor(t_idx, dtype=torch.long)
        step_rewards = torch.tensor([s.reward for s in rows], dtype=torch.float32)
        step_index = torch.tensor([s.step_id for s in rows], dtype=torch.long)
        invalid_t = torch.tensor(invalid, dtype=torch.bool)
        return StepTable(
            rows=rows, index=torch.arange(n), uids=uids, traj_uids=traj_uids,
            group_index=torch.tensor(g_idx, dtype=torch.long), traj_index=traj_index,
            score_raw=torch.tensor(score_raw, dtype=torch.float32),
            penalty=invalid_action_penalty(invalid_t, a.invalid_action_penalty_coef, a.use_invalid_action_penalty),
            invalid=invalid_t, bonus=torch.tensor(bonus_col, dtype=torch.float32),
            step_rewards=step_rewards, step_index=step_index,
            step_returns=discounted_step_returns(step_rewards, traj_index, alg.gamma, step_index),
            row_mask=torch.ones(n, dtype=torch.float32),
        )

    def _filtered_rows(self, groups: list[Group], step: int, metrics: dict[str, float]) -> StepTable:
        """The rows that train this iteration (SPEAR's ``fit`` order: filters before advantages).

        1. :meth:`_step_table` (scores with the tool-call bonus, GiGPO step returns on all rows);
        2. Dr.BoT response filters (``algorithm.filter_*_responses``, as SPEAR): a flagged
           row's ``row_mask`` becomes 0 — it stays in the batch and in the group statistics;
        3. group std filter (``rollout.rollout_filter_ratio`` / ``_type``, as SPEAR) on the
           score before the invalid-action penalty; 1.0 keeps every row. Its power-of-two trim
           draws from ``self.generator``.
        """
        c = self.cfg
        table = self._step_table(groups, step)
        enabled = enabled_filters(c.algorithm)
        if any(enabled.values()):
            flags = response_flags([s.response_ids for s in table.rows], [s.response_text for s in table.rows],
                                   c.data.max_response_length)
            row_mask, filter_metrics = apply_response_filters(table.row_mask.unsqueeze(-1), flags, enabled)
            table.row_mask = row_mask.squeeze(-1)
            metrics.update(filter_metrics)
        keep, std_metrics = group_std_filter(table.score_raw.tolist(), table.group_index.tolist(),
                                             table.traj_index.tolist(), c.rollout.rollout_filter_ratio,
                                             c.rollout.rollout_filter_type, generator=self.generator)
        metrics.update(std_metrics)
        if len(keep) == len(table):
            return table
        return table.select(keep.tolist())

    def _advantages(self, table: StepTable, metrics: dict[str, float]) -> torch.Tensor:
        """One advantage per row from ``algorithm.adv_estimator`` (GRPO arXiv 2402.03300, GiGPO arXiv 2505.10978); ``[rows]``.

        GiGPO's anchor groups (exact ``Step.observation`` match inside a task group, or similarity
        with ``algorithm.gigpo.enable_similarity``) are computed here once, for the estimator and
        for the step-group metrics (``gigpo/*``).
        """
        alg = self.cfg.algorithm
        data = table.advantage_input()
        if alg.adv_estimator == "gigpo":
            data.anchor_index = gigpo_anchor_index(data, alg.gigpo)
            sizes = anchor_group_sizes(data.anchor_index.tolist())
            metrics.update({"gigpo/step_groups": float(len(sizes)),
                            "gigpo/size1_group_fraction": sum(1 for k in sizes if k == 1) / len(sizes),
                            "gigpo/mean_group_size": sum(sizes) / len(sizes)})
        adv = self.adv_fn(data, alg)
        metrics.update({"critic/score/mean": data.scores.mean().item(),
                        "critic/advantages/mean": adv.mean().item(),
                        "critic/advantages/max": adv.max().item(), "critic/advantages/min": adv.min().item()})
        metrics.update(advantage_signal_metrics(adv, data.group_index))
        if alg.use_toolcall_reward != "none":
            metrics["critic/toolcall_bonus/mean"] = table.bonus.mean().item()
        return adv

    def _take_replay_batch(self, metrics: dict[str, float]) -> list[ReplayRow]:
        """SPEAR (``TrajectoryBufferBatch`` of ``ray_trainer_hybrid.py``): if the buffer is full, all of it becomes
        this step's replay batch with recalibrated advantages, and the buffer is emptied;
        otherwise no replay rows. The sample draws from ``self.generator``."""
        buf = self.replay_buffer
        if buf is None:
            return []
        metrics["replay/buffer_size"] = float(buf.size())
        if not buf.is_full():
            return []
        replay, m = buf.consume(self.generator)
        metrics.update(m)
        return replay

    def _store_replay_rows(self, table: StepTable, adv: torch.Tensor, old_lp: list[torch.Tensor], step: int,
                           metrics: dict[str, float]) -> None:
        """SPEAR (``TrajectoryBufferBatch`` of ``ray_trainer_hybrid.py``): ``remove_old`` then admit this step's rows with a positive
        advantage. Each kept row is offered with its behaviour log-probs, its token advantages
        (estimator output × response mask after the filters, before SERL's weights) and its score."""
        if self.replay_buffer is None:
            return
        scores = table.scores
        offered = []
        for i, s in enumerate(table.rows):
            mask = torch.full((len(s.response_ids),), float(table.row_mask[i]))
            offered.append(ReplayRow(
                prompt_ids=torch.tensor(s.prompt_ids, dtype=torch.long),
                response_ids=torch.tensor(s.response_ids, dtype=torch.long),
                response_mask=mask, old_log_probs=old_lp[i], advantages=float(adv[i]) * mask,
                reward=float(scores[i]), uid=table.uids[i], traj_uid=table.traj_uids[i],
                extra={"action_mask": torch.tensor(s.action_mask, dtype=torch.float32)}))
        metrics.update(self.replay_buffer.update(offered, step))

    def _update_batch(self, groups: list[Group], table: StepTable, adv: torch.Tensor, metrics: dict[str, float],
                      timing: dict[str, float], pbar=None) -> UpdateBatch:
        """The on-policy :class:`UpdateBatch` of ``table``'s rows (advantages ``adv`` ``[rows]``)
        with SERL's teacher log-probs (one inference pass per iteration while λ_eff(u) > 0; the
        teacher is frozen during the update) and, with ``actor.use_kl_loss``, the frozen
        reference's. Records ``timing/teacher_s`` and ``timing/reference_s`` in ``timing``."""
        batch = UpdateBatch.from_steps(table.rows, adv, table.row_mask)
        t1 = time.time()
        if self.teacher is not None:
            sc = self.cfg.algorithm.serl
            batch.serl_lambda = effective_lambda(self.update_step, sc.mixing_lambda, sc.lambda_decay_steps)
            batch.teacher_log_probs, batch.has_context = self._teacher_logprobs(groups, table, batch, adv, metrics, pbar)
        timing["timing/teacher_s"] = time.time() - t1
        if self.ref is not None:
            batch.ref_log_probs = self._score(self.ref.model, batch, "reference", pbar)
        timing["timing/reference_s"] = time.time() - t1 - timing["timing/teacher_s"]
        return batch

    def _score(self, model, batch: UpdateBatch, label: Optional[str] = None, pbar=None,
               prompt_ids: Optional[list[list[int]]] = None, autocast: bool = False) -> list[torch.Tensor]:
        """:func:`score_logprobs` of ``batch`` under ``model`` at the rollout temperature, in
        length-grouped micro-batches of ``actor.log_prob_micro_batch_size_per_gpu``;
        ``[resp_len]`` float32 per row."""
        progress = None
        if pbar is not None and label:
            def progress(k: int, n: int) -> None:
                pbar.set_postfix_str(f"{label} scoring {k}/{n} rows")
        def score(idx: list[int]) -> list[torch.Tensor]:  # N > 1: rows r, r+N, ... on rank r, then gathered
            part = batch if len(idx) == len(batch) else batch.select(idx)
            prompts = None if prompt_ids is None or len(idx) == len(batch) else [prompt_ids[i] for i in idx]
            return score_logprobs(model, part, self.cfg.actor.log_prob_micro_batch_size_per_gpu,
                                  pad_id=self.tokenizer.pad_token_id, temperature=self.cfg.rollout.temperature,
                                  device=self.device, prompt_ids=prompt_ids if prompts is None else prompts,
                                  autocast=self._autocast if autocast else nullcontext, progress=progress,
                                  remove_padding=self.cfg.model.use_remove_padding)

        return self.dist.sharded_map(score, len(batch), model=model)

    def _teacher_logprobs(self, groups: list[Group], table: StepTable, batch: UpdateBatch, adv: torch.Tensor,
                          metrics: dict[str, float], pbar=None) -> tuple[list[Optional[torch.Tensor]], list[bool]]:
        """SERL teacher log-probs of each row's sampled tokens under its privileged prompt.

        Returns ``(teacher_lp, has_ctx)``: ``has_ctx`` per row whether it has a context (one that
        fits ``max_reprompt_len``); ``teacher_lp`` per row a ``[resp_len]`` tensor, or None for a
        row with no context, for every row once λ_eff = 0, and for a row that trains nothing
        (advantage ``adv`` ``[rows]`` exactly 0, or masked) with
        ``algorithm.serl.skip_zero_advantage_rows`` (:func:`teacher_rows`).
        """
        n = len(batch)
        self._row_contexts = []  # no stale contexts in the trace once λ_eff = 0
        if batch.serl_lambda <= 0.0:
            metrics.update({"serl/teacher_inactive_after_decay": 1.0, "serl/reprompt_sample_fraction": 0.0,
                            "serl/teacher_scored_fraction": 0.0})
            return [None] * n, [False] * n
        contexts, t_prompts = self._teacher_prompts(groups, table)
        has_ctx = [p is not None for p in t_prompts]
        todo = teacher_rows(has_ctx, adv, table.row_mask, self.cfg.algorithm.serl.skip_zero_advantage_rows)
        scored = self._score(self.teacher.model, batch.select(todo), "teacher", pbar,
                             prompt_ids=[t_prompts[i] for i in todo])  # also when empty: N > 1 gathers
        out: list[Optional[torch.Tensor]] = [None] * n
        for i, lp in zip(todo, scored):
            out[i] = lp
        metrics.update(self._serl_metrics(table.rows, contexts, has_ctx))
        metrics["serl/teacher_scored_fraction"] = len(todo) / max(1, n)
        return out, has_ctx

    def _teacher_prompts(self, groups: list[Group], table: StepTable) -> tuple[list, list[Optional[list[int]]]]:
        """The privileged context and teacher prompt ids of each row of ``table`` (None: no
        context, or it does not fit); writes the teacher log when due.

        Contexts are built from all of ``groups`` (so the std filter does not change what a kept
        row's hindsight shows), then restricted to the kept rows ``table.index``.

        Raises:
            ValueError: ``table`` does not come from ``groups``.
        """
        sc = self.cfg.algorithm.serl
        keep = table.index.tolist()
        contexts, triples = self.context_builder.build(groups), list(iter_steps(groups))
        contexts, triples = [contexts[i] for i in keep], [triples[i] for i in keep]
        if len(triples) != len(table):
            raise ValueError(f"{len(table)} rows but {len(triples)} selected rows of the groups")
        cap = sc.max_reprompt_len or self.cfg.data.max_prompt_length
        t_prompts: list[Optional[list[int]]] = []
        for s, ctx in zip(table.rows, contexts):
            ids, ok = (None, False) if ctx is None else teacher_prompt_ids(
                self.tokenizer, s.prompt, ctx.block(), cap, sc.reprompt_truncation)
            t_prompts.append(ids if ok else None)
        self._row_contexts = [c if tp is not None else None for c, tp in zip(contexts, t_prompts)]
        if self.teacher_log.should_write(self.iteration + 1):
            self.teacher_log.write(self.iteration + 1, [
                teacher_log_row(g, t, s, ctx if tp is not None else None, mode=sc.sampling_mode,
                                teacher_prompt=self.tokenizer.decode(tp) if tp is not None else None)
                for (g, t, s), ctx, tp in zip(triples, contexts, t_prompts)])
        return contexts, t_prompts

    def _write_trace(self, groups: list[Group], table: StepTable, adv: torch.Tensor, batch: UpdateBatch) -> None:
        """Write the sampled, bounded trajectory trace of this iteration (:class:`TraceWriter`): whole
        trajectories of the trained rows with token spans, advantages (``adv`` ``[rows]``) and, with
        SERL, each token's weight W (after the update: ``batch.old_log_probs`` are all known)."""
        it = self.iteration + 1
        if not self.trace.should_write(it):
            return
        trajs = {t.traj_uid: t for g in groups for t in g.trajectories}
        sc, rows = self.cfg.algorithm.serl, []
        for i in trace_sample(table.traj_uids, it, self.trace.max_rows):
            s, trained = table.rows[i], bool(table.row_mask[i] > 0)
            serl = None
            if self.teacher is not None:
                t_lp = batch.teacher_log_probs[i] if batch.teacher_log_probs is not None else None
                ctx = self._row_contexts[i] if i < len(self._row_contexts) else None
                skipped = ctx is not None and t_lp is None  # a context, but the row trains nothing
                serl = serl_trace_fields(float(adv[i]), batch.old_log_probs[i], t_lp, s.action_mask, trained,
                                         batch.serl_lambda, sc.weight_clip, ctx, skipped)
            spans = token_char_spans(self.tokenizer, s.response_ids)
            rows.append(trace_row(trajs[table.traj_uids[i]], s, spans, float(adv[i]), trained, serl))
        self.trace.write(it, rows)

    def _serl_metrics(self, rows: list[Step], contexts: list, has_ctx: list[bool]) -> dict[str, float]:
        """Driver-side SERL metrics of the iteration (the context builder's, plus context and
        action-token fractions)."""
        n, n_ctx = len(rows), sum(has_ctx)
        metrics = dict(self.context_builder.metrics())
        metrics.update({
            "serl/teacher_inactive_after_decay": 0.0,
            # after length capping: rows whose context did not fit at all train as plain GRPO
            "serl/reprompt_sample_fraction": n_ctx / max(1, n),
            "serl/action_token_fraction": sum(sum(s.action_mask) for s in rows) / max(1, sum(len(s.response_ids) for s in rows)),
        })
        if n_ctx:
            metrics["serl/action_parse_failure_fraction"] = sum(
                1 for s, h in zip(rows, has_ctx) if h and not any(s.action_mask)) / n_ctx
        metrics["serl/context_dropped_by_length_fraction"] = sum(
            1 for c, h in zip(contexts, has_ctx) if c is not None and not h) / max(1, n)
        return metrics

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device, dtype=self.autocast_dtype)

    def _update(self, batch: UpdateBatch, replay: Sequence[ReplayRow] = (), step: Optional[int] = None
                ) -> dict[str, float]:
        """PPO update: per epoch the on-policy mini-batches of ``batch``, then SPEAR's replay
        mini-batches of ``replay`` (never mixed with them); one optimizer step per mini-batch,
        gradient accumulation over micro-batches.

        Args:
            batch: the on-policy rows; on return every row's ``old_log_probs`` is set (the
                behaviour log-probs, which SPEAR stores for the replay ratio).
            replay: the replay rows of this step (may be empty).
            step: the global step of the replay coefficient γ_t (default: the next iteration).

        Returns:
            The ``actor/*``, ``serl_action_mask/*`` and ``replay/*`` metrics, averaged.
        """
        a = self.cfg.actor
        self._precompute_old_logprobs(batch)
        s = self.cfg.algorithm.spear
        gamma_t = replay_coef(self.iteration + 1 if step is None else step, s.replay_loss_coef,
                              s.max_replay_loss_steps) if replay else 0.0
        replay_batch = UpdateBatch.from_replay_rows(list(replay), gamma_t)
        self.train_model.train()
        self.grad_ckpt.begin()
        means = MetricMeans()
        for _ in range(a.ppo_epochs):
            for part in (batch, replay_batch):
                for mini in part.split(a.ppo_mini_batch_size):
                    self.optimizer.zero_grad(set_to_none=True)
                    self._accumulate_gradients(part, mini, means)
                    means.add(self._optimizer_step(part.prefix))
        self.train_model.eval()
        metrics = self.dist.reduce_means(means)  # N > 1: over every rank's micro-steps
        metrics.update(self.grad_ckpt.metrics())
        if replay:
            metrics.update({"replay/coef": gamma_t, "replay/rows": float(len(replay))})
        return metrics

    def _accumulate_gradients(self, part: UpdateBatch, mini: UpdateBatch, means: MetricMeans) -> None:
        """Forward/backward of this rank's micro-batches of ``mini`` (all of them with one process;
        with N ranks micro-batch ``k`` runs on rank ``k mod N``, :func:`deal_micro_batches`); the
        gradients are all-reduced on the last micro-step only (DDP ``no_sync`` before). Records
        the old log-probs used in ``part`` and the micro-step metrics in ``means``."""
        plan = deal_micro_batches(self._micro_batches(mini), self.dist.rank, self.dist.world_size)
        for k, (micro, weight) in enumerate(plan):
            with self.dist.sync_context(self.train_model, sync=k == len(plan) - 1):
                m, old = self._micro_step(micro, len(mini), weight)
            if weight:
                part.fill_old_log_probs(micro.index, old)
                means.add(m)

    def _micro_batches(self, mini: UpdateBatch) -> list[UpdateBatch]:
        """The micro-batches of one mini-batch: consecutive rows of ``actor.ppo_micro_batch_size``,
        or with ``actor.use_dynamic_bsz`` rows grouped by length within the token budget
        ``actor.ppo_max_token_len_per_gpu`` (:func:`~serl.train.batch.length_buckets`)."""
        a = self.cfg.actor
        if not a.use_dynamic_bsz:
            return mini.split(a.ppo_micro_batch_size)
        lengths = [len(p) + len(r) for p, r in zip(mini.prompt_ids, mini.response_ids)]
        return [mini.select(idx) for idx in length_buckets(lengths, a.ppo_micro_batch_size, a.ppo_max_token_len_per_gpu)]

    def _precompute_old_logprobs(self, batch: UpdateBatch) -> None:
        """Behaviour log-probs, before any optimizer step, of the rows outside the first
        mini-batch (of every row with ``algorithm.serl.student_logprob=old`` or N > 1); the first
        mini-batch's are its detached current log-probs, taken in the micro-step."""
        # N > 1: all rows (a rank runs only some micro-batches, but every rank needs every row's)
        first = 0 if self.cfg.algorithm.serl.student_logprob == "old" or self.dist.enabled \
            else self.cfg.actor.ppo_mini_batch_size
        targets = list(range(first, len(batch)))
        if targets:
            self.policy.eval()
            batch.fill_old_log_probs(targets, self._score(self.policy, batch.select(targets), autocast=True))

    def _optimizer_step(self, prefix: str) -> dict[str, float]:
        """Clip the gradient norm to ``actor.grad_clip`` and step; a non-finite norm skips the step."""
        grad_norm = self.dist.clip_grad_norm(self.policy.parameters(), self.cfg.actor.grad_clip)
        if not torch.isfinite(grad_norm):
            log.warning("non-finite grad norm %s: skipping this optimizer step", grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        return {f"{prefix}/grad_norm": grad_norm.item(), f"{prefix}/lr": self.optimizer.param_groups[0]["lr"]}

    def _micro_step(self, micro: UpdateBatch, mini_rows: int, weight: float = 1.0
                    ) -> tuple[dict[str, float], list[torch.Tensor]]:
        """Forward/backward of one micro-batch, on-policy or SPEAR replay (the batch says which).

        loss = weight · loss_coef · len(micro)/mini_rows · N · [policy_loss(logπ_old, logπ, A·W, m)
        − entropy_coeff·agg(H, m) + kl_loss_coef·agg(KL(π‖π_ref), m)]: ``m`` = response mask ×
        the row's mask (Dr.BoT / stored), ``A`` the token advantages, ``W`` SERL's weights (rows
        with teacher log-probs), the KL term only for rows with reference log-probs; a replay
        batch uses the ``*_replay`` loss parameters and γ_t as ``loss_coef``. Tensors ``[b, R]``.
        ``N`` = the number of processes (DDP then averages the ranks' gradients:
        :func:`~serl.train.distributed.micro_loss_scale`); ``weight`` 0 = a padding micro-step.

        Returns:
            ``(metrics, old)``: the metrics under ``micro.prefix``, and per row the old log-probs
            used (the detached current ones where the batch had none).
        """
        a = self.cfg.actor
        b = micro.collate(self.tokenizer.pad_token_id).to(self.device)
        R = b.responses.shape[1]
        self.grad_ckpt.select(*b.input_ids.shape, logit_positions=int(b.response_mask.sum()))
        with self._autocast():  # through the DDP wrapper with N > 1 (its hooks all-reduce the gradients)
            lp, ent = response_logprobs(self.train_model, b, self.cfg.rollout.temperature, with_entropy=a.entropy_coeff != 0,
                                        remove_padding=self.cfg.model.use_remove_padding)
        lp = lp.float()
        old_rows = [o if o is not None else lp[j, : len(r)].detach().cpu()
                    for j, (o, r) in enumerate(zip(micro.old_log_probs, micro.response_ids))]
        old = pad_rows(old_rows, R).to(self.device)
        mask = b.response_mask * micro.padded("response_masks", R).to(self.device)
        adv_tok = micro.padded("advantages", R).to(self.device) * mask
        metrics: dict[str, float] = {}
        if micro.teacher_log_probs is not None:
            adv_tok = self._serl_weighted(micro, b, adv_tok, mask, lp, old, metrics)
        loss = self._loss(micro, lp, ent, old, adv_tok, mask, metrics)
        scale = micro_loss_scale(len(micro), mini_rows, self.dist.world_size)
        self.dist.backward(loss * (scale * weight) * micro.loss_coef)
        return metrics, old_rows

    def _loss(self, micro: UpdateBatch, lp: torch.Tensor, ent: Optional[torch.Tensor], old: torch.Tensor,
              adv_tok: torch.Tensor, mask: torch.Tensor, metrics: dict[str, float]) -> torch.Tensor:
        """The micro-batch loss before scaling (see :meth:`_micro_step`); adds its metrics."""
        a, p = self.cfg.actor, micro.prefix
        pg_loss, pg_m = self.loss_fn(old, lp, adv_tok, mask, self.loss_cfgs[p])
        loss = pg_loss
        if ent is not None:
            ent_loss = agg_loss(ent.float(), mask, a.loss_agg_mode, loss_scale_factor=a.loss_scale_factor)
            loss = loss - a.entropy_coeff * ent_loss
            metrics[f"{p}/entropy"] = ent_loss.item()
        if micro.ref_log_probs is not None:
            ref = micro.padded("ref_log_probs", lp.shape[1]).to(self.device)
            kl = kl_loss(lp, ref, mask, a.kl_loss_type, a.loss_agg_mode, loss_scale_factor=a.loss_scale_factor)
            loss = loss + a.kl_loss_coef * kl
            metrics.update({f"{p}/kl_loss": kl.item(), f"{p}/kl_coef": a.kl_loss_coef})
        metrics[f"{p}/pg_loss"] = pg_loss.item()
        metrics.update({f"{p}/{k}": v for k, v in pg_m.items()})
        return loss

    def _serl_weighted(self, micro: UpdateBatch, b: RowBatch, adv_tok: torch.Tensor, mask: torch.Tensor,
                       lp: torch.Tensor, old: torch.Tensor, metrics: dict[str, float]) -> torch.Tensor:
        """``adv_tok`` ``[b, R]`` times SERL's selective token weights W on the action tokens of
        rows with teacher log-probs (arXiv 2605.19447; ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/core_algos.py``);
        unchanged when λ_eff = 0 or no row has them. Adds the ``serl_action_mask/*`` metrics."""
        sc, lam = self.cfg.algorithm.serl, micro.serl_lambda
        metrics["serl_action_mask/effective_lambda"] = lam
        # rows the teacher scored: those with a context, less the ones that train nothing when
        # algorithm.serl.skip_zero_advantage_rows (their W would be 1: sign(A) = 0 or masked)
        scored_rows = torch.tensor([t is not None for t in micro.teacher_log_probs], device=self.device)
        if not (lam > 0 and bool(scored_rows.any())):
            metrics.update({"serl_action_mask/weight_mean": 1.0, "serl_action_mask/empty_target_batch": 1.0})
            return adv_tok
        student = old if sc.student_logprob == "old" else lp.detach()
        selected = mask.bool() & scored_rows.unsqueeze(-1) & b.action_mask.bool()
        teacher = micro.padded("teacher_log_probs", lp.shape[1]).to(self.device)
        W, wm = serl_token_weights(adv_tok, student, teacher, selected, lam, sc.weight_clip)
        scored_tokens = (mask * scored_rows.unsqueeze(-1)).sum().clamp_min(1)
        wm["selected_fraction"] = (selected.sum() / scored_tokens).item()
        metrics.update({f"serl_action_mask/{k}": v for k, v in wm.items()})
        return adv_tok * W

    # ------------------------------------------------------------------ loop
    def train(self) -> dict[str, float]:
        """Train until ``trainer.total_training_steps``; checkpoint every ``save_freq`` iterations
        and at the end. Returns the last iteration's metrics. With N > 1 processes only rank 0
        evaluates (``trainer.test_freq``), shows progress and writes ``last_rollout.jsonl``."""
        from tqdm.auto import tqdm

        c, main = self.cfg.trainer, self.dist.is_main
        last: dict[str, float] = {}
        try:
            if c.val_before_train and self.iteration == 0 and main:
                self._log_eval(0)
            with tqdm(total=c.total_training_steps, initial=self.iteration, desc="serl train", unit="it",
                      disable=not (c.progress and main), file=sys.stderr, dynamic_ncols=True) as pbar:
                while self.iteration < c.total_training_steps:
                    last = self.train_iteration(pbar)
                    self.logger.log(self.iteration, last)
                    if c.test_freq > 0 and self.iteration % c.test_freq == 0 and main:
                        last.update(self._log_eval(self.iteration))
                    done = self.iteration >= c.total_training_steps
                    if done or (c.save_freq > 0 and self.iteration % c.save_freq == 0):
                        self.save()
                    pbar.update(1)
                    pbar.set_postfix_str(f"success {last.get('episode/success_rate', 0):.2f}")
            if self._last_groups_exist() and main:
                write_jsonl(self.run_dir / "last_rollout.jsonl",
                            [t for g in self._last_groups for t in g.trajectories])
        finally:
            self.close()
        return last

    def _last_groups_exist(self) -> bool:
        return bool(getattr(self, "_last_groups", None))

    def _log_eval(self, iteration: int) -> dict[str, float]:
        res = self.evaluate(self.cfg.env.eval_split, self.cfg.env.eval_num_tasks)
        m = {f"val/{k}": v for k, v in res["metrics"].items()}
        self.logger.log(iteration, m)
        return m

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, split: str, num_tasks: int = -1, greedy: bool = False, seed: Optional[int] = None,
                 progress: bool = True) -> dict[str, Any]:
        """Play each task of ``split`` once with the current policy; returns
        ``{"metrics": {success_rate, <type>_success_rate, ...}, "trajectories": [...]}``."""
        return evaluate_policy(self.cfg, self.engine, self.tokenizer, split, num_tasks, greedy,
                               self.cfg.seed if seed is None else seed, progress)

    def close(self) -> None:
        """Stop the env workers, close the judge client and the metric sinks, release the run
        folder's lock (rank 0's)."""
        try:
            if self.pool is not None:
                self.pool.close()
                self.pool = None
            if self.context_builder is not None:
                self.context_builder.close()
            self.logger.close()
        finally:
            self._release_run_dir()


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


def evaluate_policy(cfg: Config, engine, tokenizer, split: str, num_tasks: int = -1, greedy: bool = False,
                    seed: Optional[int] = 0, progress: bool = True) -> dict[str, Any]:
    """Success rate overall and per task type on ``split``, one episode per task (G = 1).

    ``num_tasks >= 0`` evaluates a fixed subset taken round-robin over task types
    (:func:`eval_subset`). Tasks are played in chunks of ``rollout.micro_batch_size`` envs.
    Sampling is greedy or seeded (``seed`` reseeds torch before each chunk), so a run is
    reproducible.
    """
    from tqdm.auto import tqdm

    tasks = eval_subset(list_tasks(cfg, split), num_tasks)
    chunk = max(1, min(cfg.rollout.micro_batch_size, len(tasks)))
    trajs: list[Trajectory] = []
    pool = make_pool(cfg, chunk)
    try:
        collector = Collector(pool, engine, tokenizer, cfg.env.name, cfg.env.history_length, cfg.env.max_steps,
                              cfg.data.max_prompt_length)
        r = cfg.rollout
        with tqdm(total=len(tasks), desc=f"serl eval {split}", unit="task", disable=not progress,
                  file=sys.stderr, dynamic_ncols=True) as bar:
            for k in range(0, len(tasks), chunk):
                part = tasks[k : k + chunk]
                padded = part + [part[-1]] * (chunk - len(part))  # the pool has a fixed size
                params = SamplingParams(max_new_tokens=cfg.data.max_response_length, temperature=r.val_temperature,
                                        top_p=r.top_p, top_k=r.top_k, do_sample=r.val_do_sample and not greedy,
                                        seed=None if seed is None else seed + k)
                def step_progress(step, active, _bar=bar):
                    _bar.set_postfix_str(f"step {step}/{cfg.env.max_steps}, {active} active")

                groups = collector.collect(padded, 1, params, step_progress)
                trajs.extend(g.trajectories[0] for g in groups[: len(part)])
                bar.update(len(part))
    finally:
        pool.close()
    steps = [s for t in trajs for s in t.steps]
    metrics = {"success_rate": sum(t.won for t in trajs) / max(1, len(trajs)), "num_tasks": len(trajs),
               "valid_action_ratio": sum(s.action_valid for s in steps) / max(1, len(steps)),
               "admissible_action_ratio": sum(s.action in s.admissible_actions for s in steps) / max(1, len(steps))}
    metrics.update({f"{k}_success_rate": v for k, v in success_by_type(trajs).items()})
    metrics.update(get_env_class(cfg.env.name).episode_metrics(trajs))
    return {"metrics": metrics, "trajectories": trajs}


def load_run_config(run_dir: Path, overrides: list[str] | None = None) -> Config:
    """The config saved in ``<run_dir>/config.yaml`` with optional dotted overrides."""
    from omegaconf import OmegaConf

    import yaml
    from omegaconf.errors import OmegaConfBaseException

    p = Path(run_dir) / "config.yaml"
    if not p.exists():
        raise FileNotFoundError(f"{p} not found: is {run_dir} a serl run folder?")
    text = p.read_text()
    if overrides:
        try:
            merged = OmegaConf.merge(OmegaConf.create(text), OmegaConf.from_dotlist(list(overrides)))
        except (yaml.YAMLError, OmegaConfBaseException) as e:
            raise ConfigError(f"{p} with overrides {list(overrides)}: {str(e).splitlines()[0]}") from None
        text = OmegaConf.to_yaml(merged)
    return config_from_yaml(text, source=str(p))
