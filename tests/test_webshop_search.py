"""WebShop search: the Lucene-twin analyzer, SmallFloat norms, BM25 ranking, and parity with Anserini."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serl.envs.webshop import load_world
from serl.envs.webshop.analysis import analyze, lucene_lower, tokenize
from serl.envs.webshop.data import read_jsonl
from serl.envs.webshop.search import SearchIndex, byte4_to_int, int_to_byte4

FIXTURES = Path(__file__).parent / "fixtures"


def test_tokenizer_uax29_joins_and_splits():
    assert tokenize("material:solid 3.1 1,299.99 d.o.n clip-in") == ["material:solid", "3.1", "1,299.99", "d.o.n", "clip", "in"]
    assert tokenize("foo_bar -- ,,, x²") == ["foo_bar", "x"]  # punctuation and ² make no token
    # Lucene 9.5's emoji data: every Extended_Pictographic character is a token, ★ and ☞ included
    assert tokenize("★★ ☞ ™ 😀 ❤️") == ["★", "★", "☞", "™", "😀", "❤️"]
    assert tokenize("日本 カタカナ") == ["日", "本", "カタカナ"]
    assert tokenize("made in 🇺🇸") == ["made", "in", "🇺🇸"]  # a flag (regional-indicator pair) is one emoji token
    assert tokenize("a" * 300) == ["a" * 255, "a" * 45]


def test_analyzer_chain():
    # possessive removal, 33 stop words, Porter (Martin variant: 'technology' -> 'technolog', 'us' kept)
    assert analyze("It's the Women's printing technology for the US assembly") == [
        "women", "print", "technolog", "us", "assembl"]
    assert analyze("the and of") == []
    assert analyze("Running pillows, caresses & ponies") == ["run", "pillow", "caress", "poni"]


def test_smallfloat_norms_match_lucene():
    # lengths below 24 are exact; above, 4 significant bits (Lucene's SmallFloat.intToByte4)
    assert [int_to_byte4(i) for i in (0, 1, 23, 24, 25)] == [0, 1, 23, 24, 25]
    assert byte4_to_int(int_to_byte4(81)) == 80 and byte4_to_int(int_to_byte4(83)) == 80
    assert byte4_to_int(int_to_byte4(87)) == 84 and byte4_to_int(int_to_byte4(88)) == 88
    assert byte4_to_int(255) == 2013265944  # the largest representable length
    for n in (0, 5, 30, 100, 1000, 10**6):
        assert byte4_to_int(int_to_byte4(n)) <= n  # decoding rounds down
    assert all(int_to_byte4(n) <= int_to_byte4(n + 1) for n in range(5000))  # monotone


def test_ranking_ties_by_asin_and_bag_of_words_boost():
    ids = ["B3", "B1", "B2", "B4"]
    docs = ["red shirt", "red shirt", "red shirt", "blue shirt shirt"]
    idx = SearchIndex(ids, docs, cache_dir=False)
    assert idx.search("red") == ["B1", "B2", "B3"]  # equal scores: asin order, not index order
    assert idx.search("red", k=2) == ["B1", "B2"]
    assert idx.search("green") == []  # no matching term: no results
    _, s1 = idx.search_indices("shirt")
    _, s2 = idx.search_indices("shirt shirt")
    assert np.allclose(s2, 2 * s1, rtol=1e-6)  # a repeated term is one clause boosted by its count
    assert idx.search("shirt")[0] == "B4"  # higher tf wins


def test_index_cache_roundtrip(tmp_path):
    ids = ["A", "B"]
    docs = ["solid wood console table", "wooden tables for the living room"]
    built = SearchIndex(ids, docs, cache_dir=tmp_path)
    files = list(tmp_path.glob("bm25-index-*.npz"))
    assert len(files) == 1
    loaded = SearchIndex(ids, docs, cache_dir=tmp_path)
    for q in ("wood table", "living room", "console"):
        a, sa = built.search_indices(q)
        b, sb = loaded.search_indices(q)
        assert a.tolist() == b.tolist() and np.array_equal(sa, sb)
    files[0].write_bytes(b"garbage")  # a damaged cache is rebuilt, not fatal
    assert SearchIndex(ids, docs, cache_dir=tmp_path).search("wood table") == built.search("wood table")


def test_top10_parity_with_anserini_over_all_2539_queries():
    """Top-10 overlap with real Anserini 0.22.1 results must be >= 0.99 (we reach 1.0)."""
    fx = read_jsonl(FIXTURES / "webshop_search_anserini_top50.jsonl.xz")
    assert len(fx) == 2539
    index = load_world().index
    overlap = same_top10 = same_top50 = 0
    for f in fx:
        got = index.search(f["query"], 50)
        want = f["top50"]
        overlap += len(set(got[:10]) & set(want[:10])) / max(1, min(10, len(want)))
        same_top10 += got[:10] == want[:10]
        same_top50 += got == want
    n = len(fx)
    assert overlap / n >= 0.99
    assert same_top10 / n >= 0.99
    assert same_top50 / n >= 0.99  # search latency: benchmarks/bench_webshop.py, not a bound sized for one CPU


def test_scores_match_anserini_to_4_decimals():
    """Every reported Anserini score of all 2539 queries is reproduced to its 4 decimals, and every
    top-50 list is identical (before the leading-apostrophe fix, 5.3% of the scores differed at the
    4th decimal and 2 top-50 lists swapped two near-tied documents)."""
    fx = read_jsonl(FIXTURES / "webshop_search_anserini_top50.jsonl.xz")
    index = load_world().index
    pos = {a: i for i, a in enumerate(index.doc_ids)}
    differ = total = 0
    for f in fx:
        idx, sc = index.scores(f["query"])
        m = dict(zip(idx.tolist(), sc.tolist()))
        for asin, want in zip(f["top50"], f["scores"]):
            total += 1
            differ += round(m[pos[asin]], 4) != round(want, 4)
        assert index.search(f["query"], 50) == f["top50"], f["query"]
    assert total == 123810 and differ == 0


def test_corpus_has_anserinis_term_count():
    """Anserini's analyzer (run on the JVM) gives 107,608 terms for the 1000 documents; serl once had
    one more: ``regex`` kept the leading apostrophe of `` 'is`` in asin B07YN72RH4 ("asked me 'is it
    supposed to ..."), giving the term ``'i`` where Lucene drops the stop word ``is``."""
    index = load_world().index
    assert int(index.lengths.sum()) == 107608
    assert int(index.lengths[index.doc_ids.index("B07YN72RH4")]) == 256
    assert "'i" not in index.vocab and "'em" not in index.vocab
    # the tokens Anserini gives for these cases
    assert tokenize("asked me 'is it") == ["asked", "me", "is", "it"]
    assert analyze("asked me 'is it") == ["ask", "me"]
    assert tokenize("beat 'em, join \u2019em. kids 'energyso") == ["beat", "em", "join", "em", "kids", "energyso"]
    assert tokenize("cats' toys 'b' don't") == ["cats", "toys", "b", "don't"]


def test_lowercasing_is_lucenes_per_code_point():
    """Lucene's LowerCaseFilter is Java's Character.toLowerCase per code point (verified on the JVM
    with Anserini's analyzer): U+0130 gives "i" (Python's str.lower gives "i" + U+0307) and a final
    capital sigma gives "σ" (Python: "ς")."""
    assert "İ".lower() == "i\u0307" and lucene_lower("İ") == "i"
    assert lucene_lower("ΣΟΦΟΣ") == "σοφοσ" and "ΣΟΦΟΣ".lower() == "σοφος"
    assert lucene_lower("Mixed CASE ascii") == "mixed case ascii"
    assert analyze("İSTANBUL ΟΔΟΣ İs İT") == ["istanbul", "οδοσ"]  # "is", "it" are stop words once lowered
    assert analyze("The İİ KİTAP's") == ["ii", "kitap"]
