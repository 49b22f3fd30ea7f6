"""The env worker process: the code that runs *inside* one :class:`serl.envs.pool.EnvPool` worker.

A worker is a fresh interpreter started by the parent as
``python -c "from serl.envs.worker import worker_main; worker_main(FD)"`` (``FD``: the child end
of a :func:`multiprocessing.Pipe`, inherited). :func:`worker_main` builds the worker's envs and
:func:`serve` answers the parent's commands until it is told to close or the parent goes away.
This module imports only :mod:`serl.envs.base` (and, through it, the env module named in the
init message); it must never import torch, the parent side of the pool or anything that does.

**Message protocol** (tuples over the pipe, pickled by :class:`multiprocessing.connection.Connection`):

* parent -> worker, once: ``("init", sys_path, spec)``, ``spec`` =
  ``pickle.dumps((env_ref, env_kwargs, env_indices))``; ``sys_path`` is added to the worker's
  ``sys.path`` before ``spec`` is unpickled, so env classes passed by reference resolve.
  Reply: ``("ready", pid)``, or ``("fatal", traceback)`` if the envs could not be built.
* ``("reset" | "step", [(env_index, task_or_action), ...])``: one reply per listed env, in
  order: ``("ok", env_index, StepResult)`` or ``("err", env_index, "Type: message", traceback)``
  (an env that raises does not stop the others).
* ``("info",)`` -> ``("info", {"pid", "torch_imported", "omp_num_threads", "env_indices"})``.
* ``("close",)`` -> ``("closed", traceback_of_the_first_failed_env_close_or_None)``, then exit.

Not here: starting the workers, reading their replies, timeouts and dead-worker detection (all
in the parent, :mod:`serl.envs.pool`), and the shared pool logic (:mod:`serl.envs.pool_base`).
:func:`resolve_env_class` is also used by the serial in-process mode and by
:mod:`serl.envs.ray_pool`'s actors.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from serl.envs.base import get_env_class, load_entry_point


def resolve_env_class(env_ref: str | type) -> type:
    """An env class given as a class, a ``"module:Class"`` entry point or a registered name."""
    if isinstance(env_ref, type):
        return env_ref
    return load_entry_point(env_ref) if ":" in env_ref else get_env_class(env_ref)


def serve(conn: Connection, envs: dict[int, Any]) -> None:
    """Worker loop: answer commands until ``close`` or the parent goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent closed the pipe or died
        cmd = msg[0]
        if cmd == "close":
            first_error = None
            for env in envs.values():
                try:
                    env.close()
                except Exception:  # close the others, then report the first failure
                    first_error = first_error or traceback.format_exc()
            conn.send(("closed", first_error))
            return
        if cmd == "info":
            conn.send(
                (
                    "info",
                    {
                        "pid": os.getpid(),
                        "torch_imported": "torch" in sys.modules,
                        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                        "env_indices": sorted(envs),
                    },
                )
            )
            continue
        # ("reset" | "step", [(env_index, task_or_action), ...]): one reply per env, in order.
        for i, arg in msg[1]:
            try:
                result = envs[i].reset(arg) if cmd == "reset" else envs[i].step(arg)
            except Exception as e:
                conn.send(("err", i, f"{type(e).__name__}: {e}", traceback.format_exc()))
            else:
                conn.send(("ok", i, result))


def worker_main(fd: int) -> None:
    """Entry point of a worker process (see :mod:`serl.envs.pool`). ``fd`` is the inherited
    pipe end. Start-up failures are sent to the parent as ``("fatal", traceback)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    conn = Connection(fd)
    try:
        _, sys_path, spec = conn.recv()
        # Same import path as the parent, so env classes passed by reference resolve here.
        for p in sys_path:
            if p not in sys.path:
                sys.path.append(p)
        env_ref, env_kwargs, env_indices = pickle.loads(spec)
        cls = resolve_env_class(env_ref)
        envs = {i: cls(**env_kwargs) for i in env_indices}
    except (EOFError, OSError):
        return
    except Exception:
        conn.send(("fatal", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    try:
        serve(conn, envs)
    except (BrokenPipeError, EOFError):
        return  # the parent is gone; nothing to report to
