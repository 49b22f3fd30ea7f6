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
                    dedup: bool = True, turn_cache: Optional["TurnCache"] = None, batch_tokens: int = 0):
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
        batch_tokens: 0 = one forward per distinct prompt (right on a CPU: no padding). ``> 0``:
            the prompts' new tokens run together in padded forwards over their cached prefixes
            (:func:`_batched_heads_kv`), each holding at most ``batch_tokens`` token positions
            (rows × longest prompt): on a GPU, one forward per turn instead of one per row
            (``rollout.prefill_batch_tokens``). The keys and values equal the per-prompt path's
            up to float rounding.

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
    # a one-token prompt has nothing to prefill: its columns stay padding
    heads = [(prompts[rows[0]][:-1], rows) for rows in runs.values() if len(prompts[rows[0]]) > 1]
    if not heads:
        raise ValueError("every prompt has one token: nothing to prefill")
    matches = [_match(turn_cache, head) for head, _ in heads]
    if batch_tokens > 0:
        kvs = _batched_heads_kv(model, [h for h, _ in heads], matches, device, batch_tokens)
    else:
        kvs = ((j, _head_kv(model, head, device, *matches[j])) for j, (head, _) in enumerate(heads))
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    capacity = width + new_tokens + 1
    for j, layers in kvs:
        rows = heads[j][1]
        for layer_idx, (k, v) in enumerate(layers):  # [KV, n, D]
            if layer_idx == len(keys):
                keys.append(k.new_zeros((len(prompts), k.shape[0], capacity, k.shape[2])))
                values.append(v.new_zeros((len(prompts), v.shape[0], capacity, v.shape[2])))
            n = k.shape[1]
            for r in rows:
                keys[layer_idx][r, :, width - 1 - n : width - 1] = k
                values[layer_idx][r, :, width - 1 - n : width - 1] = v
    return Cache(layers=[PreallocatedLayer(k, v, width - 1) for k, v in zip(keys, values)])


def _match(turn_cache: Optional["TurnCache"], head: list[int]) -> tuple[int, Optional[list]]:
    """``(n, kept)``: the longest prefix of ``head`` found in ``turn_cache`` (at most all of it) and
    that kept sequence's per-layer ``(keys, values)`` ``[KV, >= n, D]``; counted in its stats."""
    n, kept = turn_cache.match(head) if turn_cache is not None else (0, None)
    n = min(n, len(head))
    if turn_cache is not None:
        turn_cache.reused_tokens += n
        turn_cache.prefilled_tokens += len(head) - n
    return n, kept


def _head_kv(model: "PreTrainedModel", head: list[int], device, n: int, kept: Optional[list]
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer the keys and values ``[KV, len(head), D]`` of ``head``: its first ``n`` tokens'
    copied from ``kept``, the rest run through ``model`` on top of them (all of it when ``n`` is 0)."""
    if kept is not None and n == len(head):
        return [(k[:, :n], v[:, :n]) for k, v in kept]
    past = {}
    if kept is not None and n:
        layers = []
        for k, v in kept:
            kb, vb = k.new_empty((1, k.shape[0], len(head), k.shape[2])), v.new_empty((1, v.shape[0], len(head), v.shape[2]))
            kb[0, :, :n], vb[0, :, :n] = k[:, :n], v[:, :n]
            layers.append(PreallocatedLayer(kb, vb, n))
        past = {CACHE_ARG: Cache(layers=layers)}
    out = model(input_ids=torch.tensor([head[n:]], device=device), use_cache=True, logits_to_keep=1, **past)
    return [(layer.keys[0], layer.values[0]) for layer in getattr(out, CACHE_ARG).layers]


def _buckets(suffix: list[int], width: list[int], batch_tokens: int) -> list[list[int]]:
    """Group prompts for batched prefill forwards: longest new part first, a prompt joining the
    open group while the group's padded window (rows × its longest new part) stays within twice
    the new tokens it holds and its positions (rows × longest prompt) within ``batch_tokens``.

    Args:
        suffix: per prompt, the tokens to run (``>= 1``); width: per prompt, its whole length.

    Returns:
        Lists of prompt indices; every index once.
    """
    groups: list[list[int]] = []
    new = longest = 0
    for j in sorted(range(len(suffix)), key=lambda j: -suffix[j]):
        if groups:
            rows = len(groups[-1]) + 1
            top, wide = suffix[groups[-1][0]], max(longest, width[j])
            if rows * top <= 2 * (new + suffix[j]) and rows * wide <= batch_tokens:
                groups[-1].append(j)
                new, longest = new + suffix[j], wide
                continue
        groups.append([j])
        new, longest = suffix[j], width[j]
    return groups


def _batched_heads_kv(model: "PreTrainedModel", heads: list[list[int]], matches: list[tuple[int, Optional[list]]],
                      device, batch_tokens: int) -> Iterator[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]:
    """``(j, per-layer (keys, values) [KV, len(heads[j]), D])`` for every head, the heads' new
    tokens run a group at a time (:func:`_buckets`) in one left-padded forward.

    In a group of ``R`` heads whose new parts are at most ``S`` tokens and whose longest head is
    ``W`` tokens, every head is right-aligned in ``W`` columns; the last ``S`` columns are the
    forward's input (a head with a shorter new part re-runs the end of its cached prefix there, the
    same keys and values up to rounding) and the ``W − S`` before them its cache, copied from the
    turn cache, with an attention mask over the left padding and position ids counted from each
    head's first token, as ``generate`` counts them. One forward per group instead of one per
    head: vLLM batches a step's prefills the same way (chunked prefill in one ragged batch).
    """
    todo = []
    for j, (head, (n, kept)) in enumerate(zip(heads, matches)):
        if kept is not None and n == len(head):  # all of it cached: nothing to run
            yield j, [(k[:, :n], v[:, :n]) for k, v in kept]
        else:
            todo.append(j)
    suffix = [len(heads[j]) - matches[j][0] for j in todo]
    for group in _buckets(suffix, [len(heads[j]) for j in todo], batch_tokens):
        idx = [todo[g] for g in group]
        S, W = max(suffix[g] for g in group), max(len(heads[j]) for j in idx)
        P = W - S
        ids = torch.zeros((len(idx), S), dtype=torch.long)
        mask = torch.zeros((len(idx), W), dtype=torch.long)
        past = {}
        if P:  # the longest head has a cached prefix of at least P tokens
            ref = next(matches[j][1] for j in idx if len(heads[j]) == W)
            bufs = [(k.new_zeros((len(idx), k.shape[0], W, k.shape[2])), v.new_zeros((len(idx), v.shape[0], W, v.shape[2])))
                    for k, v in ref]
        for b, j in enumerate(idx):
            head, (n, kept) = heads[j], matches[j]
            L = len(head)
            mask[b, W - L :] = 1
            m = max(0, L - S)  # this head's tokens before the window: cached, since n >= L - S
            if m:
                for (kb, vb), (k, v) in zip(bufs, kept):
                    kb[b, :, W - L : W - L + m], vb[b, :, W - L : W - L + m] = k[:, :m], v[:, :m]
            ids[b, S - (L - m) :] = torch.tensor(head[m:], dtype=torch.long)
        if P:
            past = {CACHE_ARG: Cache(layers=[PreallocatedLayer(kb, vb, P) for kb, vb in bufs])}
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, P:]
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                    use_cache=True, logits_to_keep=1, **past)
        layers = getattr(out, CACHE_ARG).layers
        for b, j in enumerate(idx):
            L = len(heads[j])
            yield j, [(layer.keys[b, :, W - L :], layer.values[b, :, W - L :]) for layer in layers]
