"""serl.train.sample_metrics: pass@k (Chen et al. 2021, eq. 1), verl's mean@n / best@k / worst@k /
maj@k bootstrap (volcengine/verl@b178a3c:verl/trainer/ppo/metric_utils.py) and the aggregation
over problems, on hand-computed cases."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from serl.train.sample_metrics import (aggregate_sample_metrics, bootstrap_indices, bootstrap_ks,
                                       majority_vote, pass_at_k, problem_metrics)

T, F = True, False


# --- pass@k ---------------------------------------------------------------------------------

@pytest.mark.parametrize("c, k, expected", [
    (0, 1, Fraction(0)), (0, 2, Fraction(0)), (0, 4, Fraction(0)),
    (1, 1, Fraction(1, 4)),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
    (1, 2, Fraction(1, 2)),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (1, 4, Fraction(1)),     # n - c = 3 < k: every 4-subset holds the correct sample
    (2, 2, Fraction(5, 6)),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (4, 1, Fraction(1)), (4, 2, Fraction(1)), (4, 4, Fraction(1)),
])
def test_pass_at_k_n4_exact_fractions(c, k, expected):
    assert pass_at_k(4, c, k) == pytest.approx(float(expected), abs=1e-15)


def test_pass_at_k_matches_the_binomial_formula_and_stays_stable_for_large_n():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)
    # C(2000, 100) ~ 1e170 overflows nothing in the product form
    exact = 1 - Fraction(math.comb(1990, 100), math.comb(2000, 100))
    assert pass_at_k(2000, 10, 100) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001, rel=1e-12)


@pytest.mark.parametrize("args, match", [
    ((4, 1, 5), "k=5 exceeds n=4"),
    ((4, 5, 1), "c=5 correct exceeds n=4"),
    ((0, 0, 1), "n must be >= 1"),
    ((4, 1, 0), "k must be >= 1"),
    ((4, -1, 1), "c must be >= 0"),
    ((4, True, 1), "c must be an int"),
    ((4.0, 1, 1), "n must be an int"),
])
def test_pass_at_k_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(*args)


# --- the k values and the bootstrap draws -----------------------------------------------------

def test_bootstrap_ks_are_verls_powers_of_two_then_n():
    assert bootstrap_ks(1) == []
    assert bootstrap_ks(2) == [2]
    assert bootstrap_ks(3) == [2, 3]
    assert bootstrap_ks(6) == [2, 4, 6]
    assert bootstrap_ks(8) == [2, 4, 8]
    assert bootstrap_ks(32) == [2, 4, 8, 16, 32]
    with pytest.raises(ValueError, match="n must be >= 1"):
        bootstrap_ks(0)


def test_bootstrap_draws_are_verls_global_seed_draws_without_touching_the_global_state():
    before = np.random.get_state()[1].copy()
    ours = bootstrap_indices(4, 2)
    assert np.array_equal(np.random.get_state()[1], before)
    np.random.seed(42)  # verl's bootstrap_metric: np.random.seed(seed); np.random.choice(...)
    verls = np.random.choice(4, size=(1000, 2), replace=True)
    assert np.array_equal(ours, verls)
    assert ours.shape == (1000, 2)
    with pytest.raises(ValueError, match="k=5 exceeds n=4"):
        bootstrap_indices(4, 5)


# --- majority vote ----------------------------------------------------------------------------

def test_majority_vote_clear_majority():
    assert majority_vote([(T, "5"), (F, "6"), (T, "5")]) is True
    assert majority_vote([(F, "6"), (T, "5"), (F, "6")]) is False


def test_majority_vote_tie_goes_to_the_answer_seen_first():
    assert majority_vote([(F, "6"), (T, "5")]) is False
    assert majority_vote([(T, "5"), (F, "6")]) is True
    assert majority_vote([(F, "6"), (T, "5"), (T, "5"), (F, "6")]) is False
    assert majority_vote([(T, "5"), (F, "6"), (F, "6"), (T, "5")]) is True


def test_majority_vote_takes_the_first_sample_of_the_winning_answer():
    assert majority_vote([(F, "5"), (T, "5"), (F, "6")]) is False
    assert majority_vote([(T, "5"), (F, "5"), (F, "6")]) is True


def test_an_unparsable_answer_never_wins_the_vote():
    # three None against one "5": verl would let None win; here "5" does
    assert majority_vote([(F, None), (F, None), (F, None), (T, "5")]) is True
    assert majority_vote([(F, None), (F, None), (F, "7")]) is False
    # no parsed answer at all: the vote is wrong, even if the scorer marked a sample correct
    assert majority_vote([(T, None), (F, None)]) is False
    with pytest.raises(ValueError, match="no samples"):
        majority_vote([])


def test_the_vectorized_bootstrap_vote_equals_majority_vote_on_every_subset():
    rng = random.Random(3)
    for n in (2, 3, 5, 8):
        samples = [(rng.random() < 0.5, rng.choice(["1", "2", "3", None])) for _ in range(n)]
        m = problem_metrics(samples, n_bootstrap=200, seed=7)
        for k in bootstrap_ks(n):
            rows = bootstrap_indices(n, k, 200, seed=7)
            votes = [majority_vote([samples[i] for i in row]) for row in rows]
            assert m[f"maj@{k}/mean"] == pytest.approx(np.mean(votes), abs=1e-12), (n, k)
            assert m[f"maj@{k}/std"] == pytest.approx(np.std(votes), abs=1e-12), (n, k)


# --- per-problem metrics ----------------------------------------------------------------------

def test_mean_and_population_std():
    m = problem_metrics([(T, "1"), (T, "1"), (F, "2"), (F, "3")])
    assert m["mean@4"] == 0.5 and m["std@4"] == 0.5
    m = problem_metrics([(T, "1"), (F, "2"), (F, "2"), (F, "2")])
    assert m["mean@4"] == 0.25
    assert m["std@4"] == pytest.approx(math.sqrt(0.25 * 0.75), abs=1e-15)  # ddof = 0, as np.std


def test_greedy_gives_the_accuracy_and_no_bootstrap_keys():
    assert problem_metrics([(T, "1")]) == {"mean@1": 1.0}
    out = aggregate_sample_metrics([("a", "gsm8k", [(T, "1")]), ("b", "gsm8k", [(F, "2")]),
                                    ("c", "gsm8k", [(T, None)])])
    assert out == {"acc/mean@1": pytest.approx(2 / 3, abs=1e-15)}


def test_the_bootstrap_is_reproducible_and_seeded():
    samples = [(T, "1"), (F, "2"), (F, "2"), (T, "1"), (F, None), (F, "3")]
    assert problem_metrics(samples) == problem_metrics(samples)
    assert problem_metrics(samples, seed=0)["best@2/mean"] != problem_metrics(samples)["best@2/mean"]
    # best/worst are, per subset, "some sample correct" / "every sample correct"
    m, correct = problem_metrics(samples), np.array([c for c, _ in samples])
    for k in bootstrap_ks(6):
        rows = bootstrap_indices(6, k)
        assert m[f"best@{k}/mean"] == pytest.approx(correct[rows].any(axis=1).mean(), abs=1e-12)
        assert m[f"worst@{k}/mean"] == pytest.approx(correct[rows].all(axis=1).mean(), abs=1e-12)


def test_best_at_n_is_not_any_correct_under_verls_bootstrap_but_pass_at_n_is():
    none, all_ = [(F, "2")] * 4, [(T, "1")] * 4
    assert problem_metrics(none)["best@4/mean"] == 0.0 and problem_metrics(all_)["best@4/mean"] == 1.0
    assert problem_metrics(all_)["worst@4/mean"] == 1.0 and problem_metrics(all_)["best@4/std"] == 0.0
    one = [(T, "1"), (F, "2"), (F, "2"), (F, "3")]
    m = problem_metrics(one)
    # subsets drawn with replacement miss the one correct sample with probability (3/4)^4
    assert m["best@4/mean"] < 1.0
    assert m["best@4/mean"] == pytest.approx(1 - 0.75 ** 4, abs=0.06)
    assert m["pass@4"] == 1.0 and m["pass@2"] == 0.5
    assert any(len(set(row)) < 4 for row in bootstrap_indices(4, 4).tolist())


# --- aggregation over problems ------------------------------------------------------------------

def test_aggregate_one_source_hand_computed():
    out = aggregate_sample_metrics([("p1", "math500", [(T, "1"), (T, "1")]),
                                    ("p2", "math500", [(F, "2"), (F, None)])])
    assert set(out) == {f"acc/{k}" for k in ("mean@2", "std@2", "best@2/mean", "best@2/std", "worst@2/mean",
                                             "worst@2/std", "maj@2/mean", "maj@2/std", "pass@2")}
    # p1: all 1 (std 0); p2: all 0 ("2" wins over None and is wrong) -> every mean is 1/2
    for key in ("mean@2", "best@2/mean", "worst@2/mean", "maj@2/mean", "pass@2"):
        assert out[f"acc/{key}"] == 0.5, key
    for key in ("std@2", "best@2/std", "worst@2/std", "maj@2/std"):
        assert out[f"acc/{key}"] == 0.0, key


def test_aggregate_several_sources_adds_per_source_keys():
    recs = [("p1", "aime24", [(T, "1"), (T, "1")]), ("p2", "math500", [(F, "2"), (F, "2")]),
            ("p3", "math500", [(T, "1"), (F, "2")]), ("p1", "math500", [(F, "9"), (F, "9")])]
    out = aggregate_sample_metrics(recs, var_name="score")
    assert out["score/mean@2"] == pytest.approx((1 + 0 + 0.5 + 0) / 4, abs=1e-15)
    assert out["aime24/score/mean@2"] == 1.0
    assert out["math500/score/mean@2"] == pytest.approx(0.5 / 3, abs=1e-15)
    assert out["math500/score/pass@2"] == pytest.approx(1 / 3, abs=1e-15)  # p3: 1 - C(1,2)/C(2,2) = 1
    assert out["score/pass@2"] == 0.5
    assert not any(k.startswith("acc/") for k in out)
    single = aggregate_sample_metrics(recs[:1])
    assert not any(k.startswith("aime24/") for k in single)


@pytest.mark.parametrize("records, match", [
    ([], "no problems"),
    ([("p1", "gsm8k", [])], "problem 'p1' .*no samples"),
    ([("p1", "gsm8k", [(T, "1")] * 4), ("p2", "gsm8k", [(T, "1")] * 3)],
     "same number of samples n, but problem 'p1' has 4 and problem 'p2' has 3"),
    ([("p1", "gsm8k", [(T, "1")]), ("p1", "gsm8k", [(F, "1")])], "'p1' of 'gsm8k' appears twice"),
    ([("p1", "gsm8k", [(1, "1")])], "correct must be a bool, got int"),
    ([("p1", "gsm8k", [(T, 5)])], "pred must be a str or None, got int"),
    ([("p1", "gsm8k", [T])], r"must be a \(correct, pred\) pair"),
    ([("p1", [(T, "1")])], r"must be \(problem_id, data_source, samples\)"),
    ([("p1", None, [(T, "1")])], "data_source must be a non-empty str"),
])
def test_aggregate_bad_input(records, match):
    with pytest.raises(ValueError, match=match):
        aggregate_sample_metrics(records)


def test_eval_metrics_of_an_env_without_answers_have_no_majority_vote():
    # ALFWorld's episodes carry no answer (info["pred"]), so maj@k read 0.0 whatever the games did
    from serl.train.evaluate import eval_metrics
    from serl.trajectory import Step, Task, Trajectory

    def episode(task_id, won):
        step = Step(step_id=0, observation="", prompt="", prompt_ids=[1], response_ids=[2], response_text="look",
                    action_mask=[1], action="look", action_valid=True, won=won)
        return Trajectory(uid=task_id, traj_uid=f"{task_id}{won}", task=Task("alfworld", task_id, "look_at_obj_in_light"),
                          steps=[step])

    m = eval_metrics("alfworld", [episode("a", True), episode("a", False), episode("b", False), episode("b", False)], n=2)
    assert m["acc/mean@2"] == 0.25 and m["acc/pass@2"] == 0.5
    assert not [k for k in m if "maj@" in k]
