"""Batched prefill: sequences that join at one step are prefilled in one forward (tiny CosyVoice2).

* ``BatchedLM.prefill_many`` over inputs of different lengths (and after saved cache rows,
  as bistream sequences come back) gives every row the keys/values and next-token
  log-probs of its input prefilled alone, within 1e-5 of their scale (fp32); its
  keys/values are those of CosyVoice's own backbone run over that input alone (its
  ``past_key_values``: the check that catches a wrong mask, since the tiny model's
  log-probs hardly depend on the context), and the rows already running are untouched;
* whatever the joining pattern (1, 3 or 16 at once, long prompts split over forwards,
  joining a running batch, fresh requests and bistream sequences back with text in
  the same forward), every sequence decodes exactly the tokens it decodes alone
  (greedy); seeded sequences draw from their own generators, the same tokens for the same
  joining pattern every time (not compared with each row alone: see the seeded test).

Cancellation, failing inputs and out-of-memory errors: ``test_prefill_failures.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.llm.bistream import BistreamFeed  # noqa: E402
from app.engines.cosyvoice.llm.forward import BatchedLM  # noqa: E402
from app.engines.cosyvoice.llm.prefill import Joiner, plan  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402
from tests.support import configs  # noqa: E402
from tests.support.llm_batches import (  # noqa: E402
    MAX_LEN,
    MIXED,
    finish,
    make_inputs,
    queued_together,
    scheduler,
    submit,
)

TOL = 1e-5  # fp32: largest difference / largest magnitude
LONG = [620, 15, 380, 44, 500, 9, 260, 33]  # long prompts: several forwards under a 1 024-token cap


@pytest.fixture(scope="module")
def lm(tiny_models):
    return BatchedLM(load_model_dir(tiny_models(2, long=True)).model.llm)


def assert_close(got, want, what: str) -> None:
    scale = float(want.abs().max())
    diff = float((got - want).abs().max())
    assert diff <= TOL * max(scale, 1.0), f"{what}: {diff:.3g} against a scale of {scale:.3g}"


def backbone_logp(lm: BatchedLM, x) -> torch.Tensor:
    """CosyVoice's own transformers backbone over ``x`` [1, T, D]: the log-probs after its last position."""
    llm = lm.llm
    hidden = llm.llm.model(inputs_embeds=x, output_hidden_states=True).hidden_states[-1]  # normed already
    return llm.llm_decoder(hidden[0, -1]).log_softmax(-1)


def backbone_kv(lm: BatchedLM, x) -> list[tuple]:
    """CosyVoice's own backbone over ``x`` [1, T, D] alone: every layer's keys and values [KV, T, hd]."""
    cache = lm.llm.llm.model(inputs_embeds=x, use_cache=True).past_key_values
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [(layer.keys[0], layer.values[0]) for layer in cache.layers]
    return [(cache.key_cache[i][0], cache.value_cache[i][0]) for i in range(len(lm.layers))]


def assert_row_equals_alone(lm, kv, row, logp, x, whole, past=None, what="") -> None:
    """Row ``row`` of ``kv`` and its log-probs: as ``x`` prefilled alone (after ``past``), and its keys/values
    as CosyVoice's backbone gives for ``whole`` (``x`` after what ``past`` holds) alone."""
    alone = lm.new_cache()
    r, want = lm.prefill(alone, x, past=past)
    assert kv.lengths[row] == alone.lengths[r] == whole.shape[1]
    n = alone.lengths[r]
    assert_close(logp, want, f"{what} log-probs")
    assert int(logp.argmax()) == int(want.argmax())
    for i, (k, v) in enumerate(backbone_kv(lm, whole)):
        assert_close(kv.k[i][row, :, :n], alone.k[i][r, :, :n], f"{what} keys, layer {i}")
        assert_close(kv.v[i][row, :, :n], alone.v[i][r, :, :n], f"{what} values, layer {i}")
        assert_close(kv.k[i][row, :, :n], k, f"{what} keys against the backbone, layer {i}")
        assert_close(kv.v[i][row, :, :n], v, f"{what} values against the backbone, layer {i}")


