from app.text.split import fit_token_budget, split_sentences


def test_short_text_is_one_segment():
    assert split_sentences("Hello world.") == ["Hello world."]


def test_sentences_are_split_and_short_ones_merged():
    text = "This is the first sentence of the text. This is the second one, a bit longer. Ok. And the last sentence here."
    segs = split_sentences(text, max_len=60, min_len=20)
    assert segs == [
        "This is the first sentence of the text.",
        "This is the second one, a bit longer.",
        "Ok. And the last sentence here.",  # a short sentence joins the next one
    ]


def test_no_segment_exceeds_max_len_and_nothing_is_lost():
    text = ("word " * 500).strip()
    segs = split_sentences(text, max_len=100)
    assert all(len(s) <= 100 for s in segs)
    assert " ".join(segs).split() == text.split()


def test_chinese_is_split_on_full_width_marks_without_spaces():
    segs = split_sentences("你好，世界。今天天气很好！我们去公园吧？好的。", max_len=40, min_len=10)
    assert "".join(segs) == "你好，世界。今天天气很好！我们去公园吧？好的。"
    assert len(segs) >= 2
    assert all(" " not in s for s in segs)


def test_punctuation_only_and_empty_give_nothing():
    assert split_sentences("") == []
    assert split_sentences("  ... !! ") == []


def test_long_sentence_without_marks_is_cut_at_commas_first():
    text = ", ".join(["a clause with several words"] * 12)
    segs = split_sentences(text, max_len=90)
    assert all(len(s) <= 90 for s in segs)
    assert all(s.endswith(",") or s == segs[-1] for s in segs)


def test_newlines_separate_sentences():
    segs = split_sentences("first line without a stop\nsecond line without a stop either", max_len=240, min_len=5)
    assert segs == ["first line without a stop", "second line without a stop either"]


def _words(text: str) -> int:
    """A token counter for tests: one token per word, one per CJK character."""
    return sum(1 if ch >= "\u3000" else 0 for ch in text) + len([w for w in text.split() if w.isascii()])


def test_token_budget_splits_only_what_is_over_it():
    short = "A short one."
    long = "one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."
    out = fit_token_budget([short, long], _words, 5)
    assert out[0] == short
    assert all(_words(s) <= 5 for s in out)
    assert " ".join(out[1:]).replace(",", "").split() == long.replace(",", "").split()  # nothing lost, in order
    assert fit_token_budget([long], _words, 100) == [long]


def test_token_budget_cuts_cjk_and_unbroken_text_anywhere():
    zh = "这是一个没有任何标点符号而且非常非常长的中文句子需要切开"
    out = fit_token_budget([zh], _words, 8)
    assert "".join(out) == zh and all(_words(s) <= 8 for s in out) and len(out) >= 4
    blob = "x" * 50
    assert "".join(fit_token_budget([blob], len, 7)) == blob
    assert all(len(s) <= 7 for s in fit_token_budget([blob], len, 7))


def test_closing_quotes_stay_with_their_sentence():
    assert split_sentences('He said "Hi." Then he left.', min_len=0) == ['He said "Hi."', "Then he left."]
    assert split_sentences('He said "Hi." Then he left.') == ['He said "Hi." Then he left.']  # merged: quote kept
    assert split_sentences("他说：“你好。”我走了。", min_len=0) == ["他说：“你好。”", "我走了。"]
    assert split_sentences("真的吗？！我……不知道。", min_len=0) == ["真的吗？！", "我……", "不知道。"]


def test_halfwidth_katakana_and_compatibility_ideographs_are_cjk():
    """Merged without a space and weighed like other CJK text (they were treated as Latin words)."""
    assert split_sentences("ｺﾝﾆﾁﾊ。ｹﾞﾝｷﾃﾞｽｶ？") == ["ｺﾝﾆﾁﾊ。ｹﾞﾝｷﾃﾞｽｶ？"]
    assert split_sentences("\uf900\uf901\uf902。\uf903。") == ["\uf900\uf901\uf902。\uf903。"]  # 豈更車。賈。
    assert split_sentences("ㇰㇱㇲ。\u1112\u1161\u11ab。") == ["ㇰㇱㇲ。\u1112\u1161\u11ab。"]  # phonetic extensions, jamo (NFD 한)
    unbroken = "ﾃｽﾄ" * 20  # 60 characters, each weighed like a short word: cut into pieces of max_len // 3
    assert [len(s) for s in split_sentences(unbroken, max_len=60)] == [20, 20, 20]
