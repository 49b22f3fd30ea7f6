"""SPEAR's self-imitation replay in the loop: take this step's replay batch, then offer this
step's rows to the buffer (``TrajectoryBufferBatch`` of SPEAR's ``ray_trainer_hybrid.py``,
``TencentYoutuResearch/SPEAR@7e84315:verl-agent/verl/trainer/ppo/ray_trainer_hybrid.py``).

The buffer itself, its admission, staleness and advantage recalibration are
:class:`serl.algos.spear.ReplayBuffer`; the replay loss is the update's (:mod:`serl.train.update`).
"""

from __future__ import annotations

from typing import Optional

import torch

from serl.algos.spear import ReplayBuffer, ReplayRow
from serl.train.batch import StepTable


def take_replay_batch(buf: Optional[ReplayBuffer], generator: torch.Generator,
                      metrics: dict[str, float]) -> list[ReplayRow]:
    """If the buffer is full, all of it becomes this step's replay batch with recalibrated
    advantages, and the buffer is emptied; otherwise no rows (also with no buffer). The sample
    draws from ``generator``. Adds ``replay/buffer_size`` and the consume metrics."""
    if buf is None:
        return []
    metrics["replay/buffer_size"] = float(buf.size())
    if not buf.is_full():
        return []
    replay, m = buf.consume(generator)
    metrics.update(m)
    return replay


def store_replay_rows(buf: Optional[ReplayBuffer], table: StepTable, adv: torch.Tensor,
                      old_lp: list[torch.Tensor], step: int, metrics: dict[str, float]) -> None:
    """``remove_old`` then admit this step's rows with a positive advantage. Each row of ``table``
    is offered with its behaviour log-probs ``old_lp`` (``[resp_len]`` each), its token advantages
    (estimator output ``adv`` ``[rows]`` × response mask after the filters × the row's
    :meth:`~serl.trajectory.Step.trained_mask`, before SERL's weights) and its score; a row that
    records its tool calls (``Step.info["tool_calls"]``, the math env) carries them, so the buffer
    admits it only with >= 1 call (SPEAR's math recipe). No-op without a buffer."""
    if buf is None:
        return
    scores = table.scores
    offered = []
    for i, s in enumerate(table.rows):
        mask = float(table.row_mask[i]) * torch.tensor(s.trained_mask(), dtype=torch.float32)
        extra = {"action_mask": torch.tensor(s.action_mask, dtype=torch.float32)}
        if "tool_calls" in s.info:
            extra["tool_calls"] = int(s.info["tool_calls"])
        offered.append(ReplayRow(
            prompt_ids=torch.tensor(s.prompt_ids, dtype=torch.long),
            response_ids=torch.tensor(s.response_ids, dtype=torch.long),
            response_mask=mask, old_log_probs=old_lp[i], advantages=float(adv[i]) * mask,
            reward=float(scores[i]), uid=table.uids[i], traj_uid=table.traj_uids[i],
            extra=extra))
    metrics.update(buf.update(offered, step))
