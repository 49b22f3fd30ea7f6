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
observation or admissible-action list so far has named (:func:`label_is_seen`;
a ``take`` where the agent stands is in the state's list, and counts as seen). There it searches, as
an agent that has not seen ``X`` must:

* standing at a receptacle that is closed (``open R`` is admissible there): ``open R``;
* else ``go to R'`` for a receptacle ``R'`` it has not been at (read off the ``You arrive at R.``
  observations): with ``order="random"`` (``--expert search``) drawn uniformly at random (one
  ``random.Random`` per seed and ``Task.key``, so the same on every machine); with
  ``order="list"`` (``--expert sweep``) the first receptacle in the first turn's admissible
  ``go to`` list that it has neither arrived at nor opened (``open`` it where it stands beside it,
  closed: drawer 3 beside drawer 2 has no ``go to``), and the reply's reasoning says so (``I have
  not seen a mug yet; cabinet 3 is the first place on the list I have not been to.``), so the chat
  determines the target;
* every receptacle visited (the object in a place the search cannot see into): the planner's action.

With ``think_mode="state"`` (``--expert sweep --think state``) every reply's reasoning names what
the agent sees and why the action follows (:func:`state_think`: ``The cabinet 3 is closed and I have
not seen a mug yet, so I open it.``), where by default the replies other than the sweep's ``go to``
take the walkthroughs' task templates; the actions are the same either way.

Every reply trains (weight 1): the search is the behaviour to learn. Once a turn names ``X``,
the planner's plan goes there and takes it; a plan of the full game from there is still the
planner's own, so the episode wins unless the step limit ends it first. The search is serl's
(ALFWorld's ``handcoded`` expert explores too, with ``traj_data.json`` that the train split lacks:
:mod:`serl.envs.alfworld_expert`); a serl option, not part of any original recipe.

