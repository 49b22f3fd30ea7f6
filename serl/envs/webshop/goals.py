"""WebShop goals: generation, the seed-233 order, splits and the seeded price clause
(``get_goals`` in ``princeton-nlp/WebShop@64fa2a5:web_agent_site/engine/goal.py``).

**Synthetic goals** (``human_goals=False``, what verl-agent / GiGPO train and test on): products
are taken in file order; a product with a synthetic ``instruction`` gives one goal per
combination of its option values (``itertools.product`` over the *sorted* option names)::

    instruction_text = instruction + " with " + ", and ".join(f"{name}: {value}") + price_text

``goal_options`` is the ``{name: value}`` dict, ``attributes`` the product's
``instruction_attributes``. The 1k split gives 6910 goals over 415 products.

**Human goals** (``human_goals=True``): one goal per human instruction record with non-empty
``instruction_attributes``; ``instruction_text = instruction.strip('.') + price_text`` and
``goal_options`` is the list of option values. Only 13 exist on the 1k split.

**Order.** After generation WebShop runs ``random.seed(233); random.shuffle(goals)``; a goal's
index in that order is its ``reset(session=idx)`` id and our ``Task.task_id``. Splits
(WebShop / verl-agent): ``test`` = indices 0–499, ``train`` = 500 and up, ``all`` = every goal.
The shuffle depends only on the number of goals, so the order does not depend on prices.

**Price clause.** ``PRICE_RANGE = [10, 20, ..., 990]``; of the first four entries above the
target's hidden price, two are sampled and the larger is ``price_upper``, with
``price_text = ", and price lower than {price_upper:.2f} dollars"``; with fewer than two such
entries (a product of $980 or more) ``price_upper = 1e6`` and no clause. WebShop samples this
from the unseeded global ``random`` once per product at start-up, so the instruction text
changes between runs. We draw it per goal from ``(seed, goal index)``
(:func:`price_clause`): deterministic, identical for all members of a group, and independent
of which worker runs the episode.

**Explicit prices.** To reproduce a published run or replay an original WebShop session, a
task's ``price_upper``, its target's hidden price and the hidden price of any other product can
be given explicitly (``env.webshop.task_prices``: a JSON file or mapping, :func:`load_task_prices`);
they override the seeded draws. As in the original, a hidden price is used only where WebShop
uses ``product_prices``: the budget draw above the target's price (``goal.py:get_synthetic_goals``
/ ``get_human_goals``) and the purchase's price term (``web_agent_text_env.py:SimServer.done``);
the pages show the catalogue's ``Price`` tag (``$a to $b``) either way.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from serl.envs.base import EnvError
from serl.envs.webshop.catalog import Catalog, Product, hidden_price
from serl.envs.webshop.options import read_task_prices

#: WebShop's budget grid (dollars)
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
#: ``price_upper`` when no budget applies
NO_BUDGET = 1000000
#: WebShop's goal-shuffle seed
SHUFFLE_SEED = 233
#: size of WebShop's / verl-agent's test split (the first goals of the shuffled list)
NUM_TEST = 500

SPLITS = ("train", "test", "all")


@dataclass(frozen=True)
class Goal:
    """A shopping goal before its price clause is drawn.

    Attributes:
        asin: the target product.
        base_text: the instruction without the price clause.
        attributes: goal attributes (matched against the purchased product).
        goal_options: ``{name: value}`` (synthetic) or a list of values (human).
        name, query, category, product_category: copied from the target product.
        human: True for a human-written goal.
    """

    asin: str
    base_text: str
    attributes: tuple[str, ...]
    goal_options: Union[dict, list]
    name: str
    query: str
    category: str
    product_category: str
    human: bool = False


@dataclass(frozen=True)
class PricedGoal:
    """A goal with its seeded price clause, as played in one episode."""

    goal: Goal
    index: int
    price_upper: float
    instruction_text: str
    #: the target's explicit hidden price (``env.webshop.task_prices``); None = seeded draw
    price: Optional[float] = None


def synthetic_goals(catalog: Catalog) -> list[Goal]:
    """WebShop's synthetic goals in generation order (before the shuffle)."""
    goals = []
    for p in catalog.products:
        if p.instruction is None:
            continue
        if not p.instruction_attributes:
            raise EnvError(f"product {p.asin} has a synthetic instruction but no instruction_attributes")
        names = sorted(p.options)
        for combo in itertools.product(*(p.options[n] for n in names)):
            opts = dict(zip(names, combo))
            opt_text = ", and ".join(f"{k}: {v}" for k, v in opts.items())
            goals.append(Goal(
                asin=p.asin,
                base_text=p.instruction + (" with " + opt_text if opt_text else ""),
                attributes=tuple(p.instruction_attributes),
                goal_options=opts,
                name=p.title,
                query=p.query,
                category=p.category,
                product_category=p.product_category,
            ))
    return goals


