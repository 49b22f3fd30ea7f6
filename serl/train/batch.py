"""Step rows → per-row tables and padded tensors, and per-token log-probs of the sampled responses.

:class:`StepTable` holds the per-row scalars of one iteration (scores, penalties, GiGPO step
returns, Dr.BoT row masks) and follows the rows through the std filter (:meth:`StepTable.select`).

A batch row is ``[left-padded prompt | right-padded response]``; positions come from the
cumulative attention mask (verl ``compute_position_id_with_mask``). Rows are padded per
micro-batch, not to a global length, so short steps cost little.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch

from serl.algos.advantages import AdvantageInput
from serl.trajectory import Step


@dataclass
class StepTable:
    """The step rows of one iteration with their per-row scalars (spear.md §0, gigpo_grpo.md §1).

    Every tensor has shape ``[n]`` (``n`` = ``len(rows)``), aligned with ``rows``.

    Attributes:
        rows: the :class:`Step` records.
        index: position of each row in ``iter_steps(groups)`` order (identity before any filter).
        uids: group id of each row (``Group.uid``); traj_uids: trajectory id (``Trajectory.traj_uid``).
        group_index: long, integer group id; traj_index: long, integer trajectory id.
        score_raw: float32, episode reward + SPEAR tool-call bonus (spear.md §5), reward units;
            what the std filter ranks (spear.md §6.4).
        penalty: float32 >= 0, invalid-action penalty of the row (gigpo_grpo.md §4).
        invalid: bool, the row's action failed the format check.
        bonus: float32, the tool-call bonus included in ``score_raw`` (0 when off).
        step_rewards: float32, env reward of the row's own step.
        step_index: long, 0-based step id inside the trajectory.
        step_returns: float32, GiGPO's discounted return ``R_t`` (gigpo_grpo.md §3.1), computed on
            *all* rows before any filter; raw env rewards only (no bonus, no penalty).
        row_mask: float32 0/1; 0 = the whole response is masked by a Dr.BoT response filter
            (spear.md §6.3): the row stays in the advantage statistics but trains nothing.
    """

    rows: list[Step]
    index: torch.Tensor
    uids: list[str]
    traj_uids: list[str]
    group_index: torch.Tensor
    traj_index: torch.Tensor
    score_raw: torch.Tensor
    penalty: torch.Tensor
    invalid: torch.Tensor
    bonus: torch.Tensor
    step_rewards: torch.Tensor
    step_index: torch.Tensor
    step_returns: torch.Tensor
    row_mask: torch.Tensor

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def scores(self) -> torch.Tensor:
        """``[n]`` float32 score fed to the advantage estimator: ``score_raw − penalty``."""
        return self.score_raw - self.penalty

    def select(self, keep: Sequence[int]) -> "StepTable":
        """The table restricted to rows ``keep`` (positions in this table), in that order."""
        keep = [int(i) for i in keep]
        idx = torch.tensor(keep, dtype=torch.long)
        return replace(
            self,
            rows=[self.rows[i] for i in keep],
            uids=[self.uids[i] for i in keep],
            traj_uids=[self.traj_uids[i] for i in keep],
            **{name: getattr(self, name)[idx] for name in (
                "index", "group_index", "traj_index", "score_raw", "penalty", "invalid", "bonus",
                "step_rewards", "step_index", "step_returns", "row_mask")},
        )

    def advantage_input(self) -> AdvantageInput:
        """The estimator input of these rows (gigpo_grpo.md §2–§4): scores with the penalty
        subtracted, the penalty again for GiGPO's ``R_t``, the precomputed step returns, the raw
        observations as GiGPO anchors, and the unmasked response length of each row."""
        return AdvantageInput(
            scores=self.scores,
            group_index=self.group_index,
            traj_index=self.traj_index,
            step_rewards=self.step_rewards,
            step_index=self.step_index,
            invalid=self.invalid,
            step_returns=self.step_returns,
            penalty=self.penalty,
            anchor_obs=[s.observation for s in self.rows],
            response_length=torch.tensor([len(s.response_ids) for s in self.rows], dtype=torch.float32) * self.row_mask,
        )


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
