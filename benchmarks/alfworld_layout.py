"""ALFWorld's two prompt layouts side by side: tokens per step, update and rollout seconds per episode.

``env.prompt_layout=step`` (verl-agent's: a fresh ~800-token prompt per step, one training row per
step) against ``conversation`` (one chat per episode, one training row per episode; the later
turns list the admissible actions that ``env.turn_actions`` selects: ``all``, ``state`` or
``none``). Three parts, in one run:

* ``tokens`` (no model, CPU-independent): scripted episodes on ``--games`` train games of all six
  task types (stratified, seeded): at each step the game's stored walkthrough action, or with
  probability ``--explore`` a random admissible one (then the walkthrough is replanned by
  restarting it from the next unplayed command), up to ``--max-steps`` steps; the reply is the
  expert's ``<think>…</think><action>…</action>`` (the templates of
  :mod:`serl.envs.alfworld_experts.walkthrough`).
  Per layout: prompt tokens of the first step, tokens each later step appends, the episode's
  update tokens (the step layout: every step's prompt and reply; the conversation: the one row),
  and the 50-step episode's projected length against SmolLM2's 8,192-token context.
* ``flops`` (no model weights, CPU-independent): the forward FLOPs of the update rows of both
  layouts on the same episodes cut to ``--flops-steps`` lengths (projections and MLP per token,
  causal attention per row, the LM head on the replies), and their ratio: the floor under the
  ``update`` part's seconds ratio, since the conversation's long rows spend more of their FLOPs in
  attention, which runs no faster than the projections.
* ``update``: the trainer's own update (:class:`serl.train.update.PolicyUpdate`, the default
  recipe's LoRA policy, dtype and micro-batching) on the same scripted episodes in both layouts
  (advantage +1 / −1 alternately per episode), timed apart: seconds and tokens per episode. With
  ``--profile``, one more update per layout under ``torch.profiler``: where its seconds go (GEMMs,
  attention, elementwise ``mul``/``add``, the rest).
* ``rollout``: the trainer's collector with the policy sampling (T = 1) on ``--rollout-games``
  games × ``--n`` episodes in each layout, ``--rollout-steps`` steps at most: seconds per step and
  per episode, and the hf engine's prefilled / reused prompt tokens (its turn cache).

Printed first: the CPU model and dtype. Needs the ALFWorld train games (``--data-dir``, default
``$SERL_DATA`` or the shared data folder).

``--expert-rows STEP.jsonl CONV.jsonl`` (any env with a conversation layout, e.g. WebShop) runs the
``update`` part on episodes that ``serl data expert`` wrote twice, in the step layout and with
``env.prompt_layout=conversation`` (same tasks and seed: the same episodes), instead of scripted
ALFWorld ones; ``--recipe`` names the trainer's recipe (e.g. ``cpu_learn_webshop``). ::

    PYTHONPATH=$PWD python benchmarks/alfworld_layout.py --data-dir ../shared/data/alfworld --parts tokens
    PYTHONPATH=$PWD python benchmarks/alfworld_layout.py --data-dir ../shared/data/alfworld --parts tokens,update,rollout
    PYTHONPATH=$PWD python benchmarks/alfworld_layout.py --parts update --recipe cpu_learn_webshop \
        --expert-rows step.jsonl conv.jsonl --update-episodes 8
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict

from serl.utils import use_openmp_policy  # imports no torch

use_openmp_policy()

import torch  # noqa: E402

from serl.agent.chat import chat_prompt_ids  # noqa: E402
from serl.agent.prompts.alfworld import build_prompt, build_turn  # noqa: E402
from serl.agent.parsing import action_token_mask  # noqa: E402
from serl.envs.alfworld import AlfWorldEnv, walkthrough  # noqa: E402
from serl.envs.alfworld_experts.walkthrough import ALFWORLD_THINK, task_phrase  # noqa: E402
from serl.rollout.collector import build_step_prompt, conversation_turn_ids  # noqa: E402
from serl.rollout.expert import format_response  # noqa: E402
from serl.utils import cpu_kind  # noqa: E402

TURN_ACTIONS = ("all", "state", "none")
CONTEXT = 8192


def pick_games(data_dir: str, n: int, seed: int) -> list:
    """``n`` train games, the six task types in turn, each type's games in a seeded order."""
    by_type = defaultdict(list)
    for t in AlfWorldEnv.list_tasks("train", data_dir):
        by_type[t.task_type].append(t)
    rng = random.Random(seed)
    for v in by_type.values():
        rng.shuffle(v)
    types, out = sorted(by_type), []
    while len(out) < n and any(by_type.values()):
        for ty in types:
            if by_type[ty] and len(out) < n:
                out.append(by_type[ty].pop())
    return out


