"""WebShop's web site as a state machine with text rendering (``princeton-nlp/WebShop@64fa2a5:web_agent_site/envs/web_agent_text_env.py``
and its ``templates/``).

WebShop renders Jinja/HTML pages and turns them into text with BeautifulSoup (``text``
observation mode). We keep the same pages, transitions and *exact* text without HTML: each page
is the list of the text nodes BeautifulSoup would yield, joined with ``" [SEP] "``.

Text-node rule (BeautifulSoup's ``html.parser`` + WebShop's ``convert_html_to_text``): a node
that is empty is absent; a node of ASCII whitespace holding a newline is dropped; any other node
is ``str.strip()``-ed, which can leave an empty segment (e.g. an empty bullet point, rendered as
``" "``, gives ``... [SEP] ``). :func:`_node` implements it.

Pages (clickables are the lower-cased button/link texts and the option values):

=========== ================================================================ ==================
page        text nodes                                                        clickables
=========== ================================================================ ==================
start       WebShop, Instruction:, <instr>, Search                           search (rejected)
results     Instruction:, <instr>, Back to Search, Page p (Total results: n), back to search,
            [< Prev if p > 1], Next > (always), then per product:            [< prev], next >,
            ASIN, Title, Price                                               the asins
item        Instruction:, <instr>, Back to Search, < Prev, per option group: back to search,
            name, values...; Title, Price: $x, Rating: N.A., Description,    < prev, description,
            Features, Reviews, [Attributes if show_attrs], Buy Now           features, reviews,
                                                                             [attributes],
                                                                             buy now, values
description Instruction:, <instr>, Back to Search, < Prev, <Description>     back to search,
features    ... < Prev, <bullet 1>, <bullet 2>, ...                          < prev
reviews     ... < Prev (reviews are disabled in WebShop)
attributes  ... < Prev, <attributes...>, category, query, product category
done        Thank you for shopping with us! ... Your score (min 0.0, max 1.0), <score> ...
=========== ================================================================ ==================

Transitions: ``search[q]`` works from every page (keywords ``q.split(' ')``; 10 results per
page of the top 50); ``back to search`` → start (clears keywords, product, options); ``next >`` /
``< prev`` page through results (``next >`` past the end shows an empty page); a product link
opens its item page with no option chosen; an option value sets ``options[group] = value`` (the
last group holding that value wins); ``< prev`` on an item page returns to its results page
(clearing the options), on a sub-page to the item page (keeping them); ``buy now`` ends the
episode. Anything else is a no-op that changes nothing (the env reports it).

Deviations from WebShop, each fixing a defect:

* a results list is computed once per search and reused when paging (WebShop re-runs the
  search on every page turn, so ``search[<r> ...]`` showed a different random sample per page);
  ``<r>`` draws its 50 products from the episode's seeded RNG;
* ``search[<a> attr]`` lists the products having that attribute (WebShop's text env crashes
  with a TypeError), and ``search[<c>]`` with no category gives 0 results (WebShop: IndexError).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from serl.envs.webshop.catalog import Catalog, Product

#: results per page (``PRODUCT_WINDOW``)
PRODUCT_WINDOW = 10
SEP = " [SEP] "
SUB_PAGES = ("description", "features", "reviews", "attributes")
_ACTION = re.compile(r"(.+)\[(.+)\]")
_ASCII_SPACE = frozenset(" \n\t\x0c\r")


def parse_action(action: str) -> tuple[str, Optional[str]]:
    """WebShop's action parser: ``re.match(r'(.+)\\[(.+)\\]')`` → ``(name, arg)``; ``arg`` is
    lower-cased, or None when the pattern does not match (greedy, as the original)."""
    m = _ACTION.match(action)
    if m is None:
        return action, None
    return m.group(1), m.group(2).lower()


def _node(raw: str) -> Optional[str]:
    """The segment BeautifulSoup + WebShop produce for a text node ``raw`` (module docstring)."""
    if raw == "":
        return None
    if all(c in _ASCII_SPACE for c in raw):
        return None if "\n" in raw else ""
    return raw.strip()


def _nodes(*raws: str) -> list[str]:
    out = []
    for r in raws:
        s = _node(r)
        if s is not None:
            out.append(s)
    return out


def tojson_html(obj: Any) -> str:
    """Flask's ``tojson`` filter: sorted-key JSON with ``< > & '`` escaped (done page)."""
    s = json.dumps(obj, sort_keys=True)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")


@dataclass
class Clickable:
    """What a clickable string does: ``kind`` is ``button``, ``product`` or ``option``."""

    kind: str
    value: str  # button label / asin / option group name


@dataclass
class SiteState:
    """The session state of one episode (WebShop's ``user_sessions[session]``)."""

    page: str = "start"  # start | results | item | description | features | reviews | attributes | done
    keywords: Optional[list[str]] = None
    results: list[str] = field(default_factory=list)  # asins of the current search, ranked
    page_num: int = 1
    asin: Optional[str] = None
    options: dict[str, str] = field(default_factory=dict)
    visited: set[str] = field(default_factory=set)
    score: Optional[float] = None


class Site:
    """The WebShop site for one episode: render pages, list clickables, apply actions.

    Args:
        catalog: the products.
        searcher: a callable ``query -> list[asin]`` (BM25 top 50).
        instruction: the goal instruction shown on every page.
        rng: the episode's RNG (for ``search[<r>]``).
        show_attrs: show the ``Attributes`` button (WebShop's ``show_attrs``; default off).
    """

    def __init__(self, catalog: Catalog, searcher, instruction: str, rng: random.Random, show_attrs: bool = False):
        self.catalog = catalog
        self.searcher = searcher
        self.instruction = instruction
        self.rng = rng
        self.show_attrs = show_attrs
        self.state = SiteState()
        self._clickables: Optional[dict[str, Clickable]] = None

    # ------------------------------------------------------------------ rendering
    def segments(self) -> list[str]:
        """The page's text nodes in order (their ``" [SEP] "`` join is the observation)."""
        st = self.state
        head = ["Instruction:"] + _nodes(self.instruction)
        if st.page == "start":
            return ["WebShop"] + head + ["Search"]
        if st.page == "results":
            segs = head + ["Back to Search", f"Page {st.page_num} (Total results: {len(st.results)})"]
            if st.page_num > 1:
                segs.append("< Prev")
            segs.append("Next >")
            for asin in self._page_asins():
                p = self.catalog.by_asin[asin]
                segs += _nodes(p.asin, p.title, p.price_tag)
            return segs
        if st.page == "done":
            return self._done_segments()
        p = self._product()
        segs = head + ["Back to Search", "< Prev"]
        if st.page == "item":
            for name, values in p.options.items():
                segs += _nodes(name, *values)
            segs += _nodes(p.title, f"Price: {p.price_tag}", f"Rating: {p.rating}")
            segs += ["Description", "Features", "Reviews"] + (["Attributes"] if self.show_attrs else []) + ["Buy Now"]
        elif st.page == "description":
            segs += _nodes(p.description)
        elif st.page == "features":
            segs += _nodes(*(" " + b for b in p.bullet_points))
        elif st.page == "attributes":
            segs += _nodes(*(" " + a for a in p.attributes), p.category, p.query, p.product_category)
        # reviews: WebShop's data has none
        return segs

    def _done_segments(self) -> list[str]:
        st = self.state
        return [
            "Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)",
            "Purchased", "asin", *_nodes(st.asin or ""), "options", tojson_html(st.options),
            "attrs", "None", "category", "None", "query", "None", "product category", "None",
            "Target", "asin", "options", "attrs", "price upper", "instuction text", "category",
            "product category", "query", "Goal", "None", "Reward", "Your score (min 0.0, max 1.0)",
            str(st.score), "Reward Details", "None",
        ]

    def text(self) -> str:
        """The raw ``[SEP]`` text observation of the current page."""
        return SEP.join(self.segments())

    def _product(self) -> Product:
        return self.catalog.by_asin[self.state.asin]

    def _page_asins(self) -> list[str]:
        k = (self.state.page_num - 1) * PRODUCT_WINDOW
        return self.state.results[k : k + PRODUCT_WINDOW] if k >= 0 else []

    # ------------------------------------------------------------------ clickables
    def clickables(self) -> dict[str, Clickable]:
        """Lower-cased clickable text → what it is, in page order (buttons, links, options)."""
        if self._clickables is not None:
            return self._clickables
        st = self.state
        out: dict[str, Clickable] = {}

        def button(label: str) -> None:
            out[label.lower()] = Clickable("button", label.lower())

        if st.page == "start":
            button("Search")
        elif st.page == "results":
            button("Back to Search")
            if st.page_num > 1:
                button("< Prev")
            button("Next >")
            for asin in self._page_asins():
                out[asin.lower()] = Clickable("product", asin)
        elif st.page == "item":
            for b in ("Back to Search", "< Prev", "Description", "Features", "Reviews"):
                button(b)
            if self.show_attrs:
                button("Attributes")
            button("Buy Now")
            for name, values in self._product().options.items():
                for v in values:
                    out[v] = Clickable("option", name)  # the later group wins (as WebShop)
        elif st.page in SUB_PAGES:
            button("Back to Search")
            button("< Prev")
        self._clickables = out
        return out

    def has_search_bar(self) -> bool:
        """Only the start page shows a search box (though ``search[...]`` works everywhere)."""
        return self.state.page == "start"

    def admissible_actions(self) -> list[str]:
        """``search[<your query>]`` where a search bar is shown, then ``click[x]`` per clickable.

        ``click[search]`` is left out: WebShop lists it on the start page but always rejects it.
        """
        acts = ["search[<your query>]"] if self.has_search_bar() else []
        acts += [f"click[{c}]" for c in self.clickables() if c != "search"]
        return acts

    # ------------------------------------------------------------------ transitions
    def act(self, action: str) -> tuple[bool, str]:
        """Apply ``action``. Returns ``(valid, reason)``; an invalid action changes nothing.

        ``reason`` is ``""`` for a valid action, else one of ``episode over``, ``empty search``,
        ``unknown click target`` or ``unparsable action``.
        """
        if self.state.page == "done":
            return False, "episode over"
        name, arg = parse_action(action)
        if name == "search":
            if not arg:
                return False, "empty search"
            self._search(arg)
            return True, ""
        if name == "click":
            cl = self.clickables().get(arg) if arg is not None else None
            if cl is None or arg == "search":
                return False, "unknown click target"
            self._click(arg, cl)
            return True, ""
        return False, "unparsable action"

    def _changed(self) -> None:
        self._clickables = None

    def _search(self, query: str) -> None:
        st = self.state
        keywords = query.split(" ")
        st.keywords = keywords
        st.results = self._top_n(keywords)
        st.page_num = 1
        self._show_results()

    def _show_results(self) -> None:
        st = self.state
        st.page = "results"
        st.asin = None
        st.options = {}
        self._changed()

    def _top_n(self, keywords: list[str]) -> list[str]:
        """WebShop's ``get_top_n_product_from_keywords`` (special prefixes ``<r> <a> <c> <q>``)."""
        head = keywords[0]
        products = self.catalog.products
        if head == "<r>":
            return [p.asin for p in self.rng.sample(products, k=min(50, len(products)))]
        if head == "<a>":
            attr = " ".join(keywords[1:]).strip()
            return [p.asin for p in products if attr in p.attributes]
        if head == "<c>":
            if len(keywords) < 2:
                return []
            cat = keywords[1].strip()
            return [p.asin for p in products if p.category == cat]
        if head == "<q>":
            q = " ".join(keywords[1:]).strip()
            return [p.asin for p in products if p.query == q]
        return list(self.searcher(" ".join(keywords)))

    def _click(self, x: str, cl: Clickable) -> None:
        st = self.state
        page = st.page
        if x == "buy now":
            st.page = "done"  # the env computes the score (needs the goal)
        elif x == "back to search":
            st.page, st.keywords, st.results, st.page_num = "start", None, [], 1
            st.asin, st.options, st.visited = None, {}, set()
        elif x == "next >" and page == "results":
            st.page_num += 1
            self._show_results()
        elif x == "< prev" and page == "results":
            st.page_num -= 1
            self._show_results()
        elif x == "< prev" and page in SUB_PAGES:
            st.page = "item"
        elif x == "< prev" and page == "item":
            self._show_results()
        elif x in SUB_PAGES:
            st.page = x
        else:
            if cl.kind == "product":
                st.asin = cl.value
                st.visited.add(cl.value)
            elif cl.kind == "option":
                st.options[cl.value] = x
            st.page = "item"
        self._changed()
