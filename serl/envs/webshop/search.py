"""WebShop's search engine: Lucene/Anserini BM25 over the product documents, in numpy.

WebShop answers ``search[q]`` with Anserini's ``LuceneSearcher.search(q, k=50)`` over an index of
one document per product (``princeton-nlp/WebShop@64fa2a5:search_engine/``). This module reproduces that ranking without Java:

* **Documents.** ``contents = lower(Title + ' ' + Description + ' ' + BulletPoints[0] + ' ' +
  option_text)`` (:func:`serl.envs.webshop.catalog.search_contents`), analysed by
  :func:`serl.envs.webshop.analysis.analyze`.
* **Query.** Bag of words: every distinct query term is one SHOULD clause boosted by its count
  (Anserini's ``BagOfWordsQueryGenerator``); terms absent from the index add nothing.
* **Scoring** (Lucene 9 ``BM25Similarity``, k1 = 0.9, b = 0.4, all in float32 as Lucene does)::

      idf(t)     = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
      norm(d)    = decode(encode(|d|))        # |d| = number of terms; 1-byte SmallFloat.intToByte4
      inv(d)     = 1 / (k1 * ((1 - b) + b * norm(d) / avgdl)),   avgdl = Σ|d| / N (exact)
      s(t, d)    = w - w / (1 + tf(t, d) * inv(d)),   w = count_q(t) * idf(t)
      score(d)   = float32(Σ_t s(t, d))       # summed in double, as Lucene's disjunction scorers

  Lucene 8+ dropped the constant (k1 + 1) factor; it does not change the ranking.
* **Ranking.** Matching documents sorted by score (descending), ties by asin (ascending), the
  first ``k`` (WebShop: 50) returned.

``bm25s`` (``method="lucene"``) was measured at 0.991 top-10 overlap and only 62 % identical
top-10 order against Anserini on this corpus: it scores with exact document
lengths, and its public API offers no way to use Lucene's quantised norms. The ~40 lines of numpy
below score exactly as Lucene does; the analysis rests on ``regex`` (UAX#29) and ``nltk``
(Porter).

Parity with real Anserini 0.22.1 results on 2539 queries (``tests/fixtures``): the top-50 lists
are identical (same documents, same order) for all 2539, and all 123,810 reported scores are
reproduced to Anserini's 4 decimals. The corpus has Anserini's 107,608 terms (:mod:`.analysis`).

The index is built once per process and data version and cached on disk (``.npz``, atomic
write) under ``$SERL_CACHE_DIR/webshop`` (default ``~/.cache/serl/webshop``); set
``SERL_WEBSHOP_NO_CACHE=1`` to skip the disk cache. A query takes ~0.1 ms.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from serl.envs.webshop import analysis

#: Anserini / Lucene BM25 defaults used by WebShop
K1 = 0.9
B = 0.4
#: results per search in WebShop (``SEARCH_RETURN_N``)
TOP_K = 50
#: bump when the analysis or index layout changes (invalidates cached indexes)
INDEX_VERSION = 6


# ------------------------------------------------------------------------------------------
# Lucene's SmallFloat norm encoding (org.apache.lucene.util.SmallFloat, Lucene 9)
# ------------------------------------------------------------------------------------------
def _long_to_int4(i: int) -> int:
    """Float-like encoding of a non-negative int keeping 4 significant bits."""
    nbits = i.bit_length()
    if nbits < 4:
        return i
    shift = nbits - 4
    encoded = (i >> shift) & 0x07
    return encoded | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits = i & 0x07
    shift = (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


_MAX_INT4 = _long_to_int4(2**31 - 1)
_NUM_FREE_VALUES = 255 - _MAX_INT4  # = 24: lengths below this are stored exactly


def int_to_byte4(length: int) -> int:
    """``SmallFloat.intToByte4``: a document length (terms) to its 1-byte norm (0..255)."""
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if length < _NUM_FREE_VALUES:
        return length
    return _NUM_FREE_VALUES + _long_to_int4(length - _NUM_FREE_VALUES)


def byte4_to_int(b: int) -> int:
    """``SmallFloat.byte4ToInt``: the document length a norm byte stands for."""
    if b < _NUM_FREE_VALUES:
        return b
    return _NUM_FREE_VALUES + _int4_to_long(b - _NUM_FREE_VALUES)


#: decoded length of every norm byte (Lucene's ``BM25Similarity.LENGTH_TABLE``)
LENGTH_TABLE = np.array([byte4_to_int(i) for i in range(256)], dtype=np.float32)


# ------------------------------------------------------------------------------------------
class SearchIndex:
    """An in-memory BM25 index over product documents.

    Args:
        doc_ids: the asin of each document, in index order.
        contents: the text of each document (already lower-cased, as WebShop indexes it).
        cache_dir: where to cache the built index; None = the default (see module docstring);
            ``False`` = no disk cache.

    Attributes:
        doc_ids: asins in index order.
        num_docs: N.
        avgdl: average document length in terms (float32, as Lucene computes it).
    """

    def __init__(self, doc_ids: Sequence[str], contents: Sequence[str], cache_dir: str | os.PathLike | None | bool = None):
        if len(doc_ids) != len(contents):
            raise ValueError(f"{len(doc_ids)} doc ids but {len(contents)} documents")
        if len(set(doc_ids)) != len(doc_ids):
            raise ValueError("document ids must be unique")
        self.doc_ids = list(doc_ids)
        self.num_docs = len(doc_ids)
        key = hashlib.sha256(
            f"v{INDEX_VERSION}\x00".encode() + "\x00".join(f"{i}\x01{c}" for i, c in zip(doc_ids, contents)).encode()
        ).hexdigest()[:24]
        path = _cache_path(cache_dir, key)
        if path is not None and path.is_file():
            try:
                self._load(path)
                return
            except (OSError, ValueError, KeyError) as e:  # a damaged cache file: rebuild it
                import logging

                logging.getLogger(__name__).warning("ignoring unreadable WebShop index cache %s (%s); rebuilding", path, e)
        self._build(contents)
        if path is not None:
            self._save(path)

    # -- building ------------------------------------------------------------------------
    def _build(self, contents: Sequence[str]) -> None:
        postings: dict[str, dict[int, int]] = {}
        lengths = np.zeros(self.num_docs, dtype=np.int64)
        for d, text in enumerate(contents):
            terms = analysis.analyze(text)
            lengths[d] = len(terms)
            for t in terms:
                row = postings.setdefault(t, {})
                row[d] = row.get(d, 0) + 1
        vocab = sorted(postings)
        ptr = np.zeros(len(vocab) + 1, dtype=np.int64)
        docs, tfs = [], []
        for i, t in enumerate(vocab):
            row = postings[t]
            ds = sorted(row)
            docs.extend(ds)
            tfs.extend(row[d] for d in ds)
            ptr[i + 1] = len(docs)
        self._set(vocab, ptr, np.asarray(docs, dtype=np.int32), np.asarray(tfs, dtype=np.float32), lengths,
                  dict(analysis.stem_cache()))

    def _set(self, vocab, ptr, post_docs, post_tf, lengths, stems) -> None:
        self.vocab = {t: i for i, t in enumerate(vocab)}
        self._vocab_list = list(vocab)
        self._ptr = ptr
        self._post_docs = post_docs
        self._post_tf = post_tf
        self.lengths = lengths
        self._stems = stems
        analysis.preload_stems(stems)
        n = np.float64(self.num_docs)
        df = np.diff(ptr).astype(np.float64)
        # idf in double, stored as float (Lucene: (float) Math.log(1 + (N - df + 0.5D) / (df + 0.5D)))
        self._idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5)).astype(np.float32)
        # avgdl = (float) (sumTotalTermFreq / (double) docCount)
        self.avgdl = np.float32(lengths.sum() / n) if self.num_docs else np.float32(1.0)
        norms = np.array([int_to_byte4(int(x)) for x in lengths], dtype=np.int64)
        k1, b = np.float32(K1), np.float32(B)
        one = np.float32(1.0)
        # cache[i] = 1f / (k1 * ((1 - b) + b * LENGTH_TABLE[i] / avgdl)), float arithmetic
        cache = one / (k1 * ((one - b) + b * LENGTH_TABLE / self.avgdl))
        inv = cache[norms].astype(np.float32)
        # freq * normInverse per posting (float32 product, as in BM25Scorer.score)
        self._post_fn = (self._post_tf * inv[self._post_docs]).astype(np.float32)
        # the contribution of a term that occurs once in the query (boost 1), precomputed with
        # Lucene's operation order: weight - weight / (1 + freq * normInverse)
        w1 = np.repeat(self._idf, np.diff(ptr))
        self._post_s1 = (w1 - w1 / (one + self._post_fn)).astype(np.float32)
        # asin order for tie-breaking
        order = sorted(range(self.num_docs), key=lambda i: self.doc_ids[i])
        self._asin_rank = np.empty(self.num_docs, dtype=np.int64)
        self._asin_rank[order] = np.arange(self.num_docs)

    # -- disk cache ----------------------------------------------------------------------
    def _save(self, path: Path) -> None:
        stems = self._stems
        keys = list(stems)
        blob = dict(
            vocab=np.frombuffer("\n".join(self._vocab_list).encode("utf-8"), dtype=np.uint8),
            ptr=self._ptr, post_docs=self._post_docs, post_tf=self._post_tf, lengths=self.lengths,
            stem_keys=np.frombuffer("\n".join(keys).encode("utf-8"), dtype=np.uint8),
            stem_vals=np.frombuffer("\n".join(stems[k] for k in keys).encode("utf-8"), dtype=np.uint8),
            num_docs=np.int64(self.num_docs),
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    np.savez(f, **blob)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as e:  # a read-only home is not an error: the index simply is not cached
            import logging

            logging.getLogger(__name__).info("could not cache the WebShop index at %s: %s", path, e)

    def _load(self, path: Path) -> None:
        with np.load(path, allow_pickle=False) as z:
            if int(z["num_docs"]) != self.num_docs:
                raise ValueError("document count differs")

            def _lines(a):
                s = a.tobytes().decode("utf-8")
                return s.split("\n") if s else []

            vocab = _lines(z["vocab"])
            keys, vals = _lines(z["stem_keys"]), _lines(z["stem_vals"])
            if len(keys) != len(vals) or len(vocab) + 1 != len(z["ptr"]):
                raise ValueError("inconsistent arrays")
            self._set(vocab, z["ptr"], z["post_docs"], z["post_tf"], z["lengths"], dict(zip(keys, vals)))

    # -- querying ------------------------------------------------------------------------
    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """The matching documents of ``query`` and their float32 BM25 scores (unsorted).

        Returns:
            ``(doc_indices, scores)``; empty arrays when no query term is in the index.
        """
        counts: dict[int, int] = {}
        for t in analysis.analyze(query):
            i = self.vocab.get(t)
            if i is not None:
                counts[i] = counts.get(i, 0) + 1
        if not counts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        acc = np.zeros(self.num_docs, dtype=np.float64)
        hit = np.zeros(self.num_docs, dtype=bool)
        for i, c in counts.items():
            lo, hi = self._ptr[i], self._ptr[i + 1]
            docs = self._post_docs[lo:hi]
            if c == 1:
                s = self._post_s1[lo:hi]
            else:
                w = np.float32(c) * self._idf[i]
                s = w - w / (np.float32(1.0) + self._post_fn[lo:hi])  # float32 throughout
            acc[docs] += s
            hit[docs] = True
        idx = np.flatnonzero(hit)
        return idx, acc[idx].astype(np.float32)

    def search(self, query: str, k: int = TOP_K) -> list[str]:
        """The asins of the top ``k`` documents for ``query`` (score desc, asin asc)."""
        return [self.doc_ids[i] for i in self.search_indices(query, k)[0]]

    def search_indices(self, query: str, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`search`, returning ``(doc_indices, scores)`` in rank order."""
        idx, sc = self.scores(query)
        if len(idx) > k:
            # keep every document scoring at least the k-th best (ties at the cut survive)
            kth = np.partition(sc, len(sc) - k)[len(sc) - k]
            keep = sc >= kth
            idx, sc = idx[keep], sc[keep]
        if len(idx) == 0:
            return idx, sc
        order = np.lexsort((self._asin_rank[idx], -sc))[:k]
        return idx[order], sc[order]


def default_cache_dir() -> Path:
    """``$SERL_CACHE_DIR/webshop`` or ``~/.cache/serl/webshop``."""
    root = os.environ.get("SERL_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "serl") / "webshop"


def _cache_path(cache_dir, key: str) -> Path | None:
    if cache_dir is False or os.environ.get("SERL_WEBSHOP_NO_CACHE", "") not in ("", "0"):
        return None
    base = default_cache_dir() if cache_dir in (None, True) else Path(cache_dir).expanduser()
    return base / f"bm25-index-{key}.npz"
