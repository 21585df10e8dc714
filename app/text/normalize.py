"""Text normalization before synthesis: "5 apples" -> "five apples", "20%" -> "百分之二十".

CosyVoice's LLM reads text tokens, and a digit, currency sign or unit abbreviation is
not what a speaker says. Upstream CosyVoice normalizes with ``ttsfrd`` or, without it,
with WeTextProcessing's runtime ``wetext`` (its zh / en / ja FSTs ship in the wheel, no
download). We do the same with ``wetext``, choosing the language per sentence:

* the text is cut into sentences; each gets a language from its own characters
  (kana -> ja, Han ideographs -> zh, Latin letters -> en; none: the text's main language);
* each sentence is normalized on its own (a cut after "Dr." or "Jan." is undone first),
  CosyVoice markup (``[laughter]``, ``<strong>``, ``<|endofprompt|>``) is
  passed through untouched;
* a piece wetext cannot normalize is kept as written.

The FSTs are read once per process (wetext caches them; we serialise the first reads)
and everything here is blocking: the engine calls it in its slot thread, never on the
event loop. No torch, no CosyVoice imports.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from app.text.scripts import (
    CLAUSE_MARKS,
    FULLWIDTH_CLAUSE_MARKS,
    FULLWIDTH_ENDS,
    HAN_CHAR,
    KANA_CHAR,
    LATIN_CHAR,
    SPACED_ENDS,
    cut_sentences,
)

log = logging.getLogger("cosyserve.engine.normalize")

MODES = ("auto", "off")
LANGUAGES = ("zh", "en", "ja")

# CosyVoice markup that must reach the tokenizer as written.
_MARKUP = re.compile(r"<\|[^|<>\s]+\|>|</?[a-z_]+>|\[[A-Za-z_\-]+\d?\]|\[[^\]\s\d]{1,6}\]")

# English text wetext would change: digits, symbols it reads out, abbreviations such as "Dr.".
# Other English is passed by (wetext's English grammar costs ~10 ms per 100 characters even
# when it changes nothing); zh / ja wetext itself only normalizes text with digits.
_EN_NEEDS_TN = re.compile(r"[\d$€£¥₹%&@#+/°=]|\b[A-Z][a-z]{0,3}\.")

_ABBREVIATION_END = re.compile(r"\b(?:[A-Z][a-z]{0,3}|[a-z]{1,3}\.[a-z])\.$")  # "Dr." "Jan." "e.g."

_load_lock = threading.Lock()


def detect_language(text: str) -> str | None:
    """zh, en or ja from the characters of ``text``; None when it has no letters we normalize.

    Japanese is recognised by kana (kanji alone read as Chinese); Korean and other
    scripts are not normalized.
    """
    if KANA_CHAR.search(text):
        return "ja"
    han = len(HAN_CHAR.findall(text))
    latin = len(LATIN_CHAR.findall(text))
    if han and han * 3 >= latin:  # a Chinese sentence with an English word or two is still Chinese
        return "zh"
    if latin:
        return "en"
    if han:
        return "zh"
    return None


def language_pieces(text: str) -> list[tuple[str | None, str]]:
    """``text`` as ``(language, sentence)`` pieces, in order; joining them with spaces gives it back.

    A sentence cut after an abbreviation ("Dr.", "Jan.") is joined to what follows. Pieces
    are normalized one by one: wetext's cost grows faster than linearly with its input.
    """
    sentences = cut_sentences(text)
    merged: list[str] = []
    for sentence in sentences:
        if merged and _ABBREVIATION_END.search(merged[-1]):
            merged[-1] = merged[-1] + " " + sentence
        else:
            merged.append(sentence)
    langs = [detect_language(s) for s in merged]
    known = [lang for lang in langs if lang]
    main = max(set(known), key=known.count) if known else None
    return [(lang or (main if re.search(r"\d", s) else None), s) for lang, s in zip(langs, merged)]


class TextNormalizer:
    """wetext text normalization for zh, en and ja (thread-safe; ``load`` once, off the event loop)."""

    def __init__(self, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"text_normalization must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self._normalizers: dict[str, Any] = {}
        self.available = False

    @property
    def enabled(self) -> bool:
        return self.mode == "auto" and self.available

    def load(self) -> None:
        """Import wetext and read its FSTs (blocking, ~0.5 s once per process); warn if wetext is missing."""
        if self.mode == "off":
            return
        try:
            from wetext import Normalizer
        except ImportError:
            log.warning("engine.text_normalization is auto but wetext is not installed: text is spoken as written "
                        "(pip install wetext)")
            return
        with _load_lock:  # the first reads fill wetext's per-process FST cache; one thread does them
            for lang in LANGUAGES:
                norm = Normalizer(lang=lang, operator="tn", remove_erhua=False)
                norm.normalize("1")  # reads the FSTs now, not in the first request
                self._normalizers[lang] = norm
        self.available = True

    def normalize(self, text: str) -> str:
        """``text`` normalized per sentence; unchanged when normalization is off or unavailable."""
        if not self.enabled or not text.strip():
            return text
        return "\n".join(self._normalize_line(line) for line in text.split("\n"))  # line breaks stay breaks

    def _normalize_line(self, line: str) -> str:
        return _join([self._normalize_piece(lang, piece) if lang else piece for lang, piece in language_pieces(line)])

    def _normalize_piece(self, lang: str, piece: str) -> str:
        parts: list[str] = []
        for is_markup, part in _split_markup(piece):
            if is_markup or not part.strip() or (lang == "en" and not _EN_NEEDS_TN.search(part)):
                parts.append(part)
                continue
            try:
                parts.append(_keep_edges(part, self._normalizers[lang].normalize(part)))
            except Exception:  # wetext finds no path for some inputs: speak those as written
                log.debug("wetext (%s) could not normalize %r; keeping it", lang, part, exc_info=True)
                parts.append(part)
        return "".join(parts)


def _keep_edges(original: str, normalized: str) -> str:
    """wetext strips the ends; keep the original's surrounding spaces so markup stays separated."""
    lead = original[: len(original) - len(original.lstrip())]
    trail = original[len(original.rstrip()):]
    return lead + normalized.strip() + trail


