"""Evaluation metrics for n sampled answers per problem (math with a code interpreter).

SPEAR validates with verl's protocol: ``process_validation_metrics`` in
``volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7:verl/trainer/ppo/metric_utils.py``
(with ``bootstrap_metric`` and ``calc_maj_val`` there). This module reimplements its semantics,
vectorized, and adds the unbiased pass@k estimator of Chen et al. 2021 (arXiv 2107.03374, eq. 1).

Per problem, with its n samples (``correct`` as 0/1, ``pred`` the extracted answer):

- ``mean@n``: the share of correct samples (n = 1, greedy: the accuracy); ``std@n`` (n > 1
  only): their population standard deviation (``np.std``, ddof = 0).
- For each k in :func:`bootstrap_ks` (2, 4, 8, ... below n, then n itself; none for n = 1):
  ``best@k/mean`` and ``best@k/std``: the mean and std over ``n_bootstrap`` = 1000 bootstrap
  subsets of k samples of "some sample in the subset is correct"; ``worst@k/...``: of "every
  sample in the subset is correct"; ``maj@k/...``: of "the majority answer of the subset is
  correct" (:func:`majority_vote`).
- ``pass@k`` for the same k: :func:`pass_at_k` (exact, no sampling noise; ours, not verl's).

Then each key is averaged over the problems (verl: per data source; see
:func:`aggregate_sample_metrics` for the key names).

verl's bootstrap, reproduced exactly, with its surprises:

- The k samples of a subset are drawn uniformly *with replacement* from the n, by
  ``np.random.seed(42)`` then ``np.random.choice(n, size=(1000, k), replace=True)`` (here the
  same legacy generator, ``np.random.RandomState(42)``, without touching numpy's global state,
  so the draws are bit-identical). So ``best@n`` is *not* "any of the n samples is correct":
  with c of n correct its expectation is 1 - (1 - c/n)^n (0.684 for c = 1, n = 4), where the
  exact pass@n is 1. Use ``pass@k`` for the pass@k the literature means.
- The seed is reset for every call: every problem with the same n uses the *same* 1000 index
  subsets, and the best/worst and the majority bootstraps share them too. The noise is
  therefore correlated across problems rather than averaging out.
- ``best@k/std`` (and the other ``/std`` keys) is the spread of one problem's 1000 bootstrap
  values, averaged over problems: not a standard error of the reported mean.

verl's majority vote (``calc_maj_val``), reproduced: the answer with the most votes in the subset
wins; a tie goes to the tied answer seen first in the subset's (random) order; the vote scores
the correctness of the *first* sample in the subset with the winning answer (a scorer could mark
the same answer string differently, e.g. a stochastic judge). One deliberate deviation: verl
counts ``None`` (no answer could be parsed) as an answer like any other, so a subset of mostly
unparsable samples "wins" with ``None`` and scores that sample's correctness. Here ``None``
casts no vote and never wins; a subset with no parsed answer at all scores 0 (incorrect).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Optional, Sequence

import numpy as np

#: bootstrap subsets per (problem, k): verl's ``n_bootstrap``
DEFAULT_N_BOOTSTRAP = 1000
#: verl's ``seed`` of ``process_validation_metrics`` (reset for every bootstrap)
DEFAULT_SEED = 42
#: elements of the [rows, k, k] vote-comparison array built at once (bounds memory for large k)
_MAJ_CHUNK_ELEMENTS = 4_000_000

Sample = tuple[bool, Optional[str]]


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021 (arXiv 2107.03374, eq. 1): the probability that at
    least one of k samples drawn *without* replacement from n samples, c of them correct, is
    correct: ``1 - C(n-c, k) / C(n, k)``.

    Computed stably as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (the paper's numpy form: no large
    binomials), and exactly 1.0 when ``n - c < k`` (every k-subset holds a correct sample).

    Args:
        n: samples drawn for the problem (>= 1).
        c: of them correct (0 <= c <= n).
        k: the budget (1 <= k <= n).

    Returns:
        A float in [0, 1]; pass_at_k(n, c, 1) = c / n.

    Raises:
        ValueError: a non-int argument, n < 1, c outside [0, n], or k outside [1, n].
    """
    _check_int("pass_at_k: n", n, 1)
    _check_int("pass_at_k: c", c, 0)
    _check_int("pass_at_k: k", k, 1)
    if c > n:
        raise ValueError(f"pass_at_k: c={c} correct exceeds n={n} samples")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} exceeds n={n} samples (pass@k needs k <= n)")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_ks(n: int) -> list[int]:
    """The subset sizes k verl bootstraps for n samples (its ``gen_ns``): the powers of two
    2, 4, 8, ... below n, then n itself; [] for n = 1. E.g. n = 6 -> [2, 4, 6], n = 8 -> [2, 4, 8].

    Raises:
        ValueError: n is not an int >= 1.
    """
    _check_int("bootstrap_ks: n", n, 1)
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n > 1 else []


