"""Text that arrives over time: the input of a streamed (WebSocket) utterance.

A :class:`TextStream` is written by the serving layer on the event loop
(``put`` each piece as the client sends it, ``end`` at ``input.done``) and read
by an engine in its own thread (``pieces``), which blocks until the next piece,
the end, or its cancel flag. Two helpers turn the pieces into units an engine
can use without re-reading what it already consumed:

* :class:`WordBuffer` holds back a trailing partial word, so text cut anywhere
  ("Hel" + "lo wor" + "ld") is tokenised in whole words, as if sent at once;
* :func:`sentences` yields complete sentences as they end (engines that speak
  sentence by sentence: CosyVoice-300M, or the unbatched path).

Pure Python, no model imports.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Iterator

from app.text.scripts import CJK, FULLWIDTH_CLAUSE_MARKS, FULLWIDTH_ENDS, SENTENCE_END
from app.text.split import split_sentences

POLL_S = 0.05  # how often a blocked reader re-checks its cancel flag

# A word ends at whitespace or after a CJK character or full-width mark (CJK text has no spaces).
_BOUNDARY = re.compile(rf"\s+|[{CJK}{re.escape(FULLWIDTH_ENDS + FULLWIDTH_CLAUSE_MARKS)}]")


class TextStream:
    """A thread-safe queue of text pieces with an end mark."""

    def __init__(self) -> None:
        self._pieces: deque[str] = deque()
        self._cond = threading.Condition()
        self._ended = False
        self.chars = 0  # characters put so far
        self.last_at = time.monotonic()  # when text last came (or the end): a job's deadline counts from here

    def put(self, text: str) -> None:
        with self._cond:
            if self._ended:
                raise RuntimeError("text stream already ended")
            self._pieces.append(text)
            self.chars += len(text)
            self.last_at = time.monotonic()
            self._cond.notify_all()

    def end(self) -> None:
        """No more text (idempotent)."""
        with self._cond:
            if not self._ended:
                self.last_at = time.monotonic()
            self._ended = True
            self._cond.notify_all()

    @property
    def ended(self) -> bool:
        return self._ended

    def get(self, timeout: float | None = None) -> str | None:
        """The next piece; None at the end. Raises TimeoutError if none came within ``timeout``."""
        with self._cond:
            if not self._pieces and not self._ended:
                self._cond.wait(timeout)
            if self._pieces:
                return self._pieces.popleft()
            if self._ended:
                return None
            raise TimeoutError

    def next_piece(self, cancel: threading.Event) -> str | None:
        """The next piece, blocking for it; None at the end or once ``cancel`` is set."""
        while not cancel.is_set():
            try:
                return self.get(POLL_S)
            except TimeoutError:
                continue
        return None

    def pieces(self, cancel: threading.Event) -> Iterator[str]:
        """Every piece in order, blocking for the next; stops at the end or when ``cancel`` is set."""
        while (piece := self.next_piece(cancel)) is not None:
            yield piece


class WordBuffer:
    """Releases text only up to the last word boundary (space or CJK character) until flushed."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        self._held += text
        cut = -1
        for m in _BOUNDARY.finditer(self._held):
            cut = m.start() if m.group().isspace() else m.end()
        if cut <= 0:
            return ""
        out, self._held = self._held[:cut], self._held[cut:]
        return out

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out


def sentences(pieces: Iterator[str], max_len: int = 240) -> Iterator[str]:
    """Complete sentences from text pieces, each as soon as it ends; the rest at the end.

    A sentence ends where :data:`app.text.scripts.SENTENCE_END` matches: an ASCII mark is an end
    only once whitespace has arrived after it ("3." may go on "50"), a full-width mark at once.
    Text that grows past ``max_len`` without one is cut at a comma or space.
    """
    buf = ""
    for piece in pieces:
        buf += piece
        while True:
            end = SENTENCE_END.search(buf)
            if end is None:
                break
            done, buf = buf[:end.end()], buf[end.end():]
            yield from split_sentences(done, max_len=max_len, min_len=0)
        if len(buf) > max_len:
            parts = split_sentences(buf, max_len=max_len, min_len=0)
            yield from parts[:-1]
            buf = (parts[-1] + (" " if buf[-1].isspace() else "")) if parts else ""
    yield from split_sentences(buf, max_len=max_len, min_len=0)
