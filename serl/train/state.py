"""What a training run must carry across ``--resume``, in one place: :class:`TrainState`.

Holds the counters (iteration, policy updates), the task order (:class:`TaskSampler`), the RNG of
the std filter's and the replay batch's draws, SPEAR's replay buffer and SERL's hindsight state
(the success buffer of the context builder). Model weights and the optimizer are not here: they
are the checkpoint's tensor files (:mod:`serl.train.checkpoint`), and the trainer writes the
process group's RNG next to this state.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from serl.algos.spear import ReplayBuffer
from serl.envs.base import Task
from serl.hindsight.builder import SerlContextBuilder

log = logging.getLogger(__name__)


class TaskSampler:
    """Deterministic task order: the train tasks shuffled once per epoch with ``seed + epoch``.

    The cursor ``(epoch, position)`` is checkpointed so a resumed run draws the same tasks.

    Raises:
        ValueError: ``tasks`` is empty.
    """

    def __init__(self, tasks: list[Task], seed: int):
        if not tasks:
            raise ValueError("no training tasks found")
        self.tasks = tasks
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(self.seed + epoch).shuffle(order)
        return order

    def draw(self, k: int) -> list[Task]:
        out = []
        for _ in range(k):
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._shuffled(self.epoch)
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, d: dict[str, int]) -> None:
        self.epoch, self.pos = int(d["epoch"]), int(d["pos"])
        self._order = self._shuffled(self.epoch)


@dataclass
class TrainState:
    """The resumable state of a run (see the module docstring).

    Attributes:
        sampler: the train tasks' order and cursor.
        generator: draws of the group std filter's power-of-two trim and of SPEAR's replay batch.
        replay_buffer: SPEAR's buffer (``algorithm.spear.enable_trajectory_replay``), else None.
        context_builder: SERL's privileged-context builder (SERL on), else None.
        iteration: completed iterations; ``iteration + 1`` is verl's ``global_steps``.
        update_step: u, completed policy updates (SERL's λ schedule, the teacher sync phase).
        pending_tasks: the next iteration's tasks, drawn early so their env resets run while the
            update trains; None when nothing is prefetched.
        sampler_before_pending: the sampler's cursor before that draw (a checkpoint stores it, so
            a resumed run draws those tasks again).
    """

    sampler: TaskSampler
    generator: torch.Generator
    replay_buffer: Optional[ReplayBuffer] = None
    context_builder: Optional[SerlContextBuilder] = None
    iteration: int = 0
    update_step: int = 0
    pending_tasks: Optional[list[Task]] = None
    sampler_before_pending: dict[str, int] = field(default_factory=dict)

    def draw_tasks(self, k: int) -> list[Task]:
        """The tasks of this iteration: the prefetched ones, else ``k`` fresh draws."""
        if self.pending_tasks is not None:
            tasks, self.pending_tasks = self.pending_tasks, None
            return tasks
        return self.sampler.draw(k)

    def prefetch_tasks(self, k: int) -> list[Task]:
        """Draw the next iteration's ``k`` tasks now, remembering the cursor before the draw."""
        self.sampler_before_pending = self.sampler.state_dict()
        self.pending_tasks = self.sampler.draw(k)
        return self.pending_tasks

    def state_dict(self) -> dict[str, Any]:
        """Counters, the sampler's cursor *before* any prefetched draw, the generator's state and,
        when present, the replay buffer's and the context builder's."""
        sampler = self.sampler_before_pending if self.pending_tasks else self.sampler.state_dict()
        state: dict[str, Any] = {"update_step": self.update_step, "sampler": sampler,
                                 "generator": self.generator.get_state()}
        if self.context_builder is not None:
            state["serl_context"] = self.context_builder.state_dict()
        if self.replay_buffer is not None:
            state["replay_buffer"] = self.replay_buffer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], source: str = "checkpoint") -> None:
        """Restore from a checkpoint's ``state`` (``iteration`` is the checkpoint's own key). A
        checkpoint without a replay buffer (e.g. a GRPO run resumed with SPEAR on) leaves the
        buffer empty, with a warning naming ``source``."""
        self.iteration = int(state["iteration"])
        self.update_step = int(state["update_step"])
        self.sampler.load_state_dict(state["sampler"])
        self.pending_tasks = None
        if self.context_builder is not None and "serl_context" in state:
            self.context_builder.load_state_dict(state["serl_context"])
        if "generator" in state:
            self.generator.set_state(state["generator"])
        if self.replay_buffer is not None:
            if "replay_buffer" in state:
                self.replay_buffer.load_state_dict(state["replay_buffer"])
            else:
                log.warning("checkpoint %s has no replay buffer: SPEAR replay starts empty", source)
