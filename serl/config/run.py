"""The ``trainer`` and ``sft`` sections and the top-level :class:`Config` with its cross-section
checks. Imports nothing from serl but :mod:`serl.errors` and the other :mod:`serl.config` modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Optional

from serl.config.algorithm import ActorConfig, AlgorithmConfig
from serl.config.model_env import DataConfig, EnvConfig, ModelConfig, RolloutConfig, _check

#: ``trainer.device`` values
DEVICES = ("auto", "cpu", "cuda")
#: ``trainer.logger`` sinks
LOGGERS = ("jsonl", "tensorboard", "console", "wandb")
#: ``trainer.strategy`` values
STRATEGIES = ("ddp", "fsdp")


@dataclass
class TrainerConfig:
    #: training iterations (verl "training steps": one rollout batch + one update each)
    total_training_steps: int = 150
    #: runs are written to ``<output_dir>/<run_name>``
    output_dir: str = "runs"
    #: None = ``<env>-<algorithm>-<timestamp>``
    run_name: Optional[str] = None
    #: checkpoint every this many iterations (and always at the end); 0 = only at the end
    save_freq: int = 1
    #: a new run (no ``--resume``) refuses an existing non-empty run folder; true = move that
    #: folder aside to ``<run_name>.old-<timestamp>`` first (never deletes it)
    overwrite: bool = False
    #: keep the newest this many checkpoints (0 = all)
    max_checkpoints_to_keep: int = 2
    #: evaluate every this many iterations (0 = never during training)
    test_freq: int = 0
    val_before_train: bool = False
    #: metric sinks: jsonl (``<run>/metrics.jsonl``, read by ``serl report``), tensorboard, console
    #: (one line per iteration on stderr), wandb (Weights & Biases; ``pip install serl[wandb]``;
    #: project ``trainer.project_name``, run ``run_name``; ``WANDB_MODE=offline`` works offline)
    logger: list = field(default_factory=lambda: ["jsonl", "tensorboard"])
    #: the W&B project (verl's key)
    project_name: str = "serl"
    #: record a trajectory trace for ``serl report`` every this many iterations (0 = off):
    #: ``<run>/trace/<iteration>.jsonl`` with replies, action-token spans, advantages and SERL's
    #: per-token weights of a sample of whole trajectories
    trace_freq: int = 1
    #: at most this many step rows per trace file (whole trajectories)
    trace_max_rows: int = 32
    #: cut observations, feedback and SERL contexts in the trace to this many characters
    trace_max_text_chars: int = 4000
    #: at most this many bytes per trace file (trajectories dropped from the end to fit)
    trace_max_bytes: int = 1_000_000
    #: torch threads; 0 = all cores
    num_threads: int = 0
    #: auto | cpu | cuda
    device: str = "auto"
    #: show tqdm progress bars
    progress: bool = True
    #: training processes (data parallel, accelerate): 1 = one process, or as many as
    #: ``accelerate launch --num_processes N -m serl.cli train`` started; N > 1 = ``serl train``
    #: re-launches itself with ``accelerate launch --num_processes N`` (``data.train_batch_size``
    #: must be a multiple of N; a resume needs the same N)
    num_processes: int = 1
    #: how N processes share the update: ddp (each rank a full copy of the model, gradients
    #: all-reduced) or fsdp (the policy's parameters, gradients and AdamW state sharded over the
    #: ranks with torch's FSDP2 ``fully_shard``; the rollout copy, teacher and reference stay
    #: full; not with LoRA; with one process fsdp runs as one process, with a warning).
    #: docs/scaling.md, "Multi-process training"
    strategy: str = "ddp"
    #: activation memory (GiB) a micro-batch may use without checkpointing under
    #: ``model.gradient_checkpointing=auto`` (per process); null = half the memory available at
    #: the start of each update (CPU: RAM, CUDA: free device memory), shared by this machine's processes
    activation_memory_gb: Optional[float] = None

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``trainer.<key>``: negative step counts, an unknown
        device, logger or strategy, ``num_processes`` < 1, trace bounds out of range, or a ``run_name`` that would leave ``output_dir`` (absolute, ``..``
        or a path separator)."""
        _check(self.total_training_steps >= 0, "trainer.total_training_steps", "must be >= 0")
        _check(self.save_freq >= 0, "trainer.save_freq", "must be >= 0 (0 = only at the end)")
        _check(self.max_checkpoints_to_keep >= 0, "trainer.max_checkpoints_to_keep", "must be >= 0 (0 = all)")
        _check(self.test_freq >= 0, "trainer.test_freq", "must be >= 0 (0 = never during training)")
        _check(self.num_threads >= 0, "trainer.num_threads", "must be >= 0 (0 = all cores)")
        _check(self.trace_freq >= 0, "trainer.trace_freq", "must be >= 0 (0 = off)")
        _check(self.trace_max_rows >= 1, "trainer.trace_max_rows", "must be >= 1 (turn the trace off with trace_freq=0)")
        _check(self.trace_max_text_chars >= 100, "trainer.trace_max_text_chars", "must be >= 100")
        _check(self.trace_max_bytes >= 10_000, "trainer.trace_max_bytes", "must be >= 10000")
        _check(bool(self.project_name), "trainer.project_name", "must be a non-empty name")
        _check(self.device in DEVICES, "trainer.device", f"unknown device {self.device!r}; valid: {list(DEVICES)}")
        _check(self.num_processes >= 1, "trainer.num_processes", "must be >= 1")
        _check(self.activation_memory_gb is None or (math.isfinite(self.activation_memory_gb)
                                                     and self.activation_memory_gb > 0),
               "trainer.activation_memory_gb", "must be > 0 GiB, or null (half the available memory)")
        _check(self.strategy in STRATEGIES, "trainer.strategy",
               f"unknown strategy {self.strategy!r}; valid: {list(STRATEGIES)}")
        for lg in self.logger:
            _check(lg in LOGGERS, "trainer.logger", f"unknown logger {lg!r}; valid: {', '.join(LOGGERS)}")
        if self.run_name:
            name = self.run_name
            _check(not (PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()),
                   "trainer.run_name", f"must be a folder name, not an absolute path: {name!r}")
            _check(name != "." and ".." not in name and "/" not in name and "\\" not in name, "trainer.run_name",
                   f"must be a single folder name inside trainer.output_dir (no '..', '/' or '\\'): {name!r}")


