"""DAgger rows for ALFWorld: the policy plays, the planner labels the states it visits, and the
states where it went wrong become SFT rows that teach the expert's action there.

DAgger (Ross, Gordon & Bagnell, "A Reduction of Imitation Learning and Structured Prediction to
No-Regret Online Learning", arXiv 1011.0686, Algorithm 3.1) trains each round on the states the
current policy reaches, labelled by the expert, aggregated over rounds; ALFWorld's BUTLER agent
was trained so (arXiv 2010.03768, Sec. 3.2). A cold start trained on walkthroughs alone never sees
a state after a mistake, and loops there (the measured failure of serl's ALFWorld cold starts).

Where the states come from: ``serl eval`` (or the trainer) with ``env.alfworld.expert=planner``,
whose env puts the planner's plan from every state in the step's ``info["expert_plan"]`` and the
collector the initial state's in ``Trajectory.extra["expert_plan0"]``
(:meth:`serl.envs.alfworld.AlfWorldEnv.expert_plan`). :func:`step_labels` turns those plans into
one label per step; :func:`dagger_rows` makes the rows. The expert's reply is written as
``serl data expert`` writes the planner expert's (a think template of
:data:`serl.envs.alfworld_experts.walkthrough.ALFWORLD_THINK` and the action), so DAgger rows and
expert rows share one reply format.

Rows, by the step's ``prompt_format``:

* ``conversation`` (``env.prompt_layout=conversation``): the chat up to the labelled state, the
  policy's own replies as sampled with ``"weight": 0`` (context, no loss:
  :func:`serl.agent.tool_chat.render_sft_conversation`), then the expert's reply (weight 1). One
  row per labelled state, each a prefix of the episode: a row cannot go on past it, since the
  turns after it followed the policy's action, not the expert's.
* ``chat`` (the step layout): the step's own prompt and the expert's reply, a step row.

Which states: those whose action is wrong (:func:`step_labels` False) and whose plan is known, at
most ``rows_per_episode`` per episode: the first mistake always, the others drawn at random (seeded
by ``seed``, the game and the episode's actions, so a trajectories file gives the same rows). A
right step is already what the policy does.

Departure (``labels="seen"``, a serl option; DAgger and BUTLER label every state): the planner
sees the whole game, so at a state where the agent has not yet found the object it needs, the
planner's ``go to`` the receptacle that holds it is a guess from the agent's side (the imitation
gap of an omniscient expert), and the agent's own ``go to`` another receptacle it has not searched
is no mistake; a first round on serl's cold start taught mostly such first-step ``go to`` guesses
and made the policy cycle among receptacles. With ``labels="seen"`` such states get no row
(:func:`labelled_states`). ``labels="search"`` and ``"sweep"`` drop them too, and where the
planner's label of a wrong state is such a guess give a search's label instead:
:func:`search_action` (where these games' plans find the object most often), or
:func:`sweep_action` (the next place of ``serl data expert --expert sweep``'s sweep, with its
reasoning, so the rows continue a sweep the chat has started). With ``keep_won`` a won episode is
also kept whole with every reply trained (weight 1): the "iterated action modeling" round of Micheli
& Fleuret, "Language Models are Few-Shot Butlers" (arXiv 2104.07972, Sec. 3.3).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from serl.envs.alfworld_experts.search import (arrived_at, fetched_object, label_is_seen,  # noqa: F401
                                               object_type, state_think, sweep_step)
from serl.envs.alfworld_experts.walkthrough import ALFWORLD_THINK, task_phrase
from serl.envs.base import expert_rng
from serl.rollout.expert import format_response
from serl.trajectory import Trajectory

#: the ``source`` of a row: a state the expert labelled, or a won episode kept whole
ROW_SOURCES = ("dagger", "won")
#: which wrong states get a row: every one, or not a search that only an omniscient expert calls
#: wrong (:func:`labelled_states`); ``search`` and ``sweep`` as ``seen``, with a search's label where the
#: planner's is a guess (the receptacle prior's, or the sweep's: :func:`sweep_action`)
LABEL_MODES = ("all", "seen", "search", "sweep")

_TAKE = re.compile(r"^take (.+) from (.+)$")


def step_labels(traj: Trajectory) -> list[Optional[bool]]:
    """Per step of ``traj``: right (True), wrong (False) or unknown (None: no plan was recorded
    for the state it was taken in).

    A step is right when it wins, when its action is the planner's next action, or when the
    planner's plan from the next state is shorter than from this one (the action keeps a shortest
    plan as short: the planner's search is uniform-cost, so equal-cost alternatives, e.g. another
    instance of the object, count). The env records no plan after an episode's last step, so a
    last step that neither is the planner's action nor wins is wrong (a lost episode's step at the
    step limit).

    Reads ``traj.extra["expert_plan0"]`` and each step's ``info["expert_plan"]`` (module docstring).
    """
    out: list[Optional[bool]] = []
    plan = traj.extra.get("expert_plan0")
    for s in traj.steps:
        nxt = s.info.get("expert_plan")
        if s.won:
            out.append(True)
        elif not plan:
            out.append(None)
        else:
            out.append(s.action == plan[0] or (nxt is not None and len(nxt) < len(plan)))
        plan = nxt
    return out


def selection_labels(traj: Trajectory) -> list[tuple[bool, bool, bool]]:
    """Against the planner, per step whose action was chosen by likelihood
    (``rollout.action_selection=score``: the step's ``info["sampled_action"]`` holds the action the
    policy wrote) taken in a state with a known plan: ``(written is the planner's next action,
    chosen is, written is admissible)``. Both are compared with the plan's next action only (the
    written one was not played, so the plan after it is unknown); :func:`step_labels` gives the
    played, chosen action's full label.
    """
    out = []
    for s, plan in zip(traj.steps, state_plans(traj)):
        written = s.info.get("sampled_action")
        if written is not None and plan:
            out.append((written == plan[0], s.action == plan[0], written in s.admissible_actions))
    return out


def state_plans(traj: Trajectory) -> list[Optional[list[str]]]:
    """The planner's plan from the state each step was taken in (None where none was recorded)."""
    plans = [traj.extra.get("expert_plan0")] + [s.info.get("expert_plan") for s in traj.steps[:-1]]
    return [list(p) if p else None for p in plans]


