"""Import circles among the scripts of ``benchmarks/`` (a folder of scripts, not a package).

The benchmark scripts import each other by bare module name (``from throughput import
cpu_model``) after putting their own folder on ``sys.path``, so a package-level tool such as
grimp does not see them. :func:`benchmark_import_cycles` reads every ``*.py`` of the folder with
:mod:`ast` (nothing is imported or run) and reports the circles among them. Test helper only: no
test lives here.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path


def _imported_names(tree: ast.AST) -> list[tuple[str, int]]:
    """``(top-level module name, line)`` of every absolute import anywhere in ``tree``: at module
    level, inside functions and classes, under ``if TYPE_CHECKING:`` / ``if __name__ ==
    "__main__":`` / ``try:``, plus ``importlib.import_module("name")`` and ``__import__("name")``
    called with a literal name. Relative imports (``from . import x``) are skipped: a folder of
    scripts has no package to be relative to."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if not arg.value.startswith("."):
                    out.append((arg.value.split(".")[0], node.lineno))
    return out


def benchmark_graph(folder: Path) -> dict[str, dict[str, int]]:
    """The import graph among the scripts of ``folder``: ``{importer: {imported: line}}``, one
    node per ``folder/*.py`` (named by its stem), an edge for each script that imports another
    script of the folder (``line``: the first such import in the importer). Imports of anything
    else (``serl``, the standard library, third-party packages) are left out.

    Raises:
        SyntaxError: a script does not parse.
    """
    paths = sorted(Path(folder).glob("*.py"))
    names = {p.stem for p in paths}
    graph: dict[str, dict[str, int]] = {}
    for p in paths:
        edges: dict[str, int] = {}
        for name, line in _imported_names(ast.parse(p.read_text(encoding="utf-8"), filename=str(p))):
            if name in names:
                edges.setdefault(name, line)
        graph[p.stem] = edges
    return graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                comps.append(sorted(comp))
    return comps


def _shortest_cycle(graph: dict[str, dict[str, int]], start: str, members: set[str]) -> list[str]:
    """The shortest path ``start -> ... -> start`` inside ``members`` (breadth-first)."""
    prev: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt not in members:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start else [start, start]
            if nxt not in seen:
                seen.add(nxt)
                prev[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is on no cycle inside {sorted(members)}")


def benchmark_import_cycles(folder: Path) -> list[str]:
    """Import circles among the scripts of ``folder`` (e.g. ``REPO_ROOT / "benchmarks"``).

    Every ``folder/*.py`` is parsed with :mod:`ast` (not imported); an import of another script
    of the folder by its module name is an edge, wherever it is written: at module level, inside
    a function, under ``if TYPE_CHECKING:`` or ``if __name__ == "__main__":`` (a deferred import
    still ties the two scripts together). A circle is a strongly connected component of more
    than one script, or a script that imports itself.

    Returns:
        One description per circle, sorted, e.g. ``"learning -> learning_report -> learning
        (learning.py:203 imports learning_report; learning_report.py:233 imports learning)
        [scripts in the circle: learning, learning_report]"``: a shortest cycle through the
        alphabetically first script of the component, with the line of each import; empty if
        there is none.

    Raises:
        SyntaxError: a script does not parse.
    """
    graph = benchmark_graph(folder)
    out = []
    for comp in _strongly_connected(graph):
        if len(comp) == 1 and comp[0] not in graph[comp[0]]:
            continue
        cycle = _shortest_cycle(graph, comp[0], set(comp))
        where = "; ".join(f"{a}.py:{graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:]))
        out.append(f"{' -> '.join(cycle)} ({where}) [scripts in the circle: {', '.join(comp)}]")
    return sorted(out)
