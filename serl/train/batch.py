"""Step rows → per-row tables, the update batch, padded tensors, and per-token log-probs.

:class:`StepTable` holds the per-row scalars of one iteration (scores, penalties, GiGPO step
returns, Dr.BoT row masks) and follows the rows through the std filter (:meth:`StepTable.select`).

:class:`UpdateBatch` carries the rows that train (ids, masks, token advantages and old / teacher /
reference log-probs) through the update, as verl's ``DataProto`` or the ``inputs`` dict of TRL's
GRPO trainer do; mini- and micro-batches are :meth:`UpdateBatch.split` / :meth:`UpdateBatch.select`
of it, and a SPEAR replay batch is the same object built from stored rows
(:meth:`UpdateBatch.from_replay_rows`). :func:`response_logprobs` gives a model's per-token
log-probs of a :class:`RowBatch` (the scoring loop over frozen models: :mod:`serl.train.scoring`).

A batch row is ``[left-padded prompt | right-padded response]``; positions come from the
cumulative attention mask (verl ``compute_position_id_with_mask``). Rows are padded per
micro-batch, not to a global length, so short steps cost little.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from serl.algos.advantages import AdvantageInput
from serl.trajectory import Step

if TYPE_CHECKING:
    from serl.algos.spear import ReplayRow


@dataclass
class StepTable:
    """The step rows of one iteration with their per-row scalars (verl-agent's step rows:
    ``langfengQ/verl-agent@d0b9724:agent_system/multi_turn_rollout/rollout_loop.py``).

    Every tensor has shape ``[n]`` (``n`` = ``len(rows)``), aligned with ``rows``.

    Attributes:
        rows: the :class:`Step` records.
        index: position of each row in ``iter_steps(groups)`` order (identity before any filter).
        uids: group id of each row (``Group.uid``); traj_uids: trajectory id (``Trajectory.traj_uid``).
        group_index: long, integer group id; traj_index: long, integer trajectory id.
        score_raw: float32, episode reward + SPEAR tool-call bonus (SPEAR, arXiv 2509.22601),
            reward units; what the std filter ranks.
        penalty: float32 >= 0, invalid-action penalty of the row (as verl-agent).
        invalid: bool, the row's action failed the format check.
        bonus: float32, the tool-call bonus included in ``score_raw`` (0 when off).
        step_rewards: float32, env reward of the row's own step.
        step_index: long, 0-based step id inside the trajectory.
        step_returns: float32, GiGPO's discounted return ``R_t`` (arXiv 2505.10978), computed on
            *all* rows before any filter; raw env rewards only (no bonus, no penalty).
        row_mask: float32 0/1; 0 = the whole response is masked by a Dr.BoT response filter
            (as SPEAR): the row stays in the advantage statistics but trains nothing.
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
        """The estimator input of these rows (GRPO / GiGPO): scores with the penalty
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
        action_mask: ``[b, R]`` float, 1 on action tokens (SERL's action mask, arXiv 2605.19447).
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
            action_masks: Optional[list[list[int]]] = None,
            logit_masks: Optional[Sequence[torch.Tensor]] = None) -> RowBatch:
    """Pad ``b`` (prompt, response) id lists into a :class:`RowBatch`.

    ``logit_masks`` (one ``[L_i]`` tensor per row, e.g. the response masks): ``response_mask`` keeps
    only their non-zero positions, so the LM head skips tokens without loss (a conversation's user
    turns, a math row's tool outputs; log-prob 0 there); an all-zero row keeps every position.

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
    response_mask = attn[:, P:].float()
    for i, m in enumerate(logit_masks or ()):
        keep = m.reshape(-1)[: len(responses[i])] != 0
        if bool(keep.any()):
            response_mask[i, : len(responses[i])] *= keep.float()
    return RowBatch(
        input_ids=input_ids,
        attention_mask=attn,
        position_ids=position_ids,
        responses=input_ids[:, P:].clone(),
        response_mask=response_mask,
        action_mask=amask,
    )


#: tokens per LM-head chunk when no gradient is taken (bounds the ``[tokens, vocab]`` logits)
SCORE_CHUNK_TOKENS = 2048


def _is_fsdp_module(model) -> bool:
    """True for a module sharded with torch's FSDP2 ``fully_shard`` (an ``FSDPModule``)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed support
        return False
    return isinstance(model, FSDPModule)


def _lm_head_parts(model):
    """``(decoder, lm_head)`` of a standard causal LM whose logits are ``lm_head(decoder(x))``
    (Llama, Qwen2, Mistral, ...); None for models that post-process the logits (soft-capping,
    logit scaling) or expose no decoder, which then take the ``logits_to_keep`` path; None for an
    FSDP-sharded model too (its root unit gathers the embeddings and LM head only when the model
    itself is called)."""
    if _is_fsdp_module(model):
        return None
    cfg = getattr(model, "config", None)
    if getattr(cfg, "final_logit_softcapping", None) is not None or getattr(cfg, "logits_scaling", None) is not None:
        return None
    get_decoder, head = getattr(model, "get_decoder", None), getattr(model, "lm_head", None)
    if get_decoder is None or not isinstance(head, torch.nn.Linear):
        return None
    try:
        decoder = get_decoder()
    except (AttributeError, NotImplementedError):
        return None
    return (decoder, head) if decoder is not None and decoder is not model else None


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The float32 log-prob ``[N]`` (nats) of ``targets`` ``[N]`` under ``[N, vocab]`` ``logits``
    divided by ``temperature``: log softmax(z / T) at the target (verl's ``logprobs_from_logits``,
    ``verl/utils/torch_functional.py``, on the logits its ``dp_actor.py`` divides by the
    temperature); with ``with_entropy`` also the entropy ``[N]`` of that distribution,
    ``logsumexp(z) - sum(softmax(z) * z)``, else None."""
    logits = logits.float() / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logprob = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprob, entropy


@dataclass
class PackedRows:
    """The real (non-padding) tokens of a :class:`RowBatch` as one sequence: verl's
    ``use_remove_padding`` (``volcengine/verl`` ``dp_actor.py``, there with flash-attention's
    varlen kernels), TRL's ``padding_free``.

    Rows are concatenated in order; each row restarts its positions at 0, and the attention of
    one row must not see another: ``attention_kwargs`` carries the row boundaries under the
    names of transformers' flash-attention kwargs (``cu_seq_lens_q`` ...), which
    :mod:`serl.models.attention` and ``flash_attention_2`` read; any other attention
    implementation gets transformers' block-diagonal mask built from the restarting positions.

    Attributes:
        input_ids: ``[1, T]`` long, ``T`` = the real tokens of all rows.
        position_ids: ``[1, T]`` long, 0 … ``L_i − 1`` within row ``i``.
        cu_seq_lens: ``[b + 1]`` int32, row ``i`` = positions ``cu_seq_lens[i] … cu_seq_lens[i+1] − 1``.
        max_length: the longest row (tokens).
        predict_index: ``[N]`` long, ``N`` = ``response_mask.sum()``: the packed position whose
            hidden state predicts each response token, in the row-major order of
            ``batch.responses[batch.response_mask.bool()]``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_length: int
    predict_index: torch.Tensor

    def attention_kwargs(self) -> dict[str, Any]:
        """The row boundaries as transformers passes them down to the attention function."""
        return {"cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}


def pack_rows(batch: RowBatch) -> PackedRows:
    """Pack the real tokens of ``batch`` (``[b, P+R]``, left-padded prompts and right-padded
    responses, as :func:`collate` builds it) into one sequence; see :class:`PackedRows`.

    Raises:
        ValueError: a row with no prompt token (nothing would predict its first response token).
    """
    keep = batch.attention_mask.bool()  # [b, P+R]
    R = batch.responses.shape[1]
    P = keep.shape[1] - R
    if P < 1 or not bool(keep[:, P - 1].all()):
        raise ValueError("every row needs at least one prompt token to pack it")
    lengths = keep.sum(1)
    packed_at = (keep.flatten().cumsum(0) - 1).view_as(keep)  # packed position of each real slot
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=keep.device)
    cu[1:] = lengths.cumsum(0)
    return PackedRows(
        input_ids=batch.input_ids[keep].unsqueeze(0),
        position_ids=batch.position_ids[keep].unsqueeze(0),
        cu_seq_lens=cu,
        max_length=int(lengths.max()),
        predict_index=packed_at[:, P - 1 : P + R - 1][batch.response_mask.bool()],
    )


def response_logprobs(model, batch: RowBatch, temperature: float = 1.0, with_entropy: bool = False,
                      response_only: bool = True, remove_padding: bool = True
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs of the sampled response tokens under ``model``.

    ``remove_padding`` (default; verl's ``use_remove_padding``): the rows run as one packed
    sequence of their real tokens (:func:`pack_rows`), so no padding goes through the model and
    each row's attention is causal within itself; else the padded ``[b, P+R]`` batch runs with
    its attention mask. ``response_only`` (default): the decoder runs, then the LM head only on
    the hidden states that predict a sampled token (``response_mask`` = 1), so neither the
    prompt positions nor the response padding go through the ``hidden × vocab`` projection;
    without a gradient the head runs in chunks of :data:`SCORE_CHUNK_TOKENS` tokens. Models
    whose logits are not ``lm_head(hidden)`` (and DDP/FSDP-wrapped ones) call the model itself
    with ``logits_to_keep``: the predicting positions when packed, else the last ``R+1``
    positions of every row (``response_only=False`` is that former path). All paths give the
    same log-probs up to float rounding. Logits are divided by ``temperature`` (the rollout
    temperature, as verl) and normalised in float32.

    Args:
        model: a causal LM.
        batch: the rows.
        temperature: > 0.
        with_entropy: also return the per-token entropy (nats).
        response_only: see above.
        remove_padding: see above.

    Returns:
        ``(logprob, entropy)``: ``[b, R]`` float32 each (``entropy`` None unless asked); values on
        padding positions are meaningless (0 except on the unpacked full path) and must be
        masked with ``batch.response_mask``.

    Raises:
        ValueError: ``remove_padding`` with a row that has no prompt token.
    """
    parts = _lm_head_parts(model) if response_only else None
    if parts is None and not remove_padding:
        return _response_logprobs_full(model, batch, temperature, with_entropy)
    sel = batch.response_mask.bool()
    targets = batch.responses[sel]
    if parts is None:  # packed, through the model itself: logits at the predicting positions only
        packed = pack_rows(batch)
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                       logits_to_keep=packed.predict_index, **packed.attention_kwargs()).logits[0]
        lp_sel, ent_sel = token_logprobs(logits, targets, temperature, with_entropy)
    else:
        decoder, head = parts
        h = _predicting_hidden(decoder, batch, remove_padding)
        lp_sel, ent_sel = _head_logprobs(head, h, targets, temperature, with_entropy)
    return _scatter_rows(sel, lp_sel, ent_sel if with_entropy else None)


