"""Does SERL's teacher point at the right action? Each hindsight mode's teacher–student log-prob gap
Δ on the student's own action tokens, ranked against an oracle's per-step label (AUC).

SERL (arXiv 2605.19447) turns Δ = log π_T(a | prompt + hindsight) − log π_θ(a | prompt) into a
sign-aware weight on the GRPO advantage (:func:`serl.algos.selective_weights.serl_token_weights`).
That can only add to GRPO if Δ is higher on right actions than on wrong ones. An oracle says which
actions are right, so this measures it directly, with no RL run:

1. ``collect`` — the current cold start plays ``--n`` episodes of each of ``--tasks`` train tasks
   at the rollouts' temperature, in the recipe's layout, and the oracle labels each step:

   * **ALFWorld**: the planner expert from the current state
     (:meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`; fast-downward, uniform-cost search on the
     relevant sub-problem). A step is *right* when its action is the planner's next action, or the
     planner's plan from the next state is shorter than from this one (the action keeps a shortest
     plan as short), or it wins the game.
   * **math**: GSM8K's reference solution: each ``<<expr=c>>`` annotation is an intermediate
     result. An assistant turn that calls the tool is *right* when the tool's output contains one of
     them; the turn that answers is right when the answer is.

2. ``score`` — for every ``--modes`` SERL sampling mode, the teacher (at the start of training: the
   policy itself, as SERL's lagged teacher is at update 0) scores the same ``--score-rows`` rows
   under the privileged prompt that SERL's teacher pass builds
   (:class:`serl.train.serl_pass.SerlTeacherPass`, contexts from all of the groups); the student's
   own log-probs once. One file per mode under ``scores/``: a re-run skips the modes done.
3. ``report`` — per mode: rows with a context, mean |Δ|, the fraction of weights at the clip
   (``algorithm.serl.weight_clip``; sign(A) > 0 in won episodes, < 0 in lost ones), and the AUC of
   the mean Δ over a step's action tokens against the label, in won and in lost episodes (and in
   all, also of Δ summed over the tokens and of Δ at the token the student was least sure of), with
   95% intervals from a bootstrap over episodes; beside them the student's own log-prob and a
   random score. ``results.json`` and ``results.md`` in the work folder.

Every phase is resumable: ``collect`` writes one file per chunk of tasks, ``score`` one per mode.
Run (CPU, small)::

    python experiments/credit_assignment.py --env alfworld --workdir runs/credit_alf \\
        --data-dir ALFWORLD_DATA --tasks 12 --n 2 --score-rows 200 --modes immediate_feedback

On a lent GPU: ``HARNESS=experiments/credit_assignment.py bash experiments/learning_gpu.sh ...``
(its header says what travels; the leg files' headers give the call), with
``--override trainer.device=cuda``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning_stats import auc, cluster_bootstrap  # noqa: E402

#: per env: its recipe, the split its tasks come from, and the env keyword that turns its oracle on
ENVS = {
    "alfworld": {"recipe": "cpu_conversation", "split": "train", "env_kwargs": {"expert": "planner"}},
    "math": {"recipe": "cpu_math", "split": "gsm8k:train", "env_kwargs": {}},
}
#: a number in a tool output or an annotation
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?")
_ANNOTATION = re.compile(r"<<[^<>=]*=([^<>]*)>>")


def default_modes(env: str) -> list[str]:
    """Every mode SERL offers for the env's rows, judge modes excepted (they need an LLM judge
    server): the 18 step and anchor modes for ALFWorld (step and anchor alternating), the 2
    trajectory-row modes for math."""
    from serl.hindsight.modes import MODE_NAMES, MODE_SPECS, TRAJECTORY_ROW_MODES

    if env == "math":
        return list(TRAJECTORY_ROW_MODES)
    step = [m for m in MODE_NAMES if MODE_SPECS[m].granularity == "step"]
    anchor = [m for m in MODE_NAMES if MODE_SPECS[m].granularity == "anchor"]
    return [m for pair in zip(step, anchor) for m in pair]  # alternating: a stopped run has both


# ---------------------------------------------------------------------------------------------- config

def load_cfg(args) -> Any:
    from serl.configure import load_config

    run_dir = Path(args.workdir) / "trainer"
    return load_config(ENVS[args.env]["recipe"], [
        f"seed={args.seed}", "trainer.logger=[]", "trainer.progress=false", "trainer.run_name=credit",
        f"trainer.output_dir={run_dir}", "algorithm.serl.enable=true", "algorithm.serl.skip_zero_advantage_rows=true",
        f"algorithm.serl.sampling_mode={args.modes[0]}",
        *([f"env.max_steps={args.max_steps}"] if args.max_steps else []),
        *([f"env.data_dir={args.data_dir}"] if args.data_dir else []),
        *args.override])


def reference_results() -> dict[str, list[float]]:
    """GSM8K train problem uid -> the intermediate results of its reference solution (the ``c`` of
    each ``<<expr=c>>`` calculator annotation; Cobbe et al., arXiv 2110.14168)."""
    from serl.envs.math.data import load_problems

    return {p.uid: [v for a in _ANNOTATION.findall(p.solution or "") for v in _numbers(a)]
            for p in load_problems("gsm8k", "train")}


def pick_tasks(cfg, env: str, k: int, seed: int) -> list:
    """``k`` train tasks, round-robin over task types in a seeded order (math: problems whose
    reference has at most two ``<<…>>`` steps)."""
    from serl.train.env_pool import list_tasks

    tasks = list_tasks(cfg, ENVS[env]["split"])
    rng = random.Random(seed)
    if env == "math":
        results = reference_results()
        tasks = [t for t in tasks if 1 <= len(results.get(t.task_id, [])) <= 2]
    by_type: dict[str, list] = {}
    for t in tasks:
        by_type.setdefault(t.task_type, []).append(t)
    for v in by_type.values():
        rng.shuffle(v)
    out, types = [], sorted(by_type)
    while len(out) < k and any(by_type.values()):
        for ty in types:
            if by_type[ty] and len(out) < k:
                out.append(by_type[ty].pop())
    return out


# ---------------------------------------------------------------------------------------------- collect

def collect(args, tr) -> None:
    """Play ``args.n`` episodes of each task, ``args.chunk`` tasks at a time; one JSONL per chunk."""
    from serl.envs.pool import EnvPool
    from serl.train.collect import train_sampling
    from serl.train.env_pool import env_kwargs, rollout_loop
    from serl.trajectory import write_jsonl

    cfg = tr.cfg
    tasks = pick_tasks(cfg, args.env, args.tasks, args.seed)
    out = Path(args.workdir) / "rollouts"
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {**env_kwargs(cfg), **ENVS[args.env]["env_kwargs"]}
    for c in range(0, len(tasks), args.chunk):
        path = out / f"chunk_{c // args.chunk:03d}.jsonl"
        if path.exists() or _out_of_time(args):
            continue
        chunk = tasks[c:c + args.chunk]
        t0 = time.time()
        n_envs = len(chunk) * args.n
        workers = min(n_envs, cfg.env.num_workers or os.cpu_count() or 1)
        pool = EnvPool(cfg.env.name, num_envs=n_envs, num_workers=workers, env_kwargs=kwargs,
                       timeout=cfg.env.worker_timeout)
        try:
            resets = pool.reset([t for t in chunk for _ in range(args.n)])
            groups = rollout_loop(cfg, pool, tr.engine, tr.models.tokenizer).collect(
                chunk, args.n, train_sampling(cfg), reset_results=resets)
        finally:
            pool.close()
        trajs = [t for g in groups for t in g.trajectories]
        results = reference_results() if args.env == "math" else {}
        for t in trajs:  # the collector put the initial state's plan in t.extra["expert_plan0"]
            if args.env == "math":
                t.extra["reference_results"] = results.get(t.task.task_id, [])
        write_jsonl(path, trajs)
        steps = sum(len(t.steps) for t in trajs)
        print(f"collect: chunk {c // args.chunk}: {len(chunk)} tasks, {len(trajs)} episodes, {steps} steps, "
              f"{sum(t.won for t in trajs)} won, {time.time() - t0:.0f} s", flush=True)


def load_groups(workdir: Path) -> list:
    """The collected trajectories as groups (by ``uid``, in file order)."""
    from serl.trajectory import Group, read_jsonl

    groups: dict[str, Group] = {}
    for path in sorted((workdir / "rollouts").glob("chunk_*.jsonl")):
        for t in read_jsonl(path):
            groups.setdefault(t.uid, Group(uid=t.uid, task=t.task)).trajectories.append(t)
    return list(groups.values())


# ---------------------------------------------------------------------------------------------- score

def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of 1s in an action mask."""
    spans, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def units(step, lp) -> list[list[float]]:
    """Per run of action tokens of ``step``: its tokens' log-probs (from ``lp`` ``[resp_len]``, nats)."""
    return [[round(float(x), 5) for x in lp[s:e]] for s, e in _runs(step.action_mask)]


