"""``serl report`` (issue 11): the trace the trainer records, the data that feeds the page, the page
itself rendered in headless Chromium, ``serl eval --out FILE.jsonl`` and the W&B sink.

One short tiny-model SERL run (immediate feedback, 2 iterations, scripted replies: see
tests/report_run.py) feeds every test of this module.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import re
import select
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from serl.cli import main
from serl.config import TrainerConfig
from serl.report.data import ReportError, load_run, report_data
from serl.report.html import chart_panel, default_spread, embed_json, render_html, spread, y_range
from serl.train.metrics import MetricsLogger
from serl.train.teacher_log import TraceWriter, merged_spans, token_char_spans, trace_sample

from report_run import scripted_serl_run


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    return scripted_serl_run(tiny_model_dir, tmp_path_factory.mktemp("report_runs"))


def _trace(run_dir, it):
    return [json.loads(x) for x in (run_dir / "trace" / f"{it}.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ the trace (trainer side)
def test_token_char_spans_cover_the_reply(tokenizer):
    text = "<think>héllo wörld</think>\n<action>go to desk 1</action>"
    ids = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    spans = token_char_spans(tokenizer, ids)
    assert len(spans) == len(ids)
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(decoded[a:b] for a, b in spans) == decoded == text
    assert spans[-1][0] == spans[-1][1] == len(text)  # EOS: empty span at the end
    assert merged_spans([[0, 2], [2, 5], [5, 5], [5, 9], [9, 12]], [1, 1, 1, 0, 1]) == [[0, 5], [9, 12]]


def test_trace_sample_takes_whole_trajectories():
    uids = ["a", "a", "b", "b", "b", "c", "d", "d"]
    picked = trace_sample(uids, iteration=3, max_rows=4)
    assert len(picked) <= 4 and picked == sorted(picked)
    by = {}
    for i in picked:
        by.setdefault(uids[i], []).append(i)
    for u, rows in by.items():  # whole trajectories only
        assert rows == [i for i, x in enumerate(uids) if x == u]
    assert picked == trace_sample(uids, iteration=3, max_rows=4)  # seeded by the iteration
    assert trace_sample(["a"] * 10, 1, max_rows=4) == [0, 1, 2, 3]  # a long first trajectory is cut


def test_trace_writer_bounds(tmp_path):
    rows = [{"traj_uid": f"t{i // 2}", "observation": "x" * 5000, "serl": {"context": "y" * 5000}} for i in range(10)]
    w = TraceWriter(tmp_path, TrainerConfig(trace_freq=2, trace_max_text_chars=100, trace_max_bytes=10_000))
    assert w.write(3, rows) is None and w.write(0, []) is None
    path = w.write(4, rows)
    got = [json.loads(x) for x in path.read_text().splitlines()]
    assert path.stat().st_size <= 10_000
    assert got[0]["observation"].startswith("x" * 100 + " [... 4900 more chars cut]")
    assert got[0]["serl"]["context"].startswith("y" * 100 + " [...") and got[0]["iteration"] == 4
    assert len({r["traj_uid"] for r in got}) * 2 == len(got)  # whole trajectories dropped to fit
    assert not TraceWriter(tmp_path, TrainerConfig(trace_freq=0)).should_write(4)


def test_run_records_trace_with_serl_weights(run_dir):
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["timing/trace_s"] < 0.2 * m["timing/iteration_s"] for m in metrics)  # cheap
    n_weighted = 0
    for it in (1, 2):
        rows = _trace(run_dir, it)
        assert 0 < len(rows) <= TrainerConfig().trace_max_rows
        for r in rows:
            assert r["iteration"] == it and len(r["tokens"]) == len(r["action_mask"])
            if r["action_valid"]:  # the action spans are the action's characters
                assert "".join(r["response"][a:b] for a, b in r["action_spans"]) == r["action"]
            s = r["serl"]
            lam = s["lambda"]  # λ0 = 0.5, decaying linearly after the first update
            assert (lam == pytest.approx(0.5) if it == 1 else 0.4 < lam < 0.5) and s["has_context"]
            assert s["sources"] == ["feedback"] and r["feedback"][:50] in s["context"]  # immediate feedback: every row
            if r["advantage"] == 0 or not r["trained"]:  # trains nothing: not scored (skip_zero_advantage_rows)
                assert s["teacher_scored"] is False and s["weights"] is None and s["lp_gap"] is None
                continue
            assert s["teacher_scored"] and len(s["weights"]) == len(s["lp_gap"]) == len(r["tokens"])
            for w, m in zip(s["weights"], r["action_mask"]):
                if not m:
                    assert w == 1.0
                else:  # W = (1-λ) + λ·clip(exp(sign(A)·Δ), 1±c), c = 0.2
                    assert 1 - 0.2 * lam - 1e-4 <= w <= 1 + 0.2 * lam + 1e-4
            n_weighted += sum(w != 1.0 for w in s["weights"])
    assert n_weighted > 0  # some action tokens were re-weighted


# ------------------------------------------------------------------ the data of the page
def test_report_data_curves_rows_tokens_weights(run_dir):
    run = load_run(run_dir)
    assert run["config"]["serl"] and run["config"]["sampling_mode"] == "immediate_feedback"
    assert [p[0] for p in run["metrics"]["episode/success_rate"]] == [1, 2]
    trajs = run["trajectories"]
    assert {t["iteration"] for t in trajs} == {1, 2} and all(t["source"] == "trace" for t in trajs)
    assert all(t["has_context"] and [s["step_id"] for s in t["steps"]] == sorted(s["step_id"] for s in t["steps"])
               for t in trajs)
    assert sum(len(t["steps"]) for t in trajs) == len(_trace(run_dir, 1)) + len(_trace(run_dir, 2))
    data = report_data([run_dir, run_dir])
    assert [r["name"] for r in data["runs"]] == ["run", "run (2)"]
    titles = [p["title"] for p in data["panels"]]
    for t in ("Success rate", "Reward", "Valid-action ratio", "Advantages", "SERL λ and weights W",
              "SERL context fraction", "Entropy", "Timings (s)"):
        assert t in titles, t
    succ = next(p for p in data["panels"] if p["title"] == "Success rate")
    assert {(s["run"], s["key"]) for s in succ["series"]} == {("run", "episode/success_rate"),
                                                               ("run (2)", "episode/success_rate")}
    assert [len(t["trajectories"]) for t in [load_run(run_dir, iteration=2)]][0] == len(
        {r["traj_uid"] for r in _trace(run_dir, 2)})
    with pytest.raises(ReportError, match="no trace of iteration 7"):
        load_run(run_dir, iteration=7)
    with pytest.raises(ReportError, match="not a serl run folder"):
        load_run(run_dir / "trace")


def test_chart_panel_aligns_runs_and_their_spread():
    panel = {"title": "Success rate", "series": [
        {"run": "a", "key": "episode/success_rate", "points": [[1, 0.2], [2, 0.4]]},
        {"run": "b", "key": "episode/success_rate", "points": [[1, 0.6], [3, 1.0]]},
        {"run": "a", "key": "val/success_rate", "points": [[2, 0.5]]}]}
    c = chart_panel(panel)
    assert c["x"] == [1, 2, 3] and c["y_range"] == {"min": 0, "max": 1, "fixed": True}
    assert [(line["run"], line["key"], line["y"]) for line in c["lines"]] == [
        ("a", "episode/success_rate", [0.2, 0.4, None]), ("b", "episode/success_rate", [0.6, None, 1.0]),
        ("a", "val/success_rate", [None, 0.5, None])]
    (g,) = c["groups"]  # val/success_rate has one run: no group
    assert g["key"] == "episode/success_rate" and g["runs"] == ["a", "b"] and g["n"] == [2, 1, 1]
    assert g["mean"] == pytest.approx([0.4, 0.4, 1.0]) and g["min"] == [0.2, 0.4, 1.0] and g["max"] == [0.6, 0.4, 1.0]
    # sample std of {0.2, 0.6}: sqrt((0.2² + 0.2²) / (2 - 1)) = 0.28284...
    assert g["std"][0] == pytest.approx(0.2828427) and g["std"][1:] == [None, None]
    s = spread([1.0, 2.0, 6.0])  # mean 3, deviations -2 -1 3: sqrt(14 / 2)
    assert s == {"n": 3, "mean": 3.0, "min": 1.0, "max": 6.0, "std": pytest.approx(7 ** 0.5)}
    with pytest.raises(ValueError, match="at least one value"):
        spread([])


def test_y_range_of_rates_and_the_default_spread():
    assert y_range(["episode/success_rate", "val/success_rate"], [0.0, 1.0]) == {"min": 0, "max": 1, "fixed": True}
    assert y_range(["episode/valid_action_ratio"], [0.5]) == {"min": 0, "max": 1, "fixed": False}
    assert y_range(["serl/action_token_fraction", "episode/success_rate"], [0.1]) == {"min": 0, "max": 1, "fixed": False}
    assert y_range(["actor/kl_loss"], [0.1]) is None  # a loss: automatic
    assert y_range(["critic/advantages/mean", "critic/advantages/nonzero_fraction"], [0.1]) is None
    assert y_range(["episode/success_rate"], [1.5]) is None  # not a rate after all: do not hide it
    same, other = {"config": {"env": "alfworld"}}, {"config": {"env": "webshop"}}
    assert default_spread([same]) == "none" and default_spread([same, dict(same)]) == "minmax"
    assert default_spread([same, other]) == "none"  # different settings: each run's own line


def test_embedded_json_cannot_close_the_script_tag():
    s = embed_json({"x": "</script><script>alert(1)</script> & \u2028"})
    assert "<" not in s and ">" not in s and json.loads(s)["x"].startswith("</script>")
    page = render_html({"runs": [], "panels": []})
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched from a network
    assert "var uPlot=" in page and "{{" not in page  # the chart library is inlined, every placeholder filled
    trap = render_html({"runs": [{"name": "{{JS}} {{UPLOT}}", "config": {}}], "panels": []})
    assert trap.count("var uPlot=") == 1  # a placeholder inside the data is data, not a place to fill


def test_eval_out_jsonl_and_report_cli(run_dir, tiny_model_dir, tmp_path, capsys):
    tasks_file = tmp_path / "tasks.jsonl"
    rc = main(["eval", "--run", str(run_dir), "env.max_steps=2", "data.max_response_length=8",
               "rollout.micro_batch_size=2", "--split", "valid_unseen", "--num-tasks", "2", "--greedy",
               "--out", str(tasks_file)])
    assert rc == 0
    lines = [json.loads(x) for x in tasks_file.read_text().splitlines()]
    assert len(lines) == 2 and {x["split"] for x in lines} == {"valid_unseen"}
    for x in lines:
        assert set(x) >= {"task_id", "task_type", "won", "episode_reward", "length", "valid_action_ratio"}
        assert 1 <= x["length"] <= 2
    assert (run_dir / "eval_valid_unseen" / "tasks.jsonl").read_text() == tasks_file.read_text()
    out = tmp_path / "page.html"
    assert main(["report", str(run_dir), "--out", str(out), "--iteration", "1"]) == 0
    assert "serl report:" in capsys.readouterr().out
    page = out.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="serl-data">(.*?)</script>', page, re.S).group(1))
    run = data["runs"][0]
    assert {t["iteration"] for t in run["trajectories"]} == {1}
    assert run["evals"][0]["name"] == "eval_valid_unseen" and len(run["evals"][0]["tasks"]) == 2
    assert main(["report", str(run_dir), "--iteration", "9", "--out", str(out)]) == 2


def test_wandb_logger_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    lg = MetricsLogger(tmp_path / "run", ["jsonl", "wandb", "console"], project="serl-test",
                       config={"trainer": {"total_training_steps": 2}})
    lg.log(1, {"episode/success_rate": 0.25})
    lg.log(2, {"episode/success_rate": 0.5})
    run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
    lg.close()
    runs = list((tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2


# ------------------------------------------------------------------ the page in a real browser
@pytest.fixture(scope="session")
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                               env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            if r.returncode != 0:
                print(f"{' '.join(cmd)} failed: {r.stderr[-500:]}")
                break
        exe = shutil.which("chromium")
    if exe is None:
        reason = "chromium is not installed and could not be installed (apt-get install chromium needs root)"
        print(reason)
        pytest.skip(reason)
    return exe


def _chromium(exe, *args):
    # --proxy-server to a closed port: any network request the page tried would fail
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
           "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


class Browser:
    """Headless Chromium driven over the DevTools protocol on ``--remote-debugging-pipe`` (JSON
    messages ended by NUL: commands on the browser's fd 3, answers and events on its fd 4), so a
    test can move the mouse and read the page back; no Python package needed."""

    def __init__(self, exe: str, width: int = 1280, height: int = 1600, scale: float = 1):
        cmd_r, self.w = os.pipe()
        self.r, out_w = os.pipe()
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, out_w)]  # clear of 3 and 4
        for fd in (cmd_r, out_w):
            os.close(fd)
        self.proc = subprocess.Popen(  # bash: dash cannot redirect fds above 9
            ["bash", "-c", f'exec "$0" "$@" 3<&{ends[0]} 4>&{ends[1]}', exe, "--headless", "--no-sandbox",
             "--disable-gpu", "--remote-debugging-pipe", "--proxy-server=127.0.0.1:9", "--hide-scrollbars", "about:blank"],
            pass_fds=ends, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in ends:
            os.close(fd)
        self.buf, self.last_id, self.events = b"", 0, []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", self.session)
        self.send("Runtime.enable", self.session)  # errors thrown or logged by the page arrive as events
        self.send("Emulation.setDeviceMetricsOverride", self.session, width=width, height=height,
                  deviceScaleFactor=scale, mobile=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.w)
        os.close(self.r)

    def _message(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError(f"chromium sent nothing for {timeout} s")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit code {self.proc.poll()})")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, session: str | None = None, timeout: float = 60, **params):
        self.last_id += 1
        msg = {"id": self.last_id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._message(timeout)
            if m.get("id") == self.last_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)

    def open(self, url: str, before: str = "") -> None:
        """Load ``url`` (``before``: a script run in the page before its own scripts)."""
        if before:
            self.send("Page.addScriptToEvaluateOnNewDocument", self.session, source=before)
        self.events.clear()
        self.send("Page.navigate", self.session, url=url)
        end = time.monotonic() + 60
        while not any(m.get("method") == "Page.loadEventFired" for m in self.events):
            self.events.append(self._message(end - time.monotonic()))

    def js(self, expr: str):
        """The value of the JS expression ``expr`` (a promise is awaited)."""
        r = self.send("Runtime.evaluate", self.session, expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr[:200]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def errors(self) -> list[dict]:
        """Exceptions the page threw and errors it logged since :meth:`open`."""
        return [m for m in self.events if m.get("method") == "Runtime.exceptionThrown"
                or (m.get("method") == "Runtime.consoleAPICalled" and m["params"]["type"] in ("error", "warning", "assert"))]

    def mouse(self, kind: str, x: float, y: float, button: str = "none", clicks: int = 0) -> None:
        held = 1 if button == "left" and kind != "mouseReleased" else 0
        self.send("Input.dispatchMouseEvent", self.session, type=kind, x=x, y=y, button=button, clickCount=clicks,
                  buttons=held)


#: run in the page before its scripts: records every text drawn on a canvas with its bounding box
#: in canvas pixels (``measureText`` from the ``textAlign``/``textBaseline`` point, through the
#: context's transform), so the test sees the tick labels uPlot paints
TEXT_SPY = """(function () {
  var P = CanvasRenderingContext2D.prototype, fill = P.fillText;
  window.serlTexts = [];
  P.fillText = function (text, x, y) {
    var m = this.measureText(text), t = this.getTransform(), px = [], py = [];
    [x - m.actualBoundingBoxLeft, x + m.actualBoundingBoxRight].forEach(function (a) {
      [y - m.actualBoundingBoxAscent, y + m.actualBoundingBoxDescent].forEach(function (b) {
        px.push(t.a * a + t.c * b + t.e); py.push(t.b * a + t.d * b + t.f); }); });
    window.serlTexts.push({canvas: this.canvas, text: String(text), x0: Math.min.apply(null, px),
      x1: Math.max.apply(null, px), y0: Math.min.apply(null, py), y1: Math.max.apply(null, py)});
    return fill.apply(this, arguments);
  };
})();"""

_CHART = "window.serlCharts.find(function (c) {{ return c.title === {title}; }})"


def _chart_texts(b: Browser) -> list[dict]:
    """Per chart on the page: its title, canvas size, plot box and the texts drawn on it."""
    return b.js("""window.serlCharts.map(function (c) { var u = c.plot, cv = u.ctx.canvas;
      return {title: c.title, w: cv.width, h: cv.height, plot: [u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height],
        y: [u.scales.y.min, u.scales.y.max], texts: window.serlTexts.filter(function (t) { return t.canvas === cv; })
          .map(function (t) { return {text: t.text, x0: t.x0, x1: t.x1, y0: t.y0, y1: t.y1}; })}; })""")


def _is_nice(step: float) -> bool:
    m = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(abs(m - n) < 1e-6 for n in (1, 2, 2.5, 5))


def _assert_ticks_inside_and_nice(charts: list[dict]) -> None:
    """Every text of every chart lies inside its canvas (nothing cut at an edge); the y tick labels
    are distinct numbers a nice step apart (1, 2, 2.5 or 5 × 10^k); the x ticks whole iterations."""
    assert charts
    for c in charts:
        assert c["texts"], c["title"]
        for t in c["texts"]:
            assert -0.5 <= t["x0"] and t["x1"] <= c["w"] + 0.5 and -0.5 <= t["y0"] and t["y1"] <= c["h"] + 0.5, (c["title"], t)
        left, top, _, height = c["plot"]
        ys = [float(t["text"]) for t in sorted(c["texts"], key=lambda t: -t["y0"]) if t["x1"] <= left]
        assert len(ys) >= 2 and len(set(ys)) == len(ys), (c["title"], ys)
        steps = [b - a for a, b in zip(ys, ys[1:])]
        assert all(s > 0 and s == pytest.approx(steps[0], rel=1e-6) for s in steps) and _is_nice(steps[0]), (c["title"], ys)
        xs = [t["text"] for t in sorted(c["texts"], key=lambda t: t["x0"]) if t["y0"] >= top + height and t["text"] != "iteration"]
        assert xs and all(x.isdigit() for x in xs) and [int(x) for x in xs] == sorted({int(x) for x in xs}), (c["title"], xs)


def _point(b: Browser, title: str, series: int, j: int) -> tuple[float, float]:
    """Viewport position of data point ``j`` of ``series`` of chart ``title`` (scrolled into view;
    a point on the plot's edge, such as a success rate of 0, is taken 1 px inside it)."""
    return tuple(b.js(f"""(function () {{ var u = {_CHART.format(title=json.dumps(title))}.plot;
      u.root.scrollIntoView({{block: "center"}});
      var r = u.over.getBoundingClientRect(), x = u.valToPos(u.data[0][{j}], "x"), y = u.valToPos(u.data[{series}][{j}], "y");
      return [r.left + Math.min(Math.max(x, 1), r.width - 1), r.top + Math.min(Math.max(y, 1), r.height - 1)]; }})()"""))


def _hover(b: Browser, title: str, series: int, j: int) -> tuple[int, dict[str, str]]:
    """Move the mouse over a data point; the cursor's index and the legend (label: value)."""
    b.mouse("mouseMoved", *_point(b, title, series, j))
    idx, rows = b.js(f"""new Promise(function (ok) {{ requestAnimationFrame(function () {{ requestAnimationFrame(function () {{
      var u = {_CHART.format(title=json.dumps(title))}.plot;
      ok([u.cursor.idx, Array.from(u.root.querySelectorAll(".u-legend .u-series")).map(function (tr) {{
        return [tr.querySelector(".u-label").textContent, tr.querySelector(".u-value").textContent]; }})]); }}); }}); }})""")
    return idx, dict(rows)


def _meta(b: Browser, title: str) -> list[dict]:
    return b.js(f"{_CHART.format(title=json.dumps(title))}.meta")


def _x_scale(b: Browser, title: str) -> list[float]:
    return b.js(f"(function () {{ var u = {_CHART.format(title=json.dumps(title))}.plot; return [u.scales.x.min, u.scales.x.max]; }})()")


def _spread(b: Browser, mode: str) -> None:
    b.js(f"""(function () {{ window.serlTexts = []; var s = document.getElementById("spread"); s.value = {json.dumps(mode)};
      s.dispatchEvent(new Event("change")); }})()""")


def _metrics(run: Path) -> dict[int, dict]:
    return {r["iteration"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory):
    """Three run folders of one setting (seeds): 30 iterations of a success rate, a KL loss near
    5.6e-4 (the ticks the hand-drawn SVG cut), iteration times near 12 000 s, advantages either
    side of 0, and a val/ success rate every 5 iterations."""
    runs = []
    for seed in range(3):
        d = tmp_path_factory.mktemp("seeds") / f"seed{seed}"
        d.mkdir()
        (d / "config.yaml").write_text("env: {name: alfworld}\nalgorithm: {adv_estimator: grpo}\n")
        rng, lines = random.Random(seed), []
        for it in range(1, 31):
            r = {"iteration": it, "episode/success_rate": min(1.0, max(0.0, it / 30 + rng.uniform(-0.1, 0.1))),
                 "actor/kl_loss": 5.5e-4 + rng.uniform(0, 1e-4), "timing/iteration_s": 12000 + rng.uniform(-500, 500),
                 "critic/advantages/mean": rng.uniform(-0.3, 0.2)}
            if it % 5 == 0:
                r["val/success_rate"] = rng.random()
            lines.append(json.dumps(r))
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        runs.append(d)
    return runs


def test_charts_of_seeds_in_chromium(seed_runs, chromium, tmp_path):
    page = tmp_path / "seeds.html"
    assert main(["report", *map(str, seed_runs), "--out", str(page)]) == 0
    metrics = {d.name: _metrics(d) for d in seed_runs}
    with Browser(chromium) as b:
        b.open(page.as_uri(), before=TEXT_SPY)
        assert b.js('document.getElementById("spread").value') == "minmax"  # one setting: seeds
        for mode in ("minmax", "std", "none"):
            if mode != "minmax":
                _spread(b, mode)
            charts = _chart_texts(b)
            assert [c["title"] for c in charts] == ["Success rate", "Advantages", "KL", "Timings (s)"], mode
            _assert_ticks_inside_and_nice(charts)
            assert next(c for c in charts if c["title"] == "Success rate")["y"] == [0, 1]
        _spread(b, "minmax")
        meta = _meta(b, "KL")
        assert [m["role"] for m in meta] == ["x", "run", "run", "run", "max", "min", "mean"]
        seed1 = next(i for i, m in enumerate(meta) if m.get("run") == "seed1")
        idx, legend = _hover(b, "KL", seed1, 6)  # the mouse on seed1's point of iteration 7
        assert idx == 6 and legend["iteration"] == "7"
        kl = [metrics[f"seed{s}"][7]["actor/kl_loss"] for s in range(3)]
        for s in range(3):
            assert float(legend[f"seed{s}: actor/kl_loss"]) == pytest.approx(kl[s], rel=1e-7)
        assert float(legend["actor/kl_loss: mean of 3 runs"]) == pytest.approx(statistics.mean(kl), rel=1e-7)
        assert float(legend["actor/kl_loss: min of 3 runs"]) == pytest.approx(min(kl), rel=1e-7)
        assert float(legend["actor/kl_loss: max of 3 runs"]) == pytest.approx(max(kl), rel=1e-7)
        _spread(b, "std")
        _, legend = _hover(b, "Timings (s)", 1, 12)
        t = [metrics[f"seed{s}"][13]["timing/iteration_s"] for s in range(3)]
        assert legend["iteration"] == "13"
        assert float(legend["timing/iteration_s: mean + std of 3 runs"]) == pytest.approx(
            statistics.mean(t) + statistics.stdev(t), rel=1e-7)
        # drag from iteration 5 to 15 zooms the x axis in to them; a double-click zooms back out
        _spread(b, "none")
        assert _x_scale(b, "Advantages") == [1, 30]
        (x0, y), (x1, _) = _point(b, "Advantages", 1, 4), _point(b, "Advantages", 1, 14)
        b.mouse("mouseMoved", x0, y)
        b.mouse("mousePressed", x0, y, "left", 1)
        b.mouse("mouseMoved", (x0 + x1) / 2, y, "left")
        b.mouse("mouseMoved", x1, y, "left")
        b.mouse("mouseReleased", x1, y, "left", 1)
        lo, hi = _x_scale(b, "Advantages")
        assert lo == pytest.approx(5, abs=0.2) and hi == pytest.approx(15, abs=0.2)
        idx, legend = _hover(b, "Advantages", 2, 9)  # zoomed in: hover still reads the data
        assert legend["seed1: critic/advantages/mean"] and float(legend["seed1: critic/advantages/mean"]) == pytest.approx(
            metrics["seed1"][10]["critic/advantages/mean"], rel=1e-7)
        for clicks in (1, 2):
            b.mouse("mousePressed", x1, y, "left", clicks)
            b.mouse("mouseReleased", x1, y, "left", clicks)
        assert _x_scale(b, "Advantages") == [1, 30]
        assert not b.errors()


def test_charts_of_a_run_in_chromium(run_dir, chromium, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--out", str(page)]) == 0
    metrics = _metrics(run_dir)
    with Browser(chromium, scale=2) as b:  # a HiDPI screen: uPlot draws in device pixels
        b.open(page.as_uri(), before=TEXT_SPY)
        assert b.js('document.getElementById("spread")') is None  # one run: nothing to aggregate
        charts = _chart_texts(b)
        assert len(charts) >= 8 and all(c["w"] == 760 for c in charts)
        _assert_ticks_inside_and_nice(charts)
        for c in charts:
            if c["title"] in ("Success rate", "Valid-action ratio", "SERL context fraction"):
                assert 0 <= c["y"][0] < c["y"][1] <= 1, c
        points = [(title, key, next(i for i, m in enumerate(_meta(b, title)) if m.get("key") == key), j, it)
                  for title, key in (("Success rate", "episode/success_rate"), ("SERL λ and weights W", "serl_action_mask/weight_mean"))
                  for j, it in enumerate((1, 2))]
        for title, key, series, j, _ in points:  # before any hover (which fades the series it is not near)
            # the curve is drawn: pixels of the series' colour (its legend marker's) at the point, with
            # the panel's other series hidden (near-equal values, as W's mean/min/max, draw over it)
            show = """(function (only) {{ var u = {chart}.plot;
              for (var i = 1; i < u.series.length; i++) u.setSeries(i, {{show: only < 0 || i === only}}); }})"""
            b.js(show.format(chart=_CHART.format(title=json.dumps(title))) + f"({series})")  # uPlot redraws after this call
            drawn = b.js(f"""(function () {{ var u = {_CHART.format(title=json.dumps(title))}.plot;
              var c = getComputedStyle(u.root.querySelectorAll(".u-legend .u-marker")[{series}]).borderTopColor.match(/\\d+/g).map(Number);
              var x = Math.round(u.valToPos(u.data[0][{j}], "x", true)), y = Math.round(u.valToPos(u.data[{series}][{j}], "y", true));
              var d = u.ctx.getImageData(x - 4, y - 4, 9, 9).data, n = 0;
              for (var k = 0; k < d.length; k += 4)
                if (d[k + 3] > 200 && Math.abs(d[k] - c[0]) + Math.abs(d[k + 1] - c[1]) + Math.abs(d[k + 2] - c[2]) < 60) n++;
              return n; }})()""")
            b.js(show.format(chart=_CHART.format(title=json.dumps(title))) + "(-1)")
            assert drawn > 0, (title, key, j)
        for title, key, series, j, it in points:
            idx, legend = _hover(b, title, series, j)
            assert (idx, legend["iteration"]) == (j, str(it)), (title, key)
            assert float(legend[key]) == pytest.approx(metrics[it][key], rel=1e-7)
        assert not b.errors()


def test_page_renders_in_headless_chromium(run_dir, chromium, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--out", str(page)]) == 0
    r = _chromium(chromium, "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    # one uPlot chart per panel, its legend naming the metrics (the drawing is checked in test_charts_*)
    assert dom.count('<div class="chart"') == dom.count('<div class="uplot') >= 8
    labels = re.findall(r'<th><div class="u-marker"[^>]*></div><div class="u-label">([^<]+)</div></th>', dom)
    assert "episode/success_rate" in labels and "serl_action_mask/weight_mean" in labels
    # one trajectory is expanded, with its steps
    opened = re.findall(r'<details class="traj"[^>]*open=""[^>]*>(.*?)</details>\s*(?=<details class="traj"|</div>)', dom, re.S)
    assert len(opened) == 1 and 'class="step"' in opened[0] and "Task:" in opened[0]
    # a coloured action token carries its weight and the log-prob gap on hover
    toks = re.findall(r'<span class="tok act w (w-up|w-down|w-one)" data-i="\d+" data-w="([0-9.]+)" '
                      r'data-gap="(-?[0-9.e-]+)" title="W = ([0-9.]+)[^"]*" style="background: rgba\(', dom)
    assert toks and any(c != "w-one" and float(w) != 1.0 for c, w, _, _ in toks)
    assert all(abs(float(w) - float(t)) < 1e-4 for _, w, _, t in toks)
    assert all(c == ("w-up" if float(w) > 1 else "w-down" if float(w) < 1 else "w-one") for c, w, _, _ in toks)
    assert re.search(r'<span class="muted" id="traj-count">(\d+) of \1 trajectories</span>', dom)
    # the URL hash opens another trajectory
    uid = _trace(run_dir, 1)[0]["traj_uid"]
    dom2 = _chromium(chromium, "--dump-dom", page.as_uri() + f"#traj-{uid}").stdout
    assert re.search(rf'<details class="traj" id="traj-{uid}"[^>]*open=""', dom2)
    shot = tmp_path / "shot.png"
    r = _chromium(chromium, "--hide-scrollbars", "--window-size=1280,1600", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_never_imports_the_trainer():
    import grimp

    graph = grimp.build_graph("serl", exclude_type_checking_imports=True)
    for m in graph.find_descendants("serl.report"):
        bad = {x for x in graph.find_modules_directly_imported_by(m) if x.startswith("serl.train")}
        assert not bad, (m, bad)


def test_math_trajectory_in_chromium_shades_tool_outputs(tiny_model_dir, tmp_path, chromium):
    """A math run's page: the tool call's output reads as such and is marked as not trained."""
    from serl.configure import load_config
    from serl.train.trainer import Trainer
    from test_tool_loop import ScriptedMathEngine, call

    cfg = load_config("cpu_math", [f"model.path={tiny_model_dir}", "model.dtype=float32", "model.train_dtype=float32",
                                   "data.train_batch_size=1", "env.rollout.n=2", "env.num_workers=1",
                                   "rollout.rollout_filter_ratio=1.0", "trainer.total_training_steps=1",
                                   "trainer.progress=false", "trainer.logger=[jsonl]", "trainer.save_freq=0",
                                   f"trainer.output_dir={tmp_path}", "trainer.run_name=math",
                                   "data.max_response_length=128"])
    tr = Trainer(cfg)
    tr.engine = ScriptedMathEngine(tr.tokenizer, [call("print(6 * 7)"), "\\boxed{42}"])
    try:
        tr.train()
    finally:
        tr.close()
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "math"), "--out", str(page)]) == 0
    r = _chromium(chromium, "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    shaded = re.findall(r'<span class="tok ins" title="inserted by the rollout \(tool output\): not trained">(.*?)</span>',
                        r.stdout, re.S)
    assert any("&lt;tool_response&gt;\n42\n&lt;/tool_response&gt;" in t for t in shaded)
    assert not any("boxed" in t for t in shaded)  # the model's own turns are not shaded
    assert "tool outputs shaded, not trained" in r.stdout
