"""``serl sft``: supervised fine-tuning of the policy on expert rows (a cold start for RL).

Input: a JSONL file written by ``serl data expert``: step rows (one env step, a user prompt and a
``response`` string: ALFWorld, WebShop) or conversation rows (multi-turn ``messages`` with tool
calls and ``tools``: math). Reading, tokenisation and batching are :mod:`serl.train.sft_data`;
tokenisation is the RL rollout's, so that SFT trains exactly the tokens RL later samples (step
rows: the chat prompt cut from the left to ``data.max_prompt_length``, the reply + end-of-turn
token cut to ``data.max_response_length``; conversation rows: :mod:`serl.agent.tool_chat`'s
rendering with its loss mask, cut from the right to the sum of both lengths; cut rows are counted
and warned about).

The loss is the token-mean cross-entropy over the reply tokens of one optimizer batch (prompt,
padding and tool-output tokens carry no loss), the standard SFT objective on completions only (as TRL's
``SFTTrainer`` with ``completion_only_loss``). Gradients accumulate over micro-batches, each
micro-batch's summed loss divided by the whole batch's reply-token count, so the update does not
depend on the micro-batch size. A batch row is ``[left-padded prompt | right-padded reply]`` as in
``serl train``, so only the reply positions go through the LM head (``logits_to_keep``).

Full fine-tuning, or LoRA (Hu et al., arXiv 2106.09685) through PEFT with ``model.lora.r > 0``.
Model loading, dtypes (fp32 master weights, bf16 autocast where the CPU has AVX512-BF16/AMX, else
float32), CPU threads and the run folder (``<trainer.output_dir>/<trainer.run_name or
sft-<timestamp>>``: a new run refuses a non-empty folder unless ``trainer.overwrite=true``, which
moves it aside; the folder is locked while the run lives) follow ``serl train``. Metrics (loss, lr, grad norm, tokens/s, rows/min) go to
``metrics.jsonl`` and TensorBoard, one line per optimizer step (its ``iteration`` field is the
1-based optimizer step).

Checkpoints ``<run>/checkpoints/step_<N>/`` (trainable weights, optimizer, step, data checksum,
RNG states) are written atomically every ``sft.save_freq`` steps, at the end, and when the run is
stopped (Ctrl-C, SIGTERM) after a step it has not saved; ``--resume RUN`` continues
bit-identically (the row order is a pure function of ``sft.seed`` and the epoch).

Output: ``<run>/model/`` is a complete Hugging Face model folder (config, safetensors in float32,
tokenizer, chat template), with LoRA **merged into the base weights**, so ``serl train
model.path=<run>/model`` and ``serl eval model.path=<run>/model`` load it like any model. With LoRA,
``<run>/adapter/`` also holds the adapter alone (PEFT format, float32; 9.8 MB for SmolLM2-135M at r=8) unless
``sft.save_adapter=false``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from serl.config import Config, to_yaml
from serl.errors import CheckpointError, ConfigError
from serl.models.loading import hf_progress_bars, load_causal_lm, load_tokenizer, pick_device, pick_dtype, resolve_model_path
from serl.models.lora import apply_lora
from serl.train.checkpoint import remove_stale_tmp_dirs
from serl.train.grad_ckpt import GradCheckpointing, prepare_checkpointing
from serl.train.metrics import MetricsLogger
from serl.train.run_dir import RunLock, check_run_dir, create_run_dir
# SFTExample, encode_row: re-exported (the public names of serl.train.sft before the data part moved)
from serl.train.sft_data import SFTBatch, SFTExample, collate_sft, encode_row, encode_rows, file_sha256, read_rows  # noqa: F401
from serl.utils import atomic_write_text, configure_cpu_threads, fix_mmap_threshold, mmap_threshold_for, set_seed

log = logging.getLogger(__name__)

#: default peak learning rates when ``sft.lr`` is null: full fine-tuning / LoRA
DEFAULT_LR_FULL = 2e-5
DEFAULT_LR_LORA = 2e-4


# ---------------------------------------------------------------------------------------- loss
def reply_token_nll(model, batch: SFTBatch, argmax_hits: bool = False):
    """Per-token negative log-likelihood of the target tokens, ``[B, R]`` float32 (nats); 0 where
    ``response_mask`` is 0 (padding, and a conversation's tool turns and headers: their logits
    do not enter the result). Only the target positions go through the LM head.

    With ``argmax_hits``: ``(nll, hits)``, ``hits`` ``[B, R]`` bool, True where the target token
    is the model's most likely next token (greedy decoding would emit it after these exact ids)."""
    R = batch.response_ids.shape[1]
    dev = next(model.parameters()).device
    out = model(input_ids=batch.input_ids.to(dev), attention_mask=batch.attention_mask.to(dev),
                position_ids=batch.position_ids.to(dev), logits_to_keep=R + 1, use_cache=False)
    logits = out.logits[:, :-1, :].float()  # position P-1+j predicts reply token j
    targets = batch.response_ids.to(dev)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").view(-1, R)
    nll = nll * batch.response_mask.to(dev)
    return (nll, logits.argmax(-1) == targets) if argmax_hits else nll