def score(args, tr, groups: list) -> None:
    """The student's and, per mode, the teacher's log-probs on the chosen rows' action tokens."""
    import torch

    from serl.hindsight.builder import SerlContextBuilder
    from serl.hindsight.modes import check_config
    from serl.train.batch import UpdateBatch
    from serl.train.rows import step_table
    from serl.utils import atomic_write_text

    cfg, out = tr.cfg, Path(args.workdir) / "scores"
    out.mkdir(parents=True, exist_ok=True)
    table = step_table(groups, 1, cfg)
    rows = [i for i, s in enumerate(table.rows) if any(s.action_mask)]
    chosen = sorted(random.Random(args.seed).sample(rows, min(args.score_rows, len(rows))))
    adv = torch.zeros(len(table))
    adv[chosen] = 1.0  # skip_zero_advantage_rows: the teacher scores exactly these rows
    keys = [(t.traj_uid, s.step_id) for _, t, s in _iter(groups)]
    student = out / "_student.json"
    if not student.exists():
        batch = UpdateBatch.from_steps([table.rows[i] for i in chosen], adv[chosen], table.row_mask[chosen])
        t0 = time.time()
        lps = tr.scorer.score(tr.serl.teacher.model, batch)
        atomic_write_text(student, json.dumps({
            "seconds": time.time() - t0, "machine": f"{_machine()}; teacher {tr.models.infer_dtype}",
            "rows": [{"key": keys[i], "units": units(table.rows[i], lp)} for i, lp in zip(chosen, lps)]}))
    for mode in args.modes:
        path = out / f"{mode}.json"
        if path.exists() or _out_of_time(args):
            continue
        cfg.algorithm.serl.sampling_mode = mode
        check_config(cfg.algorithm.serl)
        tr.serl.context_builder = SerlContextBuilder(cfg.algorithm.serl)
        batch = UpdateBatch.from_steps(table.rows, adv, table.row_mask)
        t0, metrics = time.time(), {}
        tr.serl.run(batch, groups, table, adv, 0, 1, metrics)
        recs = [{"key": keys[i], "units": units(table.rows[i], batch.teacher_log_probs[i])
                 if batch.teacher_log_probs[i] is not None else None} for i in chosen]
        atomic_write_text(path, json.dumps({"seconds": time.time() - t0, "rows": recs,
                                            "metrics": {k: v for k, v in metrics.items() if k.startswith("serl/")}}))
        print(f"score: {mode}: {sum(r['units'] is not None for r in recs)}/{len(recs)} rows with a context, "
              f"{time.time() - t0:.0f} s", flush=True)


