"""Batched token2wav (flow/batch.py, flow/scheduler.py) against CosyVoice's own per-request flow, tiny CosyVoice2.

The reference is ``flow.inference`` (CosyVoice's code) one call at a time. A batched round
pads every call to the longest and masks; in fp32 the two differ by summation order only
(measured max |diff| ~2e-6 on mel values of magnitude ~5); the bound 1e-4 of the mel's
scale leaves room for other CPUs' kernels while a wrong mask, a shifted noise index or a
look-ahead token read from the padding moves frames by O(1).

Audio: HiFT draws its excitation noise from torch's global generator, so for audio
comparisons every HiFT call is seeded from its mel length under one lock
(``deterministic_hift``): then a request's audio depends on its mel only, in any batch.
"""

from __future__ import annotations

import threading

import pytest

from app.engines.base import InvalidInput, PromptAudio, SynthesisRequest
from tests.support.engine_requests import mixed_requests
from tests.support.sounds import speechlike
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.flow.batch import BatchedFlow
from app.engines.cosyvoice.flow.scheduler import (
    FlowCancelled,
    FlowScheduler,
    FlowStopped,
)
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs
from tests.support.flow_batches import (
    MIX,
    assert_exact,
    assert_same_audio,
    deterministic_hift,
    every_mode,
    item,
    pcm,
    reference,
)


@pytest.fixture(scope="module")
def flow(tiny_models):
    return load_model_dir(tiny_models(2), dtype="fp32").model.flow


def test_a_batched_round_equals_each_call_alone(flow):
    items = [item(n, p, streaming=s, finalize=f, seed=i) for i, (n, p, s, f) in enumerate(MIX)]
    bf = BatchedFlow(flow)
    with torch.inference_mode():
        got = bf(items)
    for it, mel in zip(items, got):
        assert_exact(mel, reference(flow, it))
        assert bf.frames(it) == 2 * it.encoder_tokens(3)


def test_a_row_cancelled_mid_round_leaves_it_and_the_others_are_unchanged(flow):
    items = [item(n, p, streaming=True, finalize=False, seed=10 + i) for i, (n, p) in enumerate([(28, 50), (40, 20),
                                                                                                 (33, 60)])]
    asked: dict[int, int] = {}

    def alive(i: int) -> bool:  # row 1 is cancelled after the third ODE step
        asked[i] = asked.get(i, 0) + 1
        return i != 1 or asked[i] < 3

    with torch.inference_mode():
        got = BatchedFlow(flow)(items, alive=alive)
    assert got[1] is None
    assert asked[0] == 9 and asked[1] == 3  # checked between steps; a dropped row is not asked again
    for i in (0, 2):
        assert_exact(got[i], reference(flow, items[i]))


def test_registered_voices_start_after_their_cached_prompt_frames(flow):
    from app.engines.cosyvoice.flow.cache import PromptCache
    from app.engines.cosyvoice.flow.prefix import PromptRef

    cache = PromptCache(2**30)
    items = [item(28, 75, streaming=True, finalize=False, seed=40),  # 75 prompt tokens: 2 whole chunks cacheable
             item(53, 60, streaming=True, finalize=False, seed=41),  # another voice, 2 chunks
             item(40, 30, streaming=True, finalize=False, seed=42),  # an uploaded prompt: no cache
             item(20, 20, streaming=True, finalize=False, seed=43),  # a voice too short to cache (0 frames)
             item(45, 80, streaming=False, finalize=True, seed=44)]  # a final call: full attention, no cache
    for i in (0, 1, 3, 4):
        items[i].prompt = PromptRef(cache, f"voice-{i}")
    want = [reference(flow, it) for it in items]
    bf = BatchedFlow(flow, prompts=True)
    for _ in range(2):  # the first round computes and stores the voices' states, the second starts after them
        with torch.inference_mode():
            got = bf(items)
        for mel, ref in zip(got, want):
            assert_exact(mel, ref)
    assert len(cache) == 2 and cache.misses == 2 and cache.hits == 2
    assert bf.prompt_frames_reused == 2 * 100  # two voices, 100 estimator frames each, not computed again