def receptacle_prior(trajs: list[Trajectory]) -> dict[str, Counter]:
    """Where objects are found: per object type, how often the planner's plan from a game's
    initial state (``expert_plan0``) first takes it from each receptacle type, over ``trajs``."""
    prior: dict[str, Counter] = {}
    for t in trajs:
        take = _first_take(t.extra.get("expert_plan0"))
        if take:
            prior.setdefault(object_type(take[0]), Counter())[object_type(take[1])] += 1
    return prior


def _first_take(plan: Optional[list[str]]) -> Optional[tuple[str, str]]:
    for a in plan or []:
        m = _TAKE.match(a)
        if m:
            return m.group(1), m.group(2)
    return None


def search_action(traj: Trajectory, t: int, prior: dict[str, Counter]) -> Optional[str]:
    """A search from the state of step ``t`` for the object the planner's plan goes to fetch, as
    an agent that has not seen it must search: ``open R`` where it stands at a closed ``R``,
    else ``go to`` the receptacle it has not been at whose type ``prior`` (:func:`receptacle_prior`
    of a set of games that holds this one, whose own count is left out) finds that object type in
    most often, ties in the order of the first turn's admissible ``go to`` list. None when the
    plan fetches nothing or every receptacle was visited."""
    plan = state_plans(traj)[t]
    obj = fetched_object(plan) if plan else None
    if obj is None:
        return None
    s, seen = traj.steps[t], "\n".join(x.prompt for x in traj.steps[: t + 1])
    arrived = arrived_at(seen)
    if arrived and f"open {arrived[-1]}" in s.admissible_actions:
        return f"open {arrived[-1]}"
    counts = Counter(prior.get(object_type(obj), Counter()))
    own = _first_take(traj.extra.get("expert_plan0"))
    if own and object_type(own[0]) == object_type(obj) and counts[object_type(own[1])] > 0:
        counts[object_type(own[1])] -= 1  # leave this game out of the prior it was counted in
    rooms = [a[len("go to "):] for a in traj.steps[0].admissible_actions if a.startswith("go to ")]
    todo = [r for r in rooms if r not in arrived and f"go to {r}" in s.admissible_actions]
    if not todo:
        return None
    return "go to " + min(todo, key=lambda r: (-counts[object_type(r)], rooms.index(r)))


def sweep_action(traj: Trajectory, t: int) -> Optional[tuple[Optional[str], str]]:
    """The sweep's step from the state of step ``t`` for the object the planner's plan goes to
    fetch (``serl data expert --expert sweep``'s search,
    :func:`serl.envs.alfworld_experts.search.sweep_step`): ``open`` the closed receptacle the agent
    stands at, else ``go to`` the first receptacle of the first turn's admissible ``go to`` list
    it has neither arrived at nor opened. Returns ``(think, action)``, ``think`` the sweep's
    reasoning (None for the ``open``: the caller's template), or None when the plan fetches
    nothing or every receptacle was visited."""
    plan = state_plans(traj)[t]
    if not plan or fetched_object(plan) is None:
        return None
    seen = "\n".join(x.prompt for x in traj.steps[: t + 1])
    places = [a[len("go to "):] for a in traj.steps[0].admissible_actions if a.startswith("go to ")]
    return sweep_step(plan, seen, traj.steps[t].admissible_actions, places)