def _split_markup(text: str) -> Iterator[tuple[bool, str]]:
    pos = 0
    for m in _MARKUP.finditer(text):
        if m.start() > pos:
            yield False, text[pos:m.start()]
        yield True, m.group(0)
        pos = m.end()
    if pos < len(text):
        yield False, text[pos:]


def _join(pieces: list[str]) -> str:
    out = ""
    for p in pieces:
        if not out:
            out = p
        elif out[-1] in SPACED_ENDS + ",":
            out += " " + p
        elif out[-1] in FULLWIDTH_ENDS or HAN_CHAR.match(out[-1]) or HAN_CHAR.match(p) or KANA_CHAR.match(p):
            out += p
        else:
            out += " " + p
    return out


# A clause ends at punctuation (then maybe spaces): enough context for wetext to read a number.
_CLAUSE_END = re.compile(rf"[{re.escape(CLAUSE_MARKS + SPACED_ENDS + FULLWIDTH_CLAUSE_MARKS + FULLWIDTH_ENDS)}]\s*$")


class ClauseNormalizer:
    """Normalization for text that arrives word by word (a WebSocket, an LLM's stream).

    wetext needs context ("5" alone stays "5"; "I have 5 apples." reads "five"), so text
    that wetext would change (digits, symbols, abbreviations) is held back until its clause
    ends and then normalized as one piece; text it would not change passes on at once, so
    prose still starts speaking mid-sentence.
    """

    def __init__(self, normalize: Callable[[str], str]) -> None:
        self._normalize = normalize
        self._held = ""

    def feed(self, words: str) -> str:
        self._held += words
        if _EN_NEEDS_TN.search(self._held) and not _CLAUSE_END.search(self._held):
            return ""
        return self.flush()

    def flush(self) -> str:
        held, self._held = self._held, ""
        return _keep_edges(held, self._normalize(held)) if held.strip() else held  # " have" stays " have"
