"""WebShop's config options checked when a config is loaded, without loading WebShop.

Registered as the ``webshop`` env's config check (``serl.envs.base.ENV_CONFIG_CHECKS``), so
:func:`serl.envs.base.check_config` runs :func:`check_config` when ``env.name=webshop``, before
any model or product file loads. A leaf: it imports nothing from serl but :mod:`serl.errors`
(and :mod:`serl.envs.webshop`'s ``__init__`` imports its env lazily), so checking a config
never imports the catalog or the search index. The env checks the rest of its options when it
is built (``serl.envs.webshop.env``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from serl.errors import ConfigError

if TYPE_CHECKING:
    from serl.config import EnvConfig

#: observation modes: WebShop's ``text`` (``[SEP]``-joined, verl-agent's) and ``text_rich``
OBSERVATION_MODES = ("text", "text_rich")


def check_config(env_cfg: "EnvConfig") -> None:
    """Check ``env.webshop.observation_mode`` (one of :data:`OBSERVATION_MODES`) and
    ``env.webshop.task_prices`` (an existing JSON file, a mapping, or null); the env checks the
    other ``env.webshop`` options when it is built.

    Raises:
        ConfigError: naming ``env.webshop.observation_mode`` or ``env.webshop.task_prices``.
    """
    ws = env_cfg.webshop
    mode = ws.get("observation_mode", "text")
    if mode not in OBSERVATION_MODES:
        raise ConfigError(f"env.webshop.observation_mode: must be one of {list(OBSERVATION_MODES)}, got {mode!r}")
    prices = ws.get("task_prices")
    if isinstance(prices, str):
        if not Path(prices).expanduser().is_file():
            raise ConfigError(f"env.webshop.task_prices: no such JSON file: {prices!r}")
    elif not (prices is None or hasattr(prices, "items")):
        raise ConfigError(f"env.webshop.task_prices: must be a JSON file path or a mapping of task ids to "
                          f"{{price_upper, price}}, got {prices!r}")