def is_exploring(action: str, admissible: list[str], seen_text: str) -> bool:
    """Whether ``action`` searches: an admissible ``go to`` a receptacle the agent has not been
    at, or ``open`` the receptacle it stands at (read off the ``You arrive at R.`` observations
    in ``seen_text``, the agent's user turns up to the state)."""
    if action not in admissible:
        return False
    arrived = arrived_at(seen_text)
    if action.startswith("go to "):
        return action[len("go to "):] not in arrived
    return action.startswith("open ") and bool(arrived) and action[len("open "):] == arrived[-1]


def expert_reply(traj: Trajectory, step: int, action: str, seed: int) -> str:
    """The expert's reply at ``step``: a think template (picked by ``seed``, the task and the
    step, as :class:`serl.envs.alfworld_experts.walkthrough.AlfWorldPlannerExpert` picks it) and ``action``."""
    tpl = expert_rng(seed, traj.task.task_id, step).choice(ALFWORLD_THINK)
    return format_response(tpl.format(task=task_phrase(traj.task_text), action=action), action)


def _meta(traj: Trajectory, source: str, step: int, **kw: Any) -> dict[str, Any]:
    return {"env": traj.task.env_name, "task_id": traj.task.task_id, "task_type": traj.task.task_type,
            "source": source, "step": step, "episode_won": bool(traj.won), "prompt_truncated": False, **kw}


def _conversation(traj: Trajectory, upto: int, weight: int) -> list[dict[str, Any]]:
    """The chat of steps ``< upto``: each step's user turn and the policy's reply with ``weight``."""
    msgs: list[dict[str, Any]] = []
    for s in traj.steps[:upto]:
        msgs += [{"role": "user", "content": s.prompt}, {"role": "assistant", "content": s.response_text, "weight": weight}]
    return msgs


def _is_conversation(traj: Trajectory) -> bool:
    fmts = {s.prompt_format for s in traj.steps}
    if not fmts <= {"conversation", "chat"}:
        raise ValueError(f"dagger rows: trajectory {traj.traj_uid} has prompt format(s) {sorted(fmts)}; "
                         "only ALFWorld's step ('chat') and conversation layouts are supported")
    return fmts == {"conversation"}


def labelled_states(traj: Trajectory, labels: str = "all") -> list[int]:
    """The steps of ``traj`` that may get a DAgger row: wrong by :func:`step_labels`, with a plan,
    and with ``labels="seen"`` not a search that only an omniscient expert calls wrong: a step is
    dropped when the planner's label is one the agent could not know (:func:`label_is_seen`, on
    the user turns of the steps up to and including that one) while the agent's own action was a
    search (:func:`is_exploring`). So a ``take`` of an object that is not there, a revisit or an
    inadmissible action still gets the planner's label; a first ``go to`` elsewhere does not.

    Raises:
        ValueError: ``labels`` not in :data:`LABEL_MODES`.
    """
    if labels not in LABEL_MODES:
        raise ValueError(f"labels must be one of {LABEL_MODES}, got {labels!r}")
    out, seen = [], ""
    for t, (lab, plan, s) in enumerate(zip(step_labels(traj), state_plans(traj), traj.steps)):
        seen += s.prompt + "\n"
        if lab is False and plan and (labels == "all" or label_is_seen(plan, seen)
                                      or not is_exploring(s.action, s.admissible_actions, seen)):
            out.append(t)
    return out


