"""Parsing a sampled response: the env action, its format validity, and the action-token mask.

* :func:`project_action` is verl-agent's projection (``alfworld_projection`` /
  ``webshop_projection`` in ``langfengQ/verl-agent@574dd5b:agent_system/environments/env_package/*/projection.py``): the lower-cased text
  between the first ``<action>`` and the first ``</action>``; if a tag is missing, the last
  ``fallback_chars`` characters (30 for ALFWorld, 20 for WebShop) and ``valid = False``;
  ``valid = False`` also when ``<think>`` or ``</think>`` is missing or the text has CJK
  characters. The action is sent to the env even when invalid.
* :func:`action_char_spans` finds the inner content of the action tags (SERL's
  ``_build_action_token_mask``, ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/ray_trainer.py``).
* :func:`token_char_offsets` maps each *sampled* token id to its character range in the decoded
  text by incremental decoding of the true ids, and :func:`action_token_mask` marks the tokens
  overlapping an action span. The original re-tokenised the decoded text, which misaligns
  whenever re-encoding does not reproduce the sampled ids; we never re-tokenise.
"""

from __future__ import annotations

import re

CJK = re.compile(r"[\u4e00-\u9fff]")

FALLBACK_CHARS = {"alfworld": 30, "webshop": 20}

# Case-insensitive matching as Python's ``re.IGNORECASE`` on the tag letters, at fixed length:
# ASCII upper case, and the four non-ASCII letters that ``re`` folds onto ASCII ones
# (dotted/dotless i, long s, Kelvin sign). ``str.lower`` is not used: it changes lengths ("İ").
_FOLD = {**{c: c.lower() for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"},
         "\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"}
_FOLD_TABLE = str.maketrans(_FOLD)
# WebShop-style actions anywhere (last resort, as the original; can match inside <think>)
_TOOL_HEADS = ("search[", "click[")


def project_action(text: str, fallback_chars: int = 30) -> tuple[str, bool]:
    """Extract the env action and its format validity from a response (verl-agent's projection
    functions, ``langfengQ/verl-agent@574dd5b:agent_system/environments/env_package/*/projection.py``).

    Args:
        text: the decoded response (special tokens skipped).
        fallback_chars: tail length used when the action tags are missing.

    Returns:
        ``(action, valid)``; ``action`` is lower-cased and stripped.
    """
    low = text.lower()
    start = low.find("<action>")
    end = low.find("</action>")
    if start != -1 and end != -1:
        action = low[start + len("<action>") : end].strip()
        valid = True
    else:
        action = low[-fallback_chars:].strip() if fallback_chars > 0 else ""
        valid = False
    if "<think>" not in text or "</think>" not in text:
        valid = False
    if CJK.search(text):
        valid = False
    return action, valid


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(x for x in spans if x[1] > x[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _is_word(c: str) -> bool:
    """``re``'s ``\\w`` on one character (Unicode alphanumeric or ``_``)."""
    return c.isalnum() or c == "_"


class _NextFinder:
    """``low.find(needle, p)`` for non-decreasing ``p`` in amortised linear total time: an
    answer ``q >= p`` found from an earlier ``p0 <= p`` is still the first occurrence at or after
    ``p``; once nothing is found, nothing will be."""

    def __init__(self, low: str, needle: str):
        self.low, self.needle = low, needle
        self.hit = -2  # -2: not searched yet; -1: no occurrence at or after the last query

    def find(self, p: int) -> int:
        if self.hit == -1 or (self.hit >= p):
            return self.hit
        self.hit = self.low.find(self.needle, p)
        return self.hit


def _well_formed(text: str, low: str) -> list[tuple[int, int]]:
    """Inner spans of ``<action\\b[^>]*>(.*?)</action>`` (case-insensitive, dotall), as
    ``re.finditer`` would give them, in linear time."""
    out: list[tuple[int, int]] = []
    gt, close = _NextFinder(low, ">"), _NextFinder(low, "</action>")
    pos = 0
    while (s := low.find("<action", pos)) != -1:
        after = s + len("<action")
        if after < len(text) and _is_word(text[after]):
            pos = s + 1
            continue
        g = gt.find(after)
        c = close.find(g + 1) if g != -1 else -1
        if c == -1:  # no '>' or no closing tag after this opening: none after a later one either
            break
        out.append((g + 1, c))
        pos = c + len("</action>")
    return out


def _between(low: str, head: str, tail: str, ok=lambda s: True) -> list[tuple[int, int]]:
    """Inner spans of ``head(.*?)tail`` (literal head/tail, case-insensitive, dotall) whose
    head start satisfies ``ok``, as ``re.finditer`` would give them, in linear time."""
    out: list[tuple[int, int]] = []
    close = _NextFinder(low, tail)
    pos = 0
    while (s := low.find(head, pos)) != -1:
        if not ok(s):
            pos = s + 1
            continue
        c = close.find(s + len(head))
        if c == -1:
            break
        out.append((s + len(head), c))
        pos = c + len(tail)
    return out


def _unclosed(text: str, low: str) -> list[tuple[int, int]]:
    """The inner span of ``<action\\b[^>]*>(.*)\\Z``: from the first ``>`` after the first
    ``<action`` (followed by a non-word character) to the end of the text."""
    pos = 0
    while (s := low.find("<action", pos)) != -1:
        after = s + len("<action")
        if after < len(text) and _is_word(text[after]):
            pos = s + 1
            continue
        g = low.find(">", after)
        return [(g + 1, len(text))] if g != -1 else []
    return []


def _tool_calls(low: str) -> list[tuple[int, int]]:
    """Whole-match spans of ``(?:search|click)\\[[^\\]]*\\]`` (case-insensitive), in linear time."""
    out: list[tuple[int, int]] = []
    heads = [_NextFinder(low, h) for h in _TOOL_HEADS]
    close = _NextFinder(low, "]")
    pos = 0
    while True:
        hits = [(h.find(pos), len(h.needle)) for h in heads]
        hits = [x for x in hits if x[0] != -1]
        if not hits:
            break
        s, n = min(hits)
        c = close.find(s + n)
        if c == -1:
            break
        out.append((s, c + 1))
        pos = c + 1
    return out


def action_char_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the action content (as SERL's action mask, arXiv 2605.19447).

    Union of the inner content of ``<action …>X</action>``, ``[action>X</action>]`` and bare
    ``action>X</action>`` (not preceded by ``<``, ``[``, ``/`` or a word character); if none, an
    unclosed ``<action…>`` to the end of the text; if still none, any ``search[...]`` /
    ``click[...]`` substring. Tags match case-insensitively; the content is the shortest up to
    the first closing tag. Overlapping spans are merged; the tag characters themselves are never
    inside a span.

    The result equals ``re.finditer`` with the patterns ``<action\\b[^>]*>(.*?)</action>``,
    ``\\[action>(.*?)</action>\\]``, ``(?<![<\\[/\\w])action>(.*?)</action>``,
    ``<action\\b[^>]*>(.*)\\Z`` and ``(?:search|click)\\[[^\\]]*\\]`` (IGNORECASE | DOTALL), but
    runs in time linear in ``len(text)``: those regexes rescan the rest of the text from every
    unmatched opening tag (quadratic on long repeated-tag text).
    """
    low = text.translate(_FOLD_TABLE)
    spans = _well_formed(text, low)
    spans += _between(low, "[action>", "</action>]")
    spans += _between(low, "action>", "</action>", lambda s: s == 0 or not (text[s - 1] in "<[/" or _is_word(text[s - 1])))
    if not spans:
        spans = _unclosed(text, low)
    if not spans:
        spans = _tool_calls(low)
    return _merge(spans)


def token_char_offsets(token_ids: list[int], tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """Decode ``token_ids`` and give each token its ``[start, end)`` range in the decoded text.

    Works on the true sampled ids by incremental decoding: the end of token ``k`` is the length
    of the decoded prefix ``ids[:k+1]`` (clipped to the common prefix with the full text, so a
    partial UTF-8 character yields an empty range until it completes). Special tokens (EOS) decode
    to nothing and get empty ranges.

    Returns:
        ``(text, offsets)`` with ``len(offsets) == len(token_ids)``.
    """
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    offsets: list[tuple[int, int]] = []
    prev = 0
    for k in range(len(token_ids)):
        prefix = tokenizer.decode(token_ids[: k + 1], skip_special_tokens=True)
        if text.startswith(prefix):
            end = len(prefix)
        else:  # a partial multi-byte character decodes to U+FFFD: count only the common prefix
            end = 0
            for a, b in zip(prefix, text):
                if a != b:
                    break
                end += 1
        end = max(end, prev)
        offsets.append((prev, end))
        prev = end
    return text, offsets


def action_token_mask(token_ids: list[int], tokenizer) -> tuple[str, list[int]]:
    """Per sampled token, 1 if its characters overlap an action span (partial overlap counts).

    Args:
        token_ids: the sampled response ids, ``[resp_len]``.
        tokenizer: the policy's tokenizer.

    Returns:
        ``(decoded_text, mask)`` with ``mask`` a list of 0/1 of length ``resp_len``.
    """
    text, offsets = token_char_offsets(token_ids, tokenizer)
    spans = action_char_spans(text)
    mask = []
    for s, e in offsets:
        mask.append(int(e > s and any(s < se and ss < e for ss, se in spans)))
    return text, mask
