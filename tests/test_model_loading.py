"""Loading a model prints no transformers progress bar and leaves transformers' setting as it was."""

from __future__ import annotations

import torch
from transformers.utils import logging as hf_logging

from serl.models.loading import hf_progress_bars, load_causal_lm


def test_load_causal_lm_prints_no_loading_bar_and_restores_the_setting(tiny_model_dir, capfd):
    from transformers import AutoModelForCausalLM

    hf_logging.enable_progress_bar()
    AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert "Loading weights" in capfd.readouterr().err  # what the test guards against
    load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_hf_progress_bars_restores_a_disabled_setting():
    hf_logging.disable_progress_bar()
    try:
        with hf_progress_bars(True):
            assert hf_logging.is_progress_bar_enabled()
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