@pytest.mark.parametrize("lengths", [[37], [5, 61, 23], MIXED, LONG[:4]], ids=["1", "3", "16", "long"])
def test_prefill_many_equals_each_input_alone(lm, lengths):
    xs = make_inputs(lm, lengths)
    with torch.inference_mode():
        kv = lm.new_cache()
        for x in make_inputs(lm, [30, 11], seed=9):  # two rows already running, at different lengths
            lm.prefill(kv, x)
        lm.decode(kv, [5, 6])
        before = kv.snapshot(0), kv.snapshot(1)
        rows, logp = lm.prefill_many(kv, [(x, None) for x in xs])
        assert rows == list(range(2, 2 + len(xs))) and logp.shape[0] == len(xs)
        for i, (row, x) in enumerate(zip(rows, xs)):
            assert_row_equals_alone(lm, kv, row, logp[i], x, x, what=f"input {i} ({x.shape[1]} tokens)")
            ref = backbone_logp(lm, x)
            live = ref > -50.0
            assert float((logp[i][live] - ref[live]).abs().max()) <= 1e-4
        for row, saved in enumerate(before):  # the running rows are as they were
            assert kv.lengths[row] == saved.length
            assert all(torch.equal(kv.k[i][row, :, :saved.length], saved.k[i]) for i in range(len(lm.layers)))


def test_prefill_many_after_saved_rows_equals_each_alone(lm):
    """Bistream sequences back with text: restored cache + new input, in one forward with fresh inputs."""
    heads = make_inputs(lm, [40, 9, 120], seed=1)  # what each had fed before it sat out
    more = make_inputs(lm, [6, 22, 1], seed=2)  # its next input
    fresh = make_inputs(lm, [50, 3], seed=3)
    with torch.inference_mode():
        kv = lm.new_cache()
        saved = []
        for x in heads:
            row, _ = lm.prefill(kv, x)
            saved.append(kv.snapshot(row))
        for _ in heads:
            kv.remove_row(0)
        assert kv.rows == 0
        lm.prefill(kv, fresh[0])  # one running row
        items = [(more[0], saved[0]), (fresh[1], None), (more[1], saved[1]), (more[2], saved[2])]
        joined = [torch.cat([h, m], 1) for h, m in zip(heads, more)]
        wholes = [joined[0], fresh[1], joined[1], joined[2]]
        rows, logp = lm.prefill_many(kv, items)
        for i, (row, (x, past), whole) in enumerate(zip(rows, items, wholes)):
            assert_row_equals_alone(lm, kv, row, logp[i], x, whole, past=past, what=f"item {i}")
        for i, (head, x) in enumerate(zip(heads, more)):  # CosyVoice's backbone over the whole input at once
            ref = backbone_logp(lm, torch.cat([head, x], dim=1))
            live = ref > -50.0
            got = logp[[0, 2, 3][i]]
            assert float((got[live] - ref[live]).abs().max()) <= 1e-4


def test_a_failed_prefill_leaves_the_cache_as_it_was(lm):
    xs = make_inputs(lm, [20, 30])
    with torch.inference_mode():
        kv = lm.new_cache()
        lm.prefill(kv, xs[0])
        bad = torch.zeros(1, 4, lm.hidden + 1)
        with pytest.raises(RuntimeError):
            lm.prefill_many(kv, [(xs[1], None), (bad, None)])
        assert kv.lengths == [20]
        with pytest.raises(ValueError):
            lm.check_input(bad)


def test_plan_puts_long_inputs_first_within_the_token_cap():
    def joiner(n: int) -> Joiner:
        return Joiner(seq=None, lm_input=SimpleNamespace(shape=(1, n, 8)))

    js = [joiner(n) for n in (10, 300, 20, 300, 5000, 40)]
    groups = plan(js, max_tokens=1024, max_batch=16)
    assert [[j.length for j in g] for g in groups] == [[5000], [300, 300, 40], [20, 10]]
    assert [[j.length for j in g] for g in plan(js, 1 << 20, max_batch=2)] == [[5000, 300], [300, 40], [20, 10]]
    assert [len(g) for g in plan(js, 1 << 20, max_batch=1)] == [1] * 6


