"""Expert trajectories for a supervised cold start: scripted experts played through the real envs.

An expert plays a task through the same environment class the RL rollout uses, and every step
becomes one supervised row: the step prompt exactly as the RL :class:`~serl.rollout.collector.Collector`
would build it for that state (both call :func:`~serl.rollout.collector.build_step_prompt`: same
prompt builder, history window ``env.history_length``, history shrinking and left cut at
``data.max_prompt_length``, same chat template), and the target reply
``<think>…</think><action>…</action>``.

Experts
-------
* **ALFWorld**, ``expert="walkthrough"`` (the default): the game's stored plan, the
  ``walkthrough`` list of ``game.tw-pddl`` (ALFWorld, arXiv 2010.03768; ``alfworld/alfworld``
  0.4.2 writes it into every 2.1.2 game file), replayed command by command from the initial
  state. Every walkthrough is lower-case and admissible, so
  :func:`serl.agent.parsing.project_action` returns it unchanged.
* **ALFWorld**, ``expert="planner"``: the env's planner expert asked at every state
  (:meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`; fast-downward on the current state's
  relevant sub-problem, :mod:`serl.envs.alfworld_expert`), taking the first command of its plan.
  The env answers from the rest of its last plan while the episode follows it, so an expert
  episode costs about one search; a state off the plan is searched again.
* **ALFWorld**, ``expert="search"``: the planner, except where its next action goes to fetch an
  object that no turn has named yet; there it searches (opens the closed receptacle it
  stands at, else goes to one it has not visited, drawn at random; ``expert="sweep"``: the first
  on the first turn's list):
  :mod:`serl.rollout.expert_search`.
* **WebShop**: an oracle built from the episode's goal (WebShop, arXiv 2207.01206). The only
  state it reads beyond the public :class:`~serl.envs.base.StepResult` (instruction, observation,
  admissible actions, ``info["task_score"]``) is the env's public ``goal`` attribute
  (:class:`serl.envs.webshop.goals.Goal`): the target ``asin``, the target's title ``name`` and
  ``goal_options``. Policy, one action per step:

  1. ``search[<instruction>]``: the instruction as shown, lower-cased, without its
     ``", and price lower than … dollars"`` clause and without ``[`` / ``]``.
  2. On a results page: ``click[<target asin>]`` if listed; else ``click[next >]`` while the
     page number is below :data:`WEBSHOP_MAX_PAGES`; else a narrower query, the target's title
     (``search[<title>]``), once.
  3. On the target's item page: ``click[<value>]`` for each goal option value that the page
     offers and that is not chosen yet, in the goal's order; then ``click[buy now]``.
  4. Anything else (e.g. the target never listed): the episode is given up and dropped.

  WebShop's score is below 1.0 for about 7 % of synthetic goals even with this oracle (option
  and attribute matching are lenient), so trajectories are kept only if the final
  ``task_score >= min_score`` (:func:`collect_expert`; default 1.0 = the episode is *won*).

Think templates (no LLM)
------------------------
Each reply is ``<think>{think}</think><action>{action}</action>``; the think text is one of a few
templates, chosen by ``random.Random(f"serl-expert/{seed}/{task.key}/{step}")``, so a row depends
only on the seed, the task and the step (not on the order tasks are played in, nor on where the
data lies: ``Task.key`` is the game path without its data root).
ALFWorld's ``{task}`` is the task sentence without its final period (e.g. ``put a clean apple in
diningtable``) and ``{action}`` the command itself. WebShop's ``{task}`` is the instruction up to
its first ``" with "`` (at most 8 words), ``{title}`` the first 6 words of the target's title,
``{option}`` an option value; replies stay short (the RL recipes sample at most 96 tokens).

ALFWorld (:data:`ALFWORLD_THINK`)::

    To {task}, I should {action}.
    My task is to {task}. The next step is to {action}.
    I need to {task}. Now I will {action}.

WebShop (:data:`WEBSHOP_THINK`), by kind of action:

* ``search``: "My task: {task}. I should search for it first." / "Task: {task}. I will start
  with a search."
* ``narrow`` (the second search): "The product I need is not among these results. I should search
  again with a more specific query." / "These results do not show what I need; a narrower search
  should find it."
* ``next``: "None of the products on this page fits the request. I should look at the next
  page." / "The item I need is not listed here; I will check the next page of results."
* ``product``: "Product {asin}, {title}, matches the request. I should open it." / "{title}
  ({asin}) fits what I need; I will click it."
* ``option``: "The request asks for {option}. I should select it." / "I need the {option}
  option, so I will click it."
* ``buy``: "The product matches and the requested options are selected. I should buy it now." /
  "Everything the request asks for is set; I will click buy now."

Data flow: envs -> this module -> rows (JSONL, read by the SFT data loader). Nothing here imports
torch (the tokenizer is only used through its chat template).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from serl.agent.parsing import FALLBACK_CHARS, project_action
from serl.agent.prompts import get_prompt_builder
from serl.envs.base import EnvError, StepResult, Task

#: ALFWorld think templates: ``{task}`` the task sentence, ``{action}`` the command
ALFWORLD_THINK = (
    "To {task}, I should {action}.",
    "My task is to {task}. The next step is to {action}.",
    "I need to {task}. Now I will {action}.",
)

#: WebShop think templates per kind of action
WEBSHOP_THINK = {
    "search": (
        "My task: {task}. I should search for it first.",
        "Task: {task}. I will start with a search.",
    ),
    "narrow": (
        "The product I need is not among these results. I should search again with a more specific query.",
        "These results do not show what I need; a narrower search should find it.",
    ),
    "next": (
        "None of the products on this page fits the request. I should look at the next page.",
        "The item I need is not listed here; I will check the next page of results.",
    ),
    "product": (
        "Product {asin}, {title}, matches the request. I should open it.",
        "{title} ({asin}) fits what I need; I will click it.",
    ),
    "option": (
        "The request asks for {option}. I should select it.",
        "I need the {option} option, so I will click it.",
    ),
    "buy": (
        "The product matches and the requested options are selected. I should buy it now.",
        "Everything the request asks for is set; I will click buy now.",
    ),
}

#: results pages the WebShop oracle looks through before it searches with a narrower query
WEBSHOP_MAX_PAGES = 3
#: the price clause WebShop appends to a synthetic instruction
_PRICE_CLAUSE = re.compile(r",? and price lower than [0-9.]+ dollars\s*$", re.IGNORECASE)


def format_response(think: str, action: str) -> str:
    """The target reply of one step: ``<think>{think}</think><action>{action}</action>``."""
    return f"<think>{think}</think><action>{action}</action>"


def _rng(seed: int, task_key: str, step: int) -> random.Random:
    return random.Random(f"serl-expert/{seed}/{task_key}/{step}")


def _task_phrase(task_text: str) -> str:
    return task_text.strip().rstrip(".").strip()


def alfworld_think(task_text: str, action: str, rng: random.Random) -> str:
    """An ALFWorld reply's reasoning: one of :data:`ALFWORLD_THINK`, drawn with ``rng``."""
    return rng.choice(ALFWORLD_THINK).format(task=_task_phrase(task_text), action=action)