def reply_match_counts(hits: torch.Tensor, mask: torch.Tensor) -> dict[str, int]:
    """Greedy agreement with the target replies, counted.

    Args:
        hits: ``[B, R]`` bool, the target token is the model's argmax (:func:`reply_token_nll`).
        mask: ``[B, R]`` 0/1, the tokens that carry loss; each maximal run of 1s in a row is one
            reply (a step row's whole target; each assistant turn of a conversation).

    Returns:
        ``tokens`` (mask 1), ``correct_tokens`` (of those, hits), ``replies`` (runs) and
        ``exact_replies`` (runs whose every token is a hit: greedy decoding from the target's
        own context, e.g. the expert's chat so far, writes that reply exactly).
    """
    m = mask.bool()
    starts = m & ~F.pad(m[:, :-1], (1, 0), value=False)  # a run's first token
    run = torch.cumsum(starts.flatten().long(), 0).view_as(m)  # run ids 1.., numbered across rows
    replies = int(starts.sum())
    missed = torch.unique(run[m & ~hits.bool()])  # runs with at least one token that is not the argmax
    return {"tokens": int(m.sum()), "correct_tokens": int((m & hits.bool()).sum()), "replies": replies,
            "exact_replies": replies - int(missed.numel())}


# -------------------------------------------------------------------------------- schedule
def steps_per_epoch(num_rows: int, batch_size: int) -> int:
    """Optimizer steps in one pass over ``num_rows`` rows (the last batch may be smaller)."""
    return math.ceil(num_rows / batch_size)


def total_steps(num_rows: int, sft) -> int:
    """Optimizer steps of the run: ``sft.max_steps`` if >= 0, else ``sft.epochs`` passes."""
    return sft.max_steps if sft.max_steps >= 0 else sft.epochs * steps_per_epoch(num_rows, sft.batch_size)


def epoch_order(num_rows: int, seed: int, epoch: int) -> list[int]:
    """The row order of ``epoch``: a shuffle seeded with ``seed + epoch`` (deterministic)."""
    order = list(range(num_rows))
    random.Random(seed + epoch).shuffle(order)
    return order


def step_rows(num_rows: int, batch_size: int, seed: int, step: int) -> tuple[int, list[int]]:
    """``(epoch, row indices)`` of the 0-based optimizer ``step``; epochs continue past ``sft.epochs``
    when ``sft.max_steps`` asks for more steps."""
    per = steps_per_epoch(num_rows, batch_size)
    epoch, k = divmod(step, per)
    return epoch, epoch_order(num_rows, seed, epoch)[k * batch_size: (k + 1) * batch_size]


def lr_at(step: int, base: float, warmup: int, total: int, kind: str) -> float:
    """Learning rate of the 0-based optimizer ``step``: linear warm-up ``base·(step+1)/warmup``
    for ``step < warmup``, then ``constant`` or half-cosine decay towards 0 at ``total``."""
    if step < warmup:
        return base * (step + 1) / warmup
    if kind == "constant":
        return base
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


# -------------------------------------------------------------------------------- model
def build_policy(cfg: Config, path: str, device: str):
    """Load the policy in float32 (master weights), install activation checkpointing unless
    ``model.gradient_checkpointing=false`` (:func:`~serl.train.grad_ckpt.prepare_checkpointing`), and
    wrap it with LoRA adapters when ``model.lora.r > 0`` (only the adapters then train).

    Raises:
        ModelLoadError: the model cannot be loaded. ConfigError: bad ``model.lora.*``, or no
            module matches ``model.lora.target_modules``.
    """
    cfg.model.lora.validate()
    model = load_causal_lm(path, torch.float32, device, cfg.model.trust_remote_code, cfg.model.adapter)
    prepare_checkpointing(model, cfg.model.gradient_checkpointing)  # on, off or per micro-batch
    if cfg.model.lora.r == 0:
        return model
    return apply_lora(model, cfg.model.lora)


