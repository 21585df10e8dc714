"""Bulk rows yield to interactive ones at each LLM step, on the real CosyVoice2 classes (tiny random weights).

A bulk sequence steps only within the room the pool leaves (``set_bulk_room``); left out, it
keeps its cache row and resumes where it stopped, with the tokens it gets alone.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.engines.base import SynthesisRequest
from tests.support import configs
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch = pytest.importorskip("torch")

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Bulk work can wait a little.",
         "A live voice needs its first audio now."]
LENGTH = 40  # tokens per sequence (min = max length): the same work whatever the timing
STEP_S = 0.004  # at least this long per decode step


@pytest.fixture(scope="module")
def v2(tiny_models):
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, llm_greedy=True,
                                          batching=True, max_batch_size=8))
    eng.load()
    yield eng
    eng.close()


class Room:
    """The pool's side: how many bulk sequences may step now."""

    def __init__(self, value: int | None) -> None:
        self.value = value

    def __call__(self) -> int | None:
        return self.value


class Steps:
    """Observer: the batch size of every step."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_step(self, batch_size: int, seconds: float) -> None:
        self.sizes.append(batch_size)

    def on_tokens(self, n: int) -> None:
        pass


def scheduler(engine, room: Room, max_batch_size: int = 8, greedy: bool = True):
    from app.engines.cosyvoice.llm.forward import BatchedLM
    from app.engines.cosyvoice.llm.sampling import SamplingRules
    from app.engines.cosyvoice.llm.scheduler import LLMScheduler

    lm = BatchedLM(engine.loaded.model.llm)
    decode = lm.decode

    def paced(*args, **kw):  # the tiny model decodes a token in ~1 ms: slow it so a test sees the states
        time.sleep(STEP_S)
        return decode(*args, **kw)

    lm.decode = paced
    steps = Steps()
    sched = LLMScheduler(lm, max_batch_size=max_batch_size, observer=steps,
                         rules=SamplingRules.from_llm(lm.llm, greedy=greedy))
    sched.set_bulk_room(room)
    sched.start()
    return lm, sched, steps


def submit(engine, lm, sched, text: str, length: int = LENGTH, **kw):
    req = SynthesisRequest(text=text, mode="sft", speaker=engine.voices()[0])
    (mi,) = list(engine.inputs.for_request(req, engine.sample_rate))
    empty = torch.zeros(1, 0, dtype=torch.int32)
    with torch.inference_mode():
        x, _, _ = lm.prefix(mi["text"], empty, empty)
    return sched.submit(x, length, length, **kw)


def alone(engine, text: str, greedy: bool = True, **kw) -> list[int]:
    lm, sched, _ = scheduler(engine, Room(None), greedy=greedy)
    try:
        seq = submit(engine, lm, sched, text, **kw)
        seq.wait_for(1 << 30, timeout=120)
        return list(seq.tokens)
    finally:
        sched.stop()


def settled(seq, wait_s: float = 0.15) -> int:
    """Its token count once it stopped moving (a step already running when the room fell may finish)."""
    while True:
        n = len(seq.tokens)
        time.sleep(wait_s)
        if len(seq.tokens) == n:
            return n


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
def test_without_room_a_bulk_row_waits_while_interactive_ones_decode_then_resumes_with_its_own_tokens(v2, greedy):
    kw = {} if greedy else {"seed": 7}
    want_bulk = alone(v2, TEXTS[0], **kw) if greedy else None
    room = Room(1)
    lm, sched, steps = scheduler(v2, room, greedy=greedy)
    try:
        bulk = submit(v2, lm, sched, TEXTS[0], bulk=True, since=0.0, **kw)
        wait_until(lambda: len(bulk.tokens) >= 5, timeout=60)
        room.value = 0
        paused_at = settled(bulk)
        assert 0 < paused_at < LENGTH and sched.stats()["bulk_running"] == 1
        before = len(steps.sizes)
        interactive = [submit(v2, lm, sched, t, **kw) for t in TEXTS[1:]]
        for seq in interactive:
            seq.wait_for(1 << 30, timeout=120)
            assert len(seq.tokens) == LENGTH and seq.error is None
        assert len(bulk.tokens) == paused_at and not bulk.done  # no progress, its row kept
        assert sched.stats()["running"] == 1 and sched.stats()["kv_rows"] >= 1
        assert max(steps.sizes[before:]) == 2  # both interactive rows stepped together, the bulk row never
        room.value = 1
        bulk.wait_for(1 << 30, timeout=120)
        assert len(bulk.tokens) == LENGTH and bulk.error is None
        if greedy:
            assert bulk.tokens == want_bulk
            assert [s.tokens for s in interactive] == [alone(v2, t) for t in TEXTS[1:]]
        else:  # the same seed, undisturbed: the same tokens
            again = alone(v2, TEXTS[0], greedy=False, **kw)
            assert bulk.tokens == again
    finally:
        sched.stop()


def test_bulk_rows_step_oldest_first_up_to_the_room_and_interactive_ones_always(v2):
    room = Room(0)
    lm, sched, steps = scheduler(v2, room)
    try:
        young = submit(v2, lm, sched, TEXTS[1], bulk=True, since=2.0)
        old = submit(v2, lm, sched, TEXTS[0], bulk=True, since=1.0, length=10 * LENGTH)
        time.sleep(0.2)
        assert sched.stats()["bulk_pending"] == 2 and sched.stats()["prefill_forwards"] == 0  # not prefilled
        room.value = 2
        wait_until(lambda: len(old.tokens) >= 3 and len(young.tokens) >= 3, timeout=60)
        room.value = 1
        young_at = settled(young)
        old_at, before = len(old.tokens), len(steps.sizes)
        live = submit(v2, lm, sched, TEXTS[2])
        live.wait_for(1 << 30, timeout=120)
        assert len(live.tokens) == LENGTH
        assert len(young.tokens) == young_at and len(old.tokens) > old_at  # only the oldest bulk row stepped
        assert not old.done and max(steps.sizes[before:]) == 2  # beside the interactive one, never three
        room.value = 2
        for seq, n in ((old, 10 * LENGTH), (young, LENGTH)):
            seq.wait_for(1 << 30, timeout=120)
            assert len(seq.tokens) == n
    finally:
        sched.stop()


def test_cancelled_bulk_work_without_room_is_cleaned_up(v2):
    room = Room(1)
    lm, sched, _ = scheduler(v2, room)
    try:
        paused = submit(v2, lm, sched, TEXTS[0], bulk=True)
        wait_until(lambda: len(paused.tokens) >= 3, timeout=60)
        room.value = 0
        queued = submit(v2, lm, sched, TEXTS[1], bulk=True, cancel=threading.Event())
        settled(paused)
        paused.cancel()
        queued.cancel_flag.set()  # as the request's deadline does
        wait_until(lambda: paused.done and queued.done, timeout=5)
        assert paused.error is None and queued.error is None and queued.tokens == []
        stats = sched.stats()
        assert stats["running"] == 0 and stats["bulk_pending"] == 0 and stats["kv_bytes"] == 0
    finally:
        sched.stop()


def test_an_interactive_arrival_takes_the_place_of_the_newest_bulk_row(v2):
    want = [alone(v2, t) for t in TEXTS]
    lm, sched, _ = scheduler(v2, Room(None), max_batch_size=2)
    try:
        old = submit(v2, lm, sched, TEXTS[0], bulk=True, since=1.0)
        young = submit(v2, lm, sched, TEXTS[1], bulk=True, since=2.0)
        wait_until(lambda: len(old.tokens) >= 3 and len(young.tokens) >= 3, timeout=60)
        live = submit(v2, lm, sched, TEXTS[2])
        for seq in (live, old, young):
            seq.wait_for(1 << 30, timeout=120)
        assert sched.stats()["bulk_evictions"] >= 1 or young.done
        assert [old.tokens, young.tokens, live.tokens] == want  # the evicted row rebuilt: the same tokens
    finally:
        sched.stop()


def test_a_bulk_request_through_the_engine_waits_for_room_and_gets_its_audio(v2):
    spk = v2.voices()[0]
    req = SynthesisRequest(text=TEXTS[0], mode="sft", speaker=spk, stream=True)
    solo = sum(len(c.pcm) for c in v2.synthesize(req, threading.Event()))
    room = Room(0)
    v2.set_bulk_room(room)
    try:
        out: list[int] = []
        bulk = SynthesisRequest(text=TEXTS[0], mode="sft", speaker=spk, stream=True, priority="bulk")
        t = threading.Thread(target=lambda: out.append(sum(len(c.pcm) for c in v2.synthesize(bulk, threading.Event()))))
        t.start()
        wait_until(lambda: v2.llm_stats()["bulk_pending"] == 1, timeout=30)
        live = SynthesisRequest(text=TEXTS[2], mode="sft", speaker=spk)
        audio = np.concatenate([c.pcm for c in v2.synthesize(live, threading.Event())])
        assert len(audio) > 0 and not out  # interactive done while bulk still waits
        room.value = 1
        t.join(120)
        assert out == [solo]
    finally:
        v2.set_bulk_room(None)


def test_a_bulk_bistream_sequence_rejoins_only_with_room_and_gets_its_own_tokens(v2):
    from app.engines.cosyvoice.llm.bistream import BistreamFeed

    spec = v2.runner.lm.spec
    ids = [int(t) for t in v2.loaded.frontend._extract_text_token(TEXTS[0])[0].flatten().tolist()]

    def run(room: Room, hold: bool) -> list[int]:
        lm, sched, _ = scheduler(v2, room)
        try:
            feed = BistreamFeed(speech_token_size=spec.speech_token_size, fill_token=spec.fill_token,
                                mix_ratio=spec.mix_ratio, prompt_text=[], prompt_speech=[],
                                min_ratio=spec.min_token_text_ratio, max_ratio=spec.max_token_text_ratio)
            seq = sched.submit_bistream(feed, bulk=True)
            feed.push(ids)
            if hold:
                time.sleep(0.3)
                assert seq.tokens == [] and sched.stats()["prefill_forwards"] == 0  # its text waits for room
                room.value = 1
            feed.end()
            seq.wait_for(1 << 30, timeout=60)
            assert seq.error is None and len(seq.tokens) > 0
            return list(seq.tokens)
        finally:
            sched.stop()

    assert run(Room(0), hold=True) == run(Room(None), hold=False)
