"""Does ALFWorld's state expert win from states the policy reached, and what does it cost?

Each game is played from a **perturbed state**: ``k`` seeded random admissible actions first
(``k = 0 .. --max-perturb``, cycled over each task type's games so every type sees every ``k``),
then the expert's action at every state until the game is won or the 50-step limit
(perturbation steps included) ends it. Games are drawn stratified by task type
(``--per-type`` per type, seeded). Experts (``--expert``):

* ``planner``: :meth:`serl.envs.alfworld.AlfWorldEnv.expert_action` (fast-downward on the current
  state's relevant sub-problem, answered from the previous plan while the game follows it;
  :mod:`serl.envs.alfworld_expert`). Recorded per game: the seconds of each search and whether it
  fell back to the full problem.
* ``planner-every-state``: the same, with the plan cache emptied before every call, so every
  state of the episode is searched (what labelling a policy's states costs when the policy never
  follows the plan).
* ``full``: as ``planner``, but every search on the full problem: fast-downward's ``replan()``, what
  TextWorld's ``policy_commands`` computes (textworld 1.7.0); slow (seconds to minutes per search).
* ``handcoded``: ALFWorld's handcoded expert (``alfworld/alfworld`` 0.4.2,
  ``AlfredExpert(expert_type="handcoded")``, which observes every step, the random ones included,
  and gives ``look`` when its action is not admissible); it reads the trial's
  ``traj_data.json``, so only ``valid_seen`` / ``valid_unseen`` / ``valid_train`` work.

One JSON line per game is appended to ``--out`` (resumable: games already there for the same
expert and ``k`` are skipped): game, task type, ``k``, won, steps, reset seconds, expert seconds
(per search for the planners, per expert step for ``handcoded``), searches, fallbacks, the error
if the expert raised, and the 1-minute load average. ``--summary`` prints the table from the file
(wins per type, searches per game, reset and search seconds: median / p90 / max). ::

    nice -n 5 python benchmarks/alfworld_expert.py --expert planner --split train --per-type 34 \\
        --data-dir ../shared/data/alfworld --out alfworld_expert.jsonl
    python benchmarks/alfworld_expert.py --summary --out alfworld_expert.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from serl.envs.alfworld import TASK_TYPES, AlfWorldEnv
from serl.envs.alfworld_expert import PlannerError, solve_full
from serl.envs.base import Task

EXPERTS = ("planner", "planner-every-state", "full", "handcoded")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``) and whether it has AMX, or ``"unknown"``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "unknown")
    return name + (" (AMX)" if " amx_tile" in text else "")


def pick_games(tasks: list[Task], per_type: int, seed: int, max_perturb: int) -> list[tuple[Task, int]]:
    """``per_type`` games of each task type (seeded shuffle), each with its ``k``: the i-th game
    of a type gets ``k = i % (max_perturb + 1)``. Interleaved over types, so a partial run is
    stratified too."""
    by_type: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by_type[t.task_type].append(t)
    picked: dict[str, list[tuple[Task, int]]] = {}
    for tt in sorted(by_type):
        games = list(by_type[tt])
        random.Random(f"{seed}/{tt}").shuffle(games)
        picked[tt] = [(g, i % (max_perturb + 1)) for i, g in enumerate(games[:per_type])]
    out = []
    for i in range(max(map(len, picked.values()), default=0)):
        out.extend(p[i] for p in picked.values() if i < len(p))
    return out


def play_planner(env: AlfWorldEnv, task: Task, k: int, seed: int, every_state: bool = False) -> dict:
    """One game with :class:`AlfWorldEnv`'s planner expert from a ``k``-action perturbed state;
    ``every_state``: empty the plan cache before each call (every state is searched)."""
    t0 = time.perf_counter()
    r = env.reset(task)
    reset_s = time.perf_counter() - t0
    rng = random.Random(f"{seed}/{task.task_id}")
    for _ in range(k):
        r = env.step(rng.choice(r.admissible_actions))
        if r.done:
            break
    searches, fallbacks, error = [], 0, None
    calls = 0
    try:
        while not r.done:
            if every_state:
                env._planner.reset()  # forget the plan (and the history the error messages quote)
            action = env.expert_action()
            calls += 1
            call = env.expert_last_call
            if not call.cached:
                searches.append(call.seconds)
                fallbacks += call.fallback
            r = env.step(action)
    except PlannerError as e:
        error = f"{type(e).__name__}: {e}"[:500]
    return {"won": r.won, "steps": env._steps, "reset_s": reset_s, "expert_calls": calls,
            "searches": len(searches), "search_s": searches, "fallbacks": fallbacks, "error": error}


def play_handcoded(state: dict, task: Task, k: int, seed: int, max_steps: int) -> dict:
    """One game with ALFWorld's handcoded expert (``AlfredExpert(expert_type="handcoded")``)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

    t0 = time.perf_counter()
    if state.get("env") is None:
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        state["env"] = textworld.start(task.task_id, request_infos=infos, wrappers=[
            AlfredDemangler(shuffle=False), AlfredInfos, AlfredExpert(expert_type="handcoded")])
    else:
        state["env"].load(task.task_id)
    env = state["env"]
    s = env.reset()
    reset_s = time.perf_counter() - t0
    rng = random.Random(f"{seed}/{task.task_id}")
    steps, won = 0, False
    for _ in range(k):
        s, _score, done = env.step(rng.choice(s["admissible_commands"]))
        steps += 1
        won = bool(s["won"])
        if won:
            break
    step_s, looks, error = [], 0, None
    try:
        while not won and steps < max_steps:
            action = s["extra.expert_plan"][0]
            looks += action == "look"  # the wrapper's answer at the reset, and whenever the action is inadmissible
            t = time.perf_counter()
            s, _score, done = env.step(action)
            step_s.append(time.perf_counter() - t)
            steps += 1
            won = bool(s["won"])
    except Exception as e:  # AlfredExpert raises a bare Exception("Timeout") when the handcoded agent gives up
        error = f"{type(e).__name__}: {e}"[:500]
    return {"won": won, "steps": steps, "reset_s": reset_s, "expert_calls": len(step_s), "searches": 0,
            "search_s": [], "step_s": step_s, "looks": looks, "fallbacks": 0, "error": error}