def bootstrap_indices(n: int, k: int, n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
                      seed: int = DEFAULT_SEED) -> np.ndarray:
    """verl's bootstrap subsets: ``[n_bootstrap, k]`` int indices into the n samples, drawn
    uniformly with replacement by ``np.random.RandomState(seed).choice`` (bit-identical to verl's
    ``np.random.seed(seed); np.random.choice(...)``, without touching numpy's global state).

    Raises:
        ValueError: n, k or n_bootstrap not an int >= 1, or k > n.
    """
    _check_int("bootstrap: n", n, 1)
    _check_int("bootstrap: k", k, 1)
    _check_int("bootstrap: n_bootstrap", n_bootstrap, 1)
    if k > n:
        raise ValueError(f"bootstrap: subset size k={k} exceeds n={n} samples")
    return np.random.RandomState(seed).choice(n, size=(n_bootstrap, k), replace=True)


def majority_vote(samples: Sequence[Sample]) -> bool:
    """Whether the majority answer of ``samples`` is correct (verl's ``calc_maj_val``, but
    ``None`` casts no vote).

    The answer with the most votes wins; a tie goes to the tied answer that appears first in
    ``samples``; the result is the ``correct`` of the first sample giving the winning answer.
    Samples whose ``pred`` is ``None`` (unparsable) are ignored; with no parsed answer at all the
    vote is incorrect (False). verl instead lets ``None`` win like any answer.

    Args:
        samples: ``(correct, pred)`` pairs, in order.

    Raises:
        ValueError: ``samples`` is empty.
    """
    if len(samples) == 0:
        raise ValueError("majority_vote: no samples to vote over")
    votes = Counter(pred for _, pred in samples if pred is not None)
    if not votes:
        return False
    winner = max(votes, key=votes.get)  # Counter keeps first-seen order: ties go to the earliest
    return bool(next(correct for correct, pred in samples if pred == winner))


