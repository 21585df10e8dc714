"""Bistream sequences in the batched LLM scheduler, on the tiny CosyVoice2 (seeded sampling).

* the interleaved input our scheduler fed (with its cache saved and restored at every
  wait for text) gives, in ONE full forward of CosyVoice's own transformers backbone,
  the same next-token probabilities at every step;
* the tokens do not depend on how the text was cut or paced, nor on the batch;
* the engine speaks streamed text, and a cancelled bistream request leaves the batch.
"""

from __future__ import annotations

import threading
import time

import pytest

from app.engines.base import SynthesisRequest
from app.engines.cosyvoice.llm.bistream import BistreamFeed
from app.text.segments import Segment
from app.text.stream import TextStream
from tests.support import configs
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the deep green forest."


@pytest.fixture(scope="module")
def engine(tiny_models):
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                          llm_greedy=False))
    eng.load()
    yield eng
    eng.close()


def tokenize(engine, text: str) -> list[int]:
    return [int(t) for t in engine.loaded.frontend._extract_text_token(text)[0].flatten().tolist()]


def new_feed(engine, prompt_speech=(), prompt_text=()) -> BistreamFeed:
    spec = engine.runner.lm.spec
    return BistreamFeed(speech_token_size=spec.speech_token_size, fill_token=spec.fill_token,
                        mix_ratio=spec.mix_ratio, prompt_text=list(prompt_text), prompt_speech=list(prompt_speech),
                        min_ratio=spec.min_token_text_ratio, max_ratio=spec.max_token_text_ratio, trace=True)


def run_feed(engine, feed: BistreamFeed, ids: list[int], pieces: int = 1, pause_s: float = 0.0,
             lockstep: bool = False, seed: int = 7) -> list[int]:
    """Feed ``ids`` in ``pieces``; ``lockstep``: each piece only once the sequence waits for text again."""
    sched = engine.runner.scheduler
    seq = sched.submit_bistream(feed, seed=seed)
    step = max(1, -(-len(ids) // pieces))
    for i in range(0, len(ids), step):
        feed.push(ids[i:i + step])
        if lockstep:
            wait_until(lambda: (seq in sched._parked and not feed.dirty) or seq.done, timeout=30)
        if pause_s:
            time.sleep(pause_s)
    feed.end()
    seq.wait_for(1 << 30, timeout=60)
    assert seq.done and seq.error is None
    return list(seq.tokens)


def voice_tokens(engine, prompt_audio) -> tuple[list[int], list[int]]:
    voice = engine.compute_voice("hello there, this is my voice", prompt_audio)
    speech = voice.features["llm_prompt_speech_token"].flatten().tolist()
    return tokenize(engine, voice.prompt_text), speech


@pytest.mark.parametrize("with_prompt", [False, True], ids=["sft", "zero_shot"])
def test_incremental_decoding_equals_one_full_forward_of_the_backbone(engine, prompt_audio, with_prompt):
    import torch

    prompt_text, prompt_speech = voice_tokens(engine, prompt_audio) if with_prompt else ([], [])
    feed = new_feed(engine, prompt_speech, prompt_text)
    ids = tokenize(engine, TEXT)
    tokens = run_feed(engine, feed, ids, pieces=len(ids), lockstep=True)  # one text token at a time
    assert feed.streamed_tokens >= 10, "no speech was decoded before the text ended"
    assert sum(1 for _, t, _ in feed.decisions if t == feed.fill) >= 3  # waited for text at least 3 times
    lm = engine.runner.lm
    llm = engine.loaded.model.llm
    with torch.inference_mode():
        embeds = lm.embed(feed.trace)
        hidden = llm.llm.model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1]
        logp = llm.llm_decoder(hidden[0]).log_softmax(-1)  # the backbone's last hidden state is already normed
    hows = [how for _, _, how in feed.decisions]
    assert "forced" in hows and ("final" in hows or "final_noeos" in hows)
    for i, (pos, token, how) in enumerate(feed.decisions):
        ours, ref = feed.logps[i].exp(), logp[pos].exp()
        assert torch.allclose(ours, ref, atol=1e-5), (i, pos, how, float((ours - ref).abs().max()))
        if how != "forced":
            assert ref[token] > 0
    assert len([d for d in feed.decisions if d[1] < feed.size]) == len(tokens)


def test_tokens_do_not_depend_on_how_the_text_is_cut_paced_or_batched(engine, prompt_audio):
    prompt_text, prompt_speech = voice_tokens(engine, prompt_audio)
    ids = tokenize(engine, TEXT)
    whole = run_feed(engine, new_feed(engine, prompt_speech, prompt_text), ids)
    paced = run_feed(engine, new_feed(engine, prompt_speech, prompt_text), ids, pieces=7, pause_s=0.03)
    assert paced == whole and len(whole) > 30
    results: dict[int, list[int]] = {}

    def one(i: int) -> None:
        results[i] = run_feed(engine, new_feed(engine, prompt_speech, prompt_text), ids, pieces=3 + i, pause_s=0.01)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[i] for i in range(3)] == [whole] * 3
    assert engine.runner.scheduler.max_batch_seen >= 2