# ------------------------------------------------------------------------------------ experts
class AlfWorldExpert:
    """Replays a game's ``walkthrough`` (see the module docstring).

    Args:
        task: the ALFWorld task (its ``task_id`` is the game path).
        seed: picks the think template of each step.

    Raises:
        EnvError: the game file is missing, corrupt or has no walkthrough.
    """

    def __init__(self, task: Task, seed: int):
        from serl.envs.alfworld import walkthrough

        self.task = task
        self.seed = seed
        self.plan = walkthrough(task)

    def act(self, env, result: StepResult, step: int) -> Optional[tuple[str, str]]:
        """``(think, action)`` of step ``step`` (0-based), or None when the plan is exhausted."""
        if step >= len(self.plan):
            return None
        action = self.plan[step]
        tpl = _rng(self.seed, self.task.key, step).choice(ALFWORLD_THINK)
        return tpl.format(task=_task_phrase(result.task), action=action), action


class AlfWorldPlannerExpert:
    """Asks the env's planner expert at every state (see the module docstring).

    Args:
        task: the ALFWorld task.
        seed: picks the think template of each step.

    ``act`` calls ``env.expert_plan()``, so the env must be an
    :class:`~serl.envs.alfworld.AlfWorldEnv` in this process.
    """

    def __init__(self, task: Task, seed: int):
        self.task = task
        self.seed = seed

    def act(self, env, result: StepResult, step: int) -> Optional[tuple[str, str]]:
        """``(think, action)``: the first command of the planner's plan from the current state,
        or None when the plan is empty (the game is won).

        Raises:
            PlannerError: the planner found no plan or planned an inadmissible command
                (:meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`).
        """
        plan = env.expert_plan()
        if not plan:
            return None
        action = plan[0]
        tpl = _rng(self.seed, self.task.key, step).choice(ALFWORLD_THINK)
        return tpl.format(task=_task_phrase(result.task), action=action), action