def _iter(groups):
    from serl.trajectory import iter_steps

    return iter_steps(groups)


def _out_of_time(args) -> bool:
    return args.deadline is not None and time.time() > args.deadline


# ---------------------------------------------------------------------------------------------- labels

def alfworld_labels(traj) -> list[Optional[bool]]:
    """Per step: right / wrong / unknown by the planner (:func:`serl.rollout.dagger.step_labels`)."""
    from serl.rollout.dagger import step_labels

    return step_labels(traj)


def _numbers(text: str) -> list[float]:
    vals = []
    for m in _NUMBER.findall(text or ""):
        try:
            vals.append(float(m.replace(",", "")))
        except ValueError:
            pass
    return vals


def math_labels(traj, step, tokenizer) -> list[tuple[str, bool]]:
    """Per assistant turn of a math row: ``(kind, right)``; kind ``tool`` (its output holds an
    intermediate result of the reference) or ``answer`` (the episode's answer is right)."""
    targets = traj.extra.get("reference_results") or []
    spans = _runs(step.action_mask)
    out = []
    for k, (s, e) in enumerate(spans):
        text = tokenizer.decode(step.response_ids[s:e], skip_special_tokens=True)
        if "<tool_call>" in tokenizer.decode(step.response_ids[s:e]) or "code_interpreter" in text:
            end = spans[k + 1][0] if k + 1 < len(spans) else len(step.response_ids)
            tool_out = tokenizer.decode(step.response_ids[e:end], skip_special_tokens=True)  # the tool's reply
            hit = any(abs(v - t) <= 1e-6 * max(1.0, abs(t)) for v in _numbers(tool_out) for t in targets)
            out.append(("tool", hit))
        else:
            out.append(("answer", bool(step.won)))
    return out


