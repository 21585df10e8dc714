"""app.text.segments: a streamed utterance cut into sentence segments within the budget, as it arrives."""

from __future__ import annotations

import threading

import pytest

from app.text.scripts import SENTENCE_END
from app.text.segments import StreamSegments, plan_text
from app.text.stream import TextStream

GO = threading.Event()  # never set: nothing is cancelled


def stream_of(*pieces: str, end: bool = True) -> TextStream:
    text = TextStream()
    for p in pieces:
        text.put(p)
    if end:
        text.end()
    return text


def segments(text: TextStream, **kw) -> list[str]:
    segs = StreamSegments(text, **kw)
    out = []
    while (seg := segs.next(GO)) is not None:
        got = "".join(seg.pieces(GO))
        assert got == seg.text
        out.append(got)
    return out


def essay(n_chars: int) -> str:
    sentences = ["The quick brown fox jumps over the lazy dog near the bank.",
                 "It was late, and the river ran fast under a grey sky, cold and loud.",
                 "Nobody saw it.", "Then, at last, the rain came down on the quiet town and its old roofs."]
    out = ""
    i = 0
    while len(out) < n_chars:
        out += sentences[i % len(sentences)] + " "
        i += 1
    return out


def test_four_thousand_characters_sent_at_once_become_sentence_segments():
    text = essay(4000)
    got = segments(stream_of(text), min_chars=30, max_chars=240)
    assert "".join(got) == text  # nothing lost, nothing added
    assert len(got) > 4000 // 240 and all(len(s) <= 240 for s in got)
    for s in got:  # each ends where a sentence ends (these sentences are all shorter than the budget)
        assert SENTENCE_END.search(s[-3:]) or s is got[-1], repr(s)
        assert len(s) >= 30 or s is got[-1], repr(s)  # short sentences ride with the next ("Nobody saw it.")
    assert [g.strip() for g in got] == plan_text(text, min_chars=30, max_chars=240)  # as whole text is cut


def test_pieces_cut_anywhere_give_the_same_segments():
    text = essay(1200)
    whole = segments(stream_of(text))
    for size in (1, 3, 7, 50):
        assert segments(stream_of(*[text[i:i + size] for i in range(0, len(text), size)])) == whole, size


def test_a_long_sentence_is_cut_at_a_clause_within_the_budget():
    long = ("one two three four five six seven eight nine ten, " * 12).rstrip(", ") + "."
    got = segments(stream_of(long), max_chars=120)
    assert "".join(got) == long and len(got) > 1
    assert all(len(s) <= 120 for s in got)
    assert all(s.endswith(", ") for s in got[:-1]), got


def test_the_token_budget_is_kept_where_characters_are_cheap():
    digits = ",".join(str(1000 + i) for i in range(800))  # 4,000 characters with no space and no sentence end
    got = segments(stream_of(digits), max_chars=240, count=lambda s: sum(ch.isdigit() for ch in s), max_tokens=80)
    assert "".join(got) == digits
    assert all(sum(ch.isdigit() for ch in s) <= 80 for s in got)
    assert all(s.endswith(",") for s in got[:-1])  # cut at the commas


def test_a_word_is_cut_only_when_it_alone_is_over_budget():
    got = segments(stream_of("x" * 500 + " and then some words."), max_chars=200)
    assert got == ["x" * 200, "x" * 200, "x" * 100 + " and then some words."]
    words = segments(stream_of("aaaa bbbb cc", "cc dddd"), min_chars=0, max_chars=8)
    assert words == ["aaaa ", "bbbb cccc ", "dddd"], words  # "cc"+"cc": one word across two pieces, not cut


def test_the_first_segment_streams_before_its_sentence_is_complete():
    text = stream_of("Hello there, this sentence is still being written", end=False)
    seg = StreamSegments(text).next(GO)
    assert seg is not None
    first = next(seg.pieces(GO))
    assert first == "Hello there, this sentence is still being written"  # handed on at once, not held back
    text.put(" and now it ends. And another one begins here")
    text.end()


def ready_segments(text: TextStream, **kw) -> list[tuple[str | None, str]]:
    """Each segment's ready_text (asked first), then what its pieces hand out."""
    segs = StreamSegments(text, **kw)
    out = []
    while (seg := segs.next(GO)) is not None:
        ready = seg.ready_text()
        out.append((ready, "".join(seg.pieces(GO))))
    return out


def test_a_segment_whose_text_has_all_come_is_ready_whole_and_still_handed_out():
    text = essay(1200)
    got = ready_segments(stream_of(*[text[i:i + 7] for i in range(0, len(text), 7)]), min_chars=30, max_chars=240)
    assert all(ready == pieces for ready, pieces in got)  # every segment complete: the text sent at once
    assert [p for _, p in got] == segments(stream_of(text), min_chars=30, max_chars=240)


def test_a_segment_still_being_written_is_not_ready_and_loses_nothing():
    text = stream_of("Hello there, this sentence is still being", end=False)
    segs = StreamSegments(text)
    seg = segs.next(GO)
    assert seg is not None and seg.ready_text() is None  # its end has not come
    text.put(" written. And the next one")
    text.end()
    assert "".join(seg.pieces(GO)) == "Hello there, this sentence is still being written. "
    rest = segs.next(GO)  # the stream's remainder is the next segment's, ready now
    assert rest is not None and rest.ready_text() == "And the next one"


def test_ready_text_then_pieces_keep_the_next_segment_intact():
    text = stream_of("First sentence is here and long enough. Second one", end=False)
    segs = StreamSegments(text, min_chars=10)
    first = segs.next(GO)
    assert first is not None and first.ready_text() == "First sentence is here and long enough. "
    assert "".join(first.pieces(GO)) == "First sentence is here and long enough. "
    second = segs.next(GO)
    assert second is not None and second.ready_text() is None  # "Second one": not ended yet
    text.put(" follows.")
    text.end()
    assert second.ready_text() == "Second one follows."
    assert "".join(second.pieces(GO)) == "Second one follows."
    assert segs.next(GO) is None


def test_nothing_to_speak_gives_no_segment():
    assert segments(stream_of()) == []
    assert segments(stream_of(" ", "...", " ")) == []
    assert segments(stream_of("Hello world. ", " ", "!"), min_chars=0) == ["Hello world. "]  # trailing marks dropped


def test_a_cancel_ends_the_wait_for_text():
    stop = threading.Event()
    stop.set()
    assert StreamSegments(stream_of(end=False)).next(stop) is None


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        StreamSegments(stream_of(), min_chars=50, max_chars=40)
