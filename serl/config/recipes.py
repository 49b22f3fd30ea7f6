"""Recipes: find a recipe YAML, merge it with its ``defaults:`` bases and dotted overrides into a
:class:`~serl.config.Config`, and write a config back as YAML.

:func:`parse_config` and :func:`parse_config_yaml` run the structural
:meth:`~serl.config.Config.validate` only; :mod:`serl.configure` adds the registry checks.
Imports nothing from serl but :mod:`serl.errors` and the other :mod:`serl.config` modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from serl.config.run import Config
from serl.errors import ConfigError

#: the recipes shipped with serl: ``serl/recipes/<name>.yaml``
RECIPE_DIR = Path(__file__).parents[1] / "recipes"
#: the recipe used when none is named
DEFAULT_RECIPE = "default"


def recipe_path(recipe: str) -> Path:
    """Resolve a recipe name (``cpu``, ``webshop``) or a YAML path; raises ConfigError if absent."""
    p = Path(recipe)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    cand = RECIPE_DIR / f"{recipe}.yaml"
    if cand.exists():
        return cand
    names = sorted(x.stem for x in RECIPE_DIR.glob("*.yaml"))
    raise ConfigError(f"unknown recipe {recipe!r}: not a YAML file and not one of {names}")


def _load_yaml(p: Path):
    """``OmegaConf.load(p)``; a YAML syntax error becomes a :class:`ConfigError` naming the file
    and line (no traceback)."""
    try:
        return OmegaConf.load(p)
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {p}: {_yaml_error_text(e)}") from None


def _yaml_error_text(e: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: the problem and its line/column."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"YAML syntax error{where}: {problem}"


def _recipe_chain(names: list[str], chain: list[Path], active: tuple[Path, ...] = ()) -> list[Path]:
    """Linearise recipes and their ``defaults:`` bases, bases first, each recipe once.

    ``spear,webshop`` gives ``[cpu, spear, webshop]``: the shared ``cpu`` base is applied once, so
    the second recipe overrides only the keys it sets itself (Hydra's defaults-list rule).
    """
    for name in names:
        p = recipe_path(str(name)).resolve()
        if p in active:
            raise ConfigError(f"recipe defaults form a cycle: {' -> '.join(x.stem for x in active + (p,))}")
        if p in chain:
            continue
        raw = _load_yaml(p)
        bases = list(raw.get("defaults", []) or []) if isinstance(raw, DictConfig) else []
        _recipe_chain(bases, chain, active + (p,))
        chain.append(p)
    return chain


def _load_recipe(recipe: str) -> DictConfig:
    """Merge a recipe, or a comma-separated composition (``spear,webshop``), with its bases."""
    merged = OmegaConf.create({})
    for p in _recipe_chain([r.strip() for r in recipe.split(",") if r.strip()], []):
        raw = _load_yaml(p)
        if isinstance(raw, DictConfig):
            raw.pop("defaults", None)
        merged = OmegaConf.merge(merged, raw)
    return merged


def parse_config(recipe: str | None = DEFAULT_RECIPE, overrides: list[str] | None = None) -> Config:
    """Build a :class:`Config` from a recipe and dotted overrides, and run its structural
    :meth:`Config.validate` (ranges, types, cross-section checks). The names that select an
    implementation are not checked here: :func:`serl.configure.load_config` does both.

    Args:
        recipe: recipe name or YAML path, or several joined by commas (``spear,webshop``: later
            recipes override earlier ones, shared bases are applied once); None = defaults only.
        overrides: ``["actor.lr=1e-5", "env.rollout.n=4"]``.

    Raises:
        ConfigError: unknown key, wrong type, or invalid value; the message names the key.
    """
    schema = OmegaConf.structured(Config)
    try:
        if recipe is not None:
            schema = OmegaConf.merge(schema, _load_recipe(recipe))
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(f"overrides must look like key=value, got {bad}")
            schema = OmegaConf.merge(schema, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        raise ConfigError(f"bad config key {key!r}: {msg}" if key else f"bad config: {msg}") from None
    except yaml.YAMLError as e:  # an override value that is not valid YAML
        raise ConfigError(f"bad override in {overrides}: {_yaml_error_text(e)}") from None
    cfg: Config = OmegaConf.to_object(schema)  # type: ignore[assignment]
    cfg.validate()
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (written to ``<run>/config.yaml``)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def parse_config_yaml(text: str, source: str = "config") -> Config:
    """Inverse of :func:`to_yaml`, with the structural :meth:`Config.validate` only;
    :func:`serl.configure.config_from_yaml` (used by ``--resume``) also checks the registries.

    Raises:
        ConfigError: a YAML syntax error, an unknown key or a bad value, naming ``source``
            (e.g. the run's ``config.yaml``) and the key.
    """
    try:
        schema = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(text))
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: {_yaml_error_text(e)}") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{source}: bad config key {key!r}: {str(e).splitlines()[0]}") from None
    cfg: Config = OmegaConf.to_object(schema)  # type: ignore[assignment]
    cfg.validate()
    return cfg


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config as plain dicts and lists (interpolations resolved)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
