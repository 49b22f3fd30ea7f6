"""Copy the headline results block of ``docs/results/index.md`` into the README.

The block between ``<!-- --8<-- [start:headline] -->`` and ``<!-- --8<-- [end:headline] -->`` is
written once, on the results page; the README's "What it has learnt so far" holds a copy with its
links made relative to the repository's root (``alfworld-cold-start.md`` becomes
``docs/results/alfworld-cold-start.md``). ``tests/test_readme.py`` fails when the copy differs::

    python scripts/sync_readme.py            # rewrite README.md
    python scripts/sync_readme.py --check    # exit 1 if README.md is behind (what the test checks)
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_PAGE = "docs/results/index.md"
BLOCK = re.compile(r"<!-- --8<-- \[start:headline\] -->\n.*?<!-- --8<-- \[end:headline\] -->", re.S)
LINK = re.compile(r"\]\(([^)\s#]*)(#[^)\s]*)?\)")


def headline_block(page_text: str, page_path: str = RESULTS_PAGE) -> str:
    """The marked block of ``page_text`` (markers included) with every relative link rewritten
    from ``page_path``'s folder to the repository root.

    Raises:
        ValueError: the page has no start/end markers.
    """
    m = BLOCK.search(page_text)
    if m is None:
        raise ValueError(f"{page_path}: the headline markers (--8<-- [start:headline] / [end:headline]) are missing")
    folder = posixpath.dirname(page_path)

    def rebase(link: re.Match) -> str:
        target, anchor = link.group(1), link.group(2) or ""
        if not target or re.match(r"[a-z]+:", target) or target.startswith("/"):
            return link.group(0)
        return f"]({posixpath.normpath(posixpath.join(folder, target))}{anchor})"

    return LINK.sub(rebase, m.group(0))


def synced_readme(readme: str, page_text: str) -> str:
    """``readme`` with its headline block replaced by the results page's.

    Raises:
        ValueError: either file lacks the markers.
    """
    if BLOCK.search(readme) is None:
        raise ValueError("README.md: the headline markers (--8<-- [start:headline] / [end:headline]) are missing")
    block = headline_block(page_text)
    return BLOCK.sub(lambda _: block, readme, count=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if README.md differs")
    args = p.parse_args(argv)
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    new = synced_readme(readme, (ROOT / RESULTS_PAGE).read_text())
    if args.check:
        if new != readme:
            print(f"README.md's headline block is behind {RESULTS_PAGE}: run python scripts/sync_readme.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != readme:
        readme_path.write_text(new)
        print(f"README.md: headline block copied from {RESULTS_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
