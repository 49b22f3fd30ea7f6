"""Dr.BoT response filters and the group std filter on crafted responses (SPEAR, arXiv 2509.22601)."""

import math

import pytest
import torch

from serl.algos.filters import (
    apply_response_filters,
    enabled_filters,
    group_reward_stats,
    group_std_filter,
    is_incomplete,
    is_overlong,
    is_repetitive,
    is_unreadable,
    largest_power_of_two_le,
    response_flags,
)
from serl.configure import load_config


@pytest.mark.parametrize(
    "text,flag",
    [
        ("", True),
        ("   \n", True),
        (None, True),
        ("<think>the fridge is closed</think><action>open fridge 1</action>", False),
        ("<action>go to cabinet 1</action>", False),  # <think> is not required
        ("<think>x</think>\n<action>\ntake apple\n</action>", False),  # multi-line block
        ("<think>x</think><action></action>", False),  # an empty block still counts
        ("<think>maybe <action>go north</action></think> then I stop", True),  # only inside think
        ("<think>x</think> go to cabinet 1", True),
        ("<think>a</think><action>x</action><think>b</think>no action", True),  # after the LAST </think>
        ("<action>open fridge 1", True),  # unclosed
    ],
)
def test_incomplete(text, flag):
    assert is_incomplete(text) is flag


def test_repetitive_counts_20_grams_of_token_ids():
    assert is_repetitive(list(range(20)) * 10)  # the 20-gram 0..19 occurs 10 times
    assert not is_repetitive(list(range(20)) * 9 + list(range(19)))  # 9 times (+ a partial)
    assert is_repetitive([7] * 29)  # overlapping: 29 - 20 + 1 = 10 occurrences
    assert not is_repetitive([7] * 28)
    assert not is_repetitive([1] * 19)
    assert is_repetitive([1, 2] * 6, n=2, threshold=6)


def test_unreadable_and_overlong():
    assert is_unreadable("take apple \ufffd")
    assert is_unreadable("go to ï¿½ cabinet")
    assert is_unreadable("whatï¼Ÿ")
    assert not is_unreadable("what？ plain full-width question mark")
    assert not is_unreadable("")
    assert is_overlong(512, 512) and is_overlong(600, 512) and not is_overlong(511, 512)


def test_response_flags_and_masking():
    ids = [[1, 2, 3], [5] * 29, list(range(8)), [9, 9]]
    texts = [
        "<think>ok</think><action>look</action>",
        "<think>ok</think><action>look</action>",
        "no action at all",
        "<action>look</action>\ufffd",
    ]
    flags = response_flags(ids, texts, max_response_length=8)
    assert flags["overlong"].tolist() == [False, True, True, False]
    assert flags["incomplete"].tolist() == [False, False, True, False]
    assert flags["repetitive"].tolist() == [False, True, False, False]
    assert flags["unreadable"].tolist() == [False, False, False, True]
    mask = torch.ones(4, 5, dtype=torch.long)
    mask[0, 3:] = 0
    new, met = apply_response_filters(mask, flags, {"incomplete": True, "repetitive": True})
    assert new.tolist() == [[1, 1, 1, 0, 0], [0] * 5, [0] * 5, [1] * 5]
    assert mask.sum().item() == 18  # input untouched
    assert met == {"filter/incomplete_responses": 1.0, "filter/repetitive_responses": 1.0, "filter/masked_rows": 2.0}
    new, met = apply_response_filters(mask.float(), flags, dict.fromkeys(["overlong", "incomplete", "repetitive", "unreadable"], True))
    assert new.sum(-1).tolist() == [3.0, 0.0, 0.0, 0.0] and met["filter/masked_rows"] == 3.0
    new, met = apply_response_filters(mask, flags, {})
    assert torch.equal(new, mask) and met == {"filter/masked_rows": 0.0}
    with pytest.raises(ValueError):
        response_flags(ids, texts[:2], 8)