def human_goals(catalog: Catalog) -> list[Goal]:
    """WebShop's human goals in generation order (records without attributes are skipped)."""
    goals = []
    for p in catalog.products:
        for rec in p.human_instructions:
            attrs = rec.get("instruction_attributes") or []
            if not attrs:
                continue
            goals.append(Goal(
                asin=p.asin,
                base_text=rec["instruction"].strip("."),
                attributes=tuple(attrs),
                goal_options=list(rec.get("instruction_options") or []),
                name=p.title,
                query=p.query,
                category=p.category,
                product_category=p.product_category,
                human=True,
            ))
    return goals


def ordered_goals(catalog: Catalog, human: bool = False) -> list[Goal]:
    """The goals in WebShop's environment order: generated, then shuffled with seed 233."""
    goals = human_goals(catalog) if human else synthetic_goals(catalog)
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return goals


def split_indices(split: str, num_goals: int) -> range:
    """Goal indices of ``split``: ``test`` = 0–499, ``train`` = 500–end, ``all``.

    Raises:
        EnvError: unknown split name.
    """
    if split == "test":
        return range(min(NUM_TEST, num_goals))
    if split == "train":
        return range(min(NUM_TEST, num_goals), num_goals)
    if split == "all":
        return range(num_goals)
    raise EnvError(f"unknown WebShop split {split!r}; valid: {list(SPLITS)}")


def price_text(price_upper: float) -> str:
    """WebShop's price clause for ``price_upper`` (empty for :data:`NO_BUDGET` or more)."""
    if price_upper >= NO_BUDGET:
        return ""
    return f", and price lower than {price_upper:.2f} dollars"


def price_clause(target: Product, seed: int, index: int, price: Optional[float] = None) -> tuple[float, str]:
    """``(price_upper, price_text)`` of goal ``index`` for ``seed`` (module docstring); ``price``
    overrides the target's seeded hidden price the budget is drawn above."""
    if price is None:
        price = hidden_price(target, seed, index)
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_BUDGET, ""
    rng = random.Random(f"serl-webshop/price_upper/{seed}/{index}")
    _, upper = sorted(rng.sample(candidates, 2))
    return upper, price_text(upper)


def priced_goal(catalog: Catalog, goals: list[Goal], index: int, seed: int,
                explicit: Optional["TaskPrice"] = None) -> PricedGoal:
    """Goal ``index`` of ``goals`` with its price clause for ``seed``, or with the explicit
    ``price_upper`` / target price of ``explicit`` (:func:`load_task_prices`; the target's price
    is ``price``, else ``product_prices[target]``) where given."""
    if not 0 <= index < len(goals):
        raise EnvError(f"WebShop goal index {index} out of range: there are {len(goals)} goals")
    g = goals[index]
    price = explicit.hidden_price_of(g.asin, g.asin) if explicit is not None else None
    if explicit is not None and explicit.price_upper is not None:
        upper, text = explicit.price_upper, price_text(explicit.price_upper)
    else:
        upper, text = price_clause(catalog.by_asin[g.asin], seed, index, price)
    return PricedGoal(goal=g, index=index, price_upper=upper, instruction_text=g.base_text + text, price=price)


