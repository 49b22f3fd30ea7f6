"""ALFWorld's planner expert, asked on demand: the next expert action from *any* state.

DAgger-style training (the policy plays, an expert labels every state it visits) needs an expert
that answers from states the policy reached, not only from a game's initial state (the stored
``walkthrough`` of ``game.tw-pddl`` is a plan from the initial state only). ALFWorld
(arXiv 2010.03768; ``alfworld/alfworld`` 0.4.2, ``alfworld/agents/environment/alfred_tw_env.py``)
ships two state experts in its ``AlfredExpert`` wrapper:

* ``handcoded`` (``alfworld/agents/expert/handcoded_expert_tw.py``): a scripted explorer that
  reads ``pddl_params`` from the trial's ``traj_data.json``. The train split has no
  ``traj_data.json`` (none of its published copies has one), it must observe every step from the
  reset (it is a state machine over the trajectory, not a function of the state), and in
  ``AlfredExpert`` an inadmissible handcoded action silently becomes ``look``.
* ``planner``: TextWorld's ``policy_commands`` info (textworld 1.7.0,
  ``textworld/envs/pddl/pddl.py``, ``PddlEnv._gather_infos``), which calls
  ``PddlState.replan`` (``textworld/envs/pddl/logic/__init__.py``) on **every** step.

How the planner is asked here, and why (decision)
-------------------------------------------------
``PddlState.replan`` calls fast-downward's ``replan()`` in the game's own ``libdownward.so``
copy (``fast_downward_textworld`` 20.6.4, ``src/search/interface.cc``), which reads the game's
*current* state (``state_registry->lookup_state(state_id)``) and searches with a lazy search on
the ``g`` evaluator alone (a blind search ordered by path cost). It keeps nothing between calls, so it
can be called whenever the expert is asked and never on ordinary steps: this module does exactly
that, on the env's own engine, so an RL step costs nothing extra and an expert query costs no
reset and no replay. The alternatives cost more: ``policy_commands=True`` plans on every step,
and a separate planner env replaying the action history pays a reset (median 3.8 s, max 15 s on
2 loaded cores) plus the replay on every query.

The blind search, though, is far too slow on the full problem: every object in the room can be
taken and put anywhere and every cabinet opened, so from the initial state of the fixture game
``pick_heat_then_place_in_recep-Apple-None-CounterTop-30`` one ``replan()`` took 253 s wall
(175 s CPU), and 37 s on ``pick_clean...-DiningTable-19``. So the expert plans on a **relevant
sub-problem** built from the current facts (:func:`relevant_problem`): the agent, the objects of
the goal's object types (and the held object), the receptacles of the goal's receptacle types,
of the appliance types the domain's actions name (sink, sink basin, microwave, fridge) and those
that hold a kept object, and the locations of these (and the agent's). The sub-problem is
translated (``fast_downward.pddl2sas``, ``optimize=True`` as ``replan`` uses) and solved with the
same library's ``solve_sas``. The Alfred domain has no precondition that quantifies over objects
other than an action's own arguments, and its goals are existential, so **every plan of the
sub-problem is a plan of the full problem** (dropping objects only removes options). The reverse
does not hold in general (a held object that no kept receptacle can contain), so when the
sub-problem has no plan the expert falls back to the full ``replan()`` (exact, slow) and counts
it (:attr:`PlannerStats.fallbacks`). Measured (BENCHMARKS.md, "ALFWorld planner expert from any
state"; 2 loaded cores): from perturbed states of 204 train games of all six types the
sub-problem's translation + search took median 0.05 s, p90 0.11 s, max 1.1 s, its plans won 204 of
204 games and no search fell back; on the 12 fixture train games the full problem's search took
median 0.5 s, max 64 s, for plans of the same length. ALFWorld's handcoded expert, on 60
valid_unseen games from the same kind of states, won 47 (3 of 10 pick_two) in 3x the steps.

**Plan cache.** The engine is deterministic, so after a plan ``p`` is computed, taking ``p[0]``
leads to a state from which ``p[1:]`` is still a plan. :class:`AlfWorldPlanner` therefore keeps the remaining plan and answers from it while
the actions taken follow it; an action off the plan drops it, except actions that do not change
the state: a command that is not admissible (the engine answers ``Nothing happens.`` and applies
nothing, ``PddlEnv.step``), and ``look``, ``inventory``, ``examine ...`` and ``help``, whose only
effect in the domain is a ``checked`` fact that no precondition or goal reads
(:data:`STATE_NEUTRAL_PREFIXES`).

Failures are never silent: no plan from either search, a translation error, or a planned command
that the engine does not list as admissible raise :class:`PlannerError` (an
:class:`~serl.envs.base.EnvError`) naming the game and the actions taken since the reset.

This module imports fast-downward and textworld only inside the calls that need them.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from serl.envs.base import EnvError

logger = logging.getLogger(__name__)

#: receptacle types that the Alfred domain's actions name as constants (``CleanObject``:
#: ``SinkType`` / ``SinkBasinType``, ``HeatObject``: ``MicrowaveType``, ``CoolObject``:
#: ``FridgeType``), lower-cased as fast-downward writes them
APPLIANCE_TYPES = frozenset({"sinktype", "sinkbasintype", "microwavetype", "fridgetype"})
#: commands whose only effect in the Alfred domain is a ``checked`` fact: taking one keeps a plan
STATE_NEUTRAL_PREFIXES = ("look", "inventory", "examine ", "help")
#: the kinds of expert :class:`~serl.envs.alfworld.AlfWorldEnv` can attach to its steps
EXPERT_KINDS = ("planner",)


class PlannerError(EnvError):
    """The planner expert could not give a plan: fast-downward found none, failed, or planned a
    command the engine does not accept.

    Attributes:
        gamefile: the ``game.tw-pddl`` path.
        actions: the commands sent since the reset (the state the planner was asked from).
    """

    def __init__(self, message: str, *, gamefile: str | None = None, actions: Sequence[str] = ()):
        super().__init__(message)
        self.gamefile = gamefile
        self.actions = list(actions)


@dataclass
class PlanCall:
    """One answer of :meth:`AlfWorldPlanner.plan`.

    Attributes:
        cached: answered from the remaining plan, without a search.
        seconds: wall seconds of the call (translation + search; ~0 when cached).
        fallback: the sub-problem had no plan and the full ``replan()`` answered.
        kept_objects: PDDL objects of the sub-problem (0 when cached or already won).
        plan_length: commands in the returned plan.
    """

    cached: bool
    seconds: float = 0.0
    fallback: bool = False
    kept_objects: int = 0
    plan_length: int = 0


@dataclass
class PlannerStats:
    """Counts of an :class:`AlfWorldPlanner` since it was built (all episodes).

    Attributes:
        calls: :meth:`AlfWorldPlanner.plan` calls.
        searches: calls that ran fast-downward (the others were answered from the cache or won).
        fallbacks: searches where the sub-problem had no plan and the full problem was searched.
        search_seconds: wall seconds of each search, in order.
    """

    calls: int = 0
    searches: int = 0
    fallbacks: int = 0
    search_seconds: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counts and the median / max search seconds as a plain dict."""
        s = sorted(self.search_seconds)
        return {"calls": self.calls, "searches": self.searches, "fallbacks": self.fallbacks,
                "median_search_s": s[len(s) // 2] if s else 0.0, "max_search_s": s[-1] if s else 0.0,
                "total_search_s": sum(s)}


def goal_formula(problem: str) -> str:
    """The ``(:goal ...)`` section of a PDDL problem text, parentheses balanced.

    Raises:
        PlannerError: the problem has no ``(:goal`` section or it is not closed.
    """
    start = problem.find("(:goal")
    if start < 0:
        raise PlannerError("the game's PDDL problem has no (:goal ...) section")
    depth = 0
    for i in range(start, len(problem)):
        if problem[i] == "(":
            depth += 1
        elif problem[i] == ")":
            depth -= 1
            if depth == 0:
                return problem[start : i + 1]
    raise PlannerError("the game's PDDL (:goal ...) section is not closed")


def relevant_problem(facts: Sequence[Any], goal: str, name: str = "serl_replan") -> tuple[str, int]:
    """A PDDL problem of the Alfred domain (``alfworld/alfworld`` 0.4.2, ``alfred.pddl``) from the
    current ``facts``, restricted to what the ``goal`` can need (see the module docstring).

    Kept: every object of type ``agent``, ``otype`` and ``rtype`` (constants); objects whose
    ``objecttype`` is named in the goal, and any held object; receptacles whose
    ``receptacletype`` is named in the goal or is in :data:`APPLIANCE_TYPES`, and those holding a
    kept object; for a held object of no goal type, the receptacles at the agent's location that
    can contain it, else every receptacle that can contain it and is not openable, else every one
    that can; the locations of the kept receptacles and the agent's location. ``init`` is every
    fact whose arguments are all kept.

    Args:
        facts: the state's facts, ``textworld.logic.Proposition`` objects as
            ``PddlState.facts`` gives them (lower-case names, as fast-downward writes them).
        goal: the ``(:goal ...)`` text (:func:`goal_formula`).
        name: the problem's name.

    Returns:
        ``(problem_text, number_of_kept_objects)``.
    """
    facts = [f for f in facts if "@" not in f.name]  # fast-downward's axiom atoms (new-axiom@0)
    by_name: dict[str, list[tuple[str, ...]]] = {}
    types: dict[str, str] = {}
    for f in facts:
        args = tuple(a.name for a in f.arguments)
        by_name.setdefault(f.name, []).append(args)
        for a in f.arguments:
            types[a.name] = a.type
    goal_types = {t.lower() for t in re.findall(r"\b([A-Za-z]+Type)\b", goal)}
    otype = dict(by_name.get("objecttype", []))
    rtype = dict(by_name.get("receptacletype", []))
    held = {o for _a, o in by_name.get("holds", [])}
    objects = {o for o, t in otype.items() if t in goal_types} | held
    recs = {r for r, t in rtype.items() if t in goal_types or t in APPLIANCE_TYPES}
    recs |= {r for o, r in by_name.get("inreceptacle", []) if o in objects}
    agent_locs = {l for _a, l in by_name.get("atlocation", [])}
    rec_loc = dict(by_name.get("receptacleatlocation", []))
    can_contain = set(by_name.get("cancontain", []))
    openable = {r for (r,) in by_name.get("openable", [])}
    for o in held:
        if otype.get(o) in goal_types:
            continue
        fits = {r for r, t in rtype.items() if (t, otype.get(o)) in can_contain}
        here = {r for r in fits if rec_loc.get(r) in agent_locs}
        recs |= here or {r for r in fits if r not in openable} or fits
    locs = {rec_loc[r] for r in recs if r in rec_loc} | agent_locs
    keep = {n for n, t in types.items() if t in ("agent", "otype", "rtype")} | objects | recs | locs
    init = [f for f in facts if all(a.name in keep for a in f.arguments)]
    lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects"]
    lines += [f"{n} - {types[n]}" for n in sorted(keep)]
    lines += [")", "(:init"]
    lines += ["(" + " ".join([f.name] + [a.name for a in f.arguments]) + ")" for f in init]
    lines += [")", goal, ")"]
    return "\n".join(lines), len(keep)


def _translate(domain: str, problem: str) -> str:
    """fast-downward's PDDL -> SAS translation (``fast_downward.pddl2sas``, ``optimize=True``).
    ``pddl2sas`` overwrites ``sys.argv`` for the translator's option parser; it is restored."""
    import fast_downward

    argv = list(sys.argv)
    try:
        _task, sas = fast_downward.pddl2sas(domain, problem, optimize=True)
    finally:
        sys.argv[:] = argv
    return sas


def _last_plan(lib) -> list[str]:
    """The operator names of the library's last plan (``get_last_plan``)."""
    from fast_downward import Operator

    ops = (Operator * lib.get_last_plan_length())()
    lib.get_last_plan(ops)
    return [op.name for op in ops]


def solve_relevant(pddl_env) -> tuple[list[str] | None, int]:
    """Plan on the relevant sub-problem of ``pddl_env``'s current state (:func:`relevant_problem`)
    with fast-downward's ``solve_sas`` (the game's own library copy).

    Args:
        pddl_env: the unwrapped ``textworld.envs.pddl.PddlEnv`` (``env.unwrapped``).

    Returns:
        ``(operator_names or None when fast-downward found no plan, kept_objects)``.

    Raises:
        Exception: whatever the translator raises on a malformed problem (the caller wraps it).
    """
    data = pddl_env._game_data
    problem, kept = relevant_problem(list(pddl_env._pddl_state.facts), goal_formula(data["pddl_problem"]))
    sas = _translate(data["pddl_domain"], problem)
    if not pddl_env.downward_lib.solve_sas(sas.encode("utf-8"), False):
        return None, kept
    return _last_plan(pddl_env.downward_lib), kept


def solve_full(pddl_env) -> list[str] | None:
    """Plan on the full problem from the current state: fast-downward's ``replan()``, what
    TextWorld's ``policy_commands`` calls (exact; seconds to minutes).

    Returns:
        the operator names, or None when fast-downward found no plan.
    """
    if not pddl_env.downward_lib.replan(False):
        return None
    return _last_plan(pddl_env.downward_lib)


class AlfWorldPlanner:
    """The on-demand planner expert of one :class:`~serl.envs.alfworld.AlfWorldEnv`, with its plan
    cache (see the module docstring). The env calls :meth:`reset` at each reset and
    :meth:`observe` after each step; :meth:`plan` answers from the engine's current state.
    """

    def __init__(self) -> None:
        self._remaining: list[str] | None = None  # the plan still valid from the current state
        self._actions: list[str] = []  # commands sent since the reset (for error messages)
        self.stats = PlannerStats()
        self.last_call: PlanCall | None = None

    def reset(self) -> None:
        """Forget the plan and the action history (a new episode starts)."""
        self._remaining = None
        self._actions = []
        self.last_call = None

    def observe(self, command: str, applied: bool) -> None:
        """Record a command sent to the engine. ``applied``: it was admissible (the engine applied
        it); a command not applied, or a state-neutral one (:data:`STATE_NEUTRAL_PREFIXES`), keeps
        the plan; the plan's next command advances it; any other drops it."""
        command = command.strip()
        self._actions.append(command)
        if self._remaining is None or not applied or command.startswith(STATE_NEUTRAL_PREFIXES):
            return
        if self._remaining and command == self._remaining[0]:
            self._remaining = self._remaining[1:]
        else:
            self._remaining = None

    def plan(self, tw_env, gamefile: str, admissible: Sequence[str]) -> list[str]:
        """A plan (admissible commands, first to last) from the engine's current state; ``[]``
        when the goal already holds.

        Args:
            tw_env: the wrapped TextWorld env of the game (``AlfWorldEnv._tw_env``).
            gamefile: the game path (for messages).
            admissible: the current state's admissible commands.

        Raises:
            PlannerError: neither the sub-problem nor the full problem has a plan, the translation
                failed, or the plan's first command is not admissible.
        """
        self.stats.calls += 1
        if self._remaining is not None:
            self.last_call = PlanCall(cached=True, plan_length=len(self._remaining))
            self._check_first(self._remaining, gamefile, admissible)
            return list(self._remaining)
        pddl_env = tw_env.unwrapped
        if pddl_env._pddl_state.check_goal():
            self._remaining = []
            self.last_call = PlanCall(cached=False)
            return []
        t0 = time.perf_counter()
        try:
            ops, kept = solve_relevant(pddl_env)
        except Exception as e:
            raise PlannerError(
                f"fast-downward could not translate the relevant sub-problem of ALFWorld game {gamefile} "
                f"after actions {self._actions} ({type(e).__name__}: {str(e)[:300]})",
                gamefile=gamefile, actions=self._actions) from e
        fallback = ops is None
        if fallback:
            logger.warning("ALFWorld planner: the relevant sub-problem of %s after actions %s has no plan; "
                           "searching the full problem (can take minutes)", gamefile, self._actions)
            self.stats.fallbacks += 1
            ops = solve_full(pddl_env)
            if ops is None:
                raise PlannerError(
                    f"fast-downward found no plan for ALFWorld game {gamefile} from the state after actions "
                    f"{self._actions} (neither on the relevant sub-problem nor on the full problem)",
                    gamefile=gamefile, actions=self._actions)
        commands = pddl_env._pddl_state.plan_to_templated_actions(ops, pddl_env._entity_infos)
        seconds = time.perf_counter() - t0
        self.stats.searches += 1
        self.stats.search_seconds.append(seconds)
        self.last_call = PlanCall(cached=False, seconds=seconds, fallback=fallback, kept_objects=kept,
                                  plan_length=len(commands))
        if not commands:
            raise PlannerError(
                f"fast-downward returned an empty plan for ALFWorld game {gamefile} after actions {self._actions}, "
                "but the goal does not hold", gamefile=gamefile, actions=self._actions)
        self._check_first(commands, gamefile, admissible)
        self._remaining = list(commands)
        return list(commands)

    def _check_first(self, commands: list[str], gamefile: str, admissible: Sequence[str]) -> None:
        if commands and commands[0] not in admissible:
            raise PlannerError(
                f"the planner's next command {commands[0]!r} for ALFWorld game {gamefile} after actions "
                f"{self._actions} is not admissible (plan {commands}); admissible: {sorted(admissible)}",
                gamefile=gamefile, actions=self._actions)
