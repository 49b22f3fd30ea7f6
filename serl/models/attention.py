"""serl's attention function: fast one-token decode steps on CPU, and packed (padding-free) rows.

It also runs the packed rows of the update and the scoring passes (``model.use_remove_padding``,
:class:`serl.train.batch.PackedRows`): each row's attention is causal within itself, one
unmasked ``sdpa`` call per row, instead of a ``[T, T]`` block-diagonal mask over all of them.

Profiled on SmolLM2-135M (AMD EPYC, AVX512-BF16, torch 2.13, one thread; BENCHMARKS.md,
"Throughput"): in a batch-8 bf16 decode step with ~700 cached positions, PyTorch's CPU
``scaled_dot_product_attention`` (its flash kernel) takes 6.4 ms per layer call for a query of
length 1, while the same attention as two small matmuls takes 0.6 ms. Over 30 layers that is
~190 ms of a ~230 ms decode step. :func:`serl_attention_forward` therefore computes a
length-1 query in a reduced-precision dtype as ``softmax(q·Kᵀ·scale + mask)·V`` with the
query heads grouped per key/value head (no ``repeat_kv`` copy), the scores and the softmax in
float32 (as transformers' eager attention); every other call (prefill, training, scoring,
float32) goes to transformers' own ``sdpa_attention_forward``, with one change: a query row
that the mask lets attend to no key (a left-padding position of a padded batch) is given every
key instead (:func:`attend_somewhere`). Such rows are padding, their outputs are never read, and
every other row is unchanged; but on CUDA the memory-efficient SDPA kernel's backward turns a
fully masked row into NaN gradients for every parameter (measured: one iteration of a Qwen2.5-1.5B
shaped model on an H100, torch 2.11+cu130, transformers 5.17, skipped its optimizer step on a
non-finite gradient norm; with this change it does not). transformers' ``AttentionMaskConverter.
_unmask_unattended`` did the same for the memory-efficient path in its 4.x releases.

:func:`use_serl_attention` switches a loaded model whose attention is ``sdpa`` to it
(registered in transformers' ``AttentionInterface`` as :data:`SERL_ATTENTION`, with the
``sdpa`` mask builder); the switch is not saved with the model (``config.json`` keeps
``sdpa``).
"""

from __future__ import annotations

import torch

#: the name under which the attention is registered with transformers
SERL_ATTENTION = "serl_sdpa"
_registered = False


def _decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Attention of one query position.

    Args:
        query: ``[B, H, 1, D]``; key, value: ``[B, KV, L, D]`` with ``H`` a multiple of ``KV``.
        attention_mask: None, a bool mask (True = attend) or an additive float mask, broadcastable
            to ``[B, H, 1, L]``.
        scaling: the score scale (``1/sqrt(D)`` for Llama).

    Returns:
        ``[B, 1, H, D]`` in ``query``'s dtype (transformers' attention-output layout).
    """
    B, H, _, D = query.shape
    KV, L = key.shape[1], key.shape[2]
    G = H // KV
    q = query.reshape(B, KV, G, D)  # query heads h = kv·G + g share key/value head kv (as repeat_kv)
    # A preallocated cache hands a strided view (its filled part); the batched matmul's own copy of
    # a transposed strided operand is ~3.5x slower than this copy plus a contiguous matmul
    # (B=16, L=400, bf16, AVX512-BF16 EPYC: 88 vs 304 us per layer; benchmarks/decode_attention_ab.py).
    scores = torch.matmul(q, key.contiguous().transpose(-1, -2)).float() * scaling  # [B, KV, G, L]
    if attention_mask is not None and not (attention_mask.dtype == torch.bool and bool(attention_mask.all())):
        # a mask shared by the heads ([B, 1, 1, L], transformers' sdpa mask) broadcasts as it is
        m = attention_mask if attention_mask.shape[1] == 1 else attention_mask.expand(B, H, 1, L).reshape(B, KV, G, L)
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value.contiguous())  # [B, KV, G, D]; a strided value is copied by matmul anyway, slower
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous()


def attend_somewhere(mask: torch.Tensor) -> torch.Tensor:
    """Give every key to query rows that ``mask`` lets attend to none.

    Args:
        mask: ``[B, 1 or H, q, L]``, bool (True = attend) or additive float (``-inf`` or the
            dtype's minimum = masked).

    Returns:
        The mask with each fully masked row (all of its ``L`` entries masked) replaced by an
        all-attend row (True, or 0.0); every other row unchanged. ``mask`` itself is not modified.
    """
    if mask.dtype == torch.bool:
        return mask | ~mask.any(dim=-1, keepdim=True)
    dead = mask.amax(dim=-1, keepdim=True) <= torch.finfo(mask.dtype).min
    return mask.masked_fill(dead, 0.0)


def _packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      cu_seq_lens: torch.Tensor, dropout: float, scaling: float | None) -> torch.Tensor:
    """Causal attention of packed rows, each within itself.

    Args:
        query: ``[1, H, T, D]``; key, value: ``[1, KV, T, D]`` (``T`` = all rows' tokens).
        cu_seq_lens: ``[b + 1]`` int, row ``i`` = positions ``cu_seq_lens[i] … cu_seq_lens[i+1] − 1``.

    Returns:
        ``[1, T, H, D]`` (transformers' attention-output layout): per row, transformers'
        ``sdpa_attention_forward`` with no mask and ``is_causal`` (PyTorch's flash kernel on CPU).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = [int(x) for x in cu_seq_lens.tolist()]
    outs = [sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                                   dropout=dropout, scaling=scaling, is_causal=True)[0]
            for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outs, dim=1)


def serl_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``query`` ``[B, H, q, D]``, ``key``/``value``
    ``[B, KV, L, D]``; returns ``([B, q, H, D], None)``): packed rows (``cu_seq_lens_q`` given,
    as :class:`serl.train.batch.PackedRows` passes it; one sequence, no KV cache) attend each
    within itself (:func:`_packed_attention`; transformers' block-diagonal mask is then ignored);
    the grouped-matmul path for a length-1 query on CPU in bf16/fp16 without dropout;
    transformers' ``sdpa_attention_forward`` otherwise (same arguments, with fully masked query
    rows unmasked by :func:`attend_somewhere`)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2] == int(cu[-1]):
        return _packed_attention(module, query, key, value, cu, dropout, scaling), None
    fast = (query.shape[2] == 1 and query.device.type == "cpu" and query.dtype != torch.float32
            and not dropout and kwargs.get("position_bias") is None and kwargs.get("cache") is None
            and query.shape[1] % key.shape[1] == 0)
    if not fast:
        if attention_mask is not None and query.shape[2] > 1:
            attention_mask = attend_somewhere(attention_mask)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return _decode_attention(query, key, value, attention_mask, scale), None


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SERL_ATTENTION, serl_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SERL_ATTENTION, sdpa_mask)
    _registered = True


def use_serl_attention(model) -> bool:
    """Switch ``model`` (a transformers model) from ``sdpa`` to :data:`SERL_ATTENTION` in place.

    Returns:
        True if switched; False (model unchanged) when its attention is not ``sdpa``.
    """
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    model.set_attn_implementation(SERL_ATTENTION)
    return True