# -- the scheduler thread ----------------------------------------------------------------------------

def submit_all(sched: FlowScheduler, items, cancels=None):
    cancels = cancels or [threading.Event() for _ in items]
    return [sched.submit(it, first=False, started=float(i), cancel=c) for i, (it, c) in enumerate(zip(items, cancels))]


def test_jobs_waiting_together_run_as_one_round(flow):
    items = [item(30 + i, 40, streaming=True, finalize=False, seed=20 + i) for i in range(4)]
    sched = FlowScheduler(BatchedFlow(flow), max_batch=8)
    jobs = submit_all(sched, items)  # queued before the thread starts: its first round takes them all
    sched.start()
    try:
        for job, it in zip(jobs, items):
            assert job.done.wait(60)
            assert_exact(job.mel, reference(flow, it))
        stats = sched.stats()
        assert stats["rounds"] == 1 and stats["max_batch_seen"] == 4 and stats["jobs"] == 4
    finally:
        sched.stop()


def test_an_exception_in_one_call_fails_that_request_only(flow):
    good = [item(30, 40, streaming=True, finalize=False, seed=30 + i) for i in range(2)]
    bad = item(30, 40, streaming=True, finalize=False, seed=33)
    bad.token[0, 5] = 10**6  # beyond the token embedding: an IndexError inside the round
    sched = FlowScheduler(BatchedFlow(flow), max_batch=8)
    jobs = submit_all(sched, [good[0], bad, good[1]])
    sched.start()
    try:
        for job in jobs:
            assert job.done.wait(60)
        assert isinstance(jobs[1].error, IndexError) and jobs[1].mel is None
        for job, it in ((jobs[0], good[0]), (jobs[2], good[1])):
            assert job.error is None
            assert_exact(job.mel, reference(flow, it))
        stats = sched.stats()
        assert stats["failed"] == 1 and stats["isolated"] == 3 and sched.alive
    finally:
        sched.stop()


def test_a_cancelled_request_leaves_the_queue_and_its_waiter_returns(flow):
    sched = FlowScheduler(BatchedFlow(flow), max_batch=8)  # not started: the job stays queued
    cancel = threading.Event()
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            sched.run(item(30, 40, streaming=True, finalize=False), first=True, started=0.0, cancel=cancel)
        except BaseException as exc:  # noqa: BLE001 - what the slot thread sees
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: sched.stats()["pending"] == 1, timeout=5)
    cancel.set()
    waiter.join(5)
    assert not waiter.is_alive() and isinstance(raised[0], FlowCancelled)
    assert sched.stats()["pending"] == 0 and sched.stats()["cancelled"] == 1
    # a job cancelled before its round never runs
    gone, kept = threading.Event(), threading.Event()
    gone.set()
    jobs = submit_all(sched, [item(30, 40, streaming=True, finalize=False, seed=s) for s in (1, 2)], [gone, kept])
    sched.start()
    try:
        assert jobs[1].done.wait(60) and jobs[0].done.wait(5)
        assert jobs[0].mel is None and jobs[0].error is None and jobs[1].mel is not None
        assert sched.stats()["max_batch_seen"] == 1
    finally:
        sched.stop()


def test_stopping_fails_waiting_jobs_and_refuses_new_ones(flow):
    sched = FlowScheduler(BatchedFlow(flow), max_batch=8)
    sched.start()
    sched.stop()
    assert not sched.alive
    with pytest.raises(FlowStopped):
        sched.run(item(30, 40, streaming=True, finalize=False), first=True, started=0.0, cancel=threading.Event())


# -- through the engine: batched token2wav vs the per-request path -------------------------------------

def _engine(model_dir, batch: str):
    eng = CosyVoiceEngine(configs.engine(model_dir=str(model_dir), torch_threads=1, batching=True, llm_greedy=True,
                                          max_batch_size=8, token2wav_batch=batch, flow_prompt_cache_mb=64))
    eng.load()
    return eng


