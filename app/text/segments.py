"""Cut text that arrives over time into segments, one LLM sequence each, as it arrives.

A WebSocket utterance may run to thousands of characters. Spoken as one bistream sequence its
LLM context grows with every word (each step attends to all of it), the flow recomputes an
ever longer prefix, and the sequence runs out of its token budget: 4,000 characters spoke at
0.23 audio-s per second against 13 over HTTP, which speaks sentence by sentence. So
:class:`StreamSegments` hands an engine one segment at a time, each a text stream of its own
that ends at the first sentence end once it holds ``min_chars``, or before it would pass
``max_chars`` characters or ``max_tokens`` text tokens (cut at a clause mark, then a space,
as ``split.py`` cuts long text): the segments HTTP makes, while the text still streams in,
so the first segment starts speaking before its sentence is complete.

Pure Python, no model imports: the token count is the engine's (``count``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator

from app.text.scripts import CLAUSE_MARKS, FULLWIDTH_CLAUSE_MARKS, SENTENCE_END
from app.text.split import speakable
from app.text.stream import TextStream

_TAIL = 8  # characters of the segment kept to find a sentence end that spans two pieces ("end." + " Next")
_MARK = re.compile(rf"[{re.escape(CLAUSE_MARKS + FULLWIDTH_CLAUSE_MARKS)}]\s*")  # a clause ends
_CLAUSE = re.compile(rf"{_MARK.pattern}|\s+")  # ... or at least a word


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

    def _fits(self, text: str) -> bool:
        return (len(text) <= self.max_chars
                and (self._count is None or self._max_tokens is None or self._count(text) <= self._max_tokens))

    def _cut(self, held: str, piece: str) -> int | None:
        """Where in ``piece`` the segment holding ``held`` ends (None: not in it)."""
        tail = held[-_TAIL:]
        for m in SENTENCE_END.finditer(tail + piece):
            at = m.end() - len(tail)
            if at <= 0:
                continue
            if not self._fits(held + piece[:at]):
                break  # this sentence is too long: cut it within the budget below
            if len(held) + at >= self.min_chars:
                return at
        if self._fits(held + piece):
            return None
        return self._forced(held, piece)

    def _forced(self, held: str, piece: str) -> int:
        """The longest prefix of ``piece`` that keeps the segment in budget, cut after a clause mark or a
        space (0: end the segment before ``piece``). A word is cut only when it alone is over budget."""
        room = min(len(piece), self.max_chars - len(held))
        while room > 0:
            marks = [m.end() for m in _MARK.finditer(piece, 0, room) if m.end() <= room]
            words = [m.end() for m in _CLAUSE.finditer(piece, 0, room) if m.end() <= room]
            if not words:
                break
            at = marks[-1] if marks and marks[-1] > room // 2 else words[-1]  # a clause, unless it is short
            if self._fits(held + piece[:at]):
                return at
            room = at - 1
        if held and (held[-1].isspace() or _CLAUSE.match(held[-1])):
            return 0  # the segment ends at a word's end already
        if held:  # it ends inside a word that goes on in ``piece``: end after that word (a little over)
            m = _CLAUSE.search(piece)
            return m.end() if m else 0
        at = max(1, min(len(piece), self.max_chars))  # one word longer than the budget: cut it
        while at > 1 and not self._fits(piece[:at]):
            at //= 2
        return at


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
