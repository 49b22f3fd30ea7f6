"""A Python twin of Anserini's ``DefaultEnglishAnalyzer`` (Lucene 9.5), for WebShop search.

WebShop indexes and queries its products with Anserini (``princeton-nlp/WebShop@64fa2a5:search_engine/``, via
pyserini). Its analyzer chain is

1. ``StandardTokenizer``: Unicode UAX#29 word segmentation; only segments holding a letter, a
   digit, a CJK/kana character or an emoji become tokens (punctuation and plain symbols are
   dropped); tokens longer than 255 characters are cut into 255-character pieces;
2. ``EnglishPossessiveFilter``: a trailing ``'s`` / ``’s`` / ``＇s`` is removed;
3. ``LowerCaseFilter`` (Java's per-code-point ``Character.toLowerCase``, :func:`lucene_lower`);
4. ``StopFilter`` with Lucene's 33 English stop words (:data:`STOP_WORDS`);
5. ``PorterStemFilter``: the Porter stemmer in Martin Porter's own C/Java variant, which leaves
   tokens of at most 2 characters alone. NLTK's ``PorterStemmer(mode=MARTIN_EXTENSIONS)`` is
   that variant (``technology`` → ``technolog``, ``us`` → ``us``); Snowball's ``porter``
   (PyStemmer) is not (``technologi``, ``u``).

Segmentation uses the ``regex`` package's UAX#29 word boundaries (``(?w)\\b``). Emoji follow
Lucene's rule (every ``Extended_Pictographic`` character is a token) with Lucene's own
Unicode 14 emoji data (:data:`_EXT_PICT_RANGES`), because ``regex``'s newer Unicode tables no
longer count symbols such as ★ or ☞ as pictographic while Lucene 9.5 does.

Known gaps (none occurs in WebShop's queries or documents; see ``tests/test_webshop_search.py``): runs
of South-East-Asian script are not merged into one token, a skin-tone modifier standing alone is
dropped (Lucene keeps it), and Unicode-version differences of the word-break tables (Lucene uses
Unicode 9) are not emulated. On the 1000 WebShop documents our analysis yields the same 107,608
terms as Anserini 0.22.1's analyzer, document by document (checked against Anserini's
``DefaultEnglishAnalyzer`` run on the JVM). The last difference was a leading apostrophe:
``regex`` keeps `` 'is`` / `` ’em`` as one segment, so ``"me 'is it"`` (asin B07YN72RH4) gave the
term ``'i`` where Lucene drops the stop word ``is``; :func:`tokenize` now strips a leading
mid-word character from a segment.

The stemmer is imported lazily and every distinct surface form is stemmed once (a per-process
cache), so a query costs a dictionary look-up per word.
"""

from __future__ import annotations

from functools import lru_cache

import regex

#: Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`` (33 words).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)

#: StandardTokenizer's default maximum token length (characters).
MAX_TOKEN_LENGTH = 255

#: Lucene 9.5's ``Extended_Pictographic`` (its ``UnicodeEmojiProperties.jflex``, generated from
#: ICU 70 / Unicode 14 emoji data), as inclusive code-point ranges. Unicode property data.
_EXT_PICT_RANGES = (
    (0xA9, 0xA9), (0xAE, 0xAE), (0x203C, 0x203C), (0x2049, 0x2049), (0x2122, 0x2122), (0x2139, 0x2139),
    (0x2194, 0x2199), (0x21A9, 0x21AA), (0x231A, 0x231B), (0x2328, 0x2328), (0x2388, 0x2388),
    (0x23CF, 0x23CF), (0x23E9, 0x23F3), (0x23F8, 0x23FA), (0x24C2, 0x24C2), (0x25AA, 0x25AB),
    (0x25B6, 0x25B6), (0x25C0, 0x25C0), (0x25FB, 0x25FE), (0x2600, 0x2605), (0x2607, 0x2612),
    (0x2614, 0x2685), (0x2690, 0x2705), (0x2708, 0x2712), (0x2714, 0x2714), (0x2716, 0x2716),
    (0x271D, 0x271D), (0x2721, 0x2721), (0x2728, 0x2728), (0x2733, 0x2734), (0x2744, 0x2744),
    (0x2747, 0x2747), (0x274C, 0x274C), (0x274E, 0x274E), (0x2753, 0x2755), (0x2757, 0x2757),
    (0x2763, 0x2767), (0x2795, 0x2797), (0x27A1, 0x27A1), (0x27B0, 0x27B0), (0x27BF, 0x27BF),
    (0x2934, 0x2935), (0x2B05, 0x2B07), (0x2B1B, 0x2B1C), (0x2B50, 0x2B50), (0x2B55, 0x2B55),
    (0x3030, 0x3030), (0x303D, 0x303D), (0x3297, 0x3297), (0x3299, 0x3299), (0x1F000, 0x1F0FF),
    (0x1F10D, 0x1F10F), (0x1F12F, 0x1F12F), (0x1F16C, 0x1F171), (0x1F17E, 0x1F17F), (0x1F18E, 0x1F18E),
    (0x1F191, 0x1F19A), (0x1F1AD, 0x1F1E5), (0x1F201, 0x1F20F), (0x1F21A, 0x1F21A), (0x1F22F, 0x1F22F),
    (0x1F232, 0x1F23A), (0x1F23C, 0x1F23F), (0x1F249, 0x1F3FA), (0x1F400, 0x1F53D), (0x1F546, 0x1F64F),
    (0x1F680, 0x1F6FF), (0x1F774, 0x1F77F), (0x1F7D5, 0x1F7FF), (0x1F80C, 0x1F80F), (0x1F848, 0x1F84F),
    (0x1F85A, 0x1F85F), (0x1F888, 0x1F88F), (0x1F8AE, 0x1F8FF), (0x1F90C, 0x1F93A), (0x1F93C, 0x1F945),
    (0x1F947, 0x1FAFF), (0x1FC00, 0x1FFFD),
)


