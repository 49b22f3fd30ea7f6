"""``action_char_spans`` equals the regex definition it replaced, on random and adversarial text."""

from __future__ import annotations

import random
import re
import time

from serl.agent.parsing import action_char_spans

_FLAGS = re.IGNORECASE | re.DOTALL
_WELL_FORMED = re.compile(r"<action\b[^>]*>(.*?)</action>", _FLAGS)
_BRACKETED = re.compile(r"\[action>(.*?)</action>\]", _FLAGS)
_BARE = re.compile(r"(?<![<\[/\w])action>(.*?)</action>", _FLAGS)
_UNCLOSED = re.compile(r"<action\b[^>]*>(.*)\Z", _FLAGS)
_TOOL = re.compile(r"(?:search|click)\[[^\]]*\]", re.IGNORECASE)


def reference_spans(text: str) -> list[tuple[int, int]]:
    """The regex implementation serl used before (quadratic on repeated unclosed tags)."""
    spans = [m.span(1) for pat in (_WELL_FORMED, _BRACKETED, _BARE) for m in pat.finditer(text)]
    if not spans:
        spans = [m.span(1) for m in _UNCLOSED.finditer(text)]
    if not spans:
        spans = [m.span(0) for m in _TOOL.finditer(text)]
    out: list[tuple[int, int]] = []
    for s, e in sorted(x for x in spans if x[1] > x[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


PIECES = ["<action>", "</action>", "<ACTION>", "</Action>", "action>", "[action>", "</action>]", "<action ",
          "<actions>", "<action=1>", ">", "]", "[", "<", "/", "search[", "click[", "SEARCH[", "cLiCk[",
          "ſearch[", "clicK[", "<actİon>", "</actıon>", "x", "go to fridge 1", " ", "\n", "_", "é", "1",
          "<think>", "</think>", "a", "ction>"]


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))


def test_equals_the_regex_reference_on_random_texts():
    rng = random.Random(0)
    for _ in range(20000):
        text = _random_text(rng)
        assert action_char_spans(text) == reference_spans(text), repr(text)


def test_equals_the_reference_on_random_characters():
    rng = random.Random(1)
    alphabet = "<>/[]_ actionACTIONsearchclk\u0130\u0131\u017f\u212a\n"
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert action_char_spans(text) == reference_spans(text), repr(text)


def _best_seconds(text: str, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        action_char_spans(text)
        best = min(best, time.perf_counter() - t0)
    return best


def test_repeated_unclosed_tags_do_not_blow_up():
    """64 KB of ``<action>`` took seconds with the regexes; the scan is linear. Checked by growth,
    not by a time bound sized for one CPU: 8x the text costs ~8x the time (the quadratic regexes
    64x), measured side by side in this process, the best of 5 runs each. Speed itself:
    ``benchmarks/parse_long_input.py``."""
    for tag in ("<action>", "action>", "[action>", "<action", "search["):
        small = tag * 200
        assert action_char_spans(small) == reference_spans(small), tag
        short, long = tag * (32768 // len(tag)), tag * (262144 // len(tag))
        growth = _best_seconds(long) / _best_seconds(short)
        assert growth < 24, (tag, growth)
    assert action_char_spans("<action>" * 8192) == [(8, 8 * 8192)]
