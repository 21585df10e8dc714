"""The one text planner: text cut into segments, one LLM sequence each, whole or as it arrives.

Every door plans text here. A segment ends at the first sentence end once it weighs ``min_chars``,
or before it would pass ``max_chars`` (weighed: a CJK character counts as a short word, 3) or
``max_tokens`` text tokens (cut at a clause mark, then a word's end, as long text is cut). Whole
text (HTTP: :func:`plan_text`) and text that arrives over time (a WebSocket utterance:
:class:`StreamSegments`) get the same cuts, and a streamed segment is handed on as it arrives, so
the first one starts speaking before its sentence is complete. A long utterance thus costs what
the same text costs whole: spoken as one sequence, its LLM context would grow with every word and
the flow recompute an ever longer prefix (4,000 characters spoke at 0.23 audio-s per second over
the WebSocket against 13 over HTTP before it was cut like this).

Pure Python, no model imports: the token count is the engine's (``count``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator

from app.text.scripts import (
    CJK,
    CJK_CHAR,
    CLAUSE_MARKS,
    FULLWIDTH_CLAUSE_MARKS,
    SENTENCE_END,
)
from app.text.stream import TextStream

_TAIL = 8  # characters of the segment kept to find a sentence end that spans two pieces ("end." + " Next")
_MARK = re.compile(rf"[{re.escape(CLAUSE_MARKS + FULLWIDTH_CLAUSE_MARKS)}]\s*")  # a clause ends
_CLAUSE = re.compile(rf"{_MARK.pattern}|\s+|(?<=[{CJK}])")  # ... or a word (a CJK character is one)
_SPACES = re.compile(r"[ \t\r\f\v]+")
_LINE = re.compile(r"\s*\n\s*")
_NEVER = threading.Event()  # whole text: nothing to cancel


def speakable(text: str) -> bool:
    """It has something to say (a letter or a digit), not only spaces and marks."""
    return any(ch.isalnum() for ch in text)


def weight(text: str) -> int:
    """Its length, a CJK character counted as a short word (3): CJK text has no spaces between words."""
    return len(text) + 2 * len(CJK_CHAR.findall(text))


def _joined(a: str, b: str) -> str:
    return a + b if not a or not b or CJK_CHAR.match(a[-1]) or CJK_CHAR.match(b[0]) else f"{a} {b}"


def plan_text(text: str, *, min_chars: int = 30, max_chars: int = 240, count: Callable[[str], int] | None = None,
              max_tokens: int | None = None) -> list[str]:
    """Whole text as the segments a stream of it gets, each stripped (runs of spaces made one, line breaks
    joined), only the speakable ones; a last segment under ``min_chars`` rides with the one before when
    both fit the budgets together."""
    text = _SPACES.sub(" ", text.strip())
    if not text:
        return []
    stream = TextStream()
    stream.put(text)
    stream.end()
    segments = StreamSegments(stream, min_chars=min_chars, max_chars=max_chars, count=count, max_tokens=max_tokens)
    out: list[str] = []
    while (segment := segments.next(_NEVER)) is not None:
        planned = _flatten("".join(segment.pieces(_NEVER)))
        if speakable(planned):
            out.append(planned)
    if len(out) > 1 and weight(out[-1]) < min_chars and segments.fits(_joined(out[-2], out[-1])):
        last = out.pop()
        out[-1] = _joined(out[-1], last)
    return out


def _flatten(segment: str) -> str:
    """Stripped, each line break (and the spaces around it) made one space, or none between CJK text."""
    parts = [p.strip() for p in segment.split("\n")]
    out = ""
    for p in parts:
        if p:
            out = _joined(out, p)
    return out


def segment_texts(text: TextStream, cancel: threading.Event, **bounds: int | Callable | None) -> Iterator[str]:
    """Each segment's whole text once it is complete (engines that speak a segment at a time); ``bounds``
    as :class:`StreamSegments` takes them."""
    segments = StreamSegments(text, **bounds)  # type: ignore[arg-type]
    while (segment := segments.next(cancel)) is not None:
        whole = "".join(segment.pieces(cancel)).strip()
        if cancel.is_set():
            return
        if speakable(whole):
            yield whole


class StreamSegments:
    """The segments of one text stream, in order: ``next(cancel)`` until it returns None."""

    def __init__(self, text: TextStream, *, min_chars: int = 30, max_chars: int = 240,
                 count: Callable[[str], int] | None = None, max_tokens: int | None = None) -> None:
        if not 0 <= min_chars <= max_chars or max_chars < 1:
            raise ValueError("need 0 <= min_chars <= max_chars, max_chars >= 1")
        self._text = text
        self.min_chars, self.max_chars = min_chars, max_chars
        self._count, self._max_tokens = count, max_tokens
        self._carry = ""  # received, belongs to the next segment
        self._ended = False  # the stream has ended
        self.count = 0  # segments handed out

    def next(self, cancel: threading.Event) -> Segment | None:
        """The next segment, once text for it has come (read it to its end before asking again); None when
        the stream has ended (or ``cancel`` is set) with nothing more to speak (only spaces or marks)."""
        while not speakable(self._carry):
            piece = None if self._ended else self._get(cancel)
            if piece is None:
                self._carry = ""
                return None
            self._carry += piece
        self.count += 1
        return Segment(self)

    # -- used by Segment -----------------------------------------------------------------------------
    def _piece(self, cancel: threading.Event | None) -> str | None:
        """The carry, else the stream's next piece (``cancel`` None: without waiting, see ``_get``)."""
        if self._carry:
            piece, self._carry = self._carry, ""
            return piece
        return None if self._ended else self._get(cancel)

    def _get(self, cancel: threading.Event | None) -> str | None:
        """The stream's next piece, waiting for it; None at its end (then remembered) or on cancel. ``cancel``
        None: no wait, TimeoutError when nothing has come yet."""
        if cancel is None:
            piece = self._text.get(0)
            self._ended = piece is None
            return piece
        piece = self._text.next_piece(cancel)
        self._ended = piece is None and not cancel.is_set()
        return piece

    def fits(self, text: str) -> bool:
        """``text`` is within the budgets: ``max_chars`` weighed, ``max_tokens`` counted."""
        return (weight(text) <= self.max_chars
                and (self._count is None or self._max_tokens is None or self._count(text) <= self._max_tokens))

    def _cut(self, held: str, piece: str) -> int | None:
        """Where in ``piece`` the segment holding ``held`` ends (None: not in it)."""
        tail = held[-_TAIL:]
        for m in SENTENCE_END.finditer(tail + piece):
            at = m.end() - len(tail)
            if at <= 0:
                continue
            if not self.fits(held + piece[:at]):
                break  # this sentence is too long: cut it within the budget below
            if weight(held + piece[:at]) >= self.min_chars:
                return at
        if self.fits(held + piece):
            return None
        return self._forced(held, piece)

    def _forced(self, held: str, piece: str) -> int:
        """The longest prefix of ``piece`` that keeps the segment in budget, cut after a clause mark or a
        space (0: end the segment before ``piece``). A word is cut only when it alone is over budget."""
        room = _room(held, piece, self.max_chars)
        while room > 0:
            marks = [m.end() for m in _MARK.finditer(piece, 0, room) if m.end() <= room]
            words = [m.end() for m in _CLAUSE.finditer(piece, 0, room) if m.end() <= room]
            if not words:
                break
            at = marks[-1] if marks and marks[-1] > room // 2 else words[-1]  # a clause, unless it is short
            if self.fits(held + piece[:at]):
                return at
            room = at - 1
        if held and (held[-1].isspace() or _CLAUSE.match(held[-1]) or CJK_CHAR.match(held[-1])):
            return 0  # the segment ends at a word's end already
        if held:  # it ends inside a word that goes on in ``piece``: end after that word (a little over)
            m = _CLAUSE.search(piece)
            return m.end() if m else 0
        at = max(1, min(len(piece), self.max_chars))  # one word longer than the budget: cut it
        while at > 1 and not self.fits(piece[:at]):
            at //= 2
        return at


