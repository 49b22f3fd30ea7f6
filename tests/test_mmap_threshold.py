"""serl.utils.fix_mmap_threshold / mmap_threshold_for: freed tensor buffers go back to the OS
(glibc's dynamic mmap threshold otherwise keeps them resident; BENCHMARKS.md, "The default run's
memory")."""

import platform
import subprocess
import sys

import pytest

from serl.utils import MMAP_THRESHOLD_BYTES, fix_mmap_threshold, mmap_threshold_for

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="glibc's mallopt only")

# Frees one 24 MiB tensor (mmap-ed, so glibc's dynamic threshold rises to 24 MiB), then allocates
# 40 tensors of 8 MiB and frees every other one; prints the MiB still resident above the start.
_PROBE = """
import sys, psutil, torch
from serl.utils import fix_mmap_threshold, mmap_threshold_for
if sys.argv[1] == "fix":
    assert fix_mmap_threshold(mmap_threshold_for(True)) == 4 * 2**20
p = psutil.Process()
a = torch.ones(6 * 2**20); del a
base = p.memory_info().rss
ts = [torch.ones(2 * 2**20) for _ in range(40)]
del ts[0:39:2]
print((p.memory_info().rss - base) / 2**20)
"""


def _resident_mib(mode: str, env: dict | None = None) -> float:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


@glibc
def test_freed_buffers_leave_the_process_once_the_threshold_is_fixed():
    dynamic, fixed = _resident_mib("dynamic"), _resident_mib("fix")
    # 20 kept buffers = 160 MiB; with the dynamic threshold the 20 freed ones stay resident too
    assert dynamic > 300, dynamic
    assert 150 < fixed < 200, fixed


def test_policy_float32_cpu_only_and_the_env_override(monkeypatch):
    monkeypatch.delenv("SERL_MALLOC_MMAP_THRESHOLD", raising=False)
    assert mmap_threshold_for(True) == MMAP_THRESHOLD_BYTES == 4 * 2**20
    assert mmap_threshold_for(False) == 0  # bf16 autocast or CUDA: glibc's dynamic threshold stays
    monkeypatch.setenv("SERL_MALLOC_MMAP_THRESHOLD", "0")
    assert mmap_threshold_for(True) == 0
    monkeypatch.setenv("SERL_MALLOC_MMAP_THRESHOLD", "262144")
    assert mmap_threshold_for(False) == 262144
    monkeypatch.setenv("SERL_MALLOC_MMAP_THRESHOLD", "128k")
    with pytest.raises(ValueError, match="SERL_MALLOC_MMAP_THRESHOLD='128k'"):
        mmap_threshold_for(True)


def test_zero_sets_nothing():
    assert fix_mmap_threshold(0) == 0
