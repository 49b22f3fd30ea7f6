"""RayEnvPool: the env pool on Ray actors, so env workers can run on other machines.

``RayEnvPool`` has :class:`serl.envs.pool.EnvPool`'s interface and error semantics (``reset`` /
``step``, ``*_async`` + ``*_wait``, ``worker_info``, ``close``, a broken pool after a dead or
hung worker, :class:`EnvWorkerError` naming the env and its task). The envs live in Ray actors
instead of local subprocesses: ``num_workers`` actors, env ``i`` in actor ``i % num_workers`` as
in ``EnvPool``; ``num_workers=0`` gives one actor per CPU of the Ray cluster (at most one per
env, then the layout of verl-agent, which wraps each env in a ``ray.remote`` worker (``langfengQ/verl-agent@574dd5b:
agent_system/environments/env_package/alfworld/envs.py``, used by
``agent_system/environments/env_manager.py``). Each actor asks Ray for 1 CPU, so Ray places the
actors on the cluster's nodes by their free CPUs.

**Connecting.** The first pool calls ``ray.init(address=address)`` unless Ray is already
initialised in this process (then the existing connection is used and ``address`` is ignored).
``address=None`` is Ray's default: the cluster in ``$RAY_ADDRESS`` if set, else a Ray instance
already running on this machine, else a new local one. ``"auto"`` requires a running cluster;
``"ray://host:10001"`` connects through Ray Client. Ray stays initialised after ``close()``
(later pools reuse it; Ray shuts it down when the process exits).

**On a cluster**, every node that runs env actors needs serl, the env's dependencies and the env
data at the same path (``env.data_dir``), since the actors build the envs there.

**Failures.** Every env call is one actor task (an actor serves its envs in order). A task whose
actor died (``ray.exceptions.RayActorError``: the process was killed, its node was lost) or
that gives no reply for ``timeout`` seconds raises :class:`EnvWorkerError` and breaks the pool;
an exception raised by an env is caught in the actor and reported with its remote traceback,
and the pool stays usable. ``close()`` asks the actors to close their envs, then ``ray.kill``\\ s
them; actors of a pool that is never closed die with their handles. Ray's ``exitcode`` is not
known: :attr:`EnvWorkerError.exitcode` is ``None``.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, NoReturn

from serl.envs.base import StepResult
from serl.envs.pool_base import _CLOSE_GRACE_S, _POLL_SLICE_S, BaseEnvPool
from serl.envs.worker import resolve_env_class
from serl.errors import EnvError, EnvWorkerError

#: logical CPUs each env actor asks Ray for
ACTOR_NUM_CPUS = 1.0
#: the least time actors get to be placed and started (a fresh Ray worker process takes seconds)
_START_MIN_S = 60.0

_INSTALL_HINT = "env.pool=ray needs Ray, which is not installed: pip install 'serl[ray]' (or pip install 'ray>=2.9')"


def import_ray():
    """The ``ray`` module. Raises :class:`ImportError` with the install command if Ray is missing."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(_INSTALL_HINT) from e
    return ray


class _EnvActor:
    """The body of one Ray actor: the envs ``env_indices`` of one pool (wrapped with
    ``ray.remote`` by :class:`RayEnvPool`; nothing here imports ray)."""

    def __init__(self) -> None:
        self.envs: dict[int, Any] = {}

    def init(self, sys_path: list[str], spec: bytes) -> tuple:
        """Build the envs; ``("ready", pid, host)`` or ``("fatal", traceback)``. The spec is
        unpickled after the parent's ``sys.path`` is added, so env classes passed by reference
        (e.g. defined in a test module) resolve."""
        try:
            for p in sys_path:
                if p not in sys.path:
                    sys.path.append(p)
            env_ref, env_kwargs, env_indices = pickle.loads(spec)
            cls = resolve_env_class(env_ref)
            self.envs = {i: cls(**env_kwargs) for i in env_indices}
        except Exception:
            return ("fatal", traceback.format_exc())
        return ("ready", os.getpid(), socket.gethostname())

    def call(self, cmd: str, i: int, arg: Any) -> tuple:
        """``reset`` / ``step`` env ``i``: ``("ok", StepResult)`` or ``("err", message, traceback)``."""
        try:
            env = self.envs[i]
            return ("ok", env.reset(arg) if cmd == "reset" else env.step(arg))
        except Exception as e:
            return ("err", f"{type(e).__name__}: {e}", traceback.format_exc())

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "torch_imported": "torch" in sys.modules,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "env_indices": sorted(self.envs),
        }

    def close(self) -> str | None:
        """Close every env; the traceback of the first failure, or None."""
        first_error = None
        for env in self.envs.values():
            try:
                env.close()
            except Exception:  # close the others, then report the first failure
                first_error = first_error or traceback.format_exc()
        self.envs = {}
        return first_error


