"""Seconds per ALFWorld step with ``rollout.action_selection=generate`` and ``score``, side by side.

Plays the same games (the first ``--games`` of ``--split``, greedy, ``--steps`` steps, one chunk)
once per mode, the modes alternating over ``--repeats``, in one process with one model and
engine (``hf``), and prints per mode the seconds per env step: in the engine's ``generate``
calls, in ``score_continuations`` (the candidates' token tree, ``score`` only) and in all, with
the candidates per scored step and the games won. The CPU model and the inference dtype are
printed with the figures.

    python benchmarks/action_selection.py                                   # the shipped games
    python benchmarks/action_selection.py --data-dir ../shared/data/alfworld --split valid_unseen --games 6
"""

from __future__ import annotations

import argparse
import platform
import sys
import time


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=None, help="ALFWorld data (default: the games serl ships)")
    ap.add_argument("--split", default="valid_unseen")
    ap.add_argument("--games", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides")
    args = ap.parse_args(argv)

    import torch

    from serl.configure import load_config
    from serl.models.loading import load_causal_lm, load_tokenizer, pick_device, pick_dtype, resolve_model_path
    from serl.rollout.engine import engine_options, make_engine
    from serl.train import env_pool
    from serl.train.evaluate import eval_sampling, eval_tasks

    overrides = ["rollout.engine=hf", f"env.max_steps={args.steps}", *args.set]
    if args.data_dir:
        overrides.append(f"env.data_dir={args.data_dir}")
    cfgs = {mode: load_config("cpu_conversation", overrides + [f"rollout.action_selection={mode}"])
            for mode in ("generate", "score")}
    cfg = cfgs["generate"]
    device = pick_device(cfg.trainer.device)
    path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    tok = load_tokenizer(path)
    dtype = pick_dtype(cfg.model.dtype, device)
    model = load_causal_lm(path, dtype, device, cfg.model.trust_remote_code, cfg.model.adapter)
    engine, _ = make_engine("hf", model, tok, args.games, device,
                            **engine_options(cfg.rollout, path, dtype, device,
                                             cfg.data.max_prompt_length + cfg.data.max_response_length,
                                             0, args.games))
    spent = {"generate": 0.0, "score": 0.0}

    def timed(name, fn):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
        return call

    engine.generate = timed("generate", engine.generate)
    engine.score_continuations = timed("score", engine.score_continuations)
    tasks = eval_tasks(cfg, args.split, args.games)
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, {dtype}, torch {torch.__version__}; "
          f"{len(tasks)} {args.split} games, {args.steps} steps, greedy", flush=True)
    rows = {m: [] for m in cfgs}
    for r in range(args.repeats):
        for mode in (("generate", "score") if r % 2 == 0 else ("score", "generate")):
            c = cfgs[mode]
            pool = env_pool.make_pool(c, len(tasks))
            try:
                col = env_pool.rollout_loop(c, pool, engine, tok)
                spent.update(generate=0.0, score=0.0)
                t0 = time.perf_counter()
                groups = col.collect(tasks, 1, eval_sampling(c, greedy=True, seed=1000))
                wall = time.perf_counter() - t0
            finally:
                pool.close()
                engine.reset_prefix_cache()
            trajs = [t for g in groups for t in g.trajectories]
            steps = sum(len(t.steps) for t in trajs)
            m = col.last_metrics
            rows[mode].append((wall / steps, spent["generate"] / steps, spent["score"] / steps,
                               m.get("rollout/score_candidates_mean", 0.0), sum(t.won for t in trajs), steps))
    print("| mode | s / step | generate s / step | score s / step | candidates / scored step | won | steps |")
    print("|---|---|---|---|---|---|---|")
    for mode, rs in rows.items():
        for wall, gen, sc, cands, won, steps in rs:
            print(f"| {mode} | {wall:.2f} | {gen:.2f} | {sc:.2f} | {cands:.1f} | {won}/{len(tasks)} | {steps} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