@pytest.fixture(scope="module")
def pair(tiny_models):
    """Per-request (token2wav_batch off) and batched engines on the tiny CosyVoice2."""
    engines = {b: _engine(tiny_models(2), b) for b in ("off", "on")}
    assert engines["on"].runner.flow_rounds is not None and engines["off"].runner.flow_rounds is None
    assert engines["on"].runner.prompt_cache is not None and engines["off"].runner.prompt_cache is None
    yield engines
    for eng in engines.values():
        eng.close()


@pytest.fixture(scope="module")
def long_pair(tiny_models):
    """The same on the tiny model that speaks long (streams of many hops)."""
    engines = {b: _engine(tiny_models(2, long=True), b) for b in ("off", "on")}
    yield engines
    for eng in engines.values():
        eng.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("index", range(5), ids=["sft", "zero_shot", "cross_lingual", "instruct2", "vc"])
def test_every_mode_gets_the_audio_of_the_per_request_path(pair, index, stream):
    with deterministic_hift(pair["off"], pair["on"]):
        want = every_mode(pair["off"])[index]
        want.stream = stream
        got = every_mode(pair["on"])[index]
        got.stream = stream
        assert_same_audio(pcm(pair["on"], got), pcm(pair["off"], want))
    assert pair["on"].flow_stats()["jobs"] > 0


def test_requests_joining_and_leaving_mid_stream_get_their_own_audio(long_pair):
    off, on = long_pair["off"], long_pair["on"]
    reqs = {name: mixed_requests(eng)[:6] for name, eng in long_pair.items()}
    for rs in reqs.values():
        for i, r in enumerate(rs):
            r.stream = i % 3 != 2  # four streams of many hops, two whole files
    with deterministic_hift(off, on):
        want = [pcm(off, r) for r in reqs["off"]]
        before = on.flow_stats()
        out: dict[int, list] = {}
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, pcm(on, reqs["on"][i]))) for i in range(6)]
        for t in threads[:3]:
            t.start()
        wait_until(lambda: on.flow_stats()["rounds"] >= before["rounds"] + 3, timeout=60)  # streams under way
        for t in threads[3:]:  # these join running streams; the short ones leave first
            t.start()
        for t in threads:
            t.join(300)
    for i in range(6):
        assert_same_audio(out[i], want[i])
    stats = on.flow_stats()
    assert stats["max_batch_seen"] >= 2 and stats["rounds"] - before["rounds"] < stats["jobs"] - before["jobs"]
    assert stats["pending"] == stats["running"] == 0 and stats["failed"] == 0


def test_a_cancelled_stream_leaves_and_the_others_keep_their_audio(long_pair):
    off, on = long_pair["off"], long_pair["on"]
    with deterministic_hift(off, on):
        want = pcm(off, SynthesisRequest(**{**vars(mixed_requests(off)[2]), "stream": True}))
        other = SynthesisRequest(**{**vars(mixed_requests(on)[2]), "stream": True})
        out: list = []
        runner = threading.Thread(target=lambda: out.extend(pcm(on, other)))
        cancel = threading.Event()
        victim = SynthesisRequest(**{**vars(mixed_requests(on)[1]), "stream": True})
        gen = on.synthesize(victim, cancel)
        runner.start()
        next(gen)  # its first chunk: the request is mid-stream, its next hop queued or running
        cancel.set()
        gen.close()
        runner.join(300)
    assert_same_audio(out, want)
    wait_until(lambda: on.flow_stats()["pending"] == on.flow_stats()["running"] == 0, timeout=10)
    assert not on.loaded.model.hift_cache_dict  # per-request HiFT state is gone with both requests
    assert on.llm_stats()["running"] == 0


