"""EnvPool: parallel results equal serial ones, failures are reported and never hang.

The ALFWorld tests reset only a few games (about 0.85 s each); protocol details use a tiny
in-module env (``EchoEnv``) that workers import by reference.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir, walkthrough
from serl.envs.base import EnvError, StepResult, Task
from serl.envs.pool import EnvPool, EnvWorkerError


class EchoEnv:
    """A fast fake env: the observation echoes the task / action; ``"raise"`` raises."""

    name = "echo"
    max_steps = 5

    def __init__(self, tag: str = "", fail_init: bool = False, fail_close: bool = False):
        if fail_init:
            raise RuntimeError("EchoEnv was asked to fail")
        self.tag = tag
        self.fail_close = fail_close
        self.task = None
        self.n = 0

    def reset(self, task: Task) -> StepResult:
        self.task, self.n = task, 0
        return StepResult(observation=f"{self.tag}:{task.task_id}", admissible_actions=["a", "b"], info={"pid": os.getpid()})

    def step(self, action: str) -> StepResult:
        if action == "raise":
            raise ValueError("asked to raise")
        self.n += 1
        return StepResult(observation=f"{self.task.task_id}/{action}/{self.n}", admissible_actions=[], done=self.n >= self.max_steps)

    def close(self) -> None:
        if self.fail_close:
            raise OSError("EchoEnv could not close")


def _echo_tasks(n):
    return [Task("echo", f"t{i}", "echo") for i in range(n)]


@pytest.fixture(scope="module")
def games():
    pytest.importorskip("textworld", reason="alfworld==0.4.2 is not installed")
    tasks = AlfWorldEnv.list_tasks("valid_unseen", data_dir=fixture_data_dir())
    a = next(t for t in tasks if t.task_type == "look_at_obj_in_light")
    b = next(t for t in tasks if t.task_type == "pick_and_place_simple")
    return a, b


def _serial_reference(tasks, scripts):
    env = AlfWorldEnv(data_dir=fixture_data_dir())
    out = []
    try:
        for task, script in zip(tasks, scripts):
            out.append([env.reset(task)] + [env.step(a) for a in script])
    finally:
        env.close()
    return out


def test_pool_matches_serial_stepping(games):
    torch = pytest.importorskip("torch")  # the parent has torch loaded, as the trainer does
    assert torch is not None
    a, b = games
    tasks = [a, b]
    # different lengths, so env 0 idles (None) while env 1 finishes; env 1 starts with a no-op
    scripts = [walkthrough(a), ["jump around", "inventory"] + walkthrough(b)]
    expected = _serial_reference(tasks, scripts)
    with EnvPool("alfworld", num_envs=2, num_workers=2, env_kwargs={"data_dir": str(fixture_data_dir())}) as pool:
        info = pool.worker_info()
        assert [d["env_indices"] for d in info] == [[0], [1]]
        assert not any(d["torch_imported"] for d in info)
        assert all(d["omp_num_threads"] == "1" for d in info)
        got = [[r] for r in pool.reset(tasks)]
        for k in range(max(len(s) for s in scripts)):
            actions = [s[k] if k < len(s) else None for s in scripts]
            results = pool.step(actions)
            for i, (act, r) in enumerate(zip(actions, results)):
                if act is None:
                    assert r is None
                else:
                    got[i].append(r)
    assert got == expected
    assert len(got[0]) == len(scripts[0]) + 1 and len(got[1]) == len(scripts[1]) + 1
    assert got[0][-1].won and got[0][-1].reward == 10.0
    assert got[1][-1].won and got[1][-1].done
    assert got[1][1].feedback == "Nothing happens." and not got[1][1].done


def test_killed_worker_raises_naming_the_game_and_never_hangs(games):
    a, _ = games
    pool = EnvPool("alfworld", num_envs=1, num_workers=1, env_kwargs={"data_dir": str(fixture_data_dir())})
    try:
        pool.reset_async([a])  # a fresh worker spends ~2 s importing TextWorld and loading
        time.sleep(0.3)
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EnvWorkerError) as ei:
            pool.reset_wait()
        assert time.monotonic() - t0 < 10
        err = ei.value
        assert isinstance(err, EnvError)
        assert err.env_index == 0 and err.task_id == a.task_id and err.exitcode == -signal.SIGKILL
        assert a.task_id in str(err) and "env 0" in str(err) and "SIGKILL" in str(err)
        with pytest.raises(EnvWorkerError, match="broken"):
            pool.step(["look"])
    finally:
        pool.close()
    pool.close()  # idempotent
    with pytest.raises(EnvError, match="closed"):
        pool.step(["look"])


def test_hung_worker_times_out_and_close_still_works():
    pool = EnvPool(EchoEnv, num_envs=2, num_workers=1, timeout=1.0)
    pid = pool.worker_pids[0]
    try:
        os.kill(pid, signal.SIGSTOP)
        pool.reset_async(_echo_tasks(2))
        t0 = time.monotonic()
        with pytest.raises(EnvWorkerError, match="no reply") as ei:
            pool.reset_wait()
        assert time.monotonic() - t0 < 5
        assert ei.value.env_index == 0 and ei.value.task_id == "t0"
    finally:
        pool.close()  # kills the stopped worker
    assert pool._workers[0].proc.poll() is not None


def test_corrupt_game_in_a_worker_is_reported_and_pool_stays_usable(games, tmp_path):
    a, _ = games
    bad = tmp_path / "json_2.1.1" / "valid_unseen" / "pick_and_place_simple-X-None-Y-1" / "trial_T1" / "game.tw-pddl"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"pddl_domain": "x", "grammar": "y", "pddl_problem": "z"}))
    bad_task = Task("alfworld", str(bad), "pick_and_place_simple")
    with EnvPool("alfworld", num_envs=2, num_workers=1, env_kwargs={"data_dir": str(fixture_data_dir())}) as pool:
        with pytest.raises(EnvWorkerError) as ei:
            pool.reset([bad_task, a])
        err = ei.value
        assert err.env_index == 0 and err.task_id == str(bad) and str(bad) in str(err)
        assert "Traceback" in err.remote_traceback and "EnvError" in err.remote_traceback
        # env 1 was still reset in the same call; the pool is in sync and usable
        out = pool.step([None, "look"])
        assert out[0] is None and out[1].info["gamefile"] == a.task_id


def test_echo_pool_protocol_and_idle_envs():
    with EnvPool(EchoEnv, num_envs=5, num_workers=2, env_kwargs={"tag": "x"}) as pool:
        assert len(pool.worker_pids) == 2
        res = pool.reset(_echo_tasks(5))
        assert [r.observation for r in res] == [f"x:t{i}" for i in range(5)]
        pids = {r.info["pid"] for r in res}
        assert len(pids) == 2 and os.getpid() not in pids
        assert res[0].info["pid"] == res[2].info["pid"] == res[4].info["pid"]  # env i in worker i % 2
        pool.step_async(["a", None, "b", None, None])
        out = pool.step_wait()
        assert [o.observation if o else None for o in out] == ["t0/a/1", None, "t2/b/1", None, None]
        # a partial reset: None leaves the env alone
        res = pool.reset([None, Task("echo", "new", "echo"), None, None, None])
        assert res[0] is None and res[1].observation == "x:new"
        assert pool.step(["a", "a", None, None, None])[0].observation == "t0/a/2"
        # an env exception is reported with the remote traceback; the other envs are served
        with pytest.raises(EnvWorkerError, match="asked to raise") as ei:
            pool.step(["raise", "a", None, None, None])
        assert ei.value.env_index == 0 and ei.value.task_id == "t0" and "ValueError" in ei.value.remote_traceback
        assert pool.step([None, "a", None, None, None])[1].observation == "new/a/3"
        with pytest.raises(EnvWorkerError, match=r"1 more env\(s\) failed in the same call: envs \[3\]"):
            pool.step([None, "raise", None, "raise", None])
        with pytest.raises(ValueError, match="num_envs=5"):
            pool.step(["a"])
        pool.step_async([None] * 5)
        with pytest.raises(EnvError, match="pending"):
            pool.step_async([None] * 5)
        assert pool.step_wait() == [None] * 5
        with pytest.raises(EnvError, match="without a pending"):
            pool.step_wait()


def test_interrupted_wait_breaks_the_pool(monkeypatch):
    import serl.envs.pool as pool_mod

    with EnvPool(EchoEnv, num_envs=2, num_workers=1) as pool:
        pool.reset(_echo_tasks(2))

        def interrupted(*a, **k):
            raise KeyboardInterrupt

        monkeypatch.setattr(pool_mod, "wait", interrupted)
        pool.step_async(["a", "b"])
        with pytest.raises(KeyboardInterrupt):
            pool.step_wait()
        monkeypatch.undo()
        # the unread replies would be taken as the next call's answers: refuse instead
        with pytest.raises(EnvWorkerError, match="interrupted"):
            pool.step(["a", "b"])


def test_serial_mode_same_api():
    with EnvPool(EchoEnv, num_envs=3, num_workers=0, env_kwargs={"tag": "s"}) as pool:
        assert pool.worker_pids == [] and pool.worker_info() == []
        res = pool.reset(_echo_tasks(3))
        assert [r.observation for r in res] == ["s:t0", "s:t1", "s:t2"]
        assert {r.info["pid"] for r in res} == {os.getpid()}
        assert [o.observation if o else None for o in pool.step([None, "a", "b"])] == [None, "t1/a/1", "t2/b/1"]
        with pytest.raises(EnvWorkerError, match="asked to raise") as ei:
            pool.step(["raise", None, None])
        assert ei.value.env_index == 0 and isinstance(ei.value.__cause__, ValueError)


def test_worker_start_failure_is_reported():
    t0 = time.monotonic()
    with pytest.raises(EnvWorkerError, match="failed to start") as ei:
        EnvPool(EchoEnv, num_envs=2, num_workers=2, env_kwargs={"fail_init": True})
    assert "EchoEnv was asked to fail" in str(ei.value)
    assert time.monotonic() - t0 < 30
    with pytest.raises(ValueError):
        EnvPool(EchoEnv, num_envs=0, num_workers=1)
    with pytest.raises(ValueError):
        EnvPool(EchoEnv, num_envs=1, num_workers=-1)


def test_workers_capped_at_num_envs():
    with EnvPool(EchoEnv, num_envs=1, num_workers=4) as pool:
        assert pool.num_workers == 1 and len(pool.worker_pids) == 1
        assert pool.reset(_echo_tasks(1))[0].observation == ":t0"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_env_close_failure_is_reported_after_stopping_everything(num_workers):
    pool = EnvPool(EchoEnv, num_envs=2, num_workers=num_workers, env_kwargs={"fail_close": True})
    with pytest.raises(EnvError, match="EchoEnv could not close"):
        pool.close()
    assert all(wk.proc.poll() is not None for wk in pool._workers)
    pool.close()  # already closed: no second error
