"""Where training and evaluation get their envs: :func:`make_pool`, :func:`list_tasks`.

The one place that turns ``env.*`` into an env pool (worker processes or Ray actors) and a task
list; the env itself, its registry and its tasks are :mod:`serl.envs`.
"""

from __future__ import annotations

import os
from typing import Any

from serl.config import Config
from serl.envs.base import Task, get_env_class
from serl.envs.base import list_tasks as env_list_tasks


def make_pool(cfg: Config, num_envs: int):
    """The env pool of ``num_envs`` envs of ``cfg.env.name``, as ``cfg.env.pool`` says: an
    :class:`~serl.envs.pool.EnvPool` (worker processes; ``env.num_workers=0`` = one per CPU
    core) or a :class:`~serl.envs.ray_pool.RayEnvPool` (Ray actors at ``env.ray_address``;
    ``env.num_workers=0`` = one per CPU of the Ray cluster). Raises ImportError (with the install
    command) for ``ray`` without Ray installed."""
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