def scripted_episode(env: AlfWorldEnv, task, max_steps: int, explore: float, rng: random.Random) -> dict:
    """One scripted episode: the walkthrough's next command, or a random admissible one with
    probability ``explore`` (then the walkthrough restarts from its first command not yet
    played); returns the task text and per step ``(observation, admissible, action)``."""
    res = env.reset(task)
    plan, k, steps = walkthrough(task), 0, []
    for t in range(max_steps):
        if res.done:
            break
        if rng.random() < explore or k >= len(plan):
            action = rng.choice([a for a in res.admissible_actions if a != "help"])
        else:
            action, k = plan[k], k + 1
        steps.append((res.observation, list(res.admissible_actions), action))
        res = env.step(action)
        if res.done:
            break
    return {"task_text": res.task, "task_type": task.task_type, "steps": steps, "won": bool(res.won)}


def reply(task_text: str, action: str, t: int) -> str:
    return format_response(ALFWORLD_THINK[t % len(ALFWORLD_THINK)].format(task=task_phrase(task_text), action=action),
                           action)


def layout_rows(tok, ep: dict, layout: str, turn_actions: str, max_prompt_length: int) -> list[tuple[list, list]]:
    """``(prompt_ids, response_ids)`` per step as the collector builds them in ``layout`` (an
    episode read from expert rows carries them: :func:`expert_episodes`)."""
    if "rows" in ep:
        return ep["rows"][layout]
    rows, history, conv = [], [], None
    for t, (obs, adm, action) in enumerate(ep["steps"]):
        resp = tok(reply(ep["task_text"], action, t), add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids("<|im_end|>")]
        if layout == "step" or t == 0:
            _, ids, _ = build_step_prompt(build_prompt, tok, ep["task_text"], obs, adm, history, 2, max_prompt_length)
        else:
            ids = conv + conversation_turn_ids(tok, rows[-1][1], build_turn(obs, adm, t, turn_actions))
        rows.append((ids, resp))
        conv = ids + resp
        history.append((obs, action))
    return rows


def _read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def expert_episodes(tok, step_path: str, conv_path: str, n: int) -> list[dict]:
    """The first ``n`` episodes found in both files of ``serl data expert`` rows (matched by task
    id): per layout the ``(prompt_ids, response_ids)`` of each step. Step rows: the row's chat
    prompt and its reply + ``<|im_end|>``; a conversation row: its rendered chat
    (:func:`serl.agent.tool_chat.render_sft_conversation`, token for token the collector's) cut
    after each reply. Raises ValueError when the files share no episode, or an episode's step
    counts differ."""
    from serl.agent.tool_chat import render_sft_conversation

    end = tok.convert_tokens_to_ids("<|im_end|>")
    steps: dict[str, list] = defaultdict(list)
    for r in _read_jsonl(step_path):
        steps[r["task_id"]].append((chat_prompt_ids(tok, r["messages"][0]["content"]),
                                    tok(r["response"], add_special_tokens=False).input_ids + [end]))
    out = []
    for r in _read_jsonl(conv_path):
        if r["task_id"] not in steps or len(out) == n:
            continue
        ids, mask = render_sft_conversation(tok, r["messages"], [])
        starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
        ends = [i + 1 for i in range(len(mask)) if mask[i] and (i + 1 == len(mask) or not mask[i + 1])]
        conv = [(ids[:a], ids[a:b]) for a, b in zip(starts, ends)]
        if len(conv) != len(steps[r["task_id"]]):
            raise ValueError(f"task {r['task_id']}: {len(conv)} replies in the chat, {len(steps[r['task_id']])} step rows")
        out.append({"task_id": r["task_id"], "rows": {"step": steps[r["task_id"]], "conversation": conv}})
    if not out:
        raise ValueError(f"{step_path} and {conv_path} share no episode (task_id)")
    return out


