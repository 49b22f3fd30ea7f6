"""``serl`` command line: train, eval, report, sft, data.

    serl train [recipe=NAME|PATH] [key=value ...] [--resume RUN_DIR] [--data-dir DIR]
    serl eval  [recipe=NAME|PATH] [key=value ...] [--run RUN_DIR] [--split S] [--num-tasks N]
               [--greedy] [--seed N] [--data-dir DIR] [--shard I/N] [--out DIR|FILE.jsonl]
    serl eval  --merge DIR... --out DIR    (one evaluation from its --shard parts)
    serl report RUN_DIR... [--out FILE.html] [--iteration N]
    serl sft   --data FILE.jsonl [recipe=NAME|PATH] [key=value ...] [--resume RUN_DIR]
    serl data {download,expert} ...      (serl.cli_data)

With no recipe, ``serl train`` runs the ``default`` recipe: SERL (immediate feedback) on GRPO, on the
ALFWorld games shipped with serl (one conversation per episode, all six task types, 8 steps), with
SmolLM2-135M-Instruct and serl's conversation cold start, a few iterations on a laptop CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from serl.utils import use_openmp_policy  # serl.utils imports no torch

use_openmp_policy()  # must precede the first torch import: libgomp reads it once
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


from serl.cli_data import add_data_parser  # noqa: E402  (after the OpenMP policy; imports no torch)
from serl.cli_data import data_dir_override as _data_dir_override  # noqa: E402
from serl.cli_data import parse_shard as _parse_shard  # noqa: E402
from serl.cli_data import split_overrides as _split_overrides  # noqa: E402


def cmd_train(args: argparse.Namespace) -> int:
    from serl.config import DEFAULT_RECIPE
    from serl.configure import load_config, load_run_config
    from serl.train.trainer import Trainer

    from serl.train.distributed import launched_rank, launched_world_size

    recipe, overrides = _split_overrides(args.overrides)
    overrides += _data_dir_override(args)
    if args.resume:
        from serl.train.checkpoint import check_resumable
        from serl.train.run_dir import RunLock

        if recipe:
            print("serl train --resume: the recipe comes from the run folder; ignoring recipe=", file=sys.stderr)
        cfg = load_run_config(Path(args.resume), overrides)
        if launched_rank() == 0:  # one rank probes: ranks racing for the lock would refuse each other
            probe = RunLock.acquire(Path(args.resume))  # a live run on the folder is named first
            try:
                check_resumable(Path(args.resume))  # no model loads before its checkpoint is known intact
            finally:
                probe.release()
    else:
        cfg = load_config(recipe or DEFAULT_RECIPE, overrides)
    check_train_data(cfg)
    if cfg.trainer.num_processes > 1 and launched_world_size() == 1:
        return _relaunch(cfg, args.argv)
    trainer = Trainer(cfg, run_dir=Path(args.resume), resume=True) if args.resume else Trainer(cfg)
    if not trainer.dist.is_main:  # rank 0 reports; the others only train
        trainer.train()
        return 0
    print(f"serl: run folder {trainer.run_dir}", file=sys.stderr)
    if trainer.iteration >= cfg.trainer.total_training_steps:
        print(f"serl: {trainer.run_dir} already finished {trainer.iteration} iterations "
              f"(trainer.total_training_steps={cfg.trainer.total_training_steps}); raise it to continue")
        trainer.close()
        return 0
    last = trainer.train()
    sr = last.get("episode/success_rate", float("nan"))
    print(f"\nserl train finished {trainer.iteration} iterations "
          f"({trainer.update_step} policy updates).")
    print(f"  training success rate (last iteration): {sr:.3f}")
    by_type = {k.split("/", 1)[1][: -len("_success_rate")]: v for k, v in last.items()
               if k.startswith("episode/") and k.endswith("_success_rate") and k != "episode/success_rate"}
    if by_type:
        print("  per task type: " + ", ".join(f"{k} {v:.2f}" for k, v in by_type.items()))
    _print_signal(trainer.run_dir / "metrics.jsonl")
    print(f"  run folder:  {trainer.run_dir}")
    print(f"  config:      {trainer.run_dir / 'config.yaml'}")
    print(f"  metrics:     {trainer.run_dir / 'metrics.jsonl'} (TensorBoard: {trainer.run_dir / 'tensorboard'})")
    print(f"  checkpoint:  {trainer.run_dir / 'checkpoints'}")
    print(f"  resume with: serl train --resume {trainer.run_dir}")
    return 0


def _print_signal(metrics_path: Path) -> None:
    """The end-of-run line on learning signal: the mean fraction of groups whose advantage was not
    all 0 (:func:`serl.train.metrics.signal_summary` over every iteration in ``metrics.jsonl``,
    resumed ones included), and a one-line warning on stderr when no iteration had any."""
    from serl.train.metrics import signal_summary
    from serl.utils import jsonl_lines

    if not metrics_path.exists():
        return
    with open(metrics_path, encoding="utf-8", errors="replace") as f:
        s = signal_summary(rec for _, _, rec, _ in jsonl_lines(f) if isinstance(rec, dict))
    if not s["iterations"]:
        return
    print(f"  groups with an advantage: {s['group_fraction']:.2f} (mean over {int(s['iterations'])} iterations; "
          f"{int(s['iterations_with_signal'])} had at least one)")
    if not s["iterations_with_signal"]:
        print("serl: warning: no group carried an advantage in any iteration (every group's rollouts scored "
              "alike), so nothing was learned; train on tasks the policy sometimes wins (env.task_types, "
              "env.max_steps, a cold start: docs/recipes.md 'From a cold start to learning')", file=sys.stderr)


def check_train_data(cfg) -> None:
    """A start-up check of ``serl train``, before any model loads: the tasks of the train split,
    and of the eval split when the run evaluates (``trainer.test_freq`` or
    ``trainer.val_before_train``), can be listed. A missing or wrong ``env.data_dir`` thus stops
    in one line naming the folder and how to get the data (the env's own error) instead of after
    the model loaded or at the first evaluation. Listing is cheap (< 0.3 s for the full ALFWorld,
    WebShop or GSM8K lists).

    Raises:
        serl.errors.EnvError, serl.errors.ConfigError: as :func:`serl.train.env_pool.list_tasks`.
    """
    from serl.train.env_pool import list_tasks

    list_tasks(cfg, cfg.env.train_split)
    if cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train:
        list_tasks(cfg, cfg.env.eval_split)


def _relaunch(cfg, argv: list[str]) -> int:
    """``serl train trainer.num_processes=N``: run the same command under ``accelerate launch
    --multi_gpu --num_processes N`` (gloo on CPU, NCCL on CUDA) and return its exit code."""
    import subprocess

    n = cfg.trainer.num_processes
    # accelerate's --multi_gpu is its torchrun launcher; on CPU the trainer asks accelerate for
    # gloo itself (``--cpu`` would start one process only)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "serl.cli", *argv]
    print(f"serl: launching {n} processes: {' '.join(cmd)}", file=sys.stderr)
    return subprocess.call(cmd)


def _eval_num_tasks(flag: int | None, configured: int) -> int:
    """``serl eval``'s task count: ``--num-tasks`` if given, else ``env.eval_num_tasks`` (-1 = all).
    Raises ConfigError, naming the source, for 0 (nothing evaluated, "success rate 0.000") or < -1."""
    from serl.errors import ConfigError

    n, source = (flag, "--num-tasks") if flag is not None else (configured, "env.eval_num_tasks")
    if n == 0 or n < -1:
        raise ConfigError(f"serl eval: {source} must be >= 1 (or -1 for the whole split), got {n}: "
                          "0 tasks would evaluate nothing")
    return n


def _eval_sequences(cfg, num_tasks: int, greedy: bool) -> int:
    """The most sequences one of ``serl eval``'s ``generate`` calls carries (its engine's KV cache
    is sized to hold them): a chunk of :func:`serl.train.evaluate.evaluate_policy`, at most
    ``rollout.micro_batch_size``, fewer when the evaluation has fewer tasks × samples."""
    per_task = 1 if greedy else cfg.rollout.val_n
    return cfg.rollout.micro_batch_size if num_tasks < 1 else min(cfg.rollout.micro_batch_size, num_tasks * per_task)


def cmd_eval(args: argparse.Namespace) -> int:
    from serl.config import DEFAULT_RECIPE
    from serl.configure import load_config, load_run_config
    from serl.models.loading import (checkpoint_policy, load_causal_lm, load_tokenizer, pick_device, pick_dtype,
                                     resolve_model_path)
    from serl.rollout.engine import engine_options, make_engine
    from serl.train.checkpoint import load_newest_intact
    from serl.train.evaluate import eval_tasks, evaluate_policy
    from serl.errors import ConfigError
    from serl.trajectory import Trajectory
    from serl.utils import configure_cpu_threads

    if args.merge:
        return cmd_eval_merge(args)
    recipe, overrides = _split_overrides(args.overrides)
    overrides += _data_dir_override(args)
    cfg = load_run_config(Path(args.run), overrides) if args.run else load_config(recipe or DEFAULT_RECIPE, overrides)
    n = _eval_num_tasks(args.num_tasks, cfg.env.eval_num_tasks)  # before the model loads
    shard = _parse_shard(args.shard)
    split = args.split or cfg.env.eval_split
    if shard[1] > 1:  # an empty shard fails here, before the model loads and a journal is begun
        eval_tasks(cfg, split, n, shard)
    configure_cpu_threads(cfg.trainer.num_threads)
    device = pick_device(cfg.trainer.device)
    path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    tok = load_tokenizer(path)
    dtype = pick_dtype(cfg.model.dtype, device)
    if args.run:  # the newest checkpoint whose policy loads (a LoRA adapter is merged at load)
        ck, model = load_newest_intact(Path(args.run), lambda f: checkpoint_policy(f, cfg, dtype, device))
        source = str(ck)
    else:
        model, source = load_causal_lm(path, dtype, device, cfg.model.trust_remote_code, cfg.model.adapter), path
    # the trainer's engine (rollout.engine; auto = vLLM where installed), so an evaluation samples
    # as the run's rollouts do; vLLM gets the policy's weights (a checkpoint's) at start-up
    engine, engine_name = make_engine(
        cfg.rollout.engine, model, tok, cfg.rollout.micro_batch_size, device,
        scores_continuations=cfg.rollout.action_selection == "score",
        **engine_options(cfg.rollout, path, dtype, device, cfg.data.max_prompt_length + cfg.data.max_response_length,
                         args.seed, _eval_sequences(cfg, n, args.greedy)))
    print(f"serl: rollout engine {engine_name} (rollout.engine={cfg.rollout.engine}, device {device})", file=sys.stderr)
    tasks_file = Path(args.out) if args.out and args.out.endswith(".jsonl") else None
    out = Path(args.out) if args.out and tasks_file is None else \
        (Path(args.run) if args.run else Path(cfg.trainer.output_dir)) / f"eval_{split}"
    out.mkdir(parents=True, exist_ok=True)
    mode = "greedy" if args.greedy else f"sampled T={cfg.rollout.val_temperature}, seed={args.seed}"
    journal = eval_journal(out, cfg, split, n, mode, source, engine_name, shard)
    done = [Trajectory.from_dict(e["trajectory"]) for e in journal.entries]
    journal.entries.clear()  # held once, as trajectories
    if done:
        print(f"serl eval: resuming {journal.path}: {len(done)} episodes of finished chunks kept", file=sys.stderr)
    try:
        res = evaluate_policy(cfg, engine, tok, split, n, greedy=args.greedy, seed=args.seed, done=done, shard=shard,
                              on_chunk=lambda new: journal.append(*({"trajectory": t.to_dict()} for t in new)))
    except ValueError as e:
        raise ConfigError(f"{journal.path}: {e}; delete it to start over") from e
    adapter = {"adapter": cfg.model.adapter} if cfg.model.adapter and not args.run else {}  # merged at load
    part = {"shard": f"{shard[0]}/{shard[1]}"} if shard[1] > 1 else {}
    print(f"\nserl eval: {cfg.env.name} {split}, {int(res['metrics']['num_tasks'])} tasks"
          + (f" (shard {part['shard']})" if part else "") + f", {mode}, model {source}"
          + (f" + adapter {cfg.model.adapter}" if adapter else ""))
    write_eval(out, {"split": split, "mode": mode, "model": source, **adapter, **part}, res["metrics"],
               res["trajectories"], cfg.env.name, tasks_file)
    journal.remove()
    print(f"  written to {out}" + (" (serl report shows it)" if args.run else ""))
    return 0


def write_eval(out: Path, meta: dict, m: dict, trajs: list, env_name: str, tasks_file: Path | None = None) -> None:
    """Print an evaluation's metrics and write ``out/metrics.json`` (``meta`` then the metrics),
    ``out/trajectories.jsonl`` and ``out/tasks.jsonl`` (one line per episode, :func:`task_result`;
    also to ``tasks_file`` when given): ``serl eval`` and ``serl eval --merge``."""
    from serl.envs.base import row_layout
    from serl.trajectory import write_jsonl
    from serl.utils import atomic_write_text

    step_rows = row_layout(env_name) == "step"  # one action per step: the action ratios mean something
    print(f"  success rate: {m['success_rate']:.3f}" + (
        f"   valid-action ratio: {m['valid_action_ratio']:.3f}   admissible-action ratio: "
        f"{m['admissible_action_ratio']:.3f}" if step_rows else ""))
    shown = {"success_rate", "num_tasks", "valid_action_ratio", "admissible_action_ratio"}
    for k, v in m.items():
        if k.endswith("_success_rate") and k != "success_rate":
            print(f"  {k[: -len('_success_rate')]:<36} {v:.3f}")
            shown.add(k)
    if "webshop_task_score" in m:
        print(f"  webshop task score: {m['webshop_task_score']:.3f}")
        shown.add("webshop_task_score")
    for k, v in m.items():  # the env's own episode metrics and the sample metrics (acc/mean@n, pass@k ...)
        if k not in shown and isinstance(v, (int, float)):
            print(f"  {k:<36} {v:.3f}")
    atomic_write_text(out / "metrics.json", json.dumps({**meta, **m}, indent=2))
    write_jsonl(out / "trajectories.jsonl", trajs)
    lines = "".join(json.dumps({"split": meta["split"], "mode": meta["mode"], **task_result(t)}) + "\n" for t in trajs)
    atomic_write_text(out / "tasks.jsonl", lines)
    if tasks_file is not None:
        atomic_write_text(tasks_file, lines)
        print(f"  per-task results: {tasks_file}")


def cmd_eval_merge(args: argparse.Namespace) -> int:
    """``serl eval --merge DIR ... --out OUT``: one evaluation from the output folders of its
    ``--shard I/N`` parts (no model is loaded): its metrics recomputed over every part's episodes,
    and its trajectories and per-task lines in the whole evaluation's task order."""
    from serl.errors import ConfigError
    from serl.train.evaluate import eval_metrics, merge_shards
    from serl.trajectory import read_jsonl

    if not args.out or args.out.endswith(".jsonl"):
        raise ConfigError("serl eval --merge needs --out DIR, the folder for the merged evaluation")
    extra = [x for x in ("run", "split", "num_tasks", "shard", "data_dir") if getattr(args, x) is not None]
    if args.overrides or args.greedy or extra:
        raise ConfigError("serl eval --merge takes the parts' folders and --out only (each part's metrics.json "
                          f"says how it was played); got {args.overrides + [f'--{x}'.replace('_', '-') for x in extra]}"
                          + (" --greedy" if args.greedy else ""))
    parts = []
    for d in map(Path, args.merge):
        if not (d / "metrics.json").is_file() or not (d / "trajectories.jsonl").is_file():
            raise ConfigError(f"serl eval --merge: {d} holds no finished serl eval (metrics.json, trajectories.jsonl)")
        try:
            parts.append((json.loads((d / "metrics.json").read_text()), read_jsonl(d / "trajectories.jsonl")))
        except (ValueError, KeyError, TypeError) as e:  # a file cut or edited by hand
            raise ConfigError(f"serl eval --merge: {d}'s metrics.json or trajectories.jsonl cannot be read ({e}); "
                              "re-run that part") from e
    meta, trajs = merge_shards(parts)
    n = len(trajs) // sum(int(p[0]["num_tasks"]) for p in parts)
    m = eval_metrics(trajs[0].task.env_name, trajs, n)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"serl eval --merge: {trajs[0].task.env_name} {meta['split']}, {int(m['num_tasks'])} tasks from "
          f"{meta['shards']} shards, {meta['mode']}, model {meta['model']}"
          + (f" + adapter {meta['adapter']}" if meta.get("adapter") else ""))
    write_eval(out, {**meta, "merged": [str(d) for d in args.merge]}, m, trajs, trajs[0].task.env_name)
    print(f"  written to {out}")
    return 0


