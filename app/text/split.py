"""Sentence splitting for long input, so it is synthesised and streamed piece by piece.

Text normalization (numbers, dates -> words) happens before this, in ``normalize.py``;
here we only cut text into sentence-sized segments the LLM handles well, within its
text-token budget (``fit_token_budget``). Pure Python, no model imports.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from app.text.scripts import CLAUSE_MARKS, FULLWIDTH_CLAUSE_MARKS, cut_sentences, is_cjk

_SOFT_BREAK = re.compile(rf"(?<=[{re.escape(CLAUSE_MARKS + FULLWIDTH_CLAUSE_MARKS)}])\s*")


def speakable(text: str) -> bool:
    """It has something to say (a letter or a digit), not only spaces and marks."""
    return any(ch.isalnum() for ch in text)


def _length(text: str) -> int:
    """A length that treats one CJK character like one short word."""
    return len(text) if not is_cjk(text) else len(text) * 3


def _hard_split(piece: str, max_len: int) -> list[str]:
    """Split an over-long piece at commas, then at spaces, then anywhere."""
    parts = [p for p in _SOFT_BREAK.split(piece) if p.strip()]
    out: list[str] = []
    cur = ""
    for p in parts:
        cand = (cur + (" " if cur and not is_cjk(p) and not cur.endswith(" ") else "") + p) if cur else p
        if _length(cand) <= max_len:
            cur = cand
            continue
        if cur:
            out.append(cur)
        cur = p
        while _length(cur) > max_len:
            cut = _cut_point(cur, max_len)
            out.append(cur[:cut].strip())
            cur = cur[cut:].strip()
    if cur.strip():
        out.append(cur.strip())
    return out


def _cut_point(text: str, max_len: int) -> int:
    limit = max_len // 3 if is_cjk(text) else max_len
    limit = max(1, min(limit, len(text)))
    space = text.rfind(" ", 0, limit)
    return space if space > limit // 2 else limit


def split_sentences(text: str, max_len: int = 240, min_len: int = 30) -> list[str]:
    """Split ``text`` into segments of at most ~``max_len`` characters.

    Sentences shorter than ``min_len`` are merged with the next one so the
    model is not asked to speak one word at a time. Whitespace is normalised;
    segments with no letters or digits (pure punctuation) are dropped.
    """
    text = re.sub(r"[ \t\r\f\v]+", " ", text.strip())
    if not text:
        return []
    raw = cut_sentences(text)
    pieces: list[str] = []
    for s in raw:
        pieces.extend(_hard_split(s, max_len) if _length(s) > max_len else [s])
    merged: list[str] = []
    for p in pieces:
        if merged and _length(merged[-1]) < min_len and _length(merged[-1]) + _length(p) <= max_len:
            sep = "" if is_cjk(merged[-1]) or is_cjk(p) else " "
            merged[-1] = merged[-1] + sep + p
        else:
            merged.append(p)
    if len(merged) > 1 and _length(merged[-1]) < min_len and _length(merged[-2]) + _length(merged[-1]) <= max_len:
        last = merged.pop()
        merged[-1] = merged[-1] + ("" if is_cjk(last) else " ") + last
    return [m for m in merged if speakable(m)]


def fit_token_budget(segments: list[str], count: Callable[[str], int], max_tokens: int) -> list[str]:
    """Split every segment whose ``count`` (text tokens) exceeds ``max_tokens`` until each fits.

    The character limit of :func:`split_sentences` only approximates the LLM's budget
    (digits, symbols and rare scripts cost more tokens per character); this enforces
    it, cutting at commas, then spaces, then anywhere, as ``split_sentences`` does.
    """
    out: list[str] = []
    for seg in segments:
        out.extend(_fit(seg, count, max_tokens))
    return [s for s in out if speakable(s)]


def _fit(seg: str, count: Callable[[str], int], max_tokens: int) -> list[str]:
    if len(seg) <= 1 or count(seg) <= max_tokens:
        return [seg]
    parts = _hard_split(seg, max(1, _length(seg) // 2))
    if len(parts) < 2:
        cut = len(seg) // 2
        parts = [seg[:cut].strip(), seg[cut:].strip()]
    return [p for part in parts if part for p in _fit(part, count, max_tokens)]
