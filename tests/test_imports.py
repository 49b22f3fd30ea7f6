"""The import graph of serl: no circles, and data flows one way.

Built with grimp (the graph library behind import-linter), which reads every ``import`` in the
package, including imports deferred into function bodies. The circle check counts the imports
under ``if TYPE_CHECKING:`` too (a type-only circle is still a knot for a reader); the layer rule
leaves them out (a type hint may name a type of a higher layer). The scripts of ``benchmarks/``
must not import each other in a circle either.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from import_graph import benchmark_import_cycles

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"

#: Layers from the top of the data flow down (environment -> rollout -> trajectories ->
#: advantages/weights -> update): a module may import its own layer's modules and those of the
#: layers below it, never one above. Modules not listed (serl.errors, serl.utils, serl.data) are
#: leaves that anyone may import.
LAYERS = [
    "serl.cli",
    "serl.cli_data",
    "serl.report",
    "serl.train",
    "serl.models",
    "serl.configure",
    "serl.rollout",
    "serl.hindsight",
    "serl.algos",
    "serl.agent",
    "serl.trajectory",
    "serl.envs",
]
LEAVES = ["serl.errors", "serl.utils", "serl.config", "serl.sandbox"]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("serl", exclude_type_checking_imports=True)


@pytest.fixture(scope="module")
def full_graph():
    """The graph with the ``if TYPE_CHECKING:`` imports."""
    return grimp.build_graph("serl", exclude_type_checking_imports=False)


def _layer(module: str) -> int | None:
    for i, name in enumerate(LAYERS):
        if module == name or module.startswith(name + "."):
            return i
    return None


def _cycles(graph) -> list[str]:
    cycles = []
    for a in sorted(graph.modules):
        for b in sorted(graph.find_modules_directly_imported_by(a)):
            if b.split(".")[0] == a.split(".")[0] and graph.chain_exists(importer=b, imported=a):
                cycles.append(f"{a} -> {b} -> ... -> {a}")
    return cycles


def test_no_import_cycles(full_graph):
    """No two serl modules import each other, directly or through others, type-only imports included."""
    cycles = _cycles(full_graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_sees_type_checking_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "circ_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circ_pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circ_pkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("circ_pkg", exclude_type_checking_imports=False))
    assert not _cycles(grimp.build_graph("circ_pkg", exclude_type_checking_imports=True))


def test_no_import_cycles_among_the_benchmark_and_experiment_scripts():
    for folder in (BENCHMARKS, EXPERIMENTS):
        assert not benchmark_import_cycles(folder), benchmark_import_cycles(folder)


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
        for mod in {leaf} | graph.find_descendants(leaf):  # a leaf package: each of its modules
            deps = {m for m in graph.find_modules_directly_imported_by(mod)
                    if m.startswith("serl") and m != leaf and not m.startswith(leaf + ".")}
            allowed = {"serl.trajectory", "serl.errors"} if leaf == "serl.hindsight.rendering" else {"serl.errors"}
            assert deps <= allowed, f"{mod} imports {sorted(deps - allowed)}"


@pytest.mark.parametrize("module", ["serl.config", "serl.configure", "serl.envs.base", "serl.hindsight",
                                    "serl.train.trainer"])
def test_module_imports_alone(module):
    """Each entry module imports in a fresh interpreter (no order-dependent circle)."""
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
