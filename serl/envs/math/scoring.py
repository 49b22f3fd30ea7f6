"""Answer scorers for math problems: SPEAR's strict ``\\boxed{}`` match, a normalizing one, and math-verify.

Every scorer takes ``(response_text, ground_truth)`` and returns a :class:`ScoreResult` with SPEAR's
outcome reward: ``score`` = +1.0 when correct, -1.0 otherwise (a missing box is wrong too).

**Pass only the assistant's own text.** SPEAR scores the decoded *whole* response, tool outputs and
role words included, so a ``\\boxed{}`` printed by the code (``print("\\\\boxed{42}")``) counts as the
model's answer. The caller decides; serl's callers pass the assistant turns only.

* ``strict`` (:func:`strict_score`): SPEAR's ``math_dapo.compute_score(strict_box_verify=True)``
  (``TencentYoutuResearch/SPEAR@7e8431513165640b4b1f78d09ebaae8807ee4f85:verl/verl/utils/reward_score/math_dapo.py``):
  the last 300, then the last 100 characters; the last ``\\boxed{...}`` in them; exact string
  equality. ``\\boxed{ 42}``, ``\\boxed{042}``, ``\\boxed{'42'}`` and ``\\boxed{42^\\circ}`` are all wrong,
  and a box followed by more than ~100 characters is not seen. ``reward.scorer=strict`` reproduces SPEAR.
* ``normalized`` (:func:`normalized_score`): the last box anywhere in the text, both sides cleaned
  (:func:`normalize_answer`) and compared as exact rationals when both are numbers, else as strings.
  Meant for GSM8K's integer answers.
* ``math_verify`` (:func:`math_verify_score`): the last box, compared with HuggingFace's math-verify
  (``parse`` + ``verify``, https://github.com/huggingface/Math-Verify): LaTeX fractions, roots, tuples,
  intervals, sets, symbolic equality. Needs ``pip install math-verify``.

Defaults per dataset (:data:`DEFAULT_SCORER`): gsm8k -> normalized; math500, aime24, aime25,
dapo_math17k -> math_verify.
"""

from __future__ import annotations

import functools
import importlib
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from serl.errors import ConfigError

#: what a box starts with (SPEAR's strict path looks for exactly this; ``\boxed 42`` and ``\fbox{}`` are not boxes)
BOX = "\\boxed{"
#: SPEAR's windows: the response is cut to its last 300, then its last 100 characters
STRICT_WINDOWS = (300, 100)
#: seconds math-verify may spend on one parse / one comparison (main thread only, see math_verify_score)
MATH_VERIFY_TIMEOUT_S = 5


@dataclass(frozen=True)
class ScoreResult:
    """``score``: +1.0 correct, -1.0 wrong; ``correct``: the same as a bool (SPEAR's ``acc``); ``pred``:
    the extracted answer (None when there is no box): the raw box content for ``strict`` and
    ``math_verify``, the normalized form for ``normalized`` (``"1,234."`` -> ``"1234"``, ``"0.5"`` -> ``"1/2"``),
    so that majority votes group equal answers."""

    score: float
    correct: bool
    pred: str | None


def _result(correct: bool, pred: str | None) -> ScoreResult:
    return ScoreResult(1.0 if correct else -1.0, bool(correct), pred)