def tokens_part(tok, episodes: list[dict]) -> dict:
    out = {}
    step_rows = [layout_rows(tok, ep, "step", "all", 10**6) for ep in episodes]
    per_step = [len(p) + len(r) for rows in step_rows for p, r in rows]
    out["step"] = {"update_tokens_per_step": statistics.mean(per_step),
                   "update_tokens_per_episode": statistics.mean(sum(len(p) + len(r) for p, r in rows) for rows in step_rows)}
    for ta in TURN_ACTIONS:
        conv_rows = [layout_rows(tok, ep, "conversation", ta, 10**6) for ep in episodes]
        first = [len(rows[0][0]) for rows in conv_rows]
        growth = [(len(rows[-1][0]) + len(rows[-1][1]) - rows[0][0].__len__()) / len(rows) for rows in conv_rows]
        total = [len(rows[-1][0]) + len(rows[-1][1]) for rows in conv_rows]
        fifty = [f + 50 * g for f, g in zip(first, growth)]
        out[f"conversation/{ta}"] = {
            "first_prompt_tokens": statistics.mean(first), "tokens_per_later_step": statistics.mean(growth),
            "update_tokens_per_episode": statistics.mean(total), "projected_50_step_tokens": statistics.mean(fifty),
            "projected_50_step_max": max(fifty), "fits_8192_fraction": sum(f <= CONTEXT for f in fifty) / len(fifty)}
    return out


def row_flops(cfg, prompt_len: int, reply_len: int) -> dict[str, float]:
    """Forward FLOPs (2 per multiply-add) of one update row of a Llama-style model ``cfg``: the
    projections and MLP on every token, causal attention (``QKᵀ`` and ``AV``: position ``c``
    attends to ``c`` keys), the LM head on the reply tokens only (serl's update computes logits
    where the loss is). The backward pass costs about twice the forward in both layouts."""
    h, n, layers = cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or h // n
    kv = cfg.num_key_value_heads * hd
    length = prompt_len + reply_len
    linear = 2 * layers * (h * n * hd + 2 * h * kv + n * hd * h + 3 * h * cfg.intermediate_size) * length
    attention = 2 * 2 * layers * n * hd * length * (length + 1) / 2
    head = 2 * h * cfg.vocab_size * reply_len
    return {"linear": linear, "attention": attention, "head": head}


def flops_part(tok, model_config, episodes: list[dict], lengths: list[int]) -> dict:
    """Forward FLOPs per episode of each layout on the scripted episodes cut to ``T`` steps (those
    that last at least ``T``), and the ratio conversation / step: what the update's compute would be
    if every FLOP cost the same, so the floor of the measured seconds ratio; and that ratio with no
    attention FLOPs in either layout, the floor that even free attention would leave."""
    out = {}
    for T in lengths:
        eps = [dict(e, steps=e["steps"][:T]) for e in episodes if len(e["steps"]) >= T]
        if not eps:
            continue
        row: dict = {"episodes": len(eps)}
        for layout, ta in [("step", "all")] + [("conversation", t) for t in TURN_ACTIONS]:
            total = defaultdict(float)
            for ep in eps:
                rows = layout_rows(tok, ep, layout, ta, 10**6)
                if layout == "conversation":  # one packed row: the last prompt holds every earlier reply
                    replies = sum(len(r) for _, r in rows)
                    rows = [(len(rows[-1][0]) + len(rows[-1][1]) - replies, replies)]
                else:
                    rows = [(len(p), len(r)) for p, r in rows]
                for p, r in rows:
                    for k, v in row_flops(model_config, p, r).items():
                        total[k] += v
            name = layout if layout == "step" else f"conversation/{ta}"
            row[name] = {k: v / len(eps) / 1e9 for k, v in total.items()}
            row[name]["total"] = sum(row[name].values())
        for ta in TURN_ACTIONS:
            conv, step = row[f"conversation/{ta}"], row["step"]
            row[f"ratio/{ta}"] = conv["total"] / step["total"]
            # the floor if attention cost nothing in either layout (a kernel no CPU or GPU has)
            row[f"ratio_no_attention/{ta}"] = (conv["total"] - conv["attention"]) / (step["total"] - step["attention"])
        out[str(T)] = row
    return out


