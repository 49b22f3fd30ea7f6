"""Does serl learn? Expert cold start, then GRPO vs SERL from the same SFT checkpoint, on real games.

Phases (each one resumable: a finished phase is skipped, an interrupted run continues with
``--resume``; re-run the same command after an interruption):

1. ``expert``  — ``serl data expert alfworld`` on ``--expert-tasks`` train games of the recipe's
   task types (walkthroughs played through the RL prompt builder; WebShop: the oracle, below), or
   ``--expert-file``, rows made beforehand (e.g. in shards, or on a CPU before a GPU lease);
2. ``sft``     — ``serl sft`` (LoRA by default) on those rows; its merged model is the RL start;
   ``dagger``  — ALFWorld, with ``--dagger-rounds R``: R rounds of DAgger (arXiv 1011.0686) on the
   SFT model: it plays ``--dagger-tasks`` train games at T = 1 with ``env.alfworld.expert=planner``
   (``serl eval --split train --out dagger/r<R>/play``), ``serl data dagger`` makes rows of the
   states it got wrong, and ``serl sft`` fine-tunes it on the aggregate (``expert.jsonl`` or
   ``--dagger-data``, and every round's rows so far). Departure: each round continues from the
   previous round's model, where DAgger retrains from scratch. Each round's model gets the start
   panels (``dagger<R>``); the last is the RL start. With ``--jobs`` > 1 the SFT model's start
   panels run beside the rounds;
3. ``rl``      — for each algorithm and seed, ``serl train`` from the SFT model for
   ``--iterations`` iterations (0: none, the cold start's panels alone), in chunks of
   ``--eval-every``; after each chunk (and at the SFT start) the policy is evaluated on a fixed
   panel: the first ``--panel-per-type`` tasks of each task type of each ``--splits`` split
   (``serl eval --num-tasks``: round-robin over types in listing order, so the same tasks every
   time), sampled at ``rollout.val_temperature`` with the fixed seed ``--eval-seed``; at the start
   ``--compare-model`` (e.g. an older cold start, with ``--compare-override``) plays the same panels;
4. ``report``  — LEARNING.md (machine, commands, wall time per phase, success and valid-action
   ratio mean ± std over seeds at the start and the end, the per-iteration fraction of groups with
   a non-zero advantage) and a PNG plot of panel success vs iteration (mean ± std over seeds).

Run on this repository's CPU scale (see LEARNING.md for the figures it produced)::

    python experiments/learning.py --data-dir ../shared/data/alfworld --workdir runs/learning

Everything the script runs is a ``serl`` command printed before it runs; its outputs stay in
``--workdir`` (``expert.jsonl``, ``sft/``, ``rl/<algo>_s<seed>/``, ``eval/…/metrics.json``,
``phases.json`` with the wall time of each phase).

**ALFWorld RL from the shipped cold start** (LEARNING.md, "RL from the 200-game cold start"):
``--sft-model smollm2-135m-alfworld-sft`` skips the expert and SFT phases; ``--train-pool 200:32``
trains on a fixed pool of the 32 train games that follow the 200 its SFT used in the expert order
(``--data-dir`` must then hold the whole train split, e.g. ALFWorld's train archive unpacked beside
``valid_seen`` and ``valid_unseen``); ``--splits train valid_seen valid_unseen --panel-per-type -1
--panel-decoding greedy`` evaluates the pool and every held-out game of the two types greedily.
``--jobs N`` runs the runs of a chunk (and the start panels) side by side, ``--eval-shards K``
plays each panel as K ``serl eval --shard`` processes and merges them, ``--train-seconds S``
stops each ``serl train`` call after S s and evaluates its last checkpoint (a re-run resumes it)::

    python experiments/learning.py --workdir runs/alfworld_rl --sft-model smollm2-135m-alfworld-sft \
        --data-dir ALFWORLD_DATA --train-pool 200:32 --splits train valid_seen valid_unseen \
        --panel-per-type -1 --panel-decoding greedy --seeds 0 --iterations 10 --eval-every 5 \
        --override rollout.micro_batch_size=16 \
        --train-override data.train_batch_size=4 env.rollout.n=4 actor.lr=3e-5

On a lent GPU the same command runs through ``experiments/learning_gpu.sh`` (its header says what
must travel with the call).

**WebShop** (``--env webshop``; the default is ``alfworld``, above): the same phases in their own
work folder (default ``runs/learning_webshop``) with the recipe ``cpu_learn_webshop``:
``serl data expert webshop`` plays the WebShop oracle on ``--expert-tasks`` train goals (drawn with
``--expert-seed``) and keeps the episodes whose score is at least ``--expert-min-score`` (1.0 = won);
the panel is WebShop test goals ``0 … --panel-size - 1`` (``serl eval --split test --num-tasks k``
takes the first k goals in goal order; their hidden prices are fixed by ``env.webshop.seed``). A
WebShop episode is a success when its purchase scores exactly 1.0; the report also gives the mean
score in [0, 1] (WebShop's own metric, ``webshop_task_score`` of ``serl eval``)::

    python experiments/learning.py --env webshop --workdir runs/learning_webshop \
        --report-md LEARNING_webshop.md --report-png docs/learning_webshop.png

Estimated cost of the WebShop defaults on the 2-core machine of LEARNING.md (idle), scaled by token
counts from the ALFWorld leg (one ``cpu_learn`` iteration ≈ 62 step rows × ≈ 760 tokens ≈ 4.8 min,
i.e. ≈ 6 ms per row token for rollout + update, ≈ 2 ms of it rollout; SFT ≈ 7 ms per token): the
oracle's chat prompts with two history pairs are 1322 tokens on average (5-step episodes ≈ 1380
tokens per row with the reply), so one iteration (2 goals × 4 rollouts) is ≈ 40 rows ≈ 5.5 min when
the policy buys after ≈ 5 steps and up to ≈ 64 rows × 1800 tokens ≈ 12 min when every episode runs to
the 8-step limit; a 12-goal panel evaluation ≈ 3 min (up to 6); the SFT on the ≈ 190 rows of 40 goals
≈ 31 min; the expert rows ≈ 1 min. With 2 algorithms × 3 seeds × 3 iterations and 7 panel
evaluations: ≈ 1 + 31 + 7 × 3.5 + 18 × 7 ≈ 180 min ≈ 3 h (2.5 h if every episode buys early, 4.7 h if
every episode hits the step limit). The report's signal table gives the measured step rows and
prompt tokens per iteration, to check this estimate.

**Math** (``--env math``; recipe ``cpu_math``, work folder ``runs/learning_math``, report
``LEARNING_math.md`` and ``learning_math.png`` in it): GSM8K with a code interpreter (docs/math.md).

1. ``expert`` — ``serl data expert math --split gsm8k:train --num-tasks --expert-tasks --seed
   --expert-seed`` (default all 7,473 problems, drawn in the seed's order) writes
   ``expert_pool.jsonl``; ``expert.jsonl`` is its first ``--expert-rows`` rows (default 1,024; about
   37% of GSM8K's problems give no row: no calculator step, or more than ``env.math.max_turns − 1``);
2. ``sft`` — full fine-tuning (``--lora-r 0``) with :data:`learning_options.MATH_SFT_DEFAULTS`
   (1 epoch, lr 5e-5, 8 rows per step, micro-batches of 4; ``--sft-override`` changes any of them);
   or ``--sft-model DIR`` starts RL from an existing SFT model folder instead (both recorded in
   ``start.json``, which a resumed run checks);
3. ``rl`` — ``grpo`` (the recipe without SPEAR's replay and tool bonus), ``spear`` (the recipe as
   it is) and ``serl`` (``grpo`` + SERL with ``reference_solution`` hindsight), :data:`MATH_ALGOS`,
   for each seed, ``--iterations`` (40) in chunks of ``--eval-every`` (20);
4. the panel: the first ``--panel-size`` (128) problems of each ``--splits`` split (``gsm8k:test``),
   evaluated greedily (``eval/<policy>/it<NNN>_gsm8k-test_greedy``) and with ``--panel-avg-k`` (4)
   sampled answers per problem at ``rollout.val_temperature`` / ``val_top_p`` with ``--eval-seed``
   (``..._avg4``: avg@k = ``acc/mean@4``), for the base model (``--base-eval``, default on), the
   SFT start, and every run at every ``--eval-every`` iterations;
5. ``report`` — :func:`learning_report.write_report`, whose math sections are
   :mod:`learning_math_report` (table, per-step signal, plot, significance tests,
   example trajectories); ``python experiments/learning_report.py --env math --workdir DIR``
   rewrites it from the files of a partial experiment::

    python experiments/learning.py --env math

Its cost on the 2-core machine (docs/math.md, BENCHMARKS.md: ≈ 18.6 SFT-policy trajectories/min
at rollout) is dominated by the panel: one evaluation point is 128 greedy + 128 × 4 sampled
trajectories ≈ 640 / 18.6 ≈ 34 min, so the 2 starts + 3 algorithms × 3 seeds × 2 points = 20
points ≈ 11 h when avg@k runs at every point (``--panel-avg-at every``); the default
``--panel-avg-at ends`` runs it only at iteration 0 and at each run's end, and ``--panel-avg-k 0``
cuts a point to ≈ 7 min (figures of a bf16 CPU; LEARNING.md has those of a float32 AVX2 one). The RL cost is measured per
iteration in the report's signal table (``timing/iteration_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_options import algos_for, panel_labels, parse_args, split_spec  # noqa: E402  (a sibling script: this folder is on sys.path)


class Experiment:
    """The phases of one learning experiment in one work folder (see the module docstring)."""

    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.w = Path(args.workdir).resolve()
        self.w.mkdir(parents=True, exist_ok=True)
        self.phases_file = self.w / "phases.json"
        self.phases = json.loads(self.phases_file.read_text()) if self.phases_file.exists() else {}
        self.lock = threading.Lock()  # phases.json is written by the --jobs threads

    # ------------------------------------------------------------------ plumbing
    def serl(self, *argv: str, seconds: float = 0) -> None:
        """Run one ``serl`` command (printed first); raises ``SystemExit`` with its code on failure.
        ``seconds`` > 0 caps its wall time: then it gets SIGTERM (serl stops cleanly and keeps its
        last complete checkpoint; SIGKILL 120 s later), which is not a failure."""
        cmd = [sys.executable, "-m", "serl.cli", *argv]
        print("+ serl " + " ".join(shlex.quote(x) for x in argv), flush=True)
        proc = subprocess.Popen(cmd)
        try:
            proc.wait(timeout=seconds or None)
        except subprocess.TimeoutExpired:
            print(f"learning.py: `serl {argv[0]}` reached --train-seconds {seconds:g}; stopping it (SIGTERM)", flush=True)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return
        if proc.returncode != 0:
            raise SystemExit(f"learning.py: `serl {argv[0]}` failed with exit code {proc.returncode}")

    def timed(self, name: str, fn) -> None:
        """Run ``fn`` and add its wall time to phase ``name`` in ``phases.json`` (atomically)."""
        t0 = time.perf_counter()
        fn()
        with self.lock:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0
            tmp = self.phases_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.phases, indent=2))
            os.replace(tmp, self.phases_file)

    def side_by_side(self, calls: list) -> None:
        """Run the no-argument callables ``calls``, ``--jobs`` at a time (threads that each wait on
        ``serl`` processes); the first exception is raised once all have ended."""
        if self.a.jobs <= 1:
            for fn in calls:
                fn()
            return
        with ThreadPoolExecutor(self.a.jobs) as pool:
            futures = [pool.submit(fn) for fn in calls]
        for f in futures:
            f.result()

    def base(self) -> list[str]:
        """``model.path=--base-model`` when one is set (math), else nothing (the recipe's model)."""
        return [f"model.path={self.a.base_model}"] if self.a.base_model else []

    def common(self) -> list[str]:
        """Overrides every command shares: the recipe, the data, the model and the user's extras."""
        out = [f"recipe={self.a.recipe}", *self.a.override]
        if self.a.data_dir:
            out.append(f"env.data_dir={Path(self.a.data_dir).resolve()}")
        return out

    # ------------------------------------------------------------------ phases
    def expert(self) -> None:
        out = self.w / "expert.jsonl"
        if out.exists():
            return
        if self.a.expert_file:  # rows made beforehand: the SFT's data as they are
            import shutil

            tmp = out.with_suffix(".tmp")
            shutil.copyfile(self.a.expert_file, tmp)
            os.replace(tmp, out)
            return
        if self.a.env == "math":
            return self.expert_math(out)
        keep = ["--min-score", str(self.a.expert_min_score)] if self.a.env == "webshop" else []
        keep += ["--expert", self.a.expert] if self.a.expert else []
        keep += ["--think", self.a.think] if self.a.expert == "sweep" and self.a.think != "task" else []
        self.timed("expert", lambda: self.serl(
            "data", "expert", self.a.env, *self.common(), "--split", "train", "--num-tasks", str(self.a.expert_tasks),
            "--seed", str(self.a.expert_seed), *keep, "--out", str(out)))

    def expert_math(self, out: Path) -> None:
        """GSM8K train's expert conversations in ``--expert-seed`` order (``expert_pool.jsonl``),
        then their first ``--expert-rows`` rows as ``expert.jsonl`` (written atomically)."""
        pool = self.w / "expert_pool.jsonl"
        if not pool.exists():
            self.timed("expert", lambda: self.serl(
                "data", "expert", "math", *self.common(), "--split", "gsm8k:train",
                "--num-tasks", str(self.a.expert_tasks), "--seed", str(self.a.expert_seed), "--out", str(pool)))
        rows = [x for x in pool.read_text().split("\n") if x.strip()]  # not splitlines(): it cuts rows at a raw U+2028
        keep = rows[: self.a.expert_rows] if self.a.expert_rows else rows
        if not keep:
            raise SystemExit(f"learning.py: {pool} holds no expert row; nothing to fine-tune on")
        if self.a.expert_rows and len(keep) < self.a.expert_rows:
            print(f"learning.py: only {len(keep)} expert rows in {pool} (--expert-rows {self.a.expert_rows}); "
                  "using them all", flush=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n".join(keep) + "\n")
        os.replace(tmp, out)

    def sft(self) -> Path:
        model = self.w / "sft" / "model"
        if (model / "config.json").exists():
            return model
        resume = ["--resume", str(self.w / "sft")] if (self.w / "sft" / "checkpoints").exists() else []
        args = [] if resume else [*self.common(), *self.base(), f"model.lora.r={self.a.lora_r}", *self.a.sft_defaults,
                                  *self.a.sft_override, f"trainer.output_dir={self.w}", "trainer.run_name=sft",
                                  "trainer.overwrite=true"]  # moves aside a folder left by a run killed before its first save
        self.timed("sft", lambda: self.serl("sft", "--data", str(self.w / "expert.jsonl"), *args, *resume))
        return model

    def dagger(self, model: Path) -> Path:
        """``--dagger-rounds`` rounds from ``model`` (module docstring); returns the last round's
        model. Each step of a round is skipped when its output exists, so a re-run resumes."""
        for r in range(1, self.a.dagger_rounds + 1):
            d = self.w / "dagger" / f"r{r}"
            play, rows, data = d / "play", d / "rows.jsonl", d / "data.jsonl"
            if not (play / "trajectories.jsonl").exists():
                self.timed("dagger/play", lambda: self.serl(
                    "eval", *self.common(), f"model.path={model}", "env.alfworld.expert=planner",
                    "rollout.val_temperature=1.0", "rollout.val_n=1", *self.a.dagger_override, "--split", "train",
                    "--num-tasks", str(self.a.dagger_tasks), "--seed", str(self.a.eval_seed + r), "--out", str(play)))
            if not rows.exists():
                keep = ["--keep-won"] if self.a.dagger_keep_won else []
                self.serl("data", "dagger", str(play / "trajectories.jsonl"), "--out", str(rows),
                          "--rows-per-episode", str(self.a.dagger_rows_per_episode), *keep,
                          "--labels", self.a.dagger_labels, "--seed", str(r),
                          *(["--think", self.a.think] if self.a.dagger_labels == "sweep" and self.a.think != "task" else []))
            if not data.exists():  # DAgger's aggregate: the expert rows and every round's rows so far
                parts = [Path(x) for x in (self.a.dagger_data, self.w / "expert.jsonl") if x and Path(x).exists()]
                parts += [self.w / "dagger" / f"r{k}" / "rows.jsonl" for k in range(1, r + 1)]
                tmp = data.with_suffix(".tmp")
                tmp.write_text("".join(p.read_text() for p in parts))
                os.replace(tmp, data)
            new = d / "sft" / "model"
            if not (new / "config.json").exists():
                resume = ["--resume", str(d / "sft")] if (d / "sft" / "checkpoints").exists() else []
                args = [] if resume else [*self.common(), f"model.path={model}", f"model.lora.r={self.a.lora_r}",
                                          *self.a.sft_defaults, *self.a.sft_override, f"trainer.output_dir={d}",
                                          "trainer.run_name=sft", "trainer.overwrite=true"]
                self.timed("dagger/sft", lambda: self.serl("sft", "--data", str(data), *args, *resume))
            model = new
            self.evaluate(f"dagger{r}", 0, [*self.common(), f"model.path={model}"])
        return model

    def start_model(self, model: Path, source: str) -> Path:
        """Record the RL start in ``start.json`` (``{"model", "source"}``; source ``expert+sft`` or
        ``--sft-model``); raises ``SystemExit`` when the work folder already started from another."""
        f = self.w / "start.json"
        rec = {"model": str(model), "source": source}
        if f.exists():
            old = json.loads(f.read_text())
            if old != rec:
                raise SystemExit(f"learning.py: {self.w} started its RL runs from {old['model']} ({old['source']}), "
                                 f"not {model} ({source}); use another --workdir")
            return model
        f.write_text(json.dumps(rec, indent=2) + "\n")
        return model

    def pool_data(self) -> None:
        """``--train-pool SKIP:COUNT`` (ALFWorld): a data folder ``<workdir>/pool_data`` whose train
        split is the COUNT train games that follow the first SKIP in the seeded order of
        ``serl data expert --seed --expert-seed`` (so the games an SFT on that order's first SKIP
        did not see), and whose other ``--splits`` are copies of ``--data-dir``'s, the recipe's
        task types only; ``POOL.txt`` lists the pool. Every later command reads it as
        ``env.data_dir``. Raises ``SystemExit`` when the split holds fewer than SKIP + COUNT games."""
        import shutil

        from serl.configure import load_config
        from serl.envs.base import list_tasks
        from serl.rollout.expert import pick_tasks

        out = self.w / "pool_data"
        if not (out / "POOL.txt").exists():
            skip, count = self.a.train_pool
            cfg = load_config(self.a.recipe, self.common()[1:])  # common() starts with recipe=
            order = pick_tasks(list_tasks(cfg.env, "train"), -1, self.a.expert_seed)
            if len(order) < skip + count:
                raise SystemExit(f"learning.py: --train-pool {skip}:{count}: the train split of {self.a.data_dir} "
                                 f"has {len(order)} games of the recipe's types")
            tmp = self.w / "pool_data.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            json_dir = Path(order[0].task_id).parents[3]  # <data>/json_2.1.1/train/<task>/<trial>/game.tw-pddl
            pool = [Path(t.task_id).parent for t in order[skip: skip + count]]
            for trial in pool:
                shutil.copytree(trial, tmp / "json_2.1.1" / trial.relative_to(json_dir))
            types = tuple(cfg.env.task_types)
            for split in [x for x in self.a.splits if x != "train"]:
                for task in sorted((json_dir / split).iterdir()):
                    if not types or task.name.split("-")[0] in types:
                        shutil.copytree(task, tmp / "json_2.1.1" / split / task.name)
            (tmp / "POOL.txt").write_text("".join(f"{t.relative_to(json_dir / 'train')}\n" for t in pool))
            os.replace(tmp, out)
        self.a.data_dir = str(out)

    def panels(self, iteration: int | None = None) -> list[tuple[str, str, list[str], list[str]]]:
        """The panel evaluations of one policy at ``iteration`` (:func:`learning_options.panel_labels`)
        as ``(folder label, split, overrides, flags)``: math's greedy one runs ``--greedy``, its avg@k
        one ``rollout.val_n=k``."""
        out = []
        for label, spec, mode in panel_labels(self.a, iteration):
            split, steps = split_spec(spec)
            few = [f"env.train_split={split}", f"env.math.max_solution_steps={steps}"] if steps else []
            if mode == "greedy":
                out.append((label, split, few, ["--greedy"]))
            elif mode.startswith("avg"):
                out.append((label, split, [*few, f"rollout.val_n={mode[3:]}"], []))
            else:
                out.append((label, split, few, []))
        return out

    def evaluate(self, name: str, iteration: int, source: list[str]) -> None:
        """Panel evaluation of one policy at one iteration, on every panel (skipped if done)."""
        if self.a.env == "alfworld":
            n = -1 if self.a.panel_per_type < 0 else self.a.panel_per_type * self.num_types()
        else:
            n = self.a.panel_size
        calls = []
        for label, split, extra, flags in self.panels(iteration):
            out = self.w / "eval" / name / f"it{iteration:03d}_{label}"
            if (out / "metrics.json").exists():
                continue
            k = -1 if any(x.startswith("env.math.max_solution_steps=") for x in extra) else n  # NAME@K: all
            argv = ["eval", *source, *extra, "--split", split, "--num-tasks", str(k), *flags,
                    "--seed", str(self.a.eval_seed), "--out", str(out)]
            play = (lambda argv=argv: self.serl(*argv)) if self.a.eval_shards <= 1 else \
                (lambda argv=argv, out=out: self.sharded_eval(argv, out))
            calls.append(lambda play=play: self.timed("eval", play))
        self.side_by_side(calls)  # with --jobs, a policy's panels side by side too

    def sharded_eval(self, argv: list[str], out: Path) -> None:
        """One panel (``argv`` ends ``--out out``) as ``--eval-shards`` K ``serl eval --shard i/K``
        processes side by side into ``out/shards/i`` (a finished part is skipped, a stopped one
        resumes from its journal), then ``serl eval --merge`` of the K parts into ``out``."""
        k, head = self.a.eval_shards, argv[: argv.index("--out")]
        parts = [out / "shards" / str(i) for i in range(k)]
        todo = [(i, d) for i, d in enumerate(parts) if not (d / "metrics.json").exists()]
        with ThreadPoolExecutor(k) as pool:
            futures = [pool.submit(self.serl, *head, "--shard", f"{i}/{k}", "--out", str(d)) for i, d in todo]
        for f in futures:
            f.result()
        self.serl("eval", "--merge", *map(str, parts), "--out", str(out))

    def num_types(self) -> int:
        from serl.configure import load_config

        cfg = load_config(self.a.recipe, [x for x in self.a.override])
        return len(cfg.env.task_types) or 6

    def start_panels(self, sft: Path) -> list:
        """The start panels' calls: the base model (``--base-eval``), the SFT model ``sft`` and
        ``--compare-model`` (each skipped when done)."""
        starts = [lambda: self.evaluate("sft", 0, [*self.common(), f"model.path={sft}"])]
        if self.a.base_eval:
            starts.insert(0, lambda: self.evaluate("base", 0, [*self.common(), *self.base()]))
        if self.a.compare_model:
            starts.append(lambda: self.evaluate("compare", 0, [*self.common(), f"model.path={self.a.compare_model}",
                                                              *self.a.compare_override]))
        return starts

    def rl(self, model: Path, sft: Path) -> None:
        """Seed by seed, chunk by chunk, the algorithms side by side, so that an interrupted
        experiment has comparable points of every algorithm for every finished (seed, chunk).
        RL starts from ``model``; ``sft`` (the same but after DAgger rounds) gets the start panels."""
        starts = self.start_panels(sft)
        chunks = [(seed, target) for seed in self.a.seeds
                  for target in range(self.a.eval_every, self.a.iterations + 1, self.a.eval_every)]
        if self.a.jobs <= 1:
            self.side_by_side(starts)
            for seed, target in chunks:
                for algo in self.a.algos:
                    self.rl_chunk(algo, seed, target, model)
            return
        # --jobs: the start panels beside the first runs, then each (seed, chunk)'s runs side by side,
        # and with as many jobs as runs, every seed of a chunk at once
        targets = sorted({t for _, t in chunks})
        if not targets:  # --iterations 0: the start panels alone
            self.side_by_side(starts)
        for i, target in enumerate(targets):
            runs = [lambda a=algo, s=seed, t=target: self.rl_chunk(a, s, t, model)
                    for seed in self.a.seeds for algo in self.a.algos]
            self.side_by_side((starts if i == 0 else []) + runs)

    def rl_chunk(self, algo: str, seed: int, target: int, model: Path) -> None:
        """Train ``<algo>_s<seed>`` up to iteration ``target`` (resuming it), then evaluate it."""
        name = f"{algo}_s{seed}"
        run = self.w / "rl" / name
        last = self.panels(target)[-1][0]
        if not (self.w / "eval" / name / f"it{target:03d}_{last}" / "metrics.json").exists():
            steps = f"trainer.total_training_steps={target}"
            cap = self.a.train_seconds
            if (run / "checkpoints").exists():
                self.timed(f"rl/{algo}", lambda: self.serl("train", "--resume", str(run), steps, seconds=cap))
            else:  # a new run; trainer.overwrite moves aside a folder left by a run killed before its first save
                self.timed(f"rl/{algo}", lambda: self.serl(
                    "train", *self.common(), *algos_for(self.a.env)[algo], f"model.path={model}", f"seed={seed}",
                    f"trainer.output_dir={self.w / 'rl'}", f"trainer.run_name={name}", steps,
                    "trainer.max_checkpoints_to_keep=1", "trainer.overwrite=true", *self.a.train_override,
                    seconds=cap))
            target = self.reached(run, target)
            if not target:
                print(f"learning.py: {run} saved no checkpoint in --train-seconds {self.a.train_seconds:g}; "
                      "no panel for it (a re-run resumes it)", flush=True)
                return
        self.evaluate(name, target, ["--run", str(run)])

    @staticmethod
    def reached(run: Path, target: int) -> int:
        """The iteration of ``run``'s latest checkpoint (``target`` when it got there; fewer when
        ``--train-seconds`` stopped it first; 0 when it saved none)."""
        from serl.train.checkpoint import checkpoint_iteration, list_checkpoints

        done = [i for i in (checkpoint_iteration(c) for c in list_checkpoints(run)) if i is not None]
        return min(max(done, default=0), target)

    def run(self) -> None:
        from tqdm.auto import tqdm

        todo = ["expert", "sft", "dagger", "rl", "report"]
        with tqdm(todo, desc="learning", unit="phase", file=sys.stderr) as bar:
            model = sft = None
            source = ""
            for phase in bar:
                bar.set_postfix_str(phase)
                if phase == "expert" and not self.a.sft_model:
                    self.expert()
                elif phase == "sft":
                    if self.a.sft_model:
                        model = Path(self.a.sft_model).resolve()
                        if not model.exists() and "/" not in self.a.sft_model:  # a serl model name
                            from serl.models.loading import resolve_model_path

                            model = Path(resolve_model_path(self.a.sft_model)).resolve()
                        if not (model / "config.json").exists():
                            raise SystemExit(f"learning.py: --sft-model {self.a.sft_model}: no config.json there "
                                             "(a Hugging Face model folder, e.g. <sft run>/model, or a serl "
                                             "model name such as smollm2-135m-alfworld-sft)")
                        source = "--sft-model"
                    else:
                        model, source = self.sft(), "expert+sft"
                    sft = model
                elif phase == "dagger" and self.a.dagger_rounds:
                    # with --jobs, the start panels (which do not depend on the rounds) beside them
                    last: list[Path] = []
                    beside = self.start_panels(sft) if self.a.jobs > 1 else []
                    self.side_by_side([lambda: last.append(self.dagger(sft)), *beside])
                    model = last[0]
                    source += f"+dagger{self.a.dagger_rounds}"
                elif phase == "rl":
                    self.start_model(model, source)
                    if self.a.train_pool:
                        self.pool_data()
                    self.rl(model, sft)
                elif phase == "report":
                    from learning_report import write_report

                    from serl.utils import cpu_model

                    write_report(self.w, self.a, self.phases, cpu_model())


def main(argv: list[str] | None = None) -> int:
    Experiment(parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
