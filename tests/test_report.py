"""``serl report`` (issue 11): the trace the trainer records, the data that feeds the page, the page
itself rendered in headless Chromium, ``serl eval --out FILE.jsonl`` and the W&B sink.

One short tiny-model SERL run (immediate feedback, 2 iterations, scripted replies: see
tests/report_run.py) feeds every test of this module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from serl.cli import main
from serl.config import TrainerConfig
from serl.report.data import ReportError, load_run, report_data
from serl.report.html import embed_json, render_html
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


def test_embedded_json_cannot_close_the_script_tag():
    s = embed_json({"x": "</script><script>alert(1)</script> & \u2028"})
    assert "<" not in s and ">" not in s and json.loads(s)["x"].startswith("</script>")
    page = render_html({"runs": [], "panels": []})
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched from a network


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


def test_page_renders_in_headless_chromium(run_dir, chromium, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--out", str(page)]) == 0
    r = _chromium(chromium, "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    # curves drawn: SVG paths with points, in every chart
    paths = re.findall(r'<path class="line" d="(M[^"]*)"[^>]*data-key="([^"]+)"', dom)
    assert any(k == "episode/success_rate" and d.count("L") == 1 for d, k in paths)
    assert any(k == "serl_action_mask/weight_mean" for _, k in paths)
    assert dom.count('<div class="chart"') >= 8
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