def eval_journal(out: Path, cfg, split: str, num_tasks: int, mode: str, model: str, engine: str,
                 shard: tuple[int, int] = (0, 1)):
    """``serl eval``'s journal ``OUT/trajectories.jsonl.partial`` (:class:`serl.utils.Journal`): the
    trajectories of each finished chunk, so that the same command, stopped and run again, goes on
    from them. Its header is what decides the episodes: the split, task count, decoding, model,
    engine and the config but ``trainer.*``, ``env.num_workers`` and
    ``rollout.gpu_memory_utilization`` (the engine's memory, e.g. a KV cache grown after a slow
    first try); a rerun with another is refused (:class:`~serl.errors.ConfigError`)."""
    from serl.config.recipes import config_to_dict
    from serl.utils import Journal

    conf = config_to_dict(cfg)
    conf.pop("trainer", None)
    conf.get("env", {}).pop("num_workers", None)
    conf.get("rollout", {}).pop("gpu_memory_utilization", None)
    header = {"split": split, "num_tasks": num_tasks, "mode": mode, "model": model, "engine": engine, "config": conf}
    if shard[1] > 1:  # (absent for the whole split, so journals written before --shard still resume)
        header["shard"] = list(shard)
    return Journal(out / "trajectories.jsonl.partial", header, "serl eval", keep=False)