@dataclass
class SFTConfig:
    """Supervised fine-tuning on expert step rows (``serl sft``; see :mod:`serl.train.sft`).

    The loss is the token-mean cross-entropy of the reply tokens of one optimizer batch. Prompt
    and reply lengths come from ``data.max_prompt_length`` / ``data.max_response_length``, the
    model and its dtype from ``model.*``, the run folder from ``trainer.output_dir`` /
    ``trainer.run_name``, like ``serl train``.
    """

    #: JSONL of expert rows (``serl data expert``); ``serl sft --data FILE`` sets it
    data: Optional[str] = None
    #: optional held-out JSONL: ``val/loss``, ``val/token_accuracy`` and ``val/reply_exact`` on it
    #: every ``eval_freq`` steps (:meth:`serl.train.sft.SFTTrainer.evaluate`)
    val_data: Optional[str] = None
    #: passes over the rows
    epochs: int = 2
    #: > 0: stop after this many optimizer steps (overrides ``epochs``); -1 = run all epochs;
    #: 0 = no optimizer step (with ``eval_on_start``: only evaluate the start model, write no model)
    max_steps: int = -1
    #: peak learning rate; None = 2e-5 for full fine-tuning, 2e-4 with LoRA
    lr: Optional[float] = None
    #: AdamW decoupled weight decay
    weight_decay: float = 0.0
    #: rows per optimizer step (the last step of an epoch may hold fewer)
    batch_size: int = 8
    #: rows per forward/backward; gradients accumulate over ``batch_size / micro_batch_size``
    #: micro-batches (the loss is normalised by the step's reply tokens, so the result does
    #: not depend on it, up to float rounding)
    micro_batch_size: int = 2
    #: linear warm-up from 0 over this many optimizer steps
    warmup_steps: int = 2
    #: after warm-up: constant | cosine (to 0 at the last step)
    lr_scheduler: str = "cosine"
    #: clip the global gradient L2 norm to this (0 = no clipping)
    max_grad_norm: float = 1.0
    #: seed of the row order (reshuffled each epoch with ``seed + epoch``), LoRA init and dropout
    seed: int = 0
    #: checkpoint every this many optimizer steps (and always at the end); 0 = only at the end
    save_freq: int = 50
    #: write metrics every this many optimizer steps
    log_freq: int = 1
    #: held-out metrics every this many optimizer steps (and at the end); 0 = only at the end
    eval_freq: int = 0
    #: also evaluate before this call's first step (the start model, or a resumed checkpoint's),
    #: logged at that step (Hugging Face ``TrainingArguments.eval_on_start``)
    eval_on_start: bool = False
    #: also write the LoRA adapter alone to ``<run>/adapter`` (float32; 9.8 MB for SmolLM2-135M at r=8)
    save_adapter: bool = True

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming the bad ``sft.*`` key."""
        checks = [
            (self.epochs >= 1, "sft.epochs", "must be >= 1"),
            (self.max_steps >= -1, "sft.max_steps", "must be -1 (all epochs), 0 (evaluate only) or >= 1"),
            (self.lr is None or (math.isfinite(self.lr) and self.lr > 0), "sft.lr",
             "must be finite and > 0 (or null for the default)"),
            (self.weight_decay >= 0, "sft.weight_decay", "must be >= 0"),
            (self.batch_size >= 1, "sft.batch_size", "must be >= 1"),
            (self.micro_batch_size >= 1, "sft.micro_batch_size", "must be >= 1"),
            (self.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0"),
            (self.lr_scheduler in ("constant", "cosine"), "sft.lr_scheduler", "constant | cosine"),
            (self.max_grad_norm >= 0, "sft.max_grad_norm", "must be >= 0 (0 = no clipping)"),
            (self.save_freq >= 0, "sft.save_freq", "must be >= 0"),
            (self.log_freq >= 1, "sft.log_freq", "must be >= 1"),
            (self.eval_freq >= 0, "sft.eval_freq", "must be >= 0"),
            (self.max_steps != 0 or (self.eval_on_start and bool(self.val_data)), "sft.max_steps",
             "0 takes no step, so it needs sft.val_data and sft.eval_on_start=true (an evaluation of the start model)"),
        ]
        for ok, key, msg in checks:
            _check(ok, key, msg)


@dataclass
class Config:
    """Top-level serl config; see the section classes for every key."""

    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    #: ``serl sft`` (supervised fine-tuning); unused by ``serl train``
    sft: SFTConfig = field(default_factory=SFTConfig)

    def validate(self) -> None:
        """Validate every section (each names its keys), then the checks that span sections.
        Structural checks only: :func:`serl.configure.check_config` adds the registries' checks
        of the names that select an implementation.

        Raises:
            ConfigError: the first invalid value, naming its full dotted key.
        """
        _check(0 <= self.seed < 2**32, "seed", f"must be in [0, 2**32) (numpy's seed range), got {self.seed}")
        for section in (self.model, self.env, self.data, self.rollout, self.actor, self.algorithm, self.trainer,
                        self.sft):
            section.validate()
        # Checks that span sections go here, after the sections.
        n = self.trainer.num_processes
        _check(self.data.train_batch_size % n == 0, "data.train_batch_size",
               f"{self.data.train_batch_size} task groups cannot be split over trainer.num_processes={n} "
               f"processes (each plays whole groups); make it a multiple of {n}")
        if self.actor.skip_zero_advantage_rows:
            _check(n == 1, "actor.skip_zero_advantage_rows",
                   f"runs in one process only (trainer.num_processes={n}: every rank must run its micro-steps)")
            _check(not self.algorithm.spear.enable_trajectory_replay, "actor.skip_zero_advantage_rows",
                   "cannot run with algorithm.spear.enable_trajectory_replay (the replay buffer stores every "
                   "row's old log-probs, which the skip does not compute)")
        if self.algorithm.filter_groups.enable:
            _check(self.env.rollout.n >= 2, "algorithm.filter_groups.enable",
                   f"needs env.rollout.n >= 2 (got {self.env.rollout.n}): a group of one episode has no spread to filter on")
            _check(n == 1 or self.algorithm.filter_groups.trim, "algorithm.filter_groups.trim",
                   f"must be true with trainer.num_processes={n} (every rank needs the same number of groups)")
        _check(not (self.trainer.strategy == "fsdp" and self.model.lora.r > 0), "trainer.strategy",
               "fsdp does not support LoRA (model.lora.r > 0): the LoRA policy is its own rollout model, which "
               "must not be sharded; use trainer.strategy=ddp (LoRA's optimizer state is small anyway)")
