"""``serl data``: ``download`` (full data sets), ``expert`` (expert rows for ``serl sft``) and
``dagger`` (rows from the policy's own ALFWorld episodes, labelled by the planner).

    serl data download {alfworld,dapo_math17k} [--dest DIR]
    serl data expert {alfworld,webshop} [recipe=NAME] [key=value ...] --out FILE.jsonl [--split S]
               [--num-tasks N] [--seed N] [--shard I/N] [--data-dir DIR] [--min-score X] [--max-steps N]
               [--expert walkthrough|planner|search|sweep] [--think task|state] [--detours P]   (alfworld)
    serl data expert math [recipe=NAME] [key=value ...] --out FILE.jsonl [--split train|test]
               [--num-tasks N] [--seed N] [--data-dir DIR]
    serl data dagger TRAJECTORIES.jsonl... --out FILE.jsonl [--rows-per-episode K] [--keep-won] [--labels all|seen|search|sweep] [--think task|state] [--seed N]

The ``expert`` command of ALFWorld and WebShop resumes: each finished episode is appended to
``FILE.jsonl.partial`` as it ends, and a rerun of the same command skips the tasks found there
(:mod:`serl.rollout.expert_journal`); ``FILE.jsonl`` is written, in task order, once every task
has been played.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def split_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    """``recipe=NAME`` (or None) and the other ``key=value`` items of a command line."""
    recipe, rest = None, []
    for it in items:
        if it.startswith("recipe="):
            recipe = it.split("=", 1)[1]
        else:
            rest.append(it)
    return recipe, rest


def data_dir_override(args: argparse.Namespace) -> list[str]:
    """``[env.data_dir=DIR]`` for ``--data-dir DIR``, else nothing."""
    return [f"env.data_dir={args.data_dir}"] if args.data_dir else []


def cmd_data(args: argparse.Namespace) -> int:
    """``serl data download NAME``: ALFWorld's games, or the full DAPO-Math-17k (math)."""
    if args.name == "dapo_math17k":
        from serl.envs.math.download import main_download as download_dapo

        return download_dapo(args.dest)
    from serl.data.download import main_download

    return main_download(args.name, args.dest)


