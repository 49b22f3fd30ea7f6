"""serl.hindsight: import direction (rendering is a leaf, nothing imports serl.config / train /
rollout at run time) and SERL config errors raised by load_config, before any model loads."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serl.configure import load_config
from serl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "serl" / "hindsight"


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter with this checkout first on the path; its stdout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _new_serl_modules(after: str, before: str = "serl.trajectory") -> set[str]:
    """The serl modules that importing ``after`` loads beyond those ``before`` already loaded."""
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({before!r})\n"
        "pre = {m for m in sys.modules if m == 'serl' or m.startswith('serl.')}\n"
        f"importlib.import_module({after!r})\n"
        "post = {m for m in sys.modules if m == 'serl' or m.startswith('serl.')}\n"
        "print(json.dumps(sorted(post - pre)))\n"
    )
    return set(json.loads(_fresh(code).strip().splitlines()[-1]))


def test_rendering_imports_nothing_from_serl_but_trajectory():
    assert _new_serl_modules("serl.hindsight.rendering") == {"serl.hindsight", "serl.hindsight.rendering"}
    tree = ast.parse((PKG / "rendering.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.startswith("serl")} == {"serl.trajectory"}


def test_teacher_message_path_is_light():
    # the teacher (and the teacher log) build their prompt without the registry, judge or algos
    new = _new_serl_modules("serl.models.teacher", before="serl.agent.chat")
    assert not any(m.startswith(("serl.algos", "serl.config", "serl.hindsight.builder", "serl.hindsight.judge"))
                   for m in new), new


def _runtime_imports(path: Path) -> set[str]:
    """Modules imported by ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
            for b in node.body for n in ast.walk(b)}
    out = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return out


@pytest.mark.parametrize("path", sorted(PKG.glob("*.py")), ids=lambda p: p.name)
def test_package_never_imports_config_train_or_rollout_at_run_time(path):
    bad = {m for m in _runtime_imports(path) if m.startswith(("serl.config", "serl.train", "serl.rollout"))}
    assert not bad, f"{path.name} imports {bad} at run time"


def test_judge_client_does_not_import_the_builder():
    assert not any(m.startswith("serl.hindsight.builder") for m in _runtime_imports(PKG / "judge.py"))
    assert "serl.hindsight.builder" not in _new_serl_modules("serl.hindsight.judge")


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algorithm.serl.sampling_mode=judge_all"], "algorithm.serl.sampling_mode"),
        (["algorithm.serl.trajectory_format=xml"], "algorithm.serl.trajectory_format"),
        (["algorithm.serl.success_source=replay"], "algorithm.serl.success_source"),
        (["algorithm.serl.anchor_enable_similarity=true", "algorithm.serl.anchor_similarity_thresh=1.0"],
         "algorithm.serl.anchor_similarity_thresh"),
        (["algorithm.serl.sampling_mode=judge_current_traj", "algorithm.serl.judge_api_url=localhost:8000"],
         "algorithm.serl.judge_api_url"),
        (["algorithm.serl.teacher_log_every_n_steps=0"], "algorithm.serl.teacher_log_every_n_steps"),
    ],
)
def test_bad_serl_keys_fail_at_load_config(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config("cpu", overrides)
    assert str(e.value).startswith(key + ": ")


def test_bad_sampling_mode_fails_before_any_model_loads():
    code = (
        "import json, sys\n"
        "from serl.configure import load_config\n"
        "from serl.errors import ConfigError\n"
        "try:\n"
        "    load_config('cpu', ['algorithm.serl.sampling_mode=legacy_thing'])\n"
        "    msg = None\n"
        "except ConfigError as e:\n"
        "    msg = str(e)\n"
        "print(json.dumps([msg, sorted(m for m in sys.modules if m.startswith(('serl.models', 'serl.train', 'transformers')))]))\n"
    )
    msg, loaded = json.loads(_fresh(code).strip().splitlines()[-1])
    assert msg is not None and msg.startswith("algorithm.serl.sampling_mode: unknown sampling_mode 'legacy_thing'")
    assert loaded == []


def test_serl_alias_names_pass_validation():
    cfg = load_config("cpu", ["algorithm.serl.sampling_mode=successful_trajectory_env_feedback",
                              "algorithm.serl.trajectory_format=obs_action"])
    assert cfg.algorithm.serl.sampling_mode == "successful_trajectory_env_feedback"
