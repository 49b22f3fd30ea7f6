"""Where documentation pages go (docs/contributing.md, "Where a page goes"): reference pages stay
reference, generated reports live in a folder of their own under docs/results/, and no page holds a
path of the machine that made it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: a heading or a bold lead that dates its section, e.g. "## A sweep (2026-11-30)", "**A sweep (2026-11-30).**"
DATED_HEADING = re.compile(r"^(?:#{1,6} |\*\*).*\b20\d\d-\d\d-\d\d", re.M)
#: an absolute path of a machine's work folder, home or cache (not ``verl/workers/...``)
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home|Users)/[\w.+-]")


def _pages(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.md"))


@pytest.mark.parametrize("section", ["environments", "concepts"])
def test_reference_pages_are_short_and_undated(section):
    for page in _pages(DOCS / section):
        text = page.read_text()
        assert len(text.splitlines()) <= 260, f"{page.relative_to(ROOT)}: over ~250 lines; move results to docs/results/"
        assert not DATED_HEADING.search(text), f"{page.relative_to(ROOT)}: a dated section belongs in docs/results/"


def test_no_generated_report_or_plot_in_the_docs_root():
    for f in DOCS.iterdir():
        assert f.suffix.lower() not in (".png", ".svg", ".jpg", ".html"), f"{f.name}: plots and images go beside their page"
        if f.suffix == ".md":
            assert not f.read_text().startswith("# Learning experiment"), \
                f"{f.name}: a generated report goes to docs/results/<leg>/report.md"


def test_no_page_holds_a_machine_path():
    hits = [f"{p.relative_to(ROOT)}:{n}: {ln.strip()[:80]}"
            for p in _pages(DOCS) + [ROOT / "README.md"]
            for n, ln in enumerate(p.read_text().splitlines(), 1) if MACHINE_PATH.search(ln)]
    assert not hits, "machine paths (use the command's placeholders, e.g. WORKDIR):\n" + "\n".join(hits)


def test_machine_path_pattern():
    assert MACHINE_PATH.search("--workdir /work/leg2/run") and MACHINE_PATH.search("(`/root/.cache/serl`)")
    assert not MACHINE_PATH.search("verl/workers/actor/dp_actor.py") and not MACHINE_PATH.search("~/work/x")
