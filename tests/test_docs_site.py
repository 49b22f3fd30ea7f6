"""The documentation site: ``mkdocs build --strict`` passes (a broken link, a missing page or a
docstring that does not parse fails it), and the built site works in headless Chromium: the home
page, the configuration reference (generated from the config dataclasses) and an API page render
without console errors, and the site's search finds a config key."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_report import Browser, chromium  # noqa: F401  (chromium: the session fixture, same skip rule)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site, built once per session with ``--strict``."""
    if shutil.which("mkdocs") is None and subprocess.run([sys.executable, "-m", "mkdocs", "--version"],
                                                         capture_output=True).returncode != 0:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"})
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return out


@pytest.fixture(scope="session")
def site_url(site):
    """The built site over HTTP on 127.0.0.1 (the search index is fetched by a web worker, which a
    ``file://`` page may not do)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_the_config_reference_lists_every_key_with_its_default_and_comment(site):
    from serl.config import Config

    page = (site / "reference" / "config" / "index.html").read_text()
    keys = []

    def walk(prefix, obj):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            key = f"{prefix}{f.name}"
            keys.append(key)
            if dataclasses.is_dataclass(value):
                walk(key + ".", value)

    walk("", Config())
    missing = [k for k in keys if f"<code>{k}</code>" not in page]
    assert not missing, f"keys missing from the config reference: {missing}"
    # a field's #: comment and its default, as generated from serl/config/algorithm.py
    assert "algorithm.serl.weight_clip</code></td>" in page and "<code>0.2</code>" in page
    assert "which privileged hindsight the teacher sees" in page


def test_api_pages_hold_the_docstrings(site):
    for pkg, name in [("algos", "serl_token_weights"), ("config", "SerlConfig"), ("train", "Trainer"),
                      ("rollout", "ToolAgentLoop"), ("envs", "BaseTextEnv"), ("hindsight", "SerlContextBuilder"),
                      ("agent", "parsing"), ("sandbox", "make_sandbox")]:
        html = (site / "api" / pkg / "index.html").read_text()
        assert name in html, (pkg, name)
    assert "Selective, sign-aware token weights" in (site / "api" / "algos" / "index.html").read_text()


def _wait(b: Browser, expr: str, timeout: float = 30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = b.js(expr)
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {expr}")


def test_pages_render_without_console_errors_and_search_finds_a_config_key(site_url, chromium):
    with Browser(chromium) as b:
        for path, text in [("", "Multi-turn RL for LLM agents"), ("reference/config/", "algorithm.serl.weight_clip"),
                           ("api/algos/", "serl_token_weights")]:
            b.open(site_url + path)
            _wait(b, "document.readyState === 'complete'")
            assert text in b.js("document.body.innerText"), path
            assert b.js("document.querySelectorAll('.md-content h1').length") >= 1, path
            assert not b.errors(), (path, b.errors())
        # Material opens the search with ?q= and lists the hits once its worker has the index
        b.open(site_url + "?q=weight_clip")
        hits = _wait(b, "(function () { var r = document.querySelectorAll('.md-search-result__item');"
                        " return r.length && Array.prototype.map.call(r, function (e) { return e.innerText; }); })()")
        assert any("weight_clip" in h for h in hits), hits
        assert any("Configuration reference" in h for h in hits), hits
        assert not b.errors(), b.errors()
