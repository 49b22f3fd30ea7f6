"""The policy update of one iteration: :class:`PolicyUpdate` and :func:`make_adamw`.

PPO over mini-batches of rows (one optimizer step each; gradient accumulation over micro-batches;
SERL's weights on action tokens; entropy bonus; reference KL), then SPEAR's replay mini-batches
with their own optimizer steps (as SPEAR's ``update_actor``,
``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/workers/actor/dp_actor.py``). The losses
themselves are the registry's (:mod:`serl.algos.losses`); the SERL weight rule is
:func:`serl.algos.selective_weights.serl_token_weights`. Not here: the rows, their advantages and
frozen-model log-probs, which arrive in the :class:`~serl.train.batch.UpdateBatch`.

Departure from verl, exact: the old log-probs of the first mini-batch are the detached current
log-probs (no parameter has changed yet), which saves one forward pass over those rows.

A ``token-mean`` loss averages over each micro-batch's tokens, the micro-batches weighted by
rows (verl-agent's), or with ``actor.token_mean_scope=mini_batch`` over the whole mini-batch's
tokens (current verl's; :func:`loss_count`), which makes the micro-batch size a speed setting only.

With ``actor.skip_zero_advantage_rows`` (off by default: verl runs every row), the rows whose
every token has advantage 0 are left out of the forward/backward passes and of the old-log-prob
pass (:func:`trains_something`), and each micro-batch's loss is rescaled so that its normaliser
is that of all its rows (:func:`kept_loss_factor`); those rows' old log-probs stay None.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

from serl.algos.losses import agg_loss, get_policy_loss_fn, kl_loss, replay_loss_config
from serl.algos.selective_weights import serl_token_weights
from serl.algos.spear import ReplayRow, replay_coef
from serl.config import Config
from serl.train.batch import RowBatch, UpdateBatch, length_buckets, pad_rows, response_logprobs
from serl.train.distributed import Distributed, deal_micro_batches, micro_loss_scale
from serl.train.grad_ckpt import GradCheckpointing
from serl.train.metrics import MetricMeans
from serl.train.models import PolicyModels
from serl.train.scoring import Scorer

log = logging.getLogger(__name__)


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


def trains_something(batch: UpdateBatch) -> list[bool]:
    """Per row of ``batch``: True when some response token has a non-zero advantage after its
    mask (``advantages[i] * response_masks[i]``); a row with none has an all-zero
    policy-gradient term under the vanilla and gpg losses."""
    return [bool(((a * m) != 0).any()) for a, m in zip(batch.advantages, batch.response_masks)]


def token_mean_over_mini_batch(loss_agg_mode: str, token_mean_scope: str) -> bool:
    """True when the loss is a token-mean over the whole mini-batch (``token-mean`` with
    ``actor.token_mean_scope=mini_batch``): micro-batches then count by their loss tokens."""
    return loss_agg_mode == "token-mean" and token_mean_scope == "mini_batch"


def loss_count(batch: UpdateBatch, loss_agg_mode: str, token_mean_scope: str) -> float:
    """What the micro-batch losses of a mini-batch are weighted by (:func:`micro_loss_scale`):
    with :func:`token_mean_over_mini_batch` the loss tokens of ``batch``
    (:meth:`UpdateBatch.loss_tokens`), else its rows (verl-agent's ``loss / gradient_accumulation``)."""
    if token_mean_over_mini_batch(loss_agg_mode, token_mean_scope):
        return sum(batch.loss_tokens())
    return float(len(batch))


def kept_loss_factor(micro: UpdateBatch, keep: list[int], loss_agg_mode: str,
                     loss_scale_factor: Optional[float]) -> float:
    """The factor that turns the loss of rows ``keep`` of ``micro``, aggregated over those rows
    alone (:func:`serl.algos.losses.agg_loss`), into their share of the loss aggregated over all
    of ``micro``'s rows (the left-out rows adding 0 to the sum): ``token-mean`` kept / all
    response tokens under the masks; ``seq-mean-*`` kept / all rows;
    ``seq-mean-token-sum-norm`` with ``loss_scale_factor`` None (the divisor is the padded
    response length) kept / all longest response, else 1.

    Raises:
        ValueError: ``keep`` is empty or the mode is unknown.
    """
    if not keep:
        raise ValueError("kept_loss_factor: no row kept")
    if loss_agg_mode == "token-mean":
        tokens = micro.loss_tokens()
        return sum(tokens[i] for i in keep) / max(sum(tokens), 1.0)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return len(keep) / len(micro)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is not None:
            return 1.0
        return max(len(micro.response_ids[i]) for i in keep) / max(len(r) for r in micro.response_ids)
    raise ValueError(f"kept_loss_factor: unknown loss_agg_mode {loss_agg_mode!r}")


class PolicyUpdate:
    """Runs the update of an iteration (see the module docstring).

    Args:
        cfg: the run's config (``actor.*``, ``algorithm.serl.*``, ``algorithm.spear.*``).
        models: the run's models (the policy and the update's autocast).
        train_model: the policy as the update's forward passes see it (DDP-wrapped with N > 1).
        optimizer: the policy's optimizer.
        dist: the process group.
        grad_ckpt: the per-micro-batch activation checkpointing switch.
        scorer: scores the old log-probs of the rows outside the first mini-batch.

    Attributes:
        loss_fn: ``actor.policy_loss`` of the registry.
        loss_cfgs: the loss parameters of each batch kind (:attr:`UpdateBatch.prefix`): SPEAR's
            replay rows take the ``*_replay`` ones (``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/core_algos.py``).
    """

    def __init__(self, cfg: Config, models: PolicyModels, train_model, optimizer: torch.optim.Optimizer,
                 dist: Distributed, grad_ckpt: GradCheckpointing, scorer: Scorer):
        self.cfg, self.models, self.train_model, self.optimizer = cfg, models, train_model, optimizer
        self.dist, self.grad_ckpt, self.scorer = dist, grad_ckpt, scorer
        self.device, self.pad_id = models.device, models.tokenizer.pad_token_id
        self.loss_fn = get_policy_loss_fn(cfg.actor.policy_loss)
        self.loss_cfgs = {"actor": cfg.actor, "replay": replay_loss_config(cfg.actor)}

    def run(self, batch: UpdateBatch, replay: Sequence[ReplayRow] = (), step: int = 1) -> dict[str, float]:
        """PPO update: per epoch the on-policy mini-batches of ``batch``, then SPEAR's replay
        mini-batches of ``replay`` (never mixed with them); one optimizer step per mini-batch,
        gradient accumulation over micro-batches.

        Args:
            batch: the on-policy rows; on return every row's ``old_log_probs`` is set (the
                behaviour log-probs, which SPEAR stores for the replay ratio).
            replay: the replay rows of this step (may be empty).
            step: the 1-based global step of the replay coefficient γ_t.

        Returns:
            The ``actor/*``, ``serl_action_mask/*`` and ``replay/*`` metrics, averaged.
        """
        a, s = self.cfg.actor, self.cfg.algorithm.spear
        self._precompute_old_logprobs(batch)
        gamma_t = replay_coef(step, s.replay_loss_coef, s.max_replay_loss_steps) if replay else 0.0
        replay_batch = UpdateBatch.from_replay_rows(list(replay), gamma_t)
        self.train_model.train()
        self.grad_ckpt.begin()
        means = MetricMeans()
        for _ in range(a.ppo_epochs):
            for part in (batch, replay_batch):
                for mini in part.split(a.ppo_mini_batch_size):
                    self.optimizer.zero_grad(set_to_none=True)
                    self._accumulate_gradients(part, mini, means)
                    if a.skip_zero_advantage_rows:
                        self._zero_missing_grads()
                    means.add(self._optimizer_step(part.prefix))
        self.train_model.eval()
        metrics = self.dist.reduce_means(means)  # N > 1: over every rank's micro-steps
        metrics.update(self.grad_ckpt.metrics())
        if replay:
            metrics.update({"replay/coef": gamma_t, "replay/rows": float(len(replay))})
        return metrics

    def micro_batches(self, mini: UpdateBatch) -> list[UpdateBatch]:
        """The micro-batches of one mini-batch: consecutive rows of ``actor.ppo_micro_batch_size``,
        or with ``actor.use_dynamic_bsz`` rows grouped by length within the token budget
        ``actor.ppo_max_token_len_per_gpu`` (:func:`~serl.train.batch.length_buckets`)."""
        a = self.cfg.actor
        if not a.use_dynamic_bsz:
            return mini.split(a.ppo_micro_batch_size)
        lengths = [len(p) + len(r) for p, r in zip(mini.prompt_ids, mini.response_ids)]
        return [mini.select(idx) for idx in length_buckets(lengths, a.ppo_micro_batch_size, a.ppo_max_token_len_per_gpu)]

    def _accumulate_gradients(self, part: UpdateBatch, mini: UpdateBatch, means: MetricMeans) -> None:
        """Forward/backward of this rank's micro-batches of ``mini`` (all of them with one process;
        with N ranks micro-batch ``k`` runs on rank ``k mod N``, :func:`deal_micro_batches`); the
        gradients are all-reduced on the last micro-step only (DDP ``no_sync`` before). Records
        the old log-probs used in ``part`` and the micro-step metrics in ``means`` (weighted by
        their loss tokens with ``token-mean`` and ``actor.token_mean_scope=mini_batch``, so that
        ``actor/pg_loss`` is the mini-batch's token-mean, the loss that is optimized)."""
        plan = deal_micro_batches(self.micro_batches(mini), self.dist.rank, self.dist.world_size)
        a = self.cfg.actor
        mini_count = max(loss_count(mini, a.loss_agg_mode, a.token_mean_scope), 1.0)  # no loss token: every loss is 0
        by_tokens = token_mean_over_mini_batch(a.loss_agg_mode, a.token_mean_scope)
        for k, (micro, weight) in enumerate(plan):
            count = loss_count(micro, a.loss_agg_mode, a.token_mean_scope)
            with self.dist.sync_context(self.train_model, sync=k == len(plan) - 1):
                m, old = self._micro_step(micro, micro_loss_scale(count, mini_count, self.dist.world_size) * weight)
            if weight:
                part.fill_old_log_probs(micro.index, old)
                means.add(m, count if by_tokens else 1.0)  # by tokens: the mini-batch's token-means

    def _precompute_old_logprobs(self, batch: UpdateBatch) -> None:
        """Behaviour log-probs, before any optimizer step, of the rows outside the first
        mini-batch (of every row with ``algorithm.serl.student_logprob=old`` or N > 1); the first
        mini-batch's are its detached current log-probs, taken in the micro-step."""
        # N > 1: all rows (a rank runs only some micro-batches, but every rank needs every row's)
        first = 0 if self.cfg.algorithm.serl.student_logprob == "old" or self.dist.enabled \
            else self.cfg.actor.ppo_mini_batch_size
        targets = list(range(first, len(batch)))
        if self.cfg.actor.skip_zero_advantage_rows:
            trains = trains_something(batch)
            targets = [i for i in targets if trains[i]]
        if targets:
            self.models.policy.eval()
            batch.fill_old_log_probs(targets, self.scorer.score(self.models.policy, batch.select(targets), autocast=True))

    def _zero_missing_grads(self) -> None:
        """Zero gradients where a mini-batch ran no backward (every row left out by
        ``actor.skip_zero_advantage_rows``), so that AdamW steps as it would on the all-zero
        gradient of those rows: its moments decay and it still moves the parameters."""
        for p in self.models.policy.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    def _optimizer_step(self, prefix: str) -> dict[str, float]:
        """Clip the gradient norm to ``actor.grad_clip`` and step; a non-finite norm skips the step."""
        grad_norm = self.dist.clip_grad_norm(self.models.policy.parameters(), self.cfg.actor.grad_clip)
        if not torch.isfinite(grad_norm):
            log.warning("non-finite grad norm %s: skipping this optimizer step", grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        return {f"{prefix}/grad_norm": grad_norm.item(), f"{prefix}/lr": self.optimizer.param_groups[0]["lr"]}

    def _micro_step(self, micro: UpdateBatch, scale: float
                    ) -> tuple[dict[str, float], list[Optional[torch.Tensor]]]:
        """Forward/backward of one micro-batch, on-policy or SPEAR replay (the batch says which).

        loss = scale · loss_coef · [policy_loss(logπ_old, logπ, A·W, m)
        − entropy_coeff·agg(H, m) + kl_loss_coef·agg(KL(π‖π_ref), m)]: ``m`` = response mask ×
        the row's mask (Dr.BoT / stored), ``A`` the token advantages, ``W`` SERL's weights (rows
        with teacher log-probs), the KL term only for rows with reference log-probs; a replay
        batch uses the ``*_replay`` loss parameters and γ_t as ``loss_coef``. Tensors ``[b, R]``.
        ``scale`` = weight · c(micro)/c(mini-batch) · N (the caller's), with ``c`` rows, or loss
        tokens with ``token-mean`` and ``actor.token_mean_scope=mini_batch`` (:func:`loss_count`),
        ``N`` the number of processes (DDP then averages the ranks' gradients:
        :func:`~serl.train.distributed.micro_loss_scale`) and weight 0 a padding micro-step.
        With ``actor.skip_zero_advantage_rows`` (on-policy rows) only the rows that train run,
        the loss times :func:`kept_loss_factor`; none of them: no pass at all.

        Returns:
            ``(metrics, old)``: the metrics under ``micro.prefix``, and per row the old log-probs
            used (the detached current ones where the batch had none; None for a row left out).
        """
        a = self.cfg.actor
        if not (a.skip_zero_advantage_rows and micro.prefix == "actor"):
            return self._forward_backward(micro, scale)
        keep = [j for j, t in enumerate(trains_something(micro)) if t]
        if len(keep) == len(micro):
            return self._forward_backward(micro, scale)
        old: list[Optional[torch.Tensor]] = [None] * len(micro)
        if not keep:  # nothing in this micro-batch trains: no forward, no backward
            return {}, old
        metrics, rows = self._forward_backward(
            micro.select(keep), scale * kept_loss_factor(micro, keep, a.loss_agg_mode, a.loss_scale_factor))
        for j, r in zip(keep, rows):
            old[j] = r
        return metrics, old

    def _forward_backward(self, micro: UpdateBatch, scale: float) -> tuple[dict[str, float], list[torch.Tensor]]:
        """The loss of :meth:`_micro_step` over the rows of ``micro``, times ``scale`` and the
        batch's ``loss_coef``, backpropagated; returns its metrics and per row the old log-probs used."""
        a = self.cfg.actor
        b = micro.collate(self.pad_id).to(self.device)
        R = b.responses.shape[1]
        self.grad_ckpt.select(*b.input_ids.shape, logit_positions=int(b.response_mask.sum()))
        with self.models.autocast():  # through the DDP wrapper with N > 1 (its hooks all-reduce the gradients)
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
        self.dist.backward(loss * scale * micro.loss_coef)
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