def test_the_engine_speaks_streamed_text_and_a_cancelled_request_leaves_at_once(engine):
    speaker = engine.voices()[0]
    text = TextStream()
    for piece in ("The quick bro", "wn fox jumps over the la", "zy dog, and runs away."):
        text.put(piece)
    text.end()
    chunks = list(engine.synthesize(SynthesisRequest(mode="sft", speaker=speaker, text_stream=text, stream=True),
                                    threading.Event()))
    assert len(chunks) >= 2 and sum(c.duration_s for c in chunks) > 1.0
    waiting = TextStream()
    waiting.put("Words that never")
    cancel = threading.Event()
    gen = engine.synthesize(SynthesisRequest(mode="sft", speaker=speaker, text_stream=waiting, stream=True), cancel)
    consumer = threading.Thread(target=lambda: list(gen))
    consumer.start()
    sched = engine.runner.scheduler
    wait_until(lambda: sched.stats()["waiting_for_text"] == 1, timeout=10)
    cancel.set()
    consumer.join(5)
    assert not consumer.is_alive()
    wait_until(lambda: sched.stats()["waiting_for_text"] == 0 and sched.stats()["running"] == 0, timeout=5)


@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2-unbatched"])
def test_without_bistream_each_sentence_is_spoken_once_it_is_complete(engines, version):
    eng = engines(version)  # one instance per slot, no LLM batching
    text = TextStream()
    text.put("The first sentence is here. The sec")
    chunks: list = []
    consumer = threading.Thread(target=lambda: chunks.extend(eng.synthesize(
        SynthesisRequest(mode="sft", speaker=eng.voices()[0], text_stream=text, stream=True), threading.Event())))
    consumer.start()
    wait_until(lambda: len(chunks) > 0, timeout=60)  # the first sentence is spoken before the second is complete
    assert consumer.is_alive()
    text.put("ond one follows.")
    text.end()
    consumer.join(60)
    assert not consumer.is_alive() and len(chunks) >= 2 and sum(c.duration_s for c in chunks) > 0.2


def _pushed_text_ids(engine, monkeypatch, text: str, **req) -> list[int]:
    """The text token ids the engine's feeder handed the bistream sequence for ``text`` (streamed in pieces)."""
    from app.engines.cosyvoice.llm import bistream

    pushed: list[int] = []
    original = bistream.BistreamFeed.push

    def record(self, ids):
        pushed.extend(ids)
        return original(self, ids)

    monkeypatch.setattr(bistream.BistreamFeed, "push", record)
    monkeypatch.setattr(Segment, "ready_text", lambda self: None)  # as if still being written: bistream
    stream = TextStream()
    for i, word in enumerate(text.split(" ")):  # a word a piece, as an LLM streams them
        stream.put(word if i == 0 else " " + word)
    stream.end()
    chunks = list(engine.synthesize(SynthesisRequest(mode="sft", speaker=engine.voices()[0], text_stream=stream,
                                                     stream=True, seed=3, **req), threading.Event()))
    assert chunks
    monkeypatch.setattr(bistream.BistreamFeed, "push", original)
    monkeypatch.undo()
    return pushed