class WebShopOracle:
    """The goal-reading WebShop oracle (see the module docstring for the policy).

    Args:
        task: the WebShop task.
        seed: picks the think template of each step.

    ``act`` reads ``env.goal`` (a public attribute of :class:`serl.envs.webshop.env.WebShopEnv`),
    so the env must live in this process (not in an :class:`~serl.envs.pool.EnvPool` worker).
    """

    def __init__(self, task: Task, seed: int):
        self.task = task
        self.seed = seed
        self.searches = 0  # searches made so far
        self.page = 0  # results page being shown
        self.on_target = False  # the last click opened the target's item page
        self.chosen: set[str] = set()  # option values clicked on the target's page

    @staticmethod
    def search_query(instruction: str) -> str:
        """The first query: the instruction, lower-cased, without its price clause and brackets."""
        q = _PRICE_CLAUSE.sub("", instruction.strip())
        return re.sub(r"\s+", " ", q.replace("[", " ").replace("]", " ")).strip().lower()

    @staticmethod
    def short(text: str, words: int) -> str:
        """The first ``words`` words of ``text`` without its price clause, cut at its first ``" with "``
        and stripped of trailing punctuation."""
        head = _PRICE_CLAUSE.sub("", text.strip()).split(" with ", 1)[0].strip().rstrip(".,")
        return " ".join(head.split()[:words]).rstrip(".,;:")

    def _think(self, kind: str, step: int, **kw: str) -> str:
        return _rng(self.seed, self.task.key, step).choice(WEBSHOP_THINK[kind]).format(**kw)

    def act(self, env, result: StepResult, step: int) -> Optional[tuple[str, str]]:
        """``(think, action)`` for the current page, or None to give the episode up."""
        goal = env.goal
        adm = set(result.admissible_actions)
        page = result.info.get("page")
        if page == "start":
            self.searches, self.page, self.on_target = 1, 1, False
            task = self.short(result.task, 8)
            return self._think("search", step, task=task), f"search[{self.search_query(result.task)}]"
        if page == "results":
            target = f"click[{goal.asin.lower()}]"
            if target in adm:
                self.on_target, self.chosen = True, set()
                return self._think("product", step, asin=goal.asin, title=self.short(goal.name, 6)), target
            if self.page < WEBSHOP_MAX_PAGES and "click[next >]" in adm:
                self.page += 1
                return self._think("next", step), "click[next >]"
            if self.searches == 1:
                self.searches, self.page = 2, 1
                return self._think("narrow", step), f"search[{self.search_query(goal.name)}]"
            return None
        if page == "item" and self.on_target:
            values = goal.goal_options.values() if isinstance(goal.goal_options, dict) else goal.goal_options
            for v in values:
                v = str(v).lower()
                if v not in self.chosen and f"click[{v}]" in adm:
                    self.chosen.add(v)
                    return self._think("option", step, option=v), f"click[{v}]"
            if "click[buy now]" in adm:
                return self._think("buy", step), "click[buy now]"
        return None