@dataclass
class _Actor:
    index: int
    handle: Any
    env_indices: list[int]
    pid: int | None = None
    host: str | None = None
    #: (env index, object ref) of the running call, in the order the actor serves them
    pending: list[tuple[int, Any]] = field(default_factory=list)


def ensure_ray(address: str | None = None):
    """``ray.init(address=address)`` unless Ray is initialised in this process; returns ``ray``.

    Raises:
        ImportError: Ray is not installed (the message gives ``pip install 'serl[ray]'``).
        EnvError: Ray could not start or connect (the message names ``address``).
    """
    ray = import_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address, configure_logging=False)
        except Exception as e:
            where = address or os.environ.get("RAY_ADDRESS") or "a local Ray instance"
            raise EnvError(f"could not start or connect to Ray at {where!r} (env.ray_address): "
                           f"{type(e).__name__}: {e}") from e
    return ray


class RayEnvPool(BaseEnvPool):
    """``num_envs`` environments of one kind in Ray actors (see the module docstring).

    Args:
        env_name, num_envs, env_kwargs, timeout: as :class:`serl.envs.pool.EnvPool`;
            the start-up is bounded by ``max(timeout, 60)`` seconds (an actor that Ray cannot
            place, e.g. for lack of free CPUs, fails then).
        num_workers: Ray actors (capped at ``num_envs``); env ``i`` lives in actor
            ``i % num_workers``. ``0`` = one actor per CPU of the Ray cluster, at most one per
            env (verl-agent's layout); there is no serial mode.
        address: Ray address for ``ray.init`` if Ray is not initialised yet (``None`` = Ray's
            default: ``$RAY_ADDRESS``, else a running local instance, else a new local one).

    Raises:
        ImportError: Ray is not installed.
        ValueError, ConfigError: as :class:`serl.envs.pool.EnvPool`.
        EnvError: Ray could not start or connect.
        EnvWorkerError: an actor failed to start, build its envs, or be placed in time.
    """

    def __init__(self, env_name: str | type, num_envs: int, num_workers: int,
                 env_kwargs: dict[str, Any] | None = None, timeout: float = 300.0,
                 address: str | None = None):
        super().__init__(env_name, num_envs, num_workers, env_kwargs, timeout)
        self._actors: list[_Actor] = []
        self._ray = ensure_ray(address)
        if self.num_workers == 0:
            cpus = int(self._ray.cluster_resources().get("CPU", 1) // ACTOR_NUM_CPUS)
            self.num_workers = max(1, min(self.num_envs, cpus))
        try:
            self._start_actors()
        except BaseException:
            self.close()
            raise

    # -- start-up ------------------------------------------------------------------------
    def _start_actors(self) -> None:
        ray = self._ray
        remote_cls = ray.remote(num_cpus=ACTOR_NUM_CPUS, max_restarts=0)(_EnvActor)
        for w in range(self.num_workers):
            indices = list(range(w, self.num_envs, self.num_workers))
            self._actors.append(_Actor(w, remote_cls.remote(), indices))
        refs = {}
        for a in self._actors:
            spec = pickle.dumps((self._env_ref(), self.env_kwargs, a.env_indices))
            refs[a.index] = a.handle.init.remote(list(sys.path), spec)
        start_s = max(self.timeout, _START_MIN_S)
        deadline = time.monotonic() + start_s
        for a in self._actors:
            ready, _ = ray.wait([refs[a.index]], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise EnvWorkerError(
                    f"env actor {a.index} did not start within {start_s:.0f} s (each env actor asks Ray "
                    f"for {ACTOR_NUM_CPUS:g} CPU; free: {ray.available_resources().get('CPU', 0):g}).",
                    worker=a.index,
                )
            msg = self._get(a, refs[a.index], starting=True)
            if msg[0] != "ready":
                raise EnvWorkerError(
                    f"env actor {a.index} (envs {a.env_indices}) failed to start {self.env_name!r} envs with "
                    f"kwargs {self.env_kwargs}.\nRemote traceback:\n{msg[1]}",
                    worker=a.index,
                    remote_traceback=msg[1],
                )
            a.pid, a.host = msg[1], msg[2]

    def _get(self, a: _Actor, ref: Any, starting: bool = False) -> tuple:
        """``ray.get(ref)``; a dead actor or a Ray failure raises :class:`EnvWorkerError`."""
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayError as e:
            if starting:
                raise EnvWorkerError(f"env actor {a.index} died during start-up: {_first_line(e)}",
                                     worker=a.index) from e
            reason = "Ray actor died" if isinstance(e, self._ray.exceptions.RayActorError) else "Ray call failed"
            self._fail(a, f"{reason} ({_first_line(e)}). The pool must be closed and re-created.")

    # -- public API ----------------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the actor processes, each on its own node (:meth:`worker_info` gives ``host``)."""
        return [a.pid for a in self._actors if a.pid is not None]

    # -- transport -----------------------------------------------------------------------
    def _info(self) -> list[dict[str, Any]]:
        out = []
        for a in self._actors:
            ref = a.handle.info.remote()
            ready, _ = self._ray.wait([ref], timeout=self.timeout)
            if not ready:
                self._fail_hung(a)
            out.append(self._get(a, ref))
        return out

    def _dispatch(self, cmd: str, args: list[Any]) -> None:
        for a in self._actors:
            a.pending = [(i, a.handle.call.remote(cmd, i, args[i])) for i in a.env_indices if args[i] is not None]

    def _in_flight(self) -> bool:
        return any(a.pending for a in self._actors)

    def _gather(self, cmd: str) -> tuple[list[StepResult | None], list[EnvWorkerError]]:
        results: list[StepResult | None] = [None] * self.num_envs
        errors: list[EnvWorkerError] = []
        last_progress = {a.index: time.monotonic() for a in self._actors}
        while True:
            busy = [a for a in self._actors if a.pending]
            if not busy:
                return results, errors
            refs = [ref for a in busy for _, ref in a.pending]
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=_POLL_SLICE_S)
            ready_set = set(ready)
            for a in busy:
                while a.pending and a.pending[0][1] in ready_set:
                    i, ref = a.pending[0]
                    msg = self._get(a, ref)
                    a.pending.pop(0)
                    last_progress[a.index] = time.monotonic()
                    if msg[0] == "ok":
                        results[i] = msg[1]
                    else:
                        errors.append(self._env_error(i, a.index, cmd, msg[1], msg[2]))
                if a.pending and time.monotonic() - last_progress[a.index] > self.timeout:
                    self._fail_hung(a)

    def _shutdown(self) -> None:
        if not self._actors:
            return
        ray = self._ray
        close_failures = []
        if self._broken is None:
            refs = {a.index: a.handle.close.remote() for a in self._actors}
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=_CLOSE_GRACE_S)
            for a in self._actors:
                if refs[a.index] in ready:
                    try:
                        tb = ray.get(refs[a.index])
                    except ray.exceptions.RayError:
                        tb = None  # already dead: nothing to close
                    if tb:
                        close_failures.append((a.index, tb))
        for a in self._actors:
            a.pending = []
            ray.kill(a.handle, no_restart=True)  # also fine for an actor that is already dead
        if close_failures:
            w, tb = close_failures[0]
            raise EnvError(f"closing the envs of env actor {w} failed (all actors are stopped):\n{tb}")

    # -- failures ------------------------------------------------------------------------
    def _fail(self, a: _Actor, reason: str) -> NoReturn:
        i = a.pending[0][0] if a.pending else None
        self._raise_broken(f"env actor {a.index} (pid {a.pid} on {a.host})", a.index, i, a.env_indices, reason)

    def _fail_hung(self, a: _Actor) -> NoReturn:
        self._fail(
            a,
            f"no reply for {self.timeout:.1f} s (hung, stopped or its node unreachable; raise "
            "env.worker_timeout if a single env call can legitimately take that long). "
            "The pool must be closed and re-created.",
        )


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
