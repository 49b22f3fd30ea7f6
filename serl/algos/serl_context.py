"""SERL privileged contexts: what hindsight the teacher sees, per ``sampling_mode`` (serl.md §3–§5).

For every step row, a mode returns a :class:`PrivilegedContext` (ordered sections, each a header
and a content) or ``None`` (no context: the row is trained as plain GRPO, ``serl_mask = 0``).
The teacher's user message is the original step prompt + a blank line + the sections joined by
blank lines + a blank line + a one-line instruction to solve the task (serl.md §3.1).

Modes (the original's 20 names, registered in :data:`SAMPLING_MODES`; table in
``docs/serl_modes.md``):

* 9 **step-level** modes (serl.md §3.3) built from four parts of the row's own rollout:
  F = immediate feedback (:attr:`Step.feedback`), N = next observation (:attr:`Step.next_prompt`),
  U = the rest of this rollout after the step, S = a successful rollout of the same task. They are
  *conjunctive*: a row gets a context only if every listed part exists, except
  ``successful_sample_or_immediate_feedback`` (S, else F).
* 9 **anchor** modes (serl.md §4): rows of a group are clustered by their raw observation
  (:attr:`Step.observation`); the context is a table of the actions tried from the row's state
  across the group, with success counts, mean return, best/worst outcome and, depending on the
  mode, feedback, next observations and continuations; S is appended when one exists. Not
  conjunctive: the row itself is always in its anchor group.
* 2 **judge** modes (serl.md §3.5): an LLM judge (:mod:`serl.judge`) critiques each trajectory
  once; every row of that trajectory gets the critique.

The trainer uses one stateful entry point, :class:`SerlContextBuilder` (it holds the success
buffer of ``success_source=buffer`` and the judge client); :func:`build_privileged_contexts` is
a stateless wrapper around it.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional, Protocol, Sequence

from serl.trajectory import Group, Step, Trajectory

log = logging.getLogger(__name__)

# --- Section headers and instruction line (our own words, the original's structure, serl.md §3.1).
FEEDBACK_HEADER = "Feedback observed right after your action at this step:"
NEXT_OBS_HEADER = "The observation that followed this step:"
FUTURE_HEADER = "What happened later in this same rollout, after this step:"
SUCCESS_HEADER = "A rollout of this same task that succeeded, for reference:"
ANCHOR_HEADER = (
    "Actions that were tried from this same state in rollouts of this task, and how each turned out:"
)
ANCHOR_FEEDBACK_HEADER = "Feedback observed after each action tried from this same state (action, feedback):"
JUDGE_HEADER = "Trajectory Judge:"
SOLVE_LINE = "Use the information above as hindsight and correctly solve the current task."

SUCCESS_CONTINUATION = "What followed this action in a rollout that succeeded:"
FAILED_CONTINUATION = "What followed this action in a rollout that failed:"
#: anchor-table placeholder for a row that was the last step of its rollout (serl.md §4)
NO_CONTINUATION = "(the rollout ended with this action; nothing followed it)"
#: action key of a response whose action text is blank (serl.md §4)
EMPTY_ACTION = "(empty action)"

#: every accepted ``trajectory_format`` name -> canonical name (serl.md §5)
TRAJECTORY_FORMATS: dict[str, str] = {
    "response": "response",
    "action": "response",
    "actions": "response",
    "action_series": "response",
    "observation_action": "observation_action",
    "obs_action": "observation_action",
    "observation-action": "observation_action",
}

SUCCESS_SOURCES = ("group", "buffer")


# ---------------------------------------------------------------------------------------------
# Records


@dataclass
class PrivilegedContext:
    """The privileged hindsight of one step row.

    Attributes:
        sections: ``(header, content)`` pairs in order; empty contents are never stored.
        sources: which kinds of hindsight are present (``"feedback"``, ``"next_observation"``,
            ``"future"``, ``"success"``, ``"anchor"``, ``"judge"``); used for the per-source
            reference-fraction metrics of serl.md §8.
        info: extra facts about the context for metrics and the teacher log, e.g.
            ``success_source`` (``"group"``/``"buffer"``/``"self"``), ``anchor_group_size``,
            ``anchor_action_count``.
    """

    sections: list[tuple[str, str]] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)
    info: dict[str, Any] = field(default_factory=dict)

    def block(self) -> str:
        """The sections as text: header line + content, joined by blank lines."""
        return "\n\n".join(f"{h}\n{c}" for h, c in self.sections)


def teacher_user_message(prompt: str, block: str) -> str:
    """Teacher user message = prompt + blank line + privileged block + blank line + solve line."""
    return f"{prompt}\n\n{block}\n\n{SOLVE_LINE}"


class StepLike(Protocol):
    """What trajectory rendering needs from a step (a :class:`Step` or a buffered copy)."""

    step_id: int
    prompt: str
    response_text: str


@dataclass
class SlimStep:
    """A step as kept in the success buffer: only what rendering needs (JSON-able)."""

    step_id: int
    prompt: str
    response_text: str


@dataclass
class SuccessRef:
    """The successful sample S chosen for a row (serl.md §3.2).

    Attributes:
        steps: the steps of the successful trajectory, in order.
        traj_uid: its trajectory id.
        source: ``"group"`` (another rollout of the same group, the original's rule),
            ``"buffer"`` (an earlier iteration, our extension) or ``"self"`` (the row's own
            trajectory; only used as the judge reference, serl.md §3.5).
    """

    steps: Sequence[StepLike]
    traj_uid: str
    source: str


# ---------------------------------------------------------------------------------------------
# Text helpers

_THINK_RE = re.compile(r"<think\b[^>]*>.*?</think>\s*", re.IGNORECASE | re.DOTALL)
_ACTION_RE = re.compile(r"<action\b[^>]*>(.*?)</action>", re.IGNORECASE | re.DOTALL)


def strip_thinking(text: str) -> str:
    """Remove every ``<think>…</think>`` block and the whitespace after it (serl.md §3.1);
    what remains is essentially the ``<action>…</action>`` part, tags kept."""
    return _THINK_RE.sub("", text).strip()


def action_key(response_text: str) -> str:
    """The anchor-table key of a response (serl.md §4): thinking removed, then the inner text
    of the first ``<action>…</action>`` (the whole remaining text if there is none),
    whitespace collapsed and lower-cased; :data:`EMPTY_ACTION` if blank."""
    text = strip_thinking(response_text)
    m = _ACTION_RE.search(text)
    if m:
        text = m.group(1)
    key = " ".join(text.split()).lower()
    return key or EMPTY_ACTION


def canonical_format(name: str) -> str:
    """Canonical ``trajectory_format`` for ``name`` or an alias; raises ``ValueError`` listing
    the valid names."""
    if name not in TRAJECTORY_FORMATS:
        raise ValueError(f"unknown trajectory_format {name!r}; valid: {sorted(TRAJECTORY_FORMATS)}")
    return TRAJECTORY_FORMATS[name]


def render_steps(
    steps: Sequence[StepLike], trajectory_format: str, *, remove_thinking: bool = True, max_steps: int = 0
) -> str:
    """Render steps as text per ``trajectory_format`` (serl.md §5).

    ``response``: per step ``"Step k"`` / ``"Response:"`` / the response.
    ``observation_action``: per step ``"Step k"`` / ``"Observation:"`` / the full step prompt /
    ``"Action:"`` / the response. ``k`` is the 0-based step id. Steps are joined by blank lines.

    Args:
        steps: the steps to render, in order.
        trajectory_format: a name or alias of :data:`TRAJECTORY_FORMATS`.
        remove_thinking: strip ``<think>`` blocks from responses.
        max_steps: keep only the first ``max_steps`` steps (0 = all); when steps are dropped a
            note saying how many is appended.

    Returns:
        The text; ``""`` for no steps.

    Raises:
        ValueError: unknown format.
    """
    fmt = canonical_format(trajectory_format)
    shown = list(steps[:max_steps]) if max_steps > 0 else list(steps)
    blocks = []
    for s in shown:
        resp = strip_thinking(s.response_text) if remove_thinking else s.response_text.strip()
        if fmt == "response":
            blocks.append(f"Step {s.step_id}\nResponse:\n{resp}")
        else:
            blocks.append(f"Step {s.step_id}\nObservation:\n{s.prompt}\nAction:\n{resp}")
    dropped = len(steps) - len(shown)
    if dropped > 0:
        blocks.append(f"({dropped} more step(s) not shown)")
    return "\n\n".join(blocks)


def is_successful(traj: Trajectory, success_reward_threshold: float = 1.0) -> bool:
    """A trajectory succeeded if the env reported ``won`` at its last step; fallback: its
    episode reward reaches ``success_reward_threshold`` (> 0) (serl.md §3.2)."""
    if traj.won:
        return True
    return success_reward_threshold > 0 and traj.episode_reward >= success_reward_threshold


def task_key(traj_or_group: Trajectory | Group) -> str:
    """Identity of a task across iterations: ``"<env_name>/<task_id>"``."""
    t = traj_or_group.task
    return f"{t.env_name}/{t.task_id}"


# ---------------------------------------------------------------------------------------------
# Success buffer (our extension, docs/serl_modes.md)


class SuccessBuffer:
    """Per-task store of successful trajectories seen in earlier iterations (``success_source=buffer``).

    Bounded: at most ``per_task`` trajectories per task (the newest kept) and ``max_tasks``
    tasks (the task least recently given a success is evicted first). Steps are stored slim
    (:class:`SlimStep`); the full prompt is kept only when ``keep_prompts`` (needed by the
    ``observation_action`` format), so the buffer stays small in checkpoints.
    """

    def __init__(self, per_task: int = 1, max_tasks: int = 4096, keep_prompts: bool = False):
        if per_task < 1 or max_tasks < 1:
            raise ValueError("SuccessBuffer: per_task and max_tasks must be >= 1")
        self.per_task = per_task
        self.max_tasks = max_tasks
        self.keep_prompts = keep_prompts
        self._data: "OrderedDict[str, list[dict]]" = OrderedDict()

    def __len__(self) -> int:
        """Number of tasks with at least one stored success."""
        return len(self._data)

    def add(self, traj: Trajectory) -> None:
        """Store a successful trajectory under its task (a trajectory already stored is skipped)."""
        key = task_key(traj)
        entries = self._data.pop(key, [])
        if any(e["traj_uid"] == traj.traj_uid for e in entries):
            self._data[key] = entries
            return
        entries.append(
            {
                "traj_uid": traj.traj_uid,
                "steps": [
                    {
                        "step_id": s.step_id,
                        "prompt": s.prompt if self.keep_prompts else "",
                        "response_text": s.response_text,
                    }
                    for s in traj.steps
                ],
            }
        )
        self._data[key] = entries[-self.per_task :]
        while len(self._data) > self.max_tasks:
            self._data.popitem(last=False)

    def newest(self, key: str) -> Optional[SuccessRef]:
        """The newest stored success of task ``key`` (see :func:`task_key`), or None."""
        entries = self._data.get(key)
        if not entries:
            return None
        e = entries[-1]
        return SuccessRef(steps=[SlimStep(**s) for s in e["steps"]], traj_uid=e["traj_uid"], source="buffer")

    def state_dict(self) -> dict:
        """Plain JSON-able data: ``{"tasks": [[key, [entry, ...]], ...]}`` in eviction order."""
        return {"tasks": [[k, [dict(e, steps=[dict(s) for s in e["steps"]]) for e in v]] for k, v in self._data.items()]}

    def load_state_dict(self, d: dict) -> None:
        """Replace the contents with :meth:`state_dict` output (bounds re-applied)."""
        self._data = OrderedDict()
        for key, entries in d.get("tasks", []):
            self._data[key] = [dict(e) for e in entries][-self.per_task :]
        while len(self._data) > self.max_tasks:
            self._data.popitem(last=False)


# ---------------------------------------------------------------------------------------------
# Anchor grouping (serl.md §4)


def anchor_clusters(
    observations: Sequence[str],
    step_ids: Sequence[int],
    similarity_thresh: Optional[float] = None,
    backend: str = "rapidfuzz",
) -> list[int]:
    """Cluster the rows of ONE group by their anchor observation (serl.md §4).

    A thin wrapper over :func:`serl.algos.advantages.anchor_groups` (shared with GiGPO) with
    SERL's visiting order.

    Args:
        observations: the anchor text of each row, in batch order.
        step_ids: each row's step id (the similarity pass visits rows in (step_id, batch
            index) order, as the original).
        similarity_thresh: None = exact equality of the text (the original's default). A float
            strictly in (0, 1) = greedy clustering: a row joins the first existing cluster whose
            representative (its first member) is at least this similar, else it seeds a new one.
        backend: ``rapidfuzz`` (default, ours): ``fuzz.ratio / 100`` = ``2·LCS / (len a + len b)``;
            ``difflib``: the original's ``SequenceMatcher(None, a, b).ratio()`` (slower; its scores
            are <= rapidfuzz's, so a pair near the threshold may cluster differently).

    Returns:
        A cluster id per row (equal ids = same anchor state).

    Raises:
        ValueError: threshold outside (0, 1) or unknown backend.
    """
    from serl.algos.advantages import anchor_groups

    return anchor_groups(
        list(observations), [0] * len(observations), similarity_thresh, order=list(step_ids), backend=backend
    )


# ---------------------------------------------------------------------------------------------
# Per-group view: rows, success choice, anchor clusters


@dataclass
class _Row:
    traj: Trajectory
    step: Step
    batch_index: int
    success: bool

    @property
    def ret(self) -> float:
        return self.traj.episode_reward


class GroupView:
    """What the modes may look up about one group: its rows, success choice and anchors.

    Built once per group per :meth:`SerlContextBuilder.build`; anchors are computed lazily.
    """

    def __init__(self, group: Group, cfg, first_batch_index: int, buffer: Optional[SuccessBuffer] = None):
        self.group = group
        self.cfg = cfg
        self.buffer = buffer
        thr = float(getattr(cfg, "success_reward_threshold", 1.0))
        self.success = {t.traj_uid: is_successful(t, thr) for t in group.trajectories}
        self.rows: list[_Row] = []
        bi = first_batch_index
        for t in group.trajectories:
            for s in t.steps:
                self.rows.append(_Row(t, s, bi, self.success[t.traj_uid]))
                bi += 1
        self._anchor_ids: Optional[list[int]] = None
        self._members: dict[int, list[_Row]] = {}
        self._cache: dict[tuple, Any] = {}
        self._row_pos = {id(r.step): k for k, r in enumerate(self.rows)}

    def success_for(self, traj: Trajectory, *, allow_self: bool = False) -> Optional[SuccessRef]:
        """The successful sample S for rows of ``traj`` (serl.md §3.2): the first successful
        trajectory of the group in group order, skipping ``traj`` itself when
        ``dont_reprompt_on_self_success``; else, with ``success_source=buffer``, the newest
        success of this task from an earlier iteration; else (``allow_self``, judge reference
        only) ``traj`` itself if it succeeded; else None."""
        skip_self = bool(getattr(self.cfg, "dont_reprompt_on_self_success", True))
        for t in self.group.trajectories:
            if skip_self and t is traj:
                continue
            if self.success[t.traj_uid] and t.steps:
                return SuccessRef(steps=t.steps, traj_uid=t.traj_uid, source="group")
        if self.buffer is not None and getattr(self.cfg, "success_source", "group") == "buffer":
            ref = self.buffer.newest(task_key(traj))
            if ref is not None:
                return ref
        if allow_self and self.success.get(traj.traj_uid) and traj.steps:
            return SuccessRef(steps=traj.steps, traj_uid=traj.traj_uid, source="self")
        return None

    def anchor_members(self, step: Step) -> list[_Row]:
        """The rows of the group in ``step``'s anchor cluster (itself included), batch order."""
        if self._anchor_ids is None:
            obs = [r.step.observation or r.step.prompt for r in self.rows]
            thr = None
            if getattr(self.cfg, "anchor_enable_similarity", False):
                thr = float(self.cfg.anchor_similarity_thresh)
            backend = getattr(self.cfg, "anchor_similarity_backend", "rapidfuzz")
            self._anchor_ids = anchor_clusters(obs, [r.step.step_id for r in self.rows], thr, backend)
        cid = self._anchor_ids[self._row_pos[id(step)]]
        if cid not in self._members:
            self._members[cid] = [r for r, c in zip(self.rows, self._anchor_ids) if c == cid]
        return self._members[cid]

    def cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        """Memoise a per-group value (e.g. an anchor table shared by all rows of a cluster)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


@dataclass
class ContextInputs:
    """What a mode function may look at for one row.

    Attributes:
        group, trajectory, step: the row.
        cfg: the ``algorithm.serl`` config section.
        view: the group's :class:`GroupView` (success choice, anchors); built on demand if None.
        judge_text: the judge's critique of ``trajectory`` (judge modes), None if none.
    """

    group: Group
    trajectory: Trajectory
    step: Step
    cfg: object
    view: Optional[GroupView] = None
    judge_text: Optional[str] = None

    def __post_init__(self) -> None:
        if self.view is None:
            self.view = GroupView(self.group, self.cfg, 0)


# ---------------------------------------------------------------------------------------------
# Mode registry


@dataclass(frozen=True)
class ModeSpec:
    """What a ``sampling_mode`` shows (see the tables of serl.md §3.3, §4 and docs/serl_modes.md).

    Attributes:
        granularity: ``"step"``, ``"anchor"`` or ``"trajectory"`` (judge).
        success, feedback, next_observation, future: parts used (S, F, N, U).
        feedback_only_without_success: the ``*_or_immediate_feedback`` modes: F only if no S.
        judge: None, ``"current"`` or ``"on_successful_sample"``.
    """

    name: str
    granularity: str
    success: bool = False
    feedback: bool = False
    next_observation: bool = False
    future: bool = False
    feedback_only_without_success: bool = False
    judge: Optional[str] = None

    @property
    def sources(self) -> set[str]:
        """Sources this mode can produce (which reference-fraction metrics it logs)."""
        out = set()
        if self.success:
            out.add("success")
        if self.feedback or self.feedback_only_without_success:
            out.add("feedback")
        if self.next_observation:
            out.add("next_observation")
        if self.future:
            out.add("future")
        if self.granularity == "anchor":
            out.add("anchor")
        if self.judge:
            out.add("judge")
        return out

    @property
    def fallback(self) -> str:
        """One-line description of what happens when a part is missing (for the docs table)."""
        if self.judge:
            return "no context if the judge fails or answers nothing"
        if self.granularity == "anchor":
            if self.name == "anchor_immediate_feedback":
                return "no context if no action in the anchor group has feedback"
            if self.feedback_only_without_success:
                return "always a table; feedback lines only if no S; S appended if found"
            return "always a table (the row is in its own group); S appended if found" if self.success else "always a table"
        if self.feedback_only_without_success:
            return "S if found, else F"
        return "no context unless every part exists (conjunctive)"


ModeFn = Callable[[ContextInputs], Optional[PrivilegedContext]]
SAMPLING_MODES: dict[str, ModeFn] = {}
MODE_SPECS: dict[str, ModeSpec] = {}
MODE_ALIASES: dict[str, str] = {}


def register_mode(name: str, spec: Optional[ModeSpec] = None):
    """Decorator registering a ``sampling_mode`` builder (and its :class:`ModeSpec`)."""

    def deco(fn: ModeFn) -> ModeFn:
        SAMPLING_MODES[name] = fn
        MODE_SPECS[name] = spec or ModeSpec(name, "step")
        return fn

    return deco


def canonical_mode(name: str) -> str:
    """Map an alias of the original (e.g. ``env_feedback``) to its canonical mode name; an
    unknown name is returned unchanged (see :func:`resolve_mode` for a checking version)."""
    return MODE_ALIASES.get(name, name)


def resolve_mode(name: str) -> str:
    """Canonical mode name; raises ``ValueError`` listing the valid names if unknown."""
    mode = canonical_mode(name)
    if mode not in SAMPLING_MODES:
        raise ValueError(
            f"unknown sampling_mode {name!r}; valid: {sorted(SAMPLING_MODES)} "
            f"(aliases: {sorted(MODE_ALIASES)})"
        )
    return mode


def _conjunctive(*parts: tuple[str, str, str]) -> Optional[PrivilegedContext]:
    """Context from ``(source, header, content)`` parts; None if any content is empty (step-level
    modes are conjunctive, serl.md §3.3)."""
    if any(not content.strip() for _, _, content in parts):
        return None
    return PrivilegedContext(sections=[(h, c) for _, h, c in parts], sources={s for s, _, _ in parts})


def _success_text(x: ContextInputs) -> tuple[str, Optional[SuccessRef]]:
    """The rendered S of the row's trajectory (cached per trajectory) and its reference."""

    def make() -> tuple[str, Optional[SuccessRef]]:
        ref = x.view.success_for(x.trajectory)
        if ref is None:
            return "", None
        text = render_steps(
            ref.steps,
            x.cfg.trajectory_format,
            remove_thinking=x.cfg.remove_thinking_from_demonstration,
            max_steps=x.cfg.max_traj_context_steps,
        )
        return text, ref

    return x.view.cached(("success", x.trajectory.traj_uid), make)


def _future_steps(traj: Trajectory, step: Step) -> list[Step]:
    return [s for s in traj.steps if s.step_id > step.step_id]


def _future_text(traj: Trajectory, step: Step, cfg) -> str:
    return render_steps(
        _future_steps(traj, step),
        cfg.trajectory_format,
        remove_thinking=cfg.remove_thinking_from_demonstration,
        max_steps=cfg.max_future_context_steps,
    )


def _step_mode(spec: ModeSpec, x: ContextInputs) -> Optional[PrivilegedContext]:
    """Step-level modes (serl.md §3.3): parts in the order S, U, F, N."""
    parts: list[tuple[str, str, str]] = []
    ref = None
    if spec.success:
        s_text, ref = _success_text(x)
        if spec.feedback_only_without_success:
            ctx = _conjunctive(("success", SUCCESS_HEADER, s_text)) if s_text else _conjunctive(
                ("feedback", FEEDBACK_HEADER, x.step.feedback)
            )
            if ctx is not None and ref is not None:
                ctx.info["success_source"] = ref.source
            return ctx
        parts.append(("success", SUCCESS_HEADER, s_text))
    if spec.future:
        parts.append(("future", FUTURE_HEADER, _future_text(x.trajectory, x.step, x.cfg)))
    if spec.feedback:
        parts.append(("feedback", FEEDBACK_HEADER, x.step.feedback))
    if spec.next_observation:
        parts.append(("next_observation", NEXT_OBS_HEADER, x.step.next_prompt))
    ctx = _conjunctive(*parts)
    if ctx is not None and ref is not None:
        ctx.info["success_source"] = ref.source
    return ctx


def _outcome(r: _Row) -> str:
    return f"{'success' if r.success else 'failure'}, reward {r.ret:.4f}"


def _best(rows: list[_Row]) -> _Row:
    """Highest return; ties -> smallest step id, then smallest batch index (serl.md §4)."""
    return max(rows, key=lambda r: (r.ret, -r.step.step_id, -r.batch_index))


def _worst(rows: list[_Row]) -> _Row:
    """Lowest return; ties -> largest step id, then largest batch index (serl.md §4)."""
    return min(rows, key=lambda r: (r.ret, -r.step.step_id, -r.batch_index))


def _by_action(members: list[_Row]) -> "OrderedDict[str, list[_Row]]":
    out: "OrderedDict[str, list[_Row]]" = OrderedDict()
    for r in sorted(members, key=lambda r: r.batch_index):
        out.setdefault(action_key(r.step.response_text), []).append(r)
    return out


def _anchor_table(
    actions: "OrderedDict[str, list[_Row]]", cfg, *, feedback: bool, next_obs: bool, future: bool
) -> tuple[str, set[str]]:
    """The anchor table: one block per distinct action (serl.md §4). Returns (text, sources)."""
    blocks, sources = [], {"anchor"}
    for key, rows in actions.items():
        n = len(rows)
        k = sum(r.success for r in rows)
        mean = sum(r.ret for r in rows) / n
        best, worst = _best(rows), _worst(rows)
        lines = [
            f"Action: {key}",
            f"Tried {n} time(s); succeeded {k}/{n}; mean return {mean:.4f}.",
            f"Best outcome: {_outcome(best)}.",
            f"Worst outcome: {_outcome(worst)}.",
        ]
        for wanted, attr, label, src in (
            (feedback, "feedback", "Feedback", "feedback"),
            (next_obs, "next_prompt", "Next observation", "next_observation"),
        ):
            if not wanted:
                continue
            b, w = getattr(best.step, attr).strip(), getattr(worst.step, attr).strip()
            if b:
                lines.append(f"{label} after the best outcome:\n{b}")
                sources.add(src)
            if w and w != b:
                lines.append(f"{label} after the worst outcome:\n{w}")
                sources.add(src)
        if future:
            succ = [r for r in rows if r.success]
            fail = [r for r in rows if not r.success]
            for subset, pick, label in ((succ, _best, SUCCESS_CONTINUATION), (fail, _worst, FAILED_CONTINUATION)):
                if not subset:
                    continue
                r = pick(subset)
                text = _future_text(r.traj, r.step, cfg)
                if text:
                    sources.add("future")
                lines.append(f"{label}\n{text or NO_CONTINUATION}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks), sources


def _anchor_mode(spec: ModeSpec, x: ContextInputs) -> Optional[PrivilegedContext]:
    """Anchor modes (serl.md §4): the table of actions tried from the row's state + S if found."""
    members = x.view.anchor_members(x.step)
    actions = x.view.cached(("actions", id(members)), lambda: _by_action(members))
    info = {"anchor_group_size": len(members), "anchor_action_count": len(actions)}
    if spec.name == "anchor_immediate_feedback":
        lines = []
        for key, rows in actions.items():
            seen: list[str] = []
            for r in rows:
                fb = " ".join(r.step.feedback.split())
                if fb and fb not in seen:
                    seen.append(fb)
            lines.extend(f"{key}, {fb}" for fb in seen)
        if not lines:
            return None
        return PrivilegedContext([(ANCHOR_FEEDBACK_HEADER, "\n".join(lines))], {"anchor", "feedback"}, info)
    s_text, ref = _success_text(x) if spec.success else ("", None)
    with_feedback = spec.feedback or (spec.feedback_only_without_success and not s_text)
    table, sources = x.view.cached(
        ("table", id(members), with_feedback),
        lambda: _anchor_table(actions, x.cfg, feedback=with_feedback, next_obs=spec.next_observation, future=spec.future),
    )
    ctx = PrivilegedContext([(ANCHOR_HEADER, table)], set(sources), info)
    if s_text:
        ctx.sections.append((SUCCESS_HEADER, s_text))
        ctx.sources.add("success")
        ctx.info["success_source"] = ref.source
    return ctx


def _judge_mode(spec: ModeSpec, x: ContextInputs) -> Optional[PrivilegedContext]:
    """Judge modes (serl.md §3.5): one "Trajectory Judge" section with the critique."""
    if not x.judge_text:
        return None
    return PrivilegedContext([(JUDGE_HEADER, x.judge_text)], {"judge"})


def _register_builtin_modes() -> None:
    step_modes = [
        ModeSpec("immediate_feedback", "step", feedback=True),
        ModeSpec("next_observation", "step", next_observation=True),
        ModeSpec("future_trajectory", "step", future=True),
        ModeSpec("successful_sample_or_immediate_feedback", "step", success=True, feedback_only_without_success=True),
        ModeSpec("successful_sample_immediate_feedback", "step", success=True, feedback=True),
        ModeSpec("successful_sample_next_observation", "step", success=True, next_observation=True),
        ModeSpec("successful_sample_future_trajectory", "step", success=True, future=True),
        ModeSpec("successful_sample_future_trajectory_immediate_feedback", "step", success=True, future=True, feedback=True),
        ModeSpec(
            "successful_sample_future_trajectory_next_observation", "step", success=True, future=True, next_observation=True
        ),
    ]
    anchor_modes = [ModeSpec("anchor_immediate_feedback", "anchor", feedback=True)] + [
        ModeSpec(
            "anchor_" + s.name,
            "anchor",
            success=s.success,
            feedback=s.feedback,
            next_observation=s.next_observation,
            future=s.future,
            feedback_only_without_success=s.feedback_only_without_success,
        )
        for s in step_modes[1:]
    ]
    judge_modes = [
        ModeSpec("judge_current_traj", "trajectory", judge="current"),
        ModeSpec("judge_current_traj_on_successful_sample", "trajectory", judge="on_successful_sample"),
    ]
    builders = {"step": _step_mode, "anchor": _anchor_mode, "trajectory": _judge_mode}
    for spec in step_modes + anchor_modes + judge_modes:
        register_mode(spec.name, spec)(partial(builders[spec.granularity], spec))
    # Aliases: the original's synonyms ``env_feedback`` (for immediate_feedback) and
    # ``successful_trajectory`` (for successful_sample), plus ``next_state`` (next_observation,
    # cf. the duplicate ``serl/next_state_reference_fraction`` metric), in every combination.
    subs = [("immediate_feedback", "env_feedback"), ("successful_sample", "successful_trajectory"),
            ("next_observation", "next_state")]
    for name in list(SAMPLING_MODES):
        for mask in itertools.product([False, True], repeat=len(subs)):
            alias = name
            for use, (old, new) in zip(mask, subs):
                if use:
                    alias = alias.replace(old, new)
            if alias != name:
                MODE_ALIASES[alias] = name


_register_builtin_modes()

#: the 20 canonical mode names, in documentation order
MODE_NAMES: tuple[str, ...] = tuple(SAMPLING_MODES)


# ---------------------------------------------------------------------------------------------
# Config checks


def validate_context_config(cfg) -> None:
    """Check the keys this module reads from ``algorithm.serl``; raises ``ConfigError`` naming
    the key (the lead's :func:`serl.algos.serl.validate_serl_config` may call this)."""
    from serl.config import ConfigError

    def check(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"algorithm.serl.{key}: {msg}")

    try:
        resolve_mode(cfg.sampling_mode)
    except ValueError as e:
        raise ConfigError(f"algorithm.serl.sampling_mode: {e}") from None
    check(cfg.trajectory_format in TRAJECTORY_FORMATS, "trajectory_format",
          f"unknown format {cfg.trajectory_format!r}; valid: {sorted(TRAJECTORY_FORMATS)}")
    check(cfg.max_traj_context_steps >= 0, "max_traj_context_steps", "must be >= 0 (0 = all steps)")
    check(cfg.max_future_context_steps >= 0, "max_future_context_steps", "must be >= 0 (0 = all steps)")
    src = getattr(cfg, "success_source", "group")
    check(src in SUCCESS_SOURCES, "success_source", f"must be one of {list(SUCCESS_SOURCES)}, got {src!r}")
    check(getattr(cfg, "success_buffer_per_task", 1) >= 1, "success_buffer_per_task", "must be >= 1")
    check(getattr(cfg, "success_buffer_max_tasks", 1) >= 1, "success_buffer_max_tasks", "must be >= 1")
    if getattr(cfg, "anchor_enable_similarity", False):
        t = cfg.anchor_similarity_thresh
        check(0.0 < t < 1.0, "anchor_similarity_thresh", f"must be strictly inside (0, 1), got {t}")
        bk = getattr(cfg, "anchor_similarity_backend", "rapidfuzz")
        check(bk in ("rapidfuzz", "difflib"), "anchor_similarity_backend", f"must be rapidfuzz or difflib, got {bk!r}")
    if MODE_SPECS[resolve_mode(cfg.sampling_mode)].judge:
        check(cfg.judge_api_url.startswith(("http://", "https://")), "judge_api_url",
              f"must be an http(s) URL such as http://localhost:8000/v1, got {cfg.judge_api_url!r}")
        check(cfg.judge_timeout > 0, "judge_timeout", "must be > 0 seconds")
        check(cfg.judge_batch_timeout > 0, "judge_batch_timeout", "must be > 0 seconds")
        check(cfg.judge_request_retries >= 0, "judge_request_retries", "must be >= 0")
        check(cfg.judge_max_concurrency >= 1, "judge_max_concurrency", "must be >= 1")
        check(cfg.judge_max_tokens >= 1, "judge_max_tokens", "must be >= 1")
    for key in ("teacher_log_every_n_steps",):
        if hasattr(cfg, key):
            check(getattr(cfg, key) >= 1, key, "must be >= 1")
    for key in ("teacher_log_max_text_chars", "teacher_log_sample_rows"):
        if hasattr(cfg, key):
            check(getattr(cfg, key) >= 0, key, "must be >= 0 (0 = no cap)")


# ---------------------------------------------------------------------------------------------
# The stateful entry point


class SerlContextBuilder:
    """Builds the privileged contexts of each iteration; holds the state that spans iterations.

    State: the success buffer (``success_source=buffer``) and the judge client (judge modes,
    created on first use). Call :meth:`build` once per training iteration while λ_eff > 0, on
    the iteration's groups, before the teacher forward; then :meth:`metrics` for logging.
    Checkpoint :meth:`state_dict`.

    Args:
        cfg: the ``algorithm.serl`` config section (:class:`serl.config.SerlConfig`).
        judge_client: a :class:`serl.judge.JudgeClient` to use instead of one built from ``cfg``
            (tests, sharing).

    Raises:
        serl.config.ConfigError: a bad key (see :func:`validate_context_config`).
    """

    def __init__(self, cfg, *, judge_client=None):
        validate_context_config(cfg)
        self.cfg = cfg
        self.mode = resolve_mode(cfg.sampling_mode)
        self.spec = MODE_SPECS[self.mode]
        self.buffer: Optional[SuccessBuffer] = None
        if getattr(cfg, "success_source", "group") == "buffer":
            self.buffer = SuccessBuffer(
                cfg.success_buffer_per_task,
                cfg.success_buffer_max_tasks,
                keep_prompts=canonical_format(cfg.trajectory_format) == "observation_action",
            )
        self._judge = judge_client
        self._metrics: dict[str, float] = {}

    # -- judge ---------------------------------------------------------------------------------

    def _judge_client(self):
        if self._judge is None:
            from serl.judge import JudgeClient

            self._judge = JudgeClient.from_config(self.cfg)
        return self._judge

    def _run_judge(self, groups: list[Group], views: list[GroupView]) -> tuple[dict[str, Optional[str]], dict]:
        """Judge every non-empty trajectory once (serl.md §3.5). Returns ``({traj_uid: text or
        None}, stats)``; raises :class:`serl.judge.JudgeError` in strict mode on a failure."""
        from serl.judge import JudgeError, build_judge_messages

        cfg = self.cfg
        trajs, requests = [], []
        for g, view in zip(groups, views):
            for t in g.trajectories:
                if not t.steps:
                    continue
                ref = view.success_for(t, allow_self=True) if self.spec.judge == "on_successful_sample" else None
                requests.append(
                    build_judge_messages(
                        t,
                        trajectory_format=cfg.trajectory_format,
                        remove_thinking=cfg.remove_thinking_from_demonstration,
                        max_steps=cfg.max_traj_context_steps,
                        include_feedback=cfg.judge_include_feedback,
                        reference=ref,
                    )
                )
                trajs.append(t)
        t0 = time.monotonic()
        results = self._judge_client().judge_many(requests) if requests else []
        failed = [r for r in results if r.error is not None]
        empty = [r for r in results if r.error is None and r.text is None]
        if failed:
            msg = (
                f"LLM judge failed for {len(failed)}/{len(results)} trajectories "
                f"(first error: {failed[0].error})"
            )
            if cfg.judge_request_strict:
                raise JudgeError(
                    msg + ". Check that an OpenAI-compatible server answers at "
                    f"algorithm.serl.judge_api_url={cfg.judge_api_url!r}, or set "
                    "algorithm.serl.judge_request_strict=false to train those rows without context."
                )
            log.warning("%s; those trajectories get no privileged context this iteration "
                        "(judge_request_strict=false).", msg)
        texts: dict[str, Optional[str]] = {}
        for t, r in zip(trajs, results):
            texts[t.traj_uid] = r.text
            t.extra["serl_judge"] = r.text
        n = max(1, len(results))
        stats = {
            "serl/judge_requests": float(len(results)),
            "serl/judge_failure_fraction": len(failed) / n,
            "serl/judge_empty_fraction": len(empty) / n,
            "serl/judge_seconds": time.monotonic() - t0,
        }
        return texts, stats

    # -- main ----------------------------------------------------------------------------------

    def build(self, groups: list[Group], *, evaluation: bool = False) -> list[Optional[PrivilegedContext]]:
        """One context (or None) per step row, in :func:`serl.trajectory.iter_steps` order.

        Judge modes call the judge once per trajectory (never on ``evaluation`` rollouts unless
        ``judge_on_validation``; then those rows get None) and store the critique in
        ``trajectory.extra["serl_judge"]``. After a training build (``evaluation=False``) the
        groups' successful trajectories are added to the success buffer (``success_source=buffer``),
        so the buffer only ever offers successes from *earlier* iterations.

        Raises:
            serl.judge.JudgeError: judge failure with ``judge_request_strict=true``.
        """
        views, bi = [], 0
        for g in groups:
            views.append(GroupView(g, self.cfg, bi, self.buffer))
            bi += len(views[-1].rows)
        judge_texts: dict[str, Optional[str]] = {}
        judge_stats: dict[str, float] = {}
        if self.spec.judge and (not evaluation or self.cfg.judge_on_validation):
            judge_texts, judge_stats = self._run_judge(groups, views)
        fn = SAMPLING_MODES[self.mode]
        contexts: list[Optional[PrivilegedContext]] = []
        for g, view in zip(groups, views):
            for r in view.rows:
                x = ContextInputs(g, r.traj, r.step, self.cfg, view, judge_texts.get(r.traj.traj_uid))
                contexts.append(fn(x))
        self._metrics = self._compute_metrics(contexts, judge_stats)
        if self.buffer is not None and not evaluation:
            for g, view in zip(groups, views):
                for t in g.trajectories:
                    if view.success[t.traj_uid] and t.steps:
                        self.buffer.add(t)
        return contexts

    def _compute_metrics(self, contexts: list[Optional[PrivilegedContext]], judge_stats: dict) -> dict[str, float]:
        n = len(contexts)
        if n == 0:
            return dict(judge_stats)
        have = [c for c in contexts if c is not None]
        m = {"serl/reprompt_sample_fraction": len(have) / n, "serl/context_available_fraction": len(have) / n}
        names = {
            "success": ["serl/success_reference_fraction"],
            "feedback": ["serl/feedback_reference_fraction"],
            "next_observation": ["serl/next_observation_reference_fraction", "serl/next_state_reference_fraction"],
            "future": ["serl/future_reference_fraction"],
            "anchor": ["serl/anchor_reference_fraction"],
            "judge": ["serl/traj_judge_reference_fraction"],
        }
        for src in sorted(self.spec.sources):
            frac = sum(src in c.sources for c in have) / n
            for key in names[src]:
                m[key] = frac
        if "success" in self.spec.sources and self.buffer is not None:
            m["serl/success_buffer_reference_fraction"] = sum(c.info.get("success_source") == "buffer" for c in have) / n
            m["serl/success_buffer_tasks"] = float(len(self.buffer))
        anchor = [c for c in have if "anchor_group_size" in c.info]
        if anchor:
            m["serl/anchor_group_size_mean"] = sum(c.info["anchor_group_size"] for c in anchor) / len(anchor)
            m["serl/anchor_action_count_mean"] = sum(c.info["anchor_action_count"] for c in anchor) / len(anchor)
        m.update(judge_stats)
        return m

    def metrics(self) -> dict[str, float]:
        """The ``serl/*`` context metrics of the last :meth:`build` (serl.md §8).

        Always: ``serl/reprompt_sample_fraction`` = ``serl/context_available_fraction`` (rows
        with a context / rows). Per source the mode can produce (logged even when 0, unlike the
        original, which logged only non-zero counts): ``serl/success_reference_fraction``,
        ``serl/feedback_reference_fraction``, ``serl/next_observation_reference_fraction`` (+ the
        duplicate ``serl/next_state_reference_fraction``), ``serl/future_reference_fraction``,
        ``serl/anchor_reference_fraction``, ``serl/traj_judge_reference_fraction`` (rows whose
        context contains that source / all rows). Anchor modes: ``serl/anchor_group_size_mean``,
        ``serl/anchor_action_count_mean`` (over rows with an anchor context). Buffer:
        ``serl/success_buffer_reference_fraction``, ``serl/success_buffer_tasks``. Judge:
        ``serl/judge_requests``, ``serl/judge_failure_fraction``, ``serl/judge_empty_fraction``,
        ``serl/judge_seconds``.
        """
        return dict(self._metrics)

    def state_dict(self) -> dict:
        """Plain JSON-able state for checkpoints: ``{"version": 1, "success_buffer": ... or None}``."""
        return {"version": 1, "success_buffer": self.buffer.state_dict() if self.buffer is not None else None}

    def load_state_dict(self, d: dict) -> None:
        """Restore :meth:`state_dict` output. A buffer saved by a run with ``success_source=buffer``
        is ignored (with a log line) when this run does not use the buffer."""
        saved = d.get("success_buffer")
        if saved is None:
            return
        if self.buffer is None:
            log.info("serl context state: ignoring a saved success buffer (success_source != buffer)")
            return
        self.buffer.load_state_dict(saved)

    def close(self) -> None:
        """Release the judge client's connections (if one was created here)."""
        if self._judge is not None and hasattr(self._judge, "close"):
            self._judge.close()


def build_privileged_contexts(groups: list[Group], cfg) -> list[Optional[PrivilegedContext]]:
    """Stateless wrapper: one context (or None) per step row, in :func:`serl.trajectory.iter_steps`
    order, with a fresh :class:`SerlContextBuilder` (no buffer carried across calls).

    Raises:
        serl.config.ConfigError: unknown ``sampling_mode`` or another bad key.
    """
    builder = SerlContextBuilder(cfg)
    try:
        return builder.build(groups)
    finally:
        builder.close()
