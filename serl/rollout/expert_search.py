"""ALFWorld's planner expert made to search: it does not go for what the agent has not seen.

The planner (:meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`) sees the whole game: from the
first state its plan goes straight to the receptacle that holds the object, and takes it there.
A cold start trained on such episodes (the stored walkthroughs are the same plans) has never seen
a receptacle that does not hold what the agent came for, and the measured failure of serl's
ALFWorld cold starts follows: after its first ``go to`` the policy takes whatever the task names,
where it stands, whether or not it is there (docs: "ALFWorld", the cold start's look games).

This expert asks the planner at every state and follows it, except where the planner's next
action is a guess from the agent's side: a ``go to R`` whose purpose is to fetch an object (the
plan's next action there, past an ``open R``, is ``take X from R`` or ``use X``) that no
observation or admissible-action list so far has named (:func:`serl.rollout.dagger.label_is_seen`;
a ``take`` where the agent stands is in the state's list, and counts as seen). There it searches, as
an agent that has not seen ``X`` must:

* standing at a receptacle that is closed (``open R`` is admissible there): ``open R``;
* else ``go to R'`` for a receptacle ``R'`` it has not been at (read off the ``You arrive at R.``
  observations), drawn uniformly at random (one ``random.Random`` per seed and task);
* every receptacle visited (the object in a place the search cannot see into): the planner's action.

Every reply trains (weight 1): the search is the behaviour to learn. Once a turn names ``X``, the planner's plan goes there and takes it; a plan of the full game from there is still
the planner's own, so the episode wins unless the step limit ends it first. The search is serl's
(ALFWorld's ``handcoded`` expert explores too, with ``traj_data.json`` that the train split lacks:
:mod:`serl.envs.alfworld_expert`); a serl option, not part of any original recipe.
"""

from __future__ import annotations

import random
from typing import Callable, Optional

from serl.envs.base import StepResult, Task


class AlfWorldSearchExpert:
    """The planner, searching for what the agent has not seen (see the module docstring).

    Args:
        task: the ALFWorld task.
        seed: the think templates and the search order (one ``random.Random`` per task and seed).
        think: ``think(task_text, action, rng) -> str``, the reply's reasoning
            (:func:`serl.rollout.expert.alfworld_think`).

    ``act`` calls ``env.expert_plan()``, so the env must be an
    :class:`~serl.envs.alfworld.AlfWorldEnv` in this process. ``searches`` counts the actions the
    search chose instead of the planner, over the episode.
    """

    def __init__(self, task: Task, seed: int, think: Callable):
        self.task, self.seed, self.think = task, seed, think
        self.rng = random.Random(f"serl-expert-search/{seed}/{task.task_id}")
        self.seen: list[str] = []  # every observation and admissible list so far, the first first
        self.searches = 0

    def act(self, env, result: StepResult, step: int) -> Optional[tuple[str, str]]:
        """``(think, action)`` for the current state, or None when the planner's plan is empty (won).

        Raises:
            PlannerError: as :meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`.
        """
        from serl.rollout.dagger import label_is_seen

        self.seen += [result.observation, "\n".join(result.admissible_actions)]
        plan = env.expert_plan()
        if not plan:
            return None
        action = plan[0]
        if not label_is_seen(plan, "\n".join(self.seen)):
            found = search_step("\n".join(self.seen), result.admissible_actions, self.rng)
            if found is not None:
                action = found
                self.searches += 1
        return self.think(result.task, action, self.rng), action


def search_step(seen_text: str, admissible: list[str], rng: random.Random) -> Optional[str]:
    """One step of a search: ``open R`` if the agent stands at a closed ``R`` (``open R``
    admissible, ``R`` the last ``You arrive at R.`` in ``seen_text``), else ``go to`` an
    admissible receptacle not arrived at yet, drawn with ``rng`` (sorted first, so a seed draws the
    same one whatever the list's order); None when every receptacle has been visited.

    Args:
        seen_text: the observations so far, joined.
        admissible: the current state's admissible commands.
        rng: the draw.
    """
    from serl.rollout.dagger import arrived_at

    arrived = arrived_at(seen_text)
    if arrived and f"open {arrived[-1]}" in admissible:
        return f"open {arrived[-1]}"
    todo = sorted(a for a in admissible if a.startswith("go to ") and a[len("go to "):] not in arrived)
    return rng.choice(todo) if todo else None
