"""One update row per episode for the conversation layout: an episode's step rows packed into one.

In ``env.prompt_layout=conversation`` (:mod:`serl.rollout.collector`) step ``t+1``'s prompt is step
``t``'s prompt, its sampled reply and the next user turn, so the last step's prompt and reply hold
the whole episode. The advantages, SERL's teacher log-probs and every per-step statistic are
computed on step rows (GiGPO's anchor states, the invalid-action penalty and SERL's per-step
hindsight need steps); :func:`pack_conversations` then merges each run of chained rows of one
trajectory into one row, so the update reads every observation once instead of once per later
step::

    packed prompt   = first step's prompt
    packed response = everything after it: reply 0, turn 1, reply 1, ..., reply T-1
    per token       = the step's own value on its reply's span (response mask, advantage, action
                      mask, teacher / reference / old log-probs); 0 on the user turns between

The loss per token is the step layout's: each reply token keeps its own step's advantage, mask and
teacher log-prob, and sees the same context it was sampled in. What changes is the row: an
episode, so ``actor.ppo_mini_batch_size`` / ``ppo_micro_batch_size`` count episodes and the
``seq-mean-*`` loss modes average over episodes. Rows that do not chain (the step layout, a
dropped step) stay as they are. :func:`unpack_to_steps` copies per-token results (the behaviour
log-probs the update records) back to the step rows, for SPEAR's replay buffer and the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from serl.train.batch import UpdateBatch


@dataclass(frozen=True)
class Span:
    """Where one step row's reply lies in its packed row.

    Attributes:
        row: the step row's position in the unpacked batch.
        offset: the first response position of the reply in the packed row.
        length: the reply's tokens.
    """

    row: int
    offset: int
    length: int


def _chains(prompt: Sequence[int], response: Sequence[int], next_prompt: Sequence[int]) -> bool:
    """``next_prompt`` begins with ``prompt + response`` and is longer."""
    n = len(prompt) + len(response)
    return len(next_prompt) > n and list(next_prompt[: len(prompt)]) == list(prompt) \
        and list(next_prompt[len(prompt) : n]) == list(response)


def _runs(batch: UpdateBatch, traj_ids: Sequence[str]) -> list[list[int]]:
    """Consecutive rows of one trajectory, each extending the previous one's prompt and reply."""
    runs: list[list[int]] = []
    for i in range(len(batch)):
        prev = runs[-1][-1] if runs else None
        if prev is not None and traj_ids[prev] == traj_ids[i] and _chains(
                batch.prompt_ids[prev], batch.response_ids[prev], batch.prompt_ids[i]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _pack_field(values: Sequence[Optional[torch.Tensor]], spans: list[Span], width: int, name: str
                ) -> Optional[torch.Tensor]:
    """One packed ``[width]`` float32 tensor from the members' per-token ``values`` (0 between
    replies); None when no member has one.

    Raises:
        ValueError: some members have values and others None (``old_log_probs`` /
            ``ref_log_probs`` must be all or nothing).
    """
    have = [values[s.row] is not None for s in spans]
    if not any(have):
        return None
    if not all(have) and name != "teacher_log_probs":
        raise ValueError(f"cannot pack {name}: some steps of an episode have them and some do not")
    out = torch.zeros(width, dtype=torch.float32)
    for s in spans:
        v = values[s.row]
        if v is not None:
            out[s.offset : s.offset + s.length] = v.reshape(-1)[: s.length].float()
    return out


def pack_conversations(batch: UpdateBatch, traj_ids: Sequence[str]) -> tuple[UpdateBatch, list[list[Span]]]:
    """Pack each run of chained step rows of one trajectory into one row (module docstring).

    Args:
        batch: step rows (``from_steps``, after SERL's teacher pass if any), in trajectory order.
        traj_ids: ``[n]`` the trajectory of each row (``StepTable.traj_uids``).

    Returns:
        ``(packed, spans)``: the packed batch (``index`` = 0..m-1, same ``serl_lambda``, ``prefix``
        and ``loss_coef``) and per packed row the :class:`Span` of each of its step rows. A
        step's action tokens stay selectable for SERL only if the teacher scored that step (its
        action mask is 0 in the packed row otherwise, so its weight is 1 as in the step layout).

    Raises:
        ValueError: ``traj_ids`` of another length than the batch, or log-probs present on some
            steps of an episode only (``old_log_probs``, ``ref_log_probs``).
    """
    if len(traj_ids) != len(batch):
        raise ValueError(f"{len(traj_ids)} trajectory ids for {len(batch)} rows")
    teacher, ref = batch.teacher_log_probs, batch.ref_log_probs
    rows = [_pack_run(batch, run) for run in _runs(batch, traj_ids)]
    packed = UpdateBatch(
        prompt_ids=[r["prompt_ids"] for r in rows], response_ids=[r["response_ids"] for r in rows],
        response_masks=[r["response_masks"] for r in rows], advantages=[r["advantages"] for r in rows],
        old_log_probs=[r["old_log_probs"] for r in rows],
        action_masks=[r["action_masks"] for r in rows] if batch.action_masks is not None else None,
        teacher_log_probs=[r["teacher_log_probs"] for r in rows] if teacher is not None else None,
        has_context=[r["has_context"] for r in rows] if teacher is not None else None,
        ref_log_probs=[r["ref_log_probs"] for r in rows] if ref is not None else None,
        serl_lambda=batch.serl_lambda, prefix=batch.prefix, loss_coef=batch.loss_coef)
    return packed, [r["spans"] for r in rows]


def _pack_run(batch: UpdateBatch, run: list[int]) -> dict:
    """The fields of the one packed row of the chained step rows ``run`` (see
    :func:`pack_conversations`), and their spans."""
    first, last = run[0], run[-1]
    p0 = len(batch.prompt_ids[first])
    response = list(batch.prompt_ids[last][p0:]) + list(batch.response_ids[last])
    spans = [Span(i, len(batch.prompt_ids[i]) - p0, len(batch.response_ids[i])) for i in run]
    width, teacher = len(response), batch.teacher_log_probs
    amask = [0] * width
    for s in spans:
        if batch.action_masks is not None and (teacher is None or teacher[s.row] is not None):
            amask[s.offset : s.offset + s.length] = list(batch.action_masks[s.row])[: s.length]
    return {
        "prompt_ids": list(batch.prompt_ids[first]), "response_ids": response, "spans": spans,
        "response_masks": _pack_field(batch.response_masks, spans, width, "response_masks"),
        "advantages": _pack_field(batch.advantages, spans, width, "advantages"),
        "old_log_probs": _pack_field(batch.old_log_probs, spans, width, "old_log_probs"),
        "action_masks": amask,
        "teacher_log_probs": None if teacher is None else _pack_field(teacher, spans, width, "teacher_log_probs"),
        "has_context": bool(batch.has_context) and any(batch.has_context[s.row] for s in spans),
        "ref_log_probs": None if batch.ref_log_probs is None else _pack_field(batch.ref_log_probs, spans, width,
                                                                              "ref_log_probs"),
    }


def unpack_to_steps(packed: UpdateBatch, batch: UpdateBatch, spans: list[list[Span]], name: str) -> None:
    """Copy the per-token field ``name`` (``old_log_probs`` or ``ref_log_probs``) of each packed
    row back onto its step rows in ``batch`` (a packed row without it leaves its steps None).

    Raises:
        ValueError: ``spans`` do not describe ``packed``.
    """
    if len(spans) != len(packed):
        raise ValueError(f"{len(spans)} span lists for {len(packed)} packed rows")
    src = getattr(packed, name)
    if src is None:
        return
    dst = getattr(batch, name)
    if dst is None:
        dst = [None] * len(batch)
        setattr(batch, name, dst)
    for row_spans, v in zip(spans, src):
        for s in row_spans:
            dst[s.row] = None if v is None else v.reshape(-1)[s.offset : s.offset + s.length].clone()