def _room(held: str, piece: str, max_chars: int) -> int:
    """How many characters of ``piece`` fit after ``held`` within ``max_chars``, weighed."""
    left = max_chars - weight(held)
    for i, ch in enumerate(piece):
        left -= 3 if CJK_CHAR.match(ch) else 1
        if left < 0:
            return i
    return len(piece)


class Segment:
    """One segment's text, read once through ``pieces`` (what an engine's text feeder reads)."""

    def __init__(self, owner: StreamSegments) -> None:
        self._owner = owner
        self.text = ""  # what this segment got so far
        self._ahead: list[str] = []  # read by ready_text, not yet handed out by pieces
        self._complete = False  # its end was found

    def ready_text(self) -> str | None:
        """The whole segment if its text has all come already (then an engine speaks it as HTTP does, its
        text prefilled at once), else None; reads only what has come, and ``pieces`` still hands it out."""
        while not self._complete:
            try:
                piece = self._owner._piece(None)  # only what has come
            except TimeoutError:
                return None
            head = self._take(piece)
            if head:
                self._ahead.append(head)
        return self.text

    def pieces(self, cancel: threading.Event) -> Iterator[str]:
        ahead, self._ahead = self._ahead, []
        yield from ahead
        while not self._complete:
            head = self._take(self._owner._piece(cancel))
            if head:
                yield head

    def _take(self, piece: str | None) -> str:
        """Add ``piece`` (None: the stream ended) up to the segment's end; what of it is the segment's."""
        owner = self._owner
        if piece is None:
            self._complete = True
            return ""
        at = owner._cut(self.text, piece)
        if at is not None:
            piece, owner._carry = piece[:at], piece[at:]
            self._complete = True
        self.text += piece
        return piece
