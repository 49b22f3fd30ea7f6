"""The one config object of a serl run: documented dataclasses, YAML recipes, dotted overrides.

Keys follow verl / verl-agent and the SERL/SPEAR recipes so that a user of the originals can
switch (``env.rollout.n``, ``data.train_batch_size``, ``actor.ppo_mini_batch_size``,
``algorithm.adv_estimator``, ``algorithm.serl.sampling_mode`` ...). verl's
``actor_rollout_ref.actor.*`` is shortened to ``actor.*`` and ``actor_rollout_ref.rollout.*`` to
``rollout.*``; SERL's ``actor_rollout_ref.actor.serl.*`` lives at ``algorithm.serl.*``.

Resolution order: dataclass defaults < recipe YAML (``serl/recipes/<name>.yaml`` or a path)
< dotted command-line overrides (``actor.lr=1e-5``). An unknown key or a value of the wrong type
raises :class:`ConfigError` naming the key.

Each section validates itself (one ``validate()`` per section dataclass, as verl's worker
configs do): ranges, types, finiteness; :meth:`Config.validate` runs them all plus the checks
that span sections. Names that select an implementation (``algorithm.adv_estimator``,
``actor.policy_loss``, ``env.name``, ``rollout.engine``, ``algorithm.serl.sampling_mode`` ...) are
not listed here: the registry that owns each name checks it (``check_config`` of
:mod:`serl.algos.advantages`, :mod:`serl.algos.losses`, :mod:`serl.algos.filters`,
:mod:`serl.algos.spear`, :mod:`serl.rollout.engine`, :mod:`serl.hindsight.modes`,
:mod:`serl.envs.base`), and :mod:`serl.configure` (:func:`~serl.configure.load_config`,
:func:`~serl.configure.config_from_yaml`) runs both before returning, i.e. before any model
loads. Adding an estimator, a loss, a mode or an env never edits this package.

This package is a leaf: it imports nothing from serl but :mod:`serl.errors`, so every module
may name its config types. Modules:

* :mod:`~serl.config.model_env`: ``model``, ``env``, ``data``, ``rollout``;
* :mod:`~serl.config.algorithm`: ``actor``, ``algorithm`` (``gigpo``, ``spear``, ``serl``, ``filter_groups``);
* :mod:`~serl.config.run`: ``trainer``, ``sft`` and the top-level :class:`Config`;
* :mod:`~serl.config.recipes`: recipe files, YAML in and out.
"""

from serl.config.algorithm import (
    ActorConfig,
    AlgorithmConfig,
    FilterGroupsConfig,
    GiGPOConfig,
    SerlConfig,
    SpearConfig,
)
from serl.config.model_env import (
    DTYPES,
    ENV_POOLS,
    DataConfig,
    EnvConfig,
    EnvRolloutConfig,
    ModelConfig,
    ModelLoraConfig,
    RolloutConfig,
    SandboxConfig,
)
from serl.config.recipes import (
    DEFAULT_RECIPE,
    RECIPE_DIR,
    config_to_dict,
    parse_config,
    parse_config_yaml,
    recipe_path,
    to_yaml,
)
from serl.config.run import DEVICES, LOGGERS, STRATEGIES, Config, SFTConfig, TrainerConfig
from serl.errors import ConfigError

__all__ = [
    "DEFAULT_RECIPE", "DEVICES", "DTYPES", "ENV_POOLS", "LOGGERS", "RECIPE_DIR", "STRATEGIES",
    "ActorConfig", "AlgorithmConfig", "Config", "ConfigError", "DataConfig", "EnvConfig", "EnvRolloutConfig",
    "FilterGroupsConfig",
    "GiGPOConfig", "ModelConfig", "ModelLoraConfig", "RolloutConfig", "SandboxConfig", "SFTConfig", "SerlConfig", "SpearConfig",
    "TrainerConfig", "config_to_dict", "parse_config", "parse_config_yaml", "recipe_path", "to_yaml",
]
