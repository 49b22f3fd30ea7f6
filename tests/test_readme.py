"""The README's quickstart is what CI runs (the test command in .ci/run must be the README's), and its
results are the results page's headline block (scripts/sync_readme.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_quickstart_is_two_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2
    assert cmds[0].endswith("serl train")
    assert cmds[1].endswith("pytest")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in [ln.strip() for ln in ci]


def _sync():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_readme", ROOT / "scripts" / "sync_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_headline_is_the_results_pages_block():
    """The README's results are a copy of docs/results/index.md's block (scripts/sync_readme.py)."""
    sync = _sync()
    readme = (ROOT / "README.md").read_text()
    assert sync.synced_readme(readme, (ROOT / sync.RESULTS_PAGE).read_text()) == readme, \
        "README.md's headline block differs from docs/results/index.md's: run python scripts/sync_readme.py"


def test_sync_rebases_links_and_refuses_a_page_without_markers():
    sync = _sync()
    page = ("x\n<!-- --8<-- [start:headline] -->\n[a](alfworld.md#t) [b](../benchmarks/index.md) "
            "[c](https://e.org/x) [d](#here)\n<!-- --8<-- [end:headline] -->\ny\n")
    block = sync.headline_block(page)
    assert "[a](docs/results/alfworld.md#t) [b](docs/benchmarks/index.md) [c](https://e.org/x) [d](#here)" in block
    readme = "# r\n<!-- --8<-- [start:headline] -->\nold\n<!-- --8<-- [end:headline] -->\nrest\n"
    assert sync.synced_readme(readme, page) == f"# r\n{block}\nrest\n"
    with pytest.raises(ValueError, match="markers"):
        sync.headline_block("no markers")
    with pytest.raises(ValueError, match="README"):
        sync.synced_readme("no markers", page)


def test_headline_names_the_default_models_current_panel():
    """The block's row for the default run's model gives the valid_unseen panel its model card states last."""
    import re

    from serl.config.recipes import DEFAULT_RECIPE, parse_config

    model = parse_config(DEFAULT_RECIPE).model.path
    card = (ROOT / "serl" / "models" / "adapters" / model / "README.md").read_text()
    panels = re.findall(r"(\d+) of the 134 `valid_unseen`", card)
    assert panels, f"{model}'s model card states no 134-game valid_unseen panel"
    block = _sync().headline_block((ROOT / "docs" / "results" / "index.md").read_text())
    row = next((ln for ln in block.splitlines() if ln.startswith(f"| `{model}` |")), None)
    assert row is not None, f"the headline block has no row for the default model {model}"
    assert f"{panels[-1]} of the 134 `valid_unseen`" in row
