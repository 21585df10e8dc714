"""Continuous LLM batching on the real CosyVoice2 classes (tiny random-weight models).

The reference everywhere is CosyVoice's own ``llm.inference`` run alone, with its
sampling function made deterministic (``ranked_greedy``).
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import psutil
import pytest

from app.engines.base import PromptAudio, SynthesisRequest
from tests.support import configs
from tests.support.engine_requests import mixed_requests
from tests.support.llm_reference import llm_inputs, make_scheduler, reference, submit
from tests.support.sounds import speechlike
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def v2(tiny_models):
    """A loaded tiny CosyVoice2 engine (per-request path) whose modules the tests batch themselves."""
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, llm_greedy=True))
    eng.load()
    yield eng
    eng.close()


def _batched_engine(model_dir):
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(model_dir), torch_threads=1,
                                          batching=True, llm_greedy=True, max_batch_size=8))
    eng.load()
    return eng


@pytest.fixture(scope="module")
def batched(tiny_models):
    """A loaded tiny CosyVoice2 engine with batching on and greedy decoding."""
    eng = _batched_engine(tiny_models(2))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def batched_long(tiny_models):
    """The same on the tiny model that speaks long (hundreds of tokens: several stream hops)."""
    eng = _batched_engine(tiny_models(2, long=True))
    yield eng
    eng.close()


def assert_logp_close(got, want) -> None:
    """Every step's log-probs: 1e-4 where a token has any chance, and 1e-5 relative everywhere."""
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        live = b > -50.0
        assert float((a[live] - b[live]).abs().max()) <= 1e-4, f"step {step}"
        assert float(((a - b).abs() / b.abs().clamp(min=1.0)).max()) <= 1e-5, f"step {step}"


def test_a_batch_of_8_gets_what_each_request_gets_alone(v2):
    inputs = [llm_inputs(v2, r) for r in mixed_requests(v2)]
    refs = [reference(v2, mi) for mi in inputs]
    assert len({mi.get("llm_prompt_speech_token", torch.zeros(1, 0)).shape[1] for mi in inputs}) >= 3
    assert len({len(t) for t, _ in refs}) >= 4, "the requests should stop at different steps"
    lm, sched = make_scheduler(v2)
    try:
        first = [submit(lm, sched, mi) for mi in inputs[:4]]
        wait_until(lambda: len(first[0].tokens) >= 3, timeout=30)  # the rest join a running batch
        later = [submit(lm, sched, mi) for mi in inputs[4:]]
        for seq in first + later:
            seq.wait_for(1 << 30, timeout=60)
        assert sched.max_batch_seen >= 5
        for seq, (tokens, steps) in zip(first + later, refs):
            assert seq.done and seq.error is None
            assert seq.tokens == tokens
            assert_logp_close(seq.logp_trace, steps)
        assert sched.stats()["kv_bytes"] == 0  # every row freed
    finally:
        sched.stop()


def test_seeded_sampling_is_reproducible_alone_and_inside_a_batch(v2):
    inputs = [llm_inputs(v2, r) for r in mixed_requests(v2)]
    lm, sched = make_scheduler(v2, greedy=False)
    try:
        alone = submit(lm, sched, inputs[1], seed=1234)
        alone.wait_for(1 << 30, timeout=60)
        again = submit(lm, sched, inputs[1], seed=1234)
        others = [submit(lm, sched, mi) for mi in inputs[2:]]
        for seq in [again, *others]:
            seq.wait_for(1 << 30, timeout=60)
        other_seed = submit(lm, sched, inputs[1], seed=99)
        other_seed.wait_for(1 << 30, timeout=60)
        assert sched.max_batch_seen >= 4
        assert alone.tokens and again.tokens == alone.tokens
        assert other_seed.tokens != alone.tokens
    finally:
        sched.stop()


class _StepsAfterCancel:
    """A scheduler observer counting the steps that ended with ``victim`` still in the batch."""

    def __init__(self) -> None:
        self.victim = None
        self.with_victim = 0

    def on_step(self, batch_size: int, seconds: float) -> None:
        if self.victim is not None and not self.victim.done:
            self.with_victim += 1

    def on_tokens(self, n: int) -> None:
        pass


def test_cancelling_one_request_removes_it_within_one_step_and_leaves_the_others_unchanged(batched_long):
    reqs = mixed_requests(batched_long)
    inputs = [llm_inputs(batched_long, r) for r in (reqs[1], reqs[2], reqs[5])]
    steps = _StepsAfterCancel()
    lm, sched = make_scheduler(batched_long, observer=steps)
    try:
        solo = [submit(lm, sched, mi) for mi in inputs[1:]]
        for seq in solo:
            seq.wait_for(1 << 30, timeout=120)
        victim = submit(lm, sched, inputs[0])
        rest = [submit(lm, sched, mi) for mi in inputs[1:]]
        wait_until(lambda: len(victim.tokens) >= 20, timeout=30)
        steps.victim = victim
        victim.cancel()
        at_cancel = len(victim.tokens)
        wait_until(lambda: victim.done, timeout=30)
        assert len(victim.tokens) <= at_cancel + 1
        # counted in the scheduler thread, so a slow test thread cannot inflate it: the step already
        # running when the flag was set may finish with the victim in it; the next one may not
        assert steps.with_victim <= 2, steps.with_victim
        for seq, want in zip(rest, solo):
            seq.wait_for(1 << 30, timeout=120)
            assert len(seq.tokens) > at_cancel
            assert seq.tokens == want.tokens
    finally:
        sched.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("index", range(8), ids=lambda i: f"req{i}")