# -- the scheduler --------------------------------------------------------------------------------
def alone(lm, xs, greedy: bool, max_len: int = MAX_LEN) -> list[list[int]]:
    """Every input decoded alone (its own scheduler run): the reference tokens."""
    out = []
    sched, _, _ = scheduler(lm, greedy)
    try:
        for i, x in enumerate(xs):
            seq = submit(sched, x, i, max_len)
            seq.wait_for(1 << 30, timeout=120)
            assert seq.error is None
            out.append(list(seq.tokens))
    finally:
        sched.stop()
    return out


@pytest.fixture(scope="module")
def references(lm):
    cache: dict = {}

    def get(name: str, lengths: list[int], greedy: bool, max_len: int = MAX_LEN) -> tuple[list, list]:
        key = (name, greedy, max_len)
        if key not in cache:
            xs = make_inputs(lm, lengths, seed=len(name))
            cache[key] = (xs, alone(lm, xs, greedy, max_len))
        return cache[key]

    return get


@pytest.mark.parametrize("greedy", [True], ids=["greedy"])  # seeded: test_seeded_sequences_joining_...
@pytest.mark.parametrize("count", [1, 3, 16])
def test_sequences_arriving_together_join_in_one_forward_and_decode_as_alone(lm, references, greedy, count):
    xs, want = references("mixed", MIXED, greedy)
    got, rec, stats = queued_together(lm, xs[:count], greedy)
    assert got == want[:count]
    assert all(len(t) >= 8 for t in got)
    assert [n for _, n, _ in rec.prefills] == [count]
    assert stats["prefill_forwards"] == 1 and stats["kv_bytes"] == 0


@pytest.mark.parametrize("greedy", [True], ids=["greedy"])  # seeded: test_seeded_sequences_joining_...
def test_sixteen_joining_a_running_batch_decode_as_alone_and_the_running_ones_too(lm, references, greedy):
    xs, want = references("mixed", MIXED, greedy)
    runners, runners_want = references("running", [70, 25], greedy, max_len=200)
    sched, rec, gate = scheduler(lm, greedy)
    try:
        running = [submit(sched, x, i, max_len=200) for i, x in enumerate(runners)]
        for seq in running:
            seq.wait_for(5, timeout=60)
        gate.arm()
        assert gate.held.wait(60)
        joined = [submit(sched, x, i) for i, x in enumerate(xs)]
        gate.go.set()
        got, got_running = finish(joined), finish(running)
    finally:
        sched.stop()
    assert got == want and got_running == runners_want
    assert 16 in [n for _, n, _ in rec.prefills]
    assert max(b for _, b, _ in rec.steps) == 18


@pytest.mark.parametrize("greedy", [True], ids=["greedy"])  # seeded: test_seeded_sequences_joining_...
def test_long_prompts_are_split_over_forwards_within_the_cap_and_decode_as_alone(lm, references, greedy):
    xs, want = references("long", LONG, greedy)
    got, rec, _ = queued_together(lm, xs, greedy, max_prefill_tokens=1024)
    assert got == want
    sizes = [n for _, n, _ in rec.prefills]
    assert sum(sizes) == len(LONG) and 1 < len(sizes) < len(LONG)  # [620], [500], [380, 260], [44, 33, 15, 9]
    assert sizes == [len(g) for g in plan([Joiner(None, x) for x in xs], 1024, 32)]


def feed_for(lm: BatchedLM) -> BistreamFeed:
    spec = lm.spec
    return BistreamFeed(speech_token_size=spec.speech_token_size, fill_token=spec.fill_token,
                        mix_ratio=spec.mix_ratio, prompt_text=[], prompt_speech=[],
                        min_ratio=spec.min_token_text_ratio, max_ratio=spec.max_token_text_ratio)


TEXTS = [[int(t) for t in torch.randint(0, 3000, (12,), generator=torch.Generator().manual_seed(s))] for s in range(3)]


def sat_out(seq, feed) -> None:
    """Wait until the bistream sequence ``seq`` sits out of the batch (cache saved) for more text."""
    wait_until(lambda: (seq.saved is not None and not feed.dirty) or seq.done, timeout=60)
    assert not seq.done


