"""The one definition of scripts and sentence ends: which characters are kana / Han / Hangul, where a sentence ends."""

from __future__ import annotations

import re

import pytest

from app.text.scripts import (
    CJK_CHAR,
    HAN_CHAR,
    HANGUL_CHAR,
    KANA_CHAR,
    LATIN_CHAR,
    SENTENCE_END,
    cut_sentences,
    is_cjk,
)

# (character, the one class it belongs to): both ends of every block, and its neighbours outside
SCRIPT_OF = [
    ("\u3041", "kana"), ("\u309f", "kana"),  # Hiragana ぁ .. ゟ
    ("\u30a0", "kana"), ("\u30ff", "kana"), ("ー", "kana"),  # Katakana ゠ .. ヿ, the prolonged sound mark
    ("\u31f0", "kana"), ("\u31ff", "kana"),  # Katakana Phonetic Extensions ㇰ .. ㇿ
    ("\uff66", "kana"), ("\uff71", "kana"), ("\uff9f", "kana"),  # Halfwidth Katakana ｦ ｱ ﾟ
    ("\u3400", "han"), ("\u4dbf", "han"),  # CJK Unified Ideographs Extension A
    ("\u4e00", "han"), ("中", "han"), ("\u9fff", "han"),  # CJK Unified Ideographs
    ("\uf900", "han"), ("\ufa0e", "han"), ("\ufaff", "han"),  # CJK Compatibility Ideographs 豈 﨎
    ("\uac00", "hangul"), ("\ud7af", "hangul"),  # Hangul Syllables 가 ..
    ("\u1100", "hangul"), ("\u11ff", "hangul"),  # Hangul Jamo ᄀ ..
    ("a", "latin"), ("Z", "latin"), ("é", "latin"), ("\u024f", "latin"),
    ("\u3002", None), ("\uff0c", None), ("\uff65", None), ("\uffa0", None),  # 。 ， and the neighbours of ｦ..ﾟ
    ("\u4dc0", None), ("\ua000", None), ("\u0250", None), ("1", None), (" ", None),
]
CLASSES = {"kana": KANA_CHAR, "han": HAN_CHAR, "hangul": HANGUL_CHAR, "latin": LATIN_CHAR}


@pytest.mark.parametrize("char, script", SCRIPT_OF, ids=[f"U+{ord(c):04X}" for c, _ in SCRIPT_OF])
def test_each_character_is_in_exactly_its_own_script(char, script):
    assert [name for name, pattern in CLASSES.items() if pattern.fullmatch(char)] == ([script] if script else [])
    assert bool(CJK_CHAR.fullmatch(char)) == is_cjk(char) == (script in ("kana", "han", "hangul"))


def test_the_text_modules_hold_no_range_of_their_own():
    """Every CJK range is written once, in scripts.py: no other text module spells a code point range."""
    from pathlib import Path

    import app.api.sse
    import app.text

    sources = [*Path(app.text.__file__).parent.glob("*.py"), Path(app.api.sse.__file__)]
    spelled = {p.name for p in sources if re.search(r"\\u[0-9a-fA-F]{4}-", p.read_text())}
    assert spelled == {"scripts.py"}


@pytest.mark.parametrize("text, pieces", [
    # ASCII marks end a sentence only when whitespace follows: numbers, versions, hosts stay whole
    ("It costs 3.50 today. See v1.2 on example.com now.", ["It costs 3.50 today.", "See v1.2 on example.com now."]),
    ("Really?! Yes; fine. Wait... what", ["Really?!", "Yes;", "fine.", "Wait...", "what"]),
    # full-width marks and the ellipsis end it where they stand: CJK text puts no space after a sentence
    ("你好。今天好吗？好！", ["你好。", "今天好吗？", "好！"]),
    ("我……不知道。真的吗？！嗯", ["我……", "不知道。", "真的吗？！", "嗯"]),  # a run of marks stays together
    # closing quotes and brackets belong to the sentence they close
    ('He said "Hi." Then he left.', ['He said "Hi."', "Then he left."]),
    ("他说：“你好。”我走了。（完。）", ["他说：“你好。”", "我走了。", "（完。）"]),
    ("「はい。」と言った。", ["「はい。」", "と言った。"]),
    # a line break always ends a sentence
    ("no stop here\nnor here\n\n", ["no stop here", "nor here"]),
    ("", []),
])
def test_cut_sentences(text, pieces):
    assert cut_sentences(text) == pieces


def test_an_ascii_end_waits_for_whitespace_a_full_width_end_does_not():
    """Why the two mark sets differ: "3." may go on as "3.50"; "。" never continues a word.

    The same rule tells a stream whether its text so far holds a complete sentence.
    """
    assert SENTENCE_END.search("It costs 3.") is None  # maybe "3.50": wait for more text
    assert SENTENCE_END.search('He said "Hi."') is None
    assert SENTENCE_END.search("It costs 3. ").end() == len("It costs 3. ")
    assert SENTENCE_END.search("价格是3。").end() == len("价格是3。")
    assert SENTENCE_END.search("价格是3.50元") is None
