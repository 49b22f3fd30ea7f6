"""The SERL teacher log: sampled per-row JSONL of student and teacher texts (SERL, arXiv 2605.19447;
the original writes them in ``fit`` of ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/ray_trainer.py``).

Opt-in (``algorithm.serl.dump_teacher_log``, default off: a departure, the original wrote every row
of every step, which is large). Every ``teacher_log_every_n_steps`` iterations, up to
``teacher_log_sample_rows`` rows (a uniform sample seeded by the iteration; 0 = all rows) are
written, in batch order, to ``<run_dir>/teacher/<iteration>.jsonl``, atomically. Text fields are
cut to ``teacher_log_max_text_chars`` characters (0 = no cap) with a note of what was cut.

Rows are plain dicts; :func:`teacher_log_row` makes the standard one from a step row and its
:class:`~serl.hindsight.rendering.PrivilegedContext`. The trainer may add fields (e.g. token
weights); any JSON-able value is kept.

The same module writes the *trajectory trace* that ``serl report`` shows (:class:`TraceWriter`,
``<run_dir>/trace/<iteration>.jsonl``): on by default and bounded, for every algorithm; with SERL
it carries each action token's weight W and teacher − student log-prob gap, and the context.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from serl.algos.selective_weights import serl_token_weights
from serl.hindsight.rendering import PrivilegedContext, teacher_user_message
from serl.trajectory import Group, Step, Trajectory
from serl.utils import atomic_write_text

if TYPE_CHECKING:
    from serl.config import SerlConfig
    from serl.train.batch import StepTable, UpdateBatch

LOG_DIR = "teacher"


def teacher_log_row(
    group: Group,
    traj: Trajectory,
    step: Step,
    ctx: Optional[PrivilegedContext],
    *,
    mode: str,
    teacher_prompt: Optional[str] = None,
) -> dict[str, Any]:
    """The standard teacher-log row of one step row.

    Args:
        group, traj, step: the row.
        ctx: its privileged context (None: no context, the teacher prompt is the student prompt).
        mode: the ``sampling_mode`` in use.
        teacher_prompt: the teacher user message actually scored (e.g. after truncation); default
            :func:`~serl.hindsight.rendering.teacher_user_message` of the prompt and the block.

    Returns:
        ``{"uid", "traj_uid", "task_id", "step_id", "mode", "has_context", "sources",
        "section_headers", "student_prompt", "teacher_prompt", "response", "episode_reward",
        "won"}``; ``sources`` and ``section_headers`` describe the context (empty if None).
    """
    if teacher_prompt is None:
        teacher_prompt = step.prompt if ctx is None else teacher_user_message(step.prompt, ctx.block())
    return {
        "uid": group.uid,
        "traj_uid": traj.traj_uid,
        "task_id": traj.task.task_id,
        "step_id": step.step_id,
        "mode": mode,
        "has_context": ctx is not None,
        "sources": sorted(ctx.sources) if ctx is not None else [],
        "section_headers": [h for h, _ in ctx.sections] if ctx is not None else [],
        "student_prompt": step.prompt,
        "teacher_prompt": teacher_prompt,
        "response": step.response_text,
        "episode_reward": traj.episode_reward,
        "won": traj.won,
    }


def _cut(value: Any, max_chars: int) -> Any:
    if max_chars > 0 and isinstance(value, str) and len(value) > max_chars:
        return value[:max_chars] + f" [... {len(value) - max_chars} more chars cut]"
    return value


class TeacherLogWriter:
    """Writes the sampled teacher log of an iteration (see the module docstring).

    Args:
        run_dir: the run folder; files go to ``<run_dir>/teacher/<iteration>.jsonl``.
        cfg: the ``algorithm.serl`` section (``dump_teacher_log``, ``teacher_log_every_n_steps``,
            ``teacher_log_sample_rows``, ``teacher_log_max_text_chars``).
    """

    def __init__(self, run_dir: str | Path, cfg: "SerlConfig"):
        self.dir = Path(run_dir) / LOG_DIR
        self.enabled = bool(cfg.dump_teacher_log)
        self.every = max(1, int(cfg.teacher_log_every_n_steps))
        self.sample_rows = max(0, int(cfg.teacher_log_sample_rows))
        self.max_chars = max(0, int(cfg.teacher_log_max_text_chars))

    def should_write(self, iteration: int) -> bool:
        """True when the log is on and ``iteration % teacher_log_every_n_steps == 0``."""
        return self.enabled and iteration % self.every == 0

    def path(self, iteration: int) -> Path:
        return self.dir / f"{iteration}.jsonl"

    def write(self, iteration: int, rows: list[dict]) -> Optional[Path]:
        """Write a sample of ``rows`` for ``iteration``; returns the file, or None if nothing was
        written (log off, not this iteration, or no rows). Each written row gets an
        ``"iteration"`` and a ``"row"`` (its index in ``rows``) field.

        Raises:
            TypeError: a row is not JSON-serialisable.
        """
        if not self.should_write(iteration) or not rows:
            return None
        idx = list(range(len(rows)))
        if self.sample_rows and len(rows) > self.sample_rows:
            idx = sorted(random.Random(iteration).sample(idx, self.sample_rows))
        lines = []
        for i in idx:
            row = {"iteration": iteration, "row": i}
            row.update({k: _cut(v, self.max_chars) for k, v in rows[i].items()})
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        path = self.path(iteration)
        atomic_write_text(path, "".join(lines))
        return path


# ---------------------------------------------------------------------------- trajectory trace
TRACE_DIR = "trace"


def token_char_spans(tokenizer, response_ids: list[int]) -> list[list[int]]:
    """The ``[start, end)`` character span of each response token in the decoded reply.

    The reply is decoded prefix by prefix (special tokens skipped, as ``Step.response_text``), so a
    token that completes a multi-byte character gets the character and the tokens before it an
    empty span; a special token (EOS) gets an empty span at the end. Cost: ``L`` decodes of up to
    ``L`` tokens for ``L = len(response_ids)``.

    Returns:
        ``[L]`` pairs of character offsets into ``tokenizer.decode(response_ids, skip_special_tokens=True)``.
    """
    spans, prev = [], 0
    for i in range(len(response_ids)):
        n = len(tokenizer.decode(response_ids[: i + 1], skip_special_tokens=True))
        n = max(n, prev)
        spans.append([prev, n])
        prev = n
    return spans


def merged_spans(spans: list[list[int]], mask: list[int]) -> list[list[int]]:
    """The character spans of the runs of masked tokens (e.g. the action tokens), merged.

    Args:
        spans: ``[L]`` ``[start, end)`` per token (:func:`token_char_spans`).
        mask: ``[L]`` 0/1 per token.
    """
    out: list[list[int]] = []
    for (a, b), m in zip(spans, mask):
        if not m or a == b:
            continue
        if out and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b])
    return out


def trace_row(traj: Trajectory, step: Step, spans: list[list[int]], advantage: float, trained: bool,
              serl: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One trace row: what ``serl report`` shows of a step row.

    Args:
        traj, step: the row.
        spans: ``[resp_len]`` character span of each response token (:func:`token_char_spans`).
        advantage: the row's advantage (before SERL's weights).
        trained: the row's Dr.BoT mask is 1 (it trains).
        serl: None without SERL weights on this row, else ``{"lambda", "has_context", "context",
            "sources", "weights" [resp_len], "lp_gap" [resp_len]}`` (W and teacher − student
            log-prob in nats per token; see :func:`serl.algos.selective_weights.serl_token_weights`).

    Returns:
        A JSON-able dict (task, step, reply, ``tokens``, ``action_mask``, ``action_spans`` ...);
        ``loss_mask``: per token, 0 where the rollout inserted it rather than sampled it (tool
        outputs and chat glue of a math row; :attr:`Step.loss_mask`), None for step rows.
    """
    return {
        "uid": traj.uid, "traj_uid": traj.traj_uid, "task_id": traj.task.task_id,
        "task_type": traj.task.task_type, "task_text": traj.task_text, "episode_reward": traj.episode_reward,
        "won": traj.won, "length": traj.length, "step_id": step.step_id, "observation": step.observation,
        "response": step.response_text, "action": step.action, "action_valid": step.action_valid,
        "reward": step.reward, "feedback": step.feedback, "done": step.done,
        "advantage": float(advantage), "trained": bool(trained),
        "tokens": spans, "action_mask": list(step.action_mask),
        "action_spans": merged_spans(spans, step.action_mask),
        "loss_mask": None if step.loss_mask is None else step.trained_mask(), "serl": serl,
    }