def test_a_library_voices_streams_reuse_its_prompt_frames_and_keep_their_audio(pair):
    off, on = pair["off"], pair["on"]
    text = "A registered voice speaks this sentence twice, in two streams of several hops."
    with deterministic_hift(off, on):
        reqs = {name: SynthesisRequest(text=text, mode="zero_shot", stream=True,
                                       voice=eng.compute_voice("a prompt of a few words", PromptAudio(speechlike(3.0), 16000)))
                for name, eng in pair.items()}
        want = pcm(off, reqs["off"])  # CosyVoice's recomputing path, the prompt frames in every hop
        cache = on.runner.prompt_cache
        first = pcm(on, reqs["on"])
        hits = cache.hits
        again = pcm(on, reqs["on"])
    assert len(want) >= 2
    assert_same_audio(first, want)
    assert_same_audio(again, want)
    assert len(cache) == 1 and cache.hits > hits  # the second stream started every hop after the cached frames


# -- first-chunk control -------------------------------------------------------------------------------

def test_a_small_first_chunk_comes_sooner_and_the_stream_adds_up(pair):
    for eng in pair.values():  # per-request token2wav and batched alike
        req = mixed_requests(eng)[2]  # zero_shot: a prompt, so the default first hop carries its alignment pad
        req.stream = True
        low, high = eng.info().first_chunk_tokens
        assert (low, high) == eng.runner.first_hop_bounds and low == 5  # 8 held-back mel frames / 2 + 1
        default = pcm(eng, req)
        req.first_chunk_tokens = low
        small = pcm(eng, req)
        assert len(default) >= 2 and len(small) > len(default)
        assert 0 < len(small[0]) < len(default[0])  # less audio to wait for: earlier first audio
        assert len(small[0]) == (2 * low - 8) * 480  # its mel frames less HiFT's held-back 8, at 480 samples each
        assert sum(map(len, small)) == sum(map(len, default))  # greedy: the same tokens, the same total audio


def test_first_chunk_tokens_outside_the_models_range_is_refused(pair, engines):
    eng = pair["on"]
    low, high = eng.info().first_chunk_tokens
    for bad in (low - 1, high + 1):
        req = SynthesisRequest(text="Hello there.", mode="sft", speaker=eng.voices()[0], stream=True,
                               first_chunk_tokens=bad)
        with pytest.raises(InvalidInput, match="first_chunk_tokens"):
            list(eng.synthesize(req, threading.Event()))
    plain = engines(2)  # CosyVoice's own tts() (no batching): no first-chunk control
    assert plain.info().first_chunk_tokens is None
    req = SynthesisRequest(text="Hello there.", mode="sft", speaker=plain.voices()[0], stream=True,
                           first_chunk_tokens=10)
    with pytest.raises(InvalidInput, match="engine.batching"):
        list(plain.synthesize(req, threading.Event()))


def test_a_batched_round_takes_engine_flow_steps_as_the_per_request_path_does(tiny_models):

    fewer = load_model_dir(tiny_models(2), levers=configs.levers(flow_steps=4)).model.flow
    calls = []
    fewer.decoder.estimator.register_forward_pre_hook(lambda m, a: calls.append(int(a[0].shape[0])))
    items = [item(n, p, streaming=s, finalize=f, seed=i) for i, (n, p, s, f) in enumerate(MIX[:3])]
    with torch.inference_mode():
        got = BatchedFlow(fewer)(items)
    # one padded pass per streaming kind (2 streamed calls, 1 whole): 4 steps each, both CFG rows of every call
    assert calls == [4] * 4 + [2] * 4
    for it, mel in zip(items, got):
        assert_exact(mel, reference(fewer, it))


def test_without_guidance_the_flow_is_not_batched_and_says_why(tiny_models):
    from app.engines.cosyvoice.flow.batch import unsupported_reason

    unguided = load_model_dir(tiny_models(2), levers=configs.levers(flow_cfg=False)).model.flow
    assert "flow_cfg" in unsupported_reason(unguided)
    with pytest.raises(TypeError, match="flow_cfg"):
        BatchedFlow(unguided)
