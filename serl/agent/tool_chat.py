"""Token-level chat rendering of a tool-calling conversation (ChatML, e.g. SmolLM2), the same for
SFT and RL, with the loss mask.

SmolLM2's chat template has no ``tools`` support, so serl builds the context itself, in the shape
Qwen2.5-Instruct's template gives SPEAR's math runs (``chat_template`` of
``huggingface.co/Qwen/Qwen2.5-7B-Instruct``'s ``tokenizer_config.json``)::

    <|im_start|>system\\n{default system text}\\n\\n{Hermes tools section}<|im_end|>\\n   mask 0
    <|im_start|>user\\n{question}<|im_end|>\\n                                        mask 0
    <|im_start|>assistant\\n                                                        mask 0
    {content}\\n<tool_call>\\n{json}\\n</tool_call><|im_end|>                         mask 1
    \\n                                                                              mask 0
    <|im_start|>user\\n<tool_response>\\n{output}\\n</tool_response><|im_end|>\\n       mask 0
    <|im_start|>assistant\\n                                                        mask 0
    {final answer}<|im_end|>                                                        mask 1

Two fixes against SPEAR's agent loop
(``TencentYoutuResearch/SPEAR@7e8431513165640b4b1f78d09ebaae8807ee4f85:verl/verl/experimental/agent_loop/tool_agent_loop.py``):

* the model's turn ends with the sampled ``<|im_end|>`` and the ``\\n`` the template writes after it
  is appended with mask 0 (:func:`end_of_turn_ids`): SPEAR's rollout context lacks it while its SFT
  data has it (its lines 88-97 keep a commented-out patch for this);
* the tool turn is written from its text (:func:`render_tool_turn`), not by applying the template
  to ``[tool_msg]`` and cutting a default-system prefix off.

Loss mask: 1 on each assistant body and its ``<|im_end|>``; 0 on the system, user and tool
turns, on the ``<|im_start|>assistant\\n`` header and on the ``\\n`` after ``<|im_end|>``. verl's
multi-turn SFT dataset (``…:verl/verl/utils/dataset/multiturn_sft_dataset.py``) puts 1 on that
``\\n`` too; the model never samples it (generation stops at ``<|im_end|>``), so serl does not
train on it, and the SFT rows equal the RL rollouts token for token.

Token in, token out: assistant tokens go in as given ids (the sampled ids in RL), never
re-tokenised; every other piece is tokenised once, on its own, with ``add_special_tokens=False``.
Tokenisation boundary caveat: tokenising the pieces one by one can differ from tokenising the
whole rendered string where a piece boundary is not next to a special token (e.g. an assistant
body starting with whitespace after the header's ``\\n``). The invariant kept is that SFT and RL
build the same pieces the same way, so an RL rollout whose sampled ids are the tokenisation of the
SFT text has exactly the SFT ids and mask. The final assistant turn ends at its ``<|im_end|>``
(nothing is appended after it, in both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serl.agent.tool_calls import ToolCall, ToolCallParse, format_assistant_turn, hermes_tools_section, parse_tool_calls

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
_MARK = "\u2063serl-user-mark\u2063"  # a user text no template rewrites, to find the system block


def encode(tokenizer, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=False).input_ids``: special-token strings in ``text``
    (``<|im_start|>``, ``<|im_end|>``) become their single ids."""
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def special_id(tokenizer, token: str) -> int:
    """The id of a single special token such as ``<|im_end|>``.

    Raises:
        ValueError: the tokenizer has no such token (it maps to ``unk`` or to nothing).
    """
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or (tokenizer.unk_token_id is not None and tid == tokenizer.unk_token_id):
        raise ValueError(f"the tokenizer has no {token!r} token; the tool chat needs a ChatML tokenizer")
    return int(tid)


def default_system_text(tokenizer) -> str | None:
    """The system text the tokenizer's chat template adds when a chat has no system message,
    read from the template (SmolLM2: ``"You are a helpful AI assistant named SmolLM, trained by
    Hugging Face"``), or ``None`` if it adds none.

    Raises:
        ValueError: the template does not render a one-user-message chat as ChatML
            (``[<|im_start|>system\\n…<|im_end|>\\n]<|im_start|>user\\n…``).
    """
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False,
                                         add_generation_prompt=False)
    head, user = text.partition(_MARK)[0], f"{IM_START}user\n"
    sys_head, sys_tail = f"{IM_START}system\n", f"{IM_END}\n"
    if _MARK not in text or not head.endswith(user):
        raise ValueError(f"chat template does not render a user turn as ChatML: {text[:200]!r}")
    head = head[: -len(user)]
    if not head:
        return None
    if not (head.startswith(sys_head) and head.endswith(sys_tail)):
        raise ValueError(f"chat template's default system block is not ChatML: {head!r}")
    return head[len(sys_head) : -len(sys_tail)]


