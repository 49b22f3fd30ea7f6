"""Code-shape checks: every function in serl/train stays short enough to read in one screen (the
train loop's one iteration excepted, by design: it reads top to bottom), and no file of serl is
longer than one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

SERL = Path(__file__).resolve().parents[1] / "serl"
TRAIN = SERL / "train"
MAX_LINES = 50
#: functions allowed to be longer, with their own bound: the loop a reader wants to see in one piece
LONG_BY_DESIGN = {("trainer.py", "Trainer.train_iteration"): 150}
MAX_FILE_LINES = 600


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, length)`` of every function in ``path``, counted from its
    ``def`` line (decorators excluded) to the last line of its body."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return out


def test_the_counter_sees_nested_and_method_bodies(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class A:\n    @staticmethod\n    def f():\n        def g():\n            return 1\n"
                   "        return g\n\n\ndef h(x):\n    return x\n")
    assert function_lengths(src) == [("A.f", 3, 4), ("A.f.g", 4, 2), ("h", 9, 2)]


def test_every_function_in_serl_train_is_at_most_50_lines():
    files = sorted(TRAIN.glob("*.py"))
    assert files, TRAIN
    too_long = [f"{p.name}:{line} {name} ({n} lines)" for p in files for name, line, n in function_lengths(p)
                if n > LONG_BY_DESIGN.get((p.name, name), MAX_LINES)]
    assert not too_long, "functions over 50 lines in serl/train: " + ", ".join(too_long)


def test_the_train_loop_is_one_function_in_the_trainer():
    lengths = {name: n for name, _, n in function_lengths(TRAIN / "trainer.py")}
    assert "Trainer.train_iteration" in lengths
    assert lengths["Trainer.train_iteration"] <= LONG_BY_DESIGN[("trainer.py", "Trainer.train_iteration")]


def test_no_file_under_serl_is_over_600_lines():
    files = sorted(SERL.rglob("*.py"))
    assert len(files) > 50, SERL
    too_long = [f"{p.relative_to(SERL.parent)} ({n} lines)" for p in files
                if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not too_long, "files over 600 lines: " + ", ".join(too_long)
