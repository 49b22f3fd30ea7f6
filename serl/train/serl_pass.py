"""SERL's teacher pass (arXiv 2605.19447): privileged contexts, teacher prompts, and the teacher's
log-probs of the student's own sampled tokens, once per iteration.

The teacher is frozen during the update (one inference pass per iteration, as
``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/ray_trainer.py``). What a context shows is
:mod:`serl.hindsight`; the weight rule applied to these log-probs is
:func:`serl.algos.selective_weights.serl_token_weights`, inside the update (:mod:`serl.train.update`).
"""

from __future__ import annotations

from typing import Optional

import torch

from serl.algos.selective_weights import effective_lambda, teacher_rows
from serl.config import Config
from serl.hindsight.builder import SerlContextBuilder
from serl.models.teacher import teacher_prompt_ids
from serl.train.batch import StepTable, UpdateBatch
from serl.train.scoring import Scorer
from serl.train.teacher_log import TeacherLogWriter, teacher_log_row
from serl.trajectory import Group, Step, iter_steps


class SerlTeacherPass:
    """Fills an update batch's ``serl_lambda``, ``teacher_log_probs`` and ``has_context``.

    Args:
        cfg: the run's config (``algorithm.serl.*``, ``data.max_prompt_length``).
        teacher: the lagged teacher (``.model`` is scored).
        tokenizer: the policy's tokenizer (teacher prompts are rendered with its chat template).
        context_builder: builds each row's privileged context from the iteration's groups.
        teacher_log: the ``teacher_log/`` writer (rank 0 only).
        scorer: runs the inference pass.

    Attributes:
        row_contexts: per kept row of the last pass, the context the teacher saw (None: no
            context, or it did not fit); the trajectory trace shows them.
    """

    def __init__(self, cfg: Config, teacher, tokenizer, context_builder: SerlContextBuilder,
                 teacher_log: TeacherLogWriter, scorer: Scorer):
        self.cfg, self.teacher, self.tokenizer = cfg, teacher, tokenizer
        self.context_builder, self.teacher_log, self.scorer = context_builder, teacher_log, scorer
        self.row_contexts: list = []

    def run(self, batch: UpdateBatch, groups: list[Group], table: StepTable, adv: torch.Tensor,
            update_step: int, step: int, metrics: dict[str, float], pbar=None) -> None:
        """Set ``batch.serl_lambda`` = λ_eff(u) for ``update_step`` u, and per row the teacher's
        ``[resp_len]`` log-probs under its privileged prompt, or None for a row with no context
        (one that fits ``max_reprompt_len``), for every row once λ_eff = 0, and for a row that
        trains nothing (advantage ``adv`` ``[rows]`` exactly 0, or masked) with
        ``algorithm.serl.skip_zero_advantage_rows`` (:func:`teacher_rows`). ``step`` is the
        1-based global step (the teacher log's). Adds the ``serl/*`` metrics (with
        ``algorithm.serl.teacher_prefix_reuse`` on conversation rows,
        ``serl/teacher_prefix_reused_fraction``: the share of the teacher's token positions that
        came from the row before, :func:`serl.train.scoring.score_logprobs_reusing_prefixes`)."""
        sc, n = self.cfg.algorithm.serl, len(batch)
        batch.serl_lambda = effective_lambda(update_step, sc.mixing_lambda, sc.lambda_decay_steps)
        self.row_contexts = []  # no stale contexts in the trace once λ_eff = 0
        if batch.serl_lambda <= 0.0:
            metrics.update({"serl/teacher_inactive_after_decay": 1.0, "serl/reprompt_sample_fraction": 0.0,
                            "serl/teacher_scored_fraction": 0.0})
            batch.teacher_log_probs, batch.has_context = [None] * n, [False] * n
            return
        contexts, t_prompts = self._teacher_prompts(groups, table, step)
        has_ctx = [p is not None for p in t_prompts]
        todo = teacher_rows(has_ctx, adv, table.row_mask, sc.skip_zero_advantage_rows)
        reuse = sc.teacher_prefix_reuse and any(s.prompt_format == "conversation" for s in table.rows)
        tokens: dict[str, int] = {}
        scored = self.scorer.score(self.teacher.model, batch.select(todo), "teacher", pbar,  # also when empty: N > 1 gathers
                                   prompt_ids=[t_prompts[i] for i in todo], reuse_prefixes=reuse, stats=tokens)
        if reuse:  # the share of the teacher's positions taken from the row before (this rank's rows)
            metrics["serl/teacher_prefix_reused_fraction"] = tokens.get("reused_tokens", 0) / max(
                1, tokens.get("reused_tokens", 0) + tokens.get("run_tokens", 0))
        out: list[Optional[torch.Tensor]] = [None] * n
        for i, lp in zip(todo, scored):
            out[i] = lp
        metrics.update(self._metrics(table.rows, contexts, has_ctx))
        metrics["serl/teacher_scored_fraction"] = len(todo) / max(1, n)
        batch.teacher_log_probs, batch.has_context = out, has_ctx

    def _teacher_prompts(self, groups: list[Group], table: StepTable, step: int
                         ) -> tuple[list, list[Optional[list[int]]]]:
        """The privileged context and teacher prompt ids of each row of ``table`` (None: no
        context, or it does not fit); writes the teacher log when due.

        Contexts are built from all of ``groups`` (so the std filter does not change what a kept
        row's hindsight shows), then restricted to the kept rows ``table.index``.

        Raises:
            ValueError: ``table`` does not come from ``groups``.
        """
        sc = self.cfg.algorithm.serl
        keep = table.index.tolist()
        contexts, triples = self.context_builder.build(groups), list(iter_steps(groups))
        contexts, triples = [contexts[i] for i in keep], [triples[i] for i in keep]
        if len(triples) != len(table):
            raise ValueError(f"{len(table)} rows but {len(triples)} selected rows of the groups")
        cap = sc.max_reprompt_len or self.cfg.data.max_prompt_length
        t_prompts: list[Optional[list[int]]] = []
        for s, ctx in zip(table.rows, contexts):
            ids, ok = (None, False) if ctx is None else teacher_prompt_ids(
                self.tokenizer, s.prompt, ctx.block(), cap, sc.reprompt_truncation, s.prompt_format, s.prompt_ids)
            t_prompts.append(ids if ok else None)
        self.row_contexts = [c if tp is not None else None for c, tp in zip(contexts, t_prompts)]
        if self.teacher_log.should_write(step):
            self.teacher_log.write(step, [
                teacher_log_row(g, t, s, ctx if tp is not None else None, mode=sc.sampling_mode,
                                teacher_prompt=self.tokenizer.decode(tp) if tp is not None else None)
                for (g, t, s), ctx, tp in zip(triples, contexts, t_prompts)])
        return contexts, t_prompts

    def _metrics(self, rows: list[Step], contexts: list, has_ctx: list[bool]) -> dict[str, float]:
        """Driver-side SERL metrics of the iteration (the context builder's, plus context and
        action-token fractions)."""
        n, n_ctx = len(rows), sum(has_ctx)
        metrics = dict(self.context_builder.metrics())
        metrics.update({
            "serl/teacher_inactive_after_decay": 0.0,
            # after length capping: rows whose context did not fit at all train as plain GRPO
            "serl/reprompt_sample_fraction": n_ctx / max(1, n),
            "serl/action_token_fraction": sum(sum(s.action_mask) for s in rows) / max(1, sum(len(s.response_ids) for s in rows)),
        })
        if n_ctx:
            metrics["serl/action_parse_failure_fraction"] = sum(
                1 for s, h in zip(rows, has_ctx) if h and not any(s.action_mask)) / n_ctx
        metrics["serl/context_dropped_by_length_fraction"] = sum(
            1 for c, h in zip(contexts, has_ctx) if c is not None and not h) / max(1, n)
        return metrics