def _check_types(response_text: object, ground_truth: object) -> None:
    if not isinstance(response_text, str) or not isinstance(ground_truth, str):
        raise TypeError(f"scorers take (str, str), got ({type(response_text).__name__}, "
                        f"{type(ground_truth).__name__}); ground truths are strings (e.g. '23', not 23)")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{`` in ``text``, up to its matching ``}`` (nested braces
    counted). None when there is no ``\\boxed{`` or the last one is never closed (an earlier, closed
    box is then not used, as in SPEAR). ``last_boxed("a \\boxed{\\frac{1}{2}}")`` -> ``"\\frac{1}{2}"``."""
    start = text.rfind(BOX)
    if start < 0:
        return None
    depth = 0
    for i in range(start + len(BOX) - 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(BOX):i]
    return None


def strict_score(response_text: str, ground_truth: str) -> ScoreResult:
    """SPEAR's outcome score: the last box within the last 100 characters, compared to
    ``ground_truth`` as an exact string (no strip, no numeric comparison).

    Args:
        response_text: the assistant's own text only (all its turns, no tool outputs; every scorer
            here takes the same): SPEAR passes the whole decoded response, so a box printed by the
            tool counts there (see the module docstring).
        ground_truth: the dataset's answer string (``MathProblem.ground_truth``).

    Raises:
        TypeError: an argument is not a ``str``.
    """
    _check_types(response_text, ground_truth)
    tail = response_text
    for n in STRICT_WINDOWS:
        tail = tail[-n:]
    pred = last_boxed(tail)
    return _result(pred is not None and pred == ground_truth, pred)


_WRAPPER = re.compile(r"^\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{(.*)\}$", re.DOTALL)
_SUFFIX = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\%|%)$")
_SPACES = re.compile(r"\s+|\\[,;:! ]|~")
_THOUSANDS = re.compile(r"(?<=\d)(?:,|\{,\})(?=\d{3}(?!\d))")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_SLASH = re.compile(r"([+-]?\d+)/(\d+)")
_FRAC = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{(\d+)\}")


def normalize_answer(text: str) -> str:
    """Clean an answer string, in this order: strip; unwrap a whole-answer ``\\text{}``,
    ``\\textbf{}``, ``\\textrm{}``, ``\\mathrm{}``, ``\\mathbf{}`` or ``\\mbox{}``; drop ``\\$`` and ``$``;
    drop all whitespace and LaTeX spacing (``\\,`` ``\\;`` ``\\:`` ``\\!`` ``\\ `` ``~``); drop commas that
    separate thousands (``1,234`` and ``1{,}234``; ``(3,4)`` keeps its comma); then, until nothing
    changes, one leading and one trailing quote (``'`` or ``"``), trailing periods, and one trailing
    degree or percent sign (``^\\circ``, ``^{\\circ}``, ``°``, ``\\%``, ``%``)."""
    s = text.strip()
    while (m := _WRAPPER.match(s)) is not None:
        s = m.group(1).strip()
    s = s.replace("\\$", "").replace("$", "")
    s = _SPACES.sub("", s)
    s = _THOUSANDS.sub("", s)
    prev = None
    while s != prev:
        prev = s
        if s[:1] in ("'", '"'):
            s = s[1:]
        if s[-1:] in ("'", '"'):
            s = s[:-1]
        s = _SUFFIX.sub("", s.rstrip("."))
    return s


def as_number(s: str) -> Fraction | None:
    """A normalized answer as an exact rational: an integer or decimal (``-7``, ``042``, ``2.50``),
    ``a/b``, or ``\\frac{a}{b}`` / ``\\dfrac`` / ``\\tfrac`` with integer ``a``, ``b`` (a sign may precede
    the ``\\frac``). None for anything else or a zero denominator."""
    if _DECIMAL.fullmatch(s):
        return Fraction(s)
    if (m := _SLASH.fullmatch(s)) is not None and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    if (m := _FRAC.fullmatch(s)) is not None and int(m.group(3)) != 0:
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return -value if m.group(1) == "-" else value
    return None


def normalized_score(response_text: str, ground_truth: str) -> ScoreResult:
    """The last box anywhere in ``response_text`` against ``ground_truth``, both through
    :func:`normalize_answer`; equal when both read as the same rational (:func:`as_number`: no float
    tolerance, so ``0.333`` is not ``1/3``), else when the cleaned strings are equal.
    ``\\boxed{'1,234.'}`` matches ``"1234"``; ``\\boxed{042}`` matches ``"42"``.

    Raises:
        TypeError: an argument is not a ``str``.
    """
    _check_types(response_text, ground_truth)
    raw = last_boxed(response_text)
    if raw is None:
        return _result(False, None)
    pred, gold = normalize_answer(raw), normalize_answer(ground_truth)
    pv, gv = as_number(pred), as_number(gold)
    if pv is not None and gv is not None:
        return _result(pv == gv, str(pv))
    return _result(pred != "" and pred == gold, str(pv) if pv is not None else pred)


@functools.lru_cache(maxsize=1)
def _math_verify() -> tuple[Callable, Callable]:
    """math-verify's ``parse`` and ``verify``, after checking that its LaTeX parser loads (math-verify
    swallows that ImportError and would score every LaTeX answer wrong)."""
    try:
        mv = importlib.import_module("math_verify")
        importlib.import_module("latex2sympy2_extended.antlr_parser")
    except ImportError as e:
        raise ImportError(f"the math_verify scorer needs math-verify and a supported ANTLR runtime "
                          f"(4.9.3, 4.11 or 4.13.2): `pip install 'math-verify>=0.9'` ({e})") from e
    return mv.parse, mv.verify


def _timeout(timeout_s: int) -> int | None:
    """math-verify times out with ``signal.alarm``, which works only in the main thread; elsewhere
    the call must run without a timeout (None), as math-verify's docs advise."""
    return timeout_s if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str, timeout_s: int | None) -> tuple:
    parse, _ = _math_verify()
    return tuple(parse(f"${ground_truth}$", parsing_timeout=timeout_s))