# ---------------------------------------------------------------------------------------------- report

def write_labels(args, groups: list, tokenizer) -> None:
    """``labels.jsonl``: per episode its task, outcome and each step's (ALFWorld) or assistant
    turn's (math) oracle label; small, so it travels back from a GPU lease without the rollouts."""
    lines = []
    for g in groups:
        for t in g.trajectories:
            if args.env == "alfworld":
                plans = [t.extra.get("expert_plan0")] + [s.info.get("expert_plan") for s in t.steps]
                units_ = [{"step_id": s.step_id, "unit": 0, "kind": "step", "label": lab, "action": s.action,
                           "admissible": s.action in s.admissible_actions,
                           "plan_length": None if plans[i] is None else len(plans[i])}
                          for i, (s, lab) in enumerate(zip(t.steps, alfworld_labels(t)))]
            else:
                units_ = [{"step_id": s.step_id, "unit": k, "kind": kind, "label": lab}
                          for s in t.steps for k, (kind, lab) in enumerate(math_labels(t, s, tokenizer))]
            lines.append(json.dumps({"traj_uid": t.traj_uid, "uid": t.uid, "task_id": t.task.task_id,
                                     "task_type": t.task.task_type, "won": t.won, "units": units_}))
    Path(args.workdir, "labels.jsonl").write_text("\n".join(lines) + "\n")


def unit_table(workdir: Path) -> tuple[dict[tuple, dict], dict[str, Any]]:
    """(traj_uid, step_id, unit) -> {"label", "kind", "won", "traj", "recurs"} of every labelled
    unit (ALFWorld: a step, all its action tokens; math: an assistant turn), and the data's counts.
    ``recurs`` (ALFWorld): the step's action is sent again later in the episode (a loop's mark)."""
    out, eps = {}, [json.loads(line) for line in open(workdir / "labels.jsonl") if line.strip()]
    for e in eps:
        actions = [u.get("action") for u in e["units"]]
        for i, u in enumerate(e["units"]):
            if u["label"] is not None:
                out[(e["traj_uid"], u["step_id"], u["unit"])] = {
                    "label": u["label"], "kind": u["kind"], "won": e["won"], "traj": e["traj_uid"],
                    "recurs": actions[i] is not None and actions[i] in actions[i + 1:]}
    counts = {"episodes": len(eps), "won": sum(e["won"] for e in eps), "tasks": len({e["uid"] for e in eps}),
              "steps": sum(len({u["step_id"] for u in e["units"]}) for e in eps)}
    return out, counts


def _unit_scores(args, rec: dict) -> dict[tuple, tuple[float, list[float]]]:
    """(traj_uid, step_id, unit) -> (mean, per-token values) from a scores file's row records."""
    out = {}
    for r in rec["rows"]:
        if r["units"] is None:
            continue
        runs = r["units"] if args.env == "math" else [[x for run in r["units"] for x in run]]
        for k, vals in enumerate(runs):
            if vals:
                out[(r["key"][0], r["key"][1], k)] = vals
    return out


def _auc_cell(items: list[tuple[float, bool, str]], seed: int) -> dict[str, Any]:
    by_traj: dict[str, list] = {}
    for it in items:
        by_traj.setdefault(it[2], []).append(it)

    def stat(xs):
        return auc([x[0] for x in xs], [x[1] for x in xs])

    lo, hi = cluster_bootstrap(stat, list(by_traj.values()), seed=seed)
    return {"auc": stat(items), "lo": lo, "hi": hi, "n": len(items), "positive": sum(x[1] for x in items)}