def _predicting_hidden(decoder, batch: RowBatch, remove_padding: bool) -> torch.Tensor:
    """``[N, H]`` decoder hidden states at the positions that predict the sampled tokens
    (position t predicts token t+1), in the row-major order of ``batch.response_mask``;
    packed (:func:`pack_rows`) or padded."""
    if remove_padding:
        packed = pack_rows(batch)
        return decoder(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                       **packed.attention_kwargs()).last_hidden_state[0, packed.predict_index]
    R = batch.responses.shape[1]
    P = batch.input_ids.shape[1] - R
    hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     position_ids=batch.position_ids, use_cache=False).last_hidden_state
    return hidden[:, P - 1 : P + R - 1][batch.response_mask.bool()]


def _head_logprobs(head: torch.nn.Linear, h: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``[N]`` log-probs (and entropies) of ``targets`` ``[N]`` from hidden states ``h`` ``[N, H]``
    through the LM head; without a gradient in chunks of :data:`SCORE_CHUNK_TOKENS` tokens, which
    bound the ``[N, vocab]`` logits of a scoring pass."""
    if torch.is_grad_enabled():
        return token_logprobs(head(h), targets, temperature, with_entropy)
    chunks = [token_logprobs(head(h[k : k + SCORE_CHUNK_TOKENS]), targets[k : k + SCORE_CHUNK_TOKENS],
                              temperature, with_entropy) for k in range(0, h.shape[0], SCORE_CHUNK_TOKENS)]
    if not chunks:
        empty = h.new_zeros(0, dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    lp = torch.cat([c[0] for c in chunks])
    return lp, torch.cat([c[1] for c in chunks]) if with_entropy else None


def _scatter_rows(sel: torch.Tensor, lp_sel: torch.Tensor, ent_sel: Optional[torch.Tensor]
                  ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``[N]`` per-token values back into ``[b, R]`` float32 rows at ``sel`` (``[b, R]`` bool); 0 elsewhere."""
    def scatter(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(sel.shape, dtype=torch.float32, device=v.device).masked_scatter(sel.to(v.device), v.float())
    return scatter(lp_sel), None if ent_sel is None else scatter(ent_sel)


def _response_logprobs_full(model, batch: RowBatch, temperature: float, with_entropy: bool
                            ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The padded ``logits_to_keep=R+1`` path of :func:`response_logprobs` (every row's last ``R+1``
    positions through the LM head, padding included)."""
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


def length_buckets(lengths: Sequence[int], max_rows: int, max_tokens: Optional[int] = None) -> list[list[int]]:
    """Micro-batches of row positions, rows sorted by length so each micro-batch pads little.

    Rows are taken shortest first; a micro-batch closes at ``max_rows`` rows or when its padded
    size (rows × longest row) would pass ``max_tokens`` (verl's ``use_dynamic_bsz`` budget,
    ``ppo_max_token_len_per_gpu``); a row longer than the budget still gets a micro-batch of its
    own. The order inside the sort is stable (equal lengths keep their order).

    Args:
        lengths: ``[n]`` padded-row lengths (prompt + response tokens).
        max_rows: >= 1 rows per micro-batch.
        max_tokens: padded-token budget per micro-batch; None = rows only.

    Returns:
        Lists of positions into ``lengths``; together they hold every position once.

    Raises:
        ValueError: ``max_rows`` < 1.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    for i in order:
        cur = out[-1] if out else None
        fits = cur is not None and len(cur) < max_rows and (
            max_tokens is None or (len(cur) + 1) * lengths[i] <= max_tokens)
        if fits:
            cur.append(i)
        else:
            out.append([i])
    return out


def pad_rows(values: Sequence[Optional[torch.Tensor]], width: int) -> torch.Tensor:
    """Right-pad 1-D per-row tensors with zeros into a ``[len(values), width]`` float32 tensor;
    a None row is all zeros.

    Raises:
        ValueError: a row longer than ``width``.
    """
    out = torch.zeros(len(values), width)
    for j, v in enumerate(values):
        if v is not None:
            if v.numel() > width:
                raise ValueError(f"row {j} has {v.numel()} values but the batch is {width} wide")
            out[j, : v.numel()] = v
    return out


#: the per-row fields of :class:`UpdateBatch` (lists aligned with the rows, or None)
ROW_FIELDS = ("prompt_ids", "response_ids", "response_masks", "advantages", "old_log_probs", "action_masks",
              "teacher_log_probs", "has_context", "ref_log_probs", "index")


@dataclass
class UpdateBatch:
    """The rows of one policy update and everything its loss reads, row by row, unpadded.

    Per-row fields are lists aligned with the rows; ``L_i`` = the response length of row ``i``.

    Attributes:
        prompt_ids, response_ids: token ids of each row (the policy's prompt; the sampled response).
        response_masks: ``[L_i]`` float 0/1 per row: 0 = trains nothing (a Dr.BoT-filtered row, or
            the stored mask of a replay row).
        advantages: ``[L_i]`` float per row, token advantages before SERL's weights.
        old_log_probs: ``[L_i]`` float per row, behaviour log-probs (nats) of the ratio's
            denominator; None = not yet known (the first mini-batch: the micro-step takes the
            detached current log-probs, exact since no parameter has changed yet, and the update
            records them with :meth:`fill_old_log_probs`).
        action_masks: 0/1 per response token, 1 on action tokens (SERL); None = all zeros.
        teacher_log_probs: SERL's teacher log-probs per row (``[L_i]`` or None), has_context: the
            row has a privileged context; both None when the update applies no SERL weights
            (SERL off, or a replay batch).
        ref_log_probs: ``[L_i]`` reference log-probs per row (``actor.use_kl_loss``); None = no KL.
        serl_lambda: λ_eff of SERL's weights.
        prefix: the metric prefix (``actor`` on-policy, ``replay`` for SPEAR's replay rows).
        loss_coef: the factor on the whole loss (1 on-policy, SPEAR's γ_t for replay).
        index: the position of each row in the batch it was first built as.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_masks: list[torch.Tensor]
    advantages: list[torch.Tensor]
    old_log_probs: list[Optional[torch.Tensor]]
    action_masks: Optional[list[list[int]]] = None
    teacher_log_probs: Optional[list[Optional[torch.Tensor]]] = None
    has_context: Optional[list[bool]] = None
    ref_log_probs: Optional[list[torch.Tensor]] = None
    serl_lambda: float = 0.0
    prefix: str = "actor"
    loss_coef: float = 1.0
    index: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.index:
            self.index = list(range(len(self.prompt_ids)))
        for name in ROW_FIELDS:
            v = getattr(self, name)
            if v is not None and len(v) != len(self.prompt_ids):
                raise ValueError(f"UpdateBatch.{name} has {len(v)} rows, expected {len(self.prompt_ids)}")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @classmethod
    def from_steps(cls, rows: Sequence[Step], advantages: torch.Tensor, row_mask: torch.Tensor) -> "UpdateBatch":
        """On-policy rows: ``advantages`` ``[n]`` and ``row_mask`` ``[n]`` (0/1) broadcast over
        each row's response tokens, the response mask times the row's :meth:`Step.trained_mask`
        (0 on tokens the rollout inserted, e.g. tool outputs); old log-probs not yet known."""
        lens = [len(s.response_ids) for s in rows]
        return cls(prompt_ids=[s.prompt_ids for s in rows], response_ids=[s.response_ids for s in rows],
                   response_masks=[row_mask[i] * torch.tensor(s.trained_mask(), dtype=row_mask.dtype)
                                   if s.loss_mask is not None else row_mask[i].expand(n)
                                   for i, (s, n) in enumerate(zip(rows, lens))],
                   advantages=[advantages[i].expand(n) for i, n in enumerate(lens)],
                   old_log_probs=[None] * len(rows), action_masks=[s.action_mask for s in rows])

    @classmethod
    def from_replay_rows(cls, rows: Sequence["ReplayRow"], loss_coef: float) -> "UpdateBatch":
        """A SPEAR replay batch: stored ids, masks, token advantages and behaviour log-probs;
        no SERL weights and no reference KL; the loss is scaled by ``loss_coef`` (γ_t)."""
        return cls(prompt_ids=[r.prompt_ids.tolist() for r in rows], response_ids=[r.response_ids.tolist() for r in rows],
                   response_masks=[r.response_mask for r in rows], advantages=[r.advantages for r in rows],
                   old_log_probs=[r.old_log_probs for r in rows], prefix="replay", loss_coef=loss_coef)

    def select(self, idx: Sequence[int]) -> "UpdateBatch":
        """The batch restricted to rows ``idx`` (positions in this batch), in that order."""
        idx = [int(i) for i in idx]
        rows = {name: None if getattr(self, name) is None else [getattr(self, name)[i] for i in idx]
                for name in ROW_FIELDS}
        return replace(self, **rows)

    def split(self, size: int) -> list["UpdateBatch"]:
        """Consecutive batches of ``size`` rows (the last may be shorter); ``[]`` when empty."""
        if size < 1:
            raise ValueError(f"split size must be >= 1, got {size}")
        return [self.select(range(s, min(s + size, len(self)))) for s in range(0, len(self), size)]

    def fill_old_log_probs(self, index: Sequence[int], values: Sequence[torch.Tensor]) -> None:
        """Record behaviour log-probs of the rows at ``index`` (this batch's :attr:`index`
        values) that have none yet; rows that have them keep theirs."""
        pos = {i: p for p, i in enumerate(self.index)}
        for i, v in zip(index, values):
            if self.old_log_probs[pos[i]] is None:
                self.old_log_probs[pos[i]] = v

    def loss_tokens(self) -> list[float]:
        """Per row, the response tokens its loss averages over: the sum of its
        ``response_masks`` (0 for a Dr.BoT-filtered row, fewer than ``L_i`` where the rollout
        inserted tokens, e.g. tool outputs)."""
        return [float(m[: len(r)].sum()) for m, r in zip(self.response_masks, self.response_ids)]

    def collate(self, pad_id: int) -> RowBatch:
        """The padded :class:`RowBatch` of these rows (see :func:`collate`)."""
        return collate(self.prompt_ids, self.response_ids, pad_id, self.action_masks, self.response_masks)

    def padded(self, name: str, width: int) -> torch.Tensor:
        """The per-row field ``name`` as a zero-padded ``[b, width]`` float32 tensor."""
        return pad_rows(getattr(self, name), width)
