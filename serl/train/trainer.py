"""The training loop: rollout → rows → advantages → SERL teacher pass → update (+ SPEAR replay)
→ sync → log → checkpoint → eval.

One iteration reads top to bottom in :meth:`Trainer.train_iteration`, in the order of SPEAR's
hybrid trainer (arXiv 2509.22601; ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/ray_trainer_hybrid.py``
``fit``; ``step`` = the 1-based global step, verl's ``global_steps``); :meth:`Trainer.train`
repeats it with logging, checkpoints and evaluation. Each phase is a call into the module that
owns its concept:

==================================  =====================================================
phase                               module
==================================  =====================================================
envs and the rollout                :mod:`serl.train.collect` (turn loop: :mod:`serl.rollout`)
rows, filters, advantages           :mod:`serl.train.rows` (estimators: :mod:`serl.algos`)
SPEAR replay in and out             :mod:`serl.train.replay`
SERL's teacher pass                 :mod:`serl.train.serl_pass`
frozen-model log-probs              :mod:`serl.train.scoring`
the update                          :mod:`serl.train.update`
models, rollout copy sync           :mod:`serl.train.models`
resumable state                     :mod:`serl.train.state`
checkpoints, run folder             :mod:`serl.train.checkpoint`, :mod:`serl.train.run_dir`
processes                           :mod:`serl.train.distributed`
evaluation                          :mod:`serl.train.evaluate`
==================================  =====================================================

Departures from the original, all documented in docs/concepts/serl.md ("Deviations"): no duplicated padding
rows, action masks on sampled ids, teacher-prompt truncation keeps the chat template's end,
the teacher and λ schedule are checkpointed, and the old log-probs of the first mini-batch
are the detached current log-probs (exact: no parameter has changed yet), which saves one
forward pass over those rows.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from serl.algos.advantages import get_advantage_fn
from serl.algos.selective_weights import teacher_needs_sync
from serl.algos.spear import ReplayBuffer
from serl.config import Config, to_yaml
from serl.errors import CheckpointError
from serl.hindsight.builder import SerlContextBuilder
from serl.models.loading import pick_device
from serl.models.teacher import Teacher
from serl.rollout.engine import engine_options, logprob_gap_metrics, make_engine
from serl.train.batch import UpdateBatch
from serl.train.checkpoint import check_resumable, load_checkpoint, load_newest_intact, remove_stale_tmp_dirs, rng_state, save_checkpoint, set_rng_state
from serl.train.collect import TrainRollout
from serl.train.distributed import WORLD_SIZE_KEY, Distributed, check_checkpoint_world_size
from serl.train import env_pool
from serl.train.env_pool import list_tasks
from serl.train.evaluate import evaluate_policy
from serl.train.grad_ckpt import GradCheckpointing
from serl.train.metrics import MetricsLogger, rollout_metrics
from serl.train.models import PolicyModels, load_models
from serl.train.packing import pack_conversations, unpack_to_steps
from serl.train.replay import store_replay_rows, take_replay_batch
from serl.train.rows import compute_advantages, filter_rows, step_table
from serl.train.run_dir import RunLock, check_run_dir, create_run_dir
from serl.train.scoring import Scorer
from serl.train.serl_pass import SerlTeacherPass
from serl.train.state import TaskSampler, TrainState
from serl.train.teacher_log import TeacherLogWriter, TraceWriter, write_iteration_trace
from serl.train.update import PolicyUpdate, make_adamw
from serl.trajectory import write_jsonl
from serl.utils import atomic_write_text, configure_cpu_threads, cpu_kind, fix_mmap_threshold, mmap_threshold_for, set_seed

log = logging.getLogger(__name__)


def sampled_token_log_probs(rows, trainer_log_probs):
    """``(engine, trainer)`` log-probs of the tokens the engine sampled, row by row, for
    :func:`~serl.rollout.engine.logprob_gap_metrics`: a row with a ``loss_mask`` (tool outputs in
    it) keeps only its mask-1 positions; a row without engine log-probs gives ``None``."""
    eng, tr = [], []
    for s, lp in zip(rows, trainer_log_probs):
        if s.loss_mask is None or s.rollout_log_probs is None or lp is None:
            eng.append(s.rollout_log_probs)
            tr.append(lp)
            continue
        keep = torch.tensor(s.trained_mask(), dtype=torch.bool)
        eng.append([x for x, m in zip(s.rollout_log_probs, s.loss_mask) if m])
        tr.append(lp.reshape(-1)[keep])
    return eng, tr


def default_run_name(cfg: Config) -> str:
    algo = cfg.algorithm.adv_estimator + ("-serl" if cfg.algorithm.serl.enable else "")
    return f"{cfg.env.name}-{algo}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


class Trainer:
    """One training run: its models, envs, state and run folder, and the loop over them.

    The run folder (:mod:`serl.train.run_dir`): a new run checks it before any model loads
    (refusing a non-empty one unless ``trainer.overwrite``) and creates and locks it only once
    the models, envs and tasks are ready; a resumed run locks it first. The lock is held until
    :meth:`close`.

    Args:
        cfg: the resolved config.
        run_dir: the run folder; None = ``<trainer.output_dir>/<run_name>``.
        resume: restore the newest intact checkpoint of ``run_dir``.

    Attributes:
        models: :class:`~serl.train.models.PolicyModels` (policy, rollout copy, teacher, reference).
        engine: the rollout engine (hf or vLLM) sampling from ``models.rollout_model``.
        state: :class:`~serl.train.state.TrainState`, everything a resume restores but the weights.
        rollout, scorer, update, serl: the phases (``serl`` None when SERL is off).

    Raises:
        SerlError: at start-up: :class:`~serl.errors.ModelLoadError`, :class:`~serl.errors.EnvError`,
            :class:`~serl.errors.ConfigError`, :class:`~serl.errors.CheckpointError`, or a
            :class:`~serl.errors.SerlError` when the run folder is locked by another process.
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

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict[str, float]:
        """Train until ``trainer.total_training_steps``; checkpoint every ``save_freq`` iterations
        and at the end. Returns the last iteration's metrics. With N > 1 processes only rank 0
        evaluates (``trainer.test_freq``), shows progress and writes ``last_rollout.jsonl``."""
        from tqdm.auto import tqdm

        c, main = self.cfg.trainer, self.dist.is_main
        last: dict[str, float] = {}
        try:
            if c.val_before_train and self.state.iteration == 0 and main:
                self._log_eval(0)
            with tqdm(total=c.total_training_steps, initial=self.state.iteration, desc="serl train", unit="it",
                      disable=not (c.progress and main), file=sys.stderr, dynamic_ncols=True) as pbar:
                while self.state.iteration < c.total_training_steps:
                    last = self.train_iteration(pbar)
                    self.logger.log(self.state.iteration, last)
                    if c.test_freq > 0 and self.state.iteration % c.test_freq == 0 and main:
                        last.update(self._log_eval(self.state.iteration))
                    done = self.state.iteration >= c.total_training_steps
                    if done or (c.save_freq > 0 and self.state.iteration % c.save_freq == 0):
                        self.save()
                    pbar.update(1)
                    pbar.set_postfix_str(f"success {last.get('episode/success_rate', 0):.2f}")
            if self.last_groups and main:
                write_jsonl(self.run_dir / "last_rollout.jsonl", [t for g in self.last_groups for t in g.trajectories])
        finally:
            self.close()
        return last

    def train_iteration(self, pbar=None) -> dict[str, float]:
        """One rollout and update; returns the iteration's metrics. The steps are SPEAR's ``fit``:

        1. rollout: ``train_batch_size`` tasks × ``env.rollout.n`` episodes (groups of trajectories);
        2. rows: one per step (in both prompt layouts), score = episode reward + SPEAR's tool-call
           bonus, GiGPO's step returns on all rows; the Dr.BoT response filters mask rows, the
           group std filter drops groups;
        3. advantages from the registry (``algorithm.adv_estimator``), after the invalid-action
           penalty;
        4. SPEAR: a full replay buffer becomes this step's replay batch;
        5. the update batch and the frozen models' log-probs: SERL's teacher (while λ_eff(u) > 0)
           on privileged prompts; with ``env.prompt_layout=conversation`` an episode's step rows
           packed into one row (:mod:`serl.train.packing`); the KL reference with
           ``actor.use_kl_loss``;
        6. the update: on-policy mini-batches, then the replay mini-batches;
        7. SPEAR: drop stale buffer entries, admit this step's positive-advantage rows; the trace;
        8. u += 1, the rollout copy and (every ``teacher_sync_interval`` updates) the teacher
           take the new weights.
        """
        cfg, st, m = self.cfg, self.state, self.models
        step = st.iteration + 1  # the 1-based global step of the schedules (verl's global_steps)
        t0 = time.time()

        # ---- 1. rollout (the next iteration's env resets start in the background)
        groups = self.rollout.collect(st, self.engine, m.tokenizer, pbar)
        timing = {"timing/rollout_s": time.time() - t0}
        metrics: dict[str, float] = {**rollout_metrics(groups), **self.rollout.last_metrics}

        # ---- 2. rows: scores, step returns, Dr.BoT response filters, group std filter
        table = filter_rows(step_table(groups, step, cfg), cfg, st.generator, metrics)

        # ---- 3. invalid-action penalty and advantages, one per row
        adv = compute_advantages(table, cfg, self.adv_fn, metrics)

        # ---- 4. SPEAR: a full buffer becomes this step's replay batch (and is emptied)
        replay = take_replay_batch(st.replay_buffer, st.generator, metrics)

        # ---- 5. the update batch and its frozen-model log-probs: SERL teacher (per step), then the
        #         conversation layout's steps packed into one row per episode, KL reference
        batch = UpdateBatch.from_steps(table.rows, adv, table.row_mask)
        t1 = time.time()
        if self.serl is not None:
            self.serl.run(batch, groups, table, adv, st.update_step, step, metrics, pbar)
        timing["timing/teacher_s"] = time.time() - t1
        train_batch, spans = pack_conversations(batch, table.traj_uids) if cfg.env.prompt_layout == "conversation" \
            else (batch, None)
        if m.ref is not None:
            train_batch.ref_log_probs = self.scorer.score(m.ref.model, train_batch, "reference", pbar)
        timing["timing/reference_s"] = time.time() - t1 - timing["timing/teacher_s"]

        # ---- 6. update: on-policy mini-batches, then replay mini-batches
        t2 = time.time()
        if pbar is not None:
            pbar.set_postfix_str(f"update on {len(train_batch)} rows" + (f" + {len(replay)} replay rows" if replay else ""))
        metrics.update(self.update.run(train_batch, replay, step))
        timing["timing/update_s"] = time.time() - t2
        if spans is not None:  # the behaviour (and reference) log-probs back onto the step rows
            for name in ("old_log_probs", "ref_log_probs"):
                unpack_to_steps(train_batch, batch, spans, name)
        metrics.update(logprob_gap_metrics(*sampled_token_log_probs(table.rows, batch.old_log_probs)))

        # ---- 7. SPEAR: drop stale entries, admit this step's positive-advantage rows; the trace
        store_replay_rows(st.replay_buffer, table, adv, batch.old_log_probs, step, metrics)
        t3 = time.time()
        write_iteration_trace(self.trace, m.tokenizer, step, groups, table, adv, batch,
                              cfg.algorithm.serl if self.serl else None, self.serl.row_contexts if self.serl else [])
        timing["timing/trace_s"] = time.time() - t3

        # ---- 8. u += 1, rollout-copy and teacher sync, iteration += 1
        st.update_step += 1
        self._sync_rollout_model()
        if m.teacher is not None and teacher_needs_sync(st.update_step, cfg.algorithm.serl.teacher_sync_interval):
            m.teacher.sync_from(self._full_policy())
            metrics["serl/teacher_synced"] = 1.0
        st.iteration += 1
        t_update = timing["timing/update_s"]
        train_tokens = sum(len(p) + len(r) for p, r in zip(train_batch.prompt_ids, train_batch.response_ids))
        metrics.update(timing)
        metrics.update({
            "timing/iteration_s": time.time() - t0, "training/update_step": st.update_step,
            "throughput/update_tokens_per_s": train_tokens / max(t_update, 1e-9),
            "throughput/update_tokens": train_tokens, "throughput/update_rows": len(train_batch),
            "throughput/response_tokens": sum(len(s.response_ids) for s in table.rows),
        })
        self.last_groups = groups
        return metrics

    def _log_eval(self, iteration: int) -> dict[str, float]:
        res = self.evaluate(self.cfg.env.eval_split, self.cfg.env.eval_num_tasks)
        m = {f"val/{k}": v for k, v in res["metrics"].items()}
        self.logger.log(iteration, m)
        return m

    def evaluate(self, split: str, num_tasks: int = -1, greedy: bool = False, seed: Optional[int] = None,
                 progress: bool = True) -> dict[str, Any]:
        """Play each task of ``split`` once with the current policy; returns
        ``{"metrics": {success_rate, <type>_success_rate, ...}, "trajectories": [...]}``."""
        return evaluate_policy(self.cfg, self.engine, self.models.tokenizer, split, num_tasks, greedy,
                               self.cfg.seed if seed is None else seed, progress)

    # ------------------------------------------------------------------ set-up
    def _check_run_dir(self, resume: bool) -> Optional[RunLock]:
        """Start-up checks of the run folder, before any model loads. Resume: the folder must
        exist; it is locked now and stale ``.tmp_*`` checkpoint folders are removed. New run:
        ``trainer.output_dir`` must be writable and the folder empty or absent (or
        ``trainer.overwrite``); nothing is written yet (see :meth:`_start`)."""
        if not self.dist.is_main:  # rank 0 alone checks, locks (and cleans): ranks probing one lock refuse each other
            if resume and not self.run_dir.is_dir():
                raise CheckpointError(f"cannot resume: {self.run_dir} is not a run folder")
            lock = None
        else:
            lock = check_run_dir(self.run_dir, resume, self.cfg.trainer.overwrite)
        if lock is not None:
            remove_stale_tmp_dirs(self.run_dir)
            if resume:  # some checkpoint has all its files, complete: before any model loads
                check_resumable(self.run_dir)
        self.dist.barrier()  # no rank reads a checkpoint while rank 0 cleans up / creates the folder
        return lock

    def _release_run_dir(self) -> None:
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _start(self, resume: bool) -> None:
        """Models, phases, state and tasks; then the new run's folder (created and locked) and its
        ``config.yaml``, the metric sinks, and a resume's checkpoint."""
        cfg = self.cfg
        configure_cpu_threads(cfg.trainer.num_threads)
        set_seed(cfg.seed)
        self.device = pick_device(cfg.trainer.device)
        env_notes = env_pool.preflight(cfg)  # e.g. the math env's sandbox: fails before any model loads
        for k, v in env_notes.items():
            print(f"serl: {k}: {v.splitlines()[0]}", file=sys.stderr)
        train_tasks = list_tasks(cfg, cfg.env.train_split)  # a missing data folder fails before the model loads
        self.models = m = load_models(cfg, self.device)
        sharing = self.dist.world_size if self.device == "cpu" else 1  # ranks sharing the RAM, or one GPU each
        self.grad_ckpt = GradCheckpointing(m.policy, cfg.model.gradient_checkpointing, cfg.trainer.activation_memory_gb,
                                           self.device, sharing, 2 if m.autocast_dtype else 4)
        context_builder = SerlContextBuilder(cfg.algorithm.serl) if m.teacher else None
        teacher_log = TeacherLogWriter(self.run_dir, cfg.algorithm.serl)
        self.trace = TraceWriter(self.run_dir, cfg.trainer)
        optimizer = make_adamw([p for p in m.policy.parameters() if p.requires_grad], cfg.actor.lr, cfg.actor.weight_decay)
        train_model, optimizer = self._prepare_distributed(optimizer, teacher_log)
        self.engine, engine_name = make_engine(cfg.rollout.engine, m.rollout_model, m.tokenizer,
                                               cfg.rollout.micro_batch_size, self.device,
                                               scores_continuations=cfg.rollout.action_selection == "score",
                                               **self._engine_options())
        self._announce(engine_name)
        self.scorer = Scorer(cfg, m.tokenizer.pad_token_id, self.device, self.dist, m.autocast)
        self.update = PolicyUpdate(cfg, m, train_model, optimizer, self.dist, self.grad_ckpt, self.scorer)
        self.serl = SerlTeacherPass(cfg, m.teacher, m.tokenizer, context_builder, teacher_log, self.scorer) \
            if m.teacher else None
        self.adv_fn = get_advantage_fn(cfg.algorithm.adv_estimator)
        self.state = TrainState(
            sampler=TaskSampler(train_tasks, cfg.seed),
            generator=torch.Generator().manual_seed(cfg.seed),  # std filter trim and replay draws
            replay_buffer=ReplayBuffer.from_config(cfg) if cfg.algorithm.spear.enable_trajectory_replay else None,
            context_builder=context_builder)
        self.rollout = TrainRollout(cfg, self.dist)
        self.last_groups: list = []
        if not resume and self.dist.is_main:  # every start-up check passed: now the folder may exist
            self._run_lock = create_run_dir(self.run_dir, cfg.trainer.overwrite)
            atomic_write_text(self.run_dir / "config.yaml", to_yaml(cfg))
        if env_notes and self.dist.is_main:  # what the env's start-up checks found (sandbox isolation)
            atomic_write_text(self.run_dir / "env_preflight.txt", "".join(f"[{k}]\n{v.rstrip()}\n" for k, v in env_notes.items()))
        sinks = cfg.trainer.logger if self.dist.is_main else []
        self.logger = MetricsLogger(self.run_dir, sinks, project=cfg.trainer.project_name,
                                    config=yaml.safe_load(to_yaml(cfg)) if "wandb" in sinks else None)
        if resume:
            self.resume()

    def _announce(self, engine_name: str) -> None:
        """Fix glibc's mmap threshold for a float32 update on CPU (:func:`serl.utils.mmap_threshold_for`;
        before the first update allocates) and print the engine, the CPU kind or GPU, the dtypes and
        that threshold to stderr."""
        m, cfg = self.models, self.cfg
        mmap = fix_mmap_threshold(mmap_threshold_for(self.device == "cpu" and m.autocast_dtype is None))
        print(f"serl: rollout engine {engine_name} (rollout.engine={cfg.rollout.engine}, device {self.device})",
              file=sys.stderr)
        where = cpu_kind() if self.device == "cpu" else f"{self.device}, {torch.cuda.get_device_name()}"
        print(f"serl: {where}; rollout/teacher dtype {str(m.infer_dtype).removeprefix('torch.')}, update "
              f"{'float32' if m.autocast_dtype is None else str(m.autocast_dtype).removeprefix('torch.') + ' autocast'}"
              + (f"; glibc mmap threshold {mmap / 2**20:g} MiB" if mmap else ""), file=sys.stderr)

    def _prepare_distributed(self, optimizer, teacher_log: TeacherLogWriter):
        """``(train_model, optimizer)``: the policy as the update's forward passes see it
        (DDP-wrapped by ``accelerator.prepare`` with N > 1; the policy itself with one process;
        same parameters). With N > 1: only rank 0 writes traces and teacher logs, and each rank
        samples rollouts with its own seed ``seed + rank`` (the models were loaded under ``seed``
        on every rank). FSDP (``trainer.strategy=fsdp``): the policy is sharded in place; the
        rollout model must not be (generation runs per rank for different numbers of decode
        steps, and each sharded forward is a collective), so a policy that is its own rollout
        model gets a full copy, taken before sharding (with LoRA the PEFT model, not a merged
        copy: ``rollout.merge_lora`` applies to unsharded runs)."""
        m = self.models
        if self.dist.sharded and (m.rollout_model is m.policy or m.lora_scalings is not None):
            m.rollout_model, m.lora_scalings = Teacher(m.policy, m.infer_dtype).model, None
        train_model, optimizer = self.dist.prepare(m.policy, optimizer)
        if self.dist.enabled:
            set_seed(self.cfg.seed + self.dist.rank)
            if not self.dist.is_main:
                teacher_log.enabled = False
                self.trace.every = 0
        return train_model, optimizer

    def _engine_options(self) -> dict[str, Any]:
        """The settings of the rollout engine (:func:`~serl.rollout.engine.engine_options`); a
        ``generate`` call carries this rank's episodes, or an evaluation's ``rollout.micro_batch_size``."""
        cfg = self.cfg
        episodes = cfg.data.train_batch_size // self.dist.world_size * cfg.env.rollout.n
        return engine_options(cfg.rollout, self.models.model_path, self.models.infer_dtype, self.device,
                              cfg.data.max_prompt_length + cfg.data.max_response_length, cfg.seed,
                              max(episodes, cfg.rollout.micro_batch_size))

    def _full_policy(self):
        """The policy with full parameters, as a module: the policy itself, or with FSDP its
        rollout copy (re-filled after every update, in the inference dtype, which is also the
        teacher's: copying from it equals copying from the policy)."""
        return self.models.rollout_model if self.dist.sharded else self.models.policy

    def _sync_rollout_model(self) -> None:
        self.models.sync_rollout_model(self.dist.full_parameters, self.engine)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``state.pt``: :meth:`TrainState.state_dict` plus the world size and,
        with N > 1, every rank's sampling RNG (collective: all ranks call it)."""
        state = self.state.state_dict()
        state[WORLD_SIZE_KEY] = self.dist.world_size
        if self.dist.enabled:
            state["rank_rng"] = self.dist.gather_one(rng_state())
        return state

    def save(self) -> Path:
        """Write a checkpoint (rank 0; the other ranks wait for it) and return its folder.
        With N > 1 every rank must call it (the state gathers each rank's RNG)."""
        policy, teacher = self.models.checkpointed()
        policy, optimizer = self.dist.checkpoint_state(policy, self.optimizer)  # FSDP: gathered to rank 0
        state = self.state_dict()
        path = None
        if self.dist.is_main:
            path = save_checkpoint(self.run_dir, self.state.iteration, policy, optimizer, state,
                                   teacher=teacher, keep=self.cfg.trainer.max_checkpoints_to_keep)
        return self.dist.gather_one(path)[0]  # also the barrier: rank 0 has written it

    def resume(self) -> None:
        """Restore the newest intact checkpoint (a damaged newer one is reported and skipped)."""
        policy, teacher = self.models.checkpointed()
        policy, optimizer = self.dist.checkpoint_loaders(policy, self.optimizer)  # FSDP: into the shards
        folder, state = load_newest_intact(
            self.run_dir, lambda f: load_checkpoint(f, policy, optimizer, teacher=teacher))
        check_checkpoint_world_size(state, self.dist.world_size, folder)
        if "rank_rng" in state:
            set_rng_state(state["rank_rng"][self.dist.rank])
        self.state.load_state_dict(state, str(folder))
        self._sync_rollout_model()
        if self.dist.is_main:
            self.logger.truncate_after(self.state.iteration)
        log.info("resumed %s at iteration %d (update %d)", folder, self.state.iteration, self.state.update_step)

    def close(self) -> None:
        """Stop the env workers, close the judge client and the metric sinks, release the run
        folder's lock (rank 0's)."""
        try:
            self.rollout.close()
            if self.state.context_builder is not None:
                self.state.context_builder.close()
            self.logger.close()
        finally:
            self._release_run_dir()

    # ------------------------------------------------------------------ shortcuts
    @property
    def policy(self):
        return self.models.policy

    @property
    def rollout_model(self):
        return self.models.rollout_model

    @property
    def teacher(self):
        return self.models.teacher

    @property
    def ref(self):
        return self.models.ref

    @property
    def tokenizer(self):
        return self.models.tokenizer

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.update.optimizer

    @optimizer.setter
    def optimizer(self, opt: torch.optim.Optimizer) -> None:
        self.update.optimizer = opt

    @property
    def iteration(self) -> int:
        return self.state.iteration

    @property
    def update_step(self) -> int:
        return self.state.update_step