def report(args, weight_clip: float) -> dict[str, Any]:
    """The per-mode table (module docstring, phase 3) from ``labels.jsonl`` and ``scores/``:
    ``results.json`` and ``results.md``."""
    import math

    wd = Path(args.workdir)
    labels, counts = unit_table(wd)
    student_rec = json.loads((wd / "scores" / "_student.json").read_text())
    student = _unit_scores(args, student_rec)
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []

    def cells(score_of: dict[tuple, float]) -> dict[str, Any]:
        items: dict[str, list] = {"won": [], "lost": [], "all": [], "recurs": []}
        for key, lab in labels.items():
            if key in score_of:
                it = (score_of[key], lab["label"], lab["traj"])
                items["all"].append(it)
                items["won" if lab["won"] else "lost"].append(it)
                items["recurs"].append((score_of[key], lab["recurs"], lab["traj"]))  # against a loop, not the plan
                items.setdefault(f"kind:{lab['kind']}", []).append(it)
        return {k: _auc_cell(v, args.seed) for k, v in items.items()}

    rows.append({"mode": "student log-prob (baseline)", **cells({k: sum(v) / len(v) for k, v in student.items()}),
                 "sum": cells({k: sum(v) for k, v in student.items()})["all"]})
    rows.append({"mode": "random (baseline)", **cells({k: rng.random() for k in student})})
    for mode in args.modes:
        path = wd / "scores" / f"{mode}.json"
        if not path.exists():
            continue
        rec = json.loads(path.read_text())
        teacher = _unit_scores(args, rec)
        deltas, sums, decisive, at_clip, n_tok = {}, {}, {}, 0, 0
        abs_sum = 0.0
        for key, tv in teacher.items():
            sv = student.get(key)
            if sv is None or len(sv) != len(tv):
                continue
            d = [a - b for a, b in zip(tv, sv)]
            deltas[key], sums[key] = sum(d) / len(d), sum(d)
            decisive[key] = d[min(range(len(sv)), key=sv.__getitem__)]  # at the student's least sure token
            sign = 1.0 if labels.get(key, {}).get("won", False) else -1.0
            for x in d:
                w = math.exp(max(-20.0, min(20.0, sign * x)))
                at_clip += w <= 1 - weight_clip + 1e-6 or w >= 1 + weight_clip - 1e-6
            n_tok += len(d)
            abs_sum += sum(abs(x) for x in d)
        rows.append({"mode": mode, "rows_with_context": sum(r["units"] is not None for r in rec["rows"]),
                     "rows": len(rec["rows"]), "seconds": rec["seconds"],
                     "mean_abs_delta": abs_sum / max(1, n_tok), "clip_fraction": at_clip / max(1, n_tok),
                     **cells(deltas), "sum": cells(sums)["all"], "decisive": cells(decisive)["all"]})
    tokens = [x for v in student.values() for x in v]
    res = {"env": args.env, **counts, "labelled_units": len(labels),
           # Δ <= -log p_student: where the student is sure of a token the teacher cannot raise it
           "student_tokens": len(tokens), "student_saturated_fraction": sum(x > math.log(0.99) for x in tokens) / max(1, len(tokens)),
           "right_units": sum(v["label"] for v in labels.values()), "weight_clip": weight_clip, "rows": rows,
           "machine": student_rec.get("machine", "?")}  # where the scores were computed
    (wd / "results.json").write_text(json.dumps(res, indent=1))
    (wd / "results.md").write_text(render(res))
    return res


def _fmt(c: dict[str, Any], positive: str = "right") -> str:
    if c["n"] == 0 or c["auc"] != c["auc"]:
        return f"— (n={c['n']})"
    return f"{c['auc']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}] (n={c['n']}, {c['positive']} {positive})"


