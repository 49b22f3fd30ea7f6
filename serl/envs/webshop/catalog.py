"""WebShop's product catalogue: loading and processing the raw records, as
``load_products`` in ``princeton-nlp/WebShop@64fa2a5:web_agent_site/engine/engine.py``.

:func:`load_catalog` turns WebShop's ``items_shuffle_1000.json`` (raw scraped records) and
``items_ins_v2_1000.json`` (attributes and synthetic instructions) into :class:`Product` records
exactly as WebShop's ``engine.load_products`` does:

* records with asin ``'nan'``, an asin longer than 10 characters, or a repeated asin are skipped;
* ``Title = name``, ``Description = full_description``, ``BulletPoints = small_description`` (as
  a list), ``Reviews = []`` and ``Rating = 'N.A.'`` (reviews are disabled in WebShop);
* price: the string is split on ``$``, every piece stripped of all but digits and dots and read
  as a float; the first two are kept. ``Price`` is shown as ``"$a"`` or ``"$a to $b"`` with
  Python's float formatting (``$704.0``); a missing price becomes ``[100.0]`` / ``"$100.0"``;
* options: ``options[name.lower()] = [value.strip().replace('/', ' | ').lower(), ...]``;
* ``Attributes`` from the attributes file (``['DUMMY_ATTR']`` when absent);
* ``query = query.lower().strip()``.

The *hidden* price the reward compares with the goal's budget is ``pricing[0]``, or for a
price range a uniform draw in ``[a, b]``. WebShop draws it from the unseeded global ``random``
when the environment is built; we draw it per episode from ``(seed, goal index, asin)``
(:func:`hidden_price`) so every run, worker and group member sees the same prices, unless
``env.webshop.task_prices`` gives a task's prices explicitly (:class:`serl.envs.webshop.goals.TaskPrice`).
Pages show ``Price`` (the tag), never the hidden price, as in WebShop.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Optional

from serl.envs.base import EnvError
from serl.envs.webshop import data as wsdata

_NON_PRICE = re.compile(r"[^\d.]")


@dataclass
class Product:
    """One processed WebShop product (field names follow WebShop's product dict).

    Attributes:
        asin: Amazon id, e.g. ``"B0743JKHBV"``.
        title: ``Title`` (= the raw ``name``).
        description: ``Description``.
        bullet_points: ``BulletPoints`` (the "Features" page).
        price_tag: ``Price`` as shown on pages, e.g. ``"$14.95"`` or ``"$2.99 to $6.99"``.
        pricing: the parsed price(s) in dollars, one or two floats.
        options: option name → values, in the page's order.
        attributes: ``Attributes`` (for the attribute reward).
        category: one of WebShop's 5 categories (``beauty``, ``electronics``, ...).
        query: WebShop's scrape-query label (lower-cased), used by the type reward.
        product_category: the Amazon breadcrumb, ``"A › B › C"``.
        rating: always ``"N.A."``.
        instruction: the synthetic instruction of this product, if it has one.
        instruction_attributes: the attributes of that instruction.
        human_instructions: the human instruction records targeting this product.
    """

    asin: str
    title: str
    description: str
    bullet_points: list[str]
    price_tag: str
    pricing: list[float]
    options: dict[str, list[str]]
    attributes: list[str]
    category: str
    query: str
    product_category: str
    rating: str = "N.A."
    instruction: Optional[str] = None
    instruction_attributes: Optional[list[str]] = None
    human_instructions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """WebShop's ``name`` (identical to ``Title``)."""
        return self.title


def parse_pricing(raw: Any) -> tuple[list[float], str]:
    """WebShop's price parsing: ``(pricing, price_tag)`` (module docstring).

    A string that yields no number (not present in the 1k data) is treated like a missing
    price rather than crashing as WebShop would.
    """
    if not raw:
        return [100.0], "$100.0"
    values = []
    for piece in str(raw).split("$")[1:]:
        digits = _NON_PRICE.sub("", piece)
        try:
            values.append(float(Decimal(digits)))
        except InvalidOperation:
            continue
    if not values:
        return [100.0], "$100.0"
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def search_contents(p: Product) -> str:
    """The text WebShop indexes for ``p`` (``search_engine/convert_product_file_format.py``):
    ``lower(Title + ' ' + Description + ' ' + BulletPoints[0] + ' ' + option_text)`` with
    ``option_text = ', and '.join(f'{name}: {", ".join(values)}')``."""
    option_text = ", and ".join(f"{k}: {', '.join(v)}" for k, v in p.options.items())
    first_bullet = p.bullet_points[0] if p.bullet_points else ""
    return " ".join([p.title, p.description, first_bullet, option_text]).lower()


@dataclass
class Catalog:
    """All products of a data folder, in file order, with look-ups.

    Attributes:
        products: in file order.
        by_asin: asin → product.
        title_nouns: asin → NOUN/PROPN tokens of the title (type reward of ``get_reward``).
        colors: WebShop's ``COLOR_SET`` (``normalize_color``).
        data_dir: the folder the data came from.
    """

    products: list[Product]
    by_asin: dict[str, Product]
    title_nouns: dict[str, list[str]]
    colors: tuple[str, ...]
    data_dir: Path

    def attribute_to_asins(self, attribute: str) -> set[str]:
        """asins whose ``Attributes`` contain ``attribute`` (WebShop's ``<a>`` search)."""
        return {p.asin for p in self.products if attribute in p.attributes}


def _process(raw: dict[str, Any], attrs: dict[str, Any], human: dict[str, Any]) -> Product:
    asin = raw["asin"]
    small = raw.get("small_description")
    bullets = small if isinstance(small, list) else [small]
    pricing, tag = parse_pricing(raw.get("pricing"))
    options: dict[str, list[str]] = {}
    custom = raw.get("customization_options")
    if custom:
        for name, contents in custom.items():
            if contents is None:
                continue
            options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    entry = attrs.get(asin)
    if entry is None:
        raise EnvError(f"asin {asin} of the products file is missing from {wsdata.ATTRIBUTES_FILE}")
    return Product(
        asin=asin,
        title=raw["name"],
        description=raw["full_description"],
        bullet_points=bullets,
        price_tag=tag,
        pricing=pricing,
        options=options,
        attributes=entry["attributes"] if "attributes" in entry else ["DUMMY_ATTR"],
        category=raw["category"],
        query=raw["query"].lower().strip(),
        product_category=raw["product_category"],
        instruction=entry.get("instruction"),
        instruction_attributes=entry.get("instruction_attributes"),
        human_instructions=list(human.get(asin, [])),
    )


def load_catalog(data_dir: Path) -> Catalog:
    """Load and process every product of ``data_dir`` (see the module docstring).

    Raises:
        EnvError: a file is missing, corrupt, or inconsistent (the message says how to fix it).
    """
    raw = wsdata.read_json(data_dir, wsdata.PRODUCTS_FILE)
    attrs = wsdata.read_json(data_dir, wsdata.ATTRIBUTES_FILE)
    human = wsdata.read_json(data_dir, wsdata.HUMAN_FILE)
    nouns_doc = wsdata.read_json(data_dir, wsdata.NOUNS_FILE)
    colors_folder = data_dir if wsdata.find_file(data_dir, wsdata.COLORS_FILE) else wsdata.shipped_data_dir()
    colors = tuple(wsdata.read_json(colors_folder, wsdata.COLORS_FILE)["colors"])
    if not isinstance(raw, list):
        raise EnvError(f"{wsdata.PRODUCTS_FILE} in {data_dir} must be a JSON list of product records")
    products: list[Product] = []
    seen: set[str] = set()
    try:
        for rec in raw:
            asin = rec["asin"]
            if asin == "nan" or len(asin) > 10 or asin in seen:
                continue
            seen.add(asin)
            products.append(_process(rec, attrs, human))
    except (KeyError, TypeError, AttributeError) as e:
        raise EnvError(f"malformed product record in {data_dir / wsdata.PRODUCTS_FILE}: {e!r}. {wsdata.HOW_TO_FIX}") from e
    nouns = nouns_doc.get("nouns") if isinstance(nouns_doc, dict) else None
    if not isinstance(nouns, dict):
        raise EnvError(f"{wsdata.NOUNS_FILE} in {data_dir} must be {{'nouns': {{asin: [tokens]}}}}")
    missing = [p.asin for p in products if p.asin not in nouns]
    if missing:
        raise EnvError(
            f"the title-noun table {wsdata.NOUNS_FILE} lacks {len(missing)} asins of {data_dir} (e.g. {missing[:3]}); "
            "regenerate it with spaCy's en_core_web_sm (NOUN/PROPN tokens of each title, lower-cased, duplicates "
            "kept)"
        )
    return Catalog(products=products, by_asin={p.asin: p for p in products}, title_nouns=nouns, colors=colors,
                   data_dir=data_dir)


def hidden_price(product: Product, seed: int, goal_idx: int | str) -> float:
    """The price the reward compares with ``price_upper`` (WebShop's ``product_prices``, seeded here).

    ``pricing[0]`` for a single price; for a range ``[a, b]`` a uniform draw seeded by
    ``("serl-webshop/price", seed, goal_idx, asin)`` (Python's ``random.Random`` with a string
    seed, stable across runs, processes and Python versions).
    """
    if len(product.pricing) < 2:
        return product.pricing[0]
    rng = random.Random(f"serl-webshop/price/{seed}/{goal_idx}/{product.asin}")
    return rng.uniform(product.pricing[0], product.pricing[1])
