"""Expert trajectories for a supervised cold start: scripted experts played through the real envs.

An expert plays a task through the same environment class the RL rollout uses, and every step
becomes one supervised row: the step prompt exactly as the RL :class:`~serl.rollout.collector.Collector`
would build it for that state (both call :func:`~serl.rollout.collector.build_step_prompt`: same
prompt builder, history window ``env.history_length``, history shrinking and left cut at
``data.max_prompt_length``, same chat template), and the target reply
``<think>…</think><action>…</action>``.

Experts
-------
Each env class hands out its own experts (:meth:`serl.envs.base.BaseTextEnv.make_expert`, the
factory its ``expert_factory`` names, as its ``rollout_loop`` names its loop); this module only
plays them (:func:`make_expert` asks the env class of ``task.env_name``), and names no env:

* **ALFWorld** (:mod:`serl.envs.alfworld_experts`): ``expert="walkthrough"`` (the default; the
  game's stored plan, replayed), ``"planner"`` (the env's planner asked at every state,
  :meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`), ``"search"`` / ``"sweep"`` (the planner,
  searching where it would fetch an object no turn has named yet:
  :mod:`serl.envs.alfworld_experts.search`; ``think="state"`` for the sweep), and the walkthrough
  with ``detours`` (:mod:`serl.envs.alfworld_experts.detours`).
* **WebShop** (:mod:`serl.envs.webshop.expert`): an oracle built from the episode's goal. WebShop's
  score is below 1.0 for about 7 % of synthetic goals even with this oracle, so trajectories are
  kept only if the final ``task_score >= min_score`` (:func:`collect_expert`; default 1.0 = the
  episode is *won*).

Think templates (no LLM)
------------------------
Each reply is ``<think>{think}</think><action>{action}</action>`` (:func:`format_response`); the
think text is one of a few templates of the env's expert, chosen by
:func:`serl.envs.base.expert_rng` (``random.Random(f"serl-expert/{seed}/{task.key}/{step}")``), so
a row depends only on the seed, the task and the step (not on the order tasks are played in, nor
on where the data lies: ``Task.key`` is the game path without its data root). The templates are
listed in each expert's module (ALFWorld's
:data:`~serl.envs.alfworld_experts.walkthrough.ALFWORLD_THINK`, WebShop's
:data:`~serl.envs.webshop.expert.WEBSHOP_THINK`).

Data flow: envs -> this module -> rows (JSONL, read by the SFT data loader). Nothing here imports
torch (the tokenizer is only used through its chat template).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from serl.agent.parsing import FALLBACK_CHARS, project_action
from serl.agent.prompts import get_prompt_builder
from serl.envs.base import EnvError, Task, env_names, expert_envs, get_env_class

def format_response(think: str, action: str) -> str:
    """The target reply of one step: ``<think>{think}</think><action>{action}</action>``."""
    return f"<think>{think}</think><action>{action}</action>"


# ------------------------------------------------------------------------------------ playing
@dataclass
class ExpertEpisode:
    """One expert episode: its rows and outcome.

    Attributes:
        task: the task played.
        rows: one dict per step (see :func:`play_expert` for the keys).
        won: the env's ``won`` at the last step.
        episode_reward: sum of the env rewards (ALFWorld 10 on a win; WebShop 10 iff score 1.0).
        task_score: the env's final ``info["task_score"]`` in [0, 1] where it reports one
            (WebShop's score), else 1.0 if won else 0.0 (ALFWorld).
        gave_up: the expert had no action before the episode ended.
        steps: the env steps played (one row each in the step layout; one row in all in the
            conversation layout).
    """

    task: Task
    rows: list[dict[str, Any]] = field(default_factory=list)
    won: bool = False
    episode_reward: float = 0.0
    task_score: float = 0.0
    gave_up: bool = False
    steps: int = 0


def _admissible(action: str, admissible_actions: list[str], free_text: tuple[str, ...] = ()) -> bool:
    """``action`` is listed, or writes its own argument where the state lists an action of that
    free-text prefix (``free_text``: the env class's ``free_text_actions``, WebShop's ``search[``,
    listed as ``search[<your query>]``)."""
    if action in admissible_actions:
        return True
    return any(action.startswith(p) and any(a.startswith(p) for a in admissible_actions) for p in free_text)


def conversation_row(step_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An episode's step rows as one conversation row (``env.prompt_layout=conversation``): the
    ``messages`` ``[user 0, assistant 0, user 1, assistant 1, ...]`` (each user text the
    conversation layout's turn, each assistant text the step's reply, with ``"weight": 0`` where
    the step row has it), which ``serl sft`` renders
    with :func:`serl.agent.tool_chat.render_sft_conversation`, the pieces the RL collector appends;
    ``actions`` and ``action_admissible`` per step; the episode's ``won`` / ``episode_reward`` /
    ``task_score``.

    Raises:
        ValueError: no rows.
    """
    if not step_rows:
        raise ValueError("conversation_row: an episode with no step")
    first = step_rows[0]
    messages: list[dict[str, str]] = []
    for r in step_rows:
        messages += [{"role": "user", "content": r["messages"][0]["content"]},
                     {"role": "assistant", "content": r["response"], **({"weight": 0} if r.get("weight", 1) == 0 else {})}]
    return {"env": first["env"], "task_id": first["task_id"], "task_type": first["task_type"],
            "steps": len(step_rows), "messages": messages, "actions": [r["action"] for r in step_rows],
            "action_admissible": [r["action_admissible"] for r in step_rows],
            "prompt_truncated": bool(first["prompt_truncated"]),
            **{k: first[k] for k in ("won", "episode_reward", "task_score") if k in first}}


def play_expert(env, task: Task, expert, tokenizer, history_length: int, max_prompt_length: int,
                max_steps: int, prompt_layout: str = "step", turn_actions: str = "state") -> ExpertEpisode:
    """Play ``expert`` on ``task`` through ``env`` and build one row per step (``prompt_layout``
    ``step``) or one :func:`conversation_row` per episode (``conversation``: the first user turn is
    the step layout's first prompt, a later one the env's turn builder's text, as the RL collector
    builds them).

    Each row: ``env``, ``task_id``, ``task_type``, ``step`` (0-based), ``messages``
    (``[{"role": "user", "content": <the step prompt the RL collector builds>}]``), ``response``
    (``<think>…</think><action>…</action>``), ``action``, ``action_admissible`` (the action is in
    the state's admissible list), ``prompt_truncated`` (history was
    dropped or the prompt ids were cut from the left to fit ``max_prompt_length``; the SFT
    loader must then cut the same way), ``weight`` 0 when the expert marks its reply as context
    only (:class:`~serl.envs.alfworld_experts.detours.AlfWorldDetourExpert`'s detours: kept in a
    conversation as an untrained reply, dropped from the step layout's rows), and after the
    episode ``won``, ``episode_reward`` and ``task_score`` of the whole episode.

    Args:
        env: an env instance of ``task.env_name`` in this process.
        task: the task to play.
        expert: an object with ``act(env, result, step) -> (think, action) | (think, action, weight) | None``.
        tokenizer: the policy tokenizer (its chat template sizes the prompt).
        history_length: ``env.history_length``.
        max_prompt_length: ``data.max_prompt_length`` (tokens).
        max_steps: the step limit of the episode.
        prompt_layout: ``step`` or ``conversation`` (``env.prompt_layout``).
        turn_actions: the conversation's listed actions (``env.turn_actions``).

    Raises:
        EnvError: the env failed, or the expert's action is not what
            :func:`~serl.agent.parsing.project_action` recovers from its own reply.
        ConfigError: ``conversation`` for an env with no turn builder.
    """
    from serl.agent.prompts import get_turn_builder
    from serl.rollout.collector import build_step_prompt

    build_prompt = get_prompt_builder(task.env_name)
    build_turn = get_turn_builder(task.env_name) if prompt_layout == "conversation" else None
    fallback = FALLBACK_CHARS.get(task.env_name, 30)
    free_text = get_env_class(task.env_name).free_text_actions
    res = env.reset(task)
    task_text = res.task
    history: list[tuple[str, str]] = []
    ep = ExpertEpisode(task=task)
    for t in range(max_steps):
        if res.done:
            break
        choice = expert.act(env, res, t)
        if choice is None:
            ep.gave_up = True
            break
        think, action, weight = choice if len(choice) == 3 else (*choice, 1)
        response = format_response(think, action)
        parsed, valid = project_action(response, fallback)
        if parsed != action or not valid:
            raise EnvError(f"expert reply {response!r} parses to {parsed!r} (valid={valid}), not to its action "
                           f"{action!r}; expert actions must be lower-case and stripped")
        if build_turn is not None and t > 0:
            text, truncated = build_turn(res.observation, res.admissible_actions, t, turn_actions), False
        else:
            text, _ids, truncated = build_step_prompt(build_prompt, tokenizer, task_text, res.observation,
                                                      res.admissible_actions, history, history_length,
                                                      max_prompt_length)
        nxt = env.step(action)
        history.append((res.observation, action))
        ep.rows.append({
            "env": task.env_name, "task_id": task.task_id, "task_type": task.task_type, "step": t,
            "messages": [{"role": "user", "content": text}], "response": response, "action": action,
            "action_admissible": _admissible(action, res.admissible_actions, free_text),
            "prompt_truncated": bool(truncated),
            **({"weight": 0} if weight == 0 else {}),
        })
        ep.episode_reward += float(nxt.reward)
        res = nxt
    ep.won = bool(res.won)
    ep.task_score = float(res.info.get("task_score", 1.0 if ep.won else 0.0))
    for row in ep.rows:
        row.update(won=ep.won, episode_reward=ep.episode_reward, task_score=ep.task_score)
    ep.steps = len(ep.rows)
    if build_turn is not None and ep.rows:
        ep.rows = [conversation_row(ep.rows)]
    else:  # a step row of weight 0 would train on nothing
        ep.rows = [r for r in ep.rows if r.get("weight", 1)]
    return ep


def make_expert(task: Task, seed: int, expert: Optional[str] = None, detours: float = 0.0, think: str = "task"):
    """The expert of ``task``, from the env class of ``task.env_name``
    (:meth:`~serl.envs.base.BaseTextEnv.make_expert`; ALFWorld's:
    :func:`serl.envs.alfworld_experts.make_expert`, WebShop's:
    :func:`serl.envs.webshop.expert.make_expert`).

    Args:
        task: the task to play.
        seed: the think-template seed.
        expert: the expert's name, one of the env class's ``expert_names`` (ALFWorld
            ``"walkthrough"``, ``"planner"``, ``"search"`` or ``"sweep"``); None = the env's default.
        detours: ALFWorld's walkthrough with detours, a probability in (0, 1] (0 = none: not passed
            on to the env).
        think: the replies' reasoning, ``"task"`` (the default: not passed on) or ``"state"``
            (ALFWorld's sweep).

    Raises:
        EnvError: no expert for that env (or no such env), no expert of that name for it,
            ``detours`` for another expert than the walkthrough, or outside (0, 1], or ``think``
            other than ``"task"`` but for the sweep (``"state"``).
    """
    options: dict[str, Any] = {}
    if think != "task":
        options["think"] = think
    if detours:
        options["detours"] = detours
    if task.env_name not in env_names():
        raise EnvError(f"no expert for env {task.env_name!r}; valid: {sorted(expert_envs())}")
    return get_env_class(task.env_name).make_expert(task, seed, expert, **options)


def pick_tasks(tasks: list[Task], num_tasks: int, seed: int) -> list[Task]:
    """``num_tasks`` tasks drawn without replacement with ``random.Random(seed)`` (all if
    ``num_tasks < 0`` or larger than the split), in the drawn order."""
    order = list(tasks)
    random.Random(seed).shuffle(order)
    return order if num_tasks < 0 else order[:num_tasks]


@dataclass
class ExpertSummary:
    """Counts of one :func:`collect_expert` call."""

    tasks: int = 0
    kept: int = 0
    rows: int = 0
    won: int = 0
    gave_up: int = 0
    task_score_sum: float = 0.0
    kept_by_type: dict[str, int] = field(default_factory=dict)
    plan_lengths: dict[str, list[int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "kept": self.kept, "rows": self.rows, "won": self.won,
                "gave_up": self.gave_up, "success_fraction": self.won / max(1, self.tasks),
                "mean_task_score": self.task_score_sum / max(1, self.tasks), "kept_by_type": self.kept_by_type}

    def add(self, task_type: str, won: bool, gave_up: bool, task_score: float, steps: int,
            kept_rows: Optional[list[dict[str, Any]]]) -> None:
        """Count one episode; ``kept_rows`` is None when it was not kept."""
        self.tasks += 1
        self.won += won
        self.gave_up += gave_up
        self.task_score_sum += task_score
        self.plan_lengths.setdefault(task_type, []).append(steps)
        if kept_rows is not None:
            self.kept += 1
            self.rows += len(kept_rows)
            self.kept_by_type[task_type] = self.kept_by_type.get(task_type, 0) + 1


def is_kept(ep: ExpertEpisode, min_score: float) -> bool:
    """Whether :func:`collect_expert` keeps an episode: its ``task_score >= min_score`` and it has rows."""
    return ep.task_score >= min_score and bool(ep.rows)


def collect_expert(env, tasks: Iterable[Task], tokenizer, *, history_length: int, max_prompt_length: int,
                   max_steps: int, seed: int = 0, min_score: float = 1.0,
                   on_episode: Optional[Callable[[ExpertEpisode, ExpertSummary], None]] = None,
                   expert: Optional[str] = None, prompt_layout: str = "step", turn_actions: str = "state",
                   detours: float = 0.0, think: str = "task") -> tuple[list[dict[str, Any]], ExpertSummary]:
    """Play the expert of every task and keep the episodes whose ``task_score >= min_score``.

    Args:
        env: one env instance (reused for every task).
        tasks: tasks to play, in order.
        tokenizer, history_length, max_prompt_length, max_steps: as for :func:`play_expert`.
        seed: think-template seed.
        min_score: keep threshold on the episode's ``task_score`` in [0, 1] (1.0: won only).
        on_episode: optional callback after each episode (progress bars).
        expert: which expert (:func:`make_expert`; ALFWorld ``"walkthrough"``, ``"planner"``,
            ``"search"`` or ``"sweep"``, None = the env's default).
        prompt_layout, turn_actions: as for :func:`play_expert` (``conversation``: one row per
            episode).
        detours: ALFWorld's walkthrough with detours (:func:`make_expert`; 0 = none).
        think: the replies' reasoning (:func:`make_expert`; ``"state"`` for the sweep).

    Returns:
        ``(rows, summary)``: the kept rows in task order, step order.

    Raises:
        EnvError: as :func:`play_expert` and :func:`make_expert` (the planner's
            :class:`~serl.envs.alfworld_expert.PlannerError` included).
    """
    rows: list[dict[str, Any]] = []
    summary = ExpertSummary()
    for task in tasks:
        ep = play_expert(env, task, make_expert(task, seed, expert, detours, think), tokenizer, history_length, max_prompt_length,
                         max_steps, prompt_layout, turn_actions)
        kept = is_kept(ep, min_score)
        summary.add(task.task_type, ep.won, ep.gave_up, ep.task_score, ep.steps, ep.rows if kept else None)
        if kept:
            rows.extend(ep.rows)
        if on_episode is not None:
            on_episode(ep, summary)
    return rows, summary


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write rows as JSON Lines (one object per line, no header), atomically."""
    from serl.utils import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read rows written by :func:`write_rows`."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