def _data_expert_math(args) -> int:
    """``serl data expert math``: GSM8K's annotated solutions as multi-turn tool-use SFT rows
    (:mod:`serl.envs.math.expert`), one JSON line per problem: ``{"messages": [...], "tools":
    [CODE_INTERPRETER_SCHEMA], "uid": problem uid, "env": "math"}``. The prompt style, tool-output
    rendering and tool-call limit (``env.math.max_turns - 1``) are the recipe's (default ``cpu_math``)."""
    import time

    from tqdm.auto import tqdm

    from serl.agent.tool_calls import CODE_INTERPRETER_SCHEMA
    from serl.agent.tool_chat import render_sft_conversation
    from serl.config import RECIPE_DIR
    from serl.configure import load_config
    from serl.envs.math.data import load_problems
    from serl.envs.math.env import sandbox_from_config
    from serl.envs.math.expert import SKIP_REASONS, ExpertOptions, expert_conversations
    from serl.envs.math.options import math_options
    from serl.errors import ConfigError
    from serl.models.loading import load_tokenizer, resolve_model_path
    from serl.rollout.expert import pick_tasks, write_rows

    recipe, overrides = split_overrides(args.overrides)
    if recipe is None and not (RECIPE_DIR / "cpu_math.yaml").is_file():
        raise ConfigError("serl data expert math: the default recipe cpu_math is not installed; "
                          "pass recipe=<a recipe with env.name=math>")
    cfg = load_config(recipe or "cpu_math", overrides + data_dir_override(args))
    if cfg.env.name != "math":
        raise ConfigError(f"serl data expert math: the recipe's env.name is {cfg.env.name!r}; use a math recipe")
    if args.shard is not None:
        raise ConfigError("serl data expert math: --shard is for alfworld/webshop (math rows take seconds per "
                          "thousand problems)")
    if args.min_score is not None or args.max_steps is not None:
        raise ConfigError("serl data expert math: --min-score and --max-steps are for alfworld/webshop; every kept "
                          "math row is correct, and its tool calls are limited by env.math.max_turns - 1")
    if args.num_tasks == 0 or args.num_tasks < -1:
        raise ConfigError(f"--num-tasks must be >= 1 (or -1 for the whole split), got {args.num_tasks}")
    dataset, _, part = args.split.rpartition(":")
    if dataset not in ("", "gsm8k") or part not in ("train", "test"):
        raise ConfigError(f"serl data expert math --split: train, test, gsm8k:train or gsm8k:test (expert rows "
                          f"come from GSM8K's annotated solutions), got {args.split!r}")
    problems = pick_tasks(load_problems("gsm8k", part, cfg.env.data_dir), args.num_tasks, args.seed)
    options = ExpertOptions.from_math_options(math_options(cfg.env))
    tok = load_tokenizer(resolve_model_path(cfg.model.path, cfg.model.gguf_file))
    sandbox = sandbox_from_config(cfg.env)
    t0 = time.perf_counter()
    try:
        with tqdm(total=len(problems), desc="serl data expert math", unit="problem", file=sys.stderr,
                  dynamic_ncols=True) as bar:
            def on_problem(stats):
                bar.update(1)
                bar.set_postfix_str(f"kept {stats.kept}/{stats.seen}", refresh=False)

            kept, stats = expert_conversations(problems, sandbox, options, on_problem=on_problem)
    finally:
        sandbox.close()
    wall = time.perf_counter() - t0
    tools = [CODE_INTERPRETER_SCHEMA]
    rows = [{"messages": r.messages, "tools": tools, "uid": r.uid, "env": "math"} for r in kept]
    write_rows(args.out, rows)
    lengths = []  # (total, prompt) tokens of each row as `serl sft` renders it
    for r in rows:
        _, mask = render_sft_conversation(tok, r["messages"], tools)
        lengths.append((len(mask), mask.index(1)))
    budget = cfg.data.max_prompt_length + cfg.data.max_response_length
    s = stats.as_dict()
    print(f"\nserl data expert: math gsm8k:{part}, {s['seen']} problems (seed {args.seed}) in {wall:.1f} s")
    print(f"  kept {s['kept']} rows; skipped " + ", ".join(f"{k} {s['skipped'][k]}" for k in SKIP_REASONS)
          + f" (max_tool_calls={options.max_tool_calls}, min_tool_calls={options.min_tool_calls})")
    for reason, examples in stats.examples.items():
        print(f"    e.g. {reason}: " + "; ".join(examples))
    print("  tool calls per row: " + ", ".join(f"{k}: {v}" for k, v in s["calls_per_row"].items()))
    if lengths:
        longest = max(lengths)
        print(f"  longest row: {longest[0]} tokens (prompt {longest[1]}) vs data.max_prompt_length + "
              f"max_response_length = {budget}; {sum(n > budget for n, _ in lengths)} rows longer (serl sft cuts them)")
        print(f"  longest prompt: {max(p for _, p in lengths)} tokens (data.max_prompt_length="
              f"{cfg.data.max_prompt_length})")
    print(f"  written to {args.out}")
    return 0


def _or(names) -> str:
    """``a, b or c``."""
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def check_expert_flags(args) -> None:
    """``--expert``, ``--detours`` and ``--think`` of ``serl data expert`` against the experts of the
    env class of ``args.env`` (its ``expert_names`` and ``expert_options``,
    :class:`serl.envs.base.BaseTextEnv`); a refusal names the envs whose experts take the flag
    (:func:`serl.envs.base.expert_envs`).

    Raises:
        ConfigError: an ``--expert`` the env has not, ``--detours`` for an expert that takes none or
            outside (0, 1], ``--think`` other than ``task`` for an expert that takes none.
    """
    from serl.envs.base import expert_envs, get_env_class
    from serl.errors import ConfigError

    def owners(option: str, tail: str) -> str:
        """``alfworld's walkthrough`` + ``tail``: the experts that take ``option``, in each env that has one."""
        return _or(f"{n}'s {_or(e)}" + tail.format(_or(e)) for n, c in expert_envs().items()
                   if (e := c.expert_options.get(option))) or "no expert"

    cls = get_env_class(args.env)
    names, options = cls.expert_names, cls.expert_options
    if args.expert is not None and args.expert not in names:
        named = ", ".join(f"{n} ({_or(c.expert_names)})" for n, c in expert_envs().items() if c.expert_names)
        raise ConfigError(f"--expert is for {named or 'no env'}; {args.env} has "
                          + (f"the experts {_or(names)}" if names else "one expert"))
    takers, chosen = options.get("detours", ()), args.expert or (names[0] if names else None)
    if args.detours and (chosen not in takers or not 0.0 < args.detours <= 1.0):
        raise ConfigError(f"--detours is a probability in (0, 1] for {owners('detours', ' expert')}; "
                          f"got {args.detours} for {args.env}"
                          + (f" --expert {args.expert}" if args.expert is not None and args.expert not in takers else ""))
    if args.think != "task" and args.expert not in options.get("think", ()):
        raise ConfigError(f"--think {args.think} is for {owners('think', ' (--expert {})')}; got {args.env}"
                          + (f" --expert {args.expert}" if args.expert else ""))


