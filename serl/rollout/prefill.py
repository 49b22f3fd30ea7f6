"""The ``hf`` engine's prefill: each distinct prompt of a batch once, without padding, into a KV
cache allocated once for the prompts and the replies.

transformers ``generate`` on a left-padded batch runs the prompt forward (the prefill) over
``rows × longest prompt`` tokens, padding included, with a padding mask, and then grows its
``DynamicCache`` by concatenation at every decode step, which copies the whole cache each
time. On CPU both cost real time (BENCHMARKS.md, "Throughput"): in a default ``serl train``
rollout the padded prefill ran 36,592 token positions where the distinct prompts hold 22,674
(the G episodes of a group share their first prompt), and the concatenation took a quarter
of a batch-8 decode step.

:func:`prefilled_cache` therefore runs one forward per distinct prompt (all its tokens but the
last, no padding, so PyTorch's causal attention kernel needs no mask), copies the keys and
values right-aligned into one buffer per layer sized for the longest prompt plus the replies,
and hands ``generate`` a cache of :class:`PreallocatedLayer`\\ s over those buffers:
``generate`` then runs the last prompt token of every row as its first step and writes each
decode step's keys and values in place. The attention mask still hides the left padding, and
position ids still come from it, so every real token sees the keys and positions it would see
in the padded batch: the tokens equal plain ``generate``'s up to float rounding
(tests/test_throughput_paths.py). vLLM does the same with its paged KV cache and prefix caching;
serl's design for the ``hf`` engine. Across calls, a prompt that extends the previous call's
prompt and reply (a multi-turn conversation's next turn) takes that prefix's keys and values
from :class:`serl.rollout.turn_cache.TurnCache` and runs only the tokens after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

import torch
from packaging.version import Version
from transformers import __version__ as _transformers_version
from transformers.cache_utils import Cache, DynamicLayer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from serl.rollout.turn_cache import TurnCache


#: the name of the KV cache in transformers' ``generate`` and model ``forward`` arguments and in model
#: outputs: ``cache`` from transformers 5.24 on, where ``past_key_values`` is deprecated (a
#: ``FutureWarning`` from ``generate``, a logged warning from ``forward`` and ``output.past_key_values``;
#: huggingface/transformers v5.24.0 ``generation/utils.py``, ``utils/generic.py``); ``past_key_values``
#: in the 5.x releases before, which do not know ``cache``
CACHE_ARG = "cache" if Version(_transformers_version).release >= (5, 24) else "past_key_values"


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer over preallocated ``[B, KV, capacity, D]`` key and value buffers.

    ``update`` writes the new keys/values at the end of the filled part and returns views of
    the filled part (transformers' ``DynamicLayer`` concatenates, copying the whole cache at
    every step). Only what sampling and greedy decoding use is supported: the cache cannot be
    cropped, reordered or re-batched (beam search, assisted decoding).

    Args:
        keys, values: the buffers ``[B, KV, capacity, D]``.
        length: positions already filled (the prefilled prompts).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self._key_buffer, self._value_buffer, self._length = keys, values, length
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` ``[B, KV, q, D]``; returns all keys and values so far.

        Raises:
            RuntimeError: the buffer is full (it is sized for the prompts and ``max_new_tokens``).
        """
        end = self._length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            raise RuntimeError(f"KV cache buffer of {self._key_buffer.shape[-2]} positions is full")
        self._key_buffer[:, :, self._length : end] = key_states
        self._value_buffer[:, :, self._length : end] = value_states
        self._length = end
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        return self.keys, self.values

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("PreallocatedLayer supports sampling and greedy decoding only")

    crop = batch_repeat_interleave = batch_select_indices = reorder_cache = _unsupported


