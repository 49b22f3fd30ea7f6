"""Shared test fixtures: the SmolLM2 tokenizer shipped in tests/fixtures and a tiny random model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FIXTURES = Path(__file__).parent / "fixtures"
TOKENIZER_DIR = FIXTURES / "smollm2_tokenizer"
REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_ALFWORLD = REPO_ROOT.parent / "shared" / "data" / "alfworld"


@pytest.fixture(scope="session")
def tokenizer():
    from serl.models.loading import load_tokenizer

    return load_tokenizer(str(TOKENIZER_DIR))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from serl.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", TOKENIZER_DIR)