def profile_update(trainer, batch) -> dict[str, float]:
    """One more update on ``batch`` under ``torch.profiler``: its wall seconds (the profiler's
    overhead included) and the self CPU seconds of its operators by kind: ``gemm`` (``aten::mm``,
    ``addmm``, ``bmm``), ``attention`` (``scaled_dot_product_*``, forward and backward),
    ``elementwise`` (``aten::mul``, ``add``, ``add_``) and ``other``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        trainer.update.run(batch)
        out = {"wall": time.perf_counter() - t0}
    for ev in prof.key_averages():
        name = ev.key
        kind = ("gemm" if name in ("aten::mm", "aten::addmm", "aten::bmm") else
                "attention" if "scaled_dot_product" in name else
                "elementwise" if name in ("aten::mul", "aten::add", "aten::add_") else "other")
        out[kind] = out.get(kind, 0.0) + ev.self_cpu_time_total / 1e6
    return out


def update_part(trainer, tok, episodes: list[dict], turn_actions: str, repeats: int,
                micro_batches: dict[str, int], profile: bool = False) -> dict:
    """Seconds of the trainer's update on the scripted episodes, both layouts (interleaved);
    ``micro_batches[layout]`` > 0: that layout's ``actor.ppo_micro_batch_size`` (rows per forward
    pass: steps, or episodes in the conversation), else the recipe's. ``profile``: after the timed
    repeats, one more update per layout under the profiler (:func:`profile_update`)."""
    from serl.train.batch import UpdateBatch
    from serl.train.packing import pack_conversations

    def batch(layout: str) -> UpdateBatch:
        prompts, resps, advs, masks, amasks, traj = [], [], [], [], [], []
        for e, ep in enumerate(episodes):
            for p, r in layout_rows(tok, ep, layout, turn_actions, 10**6):
                prompts.append(p), resps.append(r), traj.append(str(e))
                advs.append(torch.full((len(r),), 1.0 if e % 2 == 0 else -1.0))
                masks.append(torch.ones(len(r)))
                amasks.append(action_token_mask(r, tok)[1])
        b = UpdateBatch(prompt_ids=prompts, response_ids=resps, response_masks=masks, advantages=advs,
                        old_log_probs=[None] * len(prompts), action_masks=amasks)
        return pack_conversations(b, traj)[0] if layout == "conversation" else b

    out = {}
    for layout in ("step", "conversation"):
        b = batch(layout)
        out[layout] = {"rows": len(b), "tokens_per_episode": sum(len(p) + len(r) for p, r in zip(b.prompt_ids, b.response_ids)) / len(episodes),
                       "seconds": []}
    actor = trainer.update.cfg.actor
    micro = {k: micro_batches.get(k) or actor.ppo_micro_batch_size for k in ("step", "conversation")}
    for _ in range(repeats):
        for layout in ("step", "conversation"):
            b = batch(layout)
            actor.ppo_micro_batch_size = micro[layout]
            t0 = time.perf_counter()
            trainer.update.run(b)
            out[layout]["seconds"].append(time.perf_counter() - t0)
    for layout in ("step", "conversation") if profile else ():
        actor.ppo_micro_batch_size = micro[layout]
        out[layout]["profile_seconds"] = profile_update(trainer, batch(layout))
    for layout in out:
        out[layout]["ppo_micro_batch_size"] = micro[layout]
        s = out[layout]["seconds"]
        out[layout]["seconds_per_episode"] = statistics.median(s) / len(episodes)
    out["ratio_conversation_over_step"] = out["conversation"]["seconds_per_episode"] / out["step"]["seconds_per_episode"]
    return out


def rollout_part(trainer, cfg, tasks: list, n: int, steps: int, turn_actions: str) -> dict:
    from serl.rollout.collector import Collector
    from serl.rollout.engine import SamplingParams, engine_metrics, release_engine_cache
    from serl.train import env_pool

    out = {}
    pool = env_pool.make_pool(cfg, len(tasks) * n)
    try:
        for layout in ("step", "conversation"):
            col = Collector(pool, trainer.engine, trainer.tokenizer, "alfworld", 2, steps, cfg.data.max_prompt_length,
                            layout, turn_actions)
            params = SamplingParams(max_new_tokens=cfg.data.max_response_length, temperature=1.0, top_p=1.0,
                                    top_k=-1, do_sample=True)
            torch.manual_seed(0)
            engine_metrics(trainer.engine)
            t0 = time.perf_counter()
            groups = col.collect(tasks, n, params)
            dt = time.perf_counter() - t0
            em = engine_metrics(trainer.engine)
            release_engine_cache(trainer.engine)
            trajs = [t for g in groups for t in g.trajectories]
            nsteps = sum(len(t.steps) for t in trajs)
            out[layout] = {"episodes": len(trajs), "steps": nsteps, "seconds": dt,
                           "seconds_per_step": dt / max(1, nsteps), "seconds_per_episode": dt / len(trajs),
                           "won": sum(t.won for t in trajs), **{k: v for k, v in em.items() if "token" in k},
                           **col.last_metrics}
    finally:
        pool.close()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--parts", default="tokens", help="comma list of tokens,flops,update,rollout")
    ap.add_argument("--flops-steps", default="5,10,14,20,30,40,50",
                    help="flops: episode lengths T (steps) to count the layouts' FLOPs at")
    ap.add_argument("--games", type=int, default=30)
    ap.add_argument("--max-steps", type=int, default=50)
    ap.add_argument("--explore", type=float, default=0.5)
    ap.add_argument("--update-episodes", type=int, default=4)
    ap.add_argument("--update-steps", type=int, default=20, help="steps per scripted episode in the update part")
    ap.add_argument("--turn-actions", default="state")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--step-micro-batch", type=int, default=0,
                    help="update: rows per forward pass in the step layout (0: the recipe's actor.ppo_micro_batch_size)")
    ap.add_argument("--conversation-micro-batch", type=int, default=0,
                    help="update: episodes per forward pass in the conversation layout (0: the recipe's)")
    ap.add_argument("--rollout-games", type=int, default=2)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rollout-steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides on top of the default recipe (e.g. trainer.activation_memory_gb=8)")
    ap.add_argument("--profile", action="store_true",
                    help="update: one more update per layout under torch.profiler, its self CPU seconds by "
                         "operator kind (GEMMs, attention, elementwise mul/add, the rest)")
    ap.add_argument("--out", default=None, help="write the results as JSON here too")
    ap.add_argument("--expert-rows", nargs=2, metavar=("STEP", "CONV"), default=None,
                    help="update part only: episodes from `serl data expert` rows of both layouts (any env)")
    ap.add_argument("--recipe", default="cpu", help="the trainer's recipe (with --expert-rows: the env's CPU recipe)")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if args.expert_rows:
        return expert_rows_main(args)

    from serl.configure import load_config
    from serl.envs.alfworld import resolve_data_dir
    from serl.models.loading import load_tokenizer, resolve_model_path

    data_dir = str(resolve_data_dir(args.data_dir))
    cfg = load_config("cpu", [f"env.data_dir={data_dir}", "trainer.progress=false", "env.task_types=[]",
                              f"env.max_steps={args.rollout_steps}", f"data.max_prompt_length={CONTEXT - 96}",
                              *args.set])
    print(f"CPU: {cpu_kind()}; torch {torch.__version__}; threads {torch.get_num_threads()}", flush=True)
    tok = load_tokenizer(resolve_model_path(cfg.model.path))
    rng = random.Random(args.seed)
    env = AlfWorldEnv(max_steps=args.max_steps, data_dir=data_dir)
    games = pick_games(data_dir, args.games, args.seed)
    t0 = time.perf_counter()
    episodes = [scripted_episode(env, g, args.max_steps, args.explore, rng) for g in games]
    env.close()
    print(f"{len(episodes)} scripted episodes ({sum(len(e['steps']) for e in episodes)} steps, "
          f"{sum(e['won'] for e in episodes)} won) in {time.perf_counter() - t0:.0f} s", flush=True)
    results: dict = {"cpu": cpu_kind(), "args": vars(args)}
    if "tokens" in parts:
        results["tokens"] = tokens_part(tok, episodes)
        print(json.dumps(results["tokens"], indent=1), flush=True)
    if "flops" in parts:
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(resolve_model_path(cfg.model.path))
        results["flops"] = flops_part(tok, model_config, episodes, [int(x) for x in args.flops_steps.split(",")])
        for T, row in results["flops"].items():
            print(f"T={T} ({row['episodes']} episodes): step {row['step']['total']:.0f} GFLOP/episode; "
                  + ", ".join(f"conversation/{ta} {row[f'conversation/{ta}']['total']:.0f} "
                              f"(attention {row[f'conversation/{ta}']['attention']:.0f}) = {row[f'ratio/{ta}']:.2f}x, "
                              f"{row[f'ratio_no_attention/{ta}']:.2f}x without attention"
                              for ta in TURN_ACTIONS), flush=True)
    if parts & {"update", "rollout"}:
        from serl.train.trainer import Trainer

        trainer = Trainer(cfg, run_dir=tempfile.mkdtemp(prefix="serl-layout-"))
        print(f"dtype: rollout {trainer.models.infer_dtype}, update autocast {trainer.models.autocast_dtype}", flush=True)
        try:
            if "update" in parts:
                eps = [dict(e, steps=e["steps"][: args.update_steps]) for e in episodes[: args.update_episodes]]
                results["update"] = args_update_part(trainer, tok, eps, args)
                print(json.dumps(results["update"], indent=1), flush=True)
            if "rollout" in parts:
                results["rollout"] = rollout_part(trainer, cfg, games[: args.rollout_games], args.n, args.rollout_steps,
                                                  args.turn_actions)
                print(json.dumps(results["rollout"], indent=1), flush=True)
        finally:
            trainer.close()
    write_out(args, results)


def args_update_part(trainer, tok, episodes: list[dict], args) -> dict:
    """``update_part`` with the command line's turn actions, repeats and per-layout micro-batches."""
    return update_part(trainer, tok, episodes, args.turn_actions, args.repeats,
                       {"step": args.step_micro_batch, "conversation": args.conversation_micro_batch}, args.profile)


