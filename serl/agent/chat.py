"""Chat formatting shared by the student (rollout) and the teacher prompts.

A step's prompt is rendered in one of :data:`PROMPT_FORMATS` (``Step.prompt_format``): ``chat``
(the tokenizer's chat template on one user message: ALFWorld, WebShop), ``tool_chat`` (serl's
ChatML rendering with the ``code_interpreter`` tools section: the math env,
:mod:`serl.agent.tool_chat`) or ``conversation`` (``env.prompt_layout=conversation``: the
episode's chat so far, whose last user turn is the step's own text; :func:`conversation_head`).
The teacher's privileged prompt is rendered in the same format as
the student's, so the two score the same response tokens after the same kind of context.
"""

from __future__ import annotations

from serl.agent.tool_calls import CODE_INTERPRETER_SCHEMA
from serl.agent.tool_chat import encode, render_assistant_header, render_user_turn, start_conversation

#: how a row's prompt ids are built from its user message
PROMPT_FORMATS = ("chat", "tool_chat", "conversation")


def chat_prompt_ids(tokenizer, user_text: str) -> list[int]:
    """Token ids of a single user message with the generation prompt appended (as
    ``langfengQ/verl-agent@574dd5b:agent_system/multi_turn_rollout/rollout_loop.py``).

    Each env step is an independent single-turn chat (no multi-turn chat history); the
    tokenizer's chat template adds its default system prompt, if it has one.
    """
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False).input_ids


def user_turn_ids(tokenizer, user_text: str) -> list[int]:
    """``<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n`` as the conversation
    layout appends it: the user turn and the assistant header, each tokenised on its own."""
    return encode(tokenizer, render_user_turn(user_text)) + encode(tokenizer, render_assistant_header())


def conversation_head(tokenizer, prompt_ids: list[int], user_text: str) -> list[int]:
    """The ids of a conversation-layout prompt before its last user turn: ``prompt_ids`` without
    their tail :func:`user_turn_ids` ``(user_text)`` (the system block for an episode's first step,
    the earlier turns after it).

    Raises:
        ValueError: ``prompt_ids`` do not end with that user turn (a prompt not built by the
            conversation layout, or a chat template that does not render ChatML).
    """
    tail = user_turn_ids(tokenizer, user_text)
    if len(prompt_ids) < len(tail) or list(prompt_ids[len(prompt_ids) - len(tail):]) != tail:
        raise ValueError("a conversation-layout prompt must end with its own user turn and the assistant header "
                         "(ChatML); these prompt ids do not")
    return list(prompt_ids[: len(prompt_ids) - len(tail)])


def prompt_ids(tokenizer, user_text: str, prompt_format: str = "chat", head: list[int] | None = None) -> list[int]:
    """Prompt token ids of ``user_text`` in ``prompt_format`` (:data:`PROMPT_FORMATS`): ``chat`` =
    :func:`chat_prompt_ids`; ``tool_chat`` = the system block with the ``code_interpreter`` tools
    section, the user turn and the assistant header (:func:`serl.agent.tool_chat.start_conversation`);
    ``conversation`` = ``head`` (:func:`conversation_head`) then :func:`user_turn_ids`.

    Raises:
        ValueError: unknown format, or ``conversation`` without ``head``.
    """
    if prompt_format == "chat":
        return chat_prompt_ids(tokenizer, user_text)
    if prompt_format == "tool_chat":
        return start_conversation(tokenizer, [CODE_INTERPRETER_SCHEMA], user_text).input_ids
    if prompt_format == "conversation":
        if head is None:
            raise ValueError("prompt format 'conversation' needs the conversation before the turn (head)")
        return list(head) + user_turn_ids(tokenizer, user_text)
    raise ValueError(f"unknown prompt format {prompt_format!r}; valid: {list(PROMPT_FORMATS)}")