def serl_trace_fields(advantage: float, student_lp: Optional[torch.Tensor], teacher_lp: Optional[torch.Tensor],
                      action_mask: list[int], trained: bool, lam: float, weight_clip: float,
                      ctx: Optional[PrivilegedContext], skipped: bool = False) -> dict[str, Any]:
    """SERL's view of one row for the trace: its context and per-token weights W.

    W is :func:`serl.algos.selective_weights.serl_token_weights` (arXiv 2605.19447;
    ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/core_algos.py``) recomputed for this row with the
    behaviour log-probs as the student's: exact for ``student_logprob=old`` and for the first
    mini-batch of ``current``, close otherwise (the update moves the student a little).

    Args:
        advantage: the row's advantage (only the sign matters).
        student_lp: ``[L]`` behaviour log-probs (nats) of the response tokens; None for a row
            that ``actor.skip_zero_advantage_rows`` left out of the update (no weights then).
        teacher_lp: ``[L]`` teacher log-probs under the privileged prompt, or None (no context,
            or λ_eff = 0).
        action_mask: ``[L]`` 0/1 action tokens.
        trained: the row's Dr.BoT mask is 1 (a masked row gets W = 1, as in the update).
        lam: λ_eff; weight_clip: c.
        ctx: the row's privileged context (None: no context).
        skipped: the row has a context but the teacher did not score it, because it trains
            nothing (:func:`serl.algos.selective_weights.teacher_rows`); its W is 1.

    Returns:
        ``{"lambda", "has_context", "context", "sources", "weights", "lp_gap", "teacher_scored"}``;
        ``weights`` and ``lp_gap`` (teacher − student, ``[L]`` rounded to 4 decimals) are None
        without teacher log-probs.
    """
    shown = ctx is not None and (teacher_lp is not None or skipped)
    out: dict[str, Any] = {"lambda": float(lam), "has_context": shown,
                           "context": ctx.block() if shown else None,
                           "sources": sorted(ctx.sources) if shown else [],
                           "weights": None, "lp_gap": None, "teacher_scored": teacher_lp is not None}
    if teacher_lp is None or student_lp is None:  # no student log-probs: left out of the update
        return out
    n = len(action_mask)
    selected = torch.tensor(action_mask, dtype=torch.bool).unsqueeze(0) & bool(trained)
    W, _ = serl_token_weights(torch.full((1, n), float(advantage)), student_lp[None, :n], teacher_lp[None, :n],
                              selected, lam, weight_clip)
    gap = (teacher_lp[:n].float() - student_lp[:n].float()).tolist()
    out["weights"] = [round(w, 4) for w in W[0].tolist()]
    out["lp_gap"] = [round(g, 4) for g in gap]
    return out


