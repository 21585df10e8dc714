"""app.text.segments.plan_text: whole text cut as a stream of it is (the one planner of every door)."""

import threading

from app.text.segments import plan_text, segment_texts, weight
from app.text.stream import TextStream


def test_short_text_is_one_segment():
    assert plan_text("Hello world.") == ["Hello world."]


def test_sentences_are_split_and_short_ones_merged():
    text = "This is the first sentence of the text. This is the second one, a bit longer. Ok. And the last sentence here."
    segs = plan_text(text, max_chars=60, min_chars=20)
    assert segs == [
        "This is the first sentence of the text.",
        "This is the second one, a bit longer.",
        "Ok. And the last sentence here.",  # a short sentence joins the next one
    ]


def test_a_short_last_sentence_rides_with_the_one_before():
    assert plan_text("This is a sentence long enough to stand. Ok.", min_chars=20) == [
        "This is a sentence long enough to stand. Ok."]


def test_no_segment_exceeds_max_chars_and_nothing_is_lost():
    text = ("word " * 500).strip()
    segs = plan_text(text, max_chars=100)
    assert all(len(s) <= 100 for s in segs)
    assert " ".join(segs).split() == text.split()


def test_chinese_is_split_on_full_width_marks_without_spaces_and_weighed_per_character():
    text = "你好，世界。今天天气很好！我们去公园吧？好的。"
    segs = plan_text(text, max_chars=40, min_chars=10)
    assert "".join(segs) == text and len(segs) >= 2
    assert all(" " not in s and weight(s) <= 40 for s in segs)
    assert weight("你好ab") == 8


def test_punctuation_only_and_empty_give_nothing():
    assert plan_text("") == []
    assert plan_text("  ... !! ") == []


def test_long_sentence_without_marks_is_cut_at_commas_first():
    text = ", ".join(["a clause with several words"] * 12)
    segs = plan_text(text, max_chars=90)
    assert all(len(s) <= 90 for s in segs)
    assert all(s.endswith(",") or s == segs[-1] for s in segs)


def test_newlines_separate_sentences_and_spaces_collapse():
    segs = plan_text("first line without a stop\nsecond line without a stop either", min_chars=5)
    assert segs == ["first line without a stop", "second line without a stop either"]
    assert plan_text("one   two\t three.\n\nfour  five six seven.", min_chars=60) == ["one two three. four five six seven."]
    assert plan_text("你好。\n我们走吧。", min_chars=60) == ["你好。我们走吧。"]


def _words(text: str) -> int:
    """A token counter for tests: one token per word, one per CJK character."""
    return sum(1 if ch >= "\u3000" else 0 for ch in text) + len([w for w in text.split() if w.isascii()])


def test_token_budget_splits_only_what_is_over_it():
    short = "A short one."
    long = "one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."
    out = plan_text(f"{short} {long}", count=_words, max_tokens=5, min_chars=0)
    assert out[0] == short  # within the budget: left whole
    assert all(_words(s) <= 5 for s in out)
    assert " ".join(out).replace(",", "").split() == f"{short} {long}".replace(",", "").split()  # in order
    assert plan_text(long, count=_words, max_tokens=100) == [long]


def test_token_budget_cuts_cjk_and_unbroken_text_within_it():
    zh = "这是一个没有任何标点符号而且非常非常长的中文句子需要切开"
    out = plan_text(zh, count=_words, max_tokens=8)
    assert "".join(out) == zh and all(_words(s) <= 8 for s in out) and len(out) >= 4
    blob = "x" * 50
    assert "".join(plan_text(blob, count=len, max_tokens=7)) == blob
    assert all(len(s) <= 7 for s in plan_text(blob, count=len, max_tokens=7))


def test_closing_quotes_stay_with_their_sentence():
    assert plan_text('He said "Hi." Then he left.', min_chars=0) == ['He said "Hi."', "Then he left."]
    assert plan_text('He said "Hi." Then he left.') == ['He said "Hi." Then he left.']  # merged: quote kept
    assert plan_text("他说：“你好。”我走了。", min_chars=0) == ["他说：“你好。”", "我走了。"]
    assert plan_text("真的吗？！我……不知道。", min_chars=0) == ["真的吗？！", "我……", "不知道。"]


def test_halfwidth_katakana_and_compatibility_ideographs_are_cjk():
    """Merged without a space and weighed like other CJK text."""
    assert plan_text("ｺﾝﾆﾁﾊ。ｹﾞﾝｷﾃﾞｽｶ？") == ["ｺﾝﾆﾁﾊ。ｹﾞﾝｷﾃﾞｽｶ？"]
    assert plan_text("\uf900\uf901\uf902。\uf903。") == ["\uf900\uf901\uf902。\uf903。"]  # 豈更車。賈。
    assert plan_text("ㇰㇱㇲ。\u1112\u1161\u11ab。") == ["ㇰㇱㇲ。\u1112\u1161\u11ab。"]  # phonetic extensions, jamo
    unbroken = "ﾃｽﾄ" * 20  # 60 characters, each weighed like a short word: cut into pieces of max_chars // 3
    assert [len(s) for s in plan_text(unbroken, max_chars=60)] == [20, 20, 20]


def test_segment_texts_come_out_as_soon_as_they_end():
    stream = TextStream()
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(segment_texts(stream, threading.Event(), min_chars=0)))
    reader.start()
    stream.put("Hello wor")
    stream.put("ld. How ")
    deadline = threading.Event()
    for _ in range(200):
        if got:
            break
        deadline.wait(0.01)
    assert got == ["Hello world."]  # complete once the space after it arrived, before the rest
    stream.put("are you? I am")
    stream.put(" fine")
    stream.end()
    reader.join(5)
    assert got == ["Hello world.", "How are you?", "I am fine"]


def test_segment_texts_wait_for_a_decimal_and_end_at_a_full_width_mark():
    stream = TextStream()
    for piece in ("It costs 3.", "50 today. Bye。", "好"):
        stream.put(piece)
    stream.end()
    assert list(segment_texts(stream, threading.Event(), min_chars=0)) == ["It costs 3.50 today.", "Bye。", "好"]