def run(args: argparse.Namespace) -> None:
    from tqdm.auto import tqdm

    tasks = AlfWorldEnv.list_tasks(args.split, args.data_dir)
    games = pick_games(tasks, args.per_type, args.seed, args.max_perturb)
    out = Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done.add((row["expert"], row["task_id"], row["k"]))
    todo = [(t, k) for t, k in games if (args.expert, t.task_id, k) not in done]
    print(f"alfworld_expert: {args.expert} on {args.split}, {len(games)} games ({len(games) - len(todo)} already "
          f"in {out}); CPU {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
          file=sys.stderr)
    env = AlfWorldEnv(max_steps=args.max_steps, data_dir=args.data_dir)
    if args.expert == "full":  # every search on the full problem (what policy_commands computes)
        import serl.envs.alfworld_expert as ae

        ae.solve_relevant = lambda pddl_env: (solve_full(pddl_env), 0)
    hc_state: dict = {}
    wins = 0
    with tqdm(total=len(todo), desc=f"alfworld_expert {args.expert}", unit="game", dynamic_ncols=True) as bar:
        for n, (task, k) in enumerate(todo, 1):
            if args.expert == "handcoded":
                rec = play_handcoded(hc_state, task, k, args.seed, args.max_steps)
            else:
                rec = play_planner(env, task, k, args.seed, every_state=args.expert == "planner-every-state")
            row = {"expert": args.expert, "task_id": task.task_id, "task_type": task.task_type, "k": k,
                   "split": args.split, "seed": args.seed, **rec, "loadavg": os.getloadavg()[0],
                   "cpu": cpu_model(), "date": time.strftime("%Y-%m-%d")}
            with open(out, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            wins += rec["won"]
            bar.update(1)
            bar.set_postfix_str(f"won {wins}/{n}")
    env.close()


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(path: str) -> None:
    """Print the Markdown summary of a results file, one block per expert."""
    rows = [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
    for expert in EXPERTS:
        rs = [r for r in rows if r["expert"] == expert]
        if not rs:
            continue
        print(f"\n### {expert}: {len(rs)} games ({', '.join(sorted({r['split'] for r in rs}))}), "
              f"CPU {rs[0]['cpu']}, load average {min(r['loadavg'] for r in rs):.1f}-{max(r['loadavg'] for r in rs):.1f}\n")
        print("| task type | games | won | mean searches / game | mean steps |")
        print("|---|---|---|---|---|")
        for tt in TASK_TYPES + ("all",):
            g = [r for r in rs if tt in ("all", r["task_type"])]
            if g:
                print(f"| {tt} | {len(g)} | {sum(r['won'] for r in g)} | "
                      f"{statistics.mean(r['searches'] for r in g):.2f} | {statistics.mean(r['steps'] for r in g):.1f} |")
        print("\n| k (random actions first) | games | won |")
        print("|---|---|---|")
        for k in sorted({r["k"] for r in rs}):
            g = [r for r in rs if r["k"] == k]
            print(f"| {k} | {len(g)} | {sum(r['won'] for r in g)} |")
        resets = [r["reset_s"] for r in rs]
        searches = [s for r in rs for s in r["search_s"]]
        steps = [s for r in rs for s in r.get("step_s", [])]
        print("\n| seconds | n | median | p90 | max |")
        print("|---|---|---|---|---|")
        print(f"| reset | {len(resets)} | {_q(resets, .5):.2f} | {_q(resets, .9):.2f} | {max(resets):.2f} |")
        if searches:
            print(f"| search (plan from a state) | {len(searches)} | {_q(searches, .5):.3f} | {_q(searches, .9):.3f} "
                  f"| {max(searches):.3f} |")
        if steps:
            print(f"| step with the expert wrapper | {len(steps)} | {_q(steps, .5):.3f} | {_q(steps, .9):.3f} "
                  f"| {max(steps):.3f} |")
        fb = sum(r["fallbacks"] for r in rs)
        errs = [r for r in rs if r["error"]]
        print(f"\nfallbacks to the full problem: {fb}; games whose expert raised: {len(errs)}")
        for r in errs[:5]:
            print(f"  {r['task_id']} k={r['k']}: {r['error'][:200]}")
        if expert == "handcoded":
            print(f"handcoded actions that were `look`: {sum(r['looks'] for r in rs)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--expert", choices=EXPERTS, default="planner")
    p.add_argument("--split", default="train")
    p.add_argument("--per-type", type=int, default=34, help="games per task type (default 34: 204 games)")
    p.add_argument("--max-perturb", type=int, default=5, help="k = 0 .. this many random actions first")
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="ALFWorld data folder (default $SERL_DATA or the fixture)")
    p.add_argument("--out", default="alfworld_expert.jsonl", help="results, one JSON line per game (appended)")
    p.add_argument("--summary", action="store_true", help="print the summary of --out and exit")
    args = p.parse_args(argv)
    if args.summary:
        summary(args.out)
    else:
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
