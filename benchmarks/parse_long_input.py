"""Time ``action_char_spans`` on 64 KB of repeated ``<action>`` (and other repeated tags):
the regex implementation serl used before vs the linear scan of ``serl.agent.parsing``.

    python benchmarks/parse_long_input.py

Prints seconds per call for each input; both implementations must give the same spans.
"""

from __future__ import annotations

import re
import time

from serl.agent.parsing import action_char_spans

_FLAGS = re.IGNORECASE | re.DOTALL
_PATTERNS = [re.compile(p, _FLAGS) for p in (r"<action\b[^>]*>(.*?)</action>", r"\[action>(.*?)</action>\]",
                                            r"(?<![<\[/\w])action>(.*?)</action>")]
_UNCLOSED = re.compile(r"<action\b[^>]*>(.*)\Z", _FLAGS)
_TOOL = re.compile(r"(?:search|click)\[[^\]]*\]", re.IGNORECASE)


def regex_spans(text: str) -> list[tuple[int, int]]:
    """The regex version (before): same result, quadratic on repeated unclosed tags."""
    spans = [m.span(1) for pat in _PATTERNS for m in pat.finditer(text)]
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


def _time(fn, text: str) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = fn(text)
    return time.perf_counter() - t0, out


def main() -> None:
    size = 64 * 1024
    inputs = {tag: (tag * (size // len(tag) + 1))[:size] for tag in ("<action>", "action>", "[action>", "search[")}
    print(f"{'input (64 KB)':<22} {'before (regex) s':>17} {'after (scan) s':>15} {'speed-up':>9}")
    for tag, text in inputs.items():
        before, a = _time(regex_spans, text)
        after, b = _time(action_char_spans, text)
        assert a == b, tag
        print(f"{'repeated ' + tag:<22} {before:>17.3f} {after:>15.4f} {before / max(after, 1e-9):>8.0f}x")


if __name__ == "__main__":
    main()