def dagger_rows(traj: Trajectory, *, rows_per_episode: int = 2, seed: int = 0, keep_won: bool = False,
                labels: str = "all", prior: Optional[dict[str, Counter]] = None,
                think: str = "task") -> list[dict[str, Any]]:
    """The SFT rows of one trajectory (module docstring): up to ``rows_per_episode`` states where
    the policy went wrong (:func:`labelled_states` with ``labels``), each with the expert's reply;
    with ``keep_won`` and a won episode, the episode itself too (conversation: one row, every reply
    weight 1; step layout: a row per step). With ``labels="search"`` a state whose planner label
    the agent could not know (:func:`label_is_seen`) gets :func:`search_action` with ``prior``
    instead, where there is one; with ``labels="sweep"``, :func:`sweep_action` and its reasoning
    (the rows of ``serl data expert --expert sweep``); with ``think="state"`` too, every row's
    reasoning is :func:`~serl.envs.alfworld_experts.search.state_think`'s (``serl data expert --think state``).

    Each row also holds ``env``, ``task_id``, ``task_type``, ``source`` (:data:`ROW_SOURCES`),
    ``step``, ``episode_won``, and for a DAgger row ``policy_action`` / ``expert_action`` and
    ``label`` (``planner``, ``search`` or ``sweep``).

    Raises:
        ValueError: ``rows_per_episode < 0``, ``labels`` not in :data:`LABEL_MODES`, ``think``
            other than ``"task"`` but ``"state"`` with ``labels="sweep"``, or steps of another
            prompt format (e.g. math).
    """
    if rows_per_episode < 0:
        raise ValueError(f"rows_per_episode must be >= 0, got {rows_per_episode}")
    if think != "task" and (think != "state" or labels != "sweep"):
        raise ValueError(f"think={think!r}: 'state' is for the sweep's labels (labels='sweep'), got labels={labels!r}")
    if not traj.steps:
        return []
    conv = _is_conversation(traj)
    rows: list[dict[str, Any]] = []
    plans = state_plans(traj)
    wrong = labelled_states(traj, labels)
    if wrong and rows_per_episode:
        # seeded by what the episode is, not its random traj_uid: the same file gives the same rows
        rng = random.Random(f"serl-dagger/{seed}/{traj.task.key}/{'|'.join(s.action for s in traj.steps)}")
        picked = sorted([wrong[0]] + rng.sample(wrong[1:], min(len(wrong) - 1, rows_per_episode - 1)))
        for t in picked:
            action, s, label, reason = plans[t][0], traj.steps[t], "planner", None
            seen = label_is_seen(plans[t], "\n".join(x.prompt for x in traj.steps[: t + 1]))
            if labels in ("search", "sweep") and not seen:
                found = sweep_action(traj, t) if labels == "sweep" else (None, search_action(traj, t, prior or {}))
                if found and found[1]:
                    (reason, action), label = found, labels
            if think == "state" and reason is None:
                kind = object_type(fetched_object(plans[t])) if label == "sweep" else None
                reason = state_think(action, plans[t], searching=kind, seen=seen)
            reply = format_response(reason, action) if reason else expert_reply(traj, t, action, seed)
            meta = _meta(traj, "dagger", t, policy_action=s.action, expert_action=action, label=label)
            if conv:
                msgs = _conversation(traj, t, 0) + [{"role": "user", "content": s.prompt},
                                                     {"role": "assistant", "content": reply}]
                rows.append({**meta, "messages": msgs})
            else:
                rows.append({**meta, "messages": [{"role": "user", "content": s.prompt}], "response": reply})
    if keep_won and traj.won:
        if conv:
            rows.append({**_meta(traj, "won", len(traj.steps) - 1), "messages": _conversation(traj, len(traj.steps), 1)})
        else:
            rows += [{**_meta(traj, "won", t), "messages": [{"role": "user", "content": s.prompt}],
                      "response": s.response_text} for t, s in enumerate(traj.steps)]
    return rows


@dataclass
class DaggerSummary:
    """What :func:`dagger_rows` made of a set of trajectories (``serl data dagger`` prints it)."""

    episodes: int = 0
    won: int = 0
    steps: int = 0
    #: steps with a label / labelled right
    labelled: int = 0
    right: int = 0
    #: wrong states that may get a row (:func:`labelled_states`; with ``labels="seen"`` fewer than ``wrong``)
    eligible: int = 0
    #: rows made, by source
    rows: dict[str, int] = field(default_factory=lambda: {s: 0 for s in ROW_SOURCES})
    #: per task type: [episodes, won, steps labelled, right]
    by_type: dict[str, list[int]] = field(default_factory=dict)
    #: action selection by likelihood (:func:`selection_labels`): scored states with a plan; of them,
    #: the written / the chosen action is the planner's next, only one of the two is, the written is admissible
    scored: int = 0
    written_planner: int = 0
    chosen_planner: int = 0
    only_written: int = 0
    only_chosen: int = 0
    written_admissible: int = 0

    @property
    def wrong(self) -> int:
        """Steps labelled wrong."""
        return self.labelled - self.right

    def add(self, traj: Trajectory, rows: list[dict[str, Any]], label_mode: str = "all") -> None:
        """Count one trajectory and its rows (made with ``labels=label_mode``)."""
        labels = [x for x in step_labels(traj) if x is not None]
        self.eligible += len(labelled_states(traj, label_mode))
        self.episodes += 1
        self.won += int(traj.won)
        self.steps += len(traj.steps)
        self.labelled += len(labels)
        self.right += sum(labels)
        for r in rows:
            self.rows[r["source"]] += 1
        for written, chosen, admissible in selection_labels(traj):
            self.scored += 1
            self.written_planner += written
            self.chosen_planner += chosen
            self.only_written += written and not chosen
            self.only_chosen += chosen and not written
            self.written_admissible += admissible
        t = self.by_type.setdefault(traj.task.task_type, [0, 0, 0, 0])
        t[0] += 1
        t[1] += int(traj.won)
        t[2] += len(labels)
        t[3] += sum(labels)
