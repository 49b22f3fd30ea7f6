"""Wall time of one policy update with and without ``actor.skip_zero_advantage_rows``, side by
side in one run, on the same rows from the same weights (the real SmolLM2-135M of the recipe).

Rows: from a ``last_rollout.jsonl`` of a real ``serl train`` run (``--rollout``) or synthetic
with ALFWorld-like lengths (``benchmarks/throughput.py``'s ``load_rows``). A seeded share
``--zero-fraction`` of them gets advantage 0 (a group whose rewards all agree), the others ±1.
The default 0.55 is what the ALFWorld CPU pilot of 2026-11-27 measured
(``critic/advantages/nonzero_fraction`` 0.43-0.47 of its step rows); GSM8K's math leg had ~0.9
(its Clip-Cov loss refuses the switch: ``actor.policy_loss=vanilla`` there).

One untimed update first (AdamW allocates its state), then ``--repeats`` times the update
without and with the skip, alternating, each from the same parameters. Prints the CPU model,
torch's CPU capability, the thread count and the update's dtype beside the figures.

    PYTHONPATH=$PWD python benchmarks/update_skip_rows.py --rows 40
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from throughput import Clock, load_rows  # noqa: E402  (a sibling script)

from serl.configure import load_config  # noqa: E402
from serl.train.batch import UpdateBatch  # noqa: E402
from serl.train.trainer import Trainer  # noqa: E402
from serl.utils import cpu_model  # noqa: E402


def advantages(n: int, zero_fraction: float, seed: int) -> torch.Tensor:
    """``[n]`` advantages: ``round(n * zero_fraction)`` seeded rows 0, the others ±1."""
    rng = random.Random(seed)
    zero = set(rng.sample(range(n), round(n * zero_fraction)))
    return torch.tensor([0.0 if i in zero else rng.choice((1.0, -1.0)) for i in range(n)])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="cpu_learn")
    p.add_argument("--rollout", default=None, help="a last_rollout.jsonl (default: synthetic rows)")
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--zero-fraction", type=float, default=0.55)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--override", nargs="*", default=[], help="config overrides (key=value)")
    a = p.parse_args(argv)
    if not 0.0 <= a.zero_fraction < 1.0:
        p.error("--zero-fraction must be in [0, 1)")
    rows = load_rows(a.rollout, a.rows, a.seed)
    adv = advantages(len(rows), a.zero_fraction, a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(a.recipe, [f"trainer.output_dir={tmp}", "trainer.run_name=bench", "trainer.logger=[]",
                                     "trainer.progress=false", *a.override])
        tr = Trainer(cfg)
        try:
            start = copy.deepcopy(tr.policy.state_dict())
            tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in rows)

            def update(skip: bool) -> float:
                tr.policy.load_state_dict(start)
                cfg.actor.skip_zero_advantage_rows = skip
                with Clock() as c:
                    tr.update.run(UpdateBatch.from_steps(rows, adv, torch.ones(len(rows))), step=1)
                return c.wall

            update(False)  # warm-up: AdamW's state, the allocator
            times = {False: [], True: []}
            for _ in range(a.repeats):
                for skip in (False, True):
                    times[skip].append(update(skip))
            dtype = tr.models.autocast_dtype or torch.float32
        finally:
            tr.close()
    off, on = min(times[False]), min(times[True])
    print(f"CPU: {cpu_model()} (torch CPU capability {torch.backends.cpu.get_cpu_capability()}), "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, update dtype {dtype}, recipe {a.recipe}")
    print(f"{len(rows)} rows, {tokens} tokens, {int((adv == 0).sum())} with advantage 0 "
          f"({a.zero_fraction:.2f}); best of {a.repeats}")
    print("| actor.skip_zero_advantage_rows | update s | step rows / min | tokens / s |\n|---|---|---|---|")
    for label, t in (("false (every row, as verl)", off), ("true", on)):
        print(f"| {label} | {t:.1f} | {60 * len(rows) / t:.1f} | {tokens / t:.0f} |")
    print(f"ratio: {off / on:.2f}x")
    return {"off_s": off, "on_s": on, "ratio": off / on, "rows": len(rows), "zero_rows": int((adv == 0).sum())}


if __name__ == "__main__":
    main()
