"""Generation tokens/s, update tokens/s and SERL's teacher overhead, measured side by side.

One run: build a trainer from a recipe (default ``cpu``: SmolLM2-135M on the ALFWorld fixture),
collect one batch of real rollouts, then on that same batch time

* generation: response tokens / wall time of the rollout's ``generate`` calls;
* a GRPO update (advantages + PPO update);
* a SERL update (privileged contexts + teacher scoring + the same update with the weights);

and report ``SERL iteration ÷ GRPO iteration`` (rollout included in both, and update-only).
The policy is restored between the two updates, so both see identical weights and rows.

    python benchmarks/bench_train.py                      # the cpu recipe, real model
    python benchmarks/bench_train.py model.path=DIR ...   # any overrides
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from serl.configure import load_config  # noqa: E402
from serl.train.batch import UpdateBatch  # noqa: E402
from serl.train.collect import train_sampling  # noqa: E402
from serl.train.env_pool import make_pool  # noqa: E402
from serl.train.rows import step_table  # noqa: E402
from serl.train.trainer import Trainer  # noqa: E402
from serl.trajectory import iter_steps  # noqa: E402


class _TimedEngine:
    """Wraps an engine to count generated tokens and generate() wall time."""

    def __init__(self, engine):
        self.engine = engine
        self.tokens = 0
        self.seconds = 0.0

    def generate(self, prompts, params):
        t = time.perf_counter()
        out = self.engine.generate(prompts, params)
        self.seconds += time.perf_counter() - t
        self.tokens += sum(len(r) for r in out)
        return out


def main(argv: list[str]) -> dict:
    recipe = "cpu"
    overrides = []
    for a in argv:
        if a.startswith("recipe="):
            recipe = a.split("=", 1)[1]
        else:
            overrides.append(a)
    cfg = load_config(recipe, overrides + ["trainer.logger=[]", "trainer.progress=false",
                                            "trainer.output_dir=/tmp/serl-bench", "trainer.run_name=bench",
                                            "trainer.overwrite=true"])
    tr = Trainer(cfg)
    try:
        pool = make_pool(cfg, tr.rollout.num_envs)
        timed = _TimedEngine(tr.engine)
        collector = tr.rollout.collector(pool, tr.engine, tr.tokenizer)
        collector.engine = timed
        tasks = tr.state.sampler.draw(cfg.data.train_batch_size)
        t0 = time.perf_counter()
        groups = collector.collect(tasks, cfg.env.rollout.n, train_sampling(cfg))
        t_rollout = time.perf_counter() - t0
        pool.close()
        rows = [s for _, _, s in iter_steps(groups)]
        n_update_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in rows)
        state = copy.deepcopy(tr.policy.state_dict())
        opt_state = copy.deepcopy(tr.optimizer.state_dict())

        table = step_table(groups, 1, cfg)

        def grpo_update():
            adv = tr.adv_fn(table.advantage_input(), cfg.algorithm)
            tr.update.run(UpdateBatch.from_steps(table.rows, adv, table.row_mask))

        def serl_update():
            adv = tr.adv_fn(table.advantage_input(), cfg.algorithm)
            batch = UpdateBatch.from_steps(table.rows, adv, table.row_mask)
            t = time.perf_counter()
            tr.serl.run(batch, groups, table, adv, update_step=0, step=1, metrics={})  # λ_eff(0) = mixing_lambda
            serl_update.teacher_s = time.perf_counter() - t
            tr.update.run(batch)

        t = time.perf_counter()
        grpo_update()
        t_grpo = time.perf_counter() - t
        tr.policy.load_state_dict(state)
        tr.optimizer.load_state_dict(opt_state)
        t = time.perf_counter()
        serl_update()
        t_serl = time.perf_counter() - t
        res = {
            "model": cfg.model.path,
            "threads": torch.get_num_threads(),
            "episodes": tr.rollout.num_envs,
            "step_rows": len(rows),
            "update_tokens": n_update_tokens,
            "generation_tokens": timed.tokens,
            "generation_tokens_per_s": timed.tokens / max(timed.seconds, 1e-9),
            "rollout_s": t_rollout,
            "grpo_update_s": t_grpo,
            "update_tokens_per_s": n_update_tokens / t_grpo,
            "serl_update_s": t_serl,
            "serl_teacher_s": serl_update.teacher_s,
            "serl_over_grpo_update": t_serl / t_grpo,
            "serl_over_grpo_iteration": (t_rollout + t_serl) / (t_rollout + t_grpo),
        }
    finally:
        tr.close()
    print(json.dumps(res))
    print(f"generation {res['generation_tokens_per_s']:.1f} tok/s | update {res['update_tokens_per_s']:.1f} tok/s | "
          f"SERL/GRPO iteration {res['serl_over_grpo_iteration']:.3f} (update only {res['serl_over_grpo_update']:.3f}; "
          f"teacher {res['serl_teacher_s']:.1f} s) | {len(rows)} rows, {tr.rollout.num_envs} episodes")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