def test_streamed_text_is_normalized_word_by_word_unless_the_request_says_not(engine, monkeypatch):
    # wetext needs context ("5" alone stays "5"): a clause with digits is held until it ends, then
    # normalized whole; the same text with normalize: false goes on word by word as written
    decode = engine.loaded.frontend.tokenizer.decode
    digits = _pushed_text_ids(engine, monkeypatch, "I have 5 apples and 12 pears.")
    assert decode(digits) == "I have five apples and twelve pears."
    raw = _pushed_text_ids(engine, monkeypatch, "I have 5 apples and 12 pears.", normalize=False)
    assert decode(raw) == "I have 5 apples and 12 pears."
    prose = _pushed_text_ids(engine, monkeypatch, "I have five apples and twelve pears.")
    assert decode(prose) == decode(digits)


def test_a_long_utterance_is_spoken_as_sentence_segments_each_its_own_sequence(engine, monkeypatch):
    """4,000 characters in one piece are not one ever-growing sequence: each segment (sentences within
    max_segment_chars / max_segment_tokens, as HTTP cuts text) is a bistream sequence of its own."""
    sched = engine.runner.scheduler
    fed: list = []
    submit = sched.submit_bistream

    def counting(feed, **kw):
        pushed = [0]
        fed.append(pushed)
        push = feed.push

        def count_push(ids):
            pushed[0] += len(ids)
            return push(ids)

        feed.push = count_push
        return submit(feed, **kw)

    monkeypatch.setattr(sched, "submit_bistream", counting)
    monkeypatch.setattr(Segment, "ready_text", lambda self: None)  # as if each were still being written
    sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
    text = TextStream()
    text.put(sentence * 12)  # 852 characters at once, then the end
    text.end()
    chunks = list(engine.synthesize(SynthesisRequest(mode="sft", speaker=engine.voices()[0], text_stream=text,
                                                     stream=True), threading.Event()))
    cfg = engine.config
    assert len(fed) >= len(sentence * 12) // cfg.max_segment_chars + 1, len(fed)
    assert max(c.segment for c in chunks) == len(fed) - 1  # the chunks say which segment they belong to
    tokens = [pushed[0] for pushed in fed]  # the text tokens each sequence was fed
    assert all(0 < n <= cfg.max_segment_tokens for n in tokens), tokens
    assert sum(tokens) >= len(tokenize(engine, sentence * 12)) - len(fed)  # all of the text, spoken once


def test_a_segment_whose_text_has_all_come_is_prefilled_whole_as_over_http(engine, monkeypatch):
    """Text sent faster than it is spoken (all of it here): each segment's text is complete when it starts,
    so it runs as HTTP runs it (its text in the prefill) and no bistream sequence is made; the same
    segments, the same inputs, the same tokens as the HTTP request for that text."""
    runner, sched = engine.runner, engine.runner.scheduler
    bistream_calls: list = []
    monkeypatch.setattr(sched, "submit_bistream", lambda *a, **kw: bistream_calls.append(1))
    inputs: list = []
    run = runner.run

    def recording(model_input, **kw):
        inputs.append(model_input["text"].flatten().tolist())
        return run(model_input, **kw)

    monkeypatch.setattr(runner, "run", recording)
    sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
    text = TextStream()
    text.put(sentence * 6)
    text.end()
    req = SynthesisRequest(mode="sft", speaker=engine.voices()[0], text_stream=text, stream=True, seed=5)
    streamed = list(engine.synthesize(req, threading.Event()))
    assert bistream_calls == [] and len(inputs) >= 2 and streamed
    assert max(c.segment for c in streamed) == len(inputs) - 1
    whole = SynthesisRequest(mode="sft", speaker=engine.voices()[0], text=sentence * 6, stream=True, seed=5)
    http_inputs = [m["text"].flatten().tolist() for m in engine.inputs.for_request(whole, engine.sample_rate)]
    assert sum(map(len, inputs)) == pytest.approx(sum(map(len, http_inputs)), rel=0.05)  # the same text tokens
