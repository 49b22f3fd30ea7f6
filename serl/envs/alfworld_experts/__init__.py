"""ALFWorld's scripted experts for supervised cold-start rows, handed out by
:attr:`serl.envs.alfworld.AlfWorldEnv.expert_factory` (:func:`make_expert`) and played by
:mod:`serl.rollout.expert` (``serl data expert alfworld``).

Each expert is an object with ``act(env, result, step) -> (think, action) | (think, action, weight)
| None`` (:meth:`serl.envs.base.BaseTextEnv.make_expert`); none of them imports anything of the
LLM side. One module per expert family:

* :mod:`.walkthrough`: ``expert="walkthrough"`` (the default; the game's stored plan) and
  ``expert="planner"`` (the env's planner asked at every state,
  :meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`), and the think templates of ALFWorld's
  replies (:data:`~.walkthrough.ALFWORLD_THINK`);
* :mod:`.search`: ``expert="search"`` / ``"sweep"``: the planner, except where its next action goes
  to fetch an object that no turn has named yet; there it searches (opens the closed receptacle it
  stands at, else goes to one it has not visited, drawn at random; the sweep: the first on the
  first turn's list; with ``think="state"`` every reply's reasoning names what the agent sees);
* :mod:`.detours`: the walkthrough with detours (``detours=p``): states after a wrong turn, as
  context, and the walkthrough's way on from there.
"""

from __future__ import annotations

from typing import Optional

from serl.envs.alfworld import AlfWorldEnv
from serl.envs.alfworld_experts.detours import AlfWorldDetourExpert
from serl.envs.alfworld_experts.search import AlfWorldSearchExpert
from serl.envs.alfworld_experts.walkthrough import (ALFWORLD_THINK, AlfWorldExpert, AlfWorldPlannerExpert,
                                                    alfworld_think, task_phrase)
from serl.envs.base import EnvError, Task

__all__ = ["ALFWORLD_EXPERTS", "ALFWORLD_THINK", "AlfWorldDetourExpert", "AlfWorldExpert", "AlfWorldPlannerExpert",
           "AlfWorldSearchExpert", "alfworld_think", "make_expert", "task_phrase"]

#: the ALFWorld experts of :func:`make_expert`; the first is the default (``AlfWorldEnv.expert_names``)
ALFWORLD_EXPERTS = AlfWorldEnv.expert_names


def make_expert(task: Task, seed: int, expert: Optional[str] = None, detours: float = 0.0, think: str = "task"):
    """ALFWorld's expert ``expert`` for ``task``: :class:`AlfWorldExpert` (``expert`` None or
    ``"walkthrough"``; with ``detours`` > 0 :class:`AlfWorldDetourExpert`, a detour before a
    ``go to`` with that probability), :class:`AlfWorldPlannerExpert` (``"planner"``) or
    :class:`AlfWorldSearchExpert` (``"search"``: the planner, searching for objects the agent has
    not seen in a random order; ``"sweep"``: in the order of the first turn's list; with
    ``think="state"`` every reply's reasoning names what the agent sees,
    :func:`~serl.envs.alfworld_experts.search.state_think`).

    Raises:
        EnvError: no ALFWorld expert of that name, ``detours`` for another expert than the
            walkthrough, or outside (0, 1], or ``think`` other than ``"task"`` but for the sweep
            (``"state"``).
    """
    if think != "task" and (expert != "sweep" or think != "state"):
        raise EnvError(f"think={think!r}: the reasoning that names what the agent sees ('state') is the sweep's "
                       f"(ALFWorld, expert='sweep'); got expert {expert or 'default'} for {task.env_name}")
    if detours and (expert not in (None, "walkthrough") or not 0.0 < detours <= 1.0):
        raise EnvError(f"detours are for ALFWorld's walkthrough expert, with a probability in (0, 1]; "
                       f"got detours={detours} for {task.env_name} expert {expert or 'default'}")
    if expert is None or expert == "walkthrough":
        return AlfWorldDetourExpert(task, seed, alfworld_think, detours) if detours else AlfWorldExpert(task, seed)
    if expert == "planner":
        return AlfWorldPlannerExpert(task, seed)
    if expert in ("search", "sweep"):
        return AlfWorldSearchExpert(task, seed, alfworld_think, "random" if expert == "search" else "list", think)
    raise EnvError(f"no ALFWorld expert {expert!r}; valid: {list(ALFWORLD_EXPERTS)}")