Measured (docs: "ALFWorld", "Episodes that search"): the random order wins 290 of 300 train games
of all six types, but one epoch of SFT on those episodes made serl's conversation cold start far
worse (3 of 54 held-out games against 19): a target drawn at random cannot be predicted from the
chat, so the model learnt to move and take, not to search. The list order is built for that (a
target the chat determines); 7 SFT steps on 100 of its episodes did not teach it (none of the
cold start's replies on 27 held-out games took up its reasoning). Against the expert's own
held-out episodes (``serl sft``'s ``val/reply_exact``), such models write 34–41% of the sweep's
later replies exactly but none of its first, the first turn, where the walkthroughs go straight to
the object: they do not start a sweep. More steps on 194 episodes moved the first turn (step 15 of
a 2-epoch run: 69% of the later replies exact, and greedy decoding opens a sweep at the first turn
of all 24 held-out games, none word for word; docs: "ALFWorld", "Where the sweep is learnt").
``think_mode="state"`` did not change that break at small scale: after 20 LoRA steps on the first
12 turns of 77 episodes, with either reasoning, the fine-tuned cold start copied its own first
reply (0 opens, 0 takes in 8 steps on 54 held-out games; docs: "ALFWorld", "A sweep whose replies
say what the agent sees").
"""

from __future__ import annotations

import random
import re
from typing import Callable, Optional

from serl.envs.base import StepResult, Task

SEARCH_ORDERS = ("random", "list")
#: what a sweep reply's reasoning says: ``"task"``, the walkthroughs' task templates (the sweep's go
#: to sentence aside); ``"state"``, what the agent sees and why the action follows (:func:`state_think`)
THINK_MODES = ("task", "state")
SWEEP_THINK = "I have not seen {article} {kind} yet; {place} is the first place on the list I have not been to."
_FOUND = re.compile(r"^(?:take (.+) from .+|use (.+))$")
_WITH = re.compile(r"^(heat|cool|clean) (.+) with (.+)$")
_MOVE = re.compile(r"^move (.+) to (.+)$")
_ARRIVE = re.compile(r"You arrive at (.+?)\.")
_OPENED = re.compile(r"You open the (.+?)\.")


class AlfWorldSearchExpert:
    """The planner, searching for what the agent has not seen (see the module docstring).

    Args:
        task: the ALFWorld task.
        seed: the think templates and the random search order (one ``random.Random`` per
            ``Task.key`` and seed).
        think: ``think(task_text, action, rng) -> str``, the reply's reasoning
            (:func:`serl.envs.alfworld_experts.walkthrough.alfworld_think`).
        order: ``"random"`` or ``"list"`` (:data:`SEARCH_ORDERS`; see the module docstring).
        think_mode: ``"task"`` (``think`` for every reply but the sweep's ``go to`` sentence) or
            ``"state"`` (order ``"list"`` only: :func:`state_think` for every reply, ``think`` unused).

    Raises:
        ValueError: ``order`` not in :data:`SEARCH_ORDERS`, ``think_mode`` not in
            :data:`THINK_MODES`, or ``"state"`` with the random order.

    ``act`` calls ``env.expert_plan()``, so the env must be an
    :class:`~serl.envs.alfworld.AlfWorldEnv` in this process. ``searches`` counts the actions the
    search chose instead of the planner, over the episode.
    """

    def __init__(self, task: Task, seed: int, think: Callable, order: str = "random", think_mode: str = "task"):
        if order not in SEARCH_ORDERS:
            raise ValueError(f"search order must be one of {list(SEARCH_ORDERS)}, got {order!r}")
        if think_mode not in THINK_MODES or (think_mode == "state" and order != "list"):
            raise ValueError(f"think mode must be one of {list(THINK_MODES)} ('state' with the list order, "
                             f"the sweep), got {think_mode!r} with order {order!r}")
        self.task, self.seed, self.think, self.order, self.think_mode = task, seed, think, order, think_mode
        self.rng = random.Random(f"serl-expert-search/{seed}/{task.key}")
        self.seen: list[str] = []  # every observation and admissible list so far, the first first
        self.places: Optional[list[str]] = None  # the first turn's go-to list (order="list")
        self.searches = 0

    def act(self, env, result: StepResult, step: int) -> Optional[tuple[str, str]]:
        """``(think, action)`` for the current state, or None when the planner's plan is empty (won).

        Raises:
            PlannerError: as :meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`.
        """
        self.seen += [result.observation, "\n".join(result.admissible_actions)]
        if self.places is None:
            self.places = [a[len("go to "):] for a in result.admissible_actions if a.startswith("go to ")]
        plan = env.expert_plan()
        if not plan:
            return None
        action, seen = plan[0], "\n".join(self.seen)
        if not label_is_seen(plan, seen):
            if self.order == "list":
                found = sweep_step(plan, seen, result.admissible_actions, self.places)
            else:
                drawn = search_step(seen, result.admissible_actions, self.rng)
                found = None if drawn is None else (None, drawn)
            if found is not None:
                self.searches += 1
                think, action = found
                if think is not None:
                    return think, action
                if self.think_mode == "state":
                    return state_think(action, plan, searching=object_type(fetched_object(plan))), action
        if self.think_mode == "state":
            return state_think(action, plan, seen=label_is_seen(plan, seen)), action
        return self.think(result.task, action, self.rng), action


def sweep_step(plan: list[str], seen_text: str, admissible: list[str],
               places: list[str]) -> Optional[tuple[Optional[str], str]]:
    """The sweep's step (``--expert sweep``, the module docstring) at a state where the planner's
    ``plan`` fetches an object the agent has not seen: ``(think, action)`` with ``action`` from
    :func:`search_step` in ``places``' order and ``think`` the sweep's reasoning
    (:data:`SWEEP_THINK`: the object's type and the place, so the chat determines the target), or
    ``think`` None for an ``open`` of the receptacle the agent stands at (the caller's reasoning
    template). None when every place was visited.

    Args:
        plan: the planner's plan from the state (non-empty, its first action a ``go to`` that
            fetches an object: :func:`label_is_seen` False).
        seen_text: the observations (and admissible lists) so far, joined.
        admissible: the state's admissible commands.
        places: the receptacles in the first turn's ``go to`` list, in its order.
    """
    found = search_step(seen_text, admissible, None, places)
    if found is None:
        return None
    place = found.split(" ", 2)[-1] if found.startswith("go to ") else found[len("open "):]
    if place in arrived_at(seen_text)[-1:]:  # an open where it stands
        return None, found
    kind = object_type(fetched_object(plan))
    return SWEEP_THINK.format(article=_article(kind), kind=kind, place=place), found


def state_think(action: str, plan: list[str], searching: Optional[str] = None, seen: bool = True) -> str:
    """A reply's reasoning that names what the agent sees and why ``action`` follows from it
    (``think_mode="state"``; a serl option, not in ALFWorld's recipes, whose replies have none):

    * ``go to P``, a sweep step (``searching``): :data:`SWEEP_THINK`;
    * ``open R``: ``The R is closed[ and I have not seen a X yet], so I open it.``;
    * ``take X from R`` / ``use X``: ``The X is here, so I take it.`` / ``... use it.``;
    * ``go to R``, the planner's: ``I saw the X at the R, so I go there.`` where the plan goes to
      take or use ``X`` there (``seen`` False, the sweep having visited every place: ``I have not
      found a X; I go to the R.``), ``I have the X, so I go to the R to heat it.`` (cool, clean;
      ``to put it there`` for ``move``), else ``I go to the R.``;
    * ``heat|cool|clean X with R`` / ``move X to R``: ``I have the X and I am at the R, so I heat it.``
      / ``... so I put it there.``;
    * anything else: ``The next step is to <action>.``

    So the reasoning's first words are read off the last observation (``The cabinet 3 is closed.``,
    ``you see a mug 1``) rather than drawn from templates that name the task: the measured failure
    of sweep models trained with the task templates is one reply (the sweep's ``go to`` sentence)
    at every state, closed places and the object in sight included (docs: "ALFWorld", "Why it never
    opens or takes").

    Args:
        action: the reply's action.
        plan: the planner's plan from the state, first action first (a ``go to``'s purpose is
            read off its next action past an ``open``).
        searching: the type of the object a search step looks for (``"mug"``), or None.
        seen: whether the object a ``go to`` of the planner fetches was named in what the agent read.
    """
    if action.startswith("go to "):
        place = action[len("go to "):]
        if searching:
            return SWEEP_THINK.format(article=_article(searching), kind=searching, place=place)
        own = plan[:1] == [action]  # the plan's own go to: its purpose is the plan's next action
        nxt = next((a for a in plan[1:3] if not a.startswith("open ")), "") if own else ""
        obj, w, m = fetched_object(plan) if own else None, _WITH.match(nxt), _MOVE.match(nxt)
        if obj:
            return (f"I saw the {obj} at the {place}, so I go there." if seen
                    else f"I have not found {_article(object_type(obj))} {object_type(obj)}; I go to the {place}.")
        if w or m:
            what, verb = (w.group(2), w.group(1) + " it") if w else (m.group(1), "put it there")
            return f"I have the {what}, so I go to the {place} to {verb}."
        return f"I go to the {place}."
    if action.startswith("open "):
        unseen = f" and I have not seen {_article(searching)} {searching} yet" if searching else ""
        return f"The {action[len('open '):]} is closed{unseen}, so I open it."
    found, w, m = _FOUND.match(action), _WITH.match(action), _MOVE.match(action)
    if found:
        return f"The {found.group(1) or found.group(2)} is here, so I {'take' if found.group(1) else 'use'} it."
    if w:
        return f"I have the {w.group(2)} and I am at the {w.group(3)}, so I {w.group(1)} it."
    if m:
        return f"I have the {m.group(1)} and I am at the {m.group(2)}, so I put it there."
    return f"The next step is to {action}."


def search_step(seen_text: str, admissible: list[str], rng: Optional[random.Random],
                places: Optional[list[str]] = None) -> Optional[str]:
    """One step of a search: ``open R`` if the agent stands at a closed ``R`` (``open R``
    admissible, ``R`` the last ``You arrive at R.`` in ``seen_text``), else ``go to`` an
    admissible receptacle not arrived at yet, drawn with ``rng`` (sorted first, so a seed draws the
    same one whatever the list's order). With ``places`` instead (``rng`` unused): the first of
    ``places`` neither arrived at nor opened, ``go to`` it, or ``open`` it where it is closed and
    the agent stands beside it (ALFWorld offers no ``go to`` a receptacle at the agent's place, e.g.
    drawer 3 beside drawer 2). None when every receptacle has been visited.

    Args:
        seen_text: the observations so far, joined.
        admissible: the current state's admissible commands.
        rng: the draw (None with ``places``).
        places: the receptacles in the order to visit them (the first turn's ``go to`` list).
    """
    arrived = arrived_at(seen_text)
    if arrived and f"open {arrived[-1]}" in admissible:
        return f"open {arrived[-1]}"
    if places is not None:
        done = set(arrived) | set(_OPENED.findall(seen_text))
        for p in (p for p in places if p not in done):
            if f"go to {p}" in admissible:
                return f"go to {p}"
            if f"open {p}" in admissible:  # closed, and where the agent stands (no go to it there)
                return f"open {p}"
        return None
    todo = sorted(a for a in admissible if a.startswith("go to ") and a[len("go to "):] not in arrived)
    return rng.choice(todo) if todo else None


def fetched_object(plan: list[str]) -> Optional[str]:
    """The object that a plan's first action, a ``go to``, goes to fetch: ``X`` of the ``take X
    from R`` or ``use X`` after it (past an ``open R``); None otherwise."""
    if not plan[0].startswith("go to "):
        return None
    for action in plan[1:3]:
        if action.startswith("open "):
            continue
        m = _FOUND.match(action)
        return (m.group(1) or m.group(2)) if m else None
    return None


def label_is_seen(plan: list[str], seen_text: str) -> bool:
    """Whether an agent that has read ``seen_text`` could know the planner's next action ``plan[0]``.

    Every action but ``go to`` is taken where the agent stands, on what it sees, and counts as
    known. A ``go to R`` counts as known unless the plan goes there to fetch something, i.e. its
    next action (after an ``open R``) is ``take X from R`` or ``use X``, and the object ``X`` (an
    instance name such as ``apple 1``) does not appear in ``seen_text``. ``go to`` the sink, the
    microwave, the fridge or the goal receptacle to act on an object in hand counts as known.

    Args:
        plan: the planner's plan from the state, first action first (non-empty).
        seen_text: what the agent has read up to the state (its user turns: observations and
            admissible actions).
    """
    obj = fetched_object(plan)
    return obj is None or re.search(rf"(?<![\w]){re.escape(obj)}(?!\d)", seen_text) is not None


def _article(kind: str) -> str:
    return "an" if kind[:1] in "aeiou" else "a"


def object_type(name: str) -> str:
    """An ALFWorld instance name's type: ``"apple 1"`` -> ``"apple"``."""
    return re.sub(r"\s+\d+$", "", name)


def arrived_at(seen_text: str) -> list[str]:
    """The receptacles an agent arrived at, in order, read off the ``You arrive at R.``
    observations in ``seen_text`` (ALFWorld's reply to an admissible ``go to R``)."""
    return _ARRIVE.findall(seen_text)