def write_out(args, results: dict) -> None:
    """Write ``results`` as JSON to ``--out`` when it is given."""
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def expert_rows_main(args) -> None:
    """``--expert-rows``: the update part on episodes read from expert rows (module docstring)."""
    from serl.configure import load_config
    from serl.models.loading import load_tokenizer, resolve_model_path
    from serl.train.trainer import Trainer

    if set(args.parts.split(",")) != {"update"}:
        raise SystemExit("--expert-rows measures the update part only (--parts update)")
    cfg = load_config(args.recipe, ["trainer.progress=false", f"data.max_prompt_length={CONTEXT - 96}", *args.set])
    print(f"CPU: {cpu_kind()}; torch {torch.__version__}; threads {torch.get_num_threads()}", flush=True)
    tok = load_tokenizer(resolve_model_path(cfg.model.path))
    episodes = expert_episodes(tok, *args.expert_rows, args.update_episodes)
    print(f"{len(episodes)} episodes ({sum(len(e['rows']['step']) for e in episodes)} steps) from {args.expert_rows}",
          flush=True)
    trainer = Trainer(cfg, run_dir=tempfile.mkdtemp(prefix="serl-layout-"))
    print(f"dtype: rollout {trainer.models.infer_dtype}, update autocast {trainer.models.autocast_dtype}", flush=True)
    try:
        results = {"cpu": cpu_kind(), "args": vars(args), "update": args_update_part(trainer, tok, episodes, args)}
        print(json.dumps(results["update"], indent=1), flush=True)
    finally:
        trainer.close()
    write_out(args, results)


if __name__ == "__main__":
    main(sys.argv[1:])