def render_system_block(tokenizer, tools: Sequence[Mapping[str, Any]], system_text: str | None = None) -> str:
    """``<|im_start|>system\\n{system text}\\n\\n{tools section}<|im_end|>\\n``, as Qwen2.5's template
    writes it when given ``tools``.

    Args:
        tokenizer: gives the default system text when ``system_text`` is None.
        tools: tool schemas (e.g. ``[CODE_INTERPRETER_SCHEMA]``); empty: no tools section.
        system_text: the system text; None: :func:`default_system_text`; ``""``: none.

    Returns:
        the block, or ``""`` when there is neither system text nor tools.
    """
    if system_text is None:
        system_text = default_system_text(tokenizer) or ""
    parts = [p for p in (system_text, hermes_tools_section(tools) if tools else "") if p]
    return f"{IM_START}system\n" + "\n\n".join(parts) + f"{IM_END}\n" if parts else ""


def render_user_turn(text: str) -> str:
    """``<|im_start|>user\\n{text}<|im_end|>\\n``."""
    return f"{IM_START}user\n{text}{IM_END}\n"


def render_assistant_header() -> str:
    """``<|im_start|>assistant\\n``: the generation prompt (mask 0)."""
    return f"{IM_START}assistant\n"


def render_tool_turn(outputs: str | Sequence[str]) -> str:
    """The observation after a tool-calling turn, with the next assistant header:
    ``<|im_start|>user\\n<tool_response>\\n{output}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``.
    Several outputs share one user turn, one ``\\n<tool_response>\\n…\\n</tool_response>`` each
    (Qwen2.5's template for consecutive tool messages). The output text is written as given:
    truncation is the sandbox's job.

    Raises:
        ValueError: ``outputs`` is an empty sequence.
    """
    outs = [outputs] if isinstance(outputs, str) else list(outputs)
    if not outs:
        raise ValueError("render_tool_turn needs at least one tool output")
    body = "".join(f"\n<tool_response>\n{o}\n</tool_response>" for o in outs)
    return f"{IM_START}user{body}{IM_END}\n" + render_assistant_header()


@dataclass
class ConversationIds:
    """A conversation being built: ``input_ids`` and the parallel ``loss_mask`` (same length; 1
    where the model is trained / sampled)."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    def append(self, ids: Sequence[int], mask: int) -> None:
        """Append ``ids``, each with loss mask ``mask``.

        Raises:
            ValueError: ``mask`` is not 0 or 1.
        """
        if mask not in (0, 1):
            raise ValueError(f"loss mask must be 0 or 1, got {mask!r}")
        self.input_ids += [int(i) for i in ids]
        self.loss_mask += [mask] * len(ids)

    def append_text(self, tokenizer, text: str) -> None:
        """Tokenise ``text`` (a system/user/tool/header piece) and append it with mask 0."""
        self.append(encode(tokenizer, text), 0)

    def append_assistant(self, ids: Sequence[int], mask: int = 1) -> None:
        """Append an assistant turn's ids (sampled ids in RL, through ``<|im_end|>``) with mask
        ``mask`` (1; an SFT message with ``"weight": 0`` is context only)."""
        self.append(ids, mask)


def start_conversation(tokenizer, tools: Sequence[Mapping[str, Any]], user_text: str,
                       system_text: str | None = None) -> ConversationIds:
    """The prompt, all mask 0: system block, user turn and assistant header, each tokenised on its
    own. RL generates from ``input_ids``; SFT continues from it."""
    conv = ConversationIds()
    for piece in (render_system_block(tokenizer, tools, system_text), render_user_turn(user_text),
                  render_assistant_header()):
        if piece:
            conv.append_text(tokenizer, piece)
    return conv


def end_of_turn_ids(tokenizer, turn_ids: Sequence[int]) -> list[int]:
    """The ids to append (mask 0) after an assistant turn when another turn follows: the ``\\n``
    the template writes after ``<|im_end|>``. A turn that did not end with ``<|im_end|>`` (cut by a
    per-turn token limit) is closed with ``<|im_end|>\\n``, also mask 0 (the model did not sample
    it)."""
    nl = encode(tokenizer, "\n")
    im_end = special_id(tokenizer, IM_END)
    return nl if turn_ids and turn_ids[-1] == im_end else [im_end] + nl


def observation_ids(tokenizer, turn_ids: Sequence[int], outputs: str | Sequence[str]) -> list[int]:
    """Everything appended after a tool-calling turn, all mask 0: :func:`end_of_turn_ids` then the
    tokenised :func:`render_tool_turn` (which ends with the next assistant header). Its length is
    what SPEAR's rule (f) compares with the remaining response budget."""
    return end_of_turn_ids(tokenizer, turn_ids) + encode(tokenizer, render_tool_turn(outputs))


