"""The env registry (name -> "module:Class", imported lazily) and the env hooks the trainer uses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from serl.configure import load_config
from serl.envs import base
from serl.envs.base import ENV_ENTRY_POINTS, BaseTextEnv, Task, get_env_class, register_env
from serl.errors import ConfigError, EnvError
from serl.trajectory import Step, Trajectory

USER_ENV = textwrap.dedent('''
    from serl.envs.base import BaseTextEnv, StepResult, Task


    class CounterEnv(BaseTextEnv):
        """A user's env: counts its steps; the task id is the goal count."""

        name = "counter"
        prompt_builder = "user_counter_prompts:build"

        def __init__(self, max_steps=3, data_dir=None, start=0):
            self.max_steps, self.start, self.n, self.goal = max_steps, start, 0, 0

        @classmethod
        def list_tasks(cls, split, data_dir=None, **kwargs):
            return [Task("counter", str(k), "count") for k in (1, 2)]

        def reset(self, task):
            self.n, self.goal = self.start, int(task.task_id)
            return StepResult(observation=f"at {self.n}", admissible_actions=["inc"], task="count")

        def step(self, action):
            self.n += action == "inc"
            won = self.n >= self.goal
            return StepResult(observation=f"at {self.n}", admissible_actions=["inc"], reward=10.0 * won,
                              done=won, won=won)

        def close(self):
            pass
''')

USER_PROMPTS = textwrap.dedent('''
    def build(task_text, observation, admissible_actions, history, step_count, history_length):
        return f"{task_text}|{observation}|{step_count}"