def cmd_data_expert(args) -> int:
    """``serl data expert``: expert trajectories as SFT rows, played from the experts the env class
    hands out (:meth:`serl.envs.base.BaseTextEnv.make_expert`, :mod:`serl.rollout.expert`; math:
    :func:`_data_expert_math`, rows from GSM8K's annotated solutions, no expert played)."""
    from serl.errors import ConfigError

    check_expert_flags(args)
    if args.env == "math":
        return _data_expert_math(args)
    import time

    from tqdm.auto import tqdm

    from serl.configure import load_config
    from serl.envs.base import get_env_class, list_tasks
    from serl.models.loading import load_tokenizer, resolve_model_path
    from serl.rollout.expert import collect_expert, is_kept, pick_tasks, write_rows
    from serl.rollout.expert_journal import ExpertJournal

    recipe, overrides = split_overrides(args.overrides)
    overrides += data_dir_override(args)
    cfg = load_config(recipe or ("webshop" if args.env == "webshop" else "cpu"), overrides)
    if cfg.env.name != args.env:
        raise ConfigError(f"serl data expert {args.env}: the recipe's env.name is {cfg.env.name!r}; "
                          f"use a {args.env} recipe or env.name={args.env}")
    if args.num_tasks == 0 or args.num_tasks < -1:
        raise ConfigError(f"--num-tasks must be >= 1 (or -1 for the whole split), got {args.num_tasks}")
    if args.min_score is None:
        args.min_score = 1.0
    if not 0.0 <= args.min_score <= 1.0:
        raise ConfigError(f"--min-score must be in [0, 1], got {args.min_score}")
    env_cls = get_env_class(args.env)
    shard, shards = parse_shard(args.shard)
    tasks = pick_tasks(list_tasks(cfg.env, args.split), args.num_tasks, args.seed)[shard::shards]
    max_steps = args.max_steps if args.max_steps is not None else env_cls.default_max_steps
    if max_steps < 1:
        raise ConfigError(f"--max-steps must be >= 1, got {max_steps}")
    header = {"env": args.env, "split": args.split, "num_tasks": args.num_tasks, "seed": args.seed,
              "shard": [shard, shards], "expert": args.expert, "min_score": args.min_score, "max_steps": max_steps,
              **({"detours": args.detours} if args.detours else {}),
              **({"think": args.think} if args.think != "task" else {}),
              "recipe": recipe, "overrides": overrides}
    journal = ExpertJournal(args.out + ".partial", header)
    todo = [t for t in tasks if t.task_id not in journal.done()]
    if len(todo) < len(tasks):
        print(f"serl data expert: resuming {journal.path}: {len(tasks) - len(todo)} of {len(tasks)} tasks done",
              file=sys.stderr)
    tok = load_tokenizer(resolve_model_path(cfg.model.path, cfg.model.gguf_file))
    env = env_cls(**{**env_cls.config_kwargs(cfg.env), "max_steps": max_steps})
    t0 = time.perf_counter()
    try:
        with tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"serl data expert {args.env}",
                  unit="task", file=sys.stderr, dynamic_ncols=True) as bar:
            def on_episode(ep, _summary):
                journal.record(ep, kept=is_kept(ep, args.min_score))
                bar.update(1)
                s = journal.summary()
                bar.set_postfix_str(f"kept {s.kept}/{s.tasks}, {s.rows} rows")

            collect_expert(env, todo, tok, history_length=cfg.env.history_length,
                           max_prompt_length=cfg.data.max_prompt_length, max_steps=max_steps, seed=args.seed,
                           min_score=args.min_score, on_episode=on_episode, expert=args.expert,
                           prompt_layout=cfg.env.prompt_layout, turn_actions=cfg.env.turn_actions,
                           detours=args.detours, think=args.think)
        planner = env.expert_stats.as_dict() if args.expert in ("planner", "search", "sweep") else None
    finally:
        env.close()
    wall = time.perf_counter() - t0
    rows, summary = journal.rows([t.task_id for t in tasks]), journal.summary()
    write_rows(args.out, rows)
    journal.remove()
    s = summary.as_dict()
    replies = [r["response"] for r in rows if "response" in r] + [  # step rows; conversation rows
        m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant"]
    reply_tokens = max((len(tok(x, add_special_tokens=False).input_ids) + 1 for x in replies), default=0)
    part = f", shard {shard}/{shards}" if shards > 1 else ""
    print(f"\nserl data expert: {args.env} {args.split}, {s['tasks']} tasks (seed {args.seed}{part}) in {wall:.1f} s"
          + (f" (this run; {len(tasks) - len(todo)} resumed)" if len(todo) < len(tasks) else ""))
    print(f"  expert success: {s['won']}/{s['tasks']} won ({s['success_fraction']:.3f}), "
          f"mean task score {s['mean_task_score']:.3f}, {s['gave_up']} given up")
    print(f"  kept {s['kept']} episodes (task score >= {args.min_score}), {s['rows']} rows")
    if planner is not None:
        print(f"  planner: {planner['calls']} states asked, {planner['searches']} searches "
              f"({planner['searches'] / max(1, s['tasks']):.2f} per task; the others answered from the current plan), "
              f"median {planner['median_search_s']:.2f} s, max {planner['max_search_s']:.2f} s per search, "
              f"{planner['fallbacks']} fell back to the full problem")
    if summary.plan_lengths:
        print("  steps per task type (min/median/max): " + ", ".join(
            f"{k} {min(v)}/{sorted(v)[len(v) // 2]}/{max(v)}" for k, v in sorted(summary.plan_lengths.items())))
    print(f"  longest reply: {reply_tokens} tokens with EOS (data.max_response_length={cfg.data.max_response_length})")
    truncated = sum(r["prompt_truncated"] for r in rows)
    if truncated:
        print(f"  {truncated} rows had their prompt shrunk to data.max_prompt_length={cfg.data.max_prompt_length}")
    print(f"  written to {args.out}")
    return 0


def cmd_data_dagger(args) -> int:
    """``serl data dagger``: SFT rows from the policy's own ALFWorld episodes, labelled by the
    planner at every state (:mod:`serl.rollout.dagger`)."""
    from serl.errors import SerlError
    from serl.rollout.dagger import DaggerSummary, dagger_rows, receptacle_prior
    from serl.rollout.expert import write_rows
    from serl.trajectory import read_jsonl

    if args.rows_per_episode < 0:
        raise SerlError(f"--rows-per-episode must be >= 0, got {args.rows_per_episode}")
    if args.think != "task" and args.labels != "sweep":
        raise SerlError(f"--think {args.think} is for the sweep's labels (--labels sweep), got --labels {args.labels}")
    rows, summary, files = [], DaggerSummary(), []
    for path in args.trajectories:
        if not Path(path).is_file():
            raise SerlError(f"serl data dagger: no trajectories file {path} (write one with serl eval ... --out DIR: "
                            "DIR/trajectories.jsonl)")
        trajs = read_jsonl(path)
        if trajs and not any(t.extra.get("expert_plan0") or any("expert_plan" in s.info for s in t.steps) for t in trajs):
            raise SerlError(f"serl data dagger: {path} holds no planner labels: play the episodes with "
                            "env.alfworld.expert=planner (e.g. serl eval recipe=cpu_conversation "
                            "env.alfworld.expert=planner --split train --out DIR)")
        files.append(trajs)
    prior = receptacle_prior([t for trajs in files for t in trajs]) if args.labels == "search" else None
    for t in (t for trajs in files for t in trajs):
        made = dagger_rows(t, rows_per_episode=args.rows_per_episode, seed=args.seed, keep_won=args.keep_won,
                           labels=args.labels, prior=prior, think=args.think)
        summary.add(t, made, args.labels)
        rows += made
    write_rows(args.out, rows)
    s = summary
    print(f"serl data dagger: {s.episodes} episodes ({s.won} won), {s.steps} steps, {s.labelled} labelled: "
          f"{s.right} right by the planner ({s.right / max(1, s.labelled):.1%}), {s.wrong} wrong"
          + (f", {s.eligible} of them not a search only the planner calls wrong (--labels {args.labels})"
             if args.labels != "all" else ""))
    for ty, (eps, won, lab, right) in sorted(s.by_type.items()):
        print(f"  {ty:<36} {won}/{eps} won, {right}/{lab} steps right")
    if s.scored:  # episodes played with rollout.action_selection=score
        print(f"  action selection: at {s.scored} scored states the planner's next action was the written one "
              f"{s.written_planner} times ({s.written_planner / s.scored:.1%}), the chosen one {s.chosen_planner} "
              f"({s.chosen_planner / s.scored:.1%}): only chosen {s.only_chosen}, only written {s.only_written}; "
              f"written admissible {s.written_admissible} ({s.written_admissible / s.scored:.1%})")
    searched = sum(r.get("label") == args.labels for r in rows)
    print(f"  rows: {s.rows['dagger']} expert-labelled states"
          + (f" ({searched} with a {args.labels}'s label)" if args.labels in ("search", "sweep") else "")
          + (f", {s.rows['won']} won episodes" if args.keep_won else "")
          + f"; written to {args.out}")
    return 0


def parse_shard(text: str | None) -> tuple[int, int]:
    """``--shard I/N`` as ``(I, N)`` (``(0, 1)`` when not given).

    Raises:
        ConfigError: not ``I/N`` with ``0 <= I < N``.
    """
    from serl.errors import ConfigError

    if text is None:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard must be I/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= i < n:
        raise ConfigError(f"--shard I/N needs 0 <= I < N, got {text!r}")
    return i, n


def add_data_parser(sub) -> None:
    """The ``serl data`` subcommands on the top-level subparsers ``sub``."""
    d = sub.add_parser("data", help="data sets")
    dsub = d.add_subparsers(dest="data_cmd", required=True)
    dl = dsub.add_parser("download", help="download a full data set")
    dl.add_argument("name", choices=["alfworld", "dapo_math17k"])
    dl.add_argument("--dest", help="destination folder (default $SERL_DATA or ~/.cache/serl/data; "
                                   "+/alfworld or +/math)")
    dl.set_defaults(fn=cmd_data)
    ex = dsub.add_parser("expert", help="expert trajectories as supervised (SFT) rows, one JSON line per step "
                         "(math: per problem)",
                         description="Play each task's expert (ALFWorld: the game's walkthrough, or with "
                         "--expert planner fast-downward's plan from each state; WebShop: a "
                         "goal-reading oracle) through the env and write one row per step: the RL step prompt "
                         "and the target reply <think>...</think><action>...</action> (one row per episode, the "
                         "whole chat, with env.prompt_layout=conversation). math: turn each GSM8K "
                         "solution's <<expr=result>> annotations into code_interpreter calls run in the sandbox "
                         "and write one multi-turn row per problem (messages + tools).")
    ex.add_argument("env", choices=["alfworld", "webshop", "math"])
    ex.add_argument("overrides", nargs="*", help="recipe=NAME (default cpu / webshop / cpu_math) and dotted key=value "
                    "overrides (env.history_length, data.max_prompt_length, env.math.*, env.sandbox.*, "
                    "model.path for the chat template)")
    ex.add_argument("--out", required=True, help="output JSONL file")
    ex.add_argument("--split", default="train", help="task split (default train; math: train or test of GSM8K)")
    ex.add_argument("--num-tasks", type=int, default=-1, help="tasks drawn with --seed (default -1: all)")
    ex.add_argument("--seed", type=int, default=0, help="task order and think-template seed")
    ex.add_argument("--shard", metavar="I/N", help="alfworld, webshop: play the I-th of N interleaved parts of the drawn "
                    "tasks (tasks I, I+N, ...), e.g. one process per core, each with its own --out")
    ex.add_argument("--data-dir", help="data folder (sets env.data_dir)")
    ex.add_argument("--min-score", type=float, default=None,
                    help="keep episodes whose final task score (0-1) is at least this (default 1.0: won only; "
                    "not for math)")
    ex.add_argument("--expert", choices=["walkthrough", "planner", "search", "sweep"], default=None,
                    help="alfworld only: walkthrough (default) replays each game's stored plan from the initial "
                    "state; planner asks fast-downward for a plan from each state (serl.envs.alfworld_expert); "
                    "search: the planner, but where it would fetch an object no turn has named, it opens "
                    "the closed receptacle it stands at or goes to one not visited yet, drawn at random "
                    "(serl.envs.alfworld_experts.search); sweep: the same search, in the order of the first turn's list")
    ex.add_argument("--think", choices=["task", "state"], default="task",
                    help="alfworld --expert sweep: the replies' reasoning; task (default): the walkthroughs' "
                    "sentences that name the task (the sweep's go-to sentence aside); state: a sentence that "
                    "names what the agent sees and why the action follows ('The cabinet 3 is closed and I "
                    "have not seen a mug yet, so I open it.', 'The mug 1 is here, so I take it.')")
    ex.add_argument("--max-steps", type=int, default=None,
                    help="episode step limit (default: the env's own, ALFWorld 50 / WebShop 15; "
                    "env.max_steps of the RL recipe is not used; not for math)")
    ex.add_argument("--detours", type=float, default=0.0, metavar="P",
                    help="alfworld walkthrough only: before each of its go-to commands, with probability P "
                    "(at most twice an episode), first go to another receptacle and there, half the time, try "
                    "the take the walkthrough makes next (refused); these replies are context (weight 0), the "
                    "walkthrough's way on from there is trained (serl.envs.alfworld_experts.detours; default 0: none)")
    ex.set_defaults(fn=cmd_data_expert)
    dg = dsub.add_parser("dagger", help="ALFWorld: SFT rows from the policy's own episodes, labelled by the planner",
                         description="DAgger's data step (arXiv 1011.0686): read episodes the policy played with "
                         "env.alfworld.expert=planner (serl eval ... --out DIR writes DIR/trajectories.jsonl), "
                         "label every step right or wrong by the planner's plan from its state, and write, for up "
                         "to --rows-per-episode states where the policy went wrong (the first mistake always), "
                         "the chat up to that state (the policy's replies as context, weight 0) with the "
                         "planner's action as the reply to learn. Train on them with serl sft.")
    dg.add_argument("trajectories", nargs="+", help="trajectories.jsonl file(s) of serl eval --out")
    dg.add_argument("--out", required=True, help="output JSONL file")
    dg.add_argument("--rows-per-episode", type=int, default=2,
                    help="states labelled per episode, at most (default 2; 0: none, e.g. with --keep-won alone)")
    dg.add_argument("--keep-won", action="store_true",
                    help="also keep each won episode whole, every reply trained (iterated action modeling, "
                    "arXiv 2104.07972)")
    dg.add_argument("--labels", choices=["all", "seen", "search", "sweep"], default="all",
                    help="which wrong states get a row: all (DAgger's), or seen: not those where the agent searched (a go to "
                    "a receptacle it has not been at, or open the one it is at) and the planner's label goes to "
                    "fetch an object the agent has not seen (the planner sees the whole game); search: as seen, and "
                    "where the planner's label fetches an unseen object, a search's label instead (open where it "
                    "stands, else go to the unvisited receptacle that the plans of these games find that object "
                    "type in most often); sweep: as search, with the sweep's label (open where it stands, else go "
                    "to the first place of the first turn's list not visited, the reasoning saying so: "
                    "serl data expert --expert sweep)")
    dg.add_argument("--think", choices=["task", "state"], default="task",
                    help="with --labels sweep: the rows' reasoning, as serl data expert --think (state: what the "
                    "agent sees and why the label follows)")
    dg.add_argument("--seed", type=int, default=0, help="picks the states after the first mistake and the think templates")
    dg.set_defaults(fn=cmd_data_dagger)