def _char_class(ranges) -> str:
    return "".join(f"{regex.escape(chr(a))}-{regex.escape(chr(b))}" for a, b in ranges)


_EXT_PICT = _char_class(_EXT_PICT_RANGES)

# UAX#29 word segments (regex's default word boundaries); every piece between two boundaries.
_BOUNDARY = regex.compile(r"(?w)\b")
# A segment becomes a token when it holds one of the characters StandardTokenizer's grammar
# builds tokens from (word / number / katakana / hebrew / han / hiragana / SE-Asian / emoji).
_TOKEN_CHAR = regex.compile(
    r"[\p{WB=ALetter}\p{WB=Hebrew_Letter}\p{WB=Numeric}\p{WB=Katakana}\p{Script=Han}\p{Script=Hiragana}"
    r"\p{LB=SA}\p{WB=Regional_Indicator}" + _EXT_PICT + r"]"
)
_EMOJI_ONLY = regex.compile(r"[" + _EXT_PICT + r"\p{WB=Extend}\p{WB=Format}\p{WB=ZWJ}]+")
# A word segment never starts with a mid-word character (UAX#29 WB6/WB7 and WB11/WB12 need a
# letter or digit on both sides), but ``regex`` joins a leading apostrophe to the next word when a
# space precedes it (`` 'is`` → ``'is``, `` ’em`` → ``’em``); Lucene emits ``is`` / ``em``.
_LEADING_MID = regex.compile(
    r"^(?:[\p{WB=MidLetter}\p{WB=MidNumLet}\p{WB=Single_Quote}\p{WB=MidNum}][\p{WB=Extend}\p{WB=Format}\p{WB=ZWJ}]*)+"
)
_POSSESSIVE = ("'", "\u2019", "\uff07")


def tokenize(text: str) -> list[str]:
    """StandardTokenizer: the token strings of ``text`` in order (original case)."""
    out: list[str] = []
    for seg in _BOUNDARY.split(text):
        if not seg or _TOKEN_CHAR.search(seg) is None:
            continue
        seg = _LEADING_MID.sub("", seg)
        if "\ufe0e" in seg and _EMOJI_ONLY.fullmatch(seg.replace("\ufe0e", "")):
            seg = seg.replace("\ufe0e", "")  # Lucene's emoji rule does not absorb VS15
        if len(seg) > MAX_TOKEN_LENGTH:
            out.extend(seg[i : i + MAX_TOKEN_LENGTH] for i in range(0, len(seg), MAX_TOKEN_LENGTH))
        else:
            out.append(seg)
    return out


_STEMMER = None


def _stemmer():
    global _STEMMER
    if _STEMMER is None:
        try:
            from nltk.stem.porter import PorterStemmer
        except ImportError as e:  # pragma: no cover - nltk is a declared dependency
            raise ImportError("WebShop search needs nltk (`pip install nltk`) for Lucene's Porter stemmer") from e
        _STEMMER = PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)
    return _STEMMER


_STEMS: dict[str, str] = {}


def stem(word: str) -> str:
    """Porter stem (Martin variant) of an already lower-cased word; cached per process."""
    s = _STEMS.get(word)
    if s is None:
        s = word if len(word) <= 2 else _stemmer().stem(word, to_lowercase=False)
        _STEMS[word] = s
    return s


def preload_stems(table: dict[str, str]) -> None:
    """Seed the stem cache (e.g. from a cached index) so known words never load the stemmer."""
    for k, v in table.items():
        _STEMS.setdefault(k, v)


def stem_cache() -> dict[str, str]:
    """The per-process surface-form → stem cache (read-only use)."""
    return _STEMS


#: characters whose Python ``str.lower`` is not one code point, mapped as Java's
#: ``Character.toLowerCase(int)`` maps them (UnicodeData's simple lower-case mapping). In current
#: Unicode this is only U+0130 (``"İ".lower()`` is ``"i̇"``, two code points; Java gives ``"i"``).
_JAVA_LOWER_SPECIAL = {"\u0130": "i"}


def lucene_lower(text: str) -> str:
    """Lucene's ``LowerCaseFilter``: ``Character.toLowerCase`` applied to each code point.

    It differs from Python's ``str.lower`` in two ways: ``"İ"`` (U+0130) becomes ``"i"`` (Python:
    ``"i̇"``, i + U+0307), and a final capital sigma becomes ``"σ"`` (Python applies the
    Final_Sigma rule and gives ``"ς"``).
    """
    if text.isascii():
        return text.lower()
    return "".join(_JAVA_LOWER_SPECIAL.get(c) or c.lower() for c in text)


@lru_cache(maxsize=65536)
def _term(token: str) -> str | None:
    """Possessive removal, lower-casing (:func:`lucene_lower`), stop-word removal and stemming of one token."""
    if len(token) >= 2 and token[-1] in "sS" and token[-2] in _POSSESSIVE:
        token = token[:-2]
    low = lucene_lower(token)
    if not low or low in STOP_WORDS:
        return None
    return stem(low)


def analyze(text: str) -> list[str]:
    """The index terms of ``text``, in order, as Anserini's DefaultEnglishAnalyzer emits them."""
    out = []
    for tok in tokenize(text):
        t = _term(tok)
        if t is not None:
            out.append(t)
    return out
