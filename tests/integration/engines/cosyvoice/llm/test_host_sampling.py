"""Sampling is device-independent by construction, and one sequence's failure is its own.

* each decode step copies its log-probs to the host once (fp32 ``[n, V]``), and every
  sequence samples its row there with its own CPU generator (a Sampler refuses any other
  tensor), so the tokens of a seeded request depend on the seed and the log-probs only;
* a failure while sampling one sequence fails that request; the others finish, the
  scheduler thread lives on and takes new work.

Tiny CosyVoice2 (real classes), the batched LLM driven directly.
"""

from __future__ import annotations

import threading

import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.llm.forward import BatchedLM  # noqa: E402
from app.engines.cosyvoice.llm.sampling import Sampler, SamplingRules  # noqa: E402
from app.engines.cosyvoice.llm.scheduler import LLMScheduler  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def lm(tiny_models):
    return BatchedLM(load_model_dir(tiny_models(2, long=True)).model.llm)


def lm_inputs(lm: BatchedLM, count: int, max_len: int = 30) -> list[tuple]:
    empty = torch.zeros(1, 0, dtype=torch.int32)
    out = []
    with torch.inference_mode():
        for i in range(count):
            text = torch.randint(0, 3000, (1, 6 + 3 * i), dtype=torch.int32, generator=torch.Generator().manual_seed(i))
            x, lo, _ = lm.prefix(text, empty, empty)
            out.append((x, min(lo, 5), max_len))
    return out


class RecordingSampler(Sampler):
    """A sampler that notes what it was given (device, dtype, the storage of the step's copy; kept alive)."""

    def __init__(self, *args, seen: list, **kw) -> None:
        super().__init__(*args, **kw)
        self.seen = seen

    def sample(self, logp, decoded, ignore_eos):
        self.seen.append((len(decoded), logp.device.type, logp.dtype, logp.untyped_storage().data_ptr(),
                          tuple(logp.shape), logp))
        return super().sample(logp, decoded, ignore_eos)


class FailingSampler(Sampler):
    def __init__(self, *args, at: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.at = at

    def sample(self, logp, decoded, ignore_eos):
        if len(decoded) == self.at:
            raise RuntimeError("planted sampling failure")
        return super().sample(logp, decoded, ignore_eos)


def run_all(sched: LLMScheduler, seqs: list) -> None:
    for seq in seqs:
        seq.wait_for(1 << 30, timeout=60)


def test_a_sampler_takes_host_tensors_only_and_draws_with_a_cpu_generator():
    sampler = Sampler(SamplingRules(), eos_token=3, seed=7)
    assert sampler.generator.device.type == "cpu"
    with pytest.raises(ValueError, match="host tensors only"):
        sampler.sample(torch.zeros(10, device="meta"), [], ignore_eos=False)
    logp = torch.log_softmax(torch.randn(50, generator=torch.Generator().manual_seed(1)), 0)
    again = Sampler(SamplingRules(), eos_token=3, seed=7)
    assert [sampler.sample(logp, [], False) for _ in range(20)] == [again.sample(logp, [], False) for _ in range(20)]


def test_every_step_samples_from_one_host_copy_of_its_log_probs(lm):
    decoded_on: list = []
    decode = lm.decode

    def recording_decode(kv, tokens):  # each step's own result, kept alive (so no later tensor reuses its memory)
        out = decode(kv, tokens)
        decoded_on.append(out)
        return out

    seen: list = []
    rules = SamplingRules.from_llm(lm.llm)
    sched = LLMScheduler(lm, max_batch_size=8, rules=rules)
    lm.decode = recording_decode  # this test's own instance: restored below
    sched.start()
    try:
        seqs = [sched.submit(x, lo, hi, sampler=RecordingSampler(rules, lm.spec.eos_token, seed=i, seen=seen))
                for i, (x, lo, hi) in enumerate(lm_inputs(lm, 4))]
        run_all(sched, seqs)
    finally:
        sched.stop()
        del lm.decode
    assert all(s.error is None and len(s.tokens) > 10 for s in seqs)
    assert {(dev, dtype) for _, dev, dtype, *_ in seen} == {("cpu", torch.float32)}
    vocab = decoded_on[0].shape[1]
    assert {shape for *_, shape, _ in seen} == {(vocab,)}
    device_ptrs = {out.untyped_storage().data_ptr() for out in decoded_on}
    steps = max(step for step, *_ in seen)
    for step in range(1, steps + 1):  # step 0 is each prefill's own copy
        rows = [ptr for s, _, _, ptr, *_ in seen if s == step]
        if len(rows) > 1:
            assert len(set(rows)) == 1, f"step {step}: the rows of one step come from one host tensor"
            assert rows[0] not in device_ptrs, "sampling never reads the step's own output tensor"


def test_a_sampling_failure_fails_that_request_only_and_the_scheduler_lives_on(lm):
    rules = SamplingRules.from_llm(lm.llm)
    sched = LLMScheduler(lm, max_batch_size=8, rules=rules)
    sched.start()
    try:
        inputs = lm_inputs(lm, 4)
        alone = [sched.submit(x, lo, hi, seed=i) for i, (x, lo, hi) in enumerate(inputs)]
        run_all(sched, alone)
        seqs = [sched.submit(x, lo, hi, seed=i) if i != 2 else
                sched.submit(x, lo, hi, sampler=FailingSampler(rules, lm.spec.eos_token, seed=i, at=4))
                for i, (x, lo, hi) in enumerate(inputs)]
        run_all_or_error = []
        for seq in seqs:
            try:
                seq.wait_for(1 << 30, timeout=60)
            except RuntimeError as exc:
                run_all_or_error.append(str(exc))
        assert run_all_or_error == ["planted sampling failure"]
        assert seqs[2].done and len(seqs[2].tokens) == 4
        for i in (0, 1, 3):
            assert seqs[i].error is None and seqs[i].tokens == alone[i].tokens  # unchanged by the failure
        assert sched.alive
        later = sched.submit(*inputs[0][:3], seed=0)
        later.wait_for(1 << 30, timeout=60)
        assert later.tokens == alone[0].tokens and sched.stats()["kv_bytes"] == 0
    finally:
        sched.stop()


def test_seeded_tokens_do_not_depend_on_the_batch_or_the_order(lm):
    """The same seeds alone, together, and submitted in reverse order: the same tokens each."""
    inputs = lm_inputs(lm, 5)
    rules = SamplingRules.from_llm(lm.llm)
    sched = LLMScheduler(lm, max_batch_size=8, rules=rules)
    sched.start()
    try:
        alone = []
        for i, (x, lo, hi) in enumerate(inputs):
            seq = sched.submit(x, lo, hi, seed=100 + i)
            seq.wait_for(1 << 30, timeout=60)
            alone.append(seq.tokens)
        start = threading.Event()
        batch: dict[int, list] = {}

        def go(i: int) -> None:
            start.wait()
            x, lo, hi = inputs[i]
            seq = sched.submit(x, lo, hi, seed=100 + i)
            seq.wait_for(1 << 30, timeout=60)
            batch[i] = seq.tokens

        threads = [threading.Thread(target=go, args=(i,)) for i in reversed(range(len(inputs)))]
        for t in threads:
            t.start()
        start.set()
        for t in threads:
            t.join(120)
        assert [batch[i] for i in range(len(inputs))] == alone
        assert sched.max_batch_seen >= 2
    finally:
        sched.stop()
