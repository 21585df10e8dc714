"""Text normalization and long text on the real CosyVoice frontends (tiny random-weight models).

* Normalization happens before tokenization: "5 apples" and "five apples" are the same tokens
  (CosyVoice2, batched LLM: the default serving path).
* A 2,000-character mixed Chinese/English text is cut within the LLM's token budget and
  streamed sentence by sentence, in order, each sentence getting at least the audio the
  LLM must produce for it (CosyVoice decodes >= 2 speech tokens per text token). The
  splitting is the adapter's, the same for every version; it runs on the tiny CosyVoice v1,
  which speaks 2,000 characters in a third of CosyVoice2's CPU time (v1 speech tokens are
  20 ms, v2's 40 ms; the tiny v2 tokenizer spends three tokens per Chinese character).
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from app.engines.base import SynthesisRequest
from tests.support import configs

pytestmark = pytest.mark.integration

SENTENCES = [
    "I bought 5 apples for $3.50 at 10:30 am.",
    "我在2026年12月1日买了3公斤苹果，一共花了¥120。",
    "Prices rose 20% in 2025, and the store is 3 km away.",
    "今天的气温是25度，湿度是60%，风速每小时15公里。",
    "She finished 2nd out of 1,200 runners on Jan 5, 2024.",
    "会议将在下午3点30分开始，请大家准时参加。",
    ("one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen, fifteen, "
     "sixteen, seventeen, eighteen, nineteen, twenty, twenty one, twenty two, twenty three, twenty four, twenty five"),
    "这是一段没有句号的很长的中文文字，它用逗号连接了很多个小句，一直写下去，直到超过模型的预算为止，然后还在继续写",
]


def mixed_text(chars: int = 2000) -> str:
    out: list[str] = []
    i = 0
    while sum(len(s) + 1 for s in out) < chars:
        s = SENTENCES[i % len(SENTENCES)]
        out.append(s if s[-1] in ".。" else s + ("." if s.isascii() else "。"))
        i += 1
    return " ".join(out)[:chars].rsplit(" ", 1)[0]


TOKEN_SECONDS = {1: 0.02, 2: 0.04}  # audio per speech token: v1 50 Hz, v2 25 Hz


@pytest.fixture(scope="module")
def engine(tiny_models):
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), batching=True))
    eng.load()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def v1_engine(engines):
    return engines(1)


def first_text_tokens(engine, text: str, **kw) -> list[int]:
    req = SynthesisRequest(text=text, mode="sft", speaker=engine.voices()[0], **kw)
    return next(engine.inputs.for_request(req, engine.sample_rate))["text"].flatten().tolist()


def test_digits_and_words_give_the_same_text_tokens(engine):
    assert engine.normalizer.enabled
    assert first_text_tokens(engine, "I have 5 apples.") == first_text_tokens(engine, "I have five apples.")
    assert first_text_tokens(engine, "我有5个苹果。") == first_text_tokens(engine, "我有五个苹果。")
    # normalize: false speaks the text as written
    assert first_text_tokens(engine, "I have 5 apples.", normalize=False) != \
        first_text_tokens(engine, "I have five apples.")
    assert first_text_tokens(engine, "I have 5 apples.", normalize=False) == \
        engine.loaded.frontend._extract_text_token("I have 5 apples.")[0].flatten().tolist()


def _squash(text: str) -> str:
    return re.sub(r"[\s,，]+", "", text)


def test_long_mixed_text_streams_every_sentence_in_order(v1_engine):
    engine = v1_engine
    text = mixed_text()
    assert 1900 <= len(text) <= 2000 and re.search(r"[\u4e00-\u9fff]", text) and re.search(r"[A-Za-z]", text)
    # sentence by sentence: each sentence's audio is yielded (and sent) before the next is decoded. The
    # engine's within-sentence streaming (stream=True) would re-run the flow per hop: ~3x the CPU here.
    req = SynthesisRequest(text=text, mode="sft", speaker=engine.voices()[0], stream=False, seed=7)
    segments = engine.inputs.segments(req)
    tokens = [engine.inputs.text_tokens(s) for s in segments]
    assert len(segments) >= 15
    assert max(tokens) <= engine.config.max_segment_tokens
    assert _squash("".join(segments)) == _squash(engine.normalizer.normalize(text))  # every sentence, in order
    assert not re.search(r"\d", "".join(segments))  # numbers are spoken as words

    chunks = []
    gen = engine.synthesize(req, threading.Event())
    chunks.append(next(gen))
    per_token = TOKEN_SECONDS[int(engine.info().family[-1])]
    assert chunks[0].segment == 0 and chunks[0].duration_s < 0.1 * 2 * sum(tokens) * per_token  # not all of it
    chunks.extend(gen)
    order = [c.segment for c in chunks]
    assert order == sorted(order) and sorted(set(order)) == list(range(len(segments)))
    seconds = np.zeros(len(segments))
    for c in chunks:
        seconds[c.segment] += c.duration_s
        assert c.sample_rate == engine.sample_rate
    # the LLM decodes at least 2 speech tokens per text token for every sentence
    minimum = 2 * np.array(tokens) * per_token
    assert np.all(seconds >= 0.95 * minimum), list(zip(segments, seconds, minimum))
    for i in range(len(segments)):
        pcm = np.concatenate([c.pcm for c in chunks if c.segment == i])
        assert np.abs(pcm.astype(np.int32)).max() > 0, f"segment {i} is silent"
