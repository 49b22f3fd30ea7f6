"""Render the ``serl report`` page: one self-contained HTML file (inline CSS, JS and the run data
as JSON; no server, no network, no CDN). The page's script draws the curves as inline SVG and
builds the trajectory browser in the browser."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from serl.report.data import report_data
from serl.utils import atomic_write_text

ASSETS = ("report.css", "report.js", "template.html")


def _asset(name: str) -> str:
    return resources.files("serl.report").joinpath("assets", name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">`` (``<``, ``>``, ``&`` and
    the JS line separators escaped as ``\\uXXXX``, so no text in a trajectory can close the tag)."""
    s = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        s = s.replace(ch, esc)
    return s


def render_html(data: dict[str, Any], title: str = "serl report") -> str:
    """The page of ``data`` (:func:`serl.report.data.report_data`) as one HTML string."""
    from html import escape

    page = _asset("template.html")
    return (page.replace("{{TITLE}}", escape(title))
                .replace("{{CSS}}", _asset("report.css"))
                .replace("{{DATA}}", embed_json(data))
                .replace("{{JS}}", _asset("report.js")))


def write_report(run_dirs: list[str | Path], out: Optional[str | Path] = None,
                 iteration: Optional[int] = None) -> Path:
    """Write the report of ``run_dirs`` to ``out`` (default ``<first run>/report.html``).

    Raises:
        serl.report.data.ReportError: a folder is not a run folder, or has no trace of ``iteration``.
    """
    data = report_data(run_dirs, iteration)
    path = Path(out) if out else Path(run_dirs[0]) / "report.html"
    names = ", ".join(r["name"] for r in data["runs"])
    atomic_write_text(path, render_html(data, f"serl report: {names}"))
    return path
