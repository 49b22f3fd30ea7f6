"""What a tokenizer's chat template says about where turns begin and end.

Read from the template itself (by rendering a probe conversation), not from ``eos_token``, which a
conversion can get wrong: transformers 5.17's GGUF conversion of SmolLM2-135M-Instruct sets
``eos_token`` to ``<|im_start|>``. Used by :func:`serl.models.loading.load_tokenizer` (the eos an
SFT target ends with) and by the rollout engines (where a reply ends). Imports nothing of serl.
"""

from __future__ import annotations


def _special_tokens(tok) -> list[str]:
    """Every special token of ``tok``, longest first (so ``<|im_end|>`` wins over a prefix)."""
    found = set(tok.all_special_tokens) | {str(x) for x in tok.added_tokens_decoder.values() if x.special}
    return sorted((t for t in found if t), key=len, reverse=True)


def end_of_turn_token(tok) -> str | None:
    """The special token that closes an assistant turn in ``tok``'s chat template (``<|im_end|>``
    for ChatML models such as SmolLM2 and Qwen2.5, ``<|eot_id|>`` for Llama 3), or None when the
    template puts no special token right after the assistant's text (or cannot be rendered)."""
    marker = "SERL_END_OF_TURN_PROBE"
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}],
                                       tokenize=False)
    except Exception:  # a template that rejects this conversation: nothing to learn from it
        return None
    rest = text[text.rfind(marker) + len(marker):] if marker in text else ""
    return next((t for t in _special_tokens(tok) if rest.startswith(t)), None)


def turn_start_token(tok) -> str | None:
    """The special token that opens a turn in ``tok``'s chat template: the first token of its
    generation prompt (``<|im_start|>`` of ``<|im_start|>assistant\n`` for ChatML,
    ``<|start_header_id|>`` for Llama 3), or None when that prompt starts with no special token
    (or the template cannot render one)."""
    msgs = [{"role": "user", "content": "u"}]
    try:
        bare = tok.apply_chat_template(msgs, tokenize=False)
        with_prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that rejects this conversation: nothing to learn from it
        return None
    rest = with_prompt[len(bare):] if with_prompt.startswith(bare) else ""
    return next((t for t in _special_tokens(tok) if rest.startswith(t)), None)
