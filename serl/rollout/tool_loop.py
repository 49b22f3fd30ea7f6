"""The tool-use turn loop: one multi-turn conversation per episode, token in, token out, one
training row per trajectory (the math env's rollout loop, :attr:`serl.envs.math.env.MathEnv.rollout_loop`).

verl's ``ToolAgentLoop`` as SPEAR's math runs use it
(``volcengine/verl@b16865f2179f844ca8c8b0d271e9240ed72d96a2:verl/experimental/agent_loop/tool_agent_loop.py``,
``TencentYoutuResearch/SPEAR@7e84315:verl/verl/experimental/agent_loop/tool_agent_loop.py``)::

    ids = system block + tools section + user turn + assistant header          (mask 0)
    loop:
        turn = generate(ids)                        ids += turn                (mask 1)
        (a) response tokens >= budget               -> stop "budget"
        (b) assistant turns >= max_turns            -> stop "max_turns"    (turn not parsed)
        (d) no tool call in the turn                -> stop "answer"
        (e) a call to an unknown tool / bad args    -> stop "tool_error"
        run the first call (max_parallel_calls = 1) in the env's sandbox
        (f) the tool turn would not fit the budget  -> stop "observation_overflow" (not appended)
        ids += "\\n" + tool turn + assistant header                            (mask 0)
    the env scores the assistant text                                          (reward ±1)

``max_user_turns`` (c) equals ``max_turns`` in the original and never binds before (b), so it is
not a separate knob. Departures, each documented in docs/environments/math.md:

* the context is built from token ids, the sampled ids kept as they are, with the ``\\n`` after
  ``<|im_end|>`` appended (mask 0) as the SFT data has it (:mod:`serl.agent.tool_chat`);
* a turn may be capped at ``max_turn_tokens`` (``env.math.max_turn_tokens``, 0 = off as the
  original) and then at the remaining budget; a cut turn is the same sample as a stopped one;
* only the assistant text is scored (the original scores the decoded response, tool outputs and
  role words included);
* ``malformed_call_feedback`` (off by default, as the original): a ``<tool_call>`` whose JSON
  does not parse gets a tool turn saying so instead of silently ending the episode;
* an executor crash is a tool message, never a lost batch (the sandbox returns a result);
* a prompt longer than ``max_prompt_length`` is kept whole (the original drops such prompts
  from the data, verl's ``data.filter_overlong_prompts``) and its episode's budget is reduced by
  the overflow, so prompt + response never exceeds ``max_prompt_length + response_length`` (the
  vLLM engine's ``max_model_len``); a prompt that leaves no room at all is an error.

The turns of all active episodes are generated together (one engine call per turn index), so a
group of ``G`` episodes costs ``max_turns`` engine calls at most.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from serl.agent.tool_calls import CODE_INTERPRETER_SCHEMA, ParseStatus, extract_code
from serl.agent.tool_chat import ConversationIds, observation_ids, parse_turn, start_conversation
from serl.envs.base import StepResult, Task
from serl.rollout.engine import RolloutEngine, SamplingParams, sample
from serl.sandbox import STATUSES
from serl.trajectory import Group, Step, Trajectory

if TYPE_CHECKING:
    from serl.config import Config

log = logging.getLogger(__name__)

#: why an episode ended (``Trajectory.extra["stop_reason"]``), in the order of the rules above
STOP_REASONS = ("budget", "max_turns", "answer", "tool_error", "observation_overflow")
#: the tool turn sent for an unparsable call with ``malformed_call_feedback`` (serl's, not SPEAR's)
MALFORMED_CALL_MESSAGE = ("Tool call could not be parsed. Write it as <tool_call>{\"name\": \"code_interpreter\", "
                          "\"arguments\": {\"code\": \"...\"}}</tool_call>.")


@dataclass
class _Episode:
    traj: Trajectory
    user_text: str
    conv: ConversationIds
    prompt_len: int
    log_probs: Optional[list[float]] = field(default_factory=list)
    turns: list[list[int]] = field(default_factory=list)
    tool_calls: int = 0
    user_turns: int = 0
    malformed: int = 0
    statuses: list[str] = field(default_factory=list)
    sandbox_s: float = 0.0
    stop: str = ""
    budget: int = 0  # response tokens allowed: response_length, less a prompt's overflow past max_prompt_length
    reference: str = ""  # the env's reference solution (reset info), SERL's hindsight R; never shown to the policy

    @property
    def response_len(self) -> int:
        return len(self.conv) - self.prompt_len


class ToolAgentLoop:
    """Runs groups of tool-using episodes to completion (the module docstring's loop).

    Args:
        pool: an env pool with exactly ``len(tasks) * group_size`` envs per :meth:`collect` call;
            its envs take ``{"code"}`` / ``{"answer"}`` actions (:class:`serl.envs.math.env.MathEnv`).
        engine: the rollout engine (``hf`` or ``vllm``: any :class:`RolloutEngine`).
        tokenizer: a ChatML tokenizer (``<|im_start|>``/``<|im_end|>``), e.g. SmolLM2's or Qwen2.5's.
        max_turns: assistant turns per episode (SPEAR: 8), so at most ``max_turns - 1`` tool calls.
        response_length: token budget of everything after the prompt, tool turns included
            (``data.max_response_length``; SPEAR 16384); an overlong prompt's episode gets less
            (``max_prompt_length``).
        max_turn_tokens: new tokens per turn (0 = only the budget limits a turn).
        max_prompt_length: tokens; a longer prompt is kept whole (cutting a problem would change
            it; the original filters such prompts out of the data, verl's
            ``data.filter_overlong_prompts``), its episode's budget is ``response_length`` less the
            overflow (so prompt + response <= ``max_prompt_length + response_length``, the vLLM
            engine's ``max_model_len``), and it is counted in
            ``rollout/prompt_over_limit_fraction``, with a warning.
        malformed_call_feedback: answer an unparsable call with :data:`MALFORMED_CALL_MESSAGE`.
        tools: the tool schemas in the system block (SPEAR's ``code_interpreter``).

    Raises:
        ValueError: a non-positive ``max_turns`` or ``response_length``.
    """

    def __init__(self, pool, engine: RolloutEngine, tokenizer, *, max_turns: int, response_length: int,
                 max_turn_tokens: int = 0, max_prompt_length: int = 2048, malformed_call_feedback: bool = False,
                 tools: Sequence[dict[str, Any]] = (CODE_INTERPRETER_SCHEMA,)):
        if max_turns < 1 or response_length < 1:
            raise ValueError(f"max_turns and response_length must be >= 1, got {max_turns}, {response_length}")
        self.pool, self.engine, self.tokenizer = pool, engine, tokenizer
        self.max_turns, self.response_length, self.max_turn_tokens = max_turns, response_length, max_turn_tokens
        self.max_prompt_length = max_prompt_length
        self.malformed_call_feedback = malformed_call_feedback
        self.tools = list(tools)
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_config(cls, cfg: "Config", pool, engine: RolloutEngine, tokenizer) -> "ToolAgentLoop":
        """The loop ``env.math.*`` and ``data.max_response_length`` / ``max_prompt_length`` describe."""
        from serl.envs.math.options import math_options

        o = math_options(cfg.env)
        return cls(pool, engine, tokenizer, max_turns=o["max_turns"], response_length=cfg.data.max_response_length,
                   max_turn_tokens=o["max_turn_tokens"], max_prompt_length=cfg.data.max_prompt_length,
                   malformed_call_feedback=o["malformed_call_feedback"])

    # ------------------------------------------------------------------ loop
    def collect(self, tasks: list[Task], group_size: int, params: SamplingParams,
                progress: Callable[[int, int], None] | None = None,
                reset_results: list[StepResult] | None = None) -> list[Group]:
        """Play ``group_size`` episodes of every task; one :class:`Group` per task, each trajectory
        holding one :class:`Step` (the whole conversation; :meth:`_record`).

        Args:
            tasks: one task per group.
            group_size: G, episodes per task.
            params: sampling settings; ``max_new_tokens`` is replaced per turn.
            progress: optional callback ``(turn, n_active)`` after each turn.
            reset_results: the pool's reset results if the caller already reset it.

        Raises:
            serl.envs.base.EnvError: an env failed (e.g. a worker died); nothing is returned.
            ValueError: a prompt of ``max_prompt_length + response_length`` tokens or more (no
                room for a response); nothing is sampled.
        """
        env_tasks = [t for t in tasks for _ in range(group_size)]
        groups = [Group(uid=uuid.uuid4().hex, task=t) for t in tasks]
        results = reset_results if reset_results is not None else self.pool.reset(env_tasks)
        eps = []
        for i, (task, res) in enumerate(zip(env_tasks, results)):
            traj = Trajectory(uid=groups[i // group_size].uid, traj_uid=uuid.uuid4().hex, task=task, task_text=res.task)
            groups[i // group_size].trajectories.append(traj)
            conv = start_conversation(self.tokenizer, self.tools, res.observation)
            budget = self.response_length - max(0, len(conv) - self.max_prompt_length)
            if budget < 1:
                raise ValueError(f"the prompt of task {task.task_id!r} has {len(conv)} tokens, which leaves no room "
                                 f"for a response in data.max_prompt_length + data.max_response_length = "
                                 f"{self.max_prompt_length} + {self.response_length}")
            eps.append(_Episode(traj=traj, user_text=res.observation, conv=conv, prompt_len=len(conv), budget=budget,
                                reference=str(res.info.get("reference") or "")))
        over = sum(e.prompt_len > self.max_prompt_length for e in eps)
        if over:
            log.warning("%d of %d math prompts exceed data.max_prompt_length=%d tokens; kept whole, their response "
                        "budget reduced by the overflow", over, len(eps), self.max_prompt_length)
        for turn in range(self.max_turns):
            active = [i for i, e in enumerate(eps) if not e.stop]
            if not active:
                break
            self._turn(eps, active, params)
            if progress is not None:
                progress(turn + 1, sum(not e.stop for e in eps))
        finals = self.pool.step([json.dumps({"answer": self._assistant_text(e)}) for e in eps])
        for e, res in zip(eps, finals):
            self._record(e, res)
        self.last_metrics = self._metrics(eps, over)
        return groups

    def _turn(self, eps: list[_Episode], active: list[int], params: SamplingParams) -> None:
        """One assistant turn of every active episode, then their tool calls (rules a-f)."""
        room = max(eps[i].budget - eps[i].response_len for i in active)
        cap = min(room, self.max_turn_tokens) if self.max_turn_tokens > 0 else room
        outs, lps = sample(self.engine, [eps[i].conv.input_ids for i in active], replace(params, max_new_tokens=cap))
        actions: list[Optional[str]] = [None] * len(eps)
        tool_turns: dict[int, tuple[list[int], Optional[str]]] = {}  # i -> (turn, feedback text or None)
        for k, i in enumerate(active):
            e = eps[i]
            turn = list(outs[k])[: e.budget - e.response_len]
            e.conv.append_assistant(turn)
            e.turns.append(turn)
            if e.log_probs is not None:
                e.log_probs = None if lps is None else e.log_probs + list(lps[k])[: len(turn)]
            if e.response_len >= e.budget:
                e.stop = "budget"  # (a)
            elif len(e.turns) >= self.max_turns:
                e.stop = "max_turns"  # (b): the last turn is not parsed
            else:
                kind, value = self._action(e, turn)
                if kind == "code":
                    actions[i] = value
                if kind in ("code", "feedback"):
                    tool_turns[i] = (turn, value if kind == "feedback" else None)
        results = self.pool.step(actions) if any(a is not None for a in actions) else []
        for i, (turn, feedback) in tool_turns.items():
            e = eps[i]
            if feedback is None:
                res = results[i]
                e.statuses.append(str(res.info.get("status", "")))
                e.sandbox_s += float(res.info.get("wall_s", 0.0))
                feedback = res.observation
            obs = observation_ids(self.tokenizer, turn, feedback)
            if e.response_len + len(obs) >= e.budget:
                e.stop = "observation_overflow"  # (f): not appended
            else:
                e.conv.append(obs, 0)
                e.user_turns += 1
                if e.log_probs is not None:
                    e.log_probs += [0.0] * len(obs)

    def _action(self, e: _Episode, turn: list[int]) -> tuple[str, Optional[str]]:
        """What a parsed turn asks for: ``("code", <env action JSON>)``, ``("feedback", <tool turn
        text>)`` (an unparsable call with ``malformed_call_feedback``), or ``("stop", None)`` after
        setting ``e.stop`` (rules d, e)."""
        parsed = parse_turn(self.tokenizer, turn)
        if not parsed.calls:
            if parsed.status == ParseStatus.MALFORMED:
                e.malformed += 1
                if self.malformed_call_feedback:
                    return "feedback", MALFORMED_CALL_MESSAGE
            e.stop = "answer"  # (d)
            return "stop", None
        e.tool_calls += 1  # SPEAR counts tool-calling messages whose calls parsed
        call = parsed.calls[0]  # max_parallel_calls = 1
        try:
            if call.name != "code_interpreter":
                raise ValueError(f"unknown tool {call.name!r}")
            code = extract_code(call.arguments)
        except (ValueError, TypeError):
            e.stop = "tool_error"  # (e)
            return "stop", None
        return "code", json.dumps({"code": code})

    def _assistant_text(self, e: _Episode) -> str:
        """What is scored: the assistant turns decoded (special tokens skipped), joined by newlines."""
        return "\n".join(self.tokenizer.decode(t, skip_special_tokens=True) for t in e.turns)

    def _record(self, e: _Episode, final: StepResult) -> None:
        """The trajectory's one row: prompt = system + user + header; response = all turns and tool
        turns, ``loss_mask`` = ``action_mask`` = 1 on sampled tokens."""
        ids, mask = e.conv.input_ids, e.conv.loss_mask
        resp, resp_mask = ids[e.prompt_len:], mask[e.prompt_len:]
        info = {"tool_calls": e.tool_calls, "stop_reason": e.stop or "answer", "assistant_turns": len(e.turns),
                "num_turns": e.user_turns + len(e.turns) + 1,  # SPEAR's num_turns
                "malformed_calls": e.malformed, "tool_status": e.statuses, "sandbox_s": e.sandbox_s,
                **{k: v for k, v in final.info.items() if k in ("pred", "ground_truth", "correct")},
                **({"reference": e.reference} if e.reference else {})}
        step = Step(step_id=0, observation=e.user_text, prompt=e.user_text, prompt_ids=ids[: e.prompt_len],
                    response_ids=resp, response_text=self.tokenizer.decode(resp, skip_special_tokens=True),
                    action_mask=list(resp_mask), action=str(final.info.get("pred") or ""),
                    action_valid=e.malformed == 0, reward=float(final.reward), feedback=final.feedback,
                    done=True, won=bool(final.won), info=info, rollout_log_probs=e.log_probs, loss_mask=list(resp_mask),
                    prompt_format="tool_chat")
        e.traj.steps.append(step)
        e.traj.extra.update(tool_calls=e.tool_calls, stop_reason=info["stop_reason"])

    @staticmethod
    def _metrics(eps: list[_Episode], over: int) -> dict[str, float]:
        n = max(1, len(eps))
        calls = sum(len(e.statuses) for e in eps)
        m = {"rollout/prompt_over_limit_fraction": over / n,
             "tool/calls_per_trajectory": sum(e.tool_calls for e in eps) / n,
             "tool/trajectory_with_call_fraction": sum(e.tool_calls > 0 for e in eps) / n,
             "tool/malformed_calls": float(sum(e.malformed for e in eps)),
             "tool/executions": float(calls), "tool/sandbox_s": sum(e.sandbox_s for e in eps),
             "rollout/response_tokens_mean": sum(e.response_len for e in eps) / n}
        for s in STATUSES:
            m[f"tool/status_{s}"] = float(sum(st == s for e in eps for st in e.statuses))
        for r in STOP_REASONS:
            m[f"rollout/stop_{r}_fraction"] = sum((e.stop or "answer") == r for e in eps) / n
        return m
