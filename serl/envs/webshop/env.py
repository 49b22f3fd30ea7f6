"""``WebShopEnv``: WebShop's text environment (1k products) behind serl's :class:`TextEnv` protocol.

One env plays one goal at a time. :meth:`WebShopEnv.reset` takes a :class:`Task` whose
``task_id`` is the goal index in WebShop's seed-233 order (``"h<k>"`` for human goal ``k``) and
whose ``seed`` fixes the episode's hidden prices and budget (:mod:`serl.envs.webshop.goals`), save
those given explicitly by ``env.webshop.task_prices`` (budget, target's and other products' hidden prices).

Per step it returns (as ``princeton-nlp/WebShop``'s text env and verl-agent's, ``xlan156/verl-agent@8ca3a46``):

* ``observation``: verl-agent's view of the page, i.e. the ``[SEP]`` segments after the
  instruction, each single-quoted, joined by ``" [SEP] "`` (the raw text when the page does not
  show the instruction, i.e. the done page). This is also the GiGPO / SERL anchor. With
  ``observation_mode="text_rich"`` it is WebShop's ``text_rich`` page text unchanged.
* ``feedback``: the same page text after the action (the next raw observation, as SERL's ``OliverLeeXZ/SERL@5a2a85b:agent_system/multi_turn_rollout/rollout_loop.py``).
* ``task``: the instruction text.
* ``admissible_actions``: ``search[<your query>]`` on the start page, ``click[x]`` per clickable.
* ``reward``: 10.0 when ``buy now`` scores exactly 1.0 (verl-agent's convention), else 0.0;
  ``won`` likewise. ``done`` on ``buy now`` or after ``max_steps`` steps.
* ``info``: ``task_score`` (WebShop's raw score in [0, 1]; 0.0 until a purchase),
  ``raw_observation`` (the ``[SEP]`` page text, or the ``text_rich`` text), ``page``, ``goal_index``, ``invalid_action`` and
  ``invalid_reason`` (invalid actions are no-ops: page and state unchanged), ``available_actions``
  (WebShop's ``{has_search_bar, clickables}``), ``truncated`` (step limit reached), and at the
  purchase ``purchased_asin``, ``purchased_options``, ``reward_details``, ``price``,
  ``price_upper``.

Data, goals and the search index are loaded once per process and data folder and shared by all
envs of that process (about 0.3 s with a warm index cache). No torch import.
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from serl.envs.base import BaseTextEnv, EnvError, StepResult, Task
from serl.envs.webshop import data as wsdata
from serl.envs.webshop.catalog import Catalog, hidden_price, load_catalog, search_contents
from serl.envs.webshop.goals import (Goal, TaskPrice, check_task_prices, load_task_prices, ordered_goals, priced_goal,
                                     split_indices)
from serl.envs.webshop.pages import OBSERVATION_MODES, SEP, Site
from serl.envs.webshop.reward import get_reward
from serl.envs.webshop.search import TOP_K, SearchIndex

if TYPE_CHECKING:
    from serl.config import EnvConfig
    from serl.trajectory import Trajectory

#: verl-agent's WebShop episode limit (``langfengQ/verl-agent@574dd5b:agent_system/environments``)
DEFAULT_MAX_STEPS = 15
#: RL reward of a perfect purchase (verl-agent: 10 iff score == 1.0)
SUCCESS_REWARD = 10.0
HUMAN_PREFIX = "h"


@dataclass
class WebShopWorld:
    """Everything read-only an env needs: catalogue, goals (both kinds) and the search index."""

    catalog: Catalog
    goals: list[Goal]
    human_goals: list[Goal]
    index: SearchIndex


_WORLDS: dict[str, WebShopWorld] = {}
_LOCK = threading.Lock()


def load_world(data_dir: str | os.PathLike | None = None) -> WebShopWorld:
    """The (cached) :class:`WebShopWorld` of a data folder (resolution: :func:`serl.envs.webshop.data.resolve_data_dir`).

    Raises:
        EnvError: missing or corrupt data.
    """
    folder = wsdata.resolve_data_dir(data_dir)
    key = str(folder)
    with _LOCK:
        world = _WORLDS.get(key)
        if world is None:
            cat = load_catalog(folder)
            index = SearchIndex([p.asin for p in cat.products], [search_contents(p) for p in cat.products])
            world = WebShopWorld(cat, ordered_goals(cat), ordered_goals(cat, human=True), index)
            _WORLDS[key] = world
    return world


def format_observation(raw: str, instruction: str) -> str:
    """verl-agent's ``format_obs``: the ``[SEP]`` parts after the first part equal to the
    instruction, each single-quoted, joined by ``" [SEP] "``; ``raw`` itself when the
    instruction is not on the page."""
    parts = raw.split(SEP)
    try:
        i = parts.index(instruction)
    except ValueError:
        return raw
    return SEP.join(f"'{p}'" for p in parts[i + 1 :])


_OPTIONS = ["human_goals", "observation_mode", "seed", "show_attrs", "task_prices"]


def _check_options(human_goals: bool, show_attrs: bool, max_steps: int, unknown: dict[str, Any] | None = None,
                   observation_mode: str = "text") -> None:
    if unknown:
        raise EnvError(f"unknown env.webshop option(s) {sorted(unknown)}; valid: {_OPTIONS}")
    if observation_mode not in OBSERVATION_MODES:
        raise EnvError(f"env.webshop.observation_mode must be one of {list(OBSERVATION_MODES)}, got {observation_mode!r}")
    if not isinstance(human_goals, bool):
        raise EnvError(f"env.webshop.human_goals must be true or false, got {human_goals!r}")
    if not isinstance(show_attrs, bool):
        raise EnvError(f"env.webshop.show_attrs must be true or false, got {show_attrs!r}")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise EnvError(f"env.max_steps must be an integer >= 1, got {max_steps!r}")


class WebShopEnv(BaseTextEnv):
    """WebShop (1k products, synthetic or human goals) as a :class:`~serl.envs.base.TextEnv`.

    Args:
        max_steps: episode step limit (verl-agent: 15); the episode ends (``truncated``) after it.
        data_dir: WebShop data folder (``env.data_dir``); None = ``$SERL_WEBSHOP_DATA``, then a
            ``webshop/`` folder in ``$SERL_DATA``, then the data shipped with serl.
        human_goals: accepted for symmetry with :meth:`list_tasks` (``env.webshop.human_goals``);
            the goal kind of an episode is given by its task id.
        show_attrs: show WebShop's ``Attributes`` button and page (off in WebShop and verl-agent).
        seed: unused by the env (the task carries its seed); accepted so that one
            ``env.webshop`` dict configures both the env and :meth:`list_tasks`.
        observation_mode: ``text`` (WebShop's ``[SEP]`` text, shown as verl-agent shows it) or
            ``text_rich`` (WebShop's ``convert_html_to_text(simple=False)``: one line per text
            node, ``[button] X [button_]`` marks, ``[clicked button]`` on chosen option values and
            opened products, ``You have clicked X.`` lines first); the observation is then that
            text as it is.
        task_prices: explicit per-task budgets and hidden prices (the target's and any other
            product's), a JSON file path or a mapping (:func:`serl.envs.webshop.goals.load_task_prices`),
            overriding the seeded draws.

    Raises:
        EnvError: bad or unknown options, missing or corrupt data; in ``task_prices`` an unknown
            task id or ASIN, a bad price, or a target price given twice with two values.
    """

    name = "webshop"
    max_steps = DEFAULT_MAX_STEPS
    prompt_builder = "serl.agent.prompts.webshop:build_prompt"
    turn_builder = "serl.agent.prompts.webshop:build_turn"
    default_max_steps = DEFAULT_MAX_STEPS
    free_text_actions = ("search[",)  # the query is the policy's own text
    expert_factory = "serl.envs.webshop.expert:make_expert"  # the goal-reading oracle (serl data expert)

    def __init__(self, max_steps: int = DEFAULT_MAX_STEPS, data_dir: str | os.PathLike | None = None,
                 human_goals: bool = False, show_attrs: bool = False, seed: int = 0, observation_mode: str = "text",
                 task_prices: str | os.PathLike | dict | None = None, **unknown: Any):
        _check_options(human_goals, show_attrs, max_steps, unknown, observation_mode)
        self.observation_mode = observation_mode
        self.task_prices: dict[str, TaskPrice] = load_task_prices(task_prices)
        self.target_price: Optional[float] = None
        self.explicit_prices: Optional[TaskPrice] = None
        self.max_steps = int(max_steps)
        self.data_dir = data_dir
        self.show_attrs = show_attrs
        self.world = load_world(data_dir)
        check_task_prices(self.task_prices, self.world.catalog, self._goal_of_id)
        self.site: Optional[Site] = None
        self.task: Optional[Task] = None
        self.goal: Optional[Goal] = None
        self.goal_index: int = -1
        self.price_upper: float = 0.0
        self.instruction: str = ""
        self.steps = 0
        self.done = True
        self.last_score = 0.0

    # ------------------------------------------------------------------ config hooks
    @classmethod
    def config_kwargs(cls, env_cfg: "EnvConfig") -> dict[str, Any]:
        """``max_steps`` and ``data_dir``, plus the ``env.webshop`` options (``human_goals``,
        ``show_attrs``, ``seed``); unknown options raise :class:`EnvError` when the env is built."""
        return {**super().config_kwargs(env_cfg), **dict(env_cfg.webshop)}

    @classmethod
    def tasks_from_config(cls, env_cfg: "EnvConfig", split: str) -> list[Task]:
        """:meth:`list_tasks` of ``split`` with the ``env.webshop`` options.

        Raises:
            EnvError: unknown split or option, missing data.
        """
        return cls.list_tasks(split, env_cfg.data_dir, **dict(env_cfg.webshop))

    @classmethod
    def episode_metrics(cls, trajectories: Sequence["Trajectory"]) -> dict[str, float]:
        """``webshop_task_score``: the mean raw WebShop score in [0, 1] of the episodes' last
        steps (``info["task_score"]``; 0 for an empty episode), the score WebShop (arXiv
        2207.01206) reports beside the success rate."""
        scores = [t.steps[-1].info.get("task_score", 0.0) if t.steps else 0.0 for t in trajectories]
        return {"webshop_task_score": sum(scores) / max(1, len(scores))}

    # ------------------------------------------------------------------ tasks
    @classmethod
    def list_tasks(cls, split: str, data_dir: str | os.PathLike | None = None, *, human_goals: bool = False,
                   seed: int = 0, show_attrs: bool = False, max_steps: int = DEFAULT_MAX_STEPS,
                   observation_mode: str = "text", task_prices: Any = None, **unknown: Any) -> list[Task]:
        """The tasks of ``split`` in goal order: ``test`` (goals 0–499), ``train`` (500–end) or ``all``.

        Args:
            split: ``train`` | ``test`` | ``all``.
            data_dir: as for the constructor.
            human_goals: list WebShop's human goals instead (13 on the 1k split, all in ``test``).
            seed: ``Task.seed`` of every task (fixes the hidden prices and budgets).
            show_attrs, max_steps, observation_mode, task_prices: env options, accepted so one
                ``env.webshop`` dict fits both.

        Raises:
            EnvError: unknown split, an empty split, or bad data.
        """
        _check_options(human_goals, show_attrs, max_steps, unknown, observation_mode)
        world = load_world(data_dir)
        goals = world.human_goals if human_goals else world.goals
        idx = split_indices(split, len(goals))
        if len(idx) == 0:
            kind = "human" if human_goals else "synthetic"
            raise EnvError(f"WebShop split {split!r} has no {kind} goals ({len(goals)} goals in all; test = the "
                           f"first 500). With human_goals=true use split 'test' or 'all'.")
        prefix = HUMAN_PREFIX if human_goals else ""
        return [Task("webshop", f"{prefix}{i}", "webshop", int(seed)) for i in idx]

    def _goal_of_id(self, tid: str) -> Goal:
        goals, i = self._goal_of(Task("webshop", tid, "webshop", 0))
        return goals[i]

    def _goal_of(self, task: Task) -> tuple[list[Goal], int]:
        tid = str(task.task_id)
        human = tid.startswith(HUMAN_PREFIX)
        goals = self.world.human_goals if human else self.world.goals
        try:
            i = int(tid[1:] if human else tid)
        except ValueError:
            raise EnvError(f"bad WebShop task id {tid!r}: expected a goal index like '12' or 'h3'") from None
        if not 0 <= i < len(goals):
            raise EnvError(f"WebShop task id {tid!r} out of range: {len(goals)} {'human' if human else 'synthetic'} goals")
        return goals, i

    # ------------------------------------------------------------------ episode
    def reset(self, task: Task) -> StepResult:
        """Start the goal of ``task`` on WebShop's start page (see the module docstring)."""
        if task.env_name != "webshop":
            raise EnvError(f"task {task.task_id!r} is for env {task.env_name!r}, not webshop")
        goals, i = self._goal_of(task)
        self.explicit_prices = self.task_prices.get(str(task.task_id))
        pg = priced_goal(self.world.catalog, goals, i, int(task.seed), self.explicit_prices)
        self.task, self.goal, self.goal_index = task, pg.goal, i
        self.price_upper = pg.price_upper
        self.target_price = pg.price
        rng = random.Random(f"serl-webshop/episode/{task.seed}/{task.task_id}")
        self.site = Site(self.world.catalog, self._search, pg.instruction_text, rng, self.show_attrs,
                         session_id=str(task.task_id))
        # the task as the agent sees it: the instruction's text node (verl-agent: parts[2])
        self.instruction = self.site.segments()[2]
        self.steps = 0
        self.done = False
        self.last_score = 0.0
        return self._result(reward=0.0, info={"invalid_action": False}, feedback="")

    def _search(self, query: str) -> list[str]:
        return self.world.index.search(query, TOP_K)

    def step(self, action: str) -> StepResult:
        """Apply ``action`` (``search[...]`` / ``click[...]``); anything else is a reported no-op.

        Raises:
            EnvError: called before :meth:`reset`.
        """
        if self.site is None:
            raise EnvError("WebShopEnv.step() called before reset()")
        if self.done:
            res = self._result(reward=0.0, info={"invalid_action": True, "invalid_reason": "episode over"})
            return res
        self.steps += 1
        valid, reason = self.site.act(str(action))
        info: dict[str, Any] = {"invalid_action": not valid}
        if not valid:
            info["invalid_reason"] = reason
        reward = 0.0
        if self.site.state.page == "done":
            reward = self._purchase(info)
            self.done = True
        elif self.steps >= self.max_steps:
            self.done = True
            info["truncated"] = True
        return self._result(reward=reward, info=info)

    def _purchase(self, info: dict[str, Any]) -> float:
        st = self.site.state
        cat = self.world.catalog
        product = cat.by_asin[st.asin]
        ex = self.explicit_prices  # env.webshop.task_prices; WebShop: product_prices[asin] (SimServer.done)
        price = ex.hidden_price_of(product.asin, self.goal.asin) if ex is not None else None
        if price is None:
            price = hidden_price(product, int(self.task.seed), self.goal_index)
        score, details = get_reward(cat, product, self.goal, price, self.price_upper, dict(st.options))
        st.score = score
        self.site._changed()
        self.last_score = score
        info.update(purchased_asin=st.asin, purchased_options=dict(st.options), reward_details=details,
                    price=price, price_upper=self.price_upper)
        return SUCCESS_REWARD if score == 1.0 else 0.0

    def _result(self, reward: float, info: dict[str, Any], feedback: Optional[str] = None) -> StepResult:
        site = self.site
        if self.observation_mode == "text_rich":
            raw = obs = site.rich_text()
        else:
            raw = site.text()
            obs = format_observation(raw, self.instruction)
        clickables = list(site.clickables())
        info.update(
            task_score=self.last_score,
            won=self.done and self.last_score == 1.0,
            raw_observation=raw,
            page=site.state.page,
            goal_index=self.goal_index,
            available_actions={"has_search_bar": site.has_search_bar(), "clickables": clickables},
        )
        info.setdefault("truncated", False)
        return StepResult(
            observation=obs,
            admissible_actions=site.admissible_actions(),
            reward=reward,
            done=self.done,
            won=bool(info["won"]),
            feedback=obs if feedback is None else feedback,
            task=self.instruction,
            info=info,
        )

    def close(self) -> None:
        """Drop the episode (the shared catalogue and index stay cached in the process)."""
        self.site = None
        self.done = True
