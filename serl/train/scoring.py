"""Log-probs of the rows' sampled tokens under a frozen model: :class:`Scorer`.

One inference pass (:func:`score_logprobs`, the one scoring loop for a frozen model; for chats
whose rows extend each other, :func:`score_logprobs_reusing_prefixes`) over an
:class:`~serl.train.batch.UpdateBatch` in length-grouped micro-batches, split over the ranks of a multi-process run: SERL's teacher (with its own
prompts), the KL reference and the behaviour ("old") log-probs all go through it. Not here: what
the teacher is shown (:mod:`serl.train.serl_pass`), the update's own forward (:mod:`serl.train.update`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch
from transformers.cache_utils import Cache

from serl.config import Config
from serl.rollout.prefill import CACHE_ARG, PreallocatedLayer
from serl.rollout.turn_cache import MIN_REUSE
from serl.train.batch import UpdateBatch, collate, length_buckets, response_logprobs, token_logprobs
from serl.train.distributed import Distributed


class Scorer:
    """Scores batches under a model at the rollout temperature.

    Args:
        cfg: the run's config (``actor.log_prob_micro_batch_size_per_gpu``, ``rollout.temperature``,
            ``model.use_remove_padding``).
        pad_id: the tokenizer's pad token id.
        device: where the models are.
        dist: the process group (N > 1: rows ``r, r+N, ...`` on rank ``r``, then gathered).
        autocast: the update's autocast context factory, for scoring the trained policy.
    """

    def __init__(self, cfg: Config, pad_id: int, device: str, dist: Distributed, autocast: Callable):
        self.cfg, self.pad_id, self.device, self.dist, self.autocast = cfg, pad_id, device, dist, autocast

    def score(self, model, batch: UpdateBatch, label: Optional[str] = None, pbar=None,
              prompt_ids: Optional[list[list[int]]] = None, autocast: bool = False,
              reuse_prefixes: bool = False, stats: Optional[dict[str, int]] = None) -> list[torch.Tensor]:
        """:func:`score_logprobs` of ``batch`` under ``model``; one ``[resp_len]``
        float32 tensor per row. ``prompt_ids`` replaces the rows' prompts (the teacher's
        privileged prompts); ``autocast`` scores under the update's autocast (the policy's old
        log-probs); ``reuse_prefixes`` scores with :func:`score_logprobs_reusing_prefixes` (its
        token counts added to ``stats``, this rank's rows); ``label`` names the pass in ``pbar``'s postfix."""
        progress = None
        if pbar is not None and label:
            def progress(k: int, n: int) -> None:
                pbar.set_postfix_str(f"{label} scoring {k}/{n} rows")

        def score(idx: list[int]) -> list[torch.Tensor]:  # N > 1: rows r, r+N, ... on rank r, then gathered
            part = batch if len(idx) == len(batch) else batch.select(idx)
            prompts = None if prompt_ids is None or len(idx) == len(batch) else [prompt_ids[i] for i in idx]
            if reuse_prefixes:
                return score_logprobs_reusing_prefixes(
                    model, part, temperature=self.cfg.rollout.temperature, device=self.device,
                    prompt_ids=prompt_ids if prompts is None else prompts,
                    autocast=self.autocast if autocast else nullcontext, progress=progress, stats=stats)
            return score_logprobs(model, part, self.cfg.actor.log_prob_micro_batch_size_per_gpu,
                                  pad_id=self.pad_id, temperature=self.cfg.rollout.temperature,
                                  device=self.device, prompt_ids=prompt_ids if prompts is None else prompts,
                                  autocast=self.autocast if autocast else nullcontext, progress=progress,
                                  remove_padding=self.cfg.model.use_remove_padding)

        return self.dist.sharded_map(score, len(batch), model=model)


def _score_groups(prompts: Sequence[list[int]], responses: Sequence[list[int]], mb: int, bucket: bool
                  ) -> list[list[int]]:
    """Row positions of each scoring micro-batch: grouped by length, or consecutive."""
    if bucket:
        return length_buckets([len(p) + len(r) for p, r in zip(prompts, responses)], mb)
    return [list(range(k, min(k + mb, len(prompts)))) for k in range(0, len(prompts), mb)]


def score_logprobs(
    model, batch: UpdateBatch, micro_batch_size: int, *, pad_id: int, temperature: float = 1.0,
    device: Any = "cpu", prompt_ids: Optional[list[list[int]]] = None,
    autocast: Callable[[], ContextManager] = nullcontext, progress: Optional[Callable[[int, int], None]] = None,
    bucket: bool = True, remove_padding: bool = True,
) -> list[torch.Tensor]:
    """Log-probs of each row's response tokens under a frozen ``model`` (teacher, reference, old
    log-probs), in inference mode, in micro-batches of ``micro_batch_size`` rows: grouped by
    length (:func:`length_buckets`) with ``bucket``, else consecutive; results in row order.

    Args:
        model: a causal LM (its train/eval mode is the caller's).
        batch: the rows; their ``response_ids`` are scored.
        micro_batch_size: rows per forward pass.
        prompt_ids: the prompts to score under, one per row (SERL's teacher prompts); None =
            ``batch.prompt_ids``.
        autocast: a context-manager factory wrapped around each forward pass.
        progress: called as ``progress(rows_done, rows_total)`` before each micro-batch.
        remove_padding: run each micro-batch packed (:func:`response_logprobs`).

    Returns:
        Per row a ``[L_i]`` float32 CPU tensor (nats); 0 where the row's ``response_masks`` is 0
        (those tokens carry no loss and skip the LM head, :func:`~serl.train.batch.collate`)
        unless the whole row's mask is 0.

    Raises:
        ValueError: ``prompt_ids`` of another length than the batch.
    """
    prompts = batch.prompt_ids if prompt_ids is None else prompt_ids
    if len(prompts) != len(batch):
        raise ValueError(f"{len(prompts)} prompts for {len(batch)} rows")
    out: list[Optional[torch.Tensor]] = [None] * len(batch)
    done = 0
    with torch.inference_mode():
        for idx in _score_groups(prompts, batch.response_ids, max(1, micro_batch_size), bucket):
            if progress is not None:
                progress(done, len(batch))
            responses = [batch.response_ids[i] for i in idx]
            b = collate([prompts[i] for i in idx], responses, pad_id,
                        logit_masks=[batch.response_masks[i] for i in idx]).to(device)
            with autocast():
                lp, _ = response_logprobs(model, b, temperature, remove_padding=remove_padding)
            for j, (i, r) in enumerate(zip(idx, responses)):
                out[i] = lp[j, : len(r)].float().cpu()
            done += len(idx)
    return out  # type: ignore[return-value]


def score_logprobs_reusing_prefixes(
    model, batch: UpdateBatch, *, temperature: float = 1.0, device: Any = "cpu",
    prompt_ids: Optional[list[list[int]]] = None, autocast: Callable[[], ContextManager] = nullcontext,
    progress: Optional[Callable[[int, int], None]] = None, stats: Optional[dict[str, int]] = None,
) -> list[torch.Tensor]:
    """:func:`score_logprobs` one row at a time in row order, each row starting from the keys and
    values of its longest common prefix with the row before (that row's prompt and response; used
    when at least :data:`~serl.rollout.turn_cache.MIN_REUSE` tokens), so only the rest runs.

    Made for SERL's teacher on conversation-layout rows: row ``t + 1`` of an episode begins with
    the chat up to step ``t``'s user turn, which row ``t`` ran too (its privileged turn differs),
    so each row runs about two turns instead of the whole chat, O(T) tokens for a T-step episode
    instead of O(T²) (serl's; the original scores step rows only). The log-probs equal
    :func:`score_logprobs`'s up to float rounding (tests/test_teacher_prefix_reuse.py); rows with
    nothing in common cost what they cost there, unbatched. ``model`` is called as a causal LM
    (``logits_to_keep`` = the reply's positions), so a LoRA adapter view works as it is.

    Args and returns: as :func:`score_logprobs` (without its batching options); ``stats``, if
    given, gets ``reused_tokens`` and ``run_tokens`` added (prefix positions taken from the row
    before; positions run through the model).

    Raises:
        ValueError: ``prompt_ids`` of another length than the batch, an empty prompt or response.
    """
    prompts = batch.prompt_ids if prompt_ids is None else prompt_ids
    if len(prompts) != len(batch):
        raise ValueError(f"{len(prompts)} prompts for {len(batch)} rows")
    out: list[torch.Tensor] = []
    prev: list[int] = []
    prev_kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer [KV, len(prev), D]
    with torch.inference_mode():
        for i, (p, r) in enumerate(zip(prompts, batch.response_ids)):
            if progress is not None:
                progress(i, len(batch))
            if not p or not r:
                raise ValueError(f"row {i} has an empty {'prompt' if not p else 'response'}")
            seq = list(p) + list(r)
            n = _common_prefix(prev, seq, limit=len(p) - 1)  # the last prompt token must run: it predicts r[0]
            if n < MIN_REUSE or not prev_kv:
                n = 0
            past = {CACHE_ARG: _prefix_cache(prev_kv, n, len(seq))} if n else {}
            if stats is not None:
                stats["reused_tokens"] = stats.get("reused_tokens", 0) + n
                stats["run_tokens"] = stats.get("run_tokens", 0) + len(seq) - n
            with autocast():  # position t predicts token t + 1: the last len(r) + 1 positions, less the last
                res = model(input_ids=torch.tensor([seq[n:]], device=device), use_cache=True,
                            logits_to_keep=len(r) + 1, **past)
            out.append(_reply_logprobs(res.logits[0, :-1], list(r), batch.response_masks[i], temperature))
            prev, prev_kv = seq, [(layer.keys[0], layer.values[0]) for layer in getattr(res, CACHE_ARG).layers]
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    diff = (torch.tensor(a[:n]) != torch.tensor(b[:n])).nonzero()
    return n if diff.numel() == 0 else int(diff[0, 0])


def _prefix_cache(kv: list[tuple[torch.Tensor, torch.Tensor]], n: int, capacity: int) -> Cache:
    """A KV cache holding the first ``n`` positions of ``kv`` (per layer ``[KV, >= n, D]``), with
    room for ``capacity`` positions in all."""
    layers = []
    for k, v in kv:
        kb = k.new_empty((1, k.shape[0], capacity, k.shape[2]))
        vb = v.new_empty((1, v.shape[0], capacity, v.shape[2]))
        kb[0, :, :n], vb[0, :, :n] = k[:, :n], v[:, :n]
        layers.append(PreallocatedLayer(kb, vb, n))
    return Cache(layers=layers)


def _reply_logprobs(logits: torch.Tensor, reply: list[int], mask, temperature: float) -> torch.Tensor:
    """``[len(reply)]`` float32 CPU log-probs of ``reply`` from the ``[len(reply), vocab]`` logits
    that predict it; 0 where ``mask`` is 0, unless it is all 0 (then every position, as
    :func:`~serl.train.batch.collate`)."""
    keep = torch.as_tensor(mask).reshape(-1)[: len(reply)] != 0
    if not bool(keep.any()):
        keep = torch.ones(len(reply), dtype=torch.bool)
    sel = keep.to(logits.device)
    targets = torch.tensor(reply, dtype=torch.long, device=logits.device)[sel]
    lp_sel, _ = token_logprobs(logits[sel], targets, temperature, False)
    lp = torch.zeros(len(reply), dtype=torch.float32)
    lp[keep] = lp_sel.float().cpu()
    return lp
