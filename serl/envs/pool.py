"""EnvPool: step many text environments in parallel worker processes.

``EnvPool(env_name, num_envs, num_workers, env_kwargs)`` owns ``num_envs`` environments; env
``i`` lives in worker ``i % num_workers`` (the local counterpart of
verl-agent's one-Ray-actor-per-env layer, ``langfengQ/verl-agent@574dd5b:agent_system/environments``). Every call addresses all envs at
once, one LLM turn for all of them:

* ``reset(tasks)`` / ``step(actions)``: blocking; a ``None`` task or action leaves that env
  alone (idle or already done) and yields ``None`` in its slot.
* ``reset_async`` + ``reset_wait`` / ``step_async`` + ``step_wait``: send the work, do something
  else (e.g. generate the next responses of envs that are not being stepped), then collect.
* ``num_workers=0``: serial, in-process mode with the same API (tests, benchmarks, debugging).

This module holds the parent side of the local pool: :class:`EnvPool` starts the worker
processes, sends them the calls over pipes, reads their replies and detects dead or hung workers.
It does not hold what every pool shares (argument checks, the one-pending-call state machine,
the closed / broken rules, the error messages: :class:`serl.envs.pool_base.BaseEnvPool`,
re-exported here), nor the code that runs inside a worker and its message protocol
(:mod:`serl.envs.worker`). :class:`serl.envs.ray_pool.RayEnvPool` (``env.pool=ray``) is the
same interface on Ray actors, possibly on other machines.

**Process model (decision).** Workers are fresh Python interpreters started with
:mod:`subprocess` (``python -c "from serl.envs.worker import worker_main; ..."``) and talk to the
parent over a :func:`multiprocessing.Pipe` whose child end is inherited as a file descriptor.
We do not ``fork``: the trainer process has torch (and its OpenMP / thread pools) loaded, and
forking a multi-threaded process is unsafe. We do not use multiprocessing's ``spawn`` /
``forkserver`` either: both re-import the parent's ``__main__`` module in every child, which
imports torch whenever the launching script does. A worker therefore only imports
``serl.envs.base``, :mod:`serl.envs.worker` and the env module itself; it never imports torch. Workers get
``OMP_NUM_THREADS=1`` (and MKL / OpenBLAS = 1, ``OMP_WAIT_POLICY=PASSIVE``) and ignore SIGINT
(the parent closes them). POSIX only.

**Failures never hang the caller.** The parent waits on the pipes with
:func:`multiprocessing.connection.wait` in short slices while checking that each worker is
alive. A worker that dies (segfault, SIGKILL, out-of-memory kill), stops answering for
``timeout`` seconds, or raises inside an env call is reported as :class:`EnvWorkerError`
naming the env index, its task id (the ALFWorld game path) and the exit code or the remote
traceback. A dead or hung worker marks the pool *broken*: every later call raises at once, and
``close()`` still works (it kills what is left). So does a ``*_wait`` interrupted (e.g. by
Ctrl-C) while replies are in flight, since they would otherwise be read as later answers. An exception raised by an env inside a live
worker does not break the pool: the worker finishes the other envs of the call first, so the
pool stays in sync and can be used again.

Worker recycling is not implemented; a long-lived ALFWorld worker grows about 1 MB per game
loaded. Close and re-create the pool to recycle.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
import weakref
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NoReturn

from serl.envs.base import StepResult
from serl.envs.pool_base import _CLOSE_GRACE_S, _POLL_SLICE_S, BaseEnvPool
from serl.envs.worker import resolve_env_class
from serl.errors import EnvError, EnvWorkerError  # noqa: F401  (EnvWorkerError re-exported)

#: seconds a worker may take to start (import its env), whatever ``timeout`` is
_START_MIN_S = 60.0


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"killed by signal {-code} (exit code {code})"
    return f"exit code {code}"


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    conn: Connection
    env_indices: list[int]
    #: env indices of the running command, in the order the worker serves them
    pending: list[int] = field(default_factory=list)


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """Finalizer: make sure no worker outlives a pool that was never closed."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass  # a process that ignores SIGKILL (uninterruptible sleep): nothing more to do


