"""BaseEnvPool: the part of an env pool that does not depend on how the envs are reached.

Holds :class:`BaseEnvPool`, the base class of :class:`serl.envs.pool.EnvPool` (local worker
processes) and :class:`serl.envs.ray_pool.RayEnvPool` (Ray actors): the argument checks, the
public API (``reset`` / ``step``, ``*_async`` + ``*_wait``, ``worker_info``, ``close``, the
context manager), the one-pending-call state machine, the closed / broken rules and the
:class:`~serl.errors.EnvWorkerError` messages; plus the timing constants both pools share.

Not here: any transport. A subclass implements the hooks ``_dispatch``, ``_gather``,
``_in_flight``, ``_info`` and ``_shutdown``; starting and talking to worker processes is in
:mod:`serl.envs.pool`, the code that runs inside a worker in :mod:`serl.envs.worker`. The
semantics (what a ``None`` task or action means, when a pool is broken) are described in
:mod:`serl.envs.pool`'s docstring.
"""

from __future__ import annotations

from typing import Any, NoReturn, Sequence

from serl.envs.base import StepResult, Task, env_entry_point
from serl.errors import EnvError, EnvWorkerError

#: how long one ``wait`` slice lasts while the parent also checks that workers are alive (s)
_POLL_SLICE_S = 0.2
#: how long ``close()`` lets a worker exit on its own before it is terminated (s)
_CLOSE_GRACE_S = 3.0


def _first_of(errors: list[EnvWorkerError]) -> EnvWorkerError:
    """The first env error of a call, its message noting the other envs that failed too."""
    first = errors[0]
    if len(errors) > 1:
        others = [e.env_index for e in errors[1:]]
        first.args = (f"{first.args[0]}\n({len(others)} more env(s) failed in the same call: envs {others})",)
    return first


