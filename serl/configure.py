"""Load a config and check it against the registries.

:mod:`serl.config` holds the config dataclasses and their structural checks (ranges, types,
cross-section rules) and imports nothing from serl; the names that select an implementation are
owned by the registries that implement them, each with a ``check_config``:

* :func:`serl.envs.base.check_config`: ``env.name``, then the env's own options (``env.webshop.*``);
* :func:`serl.rollout.engine.check_config`: ``rollout.engine`` (and vLLM installed);
* :func:`serl.rollout.action_selection.check_config`: ``rollout.action_selection`` (``score``
  not on vLLM); and (here) ``score`` only for an env with one row per step;
* :func:`serl.algos.filters.check_config`: ``rollout.rollout_filter_type``;
* :func:`serl.algos.losses.check_config`: ``actor.policy_loss``, ``loss_agg_mode``, ``kl_loss_type``;
* :func:`serl.algos.advantages.check_config`: ``algorithm.adv_estimator``, ``algorithm.gigpo.mode``,
  ``algorithm.gigpo.similarity_backend``; and (here) the estimator against the env's
  ``row_layout``: GiGPO needs one row per env step;
* :func:`serl.algos.spear.check_config`: ``algorithm.use_toolcall_reward``,
  ``algorithm.spear.trajectory_staleness_reference``;
* :func:`serl.hindsight.modes.check_config`: ``algorithm.serl.sampling_mode``,
  ``trajectory_format``, ``success_source`` and a judge mode's ``judge_*`` keys;
* :func:`serl.algos.dynamic_sampling.check_config`: ``algorithm.filter_groups.metric``.

This module asks them all: :func:`load_config` and :func:`config_from_yaml` return a config that
passed both kinds of checks, before any model loads. It imports the registries; no registry
imports it. Adding an estimator, a loss, a mode or an env registers it with its registry and
edits neither this module nor :mod:`serl.config`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from serl.algos import advantages, dynamic_sampling, filters, losses, spear
from serl.config import DEFAULT_RECIPE, Config, parse_config, parse_config_yaml
from serl.envs import base as env_base
from serl.errors import ConfigError
from serl.hindsight import modes
from serl.rollout import action_selection, engine

__all__ = ["check_config", "config_from_yaml", "load_config", "load_run_config"]


def _check_registries(cfg: Config) -> None:
    """The registries' checks, in :meth:`Config.validate`'s section order (model, env, data,
    rollout, actor, algorithm: estimator, gigpo, spear, serl, filter_groups; trainer, sft), so the first error
    reported is the first in that order among the registry-owned names."""
    env_base.check_config(cfg.env)
    engine.check_config(cfg.rollout)
    action_selection.check_config(cfg.rollout.action_selection, cfg.rollout.engine)
    filters.check_config(cfg.rollout)
    losses.check_config(cfg.actor)
    advantages.check_config(cfg.algorithm)
    _check_row_layout(cfg)
    spear.check_config(cfg.algorithm)
    modes.check_config(cfg.algorithm.serl)
    dynamic_sampling.check_config(cfg.algorithm.filter_groups.metric)


def _check_row_layout(cfg: Config) -> None:
    """A step-row estimator (:data:`serl.algos.advantages.STEP_ROW_ESTIMATORS`: GiGPO) needs an env
    whose rows are one per env step (:func:`serl.envs.base.row_layout`, read without importing the
    env), and so does a SERL sampling mode outside :data:`serl.hindsight.modes.TRAJECTORY_ROW_MODES`;
    ``env.prompt_layout=conversation`` needs a step-row env with a turn builder (an env that plays
    one row per trajectory, math, is one conversation already and ignores the key); raises
    :class:`ConfigError` otherwise."""
    layout = env_base.row_layout(cfg.env.name)
    if cfg.algorithm.adv_estimator in advantages.STEP_ROW_ESTIMATORS and layout != "step":
        raise ConfigError(f"algorithm.adv_estimator: {cfg.algorithm.adv_estimator} needs one row per env step (its "
                          f"step groups are anchor states), but env {cfg.env.name!r} trains one row per trajectory; "
                          "use grpo, drgrpo, rloo or reinforce_plus_plus_baseline")
    if cfg.env.prompt_layout == "conversation" and layout == "step" and not getattr(
            env_base.get_env_class(cfg.env.name), "turn_builder", ""):
        raise ConfigError(f"env.prompt_layout: env {cfg.env.name!r} has no conversation layout (its class names no "
                          "turn_builder); use env.prompt_layout=step")
    if cfg.rollout.action_selection == "score" and layout != "step":
        raise ConfigError(f"rollout.action_selection: score chooses among an env step's admissible commands, but env "
                          f"{cfg.env.name!r} plays one row per trajectory (its actions are free code); use generate")
    sc = cfg.algorithm.serl
    if sc.enable and layout != "step" and modes.canonical_mode(sc.sampling_mode) not in modes.TRAJECTORY_ROW_MODES:
        raise ConfigError(f"algorithm.serl.sampling_mode: {sc.sampling_mode} needs one row per env step; env "
                          f"{cfg.env.name!r} trains one row per trajectory, where SERL's teacher can see "
                          f"{list(modes.TRAJECTORY_ROW_MODES)}")


def check_config(cfg: Config) -> None:
    """Check ``cfg`` completely: its structural :meth:`Config.validate` (every section, then the
    cross-section checks), then every registry's check of the names it owns (see the module
    docstring), in a fixed order.

    Raises:
        ConfigError: the first invalid value, naming its full dotted key (``actor.policy_loss``,
            ``env.webshop.observation_mode`` ...).
    """
    cfg.validate()
    _check_registries(cfg)


def load_config(recipe: str | None = DEFAULT_RECIPE, overrides: list[str] | None = None) -> Config:
    """Build a checked :class:`~serl.config.Config` from a recipe and dotted overrides
    (:func:`serl.config.parse_config`, then the registries' checks).

    Args:
        recipe: recipe name or YAML path, or several joined by commas (``spear,webshop``: later
            recipes override earlier ones, shared bases are applied once); None = defaults only.
        overrides: ``["actor.lr=1e-5", "env.rollout.n=4"]``.

    Raises:
        ConfigError: unknown recipe or key, wrong type, a YAML syntax error, an invalid value or
            an unknown registry name; the message names the key.
    """
    cfg = parse_config(recipe, overrides)  # runs cfg.validate()
    _check_registries(cfg)
    return cfg


def config_from_yaml(text: str, source: str = "config") -> Config:
    """Inverse of :func:`serl.config.to_yaml` (used by ``--resume``), checked like
    :func:`load_config`.

    Raises:
        ConfigError: a YAML syntax error, an unknown key, a bad value (naming ``source``, e.g.
            the run's ``config.yaml``, and the key) or an unknown registry name (naming the key).
    """
    cfg = parse_config_yaml(text, source)  # runs cfg.validate()
    _check_registries(cfg)
    return cfg


def load_run_config(run_dir: Path, overrides: list[str] | None = None) -> Config:
    """The config saved in ``<run_dir>/config.yaml`` with optional dotted overrides, checked.

    Raises:
        FileNotFoundError: ``run_dir`` has no ``config.yaml``.
        ConfigError: the file or an override is bad (YAML syntax, unknown key, bad value), naming
            the file.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    p = Path(run_dir) / "config.yaml"
    if not p.exists():
        raise FileNotFoundError(f"{p} not found: is {run_dir} a serl run folder?")
    text = p.read_text()
    if overrides:
        try:
            merged = OmegaConf.merge(OmegaConf.create(text), OmegaConf.from_dotlist(list(overrides)))
        except (yaml.YAMLError, OmegaConfBaseException) as e:
            raise ConfigError(f"{p} with overrides {list(overrides)}: {str(e).splitlines()[0]}") from None
        text = OmegaConf.to_yaml(merged)
    return config_from_yaml(text, source=str(p))
