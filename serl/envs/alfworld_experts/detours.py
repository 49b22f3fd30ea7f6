"""ALFWorld's walkthrough expert with detours: states after a wrong turn, and the expert's way on.

A cold start trained on walkthroughs alone never sees the agent at a receptacle that does not hold
what it came for, nor the engine's ``Nothing happens.`` after a ``take`` of an object that is not
there: the stored plan goes straight to the right receptacle, and every command in it succeeds.
Without the admissible-action list in each turn (``env.turn_actions=none``), a model so trained
takes the object wherever it stands and then acts as if it held it. This expert plays the
walkthrough, but before some of its ``go to`` commands it first goes somewhere else:

* with probability ``p`` (at most ``max_detours`` times an episode), before a walkthrough
  ``go to R``: ``go to R'`` for an admissible ``R' != R`` drawn at random;
* there, with probability ``take_p``, when the walkthrough's next command after ``go to R`` (past
  an ``open R``) is ``take X from R``: ``take X from R'``, which the engine refuses (``X`` is at
  ``R``), unless it is admissible there, when it is skipped;
* then the walkthrough goes on from ``go to R``.

The detour's replies are context only (weight 0: the row does not train on a random ``go to`` or a
refused ``take``); the expert's reply after them trains (weight 1). A detour moves the agent
only, so the walkthrough stays a plan: ``go to R`` is admissible from anywhere but ``R``, and the
commands after it do not depend on where the agent came from. Every action goes through the real
engine, so the observations after a detour are ALFWorld's own.

This is DART-style noise injection with the expert's recovery as the label (Laskey et al., "DART:
Noise Injection for Robust Imitation Learning", arXiv 1703.09327), played on the
walkthrough of ALFWorld (arXiv 2010.03768) rather than from the policy's own states as DAgger
(:mod:`serl.rollout.dagger`) does; a serl option, not part of any original recipe.
"""

from __future__ import annotations

from typing import Callable, Optional

from serl.envs.base import StepResult, Task


class AlfWorldDetourExpert:
    """The walkthrough with detours (see the module docstring).

    Args:
        task: the ALFWorld task (its ``task_id`` is the game path).
        seed: the think templates and the detours (one ``random.Random`` per task and seed).
        think: ``think(task_text, action, rng) -> str``, the reply's reasoning (the walkthrough
            expert's templates, :func:`serl.envs.alfworld_experts.walkthrough.alfworld_think`).
        p: probability of a detour before each walkthrough ``go to``, in [0, 1].
        take_p: probability of a refused ``take`` at the detour's receptacle, in [0, 1].
        max_detours: detours at most per episode.

    ``act`` returns ``(think, action, weight)``: weight 0 for a detour's replies, 1 otherwise.

    Raises:
        EnvError: the game file is missing, corrupt or has no walkthrough.
        ValueError: ``p`` or ``take_p`` outside [0, 1], or ``max_detours < 0``.
    """

    def __init__(self, task: Task, seed: int, think: Callable, p: float, take_p: float = 0.5, max_detours: int = 2):
        import random

        from serl.envs.alfworld import walkthrough

        if not (0.0 <= p <= 1.0 and 0.0 <= take_p <= 1.0) or max_detours < 0:
            raise ValueError(f"detours: p and take_p must be in [0, 1] and max_detours >= 0, "
                             f"got p={p}, take_p={take_p}, max_detours={max_detours}")
        self.task, self.seed, self.think = task, seed, think
        self.p, self.take_p, self.detours_left = p, take_p, max_detours
        self.plan = walkthrough(task)
        self.k = 0  # next walkthrough command
        self.pending: Optional[str] = None  # a refused take to try at the detour's receptacle
        self.rng = random.Random(f"serl-expert-detours/{seed}/{task.key}")
        self.detours = 0

    def _think(self, result: StepResult, action: str) -> str:
        return self.think(result.task, action, self.rng)

    def _take_after(self, k: int) -> Optional[tuple[str, str]]:
        """``(object, receptacle)`` of the walkthrough's ``take`` right after its ``go to`` at ``k``
        (an ``open`` of that receptacle between them allowed), else None."""
        target = self.plan[k][len("go to "):]
        for cmd in self.plan[k + 1: k + 3]:
            if cmd == f"open {target}":
                continue
            if cmd.startswith("take ") and cmd.endswith(f" from {target}"):
                return cmd[len("take "): -len(f" from {target}")], target
            break
        return None

    def act(self, env, result: StepResult, step: int) -> Optional[tuple[str, str, int]]:
        """``(think, action, weight)`` for the current state, or None when the walkthrough is done."""
        if self.pending is not None:
            take, self.pending = self.pending, None
            if take not in result.admissible_actions:
                return self._think(result, take), take, 0
        if self.k >= len(self.plan):
            return None
        nxt = self.plan[self.k]
        if nxt.startswith("go to ") and self.detours_left > 0 and self.rng.random() < self.p:
            options = [a for a in result.admissible_actions if a.startswith("go to ") and a != nxt]
            if options:
                detour = self.rng.choice(options)
                self.detours_left -= 1
                self.detours += 1
                fetch = self._take_after(self.k)
                if fetch is not None and self.rng.random() < self.take_p:
                    self.pending = f"take {fetch[0]} from {detour[len('go to '):]}"
                return self._think(result, detour), detour, 0
        self.k += 1
        return self._think(result, nxt), nxt, 1
