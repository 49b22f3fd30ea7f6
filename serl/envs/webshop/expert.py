"""WebShop's scripted expert for supervised cold-start rows: an oracle built from the episode's goal
(WebShop, arXiv 2207.01206), handed out by :attr:`serl.envs.webshop.env.WebShopEnv.expert_factory`
(:func:`make_expert`) and played by :mod:`serl.rollout.expert` (``serl data expert webshop``).

The only state it reads beyond the public :class:`~serl.envs.base.StepResult` (instruction,
observation, admissible actions, ``info["task_score"]``) is the env's public ``goal`` attribute
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
``task_score >= min_score`` (:func:`serl.rollout.expert.collect_expert`; default 1.0 = the
episode is *won*).

Think templates (no LLM, :data:`WEBSHOP_THINK`, drawn with :func:`serl.envs.base.expert_rng`):
``{task}`` is the instruction up to its first ``" with "`` (at most 8 words), ``{title}`` the first
6 words of the target's title, ``{option}`` an option value; replies stay short (the RL recipes
sample at most 96 tokens). By kind of action:

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

A leaf of the env package: it imports only :mod:`serl.envs.base` (not the env, its catalog or its
search index).
"""

from __future__ import annotations

import re
from typing import Optional

from serl.envs.base import EnvError, StepResult, Task, expert_rng

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
        return expert_rng(self.seed, self.task.key, step).choice(WEBSHOP_THINK[kind]).format(**kw)

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


def make_expert(task: Task, seed: int, expert: Optional[str] = None) -> WebShopOracle:
    """WebShop's one expert, :class:`WebShopOracle` (``expert`` must be None).

    Raises:
        EnvError: an ``expert`` name.
    """
    if expert is not None:
        raise EnvError(f"WebShop has one expert (the goal-reading oracle); got expert={expert!r}")
    return WebShopOracle(task, seed)
