"""The flow's per-voice prompt cache (flow_cache.PromptCache) on tiny CosyVoice2.

A registered voice's leading prompt chunks (those whose encoder input, look-ahead
included, lies inside the prompt) are computed once and every later stream with that
voice starts after them. That must not change the output: the same streamed mel as
with the prompt cache off and as the recomputing path. The difference is summation
order only (the prompt chunks computed in their own estimator call, the encoder run
over the prompt tokens alone, attention over cached + new keys): measured ~1e-6 of the
mel's scale in fp32; the bound 1e-4 of the scale (as in flow/test_cache.py) leaves room
for other CPUs' kernels, while a wrong state (another voice's, a chunk off by one, a
prompt chunk that did depend on the generated tokens) moves frames by O(1).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.base import PromptAudio, SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.flow import cache as flow_cache
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs
from tests.support.flow_streams import (
    EXACT,
    STREAM_TEXT,
    inputs,
    stream_pcm,
    streamed_mel,
)

N_PROMPT = 80  # 80 prompt tokens: chunks 0-2 (tokens 0-74, look-ahead to 77) are the voice's alone
PROMPT_FRAMES = 150


@pytest.fixture(scope="module")
def flow(tiny_models):
    lm = load_model_dir(tiny_models(2), dtype="fp32")
    flow_cache.install(lm.model.flow)
    return lm.model.flow


def voice_stream(cache, x, **kw):
    key = flow_cache.prompt_key(x["prompt"], x["feat"], x["emb"])
    return flow_cache.FlowStream(prompt_cache=cache, prompt_key=key, **kw)


def close(got, ref):
    assert got.shape == ref.shape
    return float((got - ref).abs().max()) <= EXACT * float(ref.abs().max())


def test_cacheable_frames_stop_before_the_chunks_the_generated_tokens_reach(flow):
    frames = [flow_cache.cacheable_prompt_frames(flow, n) for n in (0, 27, 28, 50, 52, 53, 80)]
    assert frames == [0, 0, 50, 50, 50, 100, 150]


def test_a_cache_hit_gives_the_same_mel_and_skips_the_prompt_frames(flow):
    x = inputs(n_prompt=N_PROMPT, seed=3)
    ref, _ = streamed_mel(flow, x)  # the recomputing path
    plain = flow_cache.FlowStream()
    without, _ = streamed_mel(flow, x, plain)  # flow cache on, prompt cache off
    cache = flow_cache.PromptCache(1 << 30)
    miss, hit = voice_stream(cache, x), voice_stream(cache, x)
    first, _ = streamed_mel(flow, x, miss)
    second, _ = streamed_mel(flow, x, hit)
    for got in (without, first, second):
        assert close(got, ref)
    assert close(second, without)
    total = 2 * (N_PROMPT + 86)
    assert plain.frames_computed == miss.frames_computed == total  # the miss computes the prompt part once
    assert hit.frames_computed == total - PROMPT_FRAMES and hit.prompt_frames_reused == PROMPT_FRAMES
    assert hit.first_call_frames == plain.first_call_frames - PROMPT_FRAMES  # a cheaper first hop
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
    assert 0 < cache.bytes < plain.nbytes()


def test_with_a_bounded_window_a_hit_changes_nothing_either(flow):
    x = inputs(n_prompt=N_PROMPT, seed=7)
    plain = flow_cache.FlowStream(window_frames=100)
    ref, _ = streamed_mel(flow, x, plain)
    cache = flow_cache.PromptCache(1 << 30)
    streamed_mel(flow, x, voice_stream(cache, x, window_frames=100))
    hit = voice_stream(cache, x, window_frames=100)
    got, _ = streamed_mel(flow, x, hit)
    assert hit.prompt_frames_reused == PROMPT_FRAMES and close(got, ref)
    k, _ = next(iter(hit.kv.values()))
    assert k.shape[2] == 100  # the stream still keeps only its window


def test_a_changed_voice_never_reuses_the_old_state(flow):
    cache = flow_cache.PromptCache(1 << 30)
    x = inputs(n_prompt=N_PROMPT, seed=4)
    streamed_mel(flow, x, voice_stream(cache, x))
    changed = dict(x, feat=x["feat"] + 0.5)  # re-registered under the same name with other audio
    assert flow_cache.prompt_key(x["prompt"], x["feat"], x["emb"]) != flow_cache.prompt_key(
        changed["prompt"], changed["feat"], changed["emb"])
    stream = voice_stream(cache, changed)
    got, _ = streamed_mel(flow, changed, stream)
    ref, _ = streamed_mel(flow, changed)
    assert close(got, ref) and stream.prompt_frames_reused == 0
    assert (cache.hits, cache.misses, len(cache)) == (0, 2, 2)
    old, _ = streamed_mel(flow, x)
    assert not close(got, old)  # the prompt features matter: a stale state would show


def test_the_cache_evicts_least_recently_used_voices_by_bytes(flow):
    voices = [inputs(n_prompt=N_PROMPT, seed=10 + i) for i in range(3)]
    probe = flow_cache.PromptCache(1 << 30)
    streamed_mel(flow, voices[0], voice_stream(probe, voices[0]))
    one = probe.bytes
    cache = flow_cache.PromptCache(int(2.5 * one))  # room for two voices
    for v in (voices[0], voices[1], voices[0], voices[2]):  # voice 1 is now the least recently used
        streamed_mel(flow, v, voice_stream(cache, v))
    keys = [flow_cache.prompt_key(v["prompt"], v["feat"], v["emb"]) for v in voices]
    assert keys[0] in cache and keys[2] in cache and keys[1] not in cache
    assert cache.evictions == 1 and cache.bytes == 2 * one <= cache.max_bytes
    assert not flow_cache.PromptCache(one - 1).put(keys[0], probe.get(keys[0]))  # bigger than the budget


def test_an_abandoned_stream_leaves_the_cache_consistent(flow):
    x = inputs(n_prompt=N_PROMPT, seed=5)
    ref, _ = streamed_mel(flow, x)
    cache = flow_cache.PromptCache(1 << 30)
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    first = voice_stream(cache, x)
    with torch.inference_mode(), flow_cache.bound_stream(first):  # one hop, then the client is gone
        tok = x["token"][:, :48]
        flow.inference(token=tok, token_len=n(tok), prompt_token=x["prompt"], prompt_token_len=n(x["prompt"]),
                       prompt_feat=x["feat"], prompt_feat_len=n(x["feat"]), embedding=x["emb"],
                       streaming=True, finalize=False)
    assert len(cache) == 1 and first.frames_done > PROMPT_FRAMES
    state = cache.get(flow_cache.prompt_key(x["prompt"], x["feat"], x["emb"]))
    assert state.frames == PROMPT_FRAMES
    k, _ = next(iter(state.kv.values()))
    assert k.shape[2] == PROMPT_FRAMES  # the abandoned stream's own frames did not leak into it
    hit = voice_stream(cache, x)
    got, _ = streamed_mel(flow, x, hit)
    assert hit.prompt_frames_reused == PROMPT_FRAMES and close(got, ref)


def test_two_streams_on_one_voice_at_once(flow):
    x = inputs(n_prompt=N_PROMPT, seed=6)
    ref, _ = streamed_mel(flow, x)
    cache = flow_cache.PromptCache(1 << 30)
    streamed_mel(flow, x, voice_stream(cache, x))  # stored
    out, errors = {}, []
    barrier = threading.Barrier(2)

    def worker(i):
        try:
            barrier.wait()
            out[i] = streamed_mel(flow, x, voice_stream(cache, x))[0]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(out) == 2
    assert close(out[0], ref) and close(out[1], ref)
    assert cache.hits == 2


# -- through the engine: a registered voice over the batched streaming path ------------------------
TRANSCRIPT = "hello there, this is my voice speaking slowly"


@pytest.fixture(scope="module")
def engines(tiny_models):
    out = {}
    for name, mb in (("plain", 0), ("voice", 256)):
        eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                              llm_greedy=True, flow_cache=True, flow_prompt_cache_mb=mb))
        eng.load()
        out[name] = eng
    assert out["plain"].runner.prompt_cache is None and out["voice"].runner.prompt_cache is not None
    yield out
    for eng in out.values():
        eng.close()


def registered(eng, seconds: float = 4.0):
    t = np.arange(int(seconds * 16000)) / 16000
    audio = PromptAudio((0.25 * np.sin(2 * np.pi * 150 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)))
                        .astype(np.float32), 16000)
    return eng.compute_voice(TRANSCRIPT, audio)


def speak(eng, voice, cancel_after: int | None = None):
    req = SynthesisRequest(text=STREAM_TEXT, mode="zero_shot", voice=voice, stream=True, seed=5)
    return stream_pcm(eng, req, cancel_after)


def test_engine_reuses_a_registered_voices_prompt_and_streams_the_same_audio(engines):
    voice = registered(engines["voice"])
    assert voice.features["flow_prompt_speech_token"].shape[1] >= 28  # at least one cacheable chunk
    cache = engines["voice"].runner.prompt_cache
    plain = speak(engines["plain"], voice)
    assert len(plain) >= 3
    assert len(speak(engines["voice"], voice, cancel_after=1)) == 1  # a miss, cancelled after its first hop
    assert (cache.misses, len(cache)) == (1, 1)
    for _ in range(2):
        got = speak(engines["voice"], voice)
        assert len(got) == len(plain)
        for a, b in zip(plain, got):  # int16 audio, +-1 for rounding
            assert a.shape == b.shape and int(np.abs(a - b).max()) <= 1
    assert cache.hits == 2
    assert not engines["voice"].loaded.model.hift_cache_dict