def math_verify_score(response_text: str, ground_truth: str, timeout_s: int = MATH_VERIFY_TIMEOUT_S) -> ScoreResult:
    """The last box anywhere in ``response_text`` against ``ground_truth`` with math-verify: both are
    wrapped in ``$...$`` and ``parse``d (unescaped ``$`` and a surrounding quote pair are removed from
    the box first), then ``verify(gold, pred)``. When the gold itself does not parse, the
    :func:`normalized_score` rule decides instead.

    Timeouts: ``timeout_s`` (whole seconds) bounds each parse and comparison through math-verify's
    ``signal.alarm`` in the main thread; in other threads there is no timeout (math-verify cannot
    use signals there), and a pathological expression can then take long. math-verify logs and
    returns "no match" for a timeout or an unparsable prediction, which scores -1.

    Raises:
        TypeError: an argument is not a ``str``.
        ImportError: math-verify or its ANTLR runtime is missing.
    """
    _check_types(response_text, ground_truth)
    parse, verify = _math_verify()
    raw = last_boxed(response_text)
    if raw is None:
        return _result(False, None)
    t = _timeout(timeout_s)
    gold = _parse_gold(ground_truth, t)
    if not gold:
        return _result(normalized_score(BOX + raw + "}", ground_truth).correct, raw)
    cleaned = re.sub(r"(?<!\\)\$", "", raw).strip()
    if len(cleaned) >= 2 and cleaned[0] == cleaned[-1] and cleaned[0] in ("'", '"'):
        cleaned = cleaned[1:-1]
    pred = parse(f"${cleaned}$", parsing_timeout=t)
    return _result(bool(pred) and verify(list(gold), pred, timeout_seconds=t), raw)


#: scorer name -> function(response_text, ground_truth) -> ScoreResult
SCORERS: dict[str, Callable[[str, str], ScoreResult]] = {
    "strict": strict_score,
    "normalized": normalized_score,
    "math_verify": math_verify_score,
}
#: the scorer each dataset uses unless the config names one
DEFAULT_SCORER = {"gsm8k": "normalized", "math500": "math_verify", "aime24": "math_verify",
                  "aime25": "math_verify", "dapo_math17k": "math_verify"}


def get_scorer(name: str) -> Callable[[str, str], ScoreResult]:
    """The scorer called ``name`` (a key of :data:`SCORERS`).

    Raises:
        ConfigError: unknown name, or ``math_verify`` without math-verify installed.
    """
    if name not in SCORERS:
        raise ConfigError(f"unknown math scorer {name!r}; valid: {', '.join(SCORERS)}")
    if name == "math_verify":
        try:
            _math_verify()
        except ImportError as e:
            raise ConfigError(f"scorer 'math_verify' is not usable here: {e}. Use reward.scorer=normalized or "
                              "strict, or install math-verify.") from e
    return SCORERS[name]


def default_scorer(dataset: str) -> str:
    """The default scorer name of ``dataset`` (:data:`DEFAULT_SCORER`).

    Raises:
        ConfigError: unknown dataset.
    """
    if dataset not in DEFAULT_SCORER:
        raise ConfigError(f"unknown math dataset {dataset!r}; available: {', '.join(DEFAULT_SCORER)}")
    return DEFAULT_SCORER[dataset]
