"""OpenAI SSE framing: events, usage estimate, the sink's final event."""

from __future__ import annotations

import base64

from app.api.sse import (
    estimate_text_tokens,
    speech_sse_sink,
    speech_tokens_per_second,
    sse_event,
)
from tests.support.sse import parse_sse, sse_audio


def test_event_framing_is_one_compact_data_line():
    assert sse_event({"type": "x", "n": 1}) == b'data: {"type":"x","n":1}\n\n'


def test_token_estimate_counts_words_cjk_and_punctuation():
    assert estimate_text_tokens("Hello, world!") == 4
    assert estimate_text_tokens("你好") == 2
    # every kana, Han and Hangul character is one token, halfwidth katakana and compatibility ideographs too
    assert estimate_text_tokens("ﾃｽﾄ") == 3 and estimate_text_tokens("\uf900\uf901\uf902") == 3
    assert estimate_text_tokens("ㇰㇱ \ud55c") == 3  # katakana phonetic extensions, a Hangul syllable
    assert estimate_text_tokens("\u1112\u1161\u11ab") == 3  # the same syllable as conjoining jamo (NFD)
    assert estimate_text_tokens("hi", None, "there") == 2
    assert estimate_text_tokens() == 0


def test_speech_tokens_per_second_by_family():
    assert speech_tokens_per_second("cosyvoice1") == 50
    assert speech_tokens_per_second("cosyvoice2") == 25


def test_sink_deltas_then_done_with_usage():
    sink = speech_sse_sink(input_tokens=3, tokens_per_second=25, audio_seconds=lambda: 2.0)
    text = (sink(b"abc", False) + sink(b"", False) + sink(b"def", False) + sink(b"", True)).decode()
    events = parse_sse(text)
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "speech.audio.done"]
    assert sse_audio(events) == b"abcdef"
    assert events[-1]["usage"] == {"input_tokens": 3, "output_tokens": 50, "total_tokens": 53}
    assert base64.b64decode(events[0]["audio"]) == b"abc"