def trainable_state(model) -> dict[str, torch.Tensor]:
    """The trainable parameters by name (all of them for full fine-tuning, the adapters for LoRA),
    as contiguous CPU tensors; tied weights appear once."""
    return {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def default_run_name() -> str:
    return f"sft-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


# -------------------------------------------------------------------------------- checkpoints
def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def _fsync_tree(folder: Path) -> None:
    for f in folder.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_folder(dest: Path, write_fn) -> Path:
    """Write a folder via ``write_fn(tmp)`` into a hidden temp sibling, fsync it and rename it to
    ``dest`` (replacing an old one): an interrupted write leaves the old folder intact."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".tmp_{dest.name}_"))
    try:
        write_fn(tmp)
        _fsync_tree(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def save_sft_checkpoint(run_dir: Path, step: int, model, optimizer, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``<run_dir>/checkpoints/step_<step>/`` (``trainable.safetensors``, ``optimizer.pt``,
    ``state.pt`` with ``state`` + RNG states) atomically and point ``checkpoints/latest`` at it;
    keep the newest ``keep`` checkpoints (0 = all). Returns the folder."""
    from safetensors.torch import save_file

    root = Path(run_dir) / "checkpoints"

    def write(tmp: Path) -> None:
        save_file(trainable_state(model), str(tmp / "trainable.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({**state, "step": step, "rng": _rng_state()}, tmp / "state.pt")

    folder = _atomic_folder(root / f"step_{step:07d}", write)
    atomic_write_text(root / "latest", folder.name + "\n")
    if keep > 0:
        for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return folder


def load_sft_checkpoint(run_dir: Path, model, optimizer) -> dict[str, Any]:
    """Restore the latest checkpoint of ``run_dir`` into ``model`` / ``optimizer`` and the RNGs;
    returns the saved state (``step``, ``data_sha256``, ...).

    Raises:
        CheckpointError: no checkpoint, an unreadable one, or one whose weights do not match
            the model (e.g. resumed with a different ``model.lora``).
    """
    from safetensors.torch import load_file

    root = Path(run_dir) / "checkpoints"
    ptr = root / "latest"
    if not ptr.exists():
        raise CheckpointError(f"no SFT checkpoint in {run_dir} (missing {ptr}); nothing to resume")
    folder = root / ptr.read_text().strip()
    try:
        saved = load_file(str(folder / "trainable.safetensors"))
        optim_state = torch.load(folder / "optimizer.pt", weights_only=False)
        state = torch.load(folder / "state.pt", weights_only=False)
    except (OSError, RuntimeError) as e:
        raise CheckpointError(f"could not read SFT checkpoint {folder}: {e}") from e
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(saved) != set(params):
        diff = sorted(set(saved) ^ set(params))[:5]
        raise CheckpointError(f"{folder} does not match the model's trainable weights (e.g. {diff}); "
                              "was model.lora changed?")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(saved[n].to(p.device, p.dtype))
    optimizer.load_state_dict(optim_state)
    _set_rng_state(state["rng"])
    return state


# -------------------------------------------------------------------------------- trainer
class SFTTrainer:
    """Owns the model, optimizer, data and run folder of one ``serl sft`` run.

    Args:
        cfg: the resolved config (``cfg.sft.data`` must name the JSONL rows).
        run_dir: the run folder; None = ``<trainer.output_dir>/<trainer.run_name or sft-<timestamp>>``.
        resume: restore the latest checkpoint of ``run_dir``.

    Raises:
        ConfigError: bad ``sft.*`` / ``model.lora.*`` values or no data file given.
        SerlError: unreadable data. ModelLoadError: the model. CheckpointError: on resume, a
            missing checkpoint or a data file whose content changed since the run started.
    """

    def __init__(self, cfg: Config, run_dir: Optional[Path] = None, resume: bool = False):
        cfg.sft.validate()
        cfg.model.lora.validate()
        if not cfg.sft.data:
            raise ConfigError("sft.data: give the expert rows with `serl sft --data FILE.jsonl`")
        self.cfg = cfg
        rows = read_rows(cfg.sft.data)  # fail on bad data before loading the model
        val_rows = read_rows(cfg.sft.val_data) if cfg.sft.val_data else []
        configure_cpu_threads(cfg.trainer.num_threads)
        set_seed(cfg.sft.seed)
        self.device = pick_device(cfg.trainer.device)
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.trainer.output_dir) / (
            cfg.trainer.run_name or default_run_name())
        self._run_lock: Optional[RunLock] = check_run_dir(self.run_dir, resume, cfg.trainer.overwrite, "serl sft run")
        if resume:
            remove_stale_tmp_dirs(self.run_dir)
        try:
            self._start(rows, val_rows, resume)
        except BaseException:
            self.release_run_dir()
            raise

    def _start(self, rows: list[dict[str, Any]], val_rows: list[dict[str, Any]], resume: bool) -> None:
        """Model, data and optimizer; then a new run's folder (created and locked, see
        :mod:`serl.train.run_dir`) and its ``config.yaml``, the metric sinks, a resume's checkpoint."""
        cfg = self.cfg
        self.model_path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
        self.tokenizer = load_tokenizer(self.model_path)
        train_dtype = pick_dtype(cfg.model.train_dtype, self.device)
        self.autocast_dtype = train_dtype if train_dtype != torch.float32 else None
        fix_mmap_threshold(mmap_threshold_for(self.device == "cpu" and self.autocast_dtype is None))
        self.model = build_policy(cfg, self.model_path, self.device)
        self.model.train()
        self.grad_ckpt = GradCheckpointing(self.model, cfg.model.gradient_checkpointing, cfg.trainer.activation_memory_gb,
                                           self.device, 1, 2 if self.autocast_dtype else 4)
        self.data_sha256 = file_sha256(cfg.sft.data)
        self.examples = encode_rows(self.tokenizer, rows, cfg)
        self.val_examples = encode_rows(self.tokenizer, val_rows, cfg, cfg.sft.val_data) if val_rows else []
        self.lr = cfg.sft.lr or (DEFAULT_LR_LORA if cfg.model.lora.r > 0 else DEFAULT_LR_FULL)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=self.lr, weight_decay=cfg.sft.weight_decay)
        self.step = 0
        self._updating = False
        self.total_steps = total_steps(len(self.examples), cfg.sft)
        if not resume:  # every start-up check passed: now the folder may exist
            self._run_lock = create_run_dir(self.run_dir, cfg.trainer.overwrite)
            atomic_write_text(self.run_dir / "config.yaml", to_yaml(cfg))
        self.logger = MetricsLogger(self.run_dir, cfg.trainer.logger)
        if resume:
            self._resume()

    def release_run_dir(self) -> None:
        """Drop the run folder's lock (idempotent; :meth:`train` calls it when it ends)."""
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _resume(self) -> None:
        state = load_sft_checkpoint(self.run_dir, self.model, self.optimizer)
        if state.get("data_sha256") != self.data_sha256:
            raise CheckpointError(f"{self.cfg.sft.data} changed since {self.run_dir} started "
                                  "(sha256 differs): resuming would train on other rows; start a new run")
        self.step = int(state["step"])
        self.logger.truncate_after(self.step)
        log.info("resumed %s at optimizer step %d", self.run_dir, self.step)

    def save(self) -> Path:
        epoch, _ = step_rows(len(self.examples), self.cfg.sft.batch_size, self.cfg.sft.seed, self.step)
        state = {"data_sha256": self.data_sha256, "epoch": epoch, "lr": self.lr,
                 "num_rows": len(self.examples)}
        return save_sft_checkpoint(self.run_dir, self.step, self.model, self.optimizer, state,
                                   keep=self.cfg.trainer.max_checkpoints_to_keep)

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device, dtype=self.autocast_dtype)

    def _micro_batches(self, rows: list[int]) -> list[list[SFTExample]]:
        """The step's rows sorted by length (less padding), cut into ``micro_batch_size`` chunks."""
        exs = sorted((self.examples[i] for i in rows), key=lambda e: e.num_tokens)
        m = self.cfg.sft.micro_batch_size
        return [exs[k: k + m] for k in range(0, len(exs), m)]

    def train_step(self, on_rows: Optional[Callable[[int, int], None]] = None) -> dict[str, float]:
        """One optimizer step on the next ``sft.batch_size`` rows; returns its metrics.

        Args:
            on_rows: called after each micro-batch's backward with (rows done, rows in the step),
                e.g. to move a progress bar inside a long step.
        """
        sft = self.cfg.sft
        t0 = time.time()
        epoch, rows = step_rows(len(self.examples), sft.batch_size, sft.seed, self.step)
        lr = lr_at(self.step, self.lr, sft.warmup_steps, self.total_steps, sft.lr_scheduler)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        n_reply = sum(self.examples[i].num_loss_tokens for i in rows)
        loss_sum, done = 0.0, 0
        self.grad_ckpt.begin()
        for mb in self._micro_batches(rows):
            R = max(len(e.target_ids) for e in mb)  # logits on the last R+1 positions of every row
            self.grad_ckpt.select(len(mb), max(len(e.prompt_ids) for e in mb) + R, logit_positions=len(mb) * (R + 1))
            with self._autocast():
                nll = reply_token_nll(self.model, collate_sft(mb, self.tokenizer.pad_token_id))
            loss = nll.sum() / n_reply  # token-mean over the whole optimizer batch
            loss.backward()
            loss_sum += loss.item()
            done += len(mb)
            if on_rows is not None:
                on_rows(done, len(rows))
        params = [p for p in self.model.parameters() if p.requires_grad]
        gnorm = torch.nn.utils.clip_grad_norm_(params, sft.max_grad_norm or float("inf"))
        self._updating = True  # weights and step disagree until the step is counted
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._updating = False
        dt = max(time.time() - t0, 1e-9)
        n_tok = sum(self.examples[i].num_tokens for i in rows)
        return {"sft/loss": loss_sum, "sft/lr": lr, "sft/grad_norm": float(gnorm), "sft/epoch": float(epoch),
                "perf/tokens_per_s": n_tok / dt, "perf/reply_tokens_per_s": n_reply / dt,
                "perf/rows_per_min": 60.0 * len(rows) / dt, "perf/step_s": dt, **self.grad_ckpt.metrics()}

    @torch.no_grad()
    def evaluate(self, examples: list[SFTExample]) -> dict[str, float]:
        """Held-out metrics over ``examples``, no dropout, no gradient: ``val/loss`` (token-mean
        reply loss, nats), ``val/token_accuracy`` (share of reply tokens that are the model's
        argmax, as TRL's SFT ``mean_token_accuracy``) and ``val/reply_exact`` (share of replies
        that greedy decoding writes exactly from their own context, :func:`reply_match_counts`)."""
        self.model.eval()
        try:
            tot, counts = 0.0, {"tokens": 0, "correct_tokens": 0, "replies": 0, "exact_replies": 0}
            m = self.cfg.sft.micro_batch_size
            for k in range(0, len(examples), m):
                batch = collate_sft(examples[k: k + m], self.tokenizer.pad_token_id)
                with self._autocast():
                    nll, hits = reply_token_nll(self.model, batch, argmax_hits=True)
                tot += nll.sum().item()
                for key, v in reply_match_counts(hits.cpu(), batch.response_mask).items():
                    counts[key] += v
        finally:
            self.model.train()
        return {"val/loss": tot / max(1, counts["tokens"]),
                "val/token_accuracy": counts["correct_tokens"] / max(1, counts["tokens"]),
                "val/reply_exact": counts["exact_replies"] / max(1, counts["replies"])}

    def train(self) -> dict[str, float]:
        """Run the remaining optimizer steps with a progress bar; checkpoint every ``sft.save_freq``
        steps and at the end, then write ``<run>/model``. Returns the last step's metrics plus
        ``perf/mean_tokens_per_s`` and ``perf/mean_rows_per_min``: the speed over all the steps of
        this call (the last step alone can be far off it, e.g. beside another job)."""
        from tqdm.auto import tqdm

        sft, last = self.cfg.sft, {}
        secs = tokens = rows = 0.0
        saved = start = self.step
        try:
            with tqdm(total=self.total_steps, initial=self.step, desc="serl sft", unit="step",
                      disable=not self.cfg.trainer.progress, file=sys.stderr, dynamic_ncols=True) as bar:
                rows_shown = _RowsPostfix(bar)
                if self.val_examples and sft.eval_on_start:
                    last = self.evaluate(self.val_examples)
                    self.logger.log(self.step, last)
                while self.step < self.total_steps:
                    last = self.train_step(on_rows=rows_shown)
                    secs += last["perf/step_s"]
                    tokens += last["perf/tokens_per_s"] * last["perf/step_s"]
                    rows += last["perf/rows_per_min"] * last["perf/step_s"] / 60.0
                    done = self.step >= self.total_steps
                    if self.val_examples and (done or (sft.eval_freq and self.step % sft.eval_freq == 0)):
                        last.update(self.evaluate(self.val_examples))
                    if done or self.step % sft.log_freq == 0:
                        self.logger.log(self.step, last)
                    if done or (sft.save_freq and self.step % sft.save_freq == 0):
                        self.save()
                        saved = self.step
                    rows_shown.last = f"loss {last['sft/loss']:.3f}, {last['perf/tokens_per_s']:.0f} tok/s"
                    bar.update(1)
                    bar.set_postfix_str(rows_shown.last)
            if self.step > start:  # an evaluation only (sft.eval_on_start, no step in this call) writes no model
                self.export_model()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (serl's handler raises a subclass)
            self._save_on_stop(saved)
            raise
        finally:
            self.logger.close()
            self.release_run_dir()
        if secs > 0:
            last = {**last, "perf/mean_tokens_per_s": tokens / secs, "perf/mean_rows_per_min": 60.0 * rows / secs}
        return last

    def _save_on_stop(self, saved: int) -> None:
        """A stopped run keeps its finished steps: a checkpoint of the last one, unless it is
        already saved or the stop came inside the optimizer's update (weights half-written: the
        last checkpoint stands). What was done of the step under way is lost."""
        if self._updating or self.step == saved:
            why = "inside an optimizer update" if self._updating else f"at step {self.step}"
            kept = f"checkpoint of step {saved} stands" if saved else "no checkpoint: nothing to resume"
            print(f"serl sft: stopped {why}; the last {kept}" if saved else f"serl sft: stopped {why}; {kept}",
                  file=sys.stderr, flush=True)
            return
        path = self.save()
        print(f"serl sft: stopped; step {self.step} saved to {path}", file=sys.stderr, flush=True)

    def export_model(self) -> Path:
        """Write ``<run>/model`` (full HF folder, LoRA merged, float32) and, with LoRA and
        ``sft.save_adapter``, ``<run>/adapter``. Merging changes ``self.model`` into the plain
        merged model, so call it last. Returns the model folder."""
        return export_model(self.model, self.tokenizer, self.run_dir, self.cfg, self.provenance())

    def provenance(self) -> dict[str, Any]:
        c = self.cfg
        return {"base_model": c.model.path, "resolved_base_model": self.model_path, "data": c.sft.data,
                "data_sha256": self.data_sha256, "num_rows": len(self.examples), "optimizer_steps": self.step,
                "lora": {"r": c.model.lora.r, "alpha": c.model.lora.alpha,
                         "target_modules": list(c.model.lora.target_modules)} if c.model.lora.r else None}


class _RowsPostfix:
    """A progress bar's postfix inside a step: ``row 5/16`` beside the last step's loss and speed,
    redrawn on the first call and then at most once every ``every_s`` seconds (a CPU step of long
    rows can take many minutes). "Never drawn" is ``-inf``, not 0: ``time.monotonic()`` counts
    from the machine's boot, so a 0 would hold the first redraw back on a machine up less than
    ``every_s``."""

    def __init__(self, bar, every_s: float = 1.0):
        self.bar, self.every_s, self.last, self._drawn = bar, every_s, "", -math.inf

    def __call__(self, done: int, total: int) -> None:
        self.bar.set_postfix_str(", ".join(s for s in (f"row {done}/{total}", self.last) if s), refresh=False)
        if time.monotonic() - self._drawn >= self.every_s:
            self.bar.refresh()
            self._drawn = time.monotonic()


def export_model(model, tokenizer, run_dir: Path, cfg: Config, provenance: dict[str, Any]) -> Path:
    """Save ``model`` as ``<run_dir>/model`` (atomic), merging LoRA adapters first (the adapter
    alone goes to ``<run_dir>/adapter`` if ``sft.save_adapter``), plus ``serl_sft.json`` with
    ``provenance``. Returns the model folder."""
    run_dir = Path(run_dir)
    if cfg.model.lora.r > 0:
        if cfg.sft.save_adapter:
            _atomic_folder(run_dir / "adapter", lambda tmp: model.save_pretrained(str(tmp)))
        model = model.merge_and_unload()
    if cfg.model.gradient_checkpointing is not False and hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()  # a training-only setting; not saved either way
    model.config.use_cache = True

    def write(tmp: Path) -> None:
        with hf_progress_bars(False):  # transformers 5's "Writing model shards" bar
            model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "serl_sft.json").write_text(json.dumps(provenance, indent=2) + "\n")

    return _atomic_folder(run_dir / "model", write)
