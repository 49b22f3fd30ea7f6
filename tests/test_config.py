"""Config resolution: recipes, their composition, overrides and validation errors."""

from __future__ import annotations

import pytest

from serl.config import ConfigError, load_config


def test_default_recipe_is_serl_on_grpo_alfworld():
    c = load_config()
    assert c.env.name == "alfworld" and c.algorithm.adv_estimator == "grpo" and c.algorithm.serl.enable
    assert c.algorithm.serl.sampling_mode == "immediate_feedback"


def test_composed_recipes_keep_both_sets_of_keys():
    c = load_config("spear,webshop")
    assert c.env.name == "webshop" and c.env.max_steps == 15 and c.data.max_prompt_length == 4096
    assert c.actor.policy_loss == "clip_cov" and c.algorithm.spear.enable_trajectory_replay
    # the shared cpu base is applied once, before both
    assert load_config("webshop,spear").actor.policy_loss == "clip_cov"
    g = load_config("gigpo,webshop", ["env.rollout.n=3"])
    assert g.algorithm.adv_estimator == "gigpo" and g.env.name == "webshop" and g.env.rollout.n == 3


def test_recipe_cycle_is_reported(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"defaults: [{b}]\nseed: 1\n")
    b.write_text(f"defaults: [{a}]\nseed: 2\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(a))


@pytest.mark.parametrize("override, key", [
    ("actor.lrr=1", "actor.lrr"),
    ("actor.lr=abc", "actor.lr"),
    ("algorithm.serl.sampling_mode=foo", "algorithm.serl.sampling_mode"),
    ("algorithm.adv_estimator=ppo2", "algorithm.adv_estimator"),
    ("rollout.engine=vllm", "rollout.engine"),
])
def test_errors_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("cpu", [override])

