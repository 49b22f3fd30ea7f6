"""The import graph of serl: no circles, and data flows one way.

Built with grimp (the graph library behind import-linter), which reads every ``import`` in the
package, including imports deferred into function bodies, and leaves out those under
``if TYPE_CHECKING:`` (type hints only; they never run).
"""

from __future__ import annotations

import subprocess
import sys

import grimp
import pytest

#: Layers from the top of the data flow down (environment -> rollout -> trajectories ->
#: advantages/weights -> update): a module may import its own layer's modules and those of the
#: layers below it, never one above. Modules not listed (serl.errors, serl.utils, serl.data) are
#: leaves that anyone may import.
LAYERS = [
    "serl.cli",
    "serl.report",
    "serl.train",
    "serl.models",
    "serl.config",
    "serl.rollout",
    "serl.hindsight",
    "serl.algos",
    "serl.agent",
    "serl.trajectory",
    "serl.envs",
]
LEAVES = ["serl.errors", "serl.utils"]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("serl", exclude_type_checking_imports=True)


def _layer(module: str) -> int | None:
    for i, name in enumerate(LAYERS):
        if module == name or module.startswith(name + "."):
            return i
    return None


def test_no_import_cycles(graph):
    """No two serl modules import each other, directly or through others."""
    cycles = []
    for a in sorted(graph.modules):
        for b in sorted(graph.find_modules_directly_imported_by(a)):
            if b.startswith("serl") and graph.chain_exists(importer=b, imported=a):
                cycles.append(f"{a} -> {b} -> ... -> {a}")
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_data_flows_one_way(graph):
    """No module imports a module of a layer above its own (see LAYERS)."""
    bad = []
    for a in sorted(graph.modules):
        la = _layer(a)
        for b in sorted(graph.find_modules_directly_imported_by(a)):
            lb = _layer(b)
            if la is not None and lb is not None and lb < la:
                bad.append(f"{a} imports {b}")
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def test_leaves_import_nothing_from_serl(graph):
    for leaf in LEAVES + ["serl.envs.base", "serl.hindsight.rendering"]:
        deps = {m for m in graph.find_modules_directly_imported_by(leaf) if m.startswith("serl")}
        allowed = {"serl.trajectory", "serl.errors"} if leaf == "serl.hindsight.rendering" else {"serl.errors"}
        assert deps <= allowed, f"{leaf} imports {sorted(deps - allowed)}"


@pytest.mark.parametrize("module", ["serl.config", "serl.envs.base", "serl.hindsight", "serl.train.trainer"])
def test_module_imports_alone(module):
    """Each entry module imports in a fresh interpreter (no order-dependent circle)."""
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
