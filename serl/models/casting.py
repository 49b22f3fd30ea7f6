"""Casting a model to a lower-precision dtype without rounding its rotary-embedding frequencies.

``model.to(torch.bfloat16)`` casts every floating buffer, including the rotary embedding's
``inv_freq`` (and ``original_inv_freq``), which Hugging Face's ``from_pretrained(dtype=...)`` keeps
in float32 and its rotary forward reads as float32 (``transformers`` Llama ``LlamaRotaryEmbedding``).
Rounded to bfloat16 (8 bits of mantissa) the frequencies shift every position's rotation: on
SmolLM2-135M the last-position logits of a 350-token ALFWorld prompt moved by up to 0.7 and the
log-prob of expert replies by up to 0.7 nats. A bf16 copy made with ``.to`` (the rollout copy, the
teacher, a checkpoint loaded for evaluation) then samples from a slightly different model than the
one ``from_pretrained`` loads and than the float32 policy that recomputes the log-probs.
"""

from __future__ import annotations

import torch

#: buffer names (last component) that stay float32 whatever the model's dtype
FLOAT32_BUFFERS = ("inv_freq", "original_inv_freq")


def to_dtype(model, dtype: torch.dtype):
    """``model.to(dtype)`` (in place, returned) that leaves the buffers named in
    :data:`FLOAT32_BUFFERS` in float32, as ``from_pretrained(dtype=...)`` does.

    Args:
        model: a ``torch.nn.Module``.
        dtype: the floating dtype of its parameters and other buffers after the call.
    """
    keep = {name: buf.float() for name, buf in model.named_buffers() if name.rsplit(".", 1)[-1] in FLOAT32_BUFFERS}
    model = model.to(dtype)
    for name, buf in keep.items():
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        module._buffers[attr] = buf.to(module._buffers[attr].device)
    return model
