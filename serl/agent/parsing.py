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

_FLAGS = re.IGNORECASE | re.DOTALL
# well-formed <action ...>X</action>
_WELL_FORMED = re.compile(r"<action\b[^>]*>(.*?)</action>", _FLAGS)
# [action>X</action>]
_BRACKETED = re.compile(r"\[action>(.*?)</action>\]", _FLAGS)
# bare action>X</action> (a broken opening tag)
_BARE = re.compile(r"(?<![<\[/\w])action>(.*?)</action>", _FLAGS)
# unclosed <action ...> to the end of the text
_UNCLOSED = re.compile(r"<action\b[^>]*>(.*)\Z", _FLAGS)
# WebShop-style actions anywhere (last resort, as the original; can match inside <think>)
_TOOL = re.compile(r"(?:search|click)\[[^\]]*\]", re.IGNORECASE)


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


def action_char_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the action content (as SERL's action mask, arXiv 2605.19447).

    Union of the inner content of ``<action …>X</action>``, ``[action>X</action>]`` and bare
    ``action>X</action>``; if none, an unclosed ``<action…>`` to the end of the text; if still
    none, any ``search[...]`` / ``click[...]`` substring. Overlapping spans are merged; the tag
    characters themselves are never inside a span.
    """
    spans = [m.span(1) for pat in (_WELL_FORMED, _BRACKETED, _BARE) for m in pat.finditer(text)]
    if not spans:
        spans = [m.span(1) for m in _UNCLOSED.finditer(text)]
    if not spans:
        spans = [m.span(0) for m in _TOOL.finditer(text)]
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
