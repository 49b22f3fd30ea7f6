"""Config resolution: recipes, their composition, overrides and validation errors."""

from __future__ import annotations

import re

import pytest

from serl.configure import load_config
from serl.errors import ConfigError


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



# ---- each section validates itself, naming the full dotted key -------------------------------


@pytest.mark.parametrize("override, key", [
    ("model.dtype=float16", "model.dtype"),
    ("model.train_dtype=fp8", "model.train_dtype"),
    ("env.rollout.n=0", "env.rollout.n"),
    ("env.max_steps=0", "env.max_steps"),
    ("env.history_length=-1", "env.history_length"),
    ("env.num_workers=-1", "env.num_workers"),
    ("env.worker_timeout=0", "env.worker_timeout"),
    ("data.train_batch_size=0", "data.train_batch_size"),
    ("data.max_prompt_length=8", "data.max_prompt_length"),
    ("data.max_response_length=0", "data.max_response_length"),
    ("rollout.temperature=0", "rollout.temperature"),
    ("rollout.micro_batch_size=0", "rollout.micro_batch_size"),
    ("rollout.rollout_filter_ratio=1.5", "rollout.rollout_filter_ratio"),
    ("rollout.rollout_filter_type=max", "rollout.rollout_filter_type"),
    ("actor.ppo_epochs=0", "actor.ppo_epochs"),
    ("actor.ppo_mini_batch_size=0", "actor.ppo_mini_batch_size"),
    ("actor.ppo_micro_batch_size=0", "actor.ppo_micro_batch_size"),
    ("actor.clip_ratio_c=1.0", "actor.clip_ratio_c"),
    ("actor.policy_loss=ppo3", "actor.policy_loss"),
    ("actor.loss_agg_mode=sum", "actor.loss_agg_mode"),
    ("actor.kl_loss_type=k9", "actor.kl_loss_type"),
    ("actor.kl_loss_coef=-1", "actor.kl_loss_coef"),
    ("actor.clip_cov_ratio=0", "actor.clip_cov_ratio"),
    ("actor.clip_cov_lb=9", "actor.clip_cov_lb"),
    ("actor.loss_scale_factor=0", "actor.loss_scale_factor"),
    ("algorithm.gamma=1.5", "algorithm.gamma"),
    ("algorithm.max_toolcall_steps=0", "algorithm.max_toolcall_steps"),
    ("algorithm.gigpo.mode=median", "algorithm.gigpo.mode"),
    ("algorithm.gigpo.similarity_thresh=1.0", "algorithm.gigpo.similarity_thresh"),
    ("algorithm.gigpo.similarity_backend=levenshtein", "algorithm.gigpo.similarity_backend"),
    ("algorithm.spear.trajectory_buffer_size=0", "algorithm.spear.trajectory_buffer_size"),
    ("algorithm.spear.baseline_buffer_size=0", "algorithm.spear.baseline_buffer_size"),
    ("algorithm.spear.trajectory_tolerate_steps=-1", "algorithm.spear.trajectory_tolerate_steps"),
    ("algorithm.spear.replay_loss_coef=-0.1", "algorithm.spear.replay_loss_coef"),
    ("algorithm.serl.weight_clip=1.0", "algorithm.serl.weight_clip"),
    ("trainer.device=tpu", "trainer.device"),
    ("trainer.logger=[jsonl,mlflow]", "trainer.logger"),
    ("trainer.trace_freq=-1", "trainer.trace_freq"),
    ("trainer.trace_max_rows=0", "trainer.trace_max_rows"),
    ("trainer.trace_max_bytes=10", "trainer.trace_max_bytes"),
    ("trainer.max_checkpoints_to_keep=-1", "trainer.max_checkpoints_to_keep"),
    ("trainer.test_freq=-1", "trainer.test_freq"),
    ("trainer.num_threads=-1", "trainer.num_threads"),
])
def test_each_section_rejects_bad_values(override, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ":"):
        load_config(None, [override])


def test_section_validate_methods_run_alone():
    from serl.algos import advantages, spear
    from serl.config import ActorConfig, AlgorithmConfig, Config, EnvConfig, GiGPOConfig, SpearConfig, TrainerConfig
    from serl.configure import check_config

    for section in (ActorConfig(), EnvConfig(), GiGPOConfig(), SpearConfig(), TrainerConfig()):
        section.validate()  # the defaults are valid
    Config().validate()
    check_config(Config())
    with pytest.raises(ConfigError, match=r"^actor\.clip_ratio:"):
        ActorConfig(clip_ratio=0.0).validate()
    # names are checked by the registry that owns them
    with pytest.raises(ConfigError, match=r"^algorithm\.gigpo\.mode:"):
        advantages.check_config(AlgorithmConfig(gigpo=GiGPOConfig(mode="x")))
    with pytest.raises(ConfigError, match=r"^algorithm\.spear\.trajectory_staleness_reference:"):
        spear.check_config(AlgorithmConfig(spear=SpearConfig(trajectory_staleness_reference="oldest")))
    cfg = Config()
    cfg.algorithm.spear.trajectory_buffer_size = 0  # a nested section is reached from the top
    with pytest.raises(ConfigError, match=r"^algorithm\.spear\.trajectory_buffer_size:"):
        cfg.validate()


# ---- issue 10's rejections ----------------------------------------------------------------------