def supports_prefilled_cache(model: "PreTrainedModel") -> bool:
    """True for decoder models whose every layer is full (global) attention with a standard KV
    cache (Llama, Qwen2, Mistral without sliding window, ...): the layers
    :func:`prefilled_cache` builds. Sliding-window, hybrid and linear-attention models keep
    plain ``generate``."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    return not getattr(cfg, "is_encoder_decoder", False)


@torch.no_grad()
def prefilled_cache(model: "PreTrainedModel", prompts: list[list[int]], width: int, new_tokens: int,
                    dedup: bool = True, turn_cache: Optional["TurnCache"] = None):
    """The KV cache of a left-padded batch's prompts, all but each prompt's last token, for
    ``generate`` to continue from (see the module docstring).

    Args:
        model: the causal LM (eval mode; its cache layers must be what
            :func:`supports_prefilled_cache` accepts).
        prompts: ``B`` prompts of 1 … ``width`` token ids; row ``r`` is right-aligned in the
            padded batch of ``width`` columns.
        width: the padded batch's prompt width (the longest prompt).
        new_tokens: the most tokens ``generate`` will sample (``max_new_tokens``).
        dedup: identical prompts are run once and their keys/values copied (verl's and vLLM's
            ``enable_prefix_caching`` for whole prompts: a group's G episodes share their first
            prompt).
        turn_cache: the keys and values of the previous call's sequences
            (:class:`serl.rollout.turn_cache.TurnCache`): a prompt that begins with one of them
            (a multi-turn conversation's next turn) runs only the tokens after that prefix.

    Returns:
        A transformers ``Cache`` of :class:`PreallocatedLayer`\\ s holding ``width − 1`` positions
        (row ``r``'s prompt minus its last token in the last ``len(prompts[r]) − 1`` of them, zeros
        under the left padding), with room for ``new_tokens + 1`` more.

    Raises:
        ValueError: an empty prompt, or one longer than ``width``.
    """
    if any(not 1 <= len(p) <= width for p in prompts):
        raise ValueError(f"prompts must hold 1 … {width} tokens")
    device = next(model.parameters()).device
    runs: dict[tuple[int, ...], list[int]] = {}  # distinct prompt → rows
    for r, p in enumerate(prompts):
        runs.setdefault(tuple(p) if dedup else (r, *p), []).append(r)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    capacity = width + new_tokens + 1
    for rows in runs.values():
        head = prompts[rows[0]][:-1]
        if not head:  # a one-token prompt: nothing to prefill, its columns stay padding
            continue
        for layer_idx, (k, v) in enumerate(_head_kv(model, head, device, turn_cache)):  # [1, KV, n, D]
            if layer_idx == len(keys):
                keys.append(k.new_zeros((len(prompts), k.shape[1], capacity, k.shape[3])))
                values.append(v.new_zeros((len(prompts), v.shape[1], capacity, v.shape[3])))
            n = k.shape[2]
            for r in rows:
                keys[layer_idx][r, :, width - 1 - n : width - 1] = k[0]
                values[layer_idx][r, :, width - 1 - n : width - 1] = v[0]
    if not keys:
        raise ValueError("every prompt has one token: nothing to prefill")
    return Cache(layers=[PreallocatedLayer(k, v, width - 1) for k, v in zip(keys, values)])


def _head_kv(model: "PreTrainedModel", head: list[int], device, turn_cache: Optional["TurnCache"]
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer the keys and values ``[1, KV, len(head), D]`` of ``head``: its longest prefix
    found in ``turn_cache`` copied, the rest run through ``model`` on top of it (all of it when
    nothing matches)."""
    n, kept = turn_cache.match(head) if turn_cache is not None else (0, None)
    n = min(n, len(head))
    if turn_cache is not None:
        turn_cache.reused_tokens += n
        turn_cache.prefilled_tokens += len(head) - n
    if kept is not None and n == len(head):
        for k, v in kept:
            yield k[None, :, :n], v[None, :, :n]
        return
    past = {}
    if kept is not None:
        layers = []
        for k, v in kept:
            kb, vb = k.new_empty((1, k.shape[0], len(head), k.shape[2])), v.new_empty((1, v.shape[0], len(head), v.shape[2]))
            kb[0, :, :n], vb[0, :, :n] = k[:, :n], v[:, :n]
            layers.append(PreallocatedLayer(kb, vb, n))
        past = {CACHE_ARG: Cache(layers=layers)}
    out = model(input_ids=torch.tensor([head[n:]], device=device), use_cache=True, logits_to_keep=1, **past)
    for layer in getattr(out, CACHE_ARG).layers:
        yield layer.keys, layer.values
