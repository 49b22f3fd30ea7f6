"""Step rows → padded tensors, and per-token log-probs of the sampled responses.

A batch row is ``[left-padded prompt | right-padded response]``; positions come from the
cumulative attention mask (verl ``compute_position_id_with_mask``). Rows are padded per
micro-batch, not to a global length, so short steps cost little.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class RowBatch:
    """Tensors for ``b`` rows with prompt width ``P`` and response width ``R``.

    Attributes:
        input_ids: ``[b, P+R]`` long.
        attention_mask: ``[b, P+R]`` long, 0 on padding.
        position_ids: ``[b, P+R]`` long.
        responses: ``[b, R]`` long, the sampled ids (padding = pad id).
        response_mask: ``[b, R]`` float, 1 on sampled tokens.
        action_mask: ``[b, R]`` float, 1 on action tokens (serl.md §2.3).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    action_mask: torch.Tensor

    def to(self, device) -> "RowBatch":
        return RowBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def collate(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
            action_masks: Optional[list[list[int]]] = None) -> RowBatch:
    """Pad ``b`` (prompt, response) id lists into a :class:`RowBatch`.

    Raises:
        ValueError: an empty response, or lists of different lengths.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if any(len(r) == 0 for r in responses):
        raise ValueError("a step row has an empty response; rows must hold at least one sampled token")
    b = len(prompts)
    P = max(len(p) for p in prompts)
    R = max(len(r) for r in responses)
    input_ids = torch.full((b, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((b, P + R), dtype=torch.long)
    amask = torch.zeros((b, R), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        input_ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        input_ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, P - len(p) : P + len(r)] = 1
        if action_masks is not None:
            amask[i, : len(r)] = torch.tensor(action_masks[i], dtype=torch.float32)
    position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
    return RowBatch(
        input_ids=input_ids,
        attention_mask=attn,
        position_ids=position_ids,
        responses=input_ids[:, P:].clone(),
        response_mask=attn[:, P:].float(),
        action_mask=amask,
    )


def response_logprobs(model, batch: RowBatch, temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs of the sampled response tokens under ``model``.

    Only the last ``R + 1`` positions go through the LM head (``logits_to_keep``), so the
    ``[b, P+R, vocab]`` logits tensor is never built. Logits are divided by ``temperature``
    (the rollout temperature, as verl) and the log-softmax is taken in float32.

    Args:
        model: a causal LM.
        batch: the rows.
        temperature: > 0.
        with_entropy: also return the per-token entropy.

    Returns:
        ``(logprob, entropy)``: ``[b, R]`` float32 each (``entropy`` None unless asked); values on
        padding positions are meaningless and must be masked with ``batch.response_mask``.
    """
    R = batch.responses.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=R + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float() / temperature  # position t predicts token t+1
    logp_all = torch.log_softmax(logits, dim=-1)
    logprob = logp_all.gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprob, entropy
