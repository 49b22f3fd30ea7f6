"""Render the ``serl report`` page: one self-contained HTML file (inline CSS, JS, the vendored
chart library uPlot and the run data as JSON; no server, no network, no CDN). The page's script
draws the curves with uPlot (hover values, drag-to-zoom, double-click reset) and builds the
trajectory browser in the browser."""

from __future__ import annotations

import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from serl.report.data import report_data
from serl.utils import atomic_write_text

ASSETS = ("report.css", "report.js", "template.html", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css")

#: a key of a success rate: its panel's axis is fixed to [0, 1]
SUCCESS_KEY = re.compile(r"success_rate$")
#: a key of a rate, ratio or fraction: its panel's axis is ranged automatically inside [0, 1]
RATE_KEY = re.compile(r"(success_rate|_ratio|_fraction)$")
#: how the page draws a metric that several runs share: mean with a min–max band, mean with a
#: ± 1 sample-std band, or each run's line only
SPREADS = ("minmax", "std", "none")


def _asset(name: str) -> str:
    return resources.files("serl.report").joinpath("assets", name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">`` (``<``, ``>``, ``&`` and
    the JS line separators escaped as ``\\uXXXX``, so no text in a trajectory can close the tag)."""
    s = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        s = s.replace(ch, esc)
    return s


def spread(values: list[float]) -> dict[str, Optional[float]]:
    """The spread of one metric at one iteration across the runs that recorded it.

    Returns:
        ``{"n", "mean", "min", "max", "std"}``; ``std`` is the sample standard deviation
        (denominator ``n - 1``), None when ``n < 2``.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("spread() needs at least one value")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return {"n": n, "mean": mean, "min": min(values), "max": max(values), "std": std}


def y_range(keys: list[str], values: list[float]) -> Optional[dict[str, Any]]:
    """The y axis of a panel of metric ``keys`` holding ``values``: ``{"min": 0, "max": 1,
    "fixed": True}`` when every key is a success rate, ``fixed: False`` (automatic, kept inside
    [0, 1]) when every key is a rate, ratio or fraction; None (automatic) otherwise, or when a
    value lies outside [0, 1]."""
    if not keys or not all(RATE_KEY.search(k) for k in keys) or any(v < 0 or v > 1 for v in values):
        return None
    return {"min": 0, "max": 1, "fixed": all(SUCCESS_KEY.search(k) for k in keys)}


def chart_panel(panel: dict[str, Any]) -> dict[str, Any]:
    """One panel of :func:`serl.report.data.panels` as the aligned columns a uPlot chart draws.

    Returns:
        ``{"title", "x" [iterations, ascending, the union over the series], "y_range"
        (:func:`y_range`), "lines": [{"run", "key", "y"}], "groups": [{"key", "runs", "n",
        "mean", "min", "max", "std"}]}``: ``y`` and the group columns are aligned with ``x``
        (None where no run recorded the key); one group per key that two or more runs share,
        its columns the :func:`spread` of those runs at each iteration.
    """
    x = sorted({int(p[0]) for s in panel["series"] for p in s["points"]})
    col = {it: i for i, it in enumerate(x)}
    lines, by_key = [], {}
    for s in panel["series"]:
        y: list[Optional[float]] = [None] * len(x)
        for it, v in s["points"]:
            y[col[int(it)]] = v
        lines.append({"run": s["run"], "key": s["key"], "y": y})
        by_key.setdefault(s["key"], []).append(lines[-1])
    groups = []
    for key, ls in by_key.items():
        if len(ls) < 2:
            continue
        g: dict[str, Any] = {"key": key, "runs": [line["run"] for line in ls],
                             **{f: [None] * len(x) for f in ("n", "mean", "min", "max", "std")}}
        for i in range(len(x)):
            vals = [line["y"][i] for line in ls if line["y"][i] is not None]
            if vals:
                for f, v in spread(vals).items():
                    g[f][i] = v
        groups.append(g)
    values = [v for s in panel["series"] for _, v in s["points"]]
    return {"title": panel["title"], "x": x, "y_range": y_range(list(by_key), values), "lines": lines,
            "groups": groups}


def default_spread(runs: list[dict[str, Any]]) -> str:
    """``"minmax"`` (mean line and min–max band) when the page shows two or more runs with the
    same config summary (seeds of one setting), else ``"none"`` (each run's own line); the page
    offers the other :data:`SPREADS` in a menu."""
    if len(runs) > 1 and all(r.get("config") == runs[0].get("config") for r in runs):
        return "minmax"
    return "none"


def render_html(data: dict[str, Any], title: str = "serl report") -> str:
    """The page of ``data`` (:func:`serl.report.data.report_data`) as one HTML string; its
    ``panels`` are embedded as :func:`chart_panel` columns, with ``spread``
    (:func:`default_spread`)."""
    from html import escape

    page_data = {**data, "panels": [chart_panel(p) for p in data["panels"]], "spread": default_spread(data["runs"])}
    page = _asset("template.html")
    parts = {"{{TITLE}}": escape(title), "{{CSS}}": _asset("vendor/uPlot.min.css") + "\n" + _asset("report.css"),
             "{{DATA}}": embed_json(page_data), "{{UPLOT}}": _asset("vendor/uPlot.iife.min.js"),
             "{{JS}}": _asset("report.js")}
    # one pass, so that no text put in (a run's data, the library) is read as a placeholder
    return re.sub(r"\{\{(TITLE|CSS|DATA|UPLOT|JS)\}\}", lambda m: parts[m.group(0)], page)


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
