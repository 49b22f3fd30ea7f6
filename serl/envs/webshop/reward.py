"""WebShop's purchase score, exactly as ``get_reward`` in
``princeton-nlp/WebShop@64fa2a5:web_agent_site/engine/goal.py``.

For a purchased product P with chosen options S and hidden price p, and a goal with attributes
A, options O and budget ``price_upper``::

    score = r_type * (n_attr + n_opt + [p <= price_upper]) / (|A| + |O| + 1)      ∈ [0, 1]

* ``r_type``: 1.0, lowered to 0.5 when none of query match, category match (≥ 2 shared
  ``›`` parts) and ``title_score > 0.2`` holds, to 0.1 when ``title_score < 0.1`` and to 0.0 when
  ``title_score == 0`` (later rules win). ``title_score = |set(N_P) ∩ set(N_goal)| / len(N_goal)``
  (0.2 when ``N_goal`` is empty) over the NOUN/PROPN title tokens of the shipped spaCy table
  (``en_core_web_sm`` 3.8.0; no spaCy at run time). ``N_goal`` is a list with duplicates, so an
  identical title can score below 1.
* ``n_attr``: goal attributes g with some product attribute a such that
  ``thefuzz.fuzz.token_set_ratio(a, g) > 85``, or g a substring of the lower-cased title,
  bullet points (joined by spaces) or description.
* ``n_opt``: goal option items matched by some chosen value v with
  ``token_set_ratio(v, item) > 85``, both sides passed through :func:`normalize_color` first.
  For synthetic goals the items are WebShop's ``goal_options.items()``, i.e. ``(name, value)``
  *tuples* (thefuzz reads them as ``str(tuple)``, effectively ``"name value"``); for human goals
  the value strings. Consequences kept on purpose, because they define WebShop's numbers:
  buying ``large`` for an ``x-large`` goal matches (token subset), ``x-large`` for ``large`` does
  not, and ``normalize_color`` is a substring test on a purchased value (``rectangular`` → ``tan``)
  but an element-equality test on a goal tuple. Buying exactly the target with exactly the goal
  options therefore scores < 1 on 458 of 6910 synthetic goals.
* price: a bool, always true when ``price_upper = 1e6``.

thefuzz 0.19 (WebShop's pin, difflib) and 0.22 (rapidfuzz) differ in raw ratios but agree on
every ``> 85`` decision on this data (all 78,561 attribute and 12,375 option pairs), so any thefuzz ≥ 0.19 gives WebShop's scores.
"""

from __future__ import annotations

from typing import Any, Sequence

from thefuzz import fuzz

from serl.envs.webshop.catalog import Catalog, Product

#: thefuzz score a match must exceed
FUZZ_THRESHOLD = 85


def normalize_color(x: Any, colors: Sequence[str]) -> Any:
    """WebShop's ``normalize_color``: the first colour c of ``colors`` with ``c in x``, else ``x``.

    ``in`` is a substring test for a string and an element test for a tuple (``engine/normalize.py``).
    """
    for c in colors:
        if c in x:
            return c
    return x


def type_reward(catalog: Catalog, purchased: Product, goal) -> dict[str, Any]:
    """``r_type`` and its parts for ``purchased`` against ``goal``."""
    query_match = purchased.query == goal.query
    cats_p = {x.strip() for x in purchased.product_category.split("›")}
    cats_g = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(cats_p & cats_g) >= 2
    nouns_p = catalog.title_nouns[purchased.asin]
    nouns_g = catalog.title_nouns[goal.asin]
    if len(nouns_g) == 0:
        title_score = 0.2
    else:
        title_score = len(set(nouns_p) & set(nouns_g)) / len(nouns_g)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return dict(r_type=r_type, query_match=query_match, category_match=category_match, title_score=title_score)


def attribute_matches(purchased: Product, goal_attributes: Sequence[str]) -> int:
    """``n_attr``: matched goal attributes."""
    title = purchased.title.lower()
    bullets = " ".join(purchased.bullet_points).lower()
    desc = purchased.description.lower()
    n = 0
    for g in goal_attributes:
        if any(fuzz.token_set_ratio(a, g) > FUZZ_THRESHOLD for a in purchased.attributes):
            n += 1
        elif g in title or g in bullets or g in desc:
            n += 1
    return n


def option_matches(chosen: dict[str, str], goal_options, colors: Sequence[str]) -> int:
    """``n_opt``: goal items (tuples for a dict, strings for a list) matched by a chosen value."""
    values = [normalize_color(v, colors) for v in chosen.values()]
    items = goal_options.items() if isinstance(goal_options, dict) else goal_options
    n = 0
    for item in items:
        item = normalize_color(item, colors)
        if any(fuzz.token_set_ratio(v, item) > FUZZ_THRESHOLD for v in values):
            n += 1
    return n


def get_reward(catalog: Catalog, purchased: Product, goal, price: float, price_upper: float,
               options: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """WebShop's score of buying ``purchased`` with ``options`` at hidden ``price`` for ``goal``.

    Args:
        catalog: the catalogue (title-noun table, colour list).
        purchased: the product bought.
        goal: a :class:`serl.envs.webshop.goals.Goal`.
        price: the purchased product's hidden price (dollars).
        price_upper: the goal's budget (dollars).
        options: the options chosen on the item page, name → value.

    Returns:
        ``(score, details)``: the score in [0, 1] and WebShop's verbose parts (``r_type``,
        ``r_att``, ``w_att``, ``r_option``/``w_option`` when the goal has options, ``r_price``,
        ``w_price``, ``query_match``, ``category_match``, ``title_score``).
    """
    t = type_reward(catalog, purchased, goal)
    r_price = price <= price_upper
    n_attr = attribute_matches(purchased, goal.attributes)
    n_opt = option_matches(options, goal.goal_options, catalog.colors)
    denom = len(goal.attributes) + len(goal.goal_options) + 1
    score = (n_attr + n_opt + r_price) / denom
    score *= t["r_type"]
    details = dict(t, r_att=n_attr / len(goal.attributes) if goal.attributes else 0.0,
                   w_att=len(goal.attributes) / denom, r_price=bool(r_price), w_price=1 / denom)
    if len(goal.goal_options) > 0:
        details["r_option"] = n_opt / len(goal.goal_options)
        details["w_option"] = len(goal.goal_options) / denom
    return score, details
