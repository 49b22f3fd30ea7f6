"""ALFWorld env throughput: EnvPool (worker processes) vs one env stepped serially, in one run.

Both sides play the same episodes: env ``i`` plays game ``i`` with random admissible actions
from ``random.Random(i)``, for at most ``--rounds`` steps. The pool steps all live envs each
round; the serial side plays the episodes one after another on one env. Steps per second of
wall time are compared; resets are timed separately (a reset costs ~0.85 s: TextWorld
re-translates the PDDL).
The run checks that both sides end in the same observations.

    python benchmarks/bench_env.py                      # fixture games, 8 envs on 2 workers
    python benchmarks/bench_env.py --data-dir ../shared/data/alfworld --split valid_seen

Prints a side-by-side table, the pool/serial ratio, and one JSON line (prefixed ``JSON``).
Takes about 1 minute on a 2-core machine. "CPU ms/step" sums the CPU time of every process
involved (parent + workers, from /proc), so it shows the pool's overhead even when other jobs
share the cores and make the wall-clock ratio noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serl.envs.alfworld import AlfWorldEnv  # noqa: E402
from serl.envs.pool import EnvPool  # noqa: E402


def _proc_cpu_s(pids: list[int]) -> float | None:
    """User + system CPU seconds of ``pids`` from /proc (Linux); None where unavailable."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
    return total


def _pick(rng: random.Random, admissible: list[str]) -> str:
    choices = [a for a in admissible if a != "help"] or ["look"]
    return rng.choice(choices)


def bench_serial(game_tasks, rounds: int, data_dir) -> dict:
    """One env plays, one after another, exactly the episodes the pool plays in parallel
    (same games, same seeded action choices), so both sides do identical engine work."""
    env = AlfWorldEnv(data_dir=data_dir)
    reset_s, step_s, step_cpu, n, finals = 0.0, 0.0, 0.0, 0, []
    try:
        for i, task in enumerate(game_tasks):
            rng = random.Random(i)
            t0 = time.perf_counter()
            r = env.reset(task)
            reset_s += time.perf_counter() - t0
            for _ in range(rounds):
                if r.done:
                    break
                a = _pick(rng, r.admissible_actions)
                t0, c0 = time.perf_counter(), time.process_time()
                r = env.step(a)
                step_s += time.perf_counter() - t0
                step_cpu += time.process_time() - c0
                n += 1
            finals.append(r.observation)
    finally:
        env.close()
    return {
        "steps": n,
        "step_s": step_s,
        "steps_per_s": n / step_s,
        "cpu_ms_per_step": 1000 * step_cpu / n,
        "reset_s_total": reset_s,
        "finals": finals,
    }


def bench_pool(game_tasks, num_workers: int, rounds: int, data_dir) -> dict:
    """``len(game_tasks)`` envs on ``num_workers`` workers, up to ``rounds`` batched steps."""
    num_envs = len(game_tasks)
    rngs = [random.Random(i) for i in range(num_envs)]
    t0 = time.perf_counter()
    with EnvPool("alfworld", num_envs, num_workers, {"data_dir": str(data_dir)}) as pool:
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = pool.reset(game_tasks)
        reset_s = time.perf_counter() - t0
        n = 0
        w0, c0 = _proc_cpu_s(pool.worker_pids), time.process_time()
        t0 = time.perf_counter()
        for _ in range(rounds):
            actions = [None if r is None or r.done else _pick(g, r.admissible_actions) for r, g in zip(results, rngs)]
            if all(a is None for a in actions):
                break
            stepped = pool.step(actions)
            results = [s if s is not None else r for s, r in zip(stepped, results)]
            n += sum(a is not None for a in actions)
        step_s = time.perf_counter() - t0
        w1, c1 = _proc_cpu_s(pool.worker_pids), time.process_time()
    cpu = None if w0 is None or w1 is None else (w1 - w0) + (c1 - c0)
    return {
        "steps": n,
        "step_s": step_s,
        "steps_per_s": n / step_s,
        "reset_s_total": reset_s,
        "start_s": start_s,
        "cpu_ms_per_step": None if cpu is None else 1000 * cpu / n,
        "finals": [r.observation for r in results],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=None, help="ALFWorld data folder (default: $SERL_DATA, else the bundled fixture)")
    ap.add_argument("--split", default="valid_unseen")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15, help="steps per episode at most (the pool steps every live env each round)")
    args = ap.parse_args(argv)

    from serl.envs.alfworld import resolve_data_dir

    data_dir = resolve_data_dir(args.data_dir)
    tasks = AlfWorldEnv.list_tasks(args.split, data_dir=data_dir)
    print(f"data: {data_dir} split={args.split} ({len(tasks)} games); cpus={os.cpu_count()} loadavg={os.getloadavg()[0]:.2f}")

    game_tasks = [tasks[i % len(tasks)] for i in range(args.num_envs)]
    serial = bench_serial(game_tasks, args.rounds, data_dir)
    pool = bench_pool(game_tasks, args.num_workers, args.rounds, data_dir)
    if serial["finals"] != pool["finals"] or serial["steps"] != pool["steps"]:
        print("ERROR: the pool's episodes differ from the serial ones", file=sys.stderr)
        return 1
    ratio = pool["steps_per_s"] / serial["steps_per_s"]

    print(f"{'':24s}{'serial (1 env)':>18s}{f'pool ({args.num_envs} envs/{args.num_workers} workers)':>30s}")
    print(f"{'env steps':24s}{serial['steps']:>18d}{pool['steps']:>30d}")
    print(f"{'steps/s':24s}{serial['steps_per_s']:>18.1f}{pool['steps_per_s']:>30.1f}")
    print(f"{'ms/step (wall)':24s}{1000 / serial['steps_per_s']:>18.1f}{1000 / pool['steps_per_s']:>30.1f}")
    pool_cpu = "n/a" if pool["cpu_ms_per_step"] is None else f"{pool['cpu_ms_per_step']:.1f}"
    print(f"{'CPU ms/step (all procs)':24s}{serial['cpu_ms_per_step']:>18.1f}{pool_cpu:>30s}")
    print(f"{'reset s/game (wall)':24s}{serial['reset_s_total'] / args.num_envs:>18.2f}{pool['reset_s_total'] / args.num_envs:>30.2f}")
    print(f"pool/serial step throughput ratio: {ratio:.2f}x  (pool start-up {pool['start_s']:.2f} s)")
    record = {
        "bench": "env_pool_alfworld",
        "split": args.split,
        "num_envs": args.num_envs,
        "num_workers": args.num_workers,
        "serial_steps_per_s": round(serial["steps_per_s"], 2),
        "pool_steps_per_s": round(pool["steps_per_s"], 2),
        "ratio": round(ratio, 3),
        "steps": pool["steps"],
        "serial_cpu_ms_per_step": round(serial["cpu_ms_per_step"], 2),
        "pool_cpu_ms_per_step": None if pool["cpu_ms_per_step"] is None else round(pool["cpu_ms_per_step"], 2),
        "serial_reset_s_per_game": round(serial["reset_s_total"] / args.num_envs, 3),
        "pool_reset_s_per_game": round(pool["reset_s_total"] / args.num_envs, 3),
        "pool_start_s": round(pool["start_s"], 3),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    print("JSON " + json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