def parse_turn(tokenizer, turn_ids: Sequence[int]) -> ToolCallParse:
    """:func:`~serl.agent.tool_calls.parse_tool_calls` on the turn decoded with special tokens
    skipped."""
    return parse_tool_calls(tokenizer.decode(list(turn_ids), skip_special_tokens=True))


def assistant_turn_ids(tokenizer, content: str | None, calls: Sequence[ToolCall] = ()) -> list[int]:
    """An assistant turn as SFT trains it: the tokenised
    :func:`~serl.agent.tool_calls.format_assistant_turn` body, then ``<|im_end|>``."""
    return encode(tokenizer, format_assistant_turn(content, calls)) + [special_id(tokenizer, IM_END)]


def _message_calls(message: Mapping[str, Any], index: int) -> list[ToolCall]:
    """The ``tool_calls`` of an SFT assistant message as :class:`ToolCall` (OpenAI nesting
    ``{"type": "function", "function": {"name", "arguments"}}`` or flat ``{"name", "arguments"}``)."""
    out = []
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function", tc) if isinstance(tc, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or "arguments" not in fn:
            raise ValueError(f"message {index}: malformed tool call {tc!r:.200}")
        out.append(ToolCall(name=fn["name"], arguments=fn["arguments"]))
    return out


_NEXT_ROLES = {"user": {"assistant"}, "assistant+calls": {"tool"}, "assistant": {"user"},
               "tool": {"tool", "assistant"}}


def _check_order(messages: Sequence[Mapping[str, Any]], start: int) -> None:
    """Raise ValueError unless ``messages[start:]`` is ``user (assistant [tool+ assistant]*)`` and
    more user/assistant rounds, ending with an assistant message."""
    prev = "user"
    for i in range(start + 1, len(messages)):
        role = messages[i].get("role")
        if role not in _NEXT_ROLES[prev]:
            raise ValueError(f"message {i}: role {role!r} cannot follow {prev!r}")
        prev = "assistant+calls" if role == "assistant" and messages[i].get("tool_calls") else role
    if prev != "assistant":
        raise ValueError(f"the conversation must end with an assistant message without tool calls, ends with {prev!r}")


def render_sft_conversation(tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                            system_text: str | None = None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one SFT conversation in SPEAR's ``sft_preprocess`` schema
    (``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/sft_preprocess.py``):
    ``[{"role": "user", "content"}, {"role": "assistant", "content", "tool_calls": [{"type":
    "function", "function": {"name", "arguments": {"code"}}}]}, {"role": "tool", "content"}, …,
    {"role": "assistant", "content"}]``, built from the same pieces as an RL rollout.

    A leading ``system`` message replaces the system text (as in Qwen2.5's template); otherwise
    ``system_text`` (None: the tokenizer's default). Consecutive tool messages share one user turn.

    An assistant message may carry ``"weight": 0`` (OpenAI's chat fine-tuning format): its turn
    is context, with mask 0 (``serl data dagger``'s rows: the policy's own replies before the
    state the expert labels); ``"weight": 1`` or no weight trains on it.

    Returns:
        ``(input_ids, loss_mask)``, equal lengths; mask 1 exactly on the assistant bodies and their
        ``<|im_end|>``.

    Raises:
        ValueError: the roles are out of order (see ``_check_order``), the first non-system message
            is not a user message, a tool call is malformed, or the tokenizer is not ChatML.
        TypeError: a tool call's arguments are not a mapping.
    """
    start = 0
    if messages and messages[0].get("role") == "system":
        system_text, start = messages[0].get("content") or "", 1
    if len(messages) <= start or messages[start].get("role") != "user":
        raise ValueError("the conversation must start with a user message (after an optional system message)")
    _check_order(messages, start)
    conv = start_conversation(tokenizer, tools, messages[start].get("content") or "", system_text)
    i = start + 1
    while i < len(messages):
        msg = messages[i]
        turn = assistant_turn_ids(tokenizer, msg.get("content"), _message_calls(msg, i))
        conv.append_assistant(turn, int(msg.get("weight", 1)))
        i += 1
        if i == len(messages):
            break
        if messages[i]["role"] == "tool":
            j = i
            while j < len(messages) and messages[j]["role"] == "tool":
                j += 1
            conv.append(observation_ids(tokenizer, turn, [m.get("content") or "" for m in messages[i:j]]), 0)
            i = j
        else:  # a new user round
            conv.append(end_of_turn_ids(tokenizer, turn), 0)
            conv.append_text(tokenizer, render_user_turn(messages[i].get("content") or ""))
            conv.append_text(tokenizer, render_assistant_header())
            i += 1
    return conv.input_ids, conv.loss_mask
