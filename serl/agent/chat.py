"""Chat formatting shared by the student (rollout) and the teacher prompts."""

from __future__ import annotations


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
