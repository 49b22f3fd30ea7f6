"""Where training and evaluation get their envs and the loop that plays them: :func:`make_pool`,
:func:`list_tasks`, :func:`rollout_loop`, :func:`preflight`.

The one place that turns ``env.*`` into an env pool (worker processes or Ray actors), a task
list and a rollout loop; the env itself, its registry and its tasks are :mod:`serl.envs`, the
loops :mod:`serl.rollout`. The env class names its loop (``rollout_loop``, the seam a new row
layout plugs into: docs/ARCHITECTURE.md), so nothing here branches on the env's name.
"""

from __future__ import annotations

import os
from typing import Any

from serl.config import Config
from serl.envs.base import Task, get_env_class, load_entry_point
from serl.envs.base import list_tasks as env_list_tasks


_PREFLIGHT: dict[str, dict[str, str]] = {}


def make_pool(cfg: Config, num_envs: int):
    """The env pool of ``num_envs`` envs of ``cfg.env.name``, as ``cfg.env.pool`` says: an
    :class:`~serl.envs.pool.EnvPool` (worker processes; ``env.num_workers=0`` = one per CPU
    core) or a :class:`~serl.envs.ray_pool.RayEnvPool` (Ray actors at ``env.ray_address``;
    ``env.num_workers=0`` = one per CPU of the Ray cluster). Raises ImportError (with the install
    command) for ``ray`` without Ray installed. The env's :func:`preflight` runs first (once per
    process and env config)."""
    preflight(cfg)
    if cfg.env.pool == "ray":
        from serl.envs.ray_pool import RayEnvPool

        return RayEnvPool(cfg.env.name, num_envs=num_envs, num_workers=cfg.env.num_workers,
                          env_kwargs=env_kwargs(cfg), timeout=cfg.env.worker_timeout, address=cfg.env.ray_address)
    from serl.envs.pool import EnvPool

    workers = cfg.env.num_workers or (os.cpu_count() or 1)
    workers = max(1, min(workers, num_envs))
    return EnvPool(cfg.env.name, num_envs=num_envs, num_workers=workers, env_kwargs=env_kwargs(cfg),
                   timeout=cfg.env.worker_timeout)


def env_kwargs(cfg: Config) -> dict[str, Any]:
    """Constructor arguments of the ``cfg.env.name`` env (its ``config_kwargs`` hook)."""
    return get_env_class(cfg.env.name).config_kwargs(cfg.env)


def list_tasks(cfg: Config, split: str) -> list[Task]:
    """The tasks of ``split`` of the ``cfg.env.name`` env, restricted to ``env.task_types``
    (:func:`serl.envs.base.list_tasks`)."""
    return env_list_tasks(cfg.env, split)


def rollout_loop(cfg: Config, pool, engine, tokenizer):
    """The rollout loop of ``cfg.env.name`` (its class's ``rollout_loop`` entry point:
    :class:`~serl.rollout.collector.Collector` for step rows, the math env's
    :class:`~serl.rollout.tool_loop.ToolAgentLoop`), built by the loop's ``from_config``."""
    loop_cls = load_entry_point(get_env_class(cfg.env.name).rollout_loop)
    return loop_cls.from_config(cfg, pool, engine, tokenizer)


def preflight(cfg: Config) -> dict[str, str]:
    """The env's start-up checks and notes (its ``preflight`` hook; e.g. the math env's sandbox
    isolation), run once per process and env config (later calls return the first notes).
    Raises what the hook raises (a clear error before any work starts)."""
    key = repr(cfg.env)
    if key not in _PREFLIGHT:
        _PREFLIGHT[key] = get_env_class(cfg.env.name).preflight(cfg.env)
    return _PREFLIGHT[key]
