"""WebShop data shipped with serl: integrity, product processing (WebShop's load_products), and an optional
cross-check against the research data in ``../shared/data/webshop`` (skipped when absent)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from serl.envs.webshop import load_world
from serl.envs.webshop import data as wsdata
from serl.envs.webshop.catalog import parse_pricing, search_contents

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "webshop"


def test_shipped_files_are_complete_and_small():
    folder = wsdata.shipped_data_dir()
    for name in (wsdata.PRODUCTS_FILE, wsdata.ATTRIBUTES_FILE, wsdata.HUMAN_FILE, wsdata.NOUNS_FILE):
        raw = wsdata.read_bytes(folder, name)
        assert hashlib.sha256(raw).hexdigest() == wsdata.SHA256[name]
    assert (folder / "LICENSE").is_file() and (folder / "SOURCE.md").is_file()
    total = sum(f.stat().st_size for f in folder.iterdir())
    assert total < 12 * 2**20


def test_catalog_numbers():
    cat = load_world().catalog
    assert len(cat.products) == 1000
    cats = {}
    for p in cat.products:
        cats[p.category] = cats.get(p.category, 0) + 1
    assert cats == {"beauty": 238, "electronics": 229, "garden": 216, "fashion": 200, "grocery": 117}
    assert sum(p.instruction is not None for p in cat.products) == 415
    assert sum(len(p.pricing) == 2 for p in cat.products) == 93
    n_opt = [len(p.options) for p in cat.products]
    assert [n_opt.count(k) for k in range(4)] == [577, 245, 165, 13]
    assert len(cat.colors) == 102 and list(cat.colors) == sorted(cat.colors)
    p = cat.by_asin["B0743JKHBV"]
    assert p.price_tag == "$14.95" and p.rating == "N.A." and p.options["size"][0] == '16" x 16"'


def test_parse_pricing():
    assert parse_pricing("$877.8") == ([877.8], "$877.8")
    assert parse_pricing("$19.99 - $27.99") == ([19.99, 27.99], "$19.99 to $27.99")
    assert parse_pricing("$1,299.00") == ([1299.0], "$1299.0")
    assert parse_pricing("$1 - $2 - $3") == ([1.0, 2.0], "$1.0 to $2.0")
    assert parse_pricing("") == ([100.0], "$100.0")
    assert parse_pricing(None) == ([100.0], "$100.0")


@pytest.mark.skipif(not SHARED.is_dir(), reason="research data ../shared/data/webshop not present")
def test_cross_check_with_research_data():
    """Our processed products and search texts equal WebShop's own (documents_1k.jsonl)."""
    cat = load_world().catalog
    docs = [json.loads(line) for line in (SHARED / "documents_1k.jsonl").read_text().splitlines()]
    assert [d["id"] for d in docs] == [p.asin for p in cat.products]
    for p, d in zip(cat.products, docs):
        q = d["product"]
        assert search_contents(p) == d["contents"], p.asin
        assert (p.title, p.description, p.bullet_points, p.price_tag, p.pricing, p.options, p.attributes, p.category,
                p.query, p.product_category) == (
            q["Title"], q["Description"], q["BulletPoints"], q["Price"], q["pricing"], q["options"], q["Attributes"],
            q["category"], q["query"], q["product_category"]), p.asin
    for name in (wsdata.PRODUCTS_FILE, wsdata.ATTRIBUTES_FILE, wsdata.HUMAN_FILE, wsdata.NOUNS_FILE):
        assert wsdata.read_bytes(wsdata.shipped_data_dir(), name) == (SHARED / name).read_bytes()
