"""Dr.BoT response filters and the rollout group-std filter (SPEAR, arXiv 2509.22601).

The original computes the flags in its episode reward manager
(``TencentYoutuResearch/SPEAR@7e84315:verl-agent/agent_system/reward_manager/episode.py``)
and filters groups in the trainer's ``_filter_rollout``; the Dr.BoT scripts
(``TencentYoutuResearch/SPEAR@7e84315:verl-agent/examples/grpo_trainer/run_alfworld_drbot.sh``)
turn all of them on.

The four response filters *mask* a step row (its whole ``response_mask`` becomes 0: it stays
in the batch, counts in the group statistics, gets advantage 0 and contributes no loss); the
std filter *drops* whole groups and then trims the batch to a power of two. The flags are
computed on what the policy actually sampled: the response token ids (repetitive, overlong)
and their decoded text (incomplete, unreadable).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import torch

from serl.errors import ConfigError

if TYPE_CHECKING:
    from serl.config import AlgorithmConfig, RolloutConfig

RESPONSE_FILTERS = ("overlong", "incomplete", "repetitive", "unreadable")
ROLLOUT_FILTER_TYPES = ("std", "std_rev")

#: Substrings marking a broken byte-level BPE decode (the "unreadable" flag): U+FFFD and
#: the UTF-8-read-as-cp1252 mojibake of U+FFFD ("ï¿½") and of the full-width "？" ("ï¼Ÿ"), as
#: listed by the original reward manager (its longer entries all contain one of these).
UNREADABLE_MARKERS = ("\ufffd", "ï¿½", "ï¼\ufffd", "ï¼Ÿ", "ï¿½ï¿½", "Ġï¿½")

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL)


def check_config(rollout: "RolloutConfig") -> None:
    """Check ``rollout.rollout_filter_type`` against :data:`ROLLOUT_FILTER_TYPES` (the Dr.BoT group
    std filter this module implements). Called by :func:`serl.configure.check_config`.

    Raises:
        ConfigError: ``"rollout.rollout_filter_type: unknown type ...; valid: [...]"``.
    """
    t = rollout.rollout_filter_type
    if t not in ROLLOUT_FILTER_TYPES:
        raise ConfigError(f"rollout.rollout_filter_type: unknown type {t!r}; valid: {list(ROLLOUT_FILTER_TYPES)}")


def largest_power_of_two_le(n: int) -> int:
    """Largest power of two ``<= n`` (1 for n = 1); 0 for ``n <= 0``."""
    if n <= 0:
        return 0
    return 1 << (int(n).bit_length() - 1)


# --------------------------------------------------------------------------------------------
# Response flags (the original's episode reward manager)
# --------------------------------------------------------------------------------------------


def is_overlong(response_length: int, max_response_length: int) -> bool:
    """True when the response hit the generation cap: ``len >= data.max_response_length``."""
    return int(response_length) >= int(max_response_length)


def is_incomplete(text: Optional[str]) -> bool:
    """"Void turn": True when the response is empty / whitespace, or when the text after the
    last ``</think>`` (the whole text if there is none) has no ``<action>…</action>`` block.
    ``<think>`` is not required, and an empty ``<action></action>`` counts as a block
    (the original's ``is_think_action_valid``)."""
    if text is None or not text.strip():
        return True
    cut = text.rfind("</think>")
    candidate = text[cut + len("</think>"):] if cut >= 0 else text
    return _ACTION_RE.search(candidate) is None


def is_repetitive(token_ids: Sequence[int], n: int = 20, threshold: int = 10) -> bool:
    """True when some ``n``-gram of *token ids* occurs at least ``threshold`` times in the
    response (the original's defaults: 20-grams, 10 times). Overlapping occurrences count."""
    ids = [int(t) for t in token_ids]
    if len(ids) < n:
        return False
    counts = Counter(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))
    return max(counts.values()) >= threshold


def is_unreadable(text: Optional[str]) -> bool:
    """True when the decoded response contains one of :data:`UNREADABLE_MARKERS`."""
    if not text:
        return False
    return any(m in text for m in UNREADABLE_MARKERS)


