"""serl.envs.math.scoring: hand-computed cases for the strict (SPEAR), normalized and math-verify scorers."""

from __future__ import annotations

import threading

import pytest

from serl.envs.math.data import load_problems
from serl.envs.math.scoring import (
    DEFAULT_SCORER,
    SCORERS,
    ScoreResult,
    as_number,
    default_scorer,
    get_scorer,
    last_boxed,
    math_verify_score,
    normalize_answer,
    normalized_score,
    strict_score,
)
from serl.errors import ConfigError

B = "\\boxed"
try:
    import math_verify  # noqa: F401

    HAVE_MV = True
except ImportError:
    HAVE_MV = False
needs_math_verify = pytest.mark.skipif(not HAVE_MV, reason="math-verify not installed (pip install 'math-verify>=0.9')")


def box(s: str) -> str:
    return f"So the answer is {B}{{{s}}}."


def test_last_boxed_matches_braces_and_takes_the_last_box():
    assert last_boxed(f"{B}{{\\frac{{1}}{{\\sqrt{{2}}}}}}") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed(f"{B}{{1}} and then {B}{{2}}") == "2"
    assert last_boxed(f"{B}{{{B}{{7}}}}") == "7"  # the last "\boxed{" starts inside the first
    assert last_boxed("no box, 42") is None
    assert last_boxed(f"{B} 42") is None and last_boxed("\\fbox{42}") is None
    assert last_boxed(f"{B}{{1}} then {B}{{2") is None  # the last box is never closed: no fallback
    assert last_boxed(f"{B}{{}}") == ""


def test_strict_is_exact_string_equality():
    assert strict_score(box("42"), "42") == ScoreResult(1.0, True, "42")
    assert strict_score(box("-7"), "-7").correct and not strict_score(box("7"), "-7").correct
    for wrong in (" 42", "42.", "042", "'42'", "42^\\circ", "42 ", "\\text{42}"):  # pitfall 2
        r = strict_score(box(wrong), "42")
        assert (r.score, r.correct, r.pred) == (-1.0, False, wrong)
    assert strict_score(box("1,234"), "1234").score == -1.0
    assert strict_score(box("\\frac{14}{3}"), "14/3").score == -1.0
    assert strict_score("no box at all: 42", "42") == ScoreResult(-1.0, False, None)
    assert strict_score(f"{B}{{41}} first, finally {B}{{42}}", "42").correct


def test_strict_sees_only_the_last_100_characters():
    assert strict_score(box("42") + "x" * 80, "42").correct
    far = box("42") + "x" * 101
    assert strict_score(far, "42") == ScoreResult(-1.0, False, None)  # missed, as in SPEAR (pitfall 3)
    assert normalized_score(far, "42").correct
    cut = "y" * 500 + B + "{42}" + "z" * 95  # 100-char window starts inside "\boxed{": no box
    assert strict_score(cut, "42").pred is None


def test_normalize_answer_cleanups():
    assert normalize_answer(" '1,234.' ") == "1234"
    assert normalize_answer("\\$1{,}234") == "1234"
    assert normalize_answer("\\text{ 42 }") == "42" and normalize_answer("\\mathrm{42}") == "42"
    assert normalize_answer("336^\\circ") == "336" and normalize_answer("336^{\\circ}") == "336"
    assert normalize_answer("25\\%") == "25" and normalize_answer('"7".') == "7"
    assert normalize_answer("(3, 4)") == "(3,4)" and normalize_answer("1,2") == "1,2"
    assert as_number("042") == 42 and as_number("-\\frac{3}{4}") == as_number("-3/4") == as_number("-0.75")
    assert as_number("1/0") is None and as_number("x") is None and as_number("\\frac{1}{\\sqrt{2}}") is None


