"""Chat formatting shared by the student (rollout) and the teacher prompts.

A step's prompt is rendered in one of :data:`PROMPT_FORMATS` (``Step.prompt_format``): ``chat``
(the tokenizer's chat template on one user message: ALFWorld, WebShop) or ``tool_chat`` (serl's
ChatML rendering with the ``code_interpreter`` tools section: the math env,
:mod:`serl.agent.tool_chat`). The teacher's privileged prompt is rendered in the same format as
the student's, so the two score the same response tokens after the same kind of context.
"""

from __future__ import annotations

from serl.agent.tool_calls import CODE_INTERPRETER_SCHEMA
from serl.agent.tool_chat import start_conversation

#: how a row's prompt ids are built from its user message
PROMPT_FORMATS = ("chat", "tool_chat")


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


def prompt_ids(tokenizer, user_text: str, prompt_format: str = "chat") -> list[int]:
    """Prompt token ids of ``user_text`` in ``prompt_format`` (:data:`PROMPT_FORMATS`): ``chat`` =
    :func:`chat_prompt_ids`; ``tool_chat`` = the system block with the ``code_interpreter`` tools
    section, the user turn and the assistant header (:func:`serl.agent.tool_chat.start_conversation`).

    Raises:
        ValueError: unknown format.
    """
    if prompt_format == "chat":
        return chat_prompt_ids(tokenizer, user_text)
    if prompt_format == "tool_chat":
        return start_conversation(tokenizer, [CODE_INTERPRETER_SCHEMA], user_text).input_ids
    raise ValueError(f"unknown prompt format {prompt_format!r}; valid: {list(PROMPT_FORMATS)}")
