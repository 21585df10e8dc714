"""Text normalization with wetext (real FSTs from the wheel): what a listener expects to hear."""

from __future__ import annotations

import threading

import pytest

from app.text.normalize import TextNormalizer, detect_language, language_pieces


@pytest.fixture(scope="module")
def tn() -> TextNormalizer:
    norm = TextNormalizer("auto")
    norm.load()
    assert norm.enabled
    return norm


@pytest.mark.parametrize("text, spoken", [
    ("I have 5 apples.", "I have five apples."),
    ("It costs $3.50 today.", "It costs three point five dollars today."),
    ("He paid £12.", "He paid twelve pounds."),
    ("We met on Jan 5, 2024.", "We met on the fifth of january, twenty twenty four."),
    ("The launch is on 2026-12-01.", "The launch is on the first of december twenty twenty six."),
    ("See you at 10:30 am.", "See you at ten thirty AM."),
    ("Prices rose 20% this year.", "Prices rose twenty percent this year."),
    ("The station is 3 km away and the bag weighs 5kg.",
     "The station is three kilometers away and the bag weighs five kilograms."),
    ("She finished 2nd.", "She finished second."),
    ("Dr. Smith lives here.", "doctor Smith lives here."),
], ids=["number", "dollars", "pounds", "date-words", "date-iso", "time", "percent", "units", "ordinal", "title"])
def test_english(tn, text, spoken):
    assert tn.normalize(text) == spoken


@pytest.mark.parametrize("text, spoken", [
    ("我有5个苹果。", "我有五个苹果。"),
    ("一共¥120。", "一共一百二十元。"),
    ("价格是3.50元。", "价格是三点五零元。"),
    ("会议在2026年12月1日下午3点30分开始。", "会议在二零二六年十二月一日下午三点三十分开始。"),
    ("今年增长了20%。", "今年增长了百分之二十。"),
    ("距离这里3公里。", "距离这里三公里。"),
    ("日期是2026-12-01。", "日期是二零二六年十二月一日。"),
], ids=["number", "yuan", "decimal", "date-time", "percent", "unit", "date-iso"])
def test_chinese(tn, text, spoken):
    assert tn.normalize(text) == spoken


def test_japanese_by_kana(tn):
    assert tn.normalize("りんごが5個あります。") == "りんごが五個あります。"


def test_language_per_sentence_in_mixed_text(tn):
    text = "I have 5 apples. 我有5个苹果。The rest is 20% off."
    assert tn.normalize(text) == "I have five apples. 我有五个苹果。The rest is twenty percent off."


def test_markup_line_breaks_and_unsupported_scripts_pass_through(tn):
    assert tn.normalize("He [laughter] ran 3 km<strong>fast</strong>.") == \
        "He [laughter] ran three kilometers<strong>fast</strong>."
    assert tn.normalize("You are a helpful assistant.<|endofprompt|>I have 5 apples.") == \
        "You are a helpful assistant.<|endofprompt|>I have five apples."
    assert tn.normalize("他突然[laughter]停下来3次。") == "他突然[laughter]停下来三次。"
    assert tn.normalize("line 1\nline 2") == "line one\nline two"
    assert tn.normalize("하나 2 셋") == "하나 2 셋"  # Korean: not normalized, kept as written
    assert tn.normalize("") == ""
    assert tn.normalize("Plain words stay as they are.") == "Plain words stay as they are."


def test_off_and_unloaded_normalizers_leave_text_alone():
    off = TextNormalizer("off")
    off.load()
    assert not off.enabled and off.normalize("I have 5 apples.") == "I have 5 apples."
    assert TextNormalizer("auto").normalize("I have 5 apples.") == "I have 5 apples."  # not loaded yet
    with pytest.raises(ValueError, match="auto, off"):
        TextNormalizer("on")


def test_detect_language():
    assert detect_language("Hello there.") == "en"
    assert detect_language("你好，世界。") == "zh"
    assert detect_language("我用iPhone打电话。") == "zh"
    assert detect_language("こんにちは、世界。") == "ja"
    assert detect_language("안녕하세요") is None
    assert detect_language("2026-12-01") is None
    # a sentence of digits only takes the text's main language; a cut after an abbreviation is undone
    assert language_pieces("Hello there. 2026-12-01. Bye.") == [("en", "Hello there."), ("en", "2026-12-01."),
                                                                ("en", "Bye.")]
    assert language_pieces("你好。12。") == [("zh", "你好。"), ("zh", "12。")]
    assert language_pieces("Dr. Smith came on Jan. 5. Then 我走了。") == [
        ("en", "Dr. Smith came on Jan. 5."), ("zh", "Then 我走了。")]


def test_language_pieces_cut_where_split_and_stream_cut():
    """The sentence ends of app.text.scripts: closing quotes and runs of marks stay with their sentence."""
    assert language_pieces('He said "Hi." Then 我说：“你好。”好的！？') == [
        ("en", 'He said "Hi."'), ("zh", "Then 我说：“你好。”"), ("zh", "好的！？")]
    assert language_pieces("ｺﾝﾆﾁﾊ。\uf900\uf901。") == [("ja", "ｺﾝﾆﾁﾊ。"), ("zh", "\uf900\uf901。")]


def test_a_full_width_semicolon_joins_without_a_space(tn):
    assert tn.normalize("我有5个苹果；OK, fine.") == "我有五个苹果；OK, fine."


def test_threads_share_one_normalizer(tn):
    texts = [f"I have {i} apples." for i in range(1, 9)] + [f"我有{i}个苹果。" for i in range(1, 9)]
    expected = [tn.normalize(t) for t in texts]
    results: dict[int, list[str]] = {}

    def work(k: int) -> None:
        results[k] = [tn.normalize(t) for t in texts]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results[k] == expected for k in range(4))
    assert expected[4] == "I have five apples." and expected[8] == "我有一个苹果。"


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over the lazy dog.",
    "Well, that's what she said; isn't it?",
    "Mr. Brown and Mrs. Green met Prof. White.",
    "It was a cold, grey morning in the hills",
])
def test_english_fast_path_matches_wetext(tn, text):
    """English without digits or symbols skips wetext only where wetext would change nothing."""
    assert tn.normalize(text) == tn._normalizers["en"].normalize(text)


def test_clause_normalizer_holds_only_clauses_wetext_would_change_and_keeps_word_spacing():
    from app.text.normalize import ClauseNormalizer

    seen: list[str] = []

    def normalize(text: str) -> str:  # strips its ends, as wetext does
        seen.append(text)
        return text.replace("5", "five").strip()

    c = ClauseNormalizer(normalize)
    assert [c.feed(w) for w in ("I", " have", " 5", " apples,", " thanks")] == \
        ["I", " have", "", " five apples,", " thanks"]
    assert " 5 apples," in seen  # the number was normalized with its clause, not alone
    assert c.feed(" and 5") == "" and c.flush() == " and five"  # the end of the text flushes what is held
    assert c.flush() == ""