def test_normalized_scorer_cases():
    assert normalized_score(box("1,234"), "1234") == ScoreResult(1.0, True, "1234")
    assert normalized_score(box("-7"), "-7").correct and not normalized_score(box("7"), "-7").correct
    assert normalized_score(box("'42'"), "42").correct  # the prompt's own quotes
    assert normalized_score(box(" 42"), "42").correct and normalized_score(box("042"), "42").correct
    assert normalized_score(box("42."), "42").correct and normalized_score(box("\\$42"), "42").correct
    assert normalized_score(box("336^\\circ"), "336").correct
    assert normalized_score(box("\\frac{14}{3}"), "14/3") == ScoreResult(1.0, True, "14/3")
    assert normalized_score(box("\\dfrac{14}{3}"), "\\frac{14}{3}").correct
    assert normalized_score(box("0.5"), "\\frac{1}{2}").pred == "1/2"
    assert not normalized_score(box("0.333"), "1/3").correct  # exact rationals, no tolerance
    assert not normalized_score(box("1,2"), "12").correct  # only thousands separators are dropped
    assert normalized_score(box("x+1"), "x + 1").correct  # non-numbers: cleaned string equality
    assert not normalized_score(box(""), "").correct
    assert normalized_score("42", "42") == ScoreResult(-1.0, False, None)
    assert normalized_score(f"{B}{{2}} ... {B}{{3}}", "3").correct


@needs_math_verify
def test_math_verify_cases():
    assert math_verify_score(box("\\frac{1}{\\sqrt{2}}"), "\\frac{\\sqrt{2}}{2}") == ScoreResult(1.0, True, "\\frac{1}{\\sqrt{2}}")
    assert math_verify_score(box("14/3"), "\\frac{14}{3}").correct
    assert math_verify_score(box("\\dfrac{14}{3}"), "\\frac{14}{3}").correct
    gold = "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math_verify_score(box("(3, \\frac{\\pi}{2})"), gold).correct
    assert math_verify_score(box("(3, \\pi/2)"), gold).correct
    assert not math_verify_score(box("(\\frac{\\pi}{2}, 3)"), gold).correct
    assert math_verify_score(box("1,234"), "1234").correct and math_verify_score(box("'42'"), "42").correct
    assert math_verify_score(box("336^\\circ"), "336").correct and math_verify_score(box("042"), "42").correct
    assert math_verify_score(box("$-7$"), "-7").correct and not math_verify_score(box("7"), "-7").correct
    assert math_verify_score("42", "42") == ScoreResult(-1.0, False, None)
    assert not math_verify_score(box("\\frac{1}{2"), "\\frac{1}{2}").correct
    assert not math_verify_score(box("x"), "").correct  # a gold that does not parse: the normalized rule


@needs_math_verify
def test_math_verify_runs_outside_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(math_verify_score(box("\\frac{2}{4}"), "\\frac{1}{2}")))
    t.start()
    t.join(60)
    assert out and out[0].correct


@needs_math_verify
def test_every_math500_answer_verifies_against_itself():
    for p in load_problems("math500", "test"):
        assert math_verify_score(box(p.ground_truth), p.ground_truth).correct, p.uid
        assert strict_score(box(p.ground_truth), p.ground_truth).correct, p.uid


def test_every_gsm8k_answer_scores_against_itself():
    for p in load_problems("gsm8k", "test"):
        assert normalized_score(box(p.ground_truth), p.ground_truth).correct, p.uid
        assert normalized_score(box(f"{int(p.ground_truth):,}"), p.ground_truth).correct, p.uid


def test_registry_and_defaults():
    assert set(SCORERS) == {"strict", "normalized", "math_verify"}
    assert get_scorer("strict") is strict_score and get_scorer("normalized") is normalized_score
    with pytest.raises(ConfigError, match="valid: strict, normalized, math_verify"):
        get_scorer("exact")
    assert default_scorer("gsm8k") == "normalized"
    assert {default_scorer(d) for d in ("math500", "aime24", "aime25", "dapo_math17k")} == {"math_verify"}
    assert set(DEFAULT_SCORER) == {"gsm8k", "math500", "aime24", "aime25", "dapo_math17k"}
    with pytest.raises(ConfigError):
        default_scorer("gsm9k")
    if HAVE_MV:
        assert get_scorer("math_verify") is math_verify_score


def test_scorers_refuse_non_string_ground_truths():
    for scorer in (strict_score, normalized_score):
        with pytest.raises(TypeError, match="ground truths are strings"):
            scorer(box("23"), 23)
