"""Code run before each program of the local sandbox (in the same ``__main__`` namespace, but
compiled separately, so the program's traceback line numbers are its own).

- ``"math"`` (default): ``from math import *``, so that ``sqrt(2)`` works without an import.
- ``"spear"``: the imports of SPEAR's ``WRAPPER_CODE``
  (``TencentYoutuResearch/SPEAR@7e8431513165640b4b1f78d09ebaae8807ee4f85:verl/recipe/spear/retool.py``):
  ``import traceback``; ``from M import *`` for each module of :data:`SPEAR_MODULES`, in that
  order (``builtins`` comes after ``math`` and ``operator`` and restores the builtins they shadow,
  e.g. ``pow`` and ``abs``; ``datetime``'s ``time`` class stays bound to ``time``); then each
  module imported by name. Without numpy.
- ``"spear_numpy"``: ``"spear"`` plus ``import numpy as np``, as the original. numpy lives in
  site-packages, so the child then runs without ``-S``; a call then takes ~170 ms instead of
  ~40 ms, and OpenBLAS may fail to start under a small RLIMIT_AS (its threads are capped to 1).
- ``"none"``: nothing.
"""

from __future__ import annotations

SPEAR_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                 "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")


def _spear(numpy: bool) -> str:
    lines = ["import traceback"]
    lines += [f"from {m} import *" for m in SPEAR_MODULES]
    lines += [f"import {m}" for m in SPEAR_MODULES]
    if numpy:
        lines.append("import numpy as np")
    return "\n".join(lines) + "\n"


PRELUDES: dict[str, str] = {
    "math": "from math import *\n",
    "spear": _spear(numpy=False),
    "spear_numpy": _spear(numpy=True),
    "none": "",
}
#: preludes that need site-packages on the child's sys.path
NEEDS_SITE = frozenset({"spear_numpy"})
