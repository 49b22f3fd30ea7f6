"""Math rollout throughput: trajectories per minute of the tool agent loop, and the sandbox's share.

Two cases on the same GSM8K train problems, in one run:

* ``model``: the real policy (SmolLM2-135M-Instruct, or ``--model``) with the hf engine playing
  ``--problems`` problems × ``--n`` episodes through :class:`serl.rollout.tool_loop.ToolAgentLoop`
  and the real env workers and local sandbox, with ``cpu_math``'s lengths. The base model seldom
  writes a tool call, so its sandbox share is near zero;
* ``tool-heavy``: the same loop and envs with a scripted engine (no model time) whose every
  episode makes ``max_turns - 1`` tool calls (the most the loop runs) and answers in its last
  turn: the wall time of the sandbox and env workers at their worst. Its share of a rollout is
  that wall time over itself plus the real model's measured seconds per round (one engine call
  per turn index) times the rounds.

Printed first: CPU model and dtype. ::

    PYTHONPATH=$PWD python benchmarks/math_rollout.py --problems 8 --n 4
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from serl.agent.tool_calls import format_tool_call
from serl.configure import load_config
from serl.rollout.engine import HFEngine, SamplingParams
from serl.train import env_pool
from serl.utils import cpu_kind


class ToolHeavyEngine:
    """Every turn but the last calls the tool with a small program; the last answers."""

    def __init__(self, tokenizer, max_turns: int):
        self.tok, self.max_turns = tokenizer, max_turns
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            k = self.tok.decode(p).count("<tool_response>")
            text = ("\\boxed{1}" if k >= self.max_turns - 1 else
                    "Compute.\n" + format_tool_call("code_interpreter", {"code": f"print(sum(range({k + 10})))"}))
            out.append(self.tok(text, add_special_tokens=False).input_ids + [self.im_end])
        return out


def play(cfg, engine, tok, tasks, n):
    pool = env_pool.make_pool(cfg, len(tasks) * n)
    try:
        loop = env_pool.rollout_loop(cfg, pool, engine, tok)
        params = SamplingParams(max_new_tokens=cfg.data.max_response_length, temperature=1.0, do_sample=True, seed=0)
        t0 = time.perf_counter()
        groups = loop.collect(tasks, n, params)
        wall = time.perf_counter() - t0
    finally:
        pool.close()
    trajs = [t for g in groups for t in g.trajectories]
    turns = [t.steps[0].info["assistant_turns"] for t in trajs]
    return {"trajectories": len(trajs), "wall_s": wall, "trajectories_per_min": 60 * len(trajs) / wall,
            "assistant_turns": sum(turns), "rounds": max(turns), "sandbox_calls": loop.last_metrics["tool/executions"],
            "sandbox_s": loop.last_metrics["tool/sandbox_s"],
            "sampled_tokens": sum(sum(t.steps[0].loss_mask) for t in trajs),
            "response_tokens_mean": loop.last_metrics["rollout/response_tokens_mean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--model", default=None, help="model.path (default: cpu_math's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    over = [f"model.path={args.model}"] if args.model else []
    cfg = load_config("cpu_math", over)
    from transformers import AutoModelForCausalLM

    from serl.models.loading import load_tokenizer, resolve_model_path

    path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    tok = load_tokenizer(path)
    dtype = torch.bfloat16 if "AVX512" in cpu_kind() or "AMX" in cpu_kind() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    print(f"{cpu_kind()}; dtype {str(dtype).removeprefix('torch.')}; torch threads {torch.get_num_threads()}")
    tasks = env_pool.list_tasks(cfg, "gsm8k:train")[: args.problems]
    real = play(cfg, HFEngine(model, tok, micro_batch_size=cfg.rollout.micro_batch_size), tok, tasks, args.n)
    heavy = play(cfg, ToolHeavyEngine(tok, cfg.env.math["max_turns"]), tok, tasks, args.n)
    # the loop generates turn k of every active episode in one engine call: a "round"
    model_s_per_round = real["wall_s"] / real["rounds"]
    share = heavy["wall_s"] / (heavy["wall_s"] + model_s_per_round * heavy["rounds"])
    real["sampled_tokens_per_s"] = real["sampled_tokens"] / real["wall_s"]
    # ru_maxrss is KiB on Linux: this process (model, engine, loop); the env workers are children
    rss = {"peak_rss_mib_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "peak_rss_mib_largest_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
    print(json.dumps({"model": real, "tool_heavy": heavy, **rss}, indent=1))
    print(f"model rollout: {real['trajectories_per_min']:.1f} trajectories/min "
          f"({real['trajectories']} in {real['wall_s']:.1f} s, {real['response_tokens_mean']:.0f} response tokens each, "
          f"{real['sandbox_calls']:.0f} sandbox calls taking {real['sandbox_s']:.2f} s); "
          f"{real['sampled_tokens_per_s']:.1f} sampled tokens/s; peak RSS {rss['peak_rss_mib_main']:.0f} MiB "
          f"(largest env worker {rss['peak_rss_mib_largest_worker']:.0f} MiB)")
    print(f"tool-heavy: {heavy['sandbox_calls']:.0f} sandbox calls ({heavy['sandbox_s']:.2f} s summed over calls), "
          f"{heavy['wall_s']:.2f} s wall for the loop without a model; with the model's {model_s_per_round:.1f} s per "
          f"round of {heavy['rounds']} rounds, the sandbox and env workers would be {100 * share:.1f}% of the rollout")


if __name__ == "__main__":
    main()
