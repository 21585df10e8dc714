"""Host syncs per batched decode step, counted on the CPU with the proxy of ``tests/support/syncs.py``.

A GPU step that reads a value back (``int()``, ``.item()``, ``.tolist()``), copies to the
host, or indexes with a boolean mask makes the host wait for every kernel queued so far.
The step may wait once: for the copy of its log-probs, which sampling then reads on the
host. (On CUDA, ``python -m bench gpu`` counts the same with
``torch.cuda.set_sync_debug_mode``.)
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.llm.forward import BatchedLM  # noqa: E402
from app.engines.cosyvoice.llm.sampling import SamplingRules  # noqa: E402
from app.engines.cosyvoice.llm.scheduler import LLMScheduler  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402
from tests.support.syncs import HostSyncCounter  # noqa: E402


def test_the_proxy_counts_what_would_wait_on_a_device_and_not_host_work():
    counter = HostSyncCounter()
    weights = torch.randn(8, 5)  # made before: "device" memory, like a model's weights
    with counter.probe():
        x = weights @ torch.ones(5)
        int(x.argmax())  # 1: a value read
        x[x > 0].sum()  # 1: a boolean mask (its size depends on values)
        x.tolist()  # 1
        host = x.to("cpu", torch.float32, copy=True)  # 1: the copy to the host
        int(host.argmax()), host[host > 0], host.tolist()  # host work: free
        host[3] = float("-inf")
        torch.multinomial(host.softmax(0), 1, generator=torch.Generator().manual_seed(0)).item()
    with counter.probe():
        (weights * 2).sum(0)  # device work that reads nothing back
    assert counter.per_step == [4, 0]
    assert counter.kinds == {"_local_scalar_dense": 1, "bool_mask_index": 1, "tolist": 1, "to_host": 1}


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_a_decode_step_of_four_sequences_syncs_once(tiny_models, greedy):
    lm = BatchedLM(load_model_dir(tiny_models(2, long=True)).model.llm)
    counter = HostSyncCounter()
    sched = LLMScheduler(lm, max_batch_size=8, rules=SamplingRules.from_llm(lm.llm, greedy=greedy),
                         step_probe=counter.probe)
    empty = torch.zeros(1, 0, dtype=torch.int32)
    sched.start()
    try:
        seqs = []
        with torch.inference_mode():
            for i in range(4):
                text = torch.randint(0, 3000, (1, 8 + i), dtype=torch.int32, generator=torch.Generator().manual_seed(i))
                x, lo, _ = lm.prefix(text, empty, empty)
                seqs.append(sched.submit(x, lo, 40, seed=i))
        for seq in seqs:
            seq.wait_for(1 << 30, timeout=60)
    finally:
        sched.stop()
    assert all(seq.error is None and len(seq.tokens) >= 10 for seq in seqs)
    assert sched.max_batch_seen == 4 and len(counter.per_step) >= 10
    assert counter.per_step == [1] * len(counter.per_step), dict(counter.kinds)
    assert counter.kinds == {"to_host": len(counter.per_step)}