def test_enabled_filters_from_config():
    cfg = load_config(None, ["algorithm.filter_incomplete_responses=true", "algorithm.filter_unreadable_responses=true"])
    assert enabled_filters(cfg.algorithm) == {"overlong": False, "incomplete": True, "repetitive": False, "unreadable": True}


def test_group_reward_stats_uses_trajectory_means_and_population_std():
    # group a: trajectory 1 rows [10, 10] -> 10, trajectory 2 row [0] -> 0: mean 5, std 5
    # group b: trajectories [4], [2, 6] -> 4, 4: mean 4, std 0
    means, stds = group_reward_stats([10, 10, 0, 4, 2, 6], ["a", "a", "a", "b", "b", "b"], [1, 1, 2, 3, 4, 4])
    assert means == [5.0, 4.0] and stds == [5.0, 0.0]


# three groups: a (std 5, 4 rows), b (std 0, 2 rows), c (trajectories 10, 0, 0, 0: std sqrt(75)/2, 5 rows)
SCORES = [10, 10, 0, 0, 10, 10, 10, 0, 0, 0, 0]
GROUPS = ["a", "a", "a", "a", "b", "b", "c", "c", "c", "c", "c"]
TRAJS = [1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 8]


def test_group_std_filter_keeps_largest_std_groups():
    _, stds = group_reward_stats(SCORES, GROUPS, TRAJS)
    assert stds[0] == 5.0 and stds[1] == 0.0 and stds[2] == pytest.approx(math.sqrt(75) / 2)
    keep, met = group_std_filter(SCORES, GROUPS, TRAJS, 0.67, "std", trim_to_power_of_two=False)
    assert keep.tolist() == [0, 1, 2, 3, 6, 7, 8, 9, 10]  # int(0.67·3) = 2 groups: a, c
    assert met["rollout/kept_groups"] == 2.0 and met["rollout/kept_rows"] == 9.0
    assert met["rollout/chosen_in_group_std"] == pytest.approx((5.0 + math.sqrt(75) / 2) / 2)
    keep, _ = group_std_filter(SCORES, GROUPS, TRAJS, 0.34, "std_rev", trim_to_power_of_two=False)
    assert keep.tolist() == [4, 5]  # smallest std: b
    # int(0.2·3) = 0 would drop everything; at least one group is kept
    keep, _ = group_std_filter(SCORES, GROUPS, TRAJS, 0.2, "std", trim_to_power_of_two=False)
    assert keep.tolist() == [0, 1, 2, 3]


def test_group_std_filter_power_of_two_trim_and_noop():
    g = torch.Generator().manual_seed(0)
    keep, met = group_std_filter(SCORES, GROUPS, TRAJS, 0.67, "std", generator=g)
    assert len(keep) == 8 and set(keep.tolist()) <= {0, 1, 2, 3, 6, 7, 8, 9, 10}
    assert keep.tolist() == sorted(keep.tolist()) and met["rollout/kept_rows"] == 8.0
    keep, met = group_std_filter(SCORES, GROUPS, TRAJS, 1.0, "std")
    assert keep.tolist() == list(range(11)) and met["rollout/kept_groups"] == 3.0  # no trim at ratio 1
    # ties keep the earlier group
    keep, _ = group_std_filter([1, 0, 1, 0], ["x", "x", "y", "y"], [1, 2, 3, 4], 0.5, trim_to_power_of_two=False)
    assert keep.tolist() == [0, 1]
    with pytest.raises(ValueError):
        group_std_filter(SCORES, GROUPS, TRAJS, 0.0)
    with pytest.raises(ValueError):
        group_std_filter(SCORES, GROUPS, TRAJS, 0.5, "max")


def test_largest_power_of_two():
    assert [largest_power_of_two_le(n) for n in (0, 1, 2, 3, 5, 8, 9, 1000)] == [0, 1, 2, 2, 4, 8, 8, 512]