def _bootstrap_majority(correct: np.ndarray, pred_ids: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """:func:`majority_vote` of each bootstrap subset (rows of ``idx``), vectorized: ``pred_ids``
    are the answers as ints (-1 = None). Returns ``[n_bootstrap]`` float 0/1."""
    out = np.empty(idx.shape[0], dtype=np.float64)
    k = idx.shape[1]
    step = max(1, _MAJ_CHUNK_ELEMENTS // (k * k))
    for lo in range(0, idx.shape[0], step):
        rows = idx[lo:lo + step]
        ids = pred_ids[rows]
        votes = (ids[:, :, None] == ids[:, None, :]).sum(axis=2)  # votes for each position's answer
        votes[ids < 0] = 0  # None casts no vote and cannot win
        # argmax: the first position of the most-voted answer seen earliest (verl's tie rule),
        # which is also that answer's first sample, whose correctness the vote takes
        first = votes.argmax(axis=1)
        picked = np.arange(len(rows))
        won = votes[picked, first] > 0
        out[lo:lo + step] = np.where(won, correct[rows[picked, first]], 0.0)
    return out


def _check_samples(samples: Sequence[Sample], where: str) -> None:
    if len(samples) == 0:
        raise ValueError(f"{where}: no samples")
    for j, sample in enumerate(samples):
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise ValueError(f"{where}: sample {j} must be a (correct, pred) pair, got {sample!r}")
        correct, pred = sample
        if not isinstance(correct, (bool, np.bool_)):
            raise ValueError(f"{where}: sample {j} correct must be a bool, got {type(correct).__name__} {correct!r}")
        if pred is not None and not isinstance(pred, str):
            raise ValueError(f"{where}: sample {j} pred must be a str or None, got {type(pred).__name__} {pred!r}")


def problem_metrics(samples: Sequence[Sample], n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
                    seed: int = DEFAULT_SEED) -> dict[str, float]:
    """The metrics of one problem's n samples, keyed as verl does (see the module docstring):
    ``mean@n``; for n > 1 also ``std@n`` and, for each k in :func:`bootstrap_ks` (n), ``best@k/mean``,
    ``best@k/std``, ``worst@k/mean``, ``worst@k/std``, ``maj@k/mean``, ``maj@k/std`` and ``pass@k``.

    Args:
        samples: the problem's ``(correct, pred)`` pairs; ``pred`` the extracted answer string,
            ``None`` when none could be parsed (it never wins a majority vote).
        n_bootstrap: bootstrap subsets per k (verl: 1000).
        seed: the bootstrap seed, the same for every k and every problem (verl: 42).

    Raises:
        ValueError: no samples, a malformed sample, or a bad n_bootstrap.
    """
    _check_samples(samples, "problem_metrics")
    _check_int("problem_metrics: n_bootstrap", n_bootstrap, 1)
    n = len(samples)
    correct = np.array([bool(c) for c, _ in samples], dtype=np.float64)
    out = {f"mean@{n}": float(np.mean(correct))}
    if n == 1:
        return out
    out[f"std@{n}"] = float(np.std(correct))
    answer_ids: dict[str, int] = {}
    pred_ids = np.array([-1 if p is None else answer_ids.setdefault(p, len(answer_ids)) for _, p in samples])
    c = int(correct.sum())
    for k in bootstrap_ks(n):
        idx = bootstrap_indices(n, k, n_bootstrap, seed)
        subset = correct[idx]
        for name, values in (("best", subset.max(axis=1)), ("worst", subset.min(axis=1)),
                             ("maj", _bootstrap_majority(correct, pred_ids, idx))):
            out[f"{name}@{k}/mean"] = float(np.mean(values))
            out[f"{name}@{k}/std"] = float(np.std(values))
        out[f"pass@{k}"] = pass_at_k(n, c, k)
    return out


def _check_records(records) -> int:
    """Validates the records of :func:`aggregate_sample_metrics`; returns their common n."""
    if len(records) == 0:
        raise ValueError("sample metrics: no problems (the list of records is empty)")
    seen: dict[tuple[str, object], int] = {}
    n0 = None
    for i, record in enumerate(records):
        if not isinstance(record, (tuple, list)) or len(record) != 3:
            raise ValueError(f"sample metrics: record {i} must be (problem_id, data_source, samples), "
                             f"got {record!r}")
        problem_id, source, samples = record
        if not isinstance(source, str) or not source:
            raise ValueError(f"sample metrics: record {i} (problem {problem_id!r}) data_source must be a "
                             f"non-empty str, got {source!r}")
        if (source, problem_id) in seen:
            raise ValueError(f"sample metrics: problem {problem_id!r} of {source!r} appears twice "
                             f"(records {seen[(source, problem_id)]} and {i}); give each problem one record")
        seen[(source, problem_id)] = i
        _check_samples(samples, f"sample metrics: problem {problem_id!r} ({source})")
        if n0 is None:
            n0, first = len(samples), problem_id
        elif len(samples) != n0:
            raise ValueError(f"sample metrics: every problem needs the same number of samples n, but "
                             f"problem {first!r} has {n0} and problem {problem_id!r} has {len(samples)}")
    return n0


def aggregate_sample_metrics(records: Sequence[tuple[object, str, Sequence[Sample]]], var_name: str = "acc",
                             n_bootstrap: int = DEFAULT_N_BOOTSTRAP, seed: int = DEFAULT_SEED) -> dict[str, float]:
    """:func:`problem_metrics` averaged over problems, as one flat dict.

    Keys ``<var_name>/<metric>`` (``acc/mean@4``, ``acc/best@4/mean``, ``acc/maj@4/mean``,
    ``acc/pass@4``, ...) average over all problems, each problem weighted equally. With more than
    one data source, ``<source>/<var_name>/<metric>`` also gives each source's own average (verl
    reports per source only). Greedy (n = 1): only ``acc/mean@1``, the accuracy.

    Args:
        records: one ``(problem_id, data_source, samples)`` per problem; ``samples`` its
            ``(correct: bool, pred: str | None)`` pairs, the same number n for every problem.
        var_name: the name of the scored variable in the keys.
        n_bootstrap, seed: as in :func:`problem_metrics`.

    Returns:
        ``{key: float}``, keys sorted by source (the pooled keys first).

    Raises:
        ValueError: no records, a malformed record or sample, a problem with no samples, a
            problem id repeated within a source, or problems with different n.
    """
    _check_records(records)
    by_source: dict[str, list[dict[str, float]]] = {}
    for _, source, samples in records:
        by_source.setdefault(source, []).append(problem_metrics(samples, n_bootstrap, seed))
    groups = [("", [m for ms in by_source.values() for m in ms])]
    if len(by_source) > 1:
        groups += [(f"{source}/", by_source[source]) for source in sorted(by_source)]
    out: dict[str, float] = {}
    for prefix, metrics in groups:
        for key in metrics[0]:
            out[f"{prefix}{var_name}/{key}"] = float(np.mean([m[key] for m in metrics]))
    return out