def test_every_mode_through_the_batched_engine(batched, index, stream):
    req = mixed_requests(batched)[index]
    req.stream = stream
    chunks = list(batched.synthesize(req, threading.Event()))
    audio = np.concatenate([c.pcm for c in chunks])
    assert len(audio) > batched.sample_rate // 4 and np.abs(audio).max() > 0


@pytest.mark.parametrize("index", [1, 2], ids=["sft", "zero_shot"])
def test_a_long_stream_comes_in_several_chunks_and_matches_the_whole_file(batched_long, index):
    req = mixed_requests(batched_long)[index]
    whole = list(batched_long.synthesize(req, threading.Event()))
    req.stream = True
    chunks = list(batched_long.synthesize(req, threading.Event()))
    assert len(whole) == 1 and len(chunks) >= 3
    assert sum(len(c.pcm) for c in chunks) == len(whole[0].pcm)  # greedy: the same tokens either way


def test_voice_conversion_through_the_batched_engine(batched):
    req = SynthesisRequest(mode="vc", prompt_audio=PromptAudio(speechlike(3.0), 16000),
                           source_audio=PromptAudio(speechlike(2.0, seed=5), 16000))
    audio = np.concatenate([c.pcm for c in batched.synthesize(req, threading.Event())])
    assert abs(len(audio) / batched.sample_rate - 2.0) < 0.2


def test_concurrent_requests_get_the_audio_they_get_one_by_one(batched):
    reqs = mixed_requests(batched)[:6]
    for i, r in enumerate(reqs):
        r.stream = i % 2 == 0
    sequential = [sum(len(c.pcm) for c in batched.synthesize(r, threading.Event())) for r in reqs]
    steps_before = batched.llm_stats()["steps"]
    out: dict[int, int] = {}

    def run(i: int) -> None:
        out[i] = sum(len(c.pcm) for c in batched.synthesize(reqs[i], threading.Event()))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [out[i] for i in range(len(reqs))] == sequential
    stats = batched.llm_stats()
    assert stats["max_batch_seen"] >= 3 and stats["steps"] > steps_before


def test_a_cancelled_engine_request_leaves_the_batch(batched_long, monkeypatch):
    # The LLM outruns token2wav on a tiny model: hold its decode steps after 80 tokens (past the first
    # hop's) until the request is cancelled, so the sequence is surely still decoding when it is.
    lm = batched_long.runner.lm
    decode, steps, held = lm.decode, [0], threading.Event()

    def paced(*args, **kwargs):
        steps[0] += 1
        if steps[0] > 80:
            held.wait(30)
        return decode(*args, **kwargs)

    monkeypatch.setattr(lm, "decode", paced)
    req = mixed_requests(batched_long)[1]
    req.stream = True
    cancel = threading.Event()
    gen = batched_long.synthesize(req, cancel)
    next(gen)  # the first chunk: the sequence is decoding
    assert batched_long.llm_stats()["running"] == 1
    cancel.set()
    gen.close()
    held.set()
    wait_until(lambda: batched_long.llm_stats()["running"] == 0, timeout=5)
    assert batched_long.llm_stats()["kv_bytes"] == 0
    assert steps[0] < 120  # it left at once: this request decodes 222 steps when left alone


def test_no_cache_or_memory_growth_over_1000_mixed_sequences(v2):
    reqs = mixed_requests(v2)
    inputs = [llm_inputs(v2, r) for r in (reqs[0], reqs[2], reqs[3], reqs[5], reqs[7])]
    lm, sched = make_scheduler(v2, greedy=False, max_batch_size=16)
    sched.trace_logp = False
    proc = psutil.Process()

    def wave(start: int, count: int) -> None:
        seqs = []
        for i in range(start, start + count):
            cancel = threading.Event()
            seqs.append((submit(lm, sched, inputs[i % len(inputs)], seed=i, cancel=cancel), cancel, i))
        for seq, cancel, i in seqs:
            if i % 7 == 0:
                cancel.set()  # some leave early, by their cancel flag
            elif i % 11 == 0:
                seq.cancel()
        for seq, _, _ in seqs:
            seq.wait_for(1 << 30, timeout=120)

    try:
        wave(0, 100)  # warm up allocator pools
        gc.collect()
        rss0 = proc.memory_info().rss
        for start in range(100, 1000, 50):
            wave(start, 50)
        gc.collect()
        grown = proc.memory_info().rss - rss0
        stats = sched.stats()
        assert stats["running"] == 0 and stats["pending"] == 0
        assert stats["kv_bytes"] == 0 and stats["kv_rows"] == 0
        assert stats["max_batch_seen"] == 16
        assert grown < 64 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MiB"
    finally:
        sched.stop()


def test_stopping_the_scheduler_fails_every_sequence_in_flight_with_scheduler_closed(batched_long):
    from app.engines.cosyvoice.llm.scheduler import SchedulerClosed

    reqs = mixed_requests(batched_long)
    lm, sched = make_scheduler(batched_long, max_batch_size=2)
    running = [submit(lm, sched, llm_inputs(batched_long, reqs[i])) for i in (1, 2)]  # two cache rows
    waiting = submit(lm, sched, llm_inputs(batched_long, reqs[5]))  # no room: still pending
    wait_until(lambda: all(len(seq.tokens) >= 5 for seq in running), timeout=30)
    sched.stop()
    assert not sched.alive
    for seq in [*running, waiting]:
        assert seq.done and isinstance(seq.error, SchedulerClosed), seq.error
    with pytest.raises(SchedulerClosed):
        running[0].wait_for(1 << 30, timeout=1)
