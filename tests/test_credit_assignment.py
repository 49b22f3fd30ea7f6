"""experiments/credit_assignment.py: the oracle labels (ALFWorld's planner, GSM8K's annotations), the
AUC and its cluster bootstrap on hand-computed cases, the report on a hand-built work folder, and
the three phases end to end on the tiny model (with resume: a second run redoes nothing)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "experiments"))  # the scripts import their siblings by name

import credit_assignment as ca  # noqa: E402
from learning_stats import auc, cluster_bootstrap  # noqa: E402

from serl.envs.base import Task  # noqa: E402
from serl.trajectory import Step, Trajectory  # noqa: E402


def _step(i: int, action: str, plan=None, won=False, mask=(0, 1, 1, 0), response=None) -> Step:
    info = {} if plan is None else {"expert_plan": plan}
    return Step(step_id=i, observation="", prompt="", prompt_ids=[1], response_ids=list(response or range(len(mask))),
                response_text="", action_mask=list(mask), action=action, action_valid=True, won=won, done=won, info=info)


def test_auc_hand_computed():
    # positives 0.35 and 0.8 against negatives 0.1 and 0.4: 3 of the 4 pairs ordered right
    assert auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert auc([1.0, 1.0], [True, False]) == pytest.approx(0.5)  # a tie counts one half
    assert auc([2.0, 1.0, 1.0], [True, True, False]) == pytest.approx(0.75)  # (1 + 0.5) / 2
    assert auc([0.0, 1.0], [False, False]) != auc([0.0, 1.0], [False, False])  # NaN: one class only


def test_cluster_bootstrap_resamples_whole_clusters():
    # each cluster holds a positive above its negative; across the two clusters 3 of 4 pairs are
    # ordered: a resample of whole clusters has AUC 1 (one cluster twice) or 0.75 (both), while
    # resampling single steps could draw e.g. the positive 1.0 against the negative 2.0 alone (AUC 0)
    clusters = [[(1.0, True), (0.0, False)], [(3.0, True), (2.0, False)]]
    stat = lambda xs: auc([x[0] for x in xs], [x[1] for x in xs])  # noqa: E731
    lo, hi = cluster_bootstrap(stat, clusters, draws=200, seed=1)
    assert (lo, hi) == (0.75, 1.0)
    lo, hi = cluster_bootstrap(lambda xs: float("nan"), clusters, draws=5)
    assert math.isnan(lo) and math.isnan(hi)


def test_alfworld_labels_follow_the_planner():
    traj = Trajectory(uid="g", traj_uid="t", task=Task("alfworld", "x", "pick_and_place_simple"))
    traj.extra["expert_plan0"] = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1", "put pen 1 in/on shelf 1"]
    traj.steps = [
        _step(0, "go to desk 1", ["take pen 1 from desk 1", "go to shelf 1", "put pen 1 in/on shelf 1"]),  # the expert's
        _step(1, "look", ["take pen 1 from desk 1", "go to shelf 1", "put pen 1 in/on shelf 1"]),  # no progress
        _step(2, "go to bed 1", ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1", "put pen 1 in/on shelf 1"]),
        # not the planner's first action, but the plan from the next state is one shorter
        _step(3, "go to desk 1", ["take pen 1 from desk 1", "go to shelf 1", "put pen 1 in/on shelf 1"]),
        _step(4, "put pen 1 in/on shelf 1", None, won=True),  # the last step wins: right whatever the plan
    ]
    assert ca.alfworld_labels(traj) == [True, False, False, True, True]
    traj.extra["expert_plan0"] = None  # no plan recorded for the first state: unknown
    assert ca.alfworld_labels(traj)[0] is None


def test_action_token_runs():
    assert ca._runs([0, 1, 1, 0, 1, 0, 0, 1]) == [(1, 3), (4, 5), (7, 8)]
    assert ca._runs([]) == []


def test_math_labels_by_turn(tokenizer):
    enc = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    turns = [(enc('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(48/2)"}}\n</tool_call>'), 1),
             (enc("\n<tool_response>\n24.0\n</tool_response>\n"), 0),
             (enc('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(48+25)"}}\n</tool_call>'), 1),
             (enc("\n<tool_response>\n73\n</tool_response>\n"), 0),
             (enc("The answer is \\boxed{72}."), 1)]
    ids = [i for t, _ in turns for i in t]
    mask = [m for t, m in turns for _ in t]
    step = _step(0, "72", mask=mask, response=ids)
    traj = Trajectory(uid="g", traj_uid="t", task=Task("math", "gsm8k-train-00000", "gsm8k"))
    traj.extra["reference_results"] = [24.0, 72.0]
    assert ca.math_labels(traj, step, tokenizer) == [("tool", True), ("tool", False), ("answer", False)]
    step.won = True
    assert ca.math_labels(traj, step, tokenizer)[-1] == ("answer", True)


def test_reference_results_parse_gsm8k_annotations():
    results = ca.reference_results()
    assert results["gsm8k-train-00000"] == [24.0, 72.0]  # Natalia's clips: <<48/2=24>>, <<48+24=72>>


def test_report_on_a_hand_built_workdir(tmp_path):
    """A teacher that raises every right step and lowers every wrong one: AUC 1 in won and lost
    episodes; the student's own log-probs ordered the other way: AUC 0."""
    episodes, student, teacher = [], [], []
    for e in range(6):
        won = e % 2 == 0
        units = [{"step_id": s, "unit": 0, "kind": "step", "label": s % 2 == 0} for s in range(4)]
        episodes.append({"traj_uid": f"t{e}", "uid": f"g{e // 2}", "task_id": "x", "task_type": "y", "won": won,
                         "units": units})
        for u in units:
            lp = -1.0 if u["label"] else -0.5
            student.append({"key": [f"t{e}", u["step_id"]], "units": [[lp, lp]]})
            d = 0.3 if u["label"] else -0.1
            teacher.append({"key": [f"t{e}", u["step_id"]], "units": [[lp + d, lp + d]]})
    (tmp_path / "scores").mkdir()
    (tmp_path / "labels.jsonl").write_text("\n".join(json.dumps(e) for e in episodes) + "\n")
    (tmp_path / "scores" / "_student.json").write_text(json.dumps({"seconds": 1.0, "rows": student}))
    (tmp_path / "scores" / "immediate_feedback.json").write_text(json.dumps({"seconds": 2.0, "rows": teacher}))

    class Args:
        workdir, env, seed, modes = str(tmp_path), "alfworld", 0, ["immediate_feedback", "next_observation"]

    res = ca.report(Args, weight_clip=0.2)
    rows = {r["mode"]: r for r in res["rows"]}
    assert set(rows) == {"student log-prob (baseline)", "random (baseline)", "immediate_feedback"}  # unscored: absent
    mode = rows["immediate_feedback"]
    assert mode["won"]["auc"] == 1.0 and mode["lost"]["auc"] == 1.0 and mode["all"]["n"] == 24
    assert mode["mean_abs_delta"] == pytest.approx(0.2)  # |0.3| and |-0.1| on equally many tokens
    # won (sign +): exp(0.3) clipped at 1.2, exp(-0.1) not; lost (sign -): exp(0.1) not, exp(-0.3) at 0.8
    assert mode["clip_fraction"] == pytest.approx(0.5)
    assert rows["student log-prob (baseline)"]["all"]["auc"] == 0.0
    assert res["episodes"] == 6 and res["tasks"] == 3 and res["right_units"] == 12
    assert "| immediate_feedback | 24/24 |" in (tmp_path / "results.md").read_text()