def task_result(traj) -> dict:
    """One ``serl eval`` per-task line: the task, won, episode reward, steps, valid- and
    admissible-action ratios, and the env's final-step info (e.g. WebShop's ``task_score``)."""
    steps = traj.steps
    info = steps[-1].info if steps else {}
    return {"task_id": traj.task.task_id, "task_type": traj.task.task_type, "task_text": traj.task_text,
            "won": traj.won, "episode_reward": traj.episode_reward, "length": traj.length,
            "valid_action_ratio": sum(s.action_valid for s in steps) / max(1, len(steps)),
            "admissible_action_ratio": sum(s.action in s.admissible_actions for s in steps) / max(1, len(steps)),
            **{k: v for k, v in info.items() if isinstance(v, (int, float, str, bool))}}


def cmd_report(args: argparse.Namespace) -> int:
    """``serl report``: one self-contained HTML page of one or more run folders."""
    from serl.report.html import write_report

    path = write_report(args.run_dirs, args.out, args.iteration)
    print(f"serl report: {path} ({path.stat().st_size / 1e6:.2f} MB; open it in a browser)")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from serl.config import DEFAULT_RECIPE
    from serl.configure import load_config, load_run_config
    from serl.train.sft import SFTTrainer

    recipe, overrides = _split_overrides(args.overrides)
    if args.resume:
        run_dir = Path(args.resume)
        if recipe:
            print("serl sft --resume: the recipe comes from the run folder; ignoring recipe=", file=sys.stderr)
        cfg = load_run_config(run_dir, overrides)
        if args.data:
            cfg.sft.data = str(Path(args.data).resolve())
        trainer = SFTTrainer(cfg, run_dir=run_dir, resume=True)
    else:
        cfg = load_config(recipe or DEFAULT_RECIPE, overrides)
        if args.data:
            cfg.sft.data = str(Path(args.data).resolve())
        trainer = SFTTrainer(cfg)
    print(f"serl: run folder {trainer.run_dir}", file=sys.stderr)
    model_dir = trainer.run_dir / "model"
    if trainer.step >= trainer.total_steps and not (cfg.sft.eval_on_start and trainer.val_examples):
        if not (model_dir / "config.json").exists():
            trainer.export_model()
        trainer.release_run_dir()
        print(f"serl: {trainer.run_dir} already finished {trainer.step} optimizer steps; "
              "raise sft.epochs or sft.max_steps to continue")
        return 0
    last = trainer.train()
    if "sft/loss" not in last:  # no step in this call: only sft.eval_on_start's evaluation
        print(f"\nserl sft evaluated the model of optimizer step {trainer.step} on {len(trainer.val_examples)} "
              f"held-out rows ({cfg.sft.val_data}): loss {last['val/loss']:.4f}, token accuracy "
              f"{last['val/token_accuracy']:.3f}, exact replies {last['val/reply_exact']:.3f}")
        print(f"  metrics:     {trainer.run_dir / 'metrics.jsonl'}")
        return 0
    print(f"\nserl sft finished {trainer.step} optimizer steps on {len(trainer.examples)} rows.")
    print(f"  last loss:   {last.get('sft/loss', float('nan')):.4f}"
          + (f" (held-out {last['val/loss']:.4f}, token accuracy {last['val/token_accuracy']:.3f}, "
             f"exact replies {last['val/reply_exact']:.3f})" if "val/loss" in last else ""))
    print(f"  speed:       {last.get('perf/mean_tokens_per_s', 0):.0f} tokens/s, "
          f"{last.get('perf/mean_rows_per_min', 0):.1f} rows/min (mean over the steps of this run)")
    print(f"  model:       {model_dir}" + (" (LoRA merged)" if cfg.model.lora.r else ""))
    if cfg.model.lora.r and cfg.sft.save_adapter:
        print(f"  adapter:     {trainer.run_dir / 'adapter'}")
    print(f"  metrics:     {trainer.run_dir / 'metrics.jsonl'}")
    print(f"  use it with: serl train model.path={model_dir}   /   serl eval model.path={model_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="serl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a policy (default recipe: default)")
    t.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    t.add_argument("--data-dir", help="data folder (sets env.data_dir; default $SERL_DATA or the shipped fixture)")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="success rate overall and per task type on a split")
    e.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
    e.add_argument("--run", metavar="RUN_DIR", help="evaluate the latest checkpoint of a run")
    e.add_argument("--split", help="split to evaluate (default env.eval_split)")
    e.add_argument("--num-tasks", type=int, default=None, help="evaluate the first N tasks of the split")
    e.add_argument("--greedy", action="store_true", help="greedy decoding (default: seeded sampling at rollout.val_temperature)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--data-dir", help="data folder (sets env.data_dir)")
    e.add_argument("--shard", metavar="I/N", help="play the I-th of N interleaved parts of the tasks (tasks I, I+N, ...), "
                   "e.g. one process per part on one machine; the parts' tasks.jsonl together are the whole "
                   "evaluation's tasks (sampled episodes are seeded per chunk, so they differ from one process's)")
    e.add_argument("--merge", nargs="+", metavar="DIR", help="merge the output folders of one evaluation's "
                   "--shard I/N parts into --out DIR (no model is loaded; the metrics are recomputed over all episodes)")
    e.add_argument("--out", help="FILE.jsonl: also write the per-task results (one JSON line per task) there; "
                   "otherwise the output folder (default <run>/eval_<split> or <output_dir>/eval_<split>: "
                   "metrics.json, trajectories.jsonl, tasks.jsonl; while it runs trajectories.jsonl.partial, "
                   "each finished chunk: the same command, stopped and run again, goes on from it)")
    e.set_defaults(fn=cmd_eval)

    r = sub.add_parser("report", help="one self-contained HTML page of runs: curves, evals, trajectories, SERL weights",
                       description="Write one HTML file (inline JS/CSS/SVG; no server, no network) with the "
                       "curves of one or more runs overlaid, their serl eval results, and a trajectory browser "
                       "of the traced iterations (trainer.trace_freq) with SERL's per-token weights.")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders of serl train")
    r.add_argument("--out", metavar="FILE.html", help="output file (default <first RUN_DIR>/report.html)")
    r.add_argument("--iteration", type=int, default=None,
                   help="show the trajectories of this traced iteration (default: the newest 8 traced)")
    r.set_defaults(fn=cmd_report)

    s = sub.add_parser("sft", help="supervised fine-tuning on expert rows (a cold start for RL)",
                       description="Fine-tune the policy on expert step rows (JSONL from `serl data expert`): "
                                   "loss on reply tokens only, full or LoRA (model.lora.r>0). Writes "
                                   "RUN/model, a full Hugging Face model folder (LoRA merged) for model.path=.")
    s.add_argument("overrides", nargs="*", help="recipe=NAME (default cpu) and dotted key=value overrides (sft.*, model.lora.*)")
    s.add_argument("--data", metavar="FILE.jsonl", help="expert rows (sets sft.data; required unless resuming)")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue the SFT run in RUN_DIR from its latest checkpoint")
    s.set_defaults(fn=cmd_sft)

    add_data_parser(sub)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers and ``kill`` send), raised in the main thread like Ctrl-C so the
    same clean-up runs: env workers stopped, an unfinished checkpoint save removed."""


def _on_sigterm(signum, frame) -> None:
    # one clean-up: a second SIGTERM while it runs is ignored (SIGKILL still works)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def _stop_hint(args) -> str:
    """What a stopped command leaves: ``train`` and ``sft`` a resumable checkpoint, ``eval`` its
    journal of finished chunks, ALFWorld's and WebShop's ``data expert`` its journal of finished
    episodes (``--out`` + ``.partial``), the others nothing to resume."""
    cmd = args.cmd
    if cmd == "sft":  # the SFT loop saved its last finished step, or said why not, just above
        return "; resume with --resume RUN_DIR from the checkpoint named above"
    if cmd == "train":
        return "; the last checkpoint is intact (resume with --resume RUN_DIR)"
    if cmd == "eval":
        return "; serl eval kept its finished chunks: the same command again goes on from them"
    if cmd == "data" and getattr(args, "data_cmd", None) == "expert" and getattr(args, "env", None) != "math":
        return (f"; serl data expert kept its finished episodes in {args.out}.partial: "
                "the same command again goes on from them")
    return f"; serl {cmd} has nothing to resume: run it again"


def main(argv: list[str] | None = None) -> int:
    """Run one ``serl`` command. Exit codes: 0 ok; 2 a :class:`~serl.errors.SerlError` (bad config,
    recipe, run folder, checkpoint, data ...), printed as one line; 130 Ctrl-C; 143 SIGTERM."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for serl train's re-launch
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from serl.errors import SerlError

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.fn(args)
    except (SerlError, FileNotFoundError) as e:
        print(f"serl: error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"serl: terminated (SIGTERM); env workers stopped{_stop_hint(args)}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"serl: interrupted{_stop_hint(args)}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
