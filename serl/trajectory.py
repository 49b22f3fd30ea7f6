"""Step, Trajectory and Group records: what a rollout produces and every algorithm consumes.

Multi-turn rollouts are stored as *step rows*, as verl-agent and SERL do
(``langfengQ/verl-agent@574dd5b:agent_system/multi_turn_rollout/rollout_loop.py``;
SERL, arXiv 2605.19447): at env step ``t`` the policy sees a fresh single-turn prompt (task +
last ``history_length`` (observation, action) pairs + current observation + admissible actions) and samples one response. Each
(prompt, response) pair is one :class:`Step`; the steps of one episode form a
:class:`Trajectory`; the ``G`` trajectories that played the same task form a :class:`Group`
(the GRPO group, ``uid`` in verl-agent).

Only *active* steps are recorded (steps taken while the env was not yet done), so there are no
"garbage rows" to mask out later, and no rows are duplicated to pad a batch (the original's
``adjust_batch`` duplicates random rows, which then count twice in the group statistics).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from serl.envs.base import Task


@dataclass
class Step:
    """One (prompt, response) sample taken at one env step.

    Attributes:
        step_id: 0-based index of the step inside its trajectory (the rollout loop index).
        observation: raw env observation the agent saw before acting (the anchor text of
            GiGPO, arXiv 2505.10978; banner-stripped for ALFWorld).
        prompt: the full user-message text of this step (task, history, observation,
            admissible actions, format instructions).
        prompt_ids: the chat-templated prompt token ids fed to the policy, ``[prompt_len]``.
        response_ids: the sampled response token ids, EOS included if sampled, ``[resp_len]``.
        response_text: ``response_ids`` decoded with special tokens skipped.
        action_mask: per response token, 1 if the token lies inside the ``<action>`` content
            (SERL's action mask, arXiv 2605.19447), computed on ``response_ids``; ``[resp_len]``.
        action: the projected action string sent to the env (lower-cased; verl-agent's projection,
            ``langfengQ/verl-agent@574dd5b:agent_system/environments/env_package/alfworld/projection.py``).
        action_valid: format validity (think and action tags present, no CJK).
        admissible_actions: the env's admissible actions at this step (what the prompt listed).
        reward: the env reward of this step (10 on the winning step, else 0).
        feedback: the immediate feedback: the raw env observation returned after the action.
        next_prompt: the full templated prompt of the following step (SERL's
            ``next_observation_text``, ``OliverLeeXZ/SERL@5a2a85b:agent_system/multi_turn_rollout/rollout_loop.py``);
            built for the terminal step too.
        done: the episode ended at this step.
        won: the task was solved at this step.
        info: extra env fields from the step (e.g. WebShop ``task_score``); with
            ``rollout.action_selection=score``, ``sampled_action``: the action the policy wrote,
            where a scored command replaced it (:mod:`serl.rollout.action_selection`).
        rollout_log_probs: the rollout engine's log-probs (nats) of ``response_ids`` at the
            sampling temperature, ``[resp_len]``, when the engine reports them (vLLM); None
            otherwise. Only logged (the engine/trainer gap); the update recomputes them.
        loss_mask: per response token, 1 if the policy sampled it (it trains), 0 if the rollout
            inserted it (a tool's output, chat-template glue between turns), ``[resp_len]``; None
            = every token sampled (one turn per row, as ALFWorld's and WebShop's step rows). A row
            holding a whole multi-turn trajectory (the math env's tool use) sets it, as verl's
            ``response_mask`` of its agent loop
            (``volcengine/verl@b16865f2179f844ca8c8b0d271e9240ed72d96a2:verl/experimental/agent_loop/agent_loop.py``).
        prompt_format: how ``prompt_ids`` were built from ``prompt`` (:data:`serl.agent.chat.PROMPT_FORMATS`):
            ``chat`` (one user message, the tokenizer's template) or ``tool_chat`` (the math
            env's tools section); SERL's teacher prompt is built the same way.
    """

    step_id: int
    observation: str
    prompt: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str
    action_mask: list[int]
    action: str
    action_valid: bool
    admissible_actions: list[str] = field(default_factory=list)
    reward: float = 0.0
    feedback: str = ""
    next_prompt: str = ""
    done: bool = False
    won: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    rollout_log_probs: Optional[list[float]] = None
    loss_mask: Optional[list[int]] = None
    prompt_format: str = "chat"

    def trained_mask(self) -> list[int]:
        """:attr:`loss_mask`, or all ones when it is None; ``[resp_len]``.

        Raises:
            ValueError: ``loss_mask`` does not have one entry per response token.
        """
        if self.loss_mask is None:
            return [1] * len(self.response_ids)
        if len(self.loss_mask) != len(self.response_ids):
            raise ValueError(f"step {self.step_id}: loss_mask has {len(self.loss_mask)} entries for "
                             f"{len(self.response_ids)} response tokens")
        return list(self.loss_mask)


@dataclass
class Trajectory:
    """One episode of one environment.

    Attributes:
        uid: the group id shared by the ``G`` rollouts of one task (GRPO group).
        traj_uid: unique id of this trajectory.
        task: the task played.
        task_text: the natural-language task ("put a clean apple in fridge").
        steps: the active steps, in order.
        extra: free-form per-trajectory data (e.g. an LLM judge's critique, SERL's judge modes).
    """

    uid: str
    traj_uid: str
    task: Task
    task_text: str = ""
    steps: list[Step] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def won(self) -> bool:
        """True if the env reported ``won`` at the last active step (verl-agent's ``success_evaluator``)."""
        return bool(self.steps) and bool(self.steps[-1].won)

    @property
    def episode_reward(self) -> float:
        """Sum of env step rewards over the episode (10 or 0 for ALFWorld/WebShop)."""
        return float(sum(s.reward for s in self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def num_tool_calls(self) -> int:
        """Tool calls of the episode as SPEAR's tool-call bonus counts them: ``extra["tool_calls"]``
        when the rollout loop recorded it (the math env's tool loop: tool-calling assistant
        turns whose call parsed), else the number of steps (in ALFWorld and WebShop every env
        step is one tool call, as SPEAR's verl-agent reward manager counts them)."""
        return int(self.extra.get("tool_calls", len(self.steps)))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["task"] = asdict(self.task)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["task"] = Task(**d["task"])
        d["steps"] = [Step(**s) for s in d["steps"]]
        return cls(**d)


@dataclass
class Group:
    """The ``G`` trajectories that played the same task (one GRPO group, ``uid``)."""

    uid: str
    task: Task
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def success_rate(self) -> float:
        if not self.trajectories:
            return 0.0
        return sum(t.won for t in self.trajectories) / len(self.trajectories)


def iter_steps(groups: Iterable[Group]) -> Iterator[tuple[Group, Trajectory, Step]]:
    """Yield ``(group, trajectory, step)`` for every step row, in a fixed order
    (group order, then trajectory order, then step order). Batch row ``i`` of
    :func:`serl.train.batch.build_batch` is the ``i``-th item of this iterator."""
    for g in groups:
        for t in g.trajectories:
            for s in t.steps:
                yield g, t, s


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory]) -> None:
    """Write trajectories as JSON lines (one trajectory per line), atomically."""
    from serl.utils import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(t.to_dict()) + "\n" for t in trajectories))


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """Read trajectories written by :func:`write_jsonl`."""
    with open(path) as f:
        return [Trajectory.from_dict(json.loads(line)) for line in f if line.strip()]
