"""The multi-turn rollout loop: prompts → engine → parse → env step → Step records → Groups.

verl-agent's ``TrajectoryCollector.vanilla_multi_turn_loop``
(``langfengQ/verl-agent@574dd5b:agent_system/multi_turn_rollout/rollout_loop.py``), with two
departures: envs that are done are not stepped and produce no rows (the original steps them and
drops the "garbage rows" later), and the action-token mask is computed here on the sampled ids.
Every group's ``G`` envs replay the same task (same game file / goal and seed).

Two prompt layouts (``env.prompt_layout``):

* ``step`` (verl-agent's): each step is a fresh single-turn chat (:func:`build_step_prompt`:
  task, the last ``history_length`` steps, the observation, the admissible actions);
* ``conversation`` (serl's): the episode is one chat, built token in, token out as the math tool
  loop builds its own (:mod:`serl.agent.tool_chat`)::

      step 0 prompt  = the step layout's first prompt (chat template: system, user, assistant header)
      step t prompt  = step t-1 prompt + its sampled reply (kept as sampled) + "\n" after <|im_end|>
                       (or "<|im_end|>\n" when the reply was cut) + user turn t + assistant header

  where user turn ``t`` is the env's turn builder (``build_turn``, e.g.
  :func:`serl.agent.prompts.alfworld.build_turn`: the env's reply and the admissible actions
  that ``env.turn_actions`` selects). Each step is still one :class:`Step` (so GiGPO's anchor
  states, SERL's per-step hindsight and the invalid-action penalty see steps), whose
  ``prompt_ids`` is the whole conversation so far and ``prompt`` the step's own user turn
  (``prompt_format="conversation"``); each prompt extends the previous one, so the ``hf``
  engine's turn cache and vLLM's prefix cache prefill only the new turn, and the update packs an
  episode's steps back into one row (:func:`serl.train.packing.pack_conversations`). An episode
  whose next prompt would pass ``max_prompt_length`` ends there (``done``, not won; counted in
  ``rollout/context_overflow_fraction``): cutting the chat would break the prefix.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from serl.agent.chat import chat_prompt_ids, user_turn_ids
from serl.agent.parsing import FALLBACK_CHARS, action_token_mask, project_action
from serl.agent.prompts import PromptBuilder, get_prompt_builder, get_turn_builder
from serl.agent.tool_chat import end_of_turn_ids
from serl.envs.base import StepResult, Task, get_env_class
from serl.rollout.action_selection import ACTION_SELECTIONS, ActionSelector
from serl.rollout.engine import RolloutEngine, SamplingParams, sample
from serl.trajectory import Group, Step, Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from serl.config import Config

    from serl.envs.pool import EnvPool

log = logging.getLogger(__name__)


@dataclass
class _EnvState:
    traj: Trajectory
    result: StepResult
    history: list[tuple[str, str]] = field(default_factory=list)
    done: bool = False
    prompt: str = ""
    #: conversation layout: the chat so far (the last step's prompt and its sampled reply)
    conv: list[int] = field(default_factory=list)


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """Keep the JSON-serialisable scalar/list fields of an env info dict."""
    out = {}
    for k, v in info.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


def build_step_prompt(build_prompt: PromptBuilder, tokenizer, task_text: str, observation: str,
                      admissible_actions: list[str], history: list[tuple[str, str]], history_length: int,
                      max_prompt_length: int) -> tuple[str, list[int], bool]:
    """The user-message text and chat token ids of one step, as the policy sees it.

    The one place where a step prompt is built: the RL :class:`Collector` and the expert
    trajectories of :mod:`serl.rollout.expert` both call it, so an SFT prompt is the RL prompt
    of the same state by construction.

    The prompt shows the last ``history_length`` (observation, action) pairs. If its chat ids
    are longer than ``max_prompt_length``, the window shrinks one pair at a time (down to no
    history); if even the history-free prompt is too long, its ids are cut from the left (a
    warning is logged). verl-agent truncates the tokenised prompt from the left only
    (``langfengQ/verl-agent@574dd5b:agent_system/multi_turn_rollout/rollout_loop.py``); dropping
    history first is serl's departure, so the current observation survives.

    Args:
        build_prompt: the env's prompt builder (:func:`serl.agent.prompts.get_prompt_builder`).
        tokenizer: the policy tokenizer (its chat template is applied, :func:`chat_prompt_ids`).
        task_text: the task / instruction of the episode.
        observation: the current observation.
        admissible_actions: the actions the env admits now.
        history: every earlier (observation, action) pair of the episode, oldest first; its
            length is the number of steps taken so far.
        history_length: the largest number of pairs shown.
        max_prompt_length: token cap of the chat prompt.

    Returns:
        ``(text, ids, truncated)``: the user-message text, its chat ids ``[prompt_len]`` with
        ``prompt_len <= max_prompt_length``, and whether history was dropped or ids were cut.
    """
    step_count = len(history)
    for h in range(history_length, -1, -1):
        text = build_prompt(task_text, observation, admissible_actions, history, step_count, h)
        ids = chat_prompt_ids(tokenizer, text)
        if len(ids) <= max_prompt_length:
            return text, ids, h < history_length
        if not history:
            break
    log.warning("step prompt of %d tokens exceeds max_prompt_length=%d; cutting it from the left",
                len(ids), max_prompt_length)
    return text, ids[-max_prompt_length:], True


def conversation_turn_ids(tokenizer, reply_ids: list[int], turn_text: str) -> list[int]:
    """The ids a conversation-layout step appends after the previous reply ``reply_ids``: the
    end of that turn (:func:`serl.agent.tool_chat.end_of_turn_ids`), the user turn ``turn_text``
    and the assistant header, each tokenised on its own (ChatML; the same pieces as SFT's
    :func:`serl.agent.tool_chat.render_sft_conversation`)."""
    return end_of_turn_ids(tokenizer, reply_ids) + user_turn_ids(tokenizer, turn_text)


class Collector:
    """Runs groups of episodes to completion.

    Args:
        pool: an :class:`serl.envs.pool.EnvPool` with exactly ``len(tasks) * group_size`` envs
            for each :meth:`collect` call.
        engine: the rollout engine.
        tokenizer: the policy tokenizer (chat template applied to each step prompt).
        env_name: selects the prompt template and the parse fallback length.
        history_length: (observation, action) pairs shown in the prompt.
        max_steps: step limit of the loop (the env also enforces its own).
        max_prompt_length: tokens; step layout: longer prompts first lose history entries, then
            are cut from the left (counted in the ``rollout/prompt_truncated`` metric);
            conversation layout: the episode ends before a longer prompt (module docstring).
        prompt_layout: ``step`` or ``conversation`` (module docstring).
        turn_actions: the conversation layout's listed actions (``env.turn_actions``).
        action_selection: ``generate`` (the action the policy wrote) or ``score`` (its reasoning,
            then the admissible command it gives the highest likelihood:
            :mod:`serl.rollout.action_selection`; ``rollout.action_selection``).

    Raises:
        ValueError: unknown ``prompt_layout`` or ``action_selection``.
        ConfigError: ``conversation`` for an env with no turn builder; ``score`` with an engine
            that cannot score continuations.
    """

    def __init__(self, pool: EnvPool, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, env_name: str,
                 history_length: int, max_steps: int, max_prompt_length: int, prompt_layout: str = "step",
                 turn_actions: str = "state", action_selection: str = "generate"):
        if prompt_layout not in ("step", "conversation"):
            raise ValueError(f"unknown prompt_layout {prompt_layout!r}; valid: ['step', 'conversation']")
        if action_selection not in ACTION_SELECTIONS:
            raise ValueError(f"unknown action_selection {action_selection!r}; valid: {list(ACTION_SELECTIONS)}")
        self.selector = None
        if action_selection == "score":
            self.selector = ActionSelector(engine, tokenizer, get_env_class(env_name).free_text_actions,
                                           eos_ids=sorted(getattr(engine, "eos_ids", ()) or ()))
        self.prompt_layout, self.turn_actions = prompt_layout, turn_actions
        self.build_turn = get_turn_builder(env_name) if prompt_layout == "conversation" else None
        self.pool = pool
        self.engine = engine
        self.tokenizer = tokenizer
        self.env_name = env_name
        self.build_prompt = get_prompt_builder(env_name)
        self.fallback_chars = FALLBACK_CHARS.get(env_name, 30)
        self.history_length = history_length
        self.max_steps = max_steps
        self.max_prompt_length = max_prompt_length
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_config(cls, cfg: "Config", pool: "EnvPool", engine: RolloutEngine,
                    tokenizer: "PreTrainedTokenizerBase") -> "Collector":
        """The collector ``env.*`` and ``data.max_prompt_length`` describe."""
        return cls(pool, engine, tokenizer, cfg.env.name, cfg.env.history_length, cfg.env.max_steps,
                   cfg.data.max_prompt_length, cfg.env.prompt_layout, cfg.env.turn_actions,
                   cfg.rollout.action_selection)

    # ------------------------------------------------------------------ prompts
    def chat_ids(self, user_text: str) -> list[int]:
        """Token ids of a single-turn chat with generation prompt
        (SERL, arXiv 2605.19447; ``OliverLeeXZ/SERL@5a2a85b:agent_system/multi_turn_rollout/rollout_loop.py``)."""
        return chat_prompt_ids(self.tokenizer, user_text)

    def _prompt(self, st: _EnvState) -> tuple[str, list[int], bool]:
        """Build the step prompt and its ids: :func:`build_step_prompt` in the step layout; in the
        conversation layout the first prompt is the step layout's (no history), a later one the
        chat so far plus :func:`conversation_turn_ids`. Returns ``(text, ids, truncated)``;
        conversation ids longer than ``max_prompt_length`` are returned whole (the caller ends
        the episode)."""
        r = st.result
        if self.prompt_layout == "step" or not st.history:
            text, ids, truncated = build_step_prompt(self.build_prompt, self.tokenizer, st.traj.task_text, r.observation,
                                                     r.admissible_actions, st.history, self.history_length,
                                                     self.max_prompt_length)
            return text, ids, truncated
        text = self.build_turn(r.observation, r.admissible_actions, len(st.history), self.turn_actions)
        return text, st.conv + conversation_turn_ids(self.tokenizer, st.traj.steps[-1].response_ids, text), False

    def _next_prompt_text(self, st: _EnvState, res: StepResult) -> str:
        """SERL's ``next_observation_text`` of the step just taken: the prompt text of the step
        that follows (the step layout's whole prompt; the conversation layout's next user turn)."""
        if self.prompt_layout == "conversation":
            return self.build_turn(res.observation, res.admissible_actions, len(st.history), self.turn_actions)
        return self.build_prompt(st.traj.task_text, res.observation, res.admissible_actions, st.history,
                                 len(st.history), self.history_length)

    def _reply(self, resp: list[int]) -> tuple[str, list[int], str, bool]:
        """``(text, action mask, action, valid)`` of a reply's ids (:mod:`serl.agent.parsing`)."""
        text, amask = action_token_mask(resp, self.tokenizer)
        action, valid = project_action(text, self.fallback_chars)
        return text, amask, action, valid

    # ------------------------------------------------------------------ loop
    def collect(self, tasks: list[Task], group_size: int, params: SamplingParams,
                progress: Callable[[int, int], None] | None = None,
                reset_results: list[StepResult] | None = None) -> list[Group]:
        """Play ``group_size`` episodes of every task; returns one :class:`Group` per task.

        Args:
            tasks: one task per group.
            group_size: G, episodes per task.
            params: sampling settings.
            progress: optional callback ``(step, n_active)`` after each env step.
            reset_results: the pool's reset results for these tasks if the caller already reset
                it (e.g. with ``reset_async`` overlapped with the previous update); else the pool
                is reset here.

        Raises:
            serl.envs.base.EnvError: an env failed (e.g. a worker died); nothing is returned.
        """
        env_tasks = [t for t in tasks for _ in range(group_size)]
        groups = [Group(uid=uuid.uuid4().hex, task=t) for t in tasks]
        results = reset_results if reset_results is not None else self.pool.reset(env_tasks)
        states: list[_EnvState] = []
        for i, (task, res) in enumerate(zip(env_tasks, results)):
            g = groups[i // group_size]
            traj = Trajectory(uid=g.uid, traj_uid=uuid.uuid4().hex, task=task, task_text=res.task)
            if "expert_plan" in res.info:  # an env expert's plan from the initial state (ALFWorld's planner)
                traj.extra["expert_plan0"] = list(res.info["expert_plan"])
            g.trajectories.append(traj)
            states.append(_EnvState(traj=traj, result=res, done=res.done))

        n_prompts = n_truncated = n_overflow = 0
        conversation = self.prompt_layout == "conversation"
        for t in range(self.max_steps):
            prompt_ids, active = [], []
            for i, st in enumerate(states):
                if st.done:
                    continue
                text, ids, truncated = self._prompt(st)
                if conversation and len(ids) > self.max_prompt_length:
                    st.done = st.traj.steps[-1].done = True  # the chat would not fit: the episode ends here
                    n_overflow += 1
                    continue
                st.prompt = text
                active.append(i)
                prompt_ids.append(ids)
                n_prompts += 1
                n_truncated += truncated
            if not active:
                break
            responses, engine_lps = sample(self.engine, prompt_ids, params)
            replies = [self._reply(resp) for resp in responses]
            written: dict[int, str] = {}  # k -> the action the policy wrote, where a scored one replaced it
            if self.selector is not None:
                chosen = self.selector.select(prompt_ids, responses, [r[2] for r in replies],
                                              [states[i].result.admissible_actions for i in active],
                                              greedy=not params.do_sample, temperature=params.temperature)
                for k, new_resp in enumerate(chosen):
                    if new_resp is not None:  # the engine's log-probs were of the tokens replaced
                        written[k] = replies[k][2]
                        responses[k], replies[k] = new_resp, self._reply(new_resp)
                        if engine_lps is not None:
                            engine_lps[k] = None
            actions: list[str | None] = [None] * len(states)
            parsed = {}
            for k, (i, ids, resp) in enumerate(zip(active, prompt_ids, responses)):
                text, amask, action, valid = replies[k]
                actions[i] = action
                parsed[i] = (ids, resp, text, amask, action, valid, None if engine_lps is None else engine_lps[k],
                             written.get(k))
            step_results = self.pool.step(actions)
            for i in active:
                st = states[i]
                ids, resp, text, amask, action, valid, resp_lps, sampled_action = parsed[i]
                res = step_results[i]
                seen = st.result
                st.history.append((seen.observation, action))
                step = Step(
                    step_id=t, observation=seen.observation, prompt=st.prompt, prompt_ids=ids,
                    response_ids=resp, response_text=text, action_mask=amask, action=action,
                    action_valid=valid, admissible_actions=list(seen.admissible_actions),
                    reward=float(res.reward), feedback=res.feedback or res.observation,
                    done=bool(res.done), won=bool(res.won), info=_jsonable(res.info),
                    rollout_log_probs=resp_lps, prompt_format="conversation" if conversation else "chat",
                )
                if sampled_action is not None:  # rollout.action_selection=score: what the policy wrote
                    step.info["sampled_action"] = sampled_action
                st.traj.steps.append(step)
                st.result = res
                if conversation:
                    st.conv = ids + list(resp)
                st.done = bool(res.done) or t + 1 >= self.max_steps
                # next_observation_text: the prompt of the following step (SERL, arXiv 2605.19447)
                step.next_prompt = self._next_prompt_text(st, res)
            if progress is not None:
                progress(t + 1, sum(not s.done for s in states))
        self.last_metrics = {"rollout/prompt_truncated_fraction": n_truncated / max(1, n_prompts)}
        if self.selector is not None:
            self.last_metrics.update(self.selector.metrics())
        if conversation:
            self.last_metrics["rollout/context_overflow_fraction"] = n_overflow / max(1, len(states))
        return groups
