"""Out of memory fails one request at most, never a batch (errors injected on the CPU).

* the batched LLM step: the newest sequence leaves the batch and waits for room (its cache
  rebuilt from its input and tokens when it rejoins); the step runs again with the others.
  Every request then gets exactly the tokens it gets without the error (greedy). Alone, the
  sequence fails, and the scheduler takes the next request;
* one request's token2wav: that request fails; the others in the batch finish.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch = pytest.importorskip("torch")

from app.engines.base import EngineFailure, SynthesisRequest  # noqa: E402
from app.engines.cosyvoice.llm.forward import BatchedLM  # noqa: E402
from app.engines.cosyvoice.llm.sampling import SamplingRules  # noqa: E402
from app.engines.cosyvoice.llm.scheduler import LLMScheduler  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402
from tests.support import configs
from tests.support.waiting import wait_until  # noqa: E402


@pytest.fixture(scope="module")
def lm(tiny_models):
    return BatchedLM(load_model_dir(tiny_models(2, long=True)).model.llm)


def inputs(lm: BatchedLM, count: int) -> list[tuple]:
    empty = torch.zeros(1, 0, dtype=torch.int32)
    out = []
    with torch.inference_mode():
        for i in range(count):
            text = torch.randint(0, 3000, (1, 6 + 2 * i), dtype=torch.int32, generator=torch.Generator().manual_seed(i))
            x, lo, _ = lm.prefix(text, empty, empty)
            out.append((x, lo, 60))
    return out


class OOMOnce:
    """``lm.decode`` that raises CUDA's out-of-memory error once, in the first step with ``rows`` rows after ``after`` steps."""

    def __init__(self, decode, rows: int, after: int) -> None:
        self.decode, self.rows, self.after = decode, rows, after
        self.calls = 0
        self.raised = 0

    def __call__(self, kv, tokens):
        self.calls += 1
        if not self.raised and kv.rows >= self.rows and self.calls > self.after:
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory (planted)")
        return self.decode(kv, tokens)


def run(lm: BatchedLM, items: list[tuple], stagger: bool = True) -> tuple[list, LLMScheduler]:
    sched = LLMScheduler(lm, max_batch_size=8, rules=SamplingRules.from_llm(lm.llm, greedy=True))
    sched.start()
    seqs = []
    try:
        for x, lo, hi in items:
            seqs.append(sched.submit(x, lo, hi))
            if stagger:  # each joins a running batch: the last one is the newest
                wait_until(lambda: len(seqs[-1].tokens) >= 2 or seqs[-1].done, timeout=30)
        for seq in seqs:
            seq.wait_for(1 << 30, timeout=60)
    finally:
        sched.stop()
    return seqs, sched


def test_an_oom_step_sends_the_newest_back_to_the_queue_and_every_request_gets_its_tokens(lm):
    items = inputs(lm, 3)
    want, _ = run(lm, items)
    injector = OOMOnce(lm.decode, rows=3, after=5)
    lm.decode = injector
    try:
        got, sched = run(lm, items)
    finally:
        del lm.decode
    assert injector.raised == 1
    assert sched.stats()["oom_preemptions"] == 1
    assert [s.error for s in got] == [None, None, None]
    assert [s.tokens for s in got] == [s.tokens for s in want]
    assert all(len(s.tokens) > 10 for s in got)
    assert sched.stats()["kv_bytes"] == 0


def test_an_oom_step_with_one_sequence_fails_it_and_the_scheduler_goes_on(lm):
    items = inputs(lm, 2)
    injector = OOMOnce(lm.decode, rows=1, after=3)
    lm.decode = injector
    sched = LLMScheduler(lm, max_batch_size=8, rules=SamplingRules.from_llm(lm.llm, greedy=True))
    sched.start()
    try:
        first = sched.submit(*items[0])
        with pytest.raises(torch.OutOfMemoryError):
            first.wait_for(1 << 30, timeout=60)
        assert sched.alive
        second = sched.submit(*items[1])
        second.wait_for(1 << 30, timeout=60)
        assert second.error is None and len(second.tokens) > 10
    finally:
        sched.stop()
        del lm.decode


def test_an_oom_in_one_requests_token2wav_fails_that_request_only(tiny_models):
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                          llm_greedy=True, max_batch_size=8))
    eng.load()
    model = eng.loaded.model
    token2wav = model.token2wav
    victim = "request-2"

    def failing(**kw):
        if threading.current_thread().name == victim:
            raise torch.OutOfMemoryError("CUDA out of memory (planted, token2wav)")
        return token2wav(**kw)

    model.token2wav = failing
    texts = ["Hello there, how are you today?", "A second sentence, a little longer than that.",
             "The third one fails.", "And a fourth request to finish the batch."]
    results: dict[str, object] = {}
    start = threading.Barrier(len(texts))

    def speak(i: int) -> None:
        req = SynthesisRequest(text=texts[i], mode="sft", speaker=eng.voices()[0], stream=i % 2 == 0)
        start.wait()
        try:
            results[f"request-{i}"] = sum(len(c.pcm) for c in eng.synthesize(req, threading.Event()))
        except EngineFailure as exc:
            results[f"request-{i}"] = exc

    try:
        threads = [threading.Thread(target=speak, args=(i,), name=f"request-{i}") for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert isinstance(results[victim], EngineFailure)
        assert "OutOfMemoryError" in str(results[victim])
        for name in ("request-0", "request-1", "request-3"):
            assert isinstance(results[name], int) and results[name] > eng.sample_rate // 4, results[name]
        eng.health_check()  # the scheduler lives on
        wait_until(lambda: eng.llm_stats()["running"] == 0, timeout=10)
        assert eng.llm_stats()["kv_bytes"] == 0
        again = SynthesisRequest(text=texts[2], mode="sft", speaker=eng.voices()[0])
        model.token2wav = token2wav
        audio = np.concatenate([c.pcm for c in eng.synthesize(again, threading.Event())])
        assert len(audio) > eng.sample_rate // 4
    finally:
        eng.close()
