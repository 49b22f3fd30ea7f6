"""SERL's teacher pass of one real iteration, two settings side by side in one process on the same
rows: ``--compare skip_zero_advantage`` (``algorithm.serl.skip_zero_advantage_rows`` off and on) or
``--compare prefix_reuse`` (``algorithm.serl.teacher_prefix_reuse`` off and on, for a
conversation-layout run's rows).

The rows are the last iteration of a real ``serl train`` run (its ``last_rollout.jsonl``, grouped
by ``uid`` into GRPO groups), put through the trainer's own row filters and advantage estimator,
then through SERL's teacher pass :meth:`serl.train.serl_pass.SerlTeacherPass.run` (contexts,
teacher prompts, teacher scoring) under each setting, alternating, ``--repeats`` times each.
skip_zero_advantage: off is the original (every row with a context is scored), on does not score
rows whose advantage is exactly 0; both give the same update (tests/test_train_e2e.py).
prefix_reuse: off runs every teacher prompt whole, on reuses each row's common prefix with the row
before; the largest difference of their teacher log-probs is reported (float rounding).

Reported: the CPU model, torch's CPU capability, threads, the teacher's dtype, rows scored,
wall and process-CPU seconds of each pass, and the ratio of the medians.

    PYTHONPATH=$PWD python benchmarks/teacher_pass.py --rollout RUN/last_rollout.jsonl
    PYTHONPATH=$PWD python benchmarks/teacher_pass.py --rollout RUN/last_rollout.jsonl --emulate-avx2
    PYTHONPATH=$PWD python benchmarks/teacher_pass.py --rollout RUN/last_rollout.jsonl --compare prefix_reuse \
        --recipe cpu_conversation env.max_steps=15

``--emulate-avx2`` caps torch, oneDNN and MKL at AVX2 (``benchmarks/cpu_kind.py``): float32,
as on an AVX2-only CPU; a proxy, labelled as such. Extra ``key=value`` arguments are config
overrides of ``--recipe`` (default ``cpu``; use the run's own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_kind import emulate_avx2  # noqa: E402

EMULATED = emulate_avx2(sys.argv)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from serl.configure import load_config  # noqa: E402
from serl.train.batch import UpdateBatch  # noqa: E402
from serl.train.rows import compute_advantages, filter_rows, step_table  # noqa: E402
from serl.train.trainer import Trainer  # noqa: E402
from serl.trajectory import Group, read_jsonl  # noqa: E402
from throughput import Clock, cpu_model  # noqa: E402


#: --compare: the two settings' labels (off, on) and the algorithm.serl key they set
SWITCHES = {"skip_zero_advantage": ("all_rows", "skip_zero_advantage"), "prefix_reuse": ("whole_prompts", "prefix_reuse")}
SWITCH_KEYS = {"skip_zero_advantage": "skip_zero_advantage_rows", "prefix_reuse": "teacher_prefix_reuse"}


def load_groups(path: str) -> list[Group]:
    """The trajectories of a ``last_rollout.jsonl`` as GRPO groups (by ``uid``, in file order)."""
    groups: dict[str, Group] = {}
    for t in read_jsonl(path):
        groups.setdefault(t.uid, Group(uid=t.uid, task=t.task)).trajectories.append(t)
    return list(groups.values())


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollout", required=True, help="last_rollout.jsonl of a serl train run")
    ap.add_argument("--repeats", type=int, default=2, help="passes per setting (alternating)")
    ap.add_argument("--emulate-avx2", action="store_true", help="cap the CPU at AVX2 (see benchmarks/cpu_kind.py)")
    ap.add_argument("--compare", choices=sorted(SWITCHES), default="skip_zero_advantage")
    ap.add_argument("--recipe", default="cpu", help="the run's recipe")
    ap.add_argument("overrides", nargs="*", help="config overrides (key=value) of the cpu recipe")
    args = ap.parse_args(argv)
    cfg = load_config(args.recipe, args.overrides + [
        "trainer.logger=[]", "trainer.progress=false", "trainer.run_name=bench",
        f"trainer.output_dir={tempfile.mkdtemp(prefix='serl-teacher-pass-')}", "algorithm.serl.enable=true"])
    tr = Trainer(cfg)
    try:
        groups = load_groups(args.rollout)
        metrics: dict[str, float] = {}
        table = filter_rows(step_table(groups, 1, cfg), cfg, tr.state.generator, metrics)
        adv = compute_advantages(table, cfg, tr.adv_fn, metrics)

        def teacher_pass(m: dict[str, float]) -> list:
            batch = UpdateBatch.from_steps(table.rows, adv, table.row_mask)
            tr.serl.run(batch, groups, table, adv, 0, 1, m)
            return batch.teacher_log_probs

        res = {"cpu": cpu_model(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "emulated_avx2": EMULATED, "threads": torch.get_num_threads(), "teacher_dtype": str(tr.models.infer_dtype),
               "rows": len(table), "nonzero_advantage_rows": int((adv != 0).sum()), "rollout": args.rollout}
        print(f"CPU {res['cpu']} ({res['torch_cpu_capability']}{', AVX2 emulated' if EMULATED else ''}), "
              f"{res['threads']} threads, teacher {tr.models.infer_dtype}; {res['rows']} rows, "
              f"{res['nonzero_advantage_rows']} with advantage != 0", file=sys.stderr)
        key, (off, on) = args.compare, SWITCHES[args.compare]
        teacher_pass({})  # warm-up (oneDNN kernels, allocator)
        times: dict[str, list[Clock]] = {off: [], on: []}
        scores: dict[str, list] = {}
        for _ in range(args.repeats):
            for label, value in ((off, False), (on, True)):
                setattr(tr.cfg.algorithm.serl, SWITCH_KEYS[key], value)
                m: dict[str, float] = {}
                with Clock() as c:
                    scores[label] = teacher_pass(m)
                times[label].append(c)
                res[f"{label}_scored_rows"] = round(m["serl/teacher_scored_fraction"] * len(table))
                res[f"{label}_prefix_reused_fraction"] = m.get("serl/teacher_prefix_reused_fraction", 0.0)
                print(f"{label}: {res[f'{label}_scored_rows']} rows scored, {c.wall:.1f} s wall, "
                      f"{c.cpu:.1f} CPU-s", file=sys.stderr)
        for label, cs in times.items():
            res[f"{label}_wall_s"] = statistics.median(c.wall for c in cs)
            res[f"{label}_cpu_s"] = statistics.median(c.cpu for c in cs)
            res[f"{label}_rows_per_s"] = len(table) / res[f"{label}_wall_s"]
        res["speedup_wall"] = res[f"{off}_wall_s"] / res[f"{on}_wall_s"]
        pairs = [(a, b) for a, b in zip(scores[off], scores[on]) if a is not None and b is not None]
        res["max_abs_logprob_diff"] = max((float((a - b).abs().max()) for a, b in pairs), default=0.0)
        print(f"teacher pass of the iteration's {len(table)} rows: {res[f'{off}_wall_s']:.1f} s -> "
              f"{res[f'{on}_wall_s']:.1f} s wall (median), {res['speedup_wall']:.2f}x; teacher log-probs "
              f"differ by at most {res['max_abs_logprob_diff']:.2g} nats", file=sys.stderr)
    finally:
        tr.close()
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