@dataclass(frozen=True)
class TaskPrice:
    """Explicit prices of one task (``env.webshop.task_prices``); None / absent = serl's seeded draw.

    Attributes:
        price_upper: the budget in dollars, shown in the instruction (``, and price lower than
            {price_upper:.2f} dollars``; no clause at 1e6 or more, as WebShop) and compared with
            the purchase's price by the reward.
        price: the target product's hidden price in dollars (WebShop's ``product_prices[asin]``),
            used by the reward when the target is bought and, without ``price_upper``, as the
            price the budget is drawn above.
        product_prices: ``{asin: dollars}``, the hidden price of any product in this task (the
            target too, when ``price`` is not given), used by the reward when that product is
            bought. Products not listed keep their seeded prices.
    """

    price_upper: Optional[float] = None
    price: Optional[float] = None
    product_prices: dict[str, float] = field(default_factory=dict)

    def hidden_price_of(self, asin: str, target: str) -> Optional[float]:
        """The explicit hidden price of product ``asin`` in a task whose target is ``target``:
        ``price`` for the target when given, else ``product_prices[asin]``; None = the seeded draw."""
        if asin == target and self.price is not None:
            return self.price
        return self.product_prices.get(asin)


def load_task_prices(spec: Union[str, os.PathLike, dict, None]) -> dict[str, TaskPrice]:
    """Explicit per-task prices: ``{task_id: TaskPrice}`` from a JSON file or a mapping.

    The JSON is an object keyed by task id (``"12"`` for synthetic goal 12, ``"h3"`` for human
    goal 3), each value an object with ``price_upper``, ``price`` and/or ``product_prices``
    (dollars; :func:`serl.envs.webshop.options.read_task_prices`), e.g.
    ``{"0": {"price_upper": 40.0, "price": 23.99}}`` or
    ``{"10": {"price_upper": 48.0, "product_prices": {"B08LKKSL8F": 47.5, "B09Q67H373": 5.55}}}``.
    Whether the task ids and ASINs exist is checked by :func:`check_task_prices`.

    Raises:
        EnvError: unreadable file, bad JSON, unknown keys, non-numeric / negative values, or a
            ``product_prices`` price that is not > 0 (naming the task and the ASIN).
    """
    return {tid: TaskPrice(e["price_upper"], e["price"], e["product_prices"])
            for tid, e in read_task_prices(spec, EnvError).items()}


def check_task_prices(prices: dict[str, TaskPrice], catalog: Catalog, goals_of: Callable[[str], Goal]) -> None:
    """Check explicit prices against the catalogue and the goals: every ``product_prices`` ASIN
    is a product of ``catalog``, and ``price`` and ``product_prices[target]``, when both given,
    agree. ``goals_of(task_id)`` is the task's goal (raising :class:`EnvError` for an unknown id).

    Raises:
        EnvError: naming the task id (and the ASIN): an unknown task id or ASIN, or two
            different target prices.
    """
    for tid, tp in prices.items():
        where = f"env.webshop.task_prices[{tid!r}]"
        try:
            goal = goals_of(tid)
        except EnvError as e:
            raise EnvError(f"{where}: {e}") from None
        for asin in tp.product_prices:
            if asin not in catalog.by_asin:
                hint = f" (ASINs are upper case: {asin.upper()!r})" if asin.upper() in catalog.by_asin else ""
                raise EnvError(f"{where}.product_prices: unknown ASIN {asin!r}: no such product in the "
                               f"{len(catalog.products)}-product catalogue of {catalog.data_dir}{hint}")
        both = tp.product_prices.get(goal.asin)
        if tp.price is not None and both is not None and both != tp.price:
            raise EnvError(f"{where}: 'price' {tp.price} and product_prices[{goal.asin!r}] {both} both set the "
                           f"hidden price of the target {goal.asin} and differ; give one of them")