def render(res: dict[str, Any]) -> str:
    """The results as a Markdown table, the machine and the data beside it. The per-kind columns
    (math: tool calls, answers) appear when the units are of several kinds; the *recurs* column
    when some action recurs (ALFWorld)."""
    unit = "step" if res["env"] == "alfworld" else "assistant turn"
    kinds = sorted({k[5:] for r in res["rows"] for k in r if k.startswith("kind:")})
    extra = [(f"kind:{k}", f"AUC, {k} turns only", "right") for k in kinds] if len(kinds) > 1 else []
    if any(r["recurs"]["positive"] for r in res["rows"]):
        extra.append(("recurs", "AUC for *the action recurs later*", "recur"))
    lines = [f"{res['env']}: {res['tasks']} train tasks, {res['episodes']} episodes ({res['won']} won), "
             f"{res['steps']} steps; {res['labelled_units']} labelled {unit}s, {res['right_units']} right. "
             f"{res['student_saturated_fraction']:.1%} of the student's {res['student_tokens']} action tokens have "
             "p > 0.99 (there Δ ≤ 0.01). "
             f"Machine: {res['machine']}.", "",
             f"| mode | rows with context | mean \\|Δ\\| (nats/token) | at clip (c={res['weight_clip']}) | "
             "AUC won episodes | AUC lost episodes | AUC all | AUC all, Δ summed | AUC all, Δ at the least sure token | "
             + "".join(f"{title} | " for _, title, _ in extra) + "s |",
             "|---" * (9 + len(extra)) + "|"]
    for r in res["rows"]:
        ctx = f"{r['rows_with_context']}/{r['rows']}" if "rows" in r else "—"
        abs_d = f"{r['mean_abs_delta']:.4f}" if "mean_abs_delta" in r else "—"
        clip = f"{r['clip_fraction']:.1%}" if "clip_fraction" in r else "—"
        secs = f"{r['seconds']:.0f}" if "seconds" in r else "—"
        lines.append(f"| {r['mode']} | {ctx} | {abs_d} | {clip} | {_fmt(r['won'])} | {_fmt(r['lost'])} | "
                     f"{_fmt(r['all'])} | {_fmt(r['sum']) if 'sum' in r else '—'} | "
                     f"{_fmt(r['decisive']) if 'decisive' in r else '—'} | "
                     + "".join(f"{_fmt(r[key], word)} | " for key, _, word in extra) + f"{secs} |")
    return "\n".join(lines) + "\n"


def _machine() -> str:
    import platform

    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu} ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads, "
            f"torch {torch.__version__}")


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    # legs: experiments/legs/credit_*.args, options as on a command line, # comments (as learning.py's)
    ap.convert_arg_line_to_args = lambda line: [] if line.lstrip().startswith("#") else shlex.split(line)
    ap.add_argument("--env", choices=sorted(ENVS), default="alfworld")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data-dir", default=None, help="ALFWorld data (json_2.1.1/train); math reads serl's GSM8K")
    phases = ["collect", "score", "report"]
    ap.add_argument("--phases", nargs="+", default=phases, choices=phases)
    ap.add_argument("--tasks", type=int, default=120, help="train tasks (ALFWorld: round-robin over the six types)")
    ap.add_argument("--n", type=int, default=4, help="episodes per task (a GRPO group)")
    ap.add_argument("--chunk", type=int, default=40, help="tasks per collect chunk (one file each)")
    ap.add_argument("--max-steps", type=int, default=0, help="env.max_steps (0: the recipe's)")
    ap.add_argument("--score-rows", type=int, default=1500, help="rows the teacher scores (a seeded sample)")
    ap.add_argument("--modes", nargs="+", default=None, help="sampling modes (default: every non-judge mode)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=0, help="start no new chunk or mode after this many s")
    ap.add_argument("--override", nargs="*", default=[], help="config overrides key=value")
    args = ap.parse_args(argv)
    args.modes = args.modes or default_modes(args.env)
    args.deadline = time.time() + args.budget_s if args.budget_s else None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from serl.train.trainer import Trainer

    wd = Path(args.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    if {"collect", "score"} & set(args.phases):  # the options that made the data (a report keeps them)
        (wd / "args.json").write_text(json.dumps({k: v for k, v in vars(args).items() if k != "deadline"}, indent=1))
    cfg = load_cfg(args)
    if {"collect", "score"} & set(args.phases) or not (wd / "labels.jsonl").exists():
        with tempfile.TemporaryDirectory(prefix="serl-credit-") as tmp:
            tr = Trainer(cfg, run_dir=Path(tmp) / "run")
            try:
                if "collect" in args.phases:
                    collect(args, tr)
                groups = load_groups(wd)
                write_labels(args, groups, tr.models.tokenizer)
                if "score" in args.phases:
                    score(args, tr, groups)
            finally:
                tr.close()
    if "report" in args.phases:
        print(render(report(args, cfg.algorithm.serl.weight_clip)))


if __name__ == "__main__":
    main(sys.argv[1:])
