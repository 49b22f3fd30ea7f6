"""Device and dtype resolution for ``trainer.device`` / ``model.dtype`` (CUDA simulated: no GPU in CI)."""

from __future__ import annotations

import pytest
import torch

from serl.errors import ModelLoadError
from serl.models import loading
from serl.models.loading import pick_device, pick_dtype


@pytest.fixture
def cuda(monkeypatch):
    """Set what torch reports about CUDA: ``cuda(available, bf16)``."""
    def set_(available: bool, bf16: bool = False) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    return set_


def test_auto_device_is_cuda_only_when_torch_sees_one(cuda):
    cuda(False)
    assert pick_device("auto") == "cpu"
    assert pick_device("cpu") == "cpu"
    cuda(True)
    assert pick_device("auto") == "cuda"
    assert pick_device("cuda") == "cuda"
    assert pick_device("cpu") == "cpu"  # an explicit cpu stays cpu on a GPU machine


def test_cuda_without_a_device_is_a_clear_error(cuda):
    cuda(False)
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        pick_device("cuda")


def test_cuda_dtype_is_bf16_only_where_supported(cuda):
    cuda(True, bf16=True)
    assert pick_dtype("auto", "cuda") is torch.bfloat16
    assert pick_dtype("bfloat16", "cuda") is torch.bfloat16
    assert pick_dtype("float32", "cuda") is torch.float32
    cuda(True, bf16=False)  # e.g. a V100 or T4
    assert pick_dtype("auto", "cuda") is torch.float32
    assert pick_dtype("float32", "cuda") is torch.float32
    with pytest.raises(ModelLoadError, match="no bf16 support"):
        pick_dtype("bfloat16", "cuda")


def test_cpu_dtype_follows_the_cpu_not_cuda(cuda, monkeypatch):
    cuda(True, bf16=True)  # a GPU's bf16 support says nothing about the CPU
    monkeypatch.setattr(loading, "cpu_supports_bf16", lambda: False)
    assert pick_dtype("auto", "cpu") is torch.float32
    assert pick_dtype("bfloat16", "cpu") is torch.bfloat16
    monkeypatch.setattr(loading, "cpu_supports_bf16", lambda: True)
    assert pick_dtype("auto", "cpu") is torch.bfloat16
    assert pick_dtype("float32", "cpu") is torch.float32
