"""Log-probs of the rows' sampled tokens under a frozen model: :class:`Scorer`.

One inference pass (:func:`score_logprobs`, the one scoring loop for a frozen model) over an
:class:`~serl.train.batch.UpdateBatch` in length-grouped micro-batches, split over the ranks of a multi-process run: SERL's teacher (with its own
prompts), the KL reference and the behaviour ("old") log-probs all go through it. Not here: what
the teacher is shown (:mod:`serl.train.serl_pass`), the update's own forward (:mod:`serl.train.update`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch

from serl.config import Config
from serl.train.batch import UpdateBatch, collate, length_buckets, response_logprobs
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
              prompt_ids: Optional[list[list[int]]] = None, autocast: bool = False) -> list[torch.Tensor]:
        """:func:`score_logprobs` of ``batch`` under ``model``; one ``[resp_len]``
        float32 tensor per row. ``prompt_ids`` replaces the rows' prompts (the teacher's
        privileged prompts); ``autocast`` scores under the update's autocast (the policy's old
        log-probs); ``label`` names the pass in ``pbar``'s postfix."""
        progress = None
        if pbar is not None and label:
            def progress(k: int, n: int) -> None:
                pbar.set_postfix_str(f"{label} scoring {k}/{n} rows")

        def score(idx: list[int]) -> list[torch.Tensor]:  # N > 1: rows r, r+N, ... on rank r, then gathered
            part = batch if len(idx) == len(batch) else batch.select(idx)
            prompts = None if prompt_ids is None or len(idx) == len(batch) else [prompt_ids[i] for i in idx]
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
