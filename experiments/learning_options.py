"""The command line of the learning experiment, shared by ``experiments/learning.py``,
``experiments/learning_report.py`` and ``experiments/learning_math_report.py``.

Holds the options (:func:`parse_args`, with the per-env defaults :data:`ENV_DEFAULTS`) and the
algorithms compared per env (:data:`ALGOS` for ALFWorld / WebShop, :data:`MATH_ALGOS` for math;
:func:`algos_for`). ``learning.py`` runs the experiment with them and the report scripts rewrite
the report of a work folder from the same options, so all import this module and none imports
another's command line. Not here: running the phases (``learning.py``) and writing the report /
the plot (``learning_report.py``, with the math leg's sections in ``learning_math_report.py`` and
the shared statistics in ``learning_stats.py``). Imports nothing but the standard
library.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

#: the ``--help`` description (the first line of ``learning.py``'s docstring)
DESCRIPTION = "Does serl learn? Expert cold start, then GRPO vs SERL from the same SFT checkpoint, on real games."

#: ALFWorld / WebShop: the algorithms compared, name -> overrides on top of the recipe
ALGOS = {
    "grpo": ["algorithm.serl.enable=false"],
    "serl": ["algorithm.serl.enable=true", "algorithm.serl.sampling_mode=immediate_feedback"],
    "serl_anchor": ["algorithm.serl.enable=true", "algorithm.serl.sampling_mode=anchor_immediate_feedback"],
}

#: math (recipe ``cpu_math``: Dr.BoT + SPEAR's self-imitation replay + the cosine tool-call bonus,
#: arXiv 2509.22601): ``grpo`` is the recipe with the replay and the tool bonus off (the same
#: Dr.BoT loss and filters), ``spear`` the recipe as it is, ``serl`` the ``grpo`` settings plus
#: SERL's teacher shown the data set's reference solution (docs/math.md, "SERL on math")
_MATH_GRPO = ["algorithm.spear.enable_trajectory_replay=false", "algorithm.use_toolcall_reward=none",
              "algorithm.serl.enable=false"]
MATH_ALGOS = {
    "grpo": _MATH_GRPO,
    "spear": ["algorithm.serl.enable=false"],
    "serl": [*_MATH_GRPO[:-1], "algorithm.serl.enable=true", "algorithm.serl.sampling_mode=reference_solution"],
    # ``grpo`` with DAPO's dynamic sampling (arXiv 2503.14476): new batches of problems until the
    # batch holds data.train_batch_size groups with a right and a wrong answer (DAPO's ``acc``)
    "grpo_ds": [*_MATH_GRPO, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=won"],
}

#: the math SFT measured in docs/math.md (full fine-tuning, 1 epoch, lr 5e-5, 8 rows per optimizer
#: step in micro-batches of 4; bf16 autocast comes from ``model.train_dtype=auto`` on a CPU with
#: AVX512-BF16/AMX). Put before ``--sft-override``, so a user's key of the same name wins.
MATH_SFT_DEFAULTS = ["sft.epochs=1", "sft.lr=5e-5", "sft.batch_size=8", "sft.micro_batch_size=4"]

#: per env, the defaults of the options left unset (the ALFWorld ones are the script's original defaults)
ENV_DEFAULTS = {
    "alfworld": {"workdir": "runs/learning", "recipe": "cpu_learn", "expert_tasks": 60, "iterations": 10,
                 "eval_every": 5, "splits": ["valid_seen", "valid_unseen"], "algos": ["grpo", "serl"],
                 "lora_r": 8, "panel_size": 12, "base_eval": False, "sft_defaults": [], "base_model": ""},
    "webshop": {"workdir": "runs/learning_webshop", "recipe": "cpu_learn_webshop", "expert_tasks": 40,
                "iterations": 3, "eval_every": 3, "splits": ["test"], "algos": ["grpo", "serl"],
                "lora_r": 8, "panel_size": 12, "base_eval": False, "sft_defaults": [], "base_model": ""},
    "math": {"workdir": "runs/learning_math", "recipe": "cpu_math", "expert_tasks": -1, "expert_rows": 1024,
             "iterations": 40, "eval_every": 20, "splits": ["gsm8k:test"], "algos": ["grpo", "spear", "serl"],
             "lora_r": 0, "panel_size": 128, "base_eval": True, "sft_defaults": MATH_SFT_DEFAULTS,
             "base_model": "smollm2-135m-instruct"},  # cpu_math's own default is the shipped math SFT
}


def algos_for(env: str) -> dict[str, list[str]]:
    """The algorithm table of leg ``env``: :data:`MATH_ALGOS` for ``math``, else :data:`ALGOS`.

    Raises:
        KeyError: ``env`` is not a leg of :data:`ENV_DEFAULTS`.
    """
    if env not in ENV_DEFAULTS:
        raise KeyError(f"learning: unknown env {env!r}; legs: {sorted(ENV_DEFAULTS)}")
    return MATH_ALGOS if env == "math" else ALGOS


def split_spec(split: str) -> tuple[str, int]:
    """A math panel split ``NAME`` or ``NAME@K`` as ``(NAME, K)``: ``gsm8k:test@2`` is every problem of
    ``gsm8k:test`` whose worked solution has at most 2 calculator steps (440 problems; ``serl eval``
    with ``env.train_split=NAME env.math.max_solution_steps=K``, the filter ``serl train`` applies to
    its train split), whatever ``--panel-size``; K = 0 for a plain split (its first ``--panel-size``).

    Raises:
        ValueError: K is not an integer >= 1.
    """
    name, at, k = split.partition("@")
    if not at:
        return split, 0
    if not k.isdigit() or int(k) < 1:
        raise ValueError(f"panel split {split!r}: the part after @ must be a step count >= 1")
    return name, int(k)


def split_label(split: str) -> str:
    """The folder label of a panel split: ``gsm8k:test`` -> ``gsm8k-test``, ``gsm8k:test@2`` ->
    ``gsm8k-test-le2``."""
    return split.replace(":", "-").replace("@", "-le")


def split_description(split: str, panel_size: int) -> str:
    """In words: ``the first 128 problems of gsm8k:test`` or ``every problem of gsm8k:test with at
    most 2 calculator steps`` (:func:`split_spec`)."""
    name, k = split_spec(split)
    return f"every problem of {name} with at most {k} calculator step{'s' if k > 1 else ''}" if k else \
        f"the first {panel_size} problems of {name}"


def command_line(argv: list[str] | None = None) -> str:
    """The command that wrote a report, as a user re-runs it: ``python experiments/<script> <args>``,
    the script that ran (``learning.py``, or ``learning_report.py`` rewriting a report) with its
    own arguments, shell-quoted (``argv``: default ``sys.argv``)."""
    argv = sys.argv if argv is None else argv
    return f"python experiments/{Path(argv[0]).name} {shlex.join(argv[1:])}"


def panel_labels(args: argparse.Namespace, iteration: int | None = None) -> list[tuple[str, str, str]]:
    """The panel evaluations of one policy: ``(folder label, split, mode)``. ALFWorld / WebShop:
    one evaluation per split, labelled by the split, with mode ``--panel-decoding`` (``sampled``
    at ``rollout.val_temperature``, or ``greedy``); math: per split a
    greedy one (``<split>_greedy``, ``:`` written ``-``; mode ``greedy``) and, with
    ``--panel-avg-k k`` > 0, one with k sampled answers per problem (``<split>_avg<k>``; mode
    ``avg<k>``) — at every evaluation point, or with ``--panel-avg-at ends`` only at ``iteration``
    0 (base, SFT start) and ``--iterations`` (each run's end); ``iteration=None`` lists every label.
    The folder of a policy's evaluation at iteration i is ``eval/<policy>/it<iii>_<label>``."""
    if args.env != "math":
        return [(s, s, args.panel_decoding) for s in args.splits]
    out = []
    ends = iteration is None or args.panel_avg_at == "every" or iteration in (0, args.iterations)
    for s in args.splits:
        out.append((f"{split_label(s)}_greedy", s, "greedy"))
        if args.panel_avg_k and ends:
            out.append((f"{split_label(s)}_avg{args.panel_avg_k}", s, f"avg{args.panel_avg_k}"))
    return out


def _pool(text: str) -> tuple[int, int]:
    """``SKIP:COUNT`` of ``--train-pool`` as two ints (SKIP >= 0, COUNT >= 1)."""
    try:
        skip, count = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SKIP:COUNT, e.g. 200:32; got {text!r}") from None
    if skip < 0 or count < 1:
        raise argparse.ArgumentTypeError(f"SKIP must be >= 0 and COUNT >= 1; got {text!r}")
    return skip, count


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of ``learning.py`` / ``learning_report.py`` (``argv``: default ``sys.argv[1:]``),
    the options left unset filled from :data:`ENV_DEFAULTS` for ``--env``; ``sft_defaults`` (not an
    option) holds the env's SFT overrides that go before ``--sft-override``."""
    # a leg is a file of options: `learning.py @experiments/legs/NAME.args` (shell words, # comments);
    # options after it add to its --*-override lists or override its other options
    p = argparse.ArgumentParser(description=DESCRIPTION, fromfile_prefix_chars="@")
    p.convert_arg_line_to_args = lambda line: [] if line.lstrip().startswith("#") else shlex.split(line)
    p.add_argument("--env", default="alfworld", choices=sorted(ENV_DEFAULTS),
                   help="which leg; sets the defaults of --workdir --recipe --expert-tasks --iterations "
                        "--eval-every --splits --algos --lora-r --panel-size --base-eval (ENV_DEFAULTS)")
    p.add_argument("--workdir", help="default: runs/learning (alfworld), runs/learning_webshop (webshop), "
                                     "runs/learning_math (math)")
    p.add_argument("--data-dir", help="env.data_dir (ALFWorld json_2.1.1/... or WebShop data); default: the "
                                      "recipe's / the data shipped with serl")
    p.add_argument("--recipe", help="default: cpu_learn (alfworld), cpu_learn_webshop (webshop), cpu_math (math)")
    p.add_argument("--expert-tasks", type=int,
                   help="expert train tasks drawn with --expert-seed; default 60 (alfworld), 40 (webshop), "
                        "-1 = all of GSM8K train (math)")
    p.add_argument("--expert-rows", type=int,
                   help="math: the SFT set is the first N expert rows in --expert-seed order (problems whose "
                        "solution has no or too many calculator steps give no row); default 1024, 0 = all")
    p.add_argument("--expert-file", help="expert rows made beforehand (`serl data expert --out`, e.g. in shards on "
                   "another machine): copied to the work folder's expert.jsonl, the SFT's data, instead of running "
                   "the expert phase")
    p.add_argument("--expert", choices=["walkthrough", "planner", "search", "sweep"],
                   help="alfworld: which expert plays the expert phase's games (`serl data expert --expert`); "
                        "default the walkthroughs")
    p.add_argument("--think", choices=["task", "state"], default="task",
                   help="alfworld, the sweep's replies (--expert sweep, --dagger-labels sweep): `serl data expert "
                        "--think` / `serl data dagger --think`; state: the reasoning names what the agent sees")
    p.add_argument("--expert-seed", type=int, default=0)
    p.add_argument("--expert-min-score", type=float, default=1.0,
                   help="webshop: keep oracle episodes whose score is at least this (1.0 = won)")
    p.add_argument("--sft-model", help="an SFT model folder (config.json inside), or a serl model name such as "
                                       "smollm2-135m-alfworld-sft (the shipped cold start), to start RL from "
                                       "instead of running the expert and sft phases; recorded in the report")
    p.add_argument("--lora-r", type=int, help="LoRA rank of the SFT (0 = full fine-tuning); default 8, math 0")
    p.add_argument("--algos", nargs="+", help="default grpo serl (alfworld, webshop: choices "
                   f"{sorted(ALGOS)}); grpo spear serl (math: choices {sorted(MATH_ALGOS)})")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, help="RL iterations per run; default 10 (alfworld), 3 (webshop), 40 (math); "
                   "0: no RL, the cold start alone (expert, SFT and the SFT start's panels)")
    p.add_argument("--eval-every", type=int, help="panel evaluation every this many iterations; default 5 / 3 / 20")
    p.add_argument("--panel-per-type", type=int, default=4,
                   help="alfworld: panel tasks per task type and split; -1 = every task of the split")
    p.add_argument("--panel-decoding", choices=["sampled", "greedy"], default="sampled",
                   help="alfworld, webshop: the panel sampled at rollout.val_temperature with --eval-seed "
                        "(default) or greedy (math's panel has both, see --panel-avg-k)")
    p.add_argument("--train-pool", type=_pool, default=None, metavar="SKIP:COUNT",
                   help="alfworld: train on a fixed pool, the COUNT train games after the first SKIP of the "
                        "seeded order of `serl data expert --seed --expert-seed` (e.g. 200:32 after an SFT on "
                        "that order's first 200); --data-dir must hold the whole train split")
    p.add_argument("--jobs", type=int, default=1,
                   help="run up to this many serl commands side by side: the RL runs of each chunk (every "
                        "algorithm and seed) and the start panels (one GPU holds several small runs)")
    p.add_argument("--eval-shards", type=int, default=1,
                   help="play each panel as this many `serl eval --shard I/N` processes side by side, then "
                        "`serl eval --merge` them (one GPU is idle between one process's turns); each part resumes")
    p.add_argument("--train-seconds", type=float, default=0,
                   help="cap each serl train call (one chunk of one run) at this wall time: SIGTERM, then the "
                        "panel of its last complete checkpoint, labelled with that iteration; 0 = no cap. A "
                        "re-run resumes the run towards the chunk's iteration")
    p.add_argument("--panel-size", type=int, help="webshop: the panel is test goals 0..N-1 (default 12); math: "
                                                  "the first N problems of each --splits split (default 128)")
    p.add_argument("--panel-avg-k", type=int, default=4,
                   help="math: also evaluate the panel with k sampled answers per problem (rollout.val_n=k; "
                        "avg@k and pass@k); 0 = greedy only")
    p.add_argument("--panel-avg-at", choices=["every", "ends"], default="ends",
                   help="math: the avg@k panel at every evaluation point, or only at the start (base, SFT) "
                        "and at each run's last iteration (default; greedy stays at every point)")
    p.add_argument("--base-model", help="model.path of the SFT's start and of the base evaluation; default: the "
                                        "recipe's (alfworld, webshop), smollm2-135m-instruct (math, whose recipe "
                                        "starts from the shipped math SFT)")
    p.add_argument("--base-eval", action=argparse.BooleanOptionalAction, default=None,
                   help="also evaluate the base model (--base-model, else the recipe's) on the panel (default: on for math)")
    p.add_argument("--splits", nargs="+", help="panel splits; default valid_seen valid_unseen (alfworld), test "
                                               "(webshop), gsm8k:test (math)")
    p.add_argument("--compare-model", help="model.path of another policy evaluated on the same start panels (policy "
                   "label `compare`), e.g. an older cold start, for a paired comparison with the SFT start")
    p.add_argument("--compare-override", nargs="*", action="extend", default=[],
                   help="key=value for the --compare-model panels only (after --override), e.g. env.prompt_layout=step")
    p.add_argument("--dagger-rounds", type=int, default=0,
                   help="alfworld: DAgger rounds after the SFT (or --sft-model): the policy plays --dagger-tasks "
                        "train games at T = 1 with the planner asked at every state, `serl data dagger` makes rows "
                        "of the states it got wrong, and serl sft fine-tunes it on every round's rows so far (with "
                        "expert.jsonl or --dagger-data); each round's model gets the start panels (policy dagger<R>) "
                        "and the last one is the RL start. Default 0: none")
    p.add_argument("--dagger-tasks", type=int, default=120, help="alfworld: train games each DAgger round plays "
                   "(serl eval --split train --num-tasks N: round-robin over the task types)")
    p.add_argument("--dagger-rows-per-episode", type=int, default=2,
                   help="serl data dagger --rows-per-episode: wrong states kept per episode (the first always)")
    p.add_argument("--dagger-labels", choices=["all", "seen", "search", "sweep"], default="all",
                   help="serl data dagger --labels: all wrong states, seen: not the searches that only the "
                        "omniscient planner calls wrong, search: as seen, with a search's label where the "
                        "planner's is a guess, sweep: as search, the sweep expert's label")
    p.add_argument("--dagger-keep-won", action="store_true",
                   help="serl data dagger --keep-won: also train on each won episode whole")
    p.add_argument("--dagger-data", help="rows added to every DAgger round's SFT data besides the work folder's "
                   "expert.jsonl (e.g. the expert rows of the --sft-model cold start)")
    p.add_argument("--dagger-override", nargs="*", action="extend", default=[],
                   help="key=value for the DAgger rounds' play only (after --override), e.g. env.max_steps=20")
    p.add_argument("--eval-seed", type=int, default=1000)
    p.add_argument("--smooth-window", type=int, default=5,
                   help="math report: moving-average window (iterations) of the training-accuracy curve and "
                        "the block size of the per-step signal table")
    p.add_argument("--report-md", help="where the report goes (default: LEARNING.md in --workdir; math: LEARNING_math.md)")
    p.add_argument("--report-png", help="where the plot goes (default: learning.png in --workdir; math: learning_math.png)")
    p.add_argument("--override", nargs="*", action="extend", default=[], help="key=value for every serl command")
    p.add_argument("--sft-override", nargs="*", action="extend", default=[], help="key=value for serl sft only (after the env's "
                                                                  "defaults: math " + " ".join(MATH_SFT_DEFAULTS) + ")")
    p.add_argument("--train-override", nargs="*", action="extend", default=[], help="key=value for serl train only")
    a = p.parse_args(argv)
    for k, v in ENV_DEFAULTS[a.env].items():
        if getattr(a, k, None) is None:
            setattr(a, k, list(v) if isinstance(v, list) else v)
    table = algos_for(a.env)
    unknown = [x for x in a.algos if x not in table]
    if unknown:
        p.error(f"--algos {unknown}: not an algorithm of --env {a.env}; choose from {sorted(table)}")
    if a.panel_size < 1 or a.panel_per_type == 0 or a.panel_per_type < -1:
        p.error("--panel-size must be >= 1 and --panel-per-type >= 1 (or -1: every task)")
    for split in a.splits:
        try:
            if split_spec(split)[1] and a.env != "math":
                p.error(f"--splits {split}: NAME@K (at most K solution steps) is for --env math")
        except ValueError as e:
            p.error(str(e))
    if a.train_pool and (a.env != "alfworld" or not a.data_dir):
        p.error("--train-pool is for --env alfworld with a --data-dir that holds the whole train split")
    if a.jobs < 1 or a.train_seconds < 0 or a.eval_shards < 1:
        p.error("--jobs and --eval-shards must be >= 1 and --train-seconds >= 0")
    if a.panel_avg_k < 0 or a.panel_avg_k == 1:
        p.error("--panel-avg-k must be 0 (off) or >= 2 (avg@k needs k samples per problem)")
    if a.expert_rows is not None and a.env != "math":
        p.error("--expert-rows is for --env math (ALFWorld / WebShop keep every row of the kept episodes)")
    if a.expert_rows is not None and a.expert_rows < 0:
        p.error("--expert-rows must be >= 0 (0 = every expert row)")
    if a.expert_tasks == 0 or a.expert_tasks < -1:
        p.error("--expert-tasks must be >= 1 (or -1 for the whole split)")
    if a.smooth_window < 1:
        p.error("--smooth-window must be >= 1")
    if not 0.0 <= a.expert_min_score <= 1.0:
        p.error("--expert-min-score must be in [0, 1]")
    if a.iterations < 0 or a.eval_every < 1 or a.iterations % a.eval_every:
        p.error("--iterations must be a multiple of --eval-every (0: no RL)")
    if a.expert_file and not Path(a.expert_file).is_file():
        p.error(f"--expert-file {a.expert_file}: no such file")
    if a.dagger_rounds < 0 or a.dagger_tasks < 1 or a.dagger_rows_per_episode < 0:
        p.error("--dagger-rounds and --dagger-rows-per-episode must be >= 0, --dagger-tasks >= 1")
    if a.dagger_rounds and a.env != "alfworld":
        p.error("--dagger-rounds is for --env alfworld (its planner labels the states)")
    if a.dagger_data and not Path(a.dagger_data).is_file():
        p.error(f"--dagger-data {a.dagger_data}: no such file")
    if a.expert and (a.env != "alfworld" or a.expert_file or a.sft_model):
        p.error("--expert is for --env alfworld's expert phase (not with --expert-file or --sft-model)")
    if a.think != "task" and a.expert != "sweep" and a.dagger_labels != "sweep":
        p.error("--think state is for the sweep: --expert sweep or --dagger-labels sweep")
    if a.expert_file and a.sft_model:
        p.error("--expert-file and --sft-model exclude each other (--sft-model skips the expert and SFT phases)")
    return a