def test_credit_assignment_end_to_end_on_the_tiny_model(tiny_model_dir, tmp_path):
    work = tmp_path / "credit"
    cmd = [sys.executable, str(REPO_ROOT / "experiments" / "credit_assignment.py"), "--env", "alfworld",
           "--workdir", str(work), "--tasks", "2", "--n", "2", "--chunk", "1", "--max-steps", "2",
           "--score-rows", "6", "--modes", "immediate_feedback", "anchor_next_observation",
           "--override", f"model.path={tiny_model_dir}", "data.max_response_length=8", "rollout.micro_batch_size=4",
           "data.max_prompt_length=2048"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}

    def run(*phases: str) -> str:
        r = subprocess.run(cmd + ["--phases", *phases], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout

    run("collect")
    chunks = sorted((work / "rollouts").iterdir())
    assert [p.name for p in chunks] == ["chunk_000.jsonl", "chunk_001.jsonl"]
    # the tiny model writes no <action> tags, so no token is an action token: mark every sampled
    # token as one, as a trained model's would be
    for p in chunks:
        trajs = [json.loads(x) for x in p.read_text().splitlines()]
        for t in trajs:
            assert t["extra"]["expert_plan0"]  # the planner answered at the reset
            for s in t["steps"]:
                s["action_mask"] = [1] * len(s["response_ids"])
        p.write_text("\n".join(json.dumps(t) for t in trajs) + "\n")
    (work / "labels.jsonl").unlink()
    out = run("collect", "score", "report")
    assert "collect:" not in out  # both chunks are on disk: nothing played again
    res = json.loads((work / "results.json").read_text())
    assert res["episodes"] == 4 and res["tasks"] == 2
    assert [r["mode"] for r in res["rows"]][2:] == ["immediate_feedback", "anchor_next_observation"]
    for row in res["rows"][2:]:
        assert row["rows"] == min(6, res["steps"]) and row["rows_with_context"] >= 1
    episodes = [json.loads(x) for x in (work / "labels.jsonl").read_text().splitlines()]
    assert all(e["units"][0]["plan_length"] for e in episodes)
    mtimes = {p: p.stat().st_mtime_ns for p in (work / "scores").iterdir()}
    out = run("collect", "score", "report")
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes and "score:" not in out  # resumed: nothing redone


@pytest.mark.parametrize("leg", ["credit_alfworld", "credit_math"])
def test_legs_parse(leg, monkeypatch, tmp_path):
    seen = {}

    def stop(args):
        seen.update(vars(args))
        raise SystemExit(0)

    monkeypatch.setattr(ca, "load_cfg", stop)
    with pytest.raises(SystemExit):
        ca.main([f"@{REPO_ROOT / 'experiments' / 'legs' / (leg + '.args')}", "--workdir", str(tmp_path)])
    assert seen["env"] == leg.split("_")[1] and seen["tasks"] >= 100 and seen["score_rows"] >= 500
    assert seen["modes"] == ca.default_modes(seen["env"])
