"""Batched prefill: sequences that join at one step are prefilled in one forward (tiny CosyVoice2).

* ``BatchedLM.prefill_many`` over inputs of different lengths (and after saved cache rows,
  as bistream sequences come back) gives every row the keys/values and next-token
  log-probs of its input prefilled alone, within 1e-5 of their scale (fp32); its
  keys/values are those of CosyVoice's own backbone run over that input alone (its
  ``past_key_values``: the check that catches a wrong mask, since the tiny model's
  log-probs hardly depend on the context), and the rows already running are untouched.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.batching.lm import BatchedLM  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402

TOL = 1e-5  # fp32: largest difference / largest magnitude
MIXED = [5, 61, 23, 140, 9, 77, 31, 190, 12, 48, 103, 7, 66, 150, 3, 88]  # 16 lengths, 1 310 tokens in all
LONG = [620, 15, 380, 44, 500, 9, 260, 33]  # long prompts: several forwards under a 1 024-token cap
MAX_LEN = 24  # tokens per request in the decode tests (min 8)


@pytest.fixture(scope="module")
def lm(tiny_models):
    return BatchedLM(load_model_dir(tiny_models(2, long=True)).model.llm)


def make_inputs(lm: BatchedLM, lengths: list[int], seed: int = 0) -> list:
    """LLM inputs of exactly these lengths: start marker, text, task marker, prompt speech."""
    gen = torch.Generator().manual_seed(seed)
    empty = torch.zeros(1, 0, dtype=torch.int32)
    out = []
    with torch.inference_mode():
        for n in lengths:
            n_text = max(1, (n - 2) // 3)
            text = torch.randint(0, 3000, (1, n_text), generator=gen, dtype=torch.int32)
            speech = torch.randint(0, lm.spec.speech_token_size, (1, max(0, n - 2 - n_text)), generator=gen,
                                   dtype=torch.int32)
            out.append(lm.prefix(text, empty, speech)[0][:, :n])  # under 3 tokens: the head of a 3-token one
            assert out[-1].shape[1] == n
    return out


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
