"""Every shell script serl ships (benchmarks/, recipes/, scripts/) parses: ``bash -n`` catches the
syntax errors that the GPU lease scripts would otherwise only show on a machine lent for minutes."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO_ROOT

SCRIPTS = sorted(p for d in ("benchmarks", "experiments", "recipes", "scripts") for p in (REPO_ROOT / d).glob("*.sh"))


def test_there_are_scripts_to_check():
    assert any(p.name == "learning_gpu.sh" for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shell_script_parses(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_bash_n_rejects_a_broken_script(tmp_path):
    """The check above can fail: an unclosed ``if`` does not parse."""
    bad = tmp_path / "bad.sh"
    bad.write_text("if true; then\n  echo x\n")
    assert subprocess.run(["bash", "-n", str(bad)], capture_output=True).returncode != 0