def trace_sample(traj_uids: list[str], iteration: int, max_rows: int) -> list[int]:
    """Which rows to trace: whole trajectories, drawn in a random order seeded by ``iteration``,
    while the rows taken stay within ``max_rows`` (the first drawn trajectory is cut to
    ``max_rows`` rows if longer). Returns row indices in batch order.

    Args:
        traj_uids: ``[rows]`` the trajectory of each row.
    """
    by_traj: dict[str, list[int]] = {}
    for i, u in enumerate(traj_uids):
        by_traj.setdefault(u, []).append(i)
    order = list(by_traj)
    random.Random(iteration).shuffle(order)
    picked: list[int] = []
    for u in order:
        rows = by_traj[u]
        if not picked:
            picked.extend(rows[:max_rows])
        elif len(picked) + len(rows) <= max_rows:
            picked.extend(rows)
    return sorted(picked)


class TraceWriter:
    """Writes the sampled trajectory trace that ``serl report`` shows: ``<run_dir>/trace/<iteration>.jsonl``.

    On by default (``trainer.trace_freq``): its cost is a few milliseconds per iteration (decoding
    the sampled replies token by token). Bounded: every ``trace_freq`` iterations (0 = off), at most
    ``trace_max_rows`` step rows (whole trajectories, :func:`trace_sample`), text fields cut to
    ``trace_max_text_chars``, and at most ``trace_max_bytes`` per file (trajectories are dropped
    from the end until it fits; one row is always kept). A serl addition: the original SERL and
    verl-agent log no trajectories.

    Args:
        run_dir: the run folder.
        cfg: the ``trainer`` section.
    """

    TEXT_FIELDS = ("observation", "feedback", "task_text")

    def __init__(self, run_dir: str | Path, cfg):
        self.dir = Path(run_dir) / TRACE_DIR
        self.every = int(cfg.trace_freq)
        self.max_rows = int(cfg.trace_max_rows)
        self.max_chars = int(cfg.trace_max_text_chars)
        self.max_bytes = int(cfg.trace_max_bytes)

    def should_write(self, iteration: int) -> bool:
        """True when the trace is on and ``iteration % trace_freq == 0``."""
        return self.every > 0 and self.max_rows > 0 and iteration % self.every == 0

    def write(self, iteration: int, rows: list[dict]) -> Optional[Path]:
        """Write ``rows`` (already sampled, batch order) for ``iteration``; returns the file or None.

        Raises:
            TypeError: a row is not JSON-serialisable.
        """
        if not self.should_write(iteration) or not rows:
            return None
        lines = []
        for r in rows:
            r = {"iteration": iteration, **{k: _cut(v, self.max_chars) if k in self.TEXT_FIELDS else v
                                             for k, v in r.items()}}
            if r.get("serl") and r["serl"].get("context"):
                r["serl"] = {**r["serl"], "context": _cut(r["serl"]["context"], self.max_chars)}
            lines.append(json.dumps(r, ensure_ascii=False) + "\n")
        while len(lines) > 1 and sum(len(x.encode()) for x in lines) > self.max_bytes:
            last = json.loads(lines[-1])["traj_uid"]
            kept = [x for x in lines if json.loads(x)["traj_uid"] != last]
            lines = kept if kept else lines[:1]
        path = self.dir / f"{iteration}.jsonl"
        atomic_write_text(path, "".join(lines))
        return path


