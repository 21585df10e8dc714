"""Scripts and sentence ends: the one definition the text modules build their patterns from.

**Scripts.** Which characters are Japanese kana, Han ideographs or Korean Hangul. Text in these
scripts has no spaces between words, so the text modules treat each such character as a word:
``segments.py`` weighs it like a short word and joins CJK sentences without a space,
``stream.py`` releases streamed text after it, ``normalize.py`` picks zh / ja from it and
``app/api/sse.py`` counts it as one token of its usage estimate. The ranges are Unicode blocks
(``\\u`` code points, both ends included):

=========  ===============  =====================================================================
class      range            block, and why it is here
=========  ===============  =====================================================================
KANA       3040-309F        Hiragana
           30A0-30FF        Katakana (with the prolonged sound mark ー)
           31F0-31FF        Katakana Phonetic Extensions: small ㇰ..ㇿ, written in Ainu words
           FF66-FF9F        Halfwidth Katakana (ｦ..ﾟ, part of Halfwidth and Fullwidth Forms): old
                            systems, receipts and SMS gateways still send ﾃｷｽﾄ like this
HAN        3400-4DBF        CJK Unified Ideographs Extension A: rarer hanzi / kanji / hanja
           4E00-9FFF        CJK Unified Ideographs: everyday Chinese characters, kanji, hanja
           F900-FAFF        CJK Compatibility Ideographs (豈 更 車 ...): duplicates kept for round
                            trips with older Korean and Japanese encodings; they arrive in
                            converted text and read as the ideographs they duplicate
HANGUL     AC00-D7AF        Hangul Syllables: modern Korean text
           1100-11FF        Hangul Jamo: conjoining letters (decomposed, NFD, Korean text)
=========  ===============  =====================================================================

The supplementary-plane ideograph extensions (B and later, U+20000 up) are not included: they are
rare in running text and none of our patterns ever counted them. ``LATIN`` (for language
detection only) is Basic Latin letters plus Latin-1 Supplement and Latin Extended-A/B
(U+00C0-024F), the letters of the European languages wetext's English grammar may meet.

**Sentence ends.** A sentence ends at a run of end marks, with the closing quotes and brackets
that follow it (they belong to the sentence they close), where

* an ASCII mark (``SPACED_ENDS``: ``. ! ? ;``) ends it only when whitespace follows: "3.50",
  "v1.2" and "example.com" stay whole; the same rule makes streamed text wait for the next
  piece ("It costs 3." may go on "50"), so a stream and the whole text cut at the same places;
* a full-width mark or the ellipsis (``UNSPACED_ENDS``: ``。！？；…``) ends it where it stands:
  CJK text puts no space after a sentence;
* a line break always ends it.

``SENTENCE_END`` matches that end (marks, closers, following whitespace); :func:`cut_sentences`
cuts whole text after each one. Clause marks (``,`` ``:`` and full-width ``，、：``) are where an
over-long sentence may be cut and where a clause of streamed text is complete.
"""

from __future__ import annotations

import re

# -- scripts (character-class bodies: put them inside [...]) -----------------------------------------
HIRAGANA = "\u3040-\u309f"
KATAKANA = "\u30a0-\u30ff"
KATAKANA_PHONETIC_EXTENSIONS = "\u31f0-\u31ff"
HALFWIDTH_KATAKANA = "\uff66-\uff9f"
CJK_UNIFIED_IDEOGRAPHS_EXT_A = "\u3400-\u4dbf"
CJK_UNIFIED_IDEOGRAPHS = "\u4e00-\u9fff"
CJK_COMPATIBILITY_IDEOGRAPHS = "\uf900-\ufaff"
HANGUL_SYLLABLES = "\uac00-\ud7af"
HANGUL_JAMO = "\u1100-\u11ff"

KANA = HIRAGANA + KATAKANA + KATAKANA_PHONETIC_EXTENSIONS + HALFWIDTH_KATAKANA
HAN = CJK_UNIFIED_IDEOGRAPHS_EXT_A + CJK_UNIFIED_IDEOGRAPHS + CJK_COMPATIBILITY_IDEOGRAPHS
HANGUL = HANGUL_SYLLABLES + HANGUL_JAMO
CJK = KANA + HAN + HANGUL  # one character of these is one word
LATIN = "A-Za-z\u00c0-\u024f"

KANA_CHAR = re.compile(f"[{KANA}]")
HAN_CHAR = re.compile(f"[{HAN}]")
HANGUL_CHAR = re.compile(f"[{HANGUL}]")
CJK_CHAR = re.compile(f"[{CJK}]")
LATIN_CHAR = re.compile(f"[{LATIN}]")

# -- punctuation ---------------------------------------------------------------------------------------
SPACED_ENDS = ".!?;"  # end a sentence only when whitespace follows
FULLWIDTH_ENDS = "。！？；"
UNSPACED_ENDS = FULLWIDTH_ENDS + "…"  # end a sentence where they stand
CLOSERS = "\"'”’」』)）"  # closing quotes and brackets: they stay with the sentence they close
CLAUSE_MARKS = ",:"
FULLWIDTH_CLAUSE_MARKS = "，、："

_ENDS = re.escape(SPACED_ENDS + UNSPACED_ENDS)
_UNSPACED = re.escape(UNSPACED_ENDS)
_CLOSERS = re.escape(CLOSERS)
SENTENCE_END = re.compile(
    rf"[{_ENDS}]+[{_CLOSERS}]*\s+"  # any mark run, its closers, then whitespace
    rf"|[{_UNSPACED}][{_ENDS}]*[{_CLOSERS}]*"  # a run holding a full-width mark or an ellipsis: no space needed
    r"|\n+"  # a line break
)


def is_cjk(text: str) -> bool:
    """Whether ``text`` holds any kana, Han or Hangul character."""
    return CJK_CHAR.search(text) is not None


def cut_sentences(text: str) -> list[str]:
    """``text`` cut after every :data:`SENTENCE_END`, each piece stripped, empty ones dropped.

    A piece keeps its end marks and closing quotes: ``'He said "Hi." Then'`` gives
    ``['He said "Hi."', 'Then']``.
    """
    pieces: list[str] = []
    start = 0
    for m in SENTENCE_END.finditer(text):
        pieces.append(text[start:m.end()])
        start = m.end()
    pieces.append(text[start:])
    return [p.strip() for p in pieces if p.strip()]