def response_flags(
    response_ids: Sequence[Sequence[int]],
    response_texts: Sequence[str],
    max_response_length: int,
    *,
    ngram: int = 20,
    ngram_threshold: int = 10,
) -> dict[str, torch.Tensor]:
    """The four Dr.BoT quality flags of every step row (overlong, incomplete, repetitive, unreadable).

    Args:
        response_ids: ``[rows]`` lists of the sampled response token ids (EOS included if
            sampled; ``Step.response_ids``): their length is the "valid response length".
        response_texts: ``[rows]`` the decoded responses (``Step.response_text``).
        max_response_length: ``data.max_response_length`` (tokens).
        ngram, ngram_threshold: the repetition test's n-gram size and count (20, 10).

    Returns:
        ``{"overlong", "incomplete", "repetitive", "unreadable"}`` → ``[rows]`` bool tensors.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(response_ids) != len(response_texts):
        raise ValueError(f"response_ids has {len(response_ids)} rows, response_texts has {len(response_texts)}")
    out = {
        "overlong": [is_overlong(len(ids), max_response_length) for ids in response_ids],
        "incomplete": [is_incomplete(t) for t in response_texts],
        "repetitive": [is_repetitive(ids, ngram, ngram_threshold) for ids in response_ids],
        "unreadable": [is_unreadable(t) for t in response_texts],
    }
    return {k: torch.tensor(v, dtype=torch.bool) for k, v in out.items()}


def enabled_filters(algorithm_cfg: AlgorithmConfig) -> dict[str, bool]:
    """``{"overlong": algorithm.filter_overlong_responses, ...}`` for :func:`apply_response_filters`."""
    return {name: bool(getattr(algorithm_cfg, f"filter_{name}_responses")) for name in RESPONSE_FILTERS}


def apply_response_filters(
    response_mask: torch.Tensor, flags: Mapping[str, torch.Tensor], enabled: Mapping[str, bool]
) -> tuple[torch.Tensor, dict[str, float]]:
    """Zero the whole ``response_mask`` row of every sample flagged by an enabled filter.

    Args:
        response_mask: ``[rows, resp_len]`` 0/1 (any dtype).
        flags: from :func:`response_flags`, each ``[rows]`` bool.
        enabled: filter name → on/off (:func:`enabled_filters`).

    Returns:
        ``(new_mask, metrics)``: a new tensor of the same dtype (the input is not modified);
        metrics ``filter/<name>_responses`` = rows flagged by each *enabled* filter and
        ``filter/masked_rows`` = rows masked by any.

    Raises:
        KeyError: an enabled filter has no flag; ValueError: a flag's length differs.
    """
    rows = response_mask.shape[0]
    masked = torch.zeros(rows, dtype=torch.bool, device=response_mask.device)
    metrics: dict[str, float] = {}
    for name in RESPONSE_FILTERS:
        if not enabled.get(name, False):
            continue
        f = flags[name].to(torch.bool).to(response_mask.device)
        if f.shape[0] != rows:
            raise ValueError(f"flag {name!r} has {f.shape[0]} rows, response_mask has {rows}")
        metrics[f"filter/{name}_responses"] = float(f.sum())
        masked |= f
    new_mask = response_mask.clone()
    new_mask[masked] = 0
    metrics["filter/masked_rows"] = float(masked.sum())
    return new_mask, metrics


# --------------------------------------------------------------------------------------------
# Group std filter (the original's _filter_rollout)
# --------------------------------------------------------------------------------------------


def group_reward_stats(
    rewards: Sequence[float], uids: Sequence[Any], traj_uids: Sequence[Any]
) -> tuple[list[float], list[float]]:
    """Per-group reward mean and population std over trajectories, as SPEAR's replay
    baseline history (``update_batch``) and its rollout std filter compute them.

    A trajectory's reward is the mean of its step rows' scalar rewards; a group's mean is the
    mean of those and its std their population std (``np.std``, ddof 0). Groups are listed in
    order of first appearance.

    Args:
        rewards: ``[rows]`` scalar reward of each step row (reward units).
        uids: ``[rows]`` group id; traj_uids: ``[rows]`` trajectory id.

    Returns:
        ``(g_means, g_stds)``, one float per group.

    Raises:
        ValueError: the lengths differ.
    """
    if not (len(rewards) == len(uids) == len(traj_uids)):
        raise ValueError(f"lengths differ: rewards {len(rewards)}, uids {len(uids)}, traj_uids {len(traj_uids)}")
    by_group: dict[Any, dict[Any, list[float]]] = {}
    for r, u, t in zip(rewards, uids, traj_uids):
        by_group.setdefault(u, {}).setdefault(t, []).append(float(r))
    means, stds = [], []
    for trajs in by_group.values():
        per_traj = [sum(v) / len(v) for v in trajs.values()]
        m = sum(per_traj) / len(per_traj)
        means.append(m)
        stds.append(math.sqrt(sum((x - m) ** 2 for x in per_traj) / len(per_traj)))
    return means, stds


def group_std_filter(
    scores: Sequence[float],
    group_index: Sequence[Any],
    traj_index: Sequence[Any],
    ratio: float,
    filter_type: str = "std",
    *,
    generator: Optional[torch.Generator] = None,
    trim_to_power_of_two: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rollout std filter (the original's ``_filter_rollout``; ``rollout.rollout_filter_ratio`` / ``_type``).

    1. Each group's std = :func:`group_reward_stats` of the rows' scalar scores (episode reward
       + tool-call bonus, *before* the invalid-action penalty, which the original applies later).
    2. Keep the ``k = max(1, int(ratio · #groups))`` groups with the largest std (``std``) or
       the smallest (``std_rev``); ties keep the earlier group. The original's ``int(...)``
       alone would drop every group when ``ratio · #groups < 1``; ``max(1, ·)`` keeps one.
    3. With ``trim_to_power_of_two``, keep a uniformly random subset (``generator``) of the
       kept rows of size :func:`largest_power_of_two_le` (the original's GPU-divisibility
       trim; it can drop single steps of a trajectory, so GiGPO step returns must be computed
       before this filter — see ``AdvantageInput.step_returns``).

    ``ratio == 1`` is a no-op (every row kept, no trim), as the original.

    Args:
        scores: ``[rows]`` scalar score per step row.
        group_index: ``[rows]`` group id (``uid``); traj_index: ``[rows]`` trajectory id.
        ratio: in (0, 1].
        filter_type: ``std`` | ``std_rev``.

    Returns:
        ``(keep, metrics)``: ``keep`` is a sorted ``[kept]`` long tensor of row indices to keep;
        metrics ``rollout/in_group_std`` (mean over all groups),
        ``rollout/chosen_in_group_std`` (over kept groups), ``rollout/kept_groups``,
        ``rollout/kept_rows``.

    Raises:
        ValueError: ratio outside (0, 1], unknown type, lengths differ.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"rollout.rollout_filter_ratio must be in (0, 1], got {ratio}")
    if filter_type not in ROLLOUT_FILTER_TYPES:
        raise ValueError(f"rollout.rollout_filter_type: unknown {filter_type!r}; valid: {list(ROLLOUT_FILTER_TYPES)}")
    n = len(scores)
    _, stds = group_reward_stats(scores, group_index, traj_index)
    order_of: dict[Any, int] = {}
    for g in group_index:
        order_of.setdefault(g, len(order_of))
    all_std = sum(stds) / len(stds) if stds else 0.0
    if ratio == 1.0:
        return torch.arange(n, dtype=torch.long), {
            "rollout/in_group_std": all_std, "rollout/chosen_in_group_std": all_std,
            "rollout/kept_groups": float(len(stds)), "rollout/kept_rows": float(n),
        }
    k = max(1, int(ratio * len(stds)))
    sign = -1.0 if filter_type == "std" else 1.0
    ranked = sorted(range(len(stds)), key=lambda gi: (sign * stds[gi], gi))
    chosen = set(ranked[:k])
    rows = [r for r, g in enumerate(group_index) if order_of[g] in chosen]
    if trim_to_power_of_two:
        m = largest_power_of_two_le(len(rows))
        pick = torch.randperm(len(rows), generator=generator)[:m].tolist()
        rows = sorted(rows[i] for i in pick)
    return torch.tensor(rows, dtype=torch.long), {
        "rollout/in_group_std": all_std,
        "rollout/chosen_in_group_std": sum(stds[gi] for gi in chosen) / len(chosen),
        "rollout/kept_groups": float(len(chosen)),
        "rollout/kept_rows": float(len(rows)),
    }
