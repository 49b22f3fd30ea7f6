"""WebShop's config options checked when a config is loaded, without loading WebShop.

Registered as the ``webshop`` env's config check (``serl.envs.base.ENV_CONFIG_CHECKS``), so
:func:`serl.envs.base.check_config` runs :func:`check_config` when ``env.name=webshop``, before
any model or product file loads. A leaf: it imports nothing from serl but :mod:`serl.errors`
(and :mod:`serl.envs.webshop`'s ``__init__`` imports its env lazily), so checking a config
never imports the catalog or the search index. The env checks the rest of its options when it
is built (``serl.envs.webshop.env``): the ASINs of ``product_prices`` against its catalogue and
the task ids against its goals.

:func:`read_task_prices` parses and checks ``env.webshop.task_prices`` (the form is in its
docstring); :func:`serl.envs.webshop.goals.load_task_prices` builds the env's prices from it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from serl.errors import ConfigError, SerlError

if TYPE_CHECKING:
    from serl.config import EnvConfig

#: observation modes: WebShop's ``text`` (``[SEP]``-joined, verl-agent's) and ``text_rich``
OBSERVATION_MODES = ("text", "text_rich")
#: the keys of one ``env.webshop.task_prices`` entry
TASK_PRICE_KEYS = ("price_upper", "price", "product_prices")
#: WebShop skips every product whose ASIN is longer (``engine.load_products``), so no longer key can name one
MAX_ASIN_LENGTH = 10


def check_config(env_cfg: "EnvConfig") -> None:
    """Check ``env.webshop.observation_mode`` (one of :data:`OBSERVATION_MODES`) and
    ``env.webshop.task_prices`` (null, or a JSON file or mapping of the form
    :func:`read_task_prices` accepts); the env checks the other ``env.webshop`` options, and the
    task ids and ASINs of ``task_prices``, when it is built.

    Raises:
        ConfigError: naming ``env.webshop.observation_mode`` or ``env.webshop.task_prices`` (with
            the task id and, for ``product_prices``, the ASIN).
    """
    ws = env_cfg.webshop
    mode = ws.get("observation_mode", "text")
    if mode not in OBSERVATION_MODES:
        raise ConfigError(f"env.webshop.observation_mode: must be one of {list(OBSERVATION_MODES)}, got {mode!r}")
    prices = ws.get("task_prices")
    if isinstance(prices, str) and not Path(prices).expanduser().is_file():
        raise ConfigError(f"env.webshop.task_prices: no such JSON file: {prices!r}")
    if isinstance(prices, (str, os.PathLike)) or hasattr(prices, "items"):
        read_task_prices(prices, ConfigError)
    elif prices is not None:
        raise ConfigError(f"env.webshop.task_prices: must be a JSON file path or a mapping of task ids to "
                          f"{{price_upper, price, product_prices}}, got {prices!r}")


def _dollars(v: Any, where: str, error: type[SerlError], positive: bool = False) -> float:
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise error(f"{where} must be a finite number {'> 0' if positive else '>= 0'} (dollars), got {v!r}")
    return float(v)


def read_task_prices(spec: Union[str, os.PathLike, dict, None],
                     error: type[SerlError] = ConfigError) -> dict[str, dict[str, Any]]:
    """Parse and check ``env.webshop.task_prices``: explicit per-task budgets and hidden prices.

    ``spec`` is a JSON file path (``~`` expanded) or a mapping keyed by task id (``"12"`` = synthetic goal 12,
    ``"h3"`` = human goal 3); each value is an object with at least one of

    * ``price_upper``: the budget in dollars (finite, >= 0);
    * ``price``: the target product's hidden price in dollars (finite, >= 0);
    * ``product_prices``: ``{asin: dollars}``, the hidden price of any product (the target
      included) in this task, each finite and > 0; ASINs as WebShop writes them (upper case,
      at most :data:`MAX_ASIN_LENGTH` characters), e.g.
      ``{"10": {"price_upper": 48.0, "product_prices": {"B08LKKSL8F": 47.5, "B09Q67H373": 5.55}}}``.

    Whether the task ids and ASINs exist is checked by the env when it is built (it needs the
    catalogue).

    Returns:
        ``{task_id: {"price_upper": float | None, "price": float | None, "product_prices":
        {asin: float}}}``, task ids as strings.

    Raises:
        SerlError: ``error`` (:class:`ConfigError` by default) on an unreadable file, bad JSON, a
            value that is not such a mapping, an unknown key, a bad number, naming the task id and the ASIN.
    """
    if spec is None:
        return {}
    if isinstance(spec, (str, os.PathLike)):
        try:
            with open(Path(spec).expanduser(), encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise error(f"env.webshop.task_prices: cannot read {str(spec)!r}: {e.strerror or e}") from None
        except ValueError as e:
            raise error(f"env.webshop.task_prices: {str(spec)!r} is not valid JSON: {e}") from None
    else:
        data = spec
    if not hasattr(data, "items"):
        raise error(f"env.webshop.task_prices must map task ids to {{price_upper, price, product_prices}}, "
                    f"got {type(data).__name__}")
    out = {}
    for tid, entry in data.items():
        where = f"env.webshop.task_prices[{str(tid)!r}]"
        if not hasattr(entry, "items") or not entry or set(entry) - set(TASK_PRICE_KEYS):
            raise error(f"{where} must be an object with 'price_upper' and/or 'price' and/or 'product_prices', "
                        f"got {entry!r}")
        up, pr, pp = (entry.get(k) for k in TASK_PRICE_KEYS)
        if pp is not None and not hasattr(pp, "items"):
            raise error(f"{where}.product_prices must map ASINs to hidden prices in dollars, got {pp!r}")
        products = {}
        for asin, v in (pp or {}).items():
            if not isinstance(asin, str) or not 0 < len(asin) <= MAX_ASIN_LENGTH:
                raise error(f"{where}.product_prices: {asin!r} is not a WebShop ASIN (a string of 1 to "
                            f"{MAX_ASIN_LENGTH} characters, e.g. 'B08LKKSL8F')")
            products[asin] = _dollars(v, f"{where}.product_prices[{asin!r}]", error, positive=True)
        out[str(tid)] = {
            "price_upper": None if up is None else _dollars(up, f"{where}.price_upper", error),
            "price": None if pr is None else _dollars(pr, f"{where}.price", error),
            "product_prices": products,
        }
    return out
