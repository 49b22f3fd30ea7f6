"""RayEnvPool: the same episodes as the process pool, and the same failure semantics.

One local Ray instance (``ray.init(num_cpus=2)``) is started for the module and shut down after
it. The ALFWorld comparison replays the fixture games' walkthroughs; protocol and failure
details use a tiny env defined here, which the actors import by reference: so this module
imports only light modules at the top (no torch, no TextWorld), which every actor repeats.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from serl.envs.base import EnvError, StepResult, Task
from serl.envs.pool import EnvPool, EnvWorkerError

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'serl[ray]'")

from serl.envs.ray_pool import RayEnvPool  # noqa: E402  (after the skip)


class SlowEchoEnv:
    """A fast fake env: the observation echoes the task / action; ``"raise"`` raises and
    ``"sleep"`` takes 30 s (so a test can kill or stop the actor in the middle of a call)."""

    def __init__(self, tag: str = "", fail_init: bool = False, fail_close: bool = False):
        if fail_init:
            raise RuntimeError("SlowEchoEnv was asked to fail")
        self.tag, self.fail_close, self.task, self.n = tag, fail_close, None, 0

    def reset(self, task: Task) -> StepResult:
        self.task, self.n = task, 0
        return StepResult(observation=f"{self.tag}:{task.task_id}", admissible_actions=["a"], info={"pid": os.getpid()})

    def step(self, action: str) -> StepResult:
        if action == "raise":
            raise ValueError("asked to raise")
        if action == "sleep":
            time.sleep(30)
        self.n += 1
        return StepResult(observation=f"{self.task.task_id}/{action}/{self.n}", admissible_actions=[])

    def close(self) -> None:
        if self.fail_close:
            raise OSError("SlowEchoEnv could not close")


def _tasks(n):
    return [Task("echo", f"t{i}", "echo") for i in range(n)]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def games():
    pytest.importorskip("textworld", reason="alfworld==0.4.2 is not installed")
    from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir

    tasks = AlfWorldEnv.list_tasks("valid_unseen", data_dir=fixture_data_dir())
    a = next(t for t in tasks if t.task_type == "look_at_obj_in_light")
    b = next(t for t in tasks if t.task_type == "pick_and_place_simple")
    return a, b


def _play(pool, tasks, scripts):
    """Reset to ``tasks`` and replay ``scripts`` (shorter ones idle with None); all results by env."""
    got = [[r] for r in pool.reset(tasks)]
    for k in range(max(len(s) for s in scripts)):
        actions = [s[k] if k < len(s) else None for s in scripts]
        for i, (act, r) in enumerate(zip(actions, pool.step(actions))):
            assert (r is None) == (act is None)
            if act is not None:
                got[i].append(r)
    return got


def test_ray_pool_plays_the_same_episodes_as_the_process_pool(games):
    from serl.envs.alfworld import fixture_data_dir, walkthrough

    a, b = games
    tasks = [a, b]
    # different lengths, so env 0 idles (None) while env 1 finishes; env 1 starts with a no-op
    scripts = [walkthrough(a), ["jump around", "inventory"] + walkthrough(b)]
    kwargs = {"data_dir": str(fixture_data_dir())}
    with EnvPool("alfworld", num_envs=2, num_workers=2, env_kwargs=kwargs) as pool:
        expected = _play(pool, tasks, scripts)
    with RayEnvPool("alfworld", num_envs=2, num_workers=0, env_kwargs=kwargs) as pool:
        info = pool.worker_info()
        assert [d["env_indices"] for d in info] == [[0], [1]]  # num_workers=0: one per Ray CPU (2)
        assert not any(d["torch_imported"] for d in info) and all(d["omp_num_threads"] == "1" for d in info)
        assert os.getpid() not in pool.worker_pids and len(set(pool.worker_pids)) == 2
        got = _play(pool, tasks, scripts)
    assert [[(r.observation, r.reward, r.done, r.won) for r in ep] for ep in got] == \
        [[(r.observation, r.reward, r.done, r.won) for r in ep] for ep in expected]
    assert got == expected  # every field, admissible actions and info included
    assert got[0][-1].won and got[0][-1].reward == 10.0 and got[1][-1].done
    assert got[1][1].feedback == "Nothing happens." and not got[1][1].done


def test_protocol_env_errors_and_idle_envs():
    with RayEnvPool(SlowEchoEnv, num_envs=3, num_workers=0, env_kwargs={"tag": "x"}) as pool:
        assert pool.num_workers == 2  # 0 = one actor per CPU of the (2-CPU) Ray instance
        res = pool.reset(_tasks(3))
        assert [r.observation for r in res] == ["x:t0", "x:t1", "x:t2"]
        assert res[0].info["pid"] == res[2].info["pid"] != res[1].info["pid"]  # env i in actor i % 2
        pool.step_async(["a", None, "b"])
        assert [o.observation if o else None for o in pool.step_wait()] == ["t0/a/1", None, "t2/b/1"]
        # an env exception is reported with the remote traceback; the other envs are served
        with pytest.raises(EnvWorkerError, match=r"asked to raise[\s\S]*1 more env\(s\) failed.*envs \[2\]") as ei:
            pool.step(["raise", "a", "raise"])
        assert ei.value.env_index == 0 and ei.value.task_id == "t0" and "ValueError" in ei.value.remote_traceback
        assert pool.step([None, "a", None])[1].observation == "t1/a/2"
        with pytest.raises(ValueError, match="num_envs=3"):
            pool.step(["a"])
        pool.step_async([None] * 3)
        with pytest.raises(EnvError, match="pending"):
            pool.step_async([None] * 3)
        assert pool.step_wait() == [None] * 3
        with pytest.raises(EnvError, match="without a pending"):
            pool.step_wait()


def test_killed_actor_raises_naming_the_task_and_breaks_the_pool():
    pool = RayEnvPool(SlowEchoEnv, num_envs=1, num_workers=1)
    try:
        pool.reset([Task("echo", "game-17/trial_T1/game.tw-pddl", "echo")])
        pool.step_async(["sleep"])
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EnvWorkerError, match="actor died") as ei:
            pool.step_wait()
        assert time.monotonic() - t0 < 20
        err = ei.value
        assert err.env_index == 0 and err.task_id == "game-17/trial_T1/game.tw-pddl" and err.worker == 0
        assert "game-17/trial_T1/game.tw-pddl" in str(err) and "env 0" in str(err)
        with pytest.raises(EnvWorkerError, match="broken"):
            pool.step(["a"])
    finally:
        pool.close()
    pool.close()  # idempotent
    with pytest.raises(EnvError, match="closed"):
        pool.step(["a"])


def test_hung_actor_times_out_and_close_still_works():
    pool = RayEnvPool(SlowEchoEnv, num_envs=2, num_workers=1, timeout=1.0)
    pid = pool.worker_pids[0]
    try:
        pool.reset(_tasks(2))
        os.kill(pid, signal.SIGSTOP)
        pool.step_async(["a", "a"])
        t0 = time.monotonic()
        with pytest.raises(EnvWorkerError, match="no reply") as ei:
            pool.step_wait()
        assert time.monotonic() - t0 < 5
        assert ei.value.env_index == 0 and ei.value.task_id == "t0"
        with pytest.raises(EnvWorkerError, match="broken"):
            pool.worker_info()
    finally:
        pool.close()
        os.kill(pid, signal.SIGKILL)  # ray.kill cannot stop a SIGSTOPped process gracefully
    pool.close()


def test_start_and_close_failures_are_reported():
    with pytest.raises(EnvWorkerError, match="failed to start") as ei:
        RayEnvPool(SlowEchoEnv, num_envs=2, num_workers=2, env_kwargs={"fail_init": True})
    assert "SlowEchoEnv was asked to fail" in ei.value.remote_traceback
    pool = RayEnvPool(SlowEchoEnv, num_envs=1, num_workers=1, env_kwargs={"fail_close": True})
    with pytest.raises(EnvError, match="SlowEchoEnv could not close"):
        pool.close()
    pool.close()  # already closed: no second error
    with pytest.raises(ValueError):
        RayEnvPool(SlowEchoEnv, num_envs=0, num_workers=1)


def test_config_chooses_the_pool(monkeypatch):
    from serl.configure import load_config
    from serl.errors import ConfigError
    from serl.envs.alfworld import fixture_data_dir
    from serl.train.env_pool import make_pool

    cfg = load_config("cpu", ["env.pool=ray", "env.num_workers=1", f"env.data_dir={fixture_data_dir()}"])
    pool = make_pool(cfg, 1)
    try:
        assert isinstance(pool, RayEnvPool) and pool.num_workers == 1
    finally:
        pool.close()
    with pytest.raises(ConfigError, match="env.pool"):
        load_config("cpu", ["env.pool=dask"])
    with pytest.raises(ConfigError, match="env.ray_address"):
        load_config("cpu", ["env.pool=ray", "env.ray_address=' '"])
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'serl\[ray\]'"):
        load_config("cpu", ["env.pool=ray"])