''')


@pytest.fixture
def user_env(tmp_path, monkeypatch):
    """A user env module on sys.path, registered as ``counter`` by entry point string."""
    (tmp_path / "user_counter_env.py").write_text(USER_ENV)
    (tmp_path / "user_counter_prompts.py").write_text(USER_PROMPTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(base, "ENV_ENTRY_POINTS", dict(ENV_ENTRY_POINTS))
    monkeypatch.setattr(base, "ENV_CONFIG_CHECKS", dict(base.ENV_CONFIG_CHECKS))
    monkeypatch.setattr(base, "_LOADED", {})
    register_env("counter", "user_counter_env:CounterEnv")
    return tmp_path


def test_builtin_entry_points_resolve_lazily():
    assert ENV_ENTRY_POINTS["alfworld"] == "serl.envs.alfworld:AlfWorldEnv"
    assert ENV_ENTRY_POINTS["webshop"] == "serl.envs.webshop.env:WebShopEnv"
    from serl.envs.alfworld import AlfWorldEnv
    from serl.envs.webshop import WebShopEnv

    assert get_env_class("alfworld") is AlfWorldEnv and get_env_class("webshop") is WebShopEnv
    assert issubclass(AlfWorldEnv, BaseTextEnv) and issubclass(WebShopEnv, BaseTextEnv)


def test_base_is_a_leaf():
    code = ("import sys, serl.envs.base; "
            "print(sorted(m for m in sys.modules if m.startswith('serl.') and m not in ('serl.envs.base', 'serl.errors', 'serl.envs')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_algos_never_import_config_at_run_time():
    """The registries read config sections duck-typed (config types only under TYPE_CHECKING), and
    none imports serl.configure, which imports them all to check a config."""
    mods = ["serl.algos.advantages", "serl.algos.filters", "serl.algos.spear", "serl.algos.losses",
            "serl.rollout.engine", "serl.hindsight.modes", "serl.envs.base", "serl.envs.webshop.options"]
    code = (f"import sys; [__import__(m) for m in {mods!r}]; "
            "print([m for m in ('serl.config', 'serl.configure') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ConfigError, match=r"unknown env 'nope'; valid: \['alfworld', 'math', 'webshop'\]"):
        get_env_class("nope")
    from serl.agent.prompts import get_prompt_builder

    with pytest.raises(ConfigError, match="valid"):
        get_prompt_builder("nope")


def test_bad_entry_points(monkeypatch):
    monkeypatch.setattr(base, "ENV_ENTRY_POINTS", dict(ENV_ENTRY_POINTS))
    monkeypatch.setattr(base, "_LOADED", {})
    with pytest.raises(ConfigError, match="module:ClassName"):
        register_env("x", "no_colon_here")
    with pytest.raises(ConfigError, match="non-empty"):
        register_env("", "a:B")
    register_env("missing", "serl_no_such_module_xyz:Env")
    with pytest.raises(EnvError, match="serl_no_such_module_xyz"):
        get_env_class("missing")
    register_env("notaclass", "serl.envs.base:ENV_ENTRY_POINTS")
    with pytest.raises(EnvError, match="not a class"):
        get_env_class("notaclass")


def test_register_env_as_decorator_and_with_a_class(monkeypatch):
    monkeypatch.setattr(base, "ENV_ENTRY_POINTS", dict(ENV_ENTRY_POINTS))
    monkeypatch.setattr(base, "_LOADED", {})

    @register_env("deco")
    class Deco(BaseTextEnv):
        pass

    assert base.ENV_ENTRY_POINTS["deco"] == f"{__name__}:test_register_env_as_decorator_and_with_a_class.<locals>.Deco"
    from serl.envs.alfworld import AlfWorldEnv

    register_env("alf2", AlfWorldEnv)
    assert get_env_class("alf2") is AlfWorldEnv


def test_user_env_by_entry_point_string(user_env):
    cfg = load_config(None, ["env.name=counter", "env.max_steps=4"])  # the config accepts the new name
    cls = get_env_class("counter")
    assert cls.__name__ == "CounterEnv" and cls.__module__ == "user_counter_env"

    from serl.agent.prompts import get_prompt_builder
    from serl.train.env_pool import env_kwargs, list_tasks

    assert env_kwargs(cfg) == {"max_steps": 4, "data_dir": None}
    assert [t.task_id for t in list_tasks(cfg, "train")] == ["1", "2"]
    assert get_prompt_builder("counter")("count", "at 0", ["inc"], [], 0, 2) == "count|at 0|0"
    env = cls.from_config(cfg.env)
    assert env.max_steps == 4 and env.reset(Task("counter", "1", "count")).observation == "at 0"
    assert cls.episode_metrics([]) == {}


def test_user_env_registers_its_own_config_check(user_env):
    """An env's options are checked by the env (``register_env(..., config_check=...)``), only when
    that env is configured: adding an env never edits serl.config."""
    (user_env / "user_counter_options.py").write_text(
        "from serl.errors import ConfigError\n\n\n"
        "def check(env_cfg):\n"
        "    if env_cfg.max_steps > 10:\n"
        "        raise ConfigError(f'env.max_steps: the counter counts to 10 at most, got {env_cfg.max_steps}')\n")
    register_env("counter", "user_counter_env:CounterEnv", config_check="user_counter_options:check")
    assert base.ENV_CONFIG_CHECKS["counter"] == "user_counter_options:check"
    assert load_config(None, ["env.name=counter", "env.max_steps=4"]).env.max_steps == 4
    with pytest.raises(ConfigError, match=r"^env\.max_steps: the counter counts to 10 at most, got 11"):
        load_config(None, ["env.name=counter", "env.max_steps=11"])
    assert load_config(None, ["env.max_steps=11"]).env.name == "alfworld"  # not the configured env: not run
    register_env("counter", "user_counter_env:CounterEnv")  # re-registered without a check: none
    assert "counter" not in base.ENV_CONFIG_CHECKS and load_config(None, ["env.name=counter", "env.max_steps=11"])
    with pytest.raises(ConfigError, match="module:"):
        register_env("counter", "user_counter_env:CounterEnv", config_check="no_colon_here")


def test_user_env_runs_in_pool_workers(user_env):
    """A worker is a fresh interpreter: the registered name reaches it as its entry point."""
    from serl.envs.pool import EnvPool

    with EnvPool("counter", num_envs=2, num_workers=2, env_kwargs={"start": 1}) as pool:
        res = pool.reset([Task("counter", "2", "count"), Task("counter", "1", "count")])
        assert [r.observation for r in res] == ["at 1", "at 1"]
        out = pool.step(["inc", "inc"])
        assert [o.won for o in out] == [True, True]
    with pytest.raises(ConfigError, match="valid"):
        EnvPool("nope", num_envs=1, num_workers=1)


def test_webshop_hooks():
    from serl.envs.webshop import WebShopEnv

    cfg = load_config("webshop", ["env.webshop={human_goals: true, seed: 3}"])
    assert WebShopEnv.config_kwargs(cfg.env) == {"max_steps": 15, "data_dir": None, "human_goals": True, "seed": 3}
    from serl.agent.prompts import get_prompt_builder
    from serl.agent.prompts.webshop import build_prompt

    assert get_prompt_builder("webshop") is build_prompt

    def traj(*scores):
        steps = [Step(i, "o", "p", [1], [2], "r", [1], "a", True, info={"task_score": s}) for i, s in enumerate(scores)]
        return Trajectory("u", "t", Task("webshop", "0", "webshop"), steps=steps)

    m = WebShopEnv.episode_metrics([traj(0.0, 0.5), traj(1.0), Trajectory("u", "e", Task("webshop", "1", "webshop"))])
    assert m == {"webshop_task_score": pytest.approx((0.5 + 1.0 + 0.0) / 3)}
    from serl.envs.alfworld import AlfWorldEnv
    from serl.envs.base import BaseTextEnv

    assert BaseTextEnv.episode_metrics([traj(1.0)]) == {}  # the default: none
    assert set(AlfWorldEnv.episode_metrics([traj(1.0)])) == {  # one lost episode (tests/test_alfworld_env.py)
        "alfworld_loop_rate", "alfworld_repeat_rate", "alfworld_receptacles_visited"}


def test_task_types_restrict_the_listed_tasks():
    from serl.configure import load_config
    from serl.envs.base import list_tasks
    from serl.errors import EnvError

    everything = list_tasks(load_config("cpu", ["env.task_types=[]"]).env, "train")
    assert len({t.task_type for t in everything}) == 6
    cfg = load_config("cpu", ["env.task_types=[pick_and_place_simple,look_at_obj_in_light]"])
    some = list_tasks(cfg.env, "train")
    assert {t.task_type for t in some} == {"pick_and_place_simple", "look_at_obj_in_light"}
    assert some == [t for t in everything if t.task_type in cfg.env.task_types]  # order kept
    with pytest.raises(EnvError, match="no task of type \\['no_such_type'\\]"):
        list_tasks(load_config("cpu", ["env.task_types=[no_such_type]"]).env, "train")


def test_task_types_must_be_names():
    from serl.configure import load_config
    from serl.errors import ConfigError

    with pytest.raises(ConfigError, match="env.task_types"):
        load_config("cpu", ["env.task_types=['']"])


def test_register_env_row_layout_is_read_without_importing_the_env(monkeypatch):
    monkeypatch.setattr(base, "ENV_ENTRY_POINTS", dict(base.ENV_ENTRY_POINTS))
    monkeypatch.setattr(base, "ENV_ROW_LAYOUTS", dict(base.ENV_ROW_LAYOUTS))
    assert base.row_layout("math") == "trajectory" and base.row_layout("alfworld") == "step"
    register_env("toolgame", "serl_no_such_module_xyz:Env", row_layout="trajectory")
    assert base.row_layout("toolgame") == "trajectory"  # the module was never imported
    register_env("toolgame", "serl_no_such_module_xyz:Env")
    assert base.row_layout("toolgame") == "step"
    with pytest.raises(ConfigError, match="row_layout must be one of"):
        register_env("bad", "a:B", row_layout="turn")