def bistream_alone(lm, greedy: bool) -> list[list[int]]:
    """Each text alone, in blocks of 5, 5 and the rest (the next block only once it sits out)."""
    out = []
    sched, _, _ = scheduler(lm, greedy)
    try:
        for i, text in enumerate(TEXTS):
            feed = feed_for(lm)
            seq = sched.submit_bistream(feed, seed=200 + i)
            for piece in (text[:5], text[5:10]):
                feed.push(piece)
                sat_out(seq, feed)
            feed.push(text[10:])
            feed.end()
            out.extend(finish([seq]))
    finally:
        sched.stop()
    return out


def bistream_join(lm, references, greedy: bool) -> tuple[list, list, list]:
    """2 running, 3 bistream sequences back with text and 4 new requests joining at one step.

    Returns the tokens of (the 4 new, the 2 running, the 3 bistream sequences)."""
    xs, _ = references("mixed", MIXED, greedy)
    runners, _ = references("running", [70, 25], greedy, max_len=200)
    sched, rec, gate = scheduler(lm, greedy)
    try:
        running = [submit(sched, x, i, max_len=200) for i, x in enumerate(runners)]
        feeds = [feed_for(lm) for _ in TEXTS]
        streams = [sched.submit_bistream(f, seed=200 + i) for i, f in enumerate(feeds)]
        for feed, text in zip(feeds, TEXTS):
            feed.push(text[:5])  # one block: 15 speech tokens, then each sits out with its cache saved
        for seq, feed in zip(streams, feeds):
            sat_out(seq, feed)
        assert all(not s.done for s in running)  # still running: the join below happens between steps
        gate.arm()
        assert gate.held.wait(60)
        for feed, text in zip(feeds, TEXTS):
            feed.push(text[5:10])
        joined = [submit(sched, x, i) for i, x in enumerate(xs[:4])]
        gate.go.set()
        got = finish(joined)
        for seq, feed, text in zip(streams, feeds, TEXTS):
            sat_out(seq, feed)
            feed.push(text[10:])
            feed.end()
        got_bistream, got_running = finish(streams), finish(running)
    finally:
        sched.stop()
    assert 7 in [n for _, n, _ in rec.prefills]  # 3 back with text + 4 new in one forward
    return got, got_running, got_bistream


def test_bistream_sequences_back_with_text_join_the_same_forward_as_new_requests(lm, references):
    """Greedy: every row's tokens are its tokens alone (packing moves log-probs by float rounding only)."""
    _, want = references("mixed", MIXED, True)
    _, runners_want = references("running", [70, 25], True, max_len=200)
    want_bistream = bistream_alone(lm, True)
    got, got_running, got_bistream = bistream_join(lm, references, True)
    assert got == want[:4] and got_running == runners_want
    assert got_bistream == want_bistream and all(len(t) > 20 for t in got_bistream)


def test_seeded_sequences_joining_together_draw_from_their_own_generators(lm, references):
    """Seeded: the same joining pattern gives the same tokens every time, and not the greedy ones.

    Seeded tokens are not compared with each row alone here: a packed forward moves a row's
    log-probs by float rounding (~1e-6, more or less at other thread counts and CPUs), and the
    random-weight model's next-token distribution is nearly flat (top probabilities ~1.8e-4,
    neighbours 1e-7 apart), so such rounding can move a nucleus draw. On a trained model the
    same rounding moves nothing a listener could hear; docs/batching.md says so."""
    first = bistream_join(lm, references, False)
    again = bistream_join(lm, references, False)
    assert first == again
    assert first != bistream_join(lm, references, True)


@pytest.mark.parametrize(("setting", "together"), [("auto", False), ("on", True), ("off", False)])
def test_engine_prefill_batch_decides_whether_joiners_share_a_forward(tiny_models, setting, together):
    """``engine.prefill_batch``: auto is off on a CPU (one forward per joiner measured faster there)."""
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                          max_batch_size=8, prefill_batch=setting))
    eng.load()
    try:
        joins = eng.runner.scheduler._joins
        assert joins.max_batch == (8 if together else 1)
    finally:
        eng.close()
