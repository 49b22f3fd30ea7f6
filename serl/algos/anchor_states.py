"""GiGPO's anchor states: rows of one task group that saw the same observation (exactly, or by a
string similarity) form one step group (GiGPO, arXiv 2505.10978 Eqs. 4, 6;
``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``). Shared by GiGPO's step advantage
(:func:`serl.algos.advantages.gigpo_advantage`) and SERL's anchor modes (:mod:`serl.hindsight.anchors`).
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional, Sequence

#: ``algorithm.gigpo.similarity_backend`` values
SIMILARITY_BACKENDS = ("rapidfuzz", "difflib")


def _similar_fn(backend: str, thresh: float) -> Callable[[str, str], bool]:
    if backend == "rapidfuzz":
        from rapidfuzz.distance import Indel

        def sim(a: str, b: str) -> bool:
            # normalized Indel similarity == rapidfuzz.fuzz.ratio / 100 == 2·LCS/(|a|+|b|)
            return Indel.normalized_similarity(a, b, score_cutoff=thresh) >= thresh

        return sim
    if backend == "difflib":
        import difflib

        def sim(a: str, b: str) -> bool:
            m = difflib.SequenceMatcher(None, a, b)
            # real_quick_ratio/quick_ratio are upper bounds of ratio(): same answer, less work
            return m.real_quick_ratio() >= thresh and m.quick_ratio() >= thresh and m.ratio() >= thresh

        return sim
    raise ValueError(f"unknown similarity backend {backend!r}; valid: {list(SIMILARITY_BACKENDS)}")


def anchor_groups(observations: Sequence[Hashable], group_index: Sequence[int], similarity_thresh: Optional[float] = None,
                  *, order: Optional[Sequence[int]] = None, backend: str = "rapidfuzz") -> list[int]:
    """Anchor-state groups: cluster rows with the same observation inside each task group
    (GiGPO, arXiv 2505.10978 Eqs. 4, 6; ``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``; the same clustering as SERL's
    anchor modes, arXiv 2605.19447).

    Exact mode (``similarity_thresh`` None): rows of one group with equal observations share a
    cluster, whatever their trajectory or step index. Any hashable observation works (strings;
    convert arrays to tuples first).

    Similarity mode (``similarity_thresh`` in (0, 1)): greedy clustering per group. Rows are
    visited in row order (GiGPO) or, with ``order`` given, sorted by ``(order[i], i)`` (SERL
    visits by ``(step_id, batch_index)``); a row joins the first cluster (creation order) whose
    representative — its first member's observation — is at least ``similarity_thresh``
    similar, else it founds a new cluster. Similarity:

    - ``backend="rapidfuzz"`` (default, ours): ``rapidfuzz.distance.Indel.normalized_similarity``
      = ``rapidfuzz.fuzz.ratio/100`` = ``2·LCS(a, b)/(|a| + |b|)`` (exact longest common
      subsequence, C speed).
    - ``backend="difflib"`` (the originals): ``difflib.SequenceMatcher(None, a, b).ratio()``
      = ``2·M/(|a| + |b|)`` with ``M`` the Ratcliff/Obershelp matching-block count (autojunk on).
      ``M <= LCS``, so rapidfuzz scores are >= difflib's: a pair near the threshold may join a
      cluster under rapidfuzz and not under difflib. Identical strings score 1.0 in both.

    Args:
        observations: ``[rows]`` raw current observations (``anchor_obs``; ``Step.observation``).
        group_index: ``[rows]`` task-group id (``uid``) of each row; clusters never cross groups.
        similarity_thresh: None = exact equality; else the threshold, strictly in (0, 1).
        order: optional ``[rows]`` visiting key for similarity mode (ties by row index).
        backend: ``rapidfuzz`` | ``difflib``.

    Returns:
        ``[rows]`` cluster ids: ints from 0, numbered in order of creation (groups by first
        appearance, then visiting order), unique across groups.

    Raises:
        ValueError: lengths differ, threshold outside (0, 1), unknown backend.
        TypeError: a non-string observation in similarity mode.
    """
    n = len(observations)
    if len(group_index) != n:
        raise ValueError(f"observations has {n} rows, group_index has {len(group_index)}")
    if order is not None and len(order) != n:
        raise ValueError(f"observations has {n} rows, order has {len(order)}")
    group_list = [int(g) for g in group_index]
    rows_by_group: dict[int, list[int]] = {}
    for r, g in enumerate(group_list):
        rows_by_group.setdefault(g, []).append(r)
    out = [-1] * n
    next_id = 0
    if similarity_thresh is None:
        for rows in rows_by_group.values():
            ids: dict[Hashable, int] = {}
            for r in rows:
                key = observations[r]
                if key not in ids:
                    ids[key] = next_id
                    next_id += 1
                out[r] = ids[key]
        return out
    if not 0.0 < similarity_thresh < 1.0:
        raise ValueError(f"similarity_thresh must be strictly inside (0, 1), got {similarity_thresh}")
    similar = _similar_fn(backend, float(similarity_thresh))
    for rows in rows_by_group.values():
        if order is not None:
            rows = sorted(rows, key=lambda r: (int(order[r]), r))
        reps: list[tuple[str, int]] = []  # (representative text, cluster id)
        exact: dict[str, int] = {}
        for r in rows:
            obs = observations[r]
            if not isinstance(obs, str):
                raise TypeError(f"similarity mode needs string observations, row {r} is {type(obs).__name__}")
            cid = exact.get(obs)
            if cid is None:
                for rep, rep_id in reps:
                    if similar(obs, rep):
                        cid = rep_id
                        break
            if cid is None:
                cid = next_id
                next_id += 1
                reps.append((obs, cid))
            # an identical string is 1.0-similar to whatever it was compared with, so it lands in
            # the same first matching cluster: memoising it changes nothing but the speed
            exact.setdefault(obs, cid)
            out[r] = cid
    return out


def anchor_group_sizes(anchor_index: Sequence[int]) -> list[int]:
    """Size of every anchor group (one entry per group), for the GiGPO step-group metrics
    (share of size-1 groups, mean size; GiGPO, arXiv 2505.10978, appendix E)."""
    counts: dict[int, int] = {}
    for a in anchor_index:
        counts[int(a)] = counts.get(int(a), 0) + 1
    return list(counts.values())
