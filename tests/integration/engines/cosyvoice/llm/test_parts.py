"""The batching building blocks on their own: the batched KV cache and the sampling rules."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.llm.kv import BatchedKV  # noqa: E402
from app.engines.cosyvoice.llm.sampling import (  # noqa: E402
    Sampler,
    SamplingRules,
    nucleus_support,
    ranked_greedy,
)


def filled(kv: BatchedKV, length: int, value: float) -> int:
    row = kv.add_row(length)
    for layer in range(kv.layers):
        block = torch.full((kv.kv_heads, length, kv.head_dim), value)
        kv.write_prefix(layer, row, block, -block)
    return row


def test_rows_stay_compact_and_keep_their_contents():
    kv = BatchedKV(layers=2, kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu", min_rows=2, min_positions=4)
    rows = [filled(kv, n, float(i + 1)) for i, n in enumerate((3, 9, 5))]  # grows rows and positions
    assert rows == [0, 1, 2] and kv.lengths == [3, 9, 5]
    assert kv.capacity == (4, 16)
    moved = kv.remove_row(0)  # the last row moves into row 0
    assert moved == 2 and kv.lengths == [5, 9]
    assert torch.all(kv.k[1][0, :, :5] == 3.0) and torch.all(kv.v[0][0, :, :5] == -3.0)
    assert torch.all(kv.k[0][1, :, :9] == 2.0)
    kv.write_step(0, torch.tensor([5, 9]), torch.full((2, 2, 4), 7.0), torch.zeros(2, 2, 4))
    assert torch.all(kv.k[0][0, :, 5] == 7.0) and torch.all(kv.k[0][1, :, 9] == 7.0)
    assert kv.remove_row(1) is None and kv.lengths == [5]
    kv.remove_row(0)
    assert kv.capacity == (0, 0) and kv.nbytes() == 0  # an empty batch holds no memory


def cosyvoice_support(probs: torch.Tensor, top_p: float, top_k: int, draws: int = 600) -> set[int]:
    from cosyvoice.utils.common import nucleus_sampling

    torch.manual_seed(0)
    return {int(nucleus_sampling(probs.log(), top_p=top_p, top_k=top_k)) for _ in range(draws)}


@pytest.mark.parametrize("seed", range(4))
def test_nucleus_support_is_cosyvoices(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(300, generator=gen) * (1 + seed)
    probs = logits.softmax(0)
    ids, _ = nucleus_support(probs, 0.8, 25)
    assert set(ids.tolist()) == cosyvoice_support(probs, 0.8, 25)


def test_end_of_speech_is_masked_below_the_minimum_and_greedy_takes_the_best_allowed():
    logp = torch.log_softmax(torch.tensor([0.0, 1.0, 9.0, 2.0]), 0)  # id 2 is "eos" here
    sampler = Sampler(SamplingRules(greedy=True), eos_token=2, seed=0)
    assert sampler.sample(logp, [], ignore_eos=True) == 3
    assert sampler.sample(logp, [], ignore_eos=False) == 2
    sampled = Sampler(SamplingRules(), eos_token=2, seed=0)
    assert all(sampled.sample(logp, [], ignore_eos=True) != 2 for _ in range(200))


def test_a_repeated_token_is_redrawn_from_the_whole_distribution():
    probs = torch.tensor([0.9] + [0.1 / 99] * 99)  # the nucleus is token 0 alone
    logp = probs.log()
    fresh = Sampler(SamplingRules(), eos_token=99, seed=1)
    assert {fresh.sample(logp, [5, 6, 7], ignore_eos=False) for _ in range(50)} == {0}
    repeating = Sampler(SamplingRules(), eos_token=99, seed=1)
    picks = [repeating.sample(logp, [0] * 10, ignore_eos=False) for _ in range(400)]
    assert 0 in picks and len(set(picks)) > 5  # drawn from everything, mostly 0


def test_same_seed_same_draws():
    logp = torch.log_softmax(torch.randn(500, generator=torch.Generator().manual_seed(3)), 0)
    a, b = (Sampler(SamplingRules(top_p=0.99, top_k=200), eos_token=499, seed=42) for _ in range(2))
    seq_a = [a.sample(logp, [], ignore_eos=True) for _ in range(30)]
    assert seq_a == [b.sample(logp, [], ignore_eos=True) for _ in range(30)]
    assert len(set(seq_a)) > 3


def test_rules_come_from_the_models_ras_sampling_partial():
    import functools

    from cosyvoice.utils.common import ras_sampling

    class LLM:
        sampling = functools.partial(ras_sampling, top_p=0.7, top_k=10, win_size=8, tau_r=0.2)

    assert SamplingRules.from_llm(LLM()) == SamplingRules(top_p=0.7, top_k=10, win_size=8, tau_r=0.2)


def test_ranked_greedy_walks_down_the_ranking_when_asked_again_for_the_same_step():
    sample = ranked_greedy()
    scores = torch.tensor([0.1, 3.0, 2.0, -1.0])
    assert [int(sample(scores, [1, 2], 25)) for _ in range(3)] == [1, 2, 0]
    assert int(sample(scores, [1, 2, 3], 25)) == 1  # a new step starts at the top again
