"""Text that arrives over time: the input of a streamed (WebSocket) utterance.

A :class:`TextStream` is written by the serving layer on the event loop
(``put`` each piece as the client sends it, ``end`` at ``input.done``) and read
by an engine in its own thread (``pieces``), which blocks until the next piece,
the end, or its cancel flag. A helper turns the pieces into units an engine
can use without re-reading what it already consumed:

* :class:`WordBuffer` holds back a trailing partial word, so text cut anywhere
  ("Hel" + "lo wor" + "ld") is tokenised in whole words, as if sent at once.

Cutting it into segments (sentences within the LLM's budget) is ``segments.py``'s, the one
planner of every door.

Pure Python, no model imports.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Iterator

from app.text.scripts import CJK, FULLWIDTH_CLAUSE_MARKS, FULLWIDTH_ENDS

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
