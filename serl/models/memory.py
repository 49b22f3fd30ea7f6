"""Activation memory of a training forward/backward, and the memory a run may give to it.

:func:`activation_bytes` estimates the bytes a Llama-style decoder holds for the backward pass
when activation (gradient) checkpointing is *off*; ``model.gradient_checkpointing=auto`` compares
it per micro-batch with :func:`activation_budget_bytes` (``trainer.activation_memory_gb``) and
checkpoints only the micro-batches that would not fit (:mod:`serl.train.grad_ckpt`).
"""

from __future__ import annotations

from typing import Optional

#: share of the available memory that ``trainer.activation_memory_gb: null`` gives the activations
DEFAULT_ACTIVATION_MEMORY_FRACTION = 0.5
#: bytes per kept logit position per vocabulary entry: the logits in the compute dtype (≤ 4), their
#: float32 copy, the saved float32 log-softmax and the float32 gradients of the backward (2 × 4),
#: plus 4 for the entropy's softmax when the entropy bonus is on
LOGIT_BYTES_PER_ENTRY = 24


def activation_bytes(rows: int, seq_len: int, hidden: int, intermediate: int, layers: int, heads: int,
                     kv_heads: int, vocab: int = 0, logit_positions: int = 0, dtype_bytes: int = 4,
                     residual_bytes: int = 4) -> int:
    """Upper estimate of the activation memory of one forward+backward **without** checkpointing.

    The per-layer accounting of Korthikanti et al., "Reducing Activation Recomputation in Large
    Transformer Models" (arXiv 2205.05198, §4.1: ``s·b·h·(34 + 5·a·s/h)`` bytes per GPT layer in
    fp16), redone for a Llama block as PyTorch autograd saves it (transformers 5 ``LlamaDecoderLayer``
    with ``sdpa`` attention; checked tensor by tensor with ``torch.autograd.graph.saved_tensors_hooks``).
    Per token and layer, with ``e`` = ``dtype_bytes`` (2 under bf16 autocast, 4 in float32) and
    ``f`` = ``residual_bytes`` (the float32 residual stream and RMSNorms):

    * two RMSNorms: input and normalised output, ``2·(2·f·h + 4)``;
    * the inputs of the 7 projections: q/k/v ``3·e·h`` and gate/up ``2·e·h`` (autocast casts the
      input once per projection; without autocast the copies are one tensor, counted anyway),
      o_proj ``e·h``, down_proj ``e·i``;
    * attention (the CPU/CUDA flash ``sdpa`` kernels keep q, k, v, the output and the
      log-sum-exp, not the ``a·s²`` scores that Korthikanti's ``5·a·s/h`` term counts): ``4·e·h``
      (k and v after GQA's ``repeat_kv``, i.e. at ``h`` width) ``+ 4·a``;
    * SwiGLU: gate, up and SiLU outputs, ``3·e·i``;
    * the additive attention mask ``[b, 1, s, s]``: one float32 copy ``4·s`` per token shared by
      the layers, plus ``e·s`` per token and layer (autocast casts it per layer; in float32 the
      kernels' backward temporaries grow with ``s²`` as well: measured 1.7 bytes per ``s²`` and layer).

    Sum: ``2(2f+5e)·h + 4e·i + 4a + 8 + e·s`` bytes per token and layer. The layer count is
    ``layers + 1``: one extra layer's worth for the backward's working set (the gradients of the
    layer being differentiated) and the embedding/final-norm outputs. The LM head adds
    :data:`LOGIT_BYTES_PER_ENTRY` ``· vocab`` per kept logit position (serl computes logits on
    response tokens only). Not counted: weights, gradients and optimizer state (batch-independent),
    autocast's bf16 weight copies, and the transient dense gradient of a tied embedding
    (``4·vocab·h`` bytes at the end of the backward, which dominates only for a few hundred tokens). Measured against the allocator peak on small Llama models
    (tests/test_grad_ckpt.py) this is an upper bound within 2×.

    Args:
        rows: micro-batch rows ``b``. seq_len: padded tokens per row ``s``.
        hidden, intermediate, layers, heads, kv_heads: the model config (``h``, ``i``, ``L``, ``a``,
            GQA's key/value heads; k and v are repeated to ``a`` heads before ``sdpa``, so
            ``kv_heads`` does not lower the estimate).
        vocab: vocabulary size; 0 = no logits counted. logit_positions: positions whose logits
            are kept (all rows together).
        dtype_bytes: bytes of the compute dtype ``e``. residual_bytes: bytes of the master dtype ``f``.

    Returns:
        Bytes (int).

    Raises:
        ValueError: a negative size, or ``heads`` not a multiple of ``kv_heads``.
    """
    if min(rows, seq_len, hidden, intermediate, layers, heads, kv_heads, vocab, logit_positions) < 0:
        raise ValueError("activation_bytes: sizes must be >= 0")
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"activation_bytes: heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    e, f, s = dtype_bytes, residual_bytes, seq_len
    per_token_layer = 2 * (2 * f + 5 * e) * hidden + 4 * e * intermediate + 4 * heads + 8 + e * s
    tokens = rows * s
    return int(tokens * (per_token_layer * (layers + 1) + 4 * s) + LOGIT_BYTES_PER_ENTRY * vocab * logit_positions)


def model_activation_bytes(config, rows: int, seq_len: int, logit_positions: int = 0, dtype_bytes: int = 4,
                           residual_bytes: int = 4) -> int:
    """:func:`activation_bytes` with the sizes read from a transformers model ``config``
    (``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads`` (default: the heads), ``vocab_size``).

    Raises:
        ValueError: the config lacks one of those sizes (not a decoder-only transformer).
    """
    try:
        h, i, L, a = (int(getattr(config, k)) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                          "num_attention_heads"))
    except (AttributeError, TypeError) as e:
        raise ValueError(f"model config {type(config).__name__} lacks a decoder size ({e}), so its activation "
                         "memory cannot be estimated: set model.gradient_checkpointing=true or false "
                         "instead of auto") from None
    kv = int(getattr(config, "num_key_value_heads", None) or a)
    return activation_bytes(rows, seq_len, h, i, L, a, kv, int(getattr(config, "vocab_size", 0) or 0),
                            logit_positions, dtype_bytes, residual_bytes)


def available_memory_bytes(device: str = "cpu") -> Optional[int]:
    """Memory this process could still allocate, in bytes; None when it cannot be read.

    CUDA: free device memory (``torch.cuda.mem_get_info``) plus what PyTorch's caching allocator
    holds unused. CPU: ``psutil.virtual_memory().available`` (psutil comes with accelerate), else
    ``MemAvailable`` of ``/proc/meminfo`` (Linux).
    """
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info()
        return int(free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def activation_budget_bytes(memory_gb: Optional[float], device: str = "cpu", processes: int = 1) -> int:
    """The activation-memory budget of one micro-batch: ``memory_gb`` GiB when set, else
    :data:`DEFAULT_ACTIVATION_MEMORY_FRACTION` of :func:`available_memory_bytes` shared by the
    ``processes`` training processes that share it (CPU: the ranks on this machine; CUDA: 1, a GPU
    per rank); 0 (always checkpoint: the safe choice)
    when the available memory cannot be read."""
    if memory_gb is not None:
        return int(memory_gb * 2**30)
    avail = available_memory_bytes(device)
    if avail is None:
        return 0
    return int(DEFAULT_ACTIVATION_MEMORY_FRACTION * avail / max(1, processes))
