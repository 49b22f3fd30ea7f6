"""Statistics and readers shared by the learning legs' reports (``learning_report.py``, which
writes every leg's report, and ``learning_math_report.py``, the math leg's sections) and by
``credit_assignment.py`` (:func:`auc`, :func:`cluster_bootstrap`).

The readers take the work folder of ``experiments/learning.py``: ``eval/<policy>/it<NNN>_<label>/``
(``metrics.json``, ``tasks.jsonl``: one panel evaluation of ``serl eval``; ``label`` is the split,
or for math ``<split>_greedy`` / ``<split>_avg<k>``) and ``rl/<algo>_s<seed>/metrics.jsonl`` (one
``serl train`` run). Imports nothing but the standard library (and numpy inside :func:`auc`).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any


# ---------------------------------------------------------------------------- statistics
def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing moving average: element i is the mean of ``values[max(0, i-window+1) : i+1]``
    (the first ``window - 1`` points average what exists). Raises ``ValueError`` for ``window < 1``."""
    if window < 1:
        raise ValueError(f"moving_average: window must be >= 1, got {window}")
    return [statistics.fmean(values[max(0, i - window + 1): i + 1]) for i in range(len(values))]


def seed_band(per_seed: dict[int, list[float]]) -> tuple[list[float], list[float], list[float], list[int]]:
    """Mean, min and max over seeds at each position, and how many seeds have it: ``per_seed`` maps a
    seed to its curve (curves of different lengths: a position uses the seeds that reach it)."""
    n = max((len(v) for v in per_seed.values()), default=0)
    mean, lo, hi, count = [], [], [], []
    for i in range(n):
        vals = [v[i] for v in per_seed.values() if i < len(v)]
        mean.append(statistics.fmean(vals))
        lo.append(min(vals))
        hi.append(max(vals))
        count.append(len(vals))
    return mean, lo, hi, count


def mean_std(values: list[float], digits: int = 3) -> str:
    """``"0.250 ± 0.050 (n=3)"``: mean and sample std over seeds (std 0 for one value); ``—`` for none."""
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f} (n={len(values)})"


_TIE = 1e-12  # statistics equal up to float rounding count as "at least as extreme"


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided sign-flip (one-sample permutation) test of mean 0: the share of the 2^n
    sign assignments of ``diffs`` whose |mean| is at least the observed |mean| (Fisher 1935; Good,
    *Permutation Tests*, 2nd ed., §3.1). With n values the smallest possible p is 2 / 2^n (0.25 for
    3 seeds). Raises ``ValueError`` for no values or more than 20 (2^20 assignments)."""
    n = len(diffs)
    if not 1 <= n <= 20:
        raise ValueError(f"sign_flip_p: needs 1..20 values, got {n}")
    obs = abs(sum(diffs))
    hits = sum(abs(sum(s * d for s, d in zip(signs, diffs))) >= obs - _TIE
               for signs in itertools.product((1, -1), repeat=n))
    return hits / 2 ** n


def permutation_p(a: list[float], b: list[float]) -> float:
    """Exact two-sided two-sample permutation test of equal means: the share of the C(n_a + n_b,
    n_a) splits of the pooled values into groups of sizes n_a and n_b whose |mean difference| is at
    least the observed one (Good, *Permutation Tests*, §3.2). 3 vs 3 seeds: smallest p = 2/20 = 0.1.
    Raises ``ValueError`` when a group is empty or there are more than 20 values."""
    if not a or not b or len(a) + len(b) > 20:
        raise ValueError(f"permutation_p: needs two non-empty groups of 20 values at most, got {len(a)} and {len(b)}")
    pooled, k = a + b, len(a)
    total = sum(pooled)

    def gap(group_sum: float) -> float:
        return abs(group_sum / k - (total - group_sum) / (len(pooled) - k))

    obs = gap(sum(a))
    splits = list(itertools.combinations(range(len(pooled)), k))
    return sum(gap(sum(pooled[i] for i in idx)) >= obs - _TIE for idx in splits) / len(splits)


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar test on paired right/wrong outcomes: ``b`` pairs where only the first
    policy is right, ``c`` where only the second is; p = min(1, 2 · P[Binomial(b + c, 1/2) ≤ min(b, c)])
    (McNemar 1947, the exact binomial form). 1.0 when there is no discordant pair. Raises
    ``ValueError`` for a negative count."""
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_p: counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_counts_p(nets: list[int]) -> float:
    """Exact two-sided sign-flip test of several runs' paired outcomes against one shared start,
    with the task as the unit: ``nets[i]`` = runs that win task i where the start lost, minus runs
    that lose it where the start won. p = P(|Σ sᵢ·nets[i]| ≥ |Σ nets[i]|) over independent fair
    signs sᵢ, by exact convolution of the integer sums. Runs that share the start's answers are
    not independent pairs, so McNemar on their pooled counts overstates the evidence; this test
    lets a task that moves in every run count once with its weight. With one run (every net
    ±1 or 0) it equals :func:`mcnemar_p`. The one-sample sign-flip test of Fisher 1935 (Good,
    *Permutation Tests*, 2nd ed., §3.1) on the tasks' nets, exact at any number of tasks.
    Raises ``ValueError`` for a non-integer value."""
    if any(not isinstance(n, int) for n in nets):
        raise ValueError(f"paired_counts_p: needs integer nets, got {nets}")
    weights = [abs(n) for n in nets if n]
    obs = abs(sum(nets))
    if obs == 0:
        return 1.0
    dist = {0: 1}  # sum -> number of sign vectors reaching it
    for w in weights:
        nxt: dict[int, int] = {}
        for s, k in dist.items():
            nxt[s + w] = nxt.get(s + w, 0) + k
            nxt[s - w] = nxt.get(s - w, 0) + k
        dist = nxt
    return sum(k for s, k in dist.items() if abs(s) >= obs) / 2 ** len(weights)