def write_iteration_trace(trace: TraceWriter, tokenizer, step: int, groups: list[Group], table: "StepTable",
                          adv: torch.Tensor, batch: "UpdateBatch", serl_cfg: Optional["SerlConfig"],
                          row_contexts: list) -> None:
    """Write the sampled, bounded trajectory trace of iteration ``step`` (1-based) when due: whole
    trajectories of the trained rows with token spans, advantages (``adv`` ``[rows]``) and, with
    SERL (``serl_cfg`` not None), each token's weight W (after the update: ``batch.old_log_probs``
    are all known) and the context the teacher saw (``row_contexts``, per row of ``table``)."""
    if not trace.should_write(step):
        return
    trajs = {t.traj_uid: t for g in groups for t in g.trajectories}
    rows = []
    for i in trace_sample(table.traj_uids, step, trace.max_rows):
        s, trained = table.rows[i], bool(table.row_mask[i] > 0)
        serl = None
        if serl_cfg is not None:
            t_lp = batch.teacher_log_probs[i] if batch.teacher_log_probs is not None else None
            ctx = row_contexts[i] if i < len(row_contexts) else None
            skipped = ctx is not None and t_lp is None  # a context, but the row trains nothing
            serl = serl_trace_fields(float(adv[i]), batch.old_log_probs[i], t_lp, s.action_mask, trained,
                                     batch.serl_lambda, serl_cfg.weight_clip, ctx, skipped)
        spans = token_char_spans(tokenizer, s.response_ids)
        rows.append(trace_row(trajs[table.traj_uids[i]], s, spans, float(adv[i]), trained, serl))
    trace.write(step, rows)