@pytest.mark.parametrize("override, key", [
    ("actor.clip_ratio=0", "actor.clip_ratio"),
    ("actor.clip_ratio=-0.2", "actor.clip_ratio"),
    ("actor.clip_ratio_low=-0.1", "actor.clip_ratio_low"),
    ("actor.clip_ratio_high=-0.01", "actor.clip_ratio_high"),
    ("actor.lr=0", "actor.lr"),
    ("actor.lr=-1e-6", "actor.lr"),
    ("actor.lr=inf", "actor.lr"),
    ("actor.lr=nan", "actor.lr"),
    ("trainer.save_freq=-1", "trainer.save_freq"),
    ("trainer.total_training_steps=-1", "trainer.total_training_steps"),
    ("trainer.run_name=/tmp/run", "trainer.run_name"),
    ("trainer.run_name=../run", "trainer.run_name"),
    ("trainer.run_name=..", "trainer.run_name"),
    ("trainer.run_name=a..b", "trainer.run_name"),
    ("trainer.run_name=a/b", "trainer.run_name"),
    (r"trainer.run_name=a\b", "trainer.run_name"),
    (r"trainer.run_name=C:\runs", "trainer.run_name"),
    ("trainer.run_name=.", "trainer.run_name"),
    ("seed=-1", "seed"),
    ("seed=4294967296", "seed"),
    ("env.eval_num_tasks=-2", "env.eval_num_tasks"),
    ("rollout.temperature=inf", "rollout.temperature"),
    ("rollout.val_temperature=0", "rollout.val_temperature"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("rollout.top_k=-2", "rollout.top_k"),
    ("actor.clip_ratio=inf", "actor.clip_ratio"),
    ("actor.clip_ratio_high=nan", "actor.clip_ratio_high"),
    ("actor.weight_decay=-0.1", "actor.weight_decay"),
    ("actor.grad_clip=0", "actor.grad_clip"),
    ("actor.grad_clip=inf", "actor.grad_clip"),
    ("actor.entropy_coeff=nan", "actor.entropy_coeff"),
    ("actor.invalid_action_penalty_coef=-1", "actor.invalid_action_penalty_coef"),
    ("actor.kl_loss_coef=inf", "actor.kl_loss_coef"),
    ("algorithm.serl.teacher_sync_interval=-1", "algorithm.serl.teacher_sync_interval"),
    ("algorithm.serl.max_reprompt_len=-1", "algorithm.serl.max_reprompt_len"),
    ("algorithm.serl.success_reward_threshold=nan", "algorithm.serl.success_reward_threshold"),
    ("algorithm.gigpo.step_advantage_w=inf", "algorithm.gigpo.step_advantage_w"),
    ("algorithm.spear.replay_loss_coef=inf", "algorithm.spear.replay_loss_coef"),
    ("algorithm.spear.trajectory_score_threshold=nan", "algorithm.spear.trajectory_score_threshold"),
    ("sft.lr=inf", "sft.lr"),
])
def test_unsafe_values_are_rejected(override, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ":"):
        load_config(None, [override])


def test_edge_values_that_stay_valid():
    c = load_config(None, ["actor.clip_ratio_low=0", "actor.clip_ratio_high=0.28", "trainer.save_freq=0",
                           "trainer.total_training_steps=0", "trainer.run_name=my-run_1.v2"])
    assert c.actor.clip_ratio_low == 0.0 and c.trainer.run_name == "my-run_1.v2"
    assert load_config(None, ["trainer.run_name=null"]).trainer.run_name is None


def test_judge_ranges_are_checked_in_judge_modes():
    base = ["algorithm.serl.sampling_mode=judge_current_traj"]
    for override, key in (("algorithm.serl.judge_retry_max_tokens=0", "judge_retry_max_tokens"),
                          ("algorithm.serl.judge_temperature=-1", "judge_temperature")):
        with pytest.raises(ConfigError, match=r"^algorithm\.serl\." + key + ":"):
            load_config(None, base + [override])


def test_greedy_evaluation_accepts_a_zero_val_temperature():
    c = load_config(None, ["rollout.val_do_sample=false", "rollout.val_temperature=0", "rollout.top_k=0"])
    assert c.rollout.val_temperature == 0.0


def test_recipe_yaml_syntax_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  lr: 1e-5\n  clip_ratio: [0.2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: YAML syntax error at line \d+"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="YAML syntax error"):
        load_config(None, ["actor.lr=[1"])


def test_run_config_yaml_syntax_error_names_the_file(tmp_path):
    from serl.configure import load_run_config

    (tmp_path / "config.yaml").write_text("actor: {lr: 1e-5\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: YAML syntax error"):
        load_run_config(tmp_path)
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        load_run_config(tmp_path, ["actor.lr=1"])


def test_config_from_yaml_validates_too():
    from serl.config import to_yaml
    from serl.configure import config_from_yaml

    text = to_yaml(load_config())
    assert config_from_yaml(text).actor.lr == load_config().actor.lr
    with pytest.raises(ConfigError, match=r"^actor\.lr:"):
        bad = re.sub(r"(?m)^(actor:\n(?:  .*\n)*?  lr: ).*$", r"\1.inf", text, count=1)  # actor.lr, not sft.lr
        assert bad != text
        config_from_yaml(bad)


# ---- env.name against the registry ------------------------------------------------------------


def test_unknown_env_name_fails_at_load_config_with_the_valid_names():
    with pytest.raises(ConfigError, match=r"^env\.name: unknown env 'nope'; valid: \['alfworld', 'math', 'webshop'\]"):
        load_config(None, ["env.name=nope"])


def test_env_name_is_checked_without_importing_the_env_modules():
    import subprocess
    import sys

    # WebShop's own config check (serl.envs.webshop.options) is a leaf; the env, catalog and index stay unloaded
    code = ("import sys; from serl.configure import load_config; load_config('webshop'); "
            "bad = [m for m in ('serl.envs.alfworld', 'serl.envs.webshop.env', 'serl.envs.webshop.catalog', "
            "'serl.envs.webshop.search') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