#: SERL's weight metrics (arXiv 2605.19447; :func:`serl.algos.selective_weights.serl_token_weights`)
SERL_KEYS = ("weight_mean", "weight_min", "weight_max", "delta_abs_mean", "clipped_fraction")


def serl_weight_stats(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """SERL's token weights W over the training iterations ``rows`` (``metrics.jsonl`` lines) whose
    teacher scored tokens: ``{"iterations": n, "weight_mean", "weight_min", "weight_max",
    "delta_abs_mean" (mean |log-prob gap| in nats), "clipped_fraction"}``, or None when no
    iteration was scored.

    An iteration's ``serl_action_mask/*`` values are means over its micro-batches. One whose teacher
    scored no row logs ``empty_target_batch`` 1 and ``weight_mean`` 1 (docs/serl_modes.md) and no
    other key, so an iteration counts as scored when its ``empty_target_batch`` e < 1, and its W
    mean over the scored micro-batches is (``weight_mean`` − e) / (1 − e); min, max, |Δ| and the
    clipped share already are."""
    scored = [x for x in rows
              if x.get("serl_action_mask/empty_target_batch", 1.0) < 1.0 and "serl_action_mask/weight_min" in x]
    if not scored:
        return None
    sk = {k: [x[f"serl_action_mask/{k}"] for x in scored if f"serl_action_mask/{k}" in x] for k in SERL_KEYS}
    return {"iterations": len(scored),
            "weight_mean": statistics.fmean((x["serl_action_mask/weight_mean"] - e) / (1.0 - e) for x in scored
                                            for e in [x["serl_action_mask/empty_target_batch"]]),
            "weight_min": min(sk["weight_min"]), "weight_max": max(sk["weight_max"]),
            "delta_abs_mean": statistics.fmean(sk["delta_abs_mean"]),
            "clipped_fraction": statistics.fmean(sk["clipped_fraction"])}


# ---------------------------------------------------------------------------- reading the work folder
def load_panel(workdir: Path) -> dict[tuple[str, int, str], dict[str, Any]]:
    """``{(policy, iteration, label): metrics.json}`` of every finished panel evaluation."""
    out = {}
    for f in sorted((workdir / "eval").glob("*/it*_*/metrics.json")):
        it, label = f.parent.name[2:].split("_", 1)
        out[(f.parent.parent.name, int(it), label)] = json.loads(f.read_text())
    return out


def panel_won(workdir: Path, policy: str, iteration: int, label: str) -> dict[str, bool]:
    """``{task_id: won}`` of one greedy panel evaluation (its ``tasks.jsonl``, one line per problem);
    empty when it is not there."""
    f = workdir / "eval" / policy / f"it{iteration:03d}_{label}" / "tasks.jsonl"
    if not f.exists():
        return {}
    rows = [json.loads(x) for x in f.read_text().split("\n") if x.strip()]
    return {str(r["task_id"]): bool(r["won"]) for r in rows}


def load_train(workdir: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """``{run name: {iteration: metrics}}`` of every RL run (``rl/*/metrics.jsonl``)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for f in sorted((workdir / "rl").glob("*/metrics.jsonl")):
        by_it: dict[int, dict[str, Any]] = {}
        for line in f.read_text().split("\n"):
            if line.strip():
                r = json.loads(line)
                by_it.setdefault(int(r.get("iteration", r.get("step", 0))), {}).update(r)  # val/ lines merge in
        out[f.parent.name] = by_it
    return out


def run_ends(evals, runs: list[str], labels: list[str]) -> dict[str, int]:
    """``{run: iteration}``: each run's last iteration evaluated on every panel of ``labels`` (a
    run stopped early, by ``--train-seconds`` or by the end of a session, ends where its last
    complete panel is); runs with no such iteration are left out. The SFT start (iteration 0 of
    policy ``sft``) is not a run. Whether a run *finished* (reached ``--iterations``) is the
    caller's rule: the math report counts only finished runs unless ``--train-seconds`` capped them."""
    out = {}
    for run in runs:
        its = [it for (p, it, _l) in evals if p == run and all((run, it, x) in evals for x in labels)]
        if its:
            out[run] = max(its)
    return out


def auc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve of ``scores`` for the positive ``labels``: the probability that a
    random positive scores above a random negative, ties counting one half (the Mann–Whitney U
    statistic over n₊·n₋; Hanley & McNeil 1982). NaN when either class is empty."""
    import numpy as np

    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    mid_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based average rank of each distinct value
    rank_sum = mid_rank[inverse][y].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def cluster_bootstrap(stat, clusters: list[list[Any]], draws: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of ``stat(items)`` when whole ``clusters`` of items (e.g. the steps of
    one episode) are resampled with replacement ``draws`` times (Efron & Tibshirani 1993, §6;
    resampling clusters keeps the steps of an episode together). Draws where ``stat`` is NaN are
    dropped; ``(nan, nan)`` when all are."""
    import math
    import random

    rng = random.Random(seed)
    vals = []
    for _ in range(draws):
        items = [x for c in rng.choices(clusters, k=len(clusters)) for x in c]
        v = stat(items)
        if not math.isnan(v):
            vals.append(v)
    if not vals:
        return float("nan"), float("nan")
    vals.sort()
    lo = vals[int((1 - level) / 2 * (len(vals) - 1))]
    hi = vals[int((1 + level) / 2 * (len(vals) - 1))]
    return lo, hi
