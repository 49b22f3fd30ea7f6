"""Rollout engines: sample responses for a batch of prompt token ids.

``hf`` (the only engine so far) runs transformers ``generate`` batched with left padding on the
policy's own weights (on CPU, bf16 HF generate is the fastest batched path with exact
log-probs). A vLLM engine for GPUs would implement the same :class:`RolloutEngine` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class SamplingParams:
    """Sampling settings of one ``generate`` call.

    Attributes:
        max_new_tokens: response length cap (tokens).
        temperature: > 0; ignored when ``do_sample`` is False (greedy).
        top_p: nucleus mass in (0, 1].
        top_k: -1 = off.
        do_sample: False = greedy decoding.
        seed: if set, the torch RNG is seeded before sampling (reproducible evaluation).
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    seed: int | None = None


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Sample one response per prompt; returns the response ids (EOS included if sampled,
        no padding), in the order of ``prompts``."""
        ...


class HFEngine:
    """Batched sampling with transformers ``generate``.

    Args:
        model: a causal LM (its current weights are used; nothing to sync).
        tokenizer: the model's tokenizer (``pad_token_id`` and ``eos_token_id`` are used).
        micro_batch_size: prompts per ``generate`` call.
        progress: optional callback ``progress(n_done)`` after each micro-batch.

    Prompts are sorted by length before batching so each micro-batch carries little padding;
    results come back in the caller's order.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, micro_batch_size: int = 32):
        self.model = model
        self.tokenizer = tokenizer
        self.micro_batch_size = max(1, micro_batch_size)
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = self._eos_ids(model, tokenizer)

    @staticmethod
    def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
        ids = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(gen_eos)
        return {i for i in ids if i is not None}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        if not prompts:
            return []
        if params.seed is not None:
            torch.manual_seed(params.seed)
        device = next(self.model.parameters()).device
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[list[int] | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            for s in range(0, len(order), self.micro_batch_size):
                idx = order[s : s + self.micro_batch_size]
                width = max(len(prompts[i]) for i in idx)
                input_ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
                attn = torch.zeros((len(idx), width), dtype=torch.long)
                for r, i in enumerate(idx):
                    p = prompts[i]
                    input_ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                    attn[r, width - len(p) :] = 1
                kwargs = dict(
                    max_new_tokens=params.max_new_tokens,
                    do_sample=params.do_sample,
                    pad_token_id=self.pad_id,
                    eos_token_id=sorted(self.eos_ids),
                )
                if params.do_sample:
                    kwargs.update(temperature=params.temperature, top_p=params.top_p,
                                  top_k=params.top_k if params.top_k > 0 else 0)
                else:  # greedy: silence the model's default sampling settings
                    kwargs.update(temperature=None, top_p=None, top_k=None)
                seqs = self.model.generate(
                    input_ids=input_ids.to(device), attention_mask=attn.to(device), **kwargs
                )
                resp = seqs[:, width:].tolist()
                for r, i in enumerate(idx):
                    out[i] = self._trim(resp[r])
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

    def _trim(self, ids: list[int]) -> list[int]:
        """Cut after the first EOS (kept: it was sampled); drop the padding after it."""
        for k, t in enumerate(ids):
            if t in self.eos_ids:
                return ids[: k + 1]
        return ids
