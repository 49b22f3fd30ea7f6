"""WebShop (Yao et al., 2022) in serl's own Python: no Java, no spaCy, no Flask, offline.

The 1k-product split, its 6910 synthetic goals in WebShop's seed-233 order (and its 13 human
goals), WebShop's pages and text observations, its reward with all its quirks, and a Lucene-exact
BM25 search, behind serl's :class:`~serl.envs.base.TextEnv` protocol. The original is
``princeton-nlp/WebShop@64fa2a5:web_agent_site`` (WebShop, arXiv 2207.01206); each module's
docstring says which file it mirrors and where it departs from it.

Modules (one concept each):

* :mod:`.data`: where the data lives, reading ``.xz``/``.gz``, integrity checks;
* :mod:`.catalog`: product records as WebShop's ``load_products`` makes them, hidden prices;
* :mod:`.goals`: synthetic / human goals, the seed-233 order, splits, seeded price clauses;
* :mod:`.analysis`: Anserini's English analyzer (UAX#29 tokens, stop words, Porter);
* :mod:`.search`: Lucene BM25 (k1 0.9, b 0.4, quantised norms, ties by asin);
* :mod:`.reward`: WebShop's purchase score;
* :mod:`.pages`: the site's state machine and exact ``[SEP]`` text rendering;
* :mod:`.env`: :class:`WebShopEnv`, registered as ``"webshop"``;
* :mod:`.expert`: the goal-reading oracle of ``serl data expert webshop``;
* :mod:`.options`: the ``env.webshop`` checks run when a config is loaded (a leaf).

The names below are imported from :mod:`.env` on first use (PEP 562), so importing
:mod:`.options` to check a config does not load the env, its catalog or its search index.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WebShopEnv", "load_world", "format_observation", "DEFAULT_MAX_STEPS", "SUCCESS_REWARD"]


def __getattr__(name: str) -> Any:
    """``WebShopEnv``, ``load_world`` ... from :mod:`serl.envs.webshop.env`, imported on first use."""
    if name in __all__:
        from serl.envs.webshop import env

        return getattr(env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