# ------------------------------------------------------------------------------------ playing
@dataclass
class ExpertEpisode:
    """One expert episode: its rows and outcome.

    Attributes:
        task: the task played.
        rows: one dict per step (see :func:`play_expert` for the keys).
        won: the env's ``won`` at the last step.
        episode_reward: sum of the env rewards (ALFWorld 10 on a win; WebShop 10 iff score 1.0).
        task_score: WebShop's final score in [0, 1] (ALFWorld: 1.0 if won else 0.0).
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


def _admissible(action: str, admissible_actions: list[str]) -> bool:
    """``action`` is listed, or is a search where WebShop lists ``search[<your query>]``."""
    if action in admissible_actions:
        return True
    return action.startswith("search[") and any(a.startswith("search[") for a in admissible_actions)


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
    only (:class:`~serl.rollout.expert_detours.AlfWorldDetourExpert`'s detours: kept in a
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
            "action_admissible": _admissible(action, res.admissible_actions), "prompt_truncated": bool(truncated),
            **({"weight": 0} if weight == 0 else {}),
        })
        ep.episode_reward += float(nxt.reward)
        res = nxt
    ep.won = bool(res.won)
    ep.task_score = float(res.info.get("task_score", 1.0 if ep.won else 0.0)) if task.env_name == "webshop" \
        else (1.0 if ep.won else 0.0)
    for row in ep.rows:
        row.update(won=ep.won, episode_reward=ep.episode_reward, task_score=ep.task_score)
    ep.steps = len(ep.rows)
    if build_turn is not None and ep.rows:
        ep.rows = [conversation_row(ep.rows)]
    else:  # a step row of weight 0 would train on nothing
        ep.rows = [r for r in ep.rows if r.get("weight", 1)]
    return ep


#: the ALFWorld experts of :func:`make_expert`; the first is the default
ALFWORLD_EXPERTS = ("walkthrough", "planner", "search", "sweep")


def make_expert(task: Task, seed: int, expert: Optional[str] = None, detours: float = 0.0, think: str = "task"):
    """The expert of ``task.env_name``: for ALFWorld :class:`AlfWorldExpert` (``expert`` None or
    ``"walkthrough"``; with ``detours`` > 0
    :class:`~serl.rollout.expert_detours.AlfWorldDetourExpert`, a detour before a ``go to`` with
    that probability), :class:`AlfWorldPlannerExpert` (``"planner"``) or
    :class:`~serl.rollout.expert_search.AlfWorldSearchExpert` (``"search"``: the planner, searching
    for objects the agent has not seen in a random order; ``"sweep"``: in the order of the first
    turn's list; with ``think="state"`` every reply's reasoning names what the agent sees,
    :func:`~serl.rollout.expert_search.state_think`); for WebShop
    :class:`WebShopOracle` (``expert`` must be None).

    Raises:
        EnvError: no expert for that env, no expert of that name for it, ``detours`` for
            another expert than the walkthrough, or outside [0, 1], or ``think`` other than
            ``"task"`` but for the sweep (``"state"``).
    """
    if think != "task" and (task.env_name != "alfworld" or expert != "sweep" or think != "state"):
        raise EnvError(f"think={think!r}: the reasoning that names what the agent sees ('state') is the sweep's "
                       f"(ALFWorld, expert='sweep'); got expert {expert or 'default'} for {task.env_name}")
    if detours and (task.env_name != "alfworld" or expert not in (None, "walkthrough") or not 0.0 < detours <= 1.0):
        raise EnvError(f"detours are for ALFWorld's walkthrough expert, with a probability in (0, 1]; "
                       f"got detours={detours} for {task.env_name} expert {expert or 'default'}")
    if task.env_name == "alfworld":
        if (expert is None or expert == "walkthrough") and detours:
            from serl.rollout.expert_detours import AlfWorldDetourExpert

            return AlfWorldDetourExpert(task, seed, alfworld_think, detours)
        if expert is None or expert == "walkthrough":
            return AlfWorldExpert(task, seed)
        if expert == "planner":
            return AlfWorldPlannerExpert(task, seed)
        if expert in ("search", "sweep"):
            from serl.rollout.expert_search import AlfWorldSearchExpert

            return AlfWorldSearchExpert(task, seed, alfworld_think, "random" if expert == "search" else "list", think)
        raise EnvError(f"no ALFWorld expert {expert!r}; valid: {list(ALFWORLD_EXPERTS)}")
    if task.env_name == "webshop":
        if expert is not None:
            raise EnvError(f"WebShop has one expert (the goal-reading oracle); got expert={expert!r}")
        return WebShopOracle(task, seed)
    raise EnvError(f"no expert for env {task.env_name!r}; valid: ['alfworld', 'webshop']")


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
