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

``text_rich`` (WebShop's ``convert_html_to_text(simple=False)``, :meth:`Site.rich_text`) uses the
same text nodes unstripped, one per line, with button / option / product-link marks.

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
from serl.envs.webshop.options import OBSERVATION_MODES  # noqa: F401  (defined there: config checks read it)

#: results per page (``PRODUCT_WINDOW``)
PRODUCT_WINDOW = 10
SEP = " [SEP] "
#: the simulated browser's base URL (``SimServer``); part of the page URL ``text_rich`` looks at
BASE_URL = "http://127.0.0.1:3000"
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


def _raw_node(raw: str) -> Optional[str]:
    """The text node BeautifulSoup's ``html.parser`` keeps for template text ``raw``: None when
    absent (empty, or ASCII whitespace holding a newline, which becomes ``"\\n"`` and is skipped by
    WebShop), ``" "`` for other ASCII whitespace, else ``raw`` unchanged."""
    if raw == "":
        return None
    if all(c in _ASCII_SPACE for c in raw):
        return None if "\n" in raw else " "
    return raw


def _node(raw: str) -> Optional[str]:
    """The ``text``-mode segment BeautifulSoup + WebShop produce for a text node ``raw`` (module docstring)."""
    r = _raw_node(raw)
    return None if r is None else r.strip()


def _typed(kind: str, raw: str) -> list[tuple[str, str]]:
    """``[(kind, node)]`` for template text ``raw``, or ``[]`` when it yields no text node."""
    r = _raw_node(raw)
    return [] if r is None else [(kind, r)]


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
        session_id: WebShop's session id (``reset(session=idx)`` uses the goal index); it is
            part of the page URL.
    """

    def __init__(self, catalog: Catalog, searcher, instruction: str, rng: random.Random, show_attrs: bool = False,
                 session_id: str = "0"):
        self.session_id = session_id
        self.catalog = catalog
        self.searcher = searcher
        self.instruction = instruction
        self.rng = rng
        self.show_attrs = show_attrs
        self.state = SiteState()
        self._clickables: Optional[dict[str, Clickable]] = None

    # ------------------------------------------------------------------ rendering
    def nodes(self) -> list[tuple[str, str]]:
        """The page's visible text nodes in order, as ``(kind, raw text)``.

        ``kind`` is what the original's ``text_rich`` mode looks at: ``button`` (the node's parent
        is a ``<button>``), ``label`` (an option value's ``<label>``), ``link`` (a product asin's
        ``<a class="product-link">``) or ``text``. ``raw`` keeps the template's own spaces (e.g.
        ``"Instruction: "`` on the start page, ``" " + bullet`` on the features page).
        """
        st = self.state
        B, T = "button", "text"
        if st.page == "start":
            return [(T, "WebShop"), (T, "Instruction: ")] + _typed(T, self.instruction) + [(B, "Search")]
        head = [(T, "Instruction:")] + _typed(T, self.instruction) + [(B, "Back to Search")]
        if st.page == "results":
            out = head + [(T, f"Page {st.page_num} (Total results: {len(st.results)})")]
            if st.page_num > 1:
                out.append((B, "< Prev"))
            out.append((B, "Next >"))
            for asin in self._page_asins():
                p = self.catalog.by_asin[asin]
                out += _typed("link", p.asin) + _typed(T, p.title) + _typed(T, p.price_tag)
            return out
        if st.page == "done":
            return self._done_nodes()
        p = self._product()
        out = head + [(B, "< Prev")]
        if st.page == "item":
            for name, values in p.options.items():
                out += _typed(T, name)
                for v in values:
                    out += _typed("label", v)
            out += _typed(T, p.title) + _typed(T, f"Price: {p.price_tag}") + _typed(T, f"Rating: {p.rating}")
            buttons = ["Description", "Features", "Reviews"] + (["Attributes"] if self.show_attrs else []) + ["Buy Now"]
            out += [(B, b) for b in buttons]
        elif st.page == "description":
            out += _typed(T, p.description)
        elif st.page == "features":
            for b in p.bullet_points:
                out += _typed(T, " " + b)
        elif st.page == "attributes":
            for a in p.attributes:
                out += _typed(T, " " + a)
            out += _typed(T, p.category) + _typed(T, p.query) + _typed(T, p.product_category)
        # reviews: WebShop's data has none
        return out

    def segments(self) -> list[str]:
        """The page's text nodes in order, stripped (their ``" [SEP] "`` join is the ``text`` observation)."""
        return [raw.strip() for _, raw in self.nodes()]

    def _done_nodes(self) -> list[tuple[str, str]]:
        st = self.state
        texts = [
            "Thank you for shopping with us!", "Your code: ", "None", " (Paste it in your MTurk interface.)",
            "Purchased", "asin", st.asin or "", "options", tojson_html(st.options),
            "attrs", "None", "category", "None", "query", "None", "product category", "None",
            "Target", "asin", "options", "attrs", "price upper", "instuction text", "category",
            "product category", "query", "Goal ", "None", "Reward", "Your score (min 0.0, max 1.0)",
            str(st.score), "Reward Details ", "None",
        ]
        return [n for t in texts for n in _typed("text", t)]

    def text(self) -> str:
        """The raw ``[SEP]`` text observation of the current page (WebShop's ``text`` mode)."""
        return SEP.join(self.segments())

    def url(self) -> str:
        """The page's URL in WebShop's simulated browser; only the item page's matters (its
        options JSON decides which option labels ``text_rich`` marks as clicked)."""
        st = self.state
        keywords = "+".join(st.keywords or [])
        if st.page == "item":
            return (f"{BASE_URL}/item_page/{self.session_id}/{st.asin}/{keywords}/{st.page_num}/"
                    f"{json.dumps(st.options)}")
        if st.page == "results":
            return f"{BASE_URL}/search_results/{self.session_id}/{keywords}/{st.page_num}"
        if st.page in SUB_PAGES:
            return (f"{BASE_URL}/item_sub_page/{self.session_id}/{st.asin}/{keywords}/{st.page_num}/"
                    f"{st.page.capitalize()}/{st.options}")
        if st.page == "done":
            return f"{BASE_URL}/done/{self.session_id}/{st.asin}/{st.options}"
        return f"{BASE_URL}/{self.session_id}"

    def rich_text(self) -> str:
        """The ``text_rich`` observation (WebShop's ``convert_html_to_text(html, simple=False)``).

        Every text node becomes one line (``raw + "\\n"``): a button's text as
        ``[button] X [button_]``; an option value as ``  [clicked button] X [clicked button_]`` when
        ``'"X"'`` occurs in the page URL (i.e. in the JSON of the chosen options), with
        ``You have clicked X.`` put in front of the whole text, else ``  [button] X [button_]``; a
        product asin as ``\\n[clicked button] X [clicked button_]`` when the asin was opened since
        the last ``back to search``, else ``\\n[button] X [button_]``; other text unchanged. As in
        the original, a value containing ``"`` or a non-ASCII character is never marked (its JSON
        form is escaped), and a value that is chosen in another option group is marked too.
        """
        st = self.state
        url = self.url()
        visited = {a.upper() for a in st.visited}
        out = ""
        for kind, t in self.nodes():
            if kind == "button":
                line = f"[button] {t} [button_]"
            elif kind == "label":
                if f'"{t}"' in url:
                    line = f"  [clicked button] {t} [clicked button_]"
                    out = f"You have clicked {t}.\n" + out
                else:
                    line = f"  [button] {t} [button_]"
            elif kind == "link":
                mark = "clicked button" if t in visited else "button"
                line = f"\n[{mark}] {t} [{mark}_]"
            else:
                line = t
            out += line + "\n"
        return out

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
