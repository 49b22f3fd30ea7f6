"""The data side of ``serl sft``: reading rows, tokenising them as RL sees them, padding batches.

Two row kinds in one JSONL file (:func:`read_rows` tells them apart):

* **step rows** (``serl data expert alfworld|webshop``): one env step, a single user message and
  the reply as a string::

      {"messages": [{"role": "user", "content": PROMPT}], "response": "<think>...</think><action>...</action>", ...}

  prompt ids = :func:`serl.agent.chat.chat_prompt_ids` (the tokenizer's chat template with its
  generation prompt), cut from the left to ``data.max_prompt_length`` as the rollout collector
  does; target ids = the reply's ids (no special tokens) + ``eos_token_id`` (``<|im_end|>`` for
  SmolLM2's ChatML), cut to ``data.max_response_length``; every target token carries loss.

* **conversation rows** (``serl data expert math``): a row with a ``tools`` key, or whose
  ``messages`` hold an assistant message, in SPEAR's ``sft_preprocess`` schema
  (``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/sft_preprocess.py``)::

      {"messages": [user, assistant(+tool_calls), tool, ..., assistant], "tools": [schema, ...], ...}

  rendered by :func:`serl.agent.tool_chat.render_sft_conversation`, the same pieces the RL tool
  loop builds. The prompt is every id before the first loss-mask-1 token (system block, user turn,
  assistant header); the rest are the targets with their loss mask (1 on assistant bodies and
  their ``<|im_end|>``, 0 on tool turns and headers: context, no loss; an assistant message with
  ``"weight": 0``, OpenAI's fine-tuning key, is context too: ``serl data dagger``). A conversation longer
  than ``data.max_prompt_length + data.max_response_length`` is cut from the right (counted in
  the warning); the prompt is never cut.

The loss (``serl.train.sft``) is the cross-entropy on target tokens whose mask is 1.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from serl.agent.chat import chat_prompt_ids
from serl.agent.tool_chat import render_sft_conversation
from serl.config import Config
from serl.errors import SerlError
from serl.utils import jsonl_lines

log = logging.getLogger(__name__)

_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class SFTExample:
    """One tokenised row.

    Attributes:
        prompt_ids: context token ids before the first trained token (chat prompt with the
            generation prompt), ``<= max_prompt_length`` for step rows.
        target_ids: the ids after the prompt: the reply + end-of-turn id (step rows), or the rest
            of the conversation (assistant turns, tool turns, headers).
        target_mask: per target id, 1 = carries loss, 0 = context only (tool outputs, headers);
            ``None`` = all 1 (step rows).
        prompt_truncated: the prompt was cut from the left.
        response_truncated: the targets were cut from the right (a step reply loses its
            end-of-turn token; a conversation loses its end).
    """

    prompt_ids: list[int]
    target_ids: list[int]
    prompt_truncated: bool = False
    response_truncated: bool = False
    target_mask: Optional[list[int]] = None

    def __post_init__(self):
        if self.target_mask is not None and len(self.target_mask) != len(self.target_ids):
            raise ValueError(f"target_mask has {len(self.target_mask)} entries for {len(self.target_ids)} target ids")

    @property
    def num_tokens(self) -> int:
        """Prompt + target ids."""
        return len(self.prompt_ids) + len(self.target_ids)

    @property
    def num_loss_tokens(self) -> int:
        """Target ids that carry loss (mask 1)."""
        return len(self.target_ids) if self.target_mask is None else int(sum(self.target_mask))


def is_conversation(row: dict[str, Any]) -> bool:
    """A conversation row: it has a ``tools`` key or an assistant message (module docstring)."""
    msgs = row.get("messages")
    return "tools" in row or (isinstance(msgs, list)
                              and any(isinstance(m, dict) and m.get("role") == "assistant" for m in msgs))


def _check_conversation(row: dict[str, Any], where: str) -> None:
    """Shape checks that need no tokenizer (the role order is checked when rendering)."""
    if "response" in row:
        raise SerlError(f"{where}: a row has either a 'response' (step row) or assistant messages / "
                        "'tools' (conversation row), not both")
    tools = row.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise SerlError(f"{where}: 'tools' must be a list of tool schemas (JSON objects)")
    for i, m in enumerate(row["messages"]):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise SerlError(f"{where}: messages[{i}] needs a role in {list(_ROLES)}")
        if m.get("content") is not None and not isinstance(m["content"], str):
            raise SerlError(f"{where}: messages[{i}].content must be a string")
        if "weight" in m and (m["role"] != "assistant" or m["weight"] not in (0, 1) or isinstance(m["weight"], bool)):
            raise SerlError(f"{where}: messages[{i}].weight must be 0 or 1, on an assistant message only")
    if row["messages"][-1].get("role") != "assistant":
        raise SerlError(f"{where}: a conversation row must end with an assistant message")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read SFT rows (step or conversation rows, module docstring) from a JSONL file (blank lines
    skipped).

    Raises:
        SerlError: the file is missing or empty, a line is not JSON, a row lacks a user message
            (``messages[0]``, or ``messages[1]`` after a system message, with role ``user`` and a
            string ``content``), a step row lacks a non-empty string ``response``, or a
            conversation row is malformed; the message names the file and line.
    """
    p = Path(path)
    if not p.is_file():
        raise SerlError(f"SFT data file {p} does not exist (write one with `serl data expert`)")
    rows = []
    with open(p, encoding="utf-8") as f:
        for n, _, row, error in jsonl_lines(f):
            if error is not None:
                raise SerlError(f"{p}:{n}: not a JSON line ({error})")
            msgs = row.get("messages") if isinstance(row, dict) else None
            first = msgs[1] if (isinstance(msgs, list) and len(msgs) > 1 and isinstance(msgs[0], dict)
                                and msgs[0].get("role") == "system") else (msgs[0] if msgs else None)
            ok_msg = (isinstance(msgs, list) and isinstance(first, dict) and first.get("role") == "user"
                      and isinstance(first.get("content"), str))
            if not ok_msg:
                raise SerlError(f"{p}:{n}: a row needs messages[0] = {{'role': 'user', 'content': <prompt>}}")
            if is_conversation(row):
                _check_conversation(row, f"{p}:{n}")
            elif msgs[0] is not first:
                raise SerlError(f"{p}:{n}: a step row ('response') has exactly one user message")
            elif not isinstance(row.get("response"), str) or not row["response"]:
                raise SerlError(f"{p}:{n}: a row needs a non-empty string 'response'")
            rows.append(row)
    if not rows:
        raise SerlError(f"SFT data file {p} holds no rows")
    return rows


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file (checked on ``--resume``: the data must not change under a run)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def encode_conversation(tokenizer, row: dict[str, Any], max_length: int) -> SFTExample:
    """Tokenise a conversation row with :func:`~serl.agent.tool_chat.render_sft_conversation`
    (module docstring): prompt = ids before the first mask-1 token, targets = the rest with their
    mask, all cut from the right to ``max_length`` ids in total.

    Raises:
        ValueError: the conversation is malformed (role order, tool calls), it has no token with
            loss, or the prompt alone fills ``max_length``.
        TypeError: a tool call's arguments are not a mapping.
    """
    ids, mask = render_sft_conversation(tokenizer, row["messages"], row.get("tools") or [])
    if 1 not in mask:
        raise ValueError("the conversation has no assistant token to train on")
    start = mask.index(1)
    if start >= max_length:
        raise ValueError(f"its prompt ({start} tokens) fills data.max_prompt_length + data.max_response_length "
                         f"= {max_length}: nothing left to train on")
    return SFTExample(ids[:start], ids[start:max_length], target_mask=mask[start:max_length],
                      response_truncated=len(ids) > max_length)


