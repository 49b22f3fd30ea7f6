"""ALFWorld's walkthrough and planner experts, and the think templates of ALFWorld's expert replies.

* :class:`AlfWorldExpert` (``expert="walkthrough"``, the default): the game's stored plan, the
  ``walkthrough`` list of ``game.tw-pddl`` (ALFWorld, arXiv 2010.03768; ``alfworld/alfworld``
  0.4.2 writes it into every 2.1.2 game file), replayed command by command from the initial
  state. Every walkthrough is lower-case and admissible, so
  :func:`serl.agent.parsing.project_action` returns it unchanged.
* :class:`AlfWorldPlannerExpert` (``expert="planner"``): the env's planner expert asked at every
  state (:meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`; fast-downward on the current state's
  relevant sub-problem, :mod:`serl.envs.alfworld_expert`), taking the first command of its plan.
  The env answers from the rest of its last plan while the episode follows it, so an expert
  episode costs about one search; a state off the plan is searched again.

Think templates (no LLM, :data:`ALFWORLD_THINK`): ``{task}`` is the task sentence without its
final period (e.g. ``put a clean apple in diningtable``) and ``{action}`` the command itself; the
template of a step is drawn with :func:`serl.envs.base.expert_rng`::

    To {task}, I should {action}.
    My task is to {task}. The next step is to {action}.
    I need to {task}. Now I will {action}.
"""

from __future__ import annotations

import random
from typing import Optional

from serl.envs.base import StepResult, Task, expert_rng

#: ALFWorld think templates: ``{task}`` the task sentence, ``{action}`` the command
ALFWORLD_THINK = (
    "To {task}, I should {action}.",
    "My task is to {task}. The next step is to {action}.",
    "I need to {task}. Now I will {action}.",
)


def task_phrase(task_text: str) -> str:
    """The task sentence as the think templates' ``{task}``: stripped, without its final period."""
    return task_text.strip().rstrip(".").strip()


def alfworld_think(task_text: str, action: str, rng: random.Random) -> str:
    """An ALFWorld reply's reasoning: one of :data:`ALFWORLD_THINK`, drawn with ``rng``."""
    return rng.choice(ALFWORLD_THINK).format(task=task_phrase(task_text), action=action)


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
        tpl = expert_rng(self.seed, self.task.key, step).choice(ALFWORLD_THINK)
        return tpl.format(task=task_phrase(result.task), action=action), action


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
        tpl = expert_rng(self.seed, self.task.key, step).choice(ALFWORLD_THINK)
        return tpl.format(task=task_phrase(result.task), action=action), action