class BaseEnvPool:
    """What every env pool shares: the argument checks, the one-pending-call state machine of
    ``reset`` / ``step`` (``*_async`` + ``*_wait``), the closed / broken checks and the error
    messages. :class:`EnvPool` (worker processes) and
    :class:`serl.envs.ray_pool.RayEnvPool` (Ray actors) implement the transport hooks
    ``_dispatch``, ``_gather``, ``_in_flight``, ``_info`` and ``_shutdown``.

    Raises:
        ValueError: ``num_envs < 1``, ``num_workers < 0`` or ``timeout <= 0``.
        ConfigError: ``env_name`` is not a registered name (the message lists the valid ones).
    """

    def __init__(self, env_name: str | type, num_envs: int, num_workers: int,
                 env_kwargs: dict[str, Any] | None = None, timeout: float = 300.0):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = serial in-process), got {num_workers}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if isinstance(env_name, str) and ":" not in env_name:
            env_entry_point(env_name)  # an unknown name fails here, listing the valid ones
        self.env_name = env_name
        self.num_envs = int(num_envs)
        self.num_workers = min(int(num_workers), self.num_envs)
        self.env_kwargs = dict(env_kwargs or {})
        self.timeout = float(timeout)
        self._tasks: list[Task | None] = [None] * self.num_envs
        self._pending_cmd: str | None = None
        self._broken: str | None = None
        self._closed = False

    # -- transport hooks (subclasses) ----------------------------------------------------
    def _dispatch(self, cmd: str, args: list[Any]) -> None:
        """Start ``cmd`` (``"reset"`` | ``"step"``) on every env whose ``args[i]`` is not None."""
        raise NotImplementedError

    def _gather(self, cmd: str) -> tuple[list[StepResult | None], list[EnvWorkerError]]:
        """Results of the dispatched call by env, and the env exceptions raised in it; raises
        :class:`EnvWorkerError` (after :meth:`_raise_broken`) for a dead or hung worker."""
        raise NotImplementedError

    def _in_flight(self) -> bool:
        """Whether replies of the dispatched call are still unread."""
        return False

    def _info(self) -> list[dict[str, Any]]:
        return []

    def _shutdown(self) -> None:
        raise NotImplementedError

    # -- public API ----------------------------------------------------------------------
    def _env_ref(self) -> str | type:
        """The env as it travels to a worker: a registered name goes as its entry point, since
        a worker is a fresh interpreter that does not see the parent's ``register_env`` calls."""
        if isinstance(self.env_name, type) or ":" in self.env_name:
            return self.env_name
        return env_entry_point(self.env_name)

    def reset(self, tasks: Sequence[Task | None]) -> list[StepResult | None]:
        """Reset env ``i`` to ``tasks[i]`` for every ``i`` (``len(tasks) == num_envs``); a
        ``None`` task leaves that env untouched and gives ``None``. Blocks until all are done.
        Raises :class:`EnvWorkerError` (see :meth:`reset_wait`)."""
        self.reset_async(tasks)
        return self.reset_wait()

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Step env ``i`` with ``actions[i]``; ``None`` = idle/done env, not stepped, ``None``
        returned. Blocks until all are done. Raises :class:`EnvWorkerError` (see
        :meth:`step_wait`)."""
        self.step_async(actions)
        return self.step_wait()

    def reset_async(self, tasks: Sequence[Task | None]) -> None:
        """Send the resets and return at once; collect them with :meth:`reset_wait`.

        Raises:
            ValueError: ``len(tasks) != num_envs``.
            EnvError: the pool is closed or broken, or another call is still pending.
        """
        if len(tasks) != self.num_envs:
            raise ValueError(f"reset needs one task (or None) per env: got {len(tasks)}, num_envs={self.num_envs}")
        self._send("reset", list(tasks))
        for i, t in enumerate(tasks):
            if t is not None:
                self._tasks[i] = t

    def reset_wait(self) -> list[StepResult | None]:
        """Results of the pending :meth:`reset_async`, indexed by env.

        Raises:
            EnvWorkerError: a worker died or hung (the pool is then broken), or an env raised
                (e.g. a missing/corrupt game file; the pool stays usable, and the other envs
                of the call were reset).
        """
        return self._wait("reset")

    def step_async(self, actions: Sequence[str | None]) -> None:
        """Send the steps and return at once; collect them with :meth:`step_wait`.

        Raises:
            ValueError: ``len(actions) != num_envs``.
            EnvError: the pool is closed or broken, or another call is still pending.
        """
        if len(actions) != self.num_envs:
            raise ValueError(f"step needs one action (or None) per env: got {len(actions)}, num_envs={self.num_envs}")
        self._send("step", list(actions))

    def step_wait(self) -> list[StepResult | None]:
        """Results of the pending :meth:`step_async`, indexed by env (``None`` where the
        action was ``None``). Raises :class:`EnvWorkerError` as :meth:`reset_wait` does."""
        return self._wait("step")

    def worker_info(self) -> list[dict[str, Any]]:
        """Diagnostics from each worker: ``pid``, ``torch_imported``, ``omp_num_threads``,
        ``env_indices``. Empty in serial mode. Raises :class:`EnvWorkerError` if a worker
        does not answer."""
        self._check_usable()
        return self._info()

    def close(self) -> None:
        """Stop the workers and close the envs. Idempotent; safe after any error, including a
        broken pool (dead or hung workers are killed). Raises :class:`EnvError` if an env's
        ``close()`` failed (after everything is stopped)."""
        if self._closed:
            return
        self._closed = True
        self._shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- shared internals ----------------------------------------------------------------
    def _check_usable(self) -> None:
        kind = type(self).__name__
        if self._closed:
            raise EnvError(f"this {kind} is closed; create a new one.")
        if self._broken is not None:
            raise EnvWorkerError(
                f"this {kind} is broken by an earlier worker failure ({self._broken}); "
                "call close() and create a new pool."
            )
        if self._pending_cmd is not None:
            raise EnvError(f"an {kind} {self._pending_cmd} is still pending; call {self._pending_cmd}_wait() first.")

    def _send(self, cmd: str, args: list[Any]) -> None:
        self._check_usable()
        self._dispatch(cmd, args)
        self._pending_cmd = cmd

    def _task_id(self, i: int | None) -> str | None:
        if i is None:
            return None
        t = self._tasks[i]
        return t.task_id if t is not None else None

    def _wait(self, cmd: str) -> list[StepResult | None]:
        if self._pending_cmd != cmd:
            raise EnvError(f"{cmd}_wait() called without a pending {cmd}_async()")
        self._pending_cmd = None
        try:
            results, errors = self._gather(cmd)
        except BaseException as e:
            # Interrupted (e.g. KeyboardInterrupt) with replies still in flight: they would be
            # read as the answers of the next call, so the pool cannot be used any more.
            if self._broken is None and self._in_flight():
                self._broken = f"{cmd}_wait() was interrupted by {type(e).__name__} with replies still pending"
            raise
        if errors:
            raise _first_of(errors)
        return results

    def _env_error(self, i: int, worker: int, cmd: str, message: str, remote_tb: str) -> EnvWorkerError:
        """The error of an env that raised inside a live worker (the pool stays usable)."""
        return EnvWorkerError(
            f"env {i} (task {self._task_id(i)}) raised in worker {worker} during {cmd}: {message}\n"
            f"Remote traceback:\n{remote_tb}",
            env_index=i,
            task_id=self._task_id(i),
            worker=worker,
            remote_traceback=remote_tb,
        )

    def _raise_broken(self, who: str, worker: int, i: int | None, env_indices: list[int], reason: str,
                      exitcode: int | None = None) -> NoReturn:
        """Mark the pool broken and raise :class:`EnvWorkerError` naming env ``i`` and its task
        (``who`` names the worker, e.g. ``"env worker 0 (pid 123)"``)."""
        task_id = self._task_id(i)
        where = f"env {i} (task {task_id})" if i is not None else f"envs {env_indices}"
        msg = f"{who} serving {where}: {reason}"
        self._broken = msg
        raise EnvWorkerError(msg, env_index=i, task_id=task_id, worker=worker, exitcode=exitcode)
