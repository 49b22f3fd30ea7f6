"""A tiny randomly initialised causal LM with a real tokenizer, for tests and
benchmarks: 2 layers, hidden 64, built offline in ~0.1 s."""

from __future__ import annotations

from pathlib import Path


def build_tiny_model_dir(dest: str | Path, tokenizer_dir: str | Path, seed: int = 0) -> Path:
    """Save a random 2-layer Llama (hidden 64) plus the tokenizer of ``tokenizer_dir`` to ``dest``.

    The vocabulary is the tokenizer's, so chat templates, special tokens and action masks behave
    as with the real model; the weights are random, so outputs are gibberish.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    dest = Path(dest)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest
