"""The input side of one bistream sequence: text that arrives while speech is decoded.

CosyVoice2/3's LLM was trained on interleaved sequences (``Qwen2LM`` with
``mix_ratio`` = (5, 15)): start marker, then blocks of 5 text tokens followed by
15 speech tokens, the last speech token of each block predicting a *fill* token
that means "give me the next 5 text tokens"; once the text is exhausted, the
rest of the text, the task marker, and speech until end-of-speech. A prompt's
speech tokens are interleaved with the first text blocks the same way. So speech
can start after the first 5 text tokens instead of after the whole sentence.

:class:`BistreamFeed` is that scheme as a state machine, our own code after
reading upstream's ``Qwen2LM.inference_bistream``:

* the producer (a feeder thread) ``push``-es text token ids and finally ``end``-s;
* the scheduler asks :meth:`next_input` for what to feed next: a list of
  embedding parts (``("marker", i)``, ``("text", ids)``, ``("speech", ids)``), or
  None when it must wait for more text. While it waits the sequence sits out of
  the batch (its cache row saved), costing the others nothing;
* :meth:`decide` turns each step's log-probs into the next token: a fill is
  forced every 15 speech tokens after the prompt (and may be sampled earlier);
  in the bistream phase no other non-speech token is allowed.

Two deliberate differences from upstream's loop: when the text ends before
anything was decoded (a short utterance), the sequence is laid out exactly like
a non-streamed one (all text, task marker, the whole prompt speech) instead of
dropping the prompt speech not yet interleaved; and at the final phase the
token before the fill, already in the cache, is not fed a second time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Part = tuple  # ("marker", index) | ("text", [ids]) | ("speech", [ids])
SOS, TASK = 0, 1  # marker indices into LMSpec.marker_ids


class BistreamFeed:
    def __init__(self, *, speech_token_size: int, fill_token: int, mix_ratio: tuple[int, int],
                 prompt_text: list[int], prompt_speech: list[int], min_ratio: float, max_ratio: float,
                 head_text: list[int] | None = None, trace: bool = False) -> None:
        self.size = speech_token_size
        self.fill = fill_token
        self.n_text, self.n_speech = int(mix_ratio[0]), int(mix_ratio[1])
        self.min_ratio, self.max_ratio = min_ratio, max_ratio
        self._lock = threading.Lock()
        self._inbox: list[int] = []
        self._ended = False
        self._wake: Callable[[], None] = lambda: None
        self.dirty = True  # something new for the scheduler to look at
        # scheduler-thread state
        self._head = list(head_text or [])  # v3: prompt text up to <|endofprompt|>, fed right after sos
        self._prompt_text = list(prompt_text)
        self._prompt_speech = list(prompt_speech)
        self.text: list[int] = []  # every text token received (not the prompt's)
        self._cache = list(prompt_text)  # text tokens not fed yet
        self._speech = list(prompt_speech)  # prompt speech tokens not fed yet
        self._pending: list[Part] = [("marker", SOS)] + ([("text", self._head)] if self._head else [])
        p = len(prompt_speech)
        self.next_fill = (p // self.n_speech + 1) * self.n_speech - p
        self.history: list[int] = []  # every decoded token, fills included (the sampler's window)
        self.started = False  # fed to the model at least once
        self.final = False  # the text has ended and been fed: decode to end-of-speech
        self.min_len = 0
        self.max_len = 1 << 30
        self.streamed_tokens = 0  # speech tokens decoded before the final phase (while text arrived)
        # testing: what went into the model, in order, and each decision at its input position
        self.trace: list[Part] | None = [] if trace else None
        self.decisions: list[tuple[int, int, str]] = []  # (position, token, how: forced|bistream|final|final_noeos)
        self.logps: list[Any] = []  # the log-probs of each decision
        self._fed = 0

    # -- producer (any thread) ---------------------------------------------------------------
    def bind(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def push(self, ids: list[int]) -> None:
        if not ids:
            return
        with self._lock:
            self._inbox.extend(int(i) for i in ids)
            self.dirty = True
        self._wake()

    def end(self) -> None:
        with self._lock:
            self._ended = True
            self.dirty = True
        self._wake()

    # -- scheduler thread ------------------------------------------------------------------------
    def next_input(self) -> list[Part] | None:
        """What to feed now, or None to wait for more text."""
        with self._lock:
            new, self._inbox = self._inbox, []
            ended = self._ended
            self.dirty = False
        self.text.extend(new)
        self._cache.extend(new)
        n = self.n_text
        while self._speech and len(self._cache) >= n:
            self._pending += [("text", self._cache[:n]), ("speech", self._speech[:self.n_speech])]
            self._cache, self._speech = self._cache[n:], self._speech[self.n_speech:]
        if not self._speech:
            interleaved_prompt = any(kind == "speech" for kind, *_ in self._pending)
            needs_text = self.started or not interleaved_prompt
            if not needs_text:
                return self._take()
            if len(self._cache) >= n:
                self._pending.append(("text", self._cache[:n]))
                self._cache = self._cache[n:]
                return self._take()
        if not ended:
            return None
        return self._final()

    def _take(self) -> list[Part]:
        parts, self._pending = self._pending, []
        self.started = True
        if self.trace is not None:
            self.trace.extend(parts)
            self._fed += sum(1 if kind == "marker" else len(value) for kind, value in parts)
        return parts

    def _final(self) -> list[Part]:
        self.final = True
        self.streamed_tokens = sum(1 for t in self.history if t != self.fill)
        total = len(self.text)
        self.max_len = max(1, int(total * self.max_ratio))
        if not self.started:  # nothing decoded yet: the plain (non-streamed) layout
            self.min_len = int(total * self.min_ratio)
            parts: list[Part] = [("marker", SOS), ("text", self._head + self._prompt_text + self.text),
                                 ("marker", TASK)]
            if self._prompt_speech:
                parts.append(("speech", self._prompt_speech))
            self._pending = parts
        else:  # as the non-streamed path: no end-of-speech before min_token_text_ratio x all the text
            self.min_len = int(total * self.min_ratio)
            self._pending.append(("text", self._cache))
            self._pending.append(("marker", TASK))
        self._cache = []
        return self._take()

    def decide(self, logp: Any, sample: Callable[[Any, list[int], bool], int], decoded: int) -> int:
        """The next token from ``logp`` (``decoded``: speech tokens handed out so far)."""
        how = "bistream"
        if self.final:
            how = "final_noeos" if decoded < self.min_len else "final"
            token = sample(logp, self.history, decoded < self.min_len)
        elif len(self.history) == self.next_fill:
            how = "forced"
            token = self.fill
        else:
            masked = logp.clone()
            keep = float(masked[self.fill])
            masked[self.size:] = float("-inf")  # end-of-speech and the other markers
            masked[self.fill] = keep
            token = sample(masked, self.history, False)
        if not self.final and token == self.fill:
            self.next_fill = len(self.history) + self.n_speech + 1
        self.history.append(token)
        if self.trace is not None:
            self.decisions.append((self._fed - 1, token, how))
            self.logps.append(logp.detach().clone())
            if token < self.size:  # a speech token is fed next
                self.trace.append(("speech", [token]))
                self._fed += 1
        return token
