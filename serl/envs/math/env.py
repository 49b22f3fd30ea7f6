"""``env.name=math``: a math problem, a code sandbox for the model's tool calls, and a scorer for
its final answer (SPEAR's third setting, arXiv 2509.22601; the tool agent loop of
``volcengine/verl@b16865f:verl/experimental/agent_loop/tool_agent_loop.py`` with SPEAR's math
recipe ``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/``).

Like every serl env, :class:`MathEnv` knows nothing of LLMs: it takes action strings and returns
text. The token-level conversation (the tools section, Hermes tool calls, the tool turns, the loss
mask) is built by its rollout loop, :class:`serl.rollout.tool_loop.ToolAgentLoop`, which the
trainer picks through :attr:`MathEnv.rollout_loop`. An action is a JSON object:

* ``{"code": "<python>"}``: run the program in the sandbox; the observation is the text the model
  sees (SPEAR's messages, cut to ``tool_response_max_chars``); reward 0, not done;
* ``{"answer": "<the assistant's text>"}``: score it against the ground truth with the configured
  scorer; reward +1 if correct, -1 if not (SPEAR's outcome score; the tool-call bonus is added by
  the trainer), done.

The tasks of a split are its problems (``env.train_split=gsm8k:train``, ``env.eval_split=gsm8k:test``,
``math500``, ``aime24``, ...): ``Task.task_id`` is the problem's stable uid, ``task_type`` its
dataset. Options: ``env.math.*`` and ``env.sandbox.*`` (:mod:`serl.envs.math.options`).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Sequence

from serl.envs.base import BaseTextEnv, EnvError, StepResult, Task
from serl.envs.math.data import DATASETS, MathProblem, load_problems, user_prompt
from serl.envs.math.options import math_options, parse_split
from serl.envs.math.scoring import default_scorer, get_scorer
from serl.errors import ConfigError
from serl.sandbox import BaseSandbox, make_sandbox, tool_response_text, truncate_tool_output

if TYPE_CHECKING:
    from serl.config import EnvConfig, SandboxConfig


def reference_solution(problem: MathProblem) -> str:
    """The worked solution a teacher may see in hindsight (SERL's ``reference_solution`` mode): the
    data set's solution (GSM8K's with its ``<<expr=result>>`` calculator annotations removed and its
    ``#### answer`` line written as a ``\\boxed{}``), else only the final answer."""
    if problem.solution:
        body = re.sub(r"<<[^>]*>>", "", problem.solution)
        body = re.sub(r"\n?#### *(.+?)\s*$", lambda m: f"\nThe final answer is \\boxed{{{m.group(1)}}}.", body)
        return body.strip()
    return f"The final answer is \\boxed{{{problem.ground_truth}}}."


def solution_steps(problem: MathProblem) -> int:
    """The number of calculator steps (``<<48/2=24>>`` annotations) in a GSM8K worked solution; 0
    for a problem without an annotated solution (GSM8K's calculator annotations: Cobbe et al., 2021,
    arXiv:2110.14168)."""
    return (problem.solution or "").count("<<")


def sandbox_options(sb: "SandboxConfig") -> dict[str, Any]:
    """``env.sandbox`` as ``{"backend": name, **keyword arguments of that backend}`` (plain values:
    env worker processes build their sandbox from it). ``max_concurrency=0`` keeps the backend's
    default."""
    conc = sb.max_concurrency or None
    if sb.backend == "sandbox_fusion":
        return {"backend": "sandbox_fusion", "url": sb.url, "run_timeout_s": sb.timeout_s,
                "memory_limit_mb": sb.memory_mb, "max_concurrency": conc or 8}
    return {"backend": sb.backend, "timeout_s": sb.timeout_s, "memory_mb": sb.memory_mb, "cpu_s": sb.cpu_s,
            "file_size_mb": sb.file_size_mb, "max_output_bytes": sb.max_output_bytes, "max_concurrency": conc,
            "prelude": sb.prelude, "require_isolation": sb.require_isolation}


def sandbox_from_config(env_cfg: "EnvConfig") -> BaseSandbox:
    """The sandbox ``env.sandbox`` describes (:func:`serl.sandbox.make_sandbox`).

    Raises:
        SandboxError: bad options, or ``require_isolation`` on a machine that cannot isolate.
    """
    opts = sandbox_options(env_cfg.sandbox)
    return make_sandbox(opts.pop("backend"), **opts)


class MathEnv(BaseTextEnv):
    """One math problem per episode; the model may run code before it answers.

    Args:
        max_steps: tool calls allowed before the answer (the loop enforces ``env.math.max_turns``;
            this is the env's own guard, a tool call beyond it is refused with an EnvError).
        data_dir: where datasets that serl does not ship are read (``$SERL_DATA`` if None).
        prompt_style: ``spear`` | ``plain`` (:func:`serl.envs.math.data.user_prompt`).
        scorer: ``strict`` | ``normalized`` | ``math_verify``; ``""`` = each dataset's default.
        tool_response_max_chars, tool_response_truncate_side: the cut of a tool output (SPEAR's
            ``max_tool_response_length`` in characters, ``tool_response_truncate_side``).
        tool_message_mode: ``original`` (SPEAR's messages) | ``stdout_and_stderr``.
        sandbox: :func:`sandbox_options` of ``env.sandbox``; None = the local default.
    """

    name = "math"
    prompt_builder = ""
    default_max_steps = 8
    rollout_loop = "serl.rollout.tool_loop:ToolAgentLoop"  # one row per trajectory (ENV_ROW_LAYOUTS)

    def __init__(self, max_steps: int = 8, data_dir: str | None = None, prompt_style: str = "spear",
                 scorer: str = "", tool_response_max_chars: int = 256, tool_response_truncate_side: str = "middle",
                 tool_message_mode: str = "original", sandbox: dict[str, Any] | None = None):
        self.max_steps = max_steps
        self.data_dir = data_dir
        self.prompt_style = prompt_style
        self.scorer_name = scorer
        self.max_chars, self.side, self.message_mode = tool_response_max_chars, tool_response_truncate_side, tool_message_mode
        opts = dict(sandbox or {"backend": "local"})
        self._sandbox: BaseSandbox = make_sandbox(opts.pop("backend"), **opts)
        self._problems: dict[str, dict[str, MathProblem]] = {}
        self._unreadable: dict[str, list[str]] = {}
        self.problem: MathProblem | None = None
        self.calls = 0

    # ------------------------------------------------------------------ config hooks
    @classmethod
    def config_kwargs(cls, env_cfg: "EnvConfig") -> dict[str, Any]:
        """Constructor arguments from ``env.math`` and ``env.sandbox`` (``max_steps`` = ``max_turns``).
        The workers' local sandboxes do not warn about missing isolation: :meth:`preflight`, run
        once by the process that starts them (:func:`serl.train.env_pool.make_pool`), does."""
        o = math_options(env_cfg)
        sandbox = sandbox_options(env_cfg.sandbox)
        if sandbox["backend"] == "local":  # the training process's preflight said it once
            sandbox["warn_unisolated"] = False
        return {"max_steps": o["max_turns"], "data_dir": env_cfg.data_dir, "prompt_style": o["prompt_style"],
                "scorer": o["scorer"], "tool_response_max_chars": o["tool_response_max_chars"],
                "tool_response_truncate_side": o["tool_response_truncate_side"],
                "tool_message_mode": o["tool_message_mode"], "sandbox": sandbox}

    @classmethod
    def list_tasks(cls, split: str, data_dir: str | None = None, max_solution_steps: int = 0) -> list[Task]:
        """One task per problem of ``split`` (``DATASET[:SPLIT]``), in file order; with
        ``max_solution_steps > 0``, only the problems whose worked solution has at most that many
        steps (:func:`solution_steps`).

        Raises:
            ConfigError: unknown dataset or split, or ``max_solution_steps`` on a set other than GSM8K.
            EnvError: the data is missing or corrupt (the message names the file), or no problem of
                ``split`` is short enough.
        """
        dataset, part = parse_split(split)
        if max_solution_steps > 0 and dataset != "gsm8k":
            raise ConfigError(f"max_solution_steps counts GSM8K's annotated solution steps; {split} has none")
        problems = load_problems(dataset, part, data_dir)
        if max_solution_steps > 0:
            problems = [p for p in problems if solution_steps(p) <= max_solution_steps]
            if not problems:
                raise EnvError(f"no problem of {split} has a worked solution of at most {max_solution_steps} "
                               f"calculator step{'' if max_solution_steps == 1 else 's'} (env.math.max_solution_steps)")
        return [Task(env_name=cls.name, task_id=p.uid, task_type=dataset) for p in problems]

    @classmethod
    def tasks_from_config(cls, env_cfg: "EnvConfig", split: str) -> list[Task]:
        """:meth:`list_tasks` of ``split``; ``env.math.max_solution_steps`` filters ``env.train_split``
        alone, so evaluation panels stay the whole split."""
        steps = math_options(env_cfg)["max_solution_steps"] if split == env_cfg.train_split else 0
        return cls.list_tasks(split, env_cfg.data_dir, max_solution_steps=steps)

    @classmethod
    def preflight(cls, env_cfg: "EnvConfig") -> dict[str, str]:
        """Build the configured sandbox once in this process: fails early (``require_isolation`` on a
        machine that cannot isolate, a bad option), and says what isolation holds here (first line:
        a summary; then :meth:`~serl.sandbox.LocalSandbox.isolation_report`). Without isolation the
        local sandbox also logs its one warning here.

        Raises:
            SandboxError: as :func:`sandbox_from_config`.
        """
        sb = sandbox_from_config(env_cfg)
        try:
            iso = getattr(sb, "isolation", None)
            if iso is None:
                first = f"{sb.backend} at {env_cfg.sandbox.url} (isolation is the server's)"
                report = first
            else:
                first = (f"{sb.backend}, isolated (own user, network, pid and mount namespaces"
                         f"{', read-only file system' if iso.readonly_fs else ''})" if iso.namespaces
                         else f"{sb.backend}, NOT isolated: {iso.reason}")
                report = sb.isolation_report()
        finally:
            sb.close()
        return {"sandbox": f"{first}\n{report}" if report != first else first}

    @classmethod
    def episode_metrics(cls, trajectories: Sequence[Any]) -> dict[str, float]:
        """Tool use of finished episodes: ``tool_call_rate`` (share of episodes with >= 1 tool call),
        ``tool_calls_mean`` (tool-calling turns per episode), ``response_tokens_mean``, and
        ``stop/<reason>_fraction`` (answer, max_turns, budget, observation_overflow, tool_error)."""
        if not trajectories:
            return {}
        n = len(trajectories)
        calls = [int(t.extra.get("tool_calls", 0)) for t in trajectories]
        out = {"tool_call_rate": sum(c > 0 for c in calls) / n, "tool_calls_mean": sum(calls) / n,
               "response_tokens_mean": sum(len(s.response_ids) for t in trajectories for s in t.steps) / n}
        for t in trajectories:
            key = f"stop/{t.extra.get('stop_reason', 'unknown')}_fraction"
            out[key] = out.get(key, 0.0) + 1.0 / n
        return out

    # ------------------------------------------------------------------ episode
    def _find(self, task: Task) -> MathProblem:
        dataset = task.task_type
        if dataset not in DATASETS:
            raise EnvError(f"math task {task.task_id!r}: unknown dataset {dataset!r}")
        if dataset not in self._problems:
            found: dict[str, MathProblem] = {}
            missing: list[str] = []
            for part in DATASETS[dataset].files:
                try:
                    found.update({p.uid: p for p in load_problems(dataset, part, self.data_dir)})
                except EnvError as e:  # a split whose file is not here (e.g. the full DAPO set): said below
                    missing.append(f"{dataset}:{part}: {e}")
            self._problems[dataset] = found
            self._unreadable[dataset] = missing
        problem = self._problems[dataset].get(task.task_id)
        if problem is None:
            why = "; ".join(self._unreadable.get(dataset, []))
            raise EnvError(f"math task {task.task_id!r}: no such problem in {dataset}"
                           + (f" (splits that could not be read: {why})" if why else ""))
        return problem

    def reset(self, task: Task) -> StepResult:
        """Start ``task``: the observation is the user message (the question in the prompt style);
        ``info["reference"]`` is :func:`reference_solution` (hindsight for SERL's teacher only).

        Raises:
            EnvError: unknown dataset or problem uid, or missing data.
        """
        self.problem = p = self._find(task)
        self.calls = 0
        text = user_prompt(p, self.prompt_style)
        return StepResult(observation=text, admissible_actions=[], task=p.question,
                          info={"uid": p.uid, "data_source": p.data_source, "reference": reference_solution(p)})

    def step(self, action: str) -> StepResult:
        """Run ``{"code": ...}`` in the sandbox, or score ``{"answer": ...}`` (module docstring).

        A program that fails, loops, or exhausts memory is a normal result (its message is the
        observation, ``info["status"]`` says what happened); the sandbox never raises here.

        Raises:
            EnvError: no episode started, an action that is not one of the two JSON objects, or more
                than ``max_steps`` tool calls.
        """
        if self.problem is None:
            raise EnvError("math env: step() before reset()")
        try:
            act = json.loads(action)
        except (TypeError, ValueError):
            act = None
        if not isinstance(act, dict) or len(act) != 1 or not isinstance(next(iter(act.values())), str):
            raise EnvError(f'math env: an action must be {{"code": str}} or {{"answer": str}}, got {action!r:.200}')
        if "code" in act:
            return self._run(act["code"])
        if "answer" in act:
            return self._score(act["answer"])
        raise EnvError(f'math env: an action must be {{"code": str}} or {{"answer": str}}, got {action!r:.200}')

    def _run(self, code: str) -> StepResult:
        self.calls += 1
        if self.calls > self.max_steps:
            raise EnvError(f"math env: tool call {self.calls} exceeds max_steps={self.max_steps}")
        res = self._sandbox.run(code)
        text = truncate_tool_output(tool_response_text(res, self.message_mode), self.max_chars, self.side)
        return StepResult(observation=text, admissible_actions=[], feedback=text,
                          info={"status": res.status, "wall_s": res.wall_s})

    def _score(self, answer: str) -> StepResult:
        p = self.problem
        assert p is not None
        scorer = get_scorer(self.scorer_name or default_scorer(p.dataset))
        result = scorer(answer, p.ground_truth)
        return StepResult(observation="", admissible_actions=[], reward=1.0 if result.correct else -1.0, done=True,
                          won=bool(result.correct),
                          info={"pred": result.pred, "ground_truth": p.ground_truth, "correct": bool(result.correct)})

    def close(self) -> None:
        """Close the sandbox (idempotent)."""
        self._sandbox.close()