def encode_row(tokenizer, row: dict[str, Any], max_prompt_length: int, max_response_length: int) -> SFTExample:
    """Tokenise one row as the RL rollout would see it (module docstring).

    Args:
        tokenizer: the policy's tokenizer (with a chat template and an ``eos_token_id``).
        row: a row from :func:`read_rows`.
        max_prompt_length: tokens; a longer step prompt keeps its last ``max_prompt_length`` ids.
        max_response_length: tokens; a longer step target keeps its first ``max_response_length``
            ids. A conversation keeps its first ``max_prompt_length + max_response_length`` ids.

    Raises:
        ValueError, TypeError: a malformed conversation row (:func:`encode_conversation`).
    """
    if is_conversation(row):
        return encode_conversation(tokenizer, row, max_prompt_length + max_response_length)
    prompt = chat_prompt_ids(tokenizer, row["messages"][0]["content"])
    target = tokenizer(row["response"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    ex = SFTExample(prompt[-max_prompt_length:], target[:max_response_length],
                    len(prompt) > max_prompt_length, len(target) > max_response_length)
    return ex


def encode_rows(tokenizer, rows: list[dict[str, Any]], cfg: Config, source: Optional[str] = None) -> list[SFTExample]:
    """:func:`encode_row` on every row; warns with the number of cut prompts, replies and
    conversations. ``source``: the file the rows came from, for messages (default ``sft.data``).

    Raises:
        SerlError: a conversation row cannot be rendered (the message names the file and the row, 1-based).
    """
    exs = []
    source = source or cfg.sft.data or "the data"
    for i, r in enumerate(rows, 1):
        try:
            exs.append(encode_row(tokenizer, r, cfg.data.max_prompt_length, cfg.data.max_response_length))
        except (ValueError, TypeError) as e:
            raise SerlError(f"SFT row {i} of {source}: {e}") from e
    conv = [is_conversation(r) for r in rows]
    n_p = sum(e.prompt_truncated for e in exs)
    n_r = sum(e.response_truncated for e, c in zip(exs, conv) if not c)
    n_c = sum(e.response_truncated for e, c in zip(exs, conv) if c)
    if n_p:
        log.warning("%d of %d SFT prompts exceed data.max_prompt_length=%d: cut from the left",
                    n_p, len(exs), cfg.data.max_prompt_length)
    if n_r:
        log.warning("%d of %d SFT replies exceed data.max_response_length=%d: cut (they lose their "
                    "end-of-turn token); raise data.max_response_length", n_r, len(exs),
                    cfg.data.max_response_length)
    if n_c:
        log.warning("%d of %d SFT conversations exceed data.max_prompt_length + data.max_response_length = %d "
                    "tokens: cut from the right (they lose their end); raise the lengths", n_c, len(exs),
                    cfg.data.max_prompt_length + cfg.data.max_response_length)
    return exs


@dataclass
class SFTBatch:
    """A padded micro-batch: row ``b`` is ``[pad.. | prompt | targets | pad..]``.

    Attributes:
        input_ids: ``[B, P + R]`` long; P = longest prompt, R = longest target.
        attention_mask: ``[B, P + R]`` long, 1 on real tokens (tool tokens included).
        position_ids: ``[B, P + R]`` long, 0 at each row's first real token.
        response_ids: ``[B, R]`` long, the targets (pad id past a row's end).
        response_mask: ``[B, R]`` float 0/1, 1 exactly on target tokens with loss (a step reply's
            tokens; a conversation's assistant tokens): the loss (label) mask.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor


def collate_sft(examples: list[SFTExample], pad_id: int) -> SFTBatch:
    """Pad ``examples`` into one :class:`SFTBatch` (prompts left-padded, targets right-padded);
    the loss mask is each example's ``target_mask`` (all 1 when None) and 0 on padding."""
    P = max(len(e.prompt_ids) for e in examples)
    R = max(len(e.target_ids) for e in examples)
    B = len(examples)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    loss_mask = torch.zeros((B, R), dtype=torch.float32)
    for b, e in enumerate(examples):
        p, t = e.prompt_ids, e.target_ids
        ids[b, P - len(p): P] = torch.tensor(p, dtype=torch.long)
        ids[b, P: P + len(t)] = torch.tensor(t, dtype=torch.long)
        attn[b, P - len(p): P + len(t)] = 1
        loss_mask[b, :len(t)] = 1.0 if e.target_mask is None else torch.tensor(e.target_mask, dtype=torch.float32)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return SFTBatch(ids, attn, pos, ids[:, P:].clone(), loss_mask)
