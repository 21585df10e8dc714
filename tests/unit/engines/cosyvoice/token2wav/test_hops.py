"""The streaming hop schedule (first-chunk control) and the flow scheduler's round policy; no torch."""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace

import pytest

from app.engines.cosyvoice.flow.scheduler import MAX_SKIPS, FlowJob, pick_round
from app.engines.cosyvoice.token2wav.hops import HopSchedule, first_hop_bounds

V2 = HopSchedule(hop=25, max_hop=100, scale=2, lookahead=3)


def hops(schedule: HopSchedule, prompt: int, n: int = 5) -> list[int]:
    return list(itertools.islice(schedule.hops(prompt), n))


def ends(schedule: HopSchedule, prompt: int, n: int = 5) -> list[int]:
    """Where each chunk ends, counted from the prompt's first token."""
    return list(itertools.accumulate(hops(schedule, prompt, n), initial=prompt))[1:]


@pytest.mark.parametrize("prompt", [0, 30, 50, 74])
def test_the_default_schedule_is_cosyvoices(prompt):
    pad = -(-prompt // 25) * 25 - prompt  # CosyVoice2Model.tts: ceil(prompt / hop) * hop - prompt
    assert hops(V2, prompt) == [25 + pad, 50, 100, 100, 100]
    assert all(end % 25 == 0 for end in ends(V2, prompt))
    assert V2.with_first(None) is V2


@pytest.mark.parametrize("prompt", [0, 30, 50, 74])
@pytest.mark.parametrize("first", [5, 10, 25, 60])
def test_a_first_hop_of_the_requests_own_then_chunk_ends_back_on_the_hop(prompt, first):
    got = hops(V2.with_first(first), prompt)
    assert got[0] == first
    assert got[2:] == [50, 100, 100]  # then the model's own growth
    assert all(end % 25 == 0 for end in ends(V2.with_first(first), prompt)[1:])
    assert 25 <= got[1] < 50


def test_with_the_flow_cache_the_first_hop_is_rounded_up_to_a_chunk_end():
    s = HopSchedule(hop=25, max_hop=100, scale=2, lookahead=3, chunk=25).with_first(5)
    assert hops(s, 30) == [20, 25, 50, 100, 100]  # 30 + 20 = 50: a whole chunk
    assert all(end % 25 == 0 for end in ends(s, 30))


def test_a_fixed_hop_model_keeps_its_hop():
    fixed = HopSchedule(hop=25, max_hop=25, scale=1, lookahead=3)
    assert hops(fixed, 10) == [40, 25, 25, 25, 25]
    assert hops(fixed.with_first(8), 10) == [8, 32, 25, 25, 25]


def _model(**kw):
    flow = SimpleNamespace(token_mel_ratio=2, pre_lookahead_len=3)
    return SimpleNamespace(flow=flow, token_hop_len=25, **kw)


def test_first_hop_bounds_come_from_the_model():
    v2 = _model(mel_cache_len=8, token_max_hop_len=100, stream_scale_factor=2)
    assert first_hop_bounds(v2, HopSchedule.of(v2)) == (5, 100)  # 8 held-back mel frames = 4 tokens, + 1
    fixed = _model(mel_cache_len=8)  # the PyPI fork: no growing hop
    assert first_hop_bounds(fixed, HopSchedule.of(fixed)) == (5, 25)
    predictor = SimpleNamespace(condnet=[SimpleNamespace(causal_padding=6)])
    v3 = _model(hift=SimpleNamespace(f0_predictor=predictor), token_max_hop_len=100, stream_scale_factor=2)
    assert first_hop_bounds(v3, HopSchedule.of(v3)) == (4, 100)


# -- the flow scheduler's rounds -------------------------------------------------------------------

def job(frames: int, *, first: bool = False, started: float = 0.0, streaming: bool = True, skipped: int = 0,
        bulk: bool = False):
    j = FlowJob(item=SimpleNamespace(streaming=streaming), frames=frames, first=first, started=started,
                cancel=threading.Event(), bulk=bulk)
    j.skipped = skipped
    return j


def test_first_hops_go_first_then_the_oldest_request():
    later = job(100, started=1.0)
    older = job(100, started=0.5)
    first = job(100, first=True, started=2.0)
    assert pick_round([later, older, first], max_batch=2) == [first, older]
    assert pick_round([later, older, first], max_batch=8) == [first, older, later]


def test_a_round_does_not_pad_a_short_hop_to_a_long_call():
    short = job(100, first=True)
    long_ = job(2000, started=1.0)
    assert pick_round([short, long_], max_batch=8) == [short]  # 1,900 of its 2,000 frames would be padding
    close = job(190, started=1.0)
    assert pick_round([short, close, long_], max_batch=8) == [short, close]


def test_streaming_and_whole_calls_are_padded_separately():
    hop = job(100, first=True)
    whole = job(2000, started=1.0, streaming=False)  # its own group in the round: no padding against the hop
    assert pick_round([hop, whole], max_batch=8) == [hop, whole]


def test_a_job_left_out_goes_first_after_max_skips_rounds():
    long_ = job(2000, started=1.0, skipped=MAX_SKIPS)
    short = job(100, first=True, started=2.0)
    assert pick_round([short, long_], max_batch=8) == [long_, short]  # overdue: first, padding or not
    assert pick_round([short, long_], max_batch=1) == [long_]


def test_interactive_jobs_come_first_in_a_round_and_bulk_fills_the_rest():
    bulk_old = job(100, started=0.0, bulk=True)
    bulk_first = job(100, first=True, started=0.5, bulk=True)
    interactive = job(100, started=5.0)
    interactive_first = job(100, first=True, started=9.0)
    pending = [bulk_old, bulk_first, interactive, interactive_first]
    assert pick_round(pending, max_batch=2) == [interactive_first, interactive]
    assert pick_round(pending, max_batch=3) == [interactive_first, interactive, bulk_first]
    assert pick_round(pending, max_batch=8) == [interactive_first, interactive, bulk_first, bulk_old]


def test_an_overdue_bulk_job_does_not_pad_interactive_calls_of_its_kind():
    hop = job(100, first=True, started=5.0)
    long_bulk = job(2000, started=0.0, skipped=MAX_SKIPS, bulk=True)
    assert pick_round([long_bulk, hop], max_batch=8) == [hop]  # it waits for a round without them
    assert pick_round([long_bulk], max_batch=8) == [long_bulk]
    whole = job(2000, started=0.0, skipped=MAX_SKIPS, streaming=False, bulk=True)
    assert pick_round([whole, hop], max_batch=8) == [hop, whole]  # another kind: a pass of its own
    overdue_interactive = job(2000, started=1.0, skipped=MAX_SKIPS)
    assert pick_round([overdue_interactive, hop], max_batch=8) == [overdue_interactive, hop]
