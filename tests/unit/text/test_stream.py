"""Streamed text: the thread-safe TextStream, whole-word release, the bistream feed (segments: test_segments)."""

from __future__ import annotations

import threading
import time

import numpy as np

from app.engines.cosyvoice.llm.bistream import SOS, TASK, BistreamFeed
from app.text.stream import TextStream, WordBuffer


def test_text_stream_blocks_until_a_piece_or_the_end_and_stops_on_cancel():
    ts = TextStream()
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(ts.pieces(threading.Event())))
    reader.start()
    ts.put("Hel")
    ts.put("lo")
    time.sleep(0.05)
    assert reader.is_alive()  # waiting for more
    ts.end()
    reader.join(2)
    assert got == ["Hel", "lo"] and ts.chars == 5
    cancel = threading.Event()
    waiting = TextStream()
    reader = threading.Thread(target=lambda: list(waiting.pieces(cancel)))
    reader.start()
    cancel.set()
    reader.join(1)
    assert not reader.is_alive()


def test_word_buffer_releases_whole_words_only():
    w = WordBuffer()
    out = [w.feed(p) for p in ["Hel", "lo wor", "ld, and ", "  more"]]
    assert out == ["", "Hello", " world, and", ""]
    assert w.flush() == "   more"
    assert "".join(out) + "   more" == "Hello world, and   more"
    assert WordBuffer().feed("你好世界") == "你好世界"  # CJK: every character is a boundary


def feed(prompt_speech=0, prompt_text=(9, 9)) -> BistreamFeed:
    return BistreamFeed(speech_token_size=100, fill_token=102, mix_ratio=(5, 15), prompt_text=list(prompt_text),
                        prompt_speech=list(range(prompt_speech)), min_ratio=2, max_ratio=20)


def test_feed_waits_for_five_text_tokens_then_interleaves_the_prompt_speech():
    f = feed(prompt_speech=20)
    assert f.next_fill == 10  # 20 prompt speech tokens: the block closes after 10 more
    f.push([1, 2])
    assert f.next_input() is None  # 2 prompt text + 2 text < 5
    f.push([3, 4, 5, 6, 7, 8])
    parts = f.next_input()  # 10 text tokens interleave both prompt-speech blocks, then decoding starts
    assert parts == [("marker", SOS), ("text", [9, 9, 1, 2, 3]), ("speech", list(range(15))),
                     ("text", [4, 5, 6, 7, 8]), ("speech", list(range(15, 20)))]
    assert f.started and not f.final
    f.push([10, 11, 12])
    assert f.next_input() is None  # after a fill: 5 text tokens again
    f.push([13, 14])
    assert f.next_input() == [("text", [10, 11, 12, 13, 14])]
    f.push([15])
    f.end()
    assert f.next_input() == [("text", [15]), ("marker", TASK)]
    assert f.final and f.min_len == 2 * 14 and f.max_len == 20 * 14


def test_feed_text_that_ends_before_decoding_gets_the_plain_layout():
    f = feed(prompt_speech=40)
    f.push([1, 2, 3])
    assert f.next_input() is None
    f.end()
    assert f.next_input() == [("marker", SOS), ("text", [9, 9, 1, 2, 3]), ("marker", TASK),
                              ("speech", list(range(40)))]
    assert f.min_len == 6 and f.max_len == 60


class _LogP(np.ndarray):
    """Stands in for a torch tensor: the feed only clones, indexes and slices it."""

    def clone(self):
        return self.copy()


def test_feed_forces_a_fill_every_15_speech_tokens_and_masks_other_markers():
    f = feed()
    f.push([1, 2, 3, 4, 5])
    assert f.next_input() == [("marker", SOS), ("text", [9, 9, 1, 2, 3])]
    seen = []

    def sample(logp, history, ignore_eos):
        seen.append(list(logp))
        return 7

    logp = np.zeros(103).view(_LogP)
    tokens = [f.decide(logp, sample, n) for n in range(16)]
    assert tokens == [7] * 15 + [102]  # the 16th decision is the forced fill, not sampled
    assert len(seen) == 15 and seen[0][100] == float("-inf") and seen[0][101] == float("-inf")
    assert seen[0][102] == 0.0  # the fill may be sampled


def test_word_buffer_treats_halfwidth_katakana_and_compatibility_ideographs_as_words():
    """Each is a word boundary, as other CJK characters are (they were held back until the end of the text)."""
    assert WordBuffer().feed("ﾃｽﾄ") == "ﾃｽﾄ"
    assert WordBuffer().feed("\uf900\uf901\uf902") == "\uf900\uf901\uf902"
    assert WordBuffer().feed("ㇰㇱ") == "ㇰㇱ"
    assert WordBuffer().feed("\u1112\u1161\u11ab") == "\u1112\u1161\u11ab"  # Hangul jamo (NFD 한)
    assert WordBuffer().feed("Hello") == ""  # a Latin word may still go on
