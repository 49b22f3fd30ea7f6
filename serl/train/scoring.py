"""Log-probs of the rows' sampled tokens under a frozen model: :class:`Scorer`.

One inference pass over an :class:`~serl.train.batch.UpdateBatch` in length-grouped
micro-batches, split over the ranks of a multi-process run: SERL's teacher (with its own
prompts), the KL reference and the behaviour ("old") log-probs all go through it. Not here: what
the teacher is shown (:mod:`serl.train.serl_pass`), the update's own forward (:mod:`serl.train.update`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional

import torch

from serl.config import Config
from serl.train.batch import UpdateBatch, score_logprobs
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
        """:func:`~serl.train.batch.score_logprobs` of ``batch`` under ``model``; one ``[resp_len]``
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