class EnvPool(BaseEnvPool):
    """``num_envs`` environments of one kind, stepped in parallel worker processes.

    Args:
        env_name: registry name (``"alfworld"``, ``"webshop"``, or one added with
            :func:`serl.envs.base.register_env`), a ``"module:Class"`` entry point, or an env
            class (it must be importable by reference in a fresh interpreter, i.e. defined at
            module level).
        num_envs: number of environments (>= 1).
        num_workers: worker processes (capped at ``num_envs``); env ``i`` lives in worker
            ``i % num_workers``. ``0`` = serial in-process mode.
        env_kwargs: keyword arguments of the env constructor (picklable plain values).
        timeout: seconds a worker may go without answering during a ``*_wait`` before it is
            declared hung (:class:`EnvWorkerError`, the pool becomes broken). Start-up gets
            ``max(timeout, 60)`` seconds.

    Raises:
        ValueError: bad sizes.
        ConfigError: ``env_name`` is not a registered name (the message lists the valid ones).
        EnvWorkerError: a worker failed to start or to build its envs.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        env_name: str | type,
        num_envs: int,
        num_workers: int,
        env_kwargs: dict[str, Any] | None = None,
        timeout: float = 300.0,
    ):
        super().__init__(env_name, num_envs, num_workers, env_kwargs, timeout)
        self._serial_results: list[Any] | None = None
        self._workers: list[_Worker] = []
        self._envs: list[Any] = []
        self._finalizer = None
        if self.num_workers == 0:
            cls = resolve_env_class(env_name)
            self._envs = [cls(**self.env_kwargs) for _ in range(self.num_envs)]
        else:
            self._start_workers()

    # -- start-up ------------------------------------------------------------------------
    def _start_workers(self) -> None:
        # The package root goes on PYTHONPATH so `serl` imports in the child even when it is
        # not installed (run from a checkout); the parent's full sys.path follows at init.
        pkg_root = str(Path(__file__).resolve().parents[2])
        child_env = dict(os.environ)
        child_env["PYTHONPATH"] = os.pathsep.join([pkg_root] + ([child_env["PYTHONPATH"]] if child_env.get("PYTHONPATH") else []))
        child_env.update(
            {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        )
        procs: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(self, _kill_all, procs)
        for w in range(self.num_workers):
            parent_conn, child_conn = Pipe(duplex=True)
            fd = child_conn.fileno()
            proc = subprocess.Popen(
                [sys.executable, "-c", f"from serl.envs.worker import worker_main; worker_main({fd})"],
                pass_fds=(fd,),
                env=child_env,
                stdin=subprocess.DEVNULL,
            )
            child_conn.close()
            procs.append(proc)
            indices = list(range(w, self.num_envs, self.num_workers))
            self._workers.append(_Worker(w, proc, parent_conn, indices))
        try:
            for wk in self._workers:
                spec = pickle.dumps((self._env_ref(), self.env_kwargs, wk.env_indices))
                wk.conn.send(("init", list(sys.path), spec))
            for wk in self._workers:
                self._await_ready(wk)
        except BaseException:
            self.close()
            raise

    def _await_ready(self, wk: _Worker) -> None:
        # start-up (a fresh interpreter importing the env) gets at least _START_MIN_S, so a short
        # ``timeout`` meant for hung steps does not fail the start on a busy machine
        start_s = max(self.timeout, _START_MIN_S)
        deadline = time.monotonic() + start_s
        while True:
            if wk.conn.poll(_POLL_SLICE_S):
                try:
                    msg = wk.conn.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is not None and msg[0] == "ready":
                    return
                code = self._exitcode(wk)
                detail = f"\nRemote traceback:\n{msg[1]}" if msg is not None and msg[0] == "fatal" else ""
                raise EnvWorkerError(
                    f"env worker {wk.index} (envs {wk.env_indices}) failed to start "
                    f"{self.env_name!r} envs with kwargs {self.env_kwargs} ({_describe_exit(code)}).{detail}",
                    worker=wk.index,
                    exitcode=code,
                    remote_traceback=msg[1] if detail else None,
                )
            if wk.proc.poll() is not None and not wk.conn.poll(0):
                raise EnvWorkerError(
                    f"env worker {wk.index} died during start-up ({_describe_exit(wk.proc.returncode)}); "
                    "its stderr above may say why.",
                    worker=wk.index,
                    exitcode=wk.proc.returncode,
                )
            if time.monotonic() > deadline:
                raise EnvWorkerError(
                    f"env worker {wk.index} did not start within {start_s:.0f} s.", worker=wk.index
                )

    @staticmethod
    def _exitcode(wk: _Worker, wait_s: float = 2.0) -> int | None:
        try:
            return wk.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    # -- public API ----------------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the worker processes (empty in serial mode)."""
        return [wk.proc.pid for wk in self._workers]

    # -- transport -----------------------------------------------------------------------
    def _info(self) -> list[dict[str, Any]]:
        out = []
        for wk in self._workers:
            wk.conn.send(("info",))
            msg = self._recv(wk, time.monotonic())
            out.append(msg[1])
        return out

    def _shutdown(self) -> None:
        if self._envs:
            errors = []
            for i, env in enumerate(self._envs):
                try:
                    env.close()
                except Exception as e:  # close every env, then re-raise the first failure
                    errors.append((i, e))
            self._envs = []
            if errors:
                i, e = errors[0]
                raise EnvError(f"closing env {i} failed: {type(e).__name__}: {e}") from e
            return
        asked = []
        for wk in self._workers:
            if wk.proc.poll() is None and self._broken is None:
                try:
                    wk.conn.send(("close",))
                    asked.append(wk)
                except (BrokenPipeError, OSError):
                    pass  # already gone; it is reaped below
        deadline = time.monotonic() + (_CLOSE_GRACE_S if self._broken is None else 0.0)
        close_failures = [(wk.index, tb) for wk in asked if (tb := self._await_closed(wk, deadline))]
        for wk in self._workers:
            try:
                wk.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                wk.proc.kill()  # busy (e.g. a pending reset), hung or stopped: no need to wait
                wk.proc.wait(timeout=5)
            wk.conn.close()
        if self._finalizer is not None:
            self._finalizer.detach()
        if close_failures:
            w, tb = close_failures[0]
            raise EnvError(f"closing the envs of worker {w} failed (all workers are stopped):\n{tb}")

    @staticmethod
    def _await_closed(wk: _Worker, deadline: float) -> str | None:
        """Read ``wk``'s replies until its ``("closed", error)`` or ``deadline``; returns the
        traceback of a failed ``env.close()`` in that worker, else None. Replies of a call
        still in flight are discarded (the pool is closing)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not wk.conn.poll(min(left, _POLL_SLICE_S)):
                if wk.proc.poll() is not None and not wk.conn.poll(0):
                    return None
                continue
            try:
                msg = wk.conn.recv()
            except (EOFError, OSError):
                return None
            if msg[0] == "closed":
                return msg[1]

    def _dispatch(self, cmd: str, args: list[Any]) -> None:
        if not self._workers:  # serial mode: run now, report in *_wait
            results: list[Any] = [None] * self.num_envs
            for i, arg in enumerate(args):
                if arg is None:
                    continue
                try:
                    results[i] = self._envs[i].reset(arg) if cmd == "reset" else self._envs[i].step(arg)
                except Exception as e:
                    results[i] = e
            self._serial_results = results
            return
        for wk in self._workers:
            wk.pending = [i for i in wk.env_indices if args[i] is not None]
            if wk.pending:
                try:
                    wk.conn.send((cmd, [(i, args[i]) for i in wk.pending]))
                except (BrokenPipeError, OSError):
                    pass  # the worker is dead; _gather reports it with its exit code

    def _in_flight(self) -> bool:
        return any(wk.pending for wk in self._workers)

    def _gather(self, cmd: str) -> tuple[list[StepResult | None], list[EnvWorkerError]]:
        results: list[StepResult | None] = [None] * self.num_envs
        errors: list[EnvWorkerError] = []
        if not self._workers:
            serial, self._serial_results = self._serial_results, None
            for i, r in enumerate(serial):
                if isinstance(r, Exception):
                    errors.append(
                        EnvWorkerError(
                            f"env {i} (task {self._task_id(i)}) raised in {cmd}: {type(r).__name__}: {r}",
                            env_index=i,
                            task_id=self._task_id(i),
                            remote_traceback="".join(traceback.format_exception(r)),
                        )
                    )
                    errors[-1].__cause__ = r
                else:
                    results[i] = r
            return results, errors
        last_progress = {wk.index: time.monotonic() for wk in self._workers}
        while True:
            busy = [wk for wk in self._workers if wk.pending]
            if not busy:
                break
            ready = wait([wk.conn for wk in busy], timeout=_POLL_SLICE_S)
            for wk in busy:
                if wk.conn in ready:
                    msg = self._recv(wk, last_progress[wk.index])
                    last_progress[wk.index] = time.monotonic()
                    kind, i = msg[0], msg[1]
                    if not wk.pending or i != wk.pending[0]:
                        self._fail(wk, f"protocol error: expected a reply for env {wk.pending[:1]}, got {msg[:2]}")
                    wk.pending.pop(0)
                    if kind == "ok":
                        results[i] = msg[2]
                    else:
                        errors.append(self._env_error(i, wk.index, cmd, msg[2], msg[3]))
                elif wk.proc.poll() is not None and not wk.conn.poll(0):
                    self._fail_dead(wk)
                elif time.monotonic() - last_progress[wk.index] > self.timeout:
                    self._fail_hung(wk)
        return results, errors

    def _recv(self, wk: _Worker, since: float) -> tuple:
        """Receive one message from ``wk`` (waiting at most ``timeout`` from ``since``), or
        raise :class:`EnvWorkerError` if it died or hung."""
        while not wk.conn.poll(_POLL_SLICE_S):
            if wk.proc.poll() is not None and not wk.conn.poll(0):
                self._fail_dead(wk)
            if time.monotonic() - since > self.timeout:
                self._fail_hung(wk)
        try:
            return wk.conn.recv()
        except (EOFError, OSError):
            self._fail_dead(wk)
        except Exception as e:  # a reply that cannot be unpickled here
            self._fail(wk, f"unreadable reply ({type(e).__name__}: {e}); the pool must be closed and re-created.")

    def _current_env(self, wk: _Worker) -> int | None:
        return wk.pending[0] if wk.pending else None

    def _fail(self, wk: _Worker, reason: str, exitcode: int | None = None) -> NoReturn:
        self._raise_broken(f"env worker {wk.index} (pid {wk.proc.pid})", wk.index, self._current_env(wk),
                           wk.env_indices, reason, exitcode)

    def _fail_dead(self, wk: _Worker) -> NoReturn:
        code = self._exitcode(wk)
        self._fail(
            wk,
            f"worker process died ({_describe_exit(code)}). Its stderr above may say why; "
            "the pool must be closed and re-created.",
            exitcode=code,
        )

    def _fail_hung(self, wk: _Worker) -> NoReturn:
        self._fail(
            wk,
            f"no reply for {self.timeout:.1f} s (hung or stopped; raise env.worker_timeout if a "
            "single env call can legitimately take that long). The pool must be closed and re-created.",
        )
