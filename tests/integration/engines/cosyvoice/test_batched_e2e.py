"""End to end: a real `cosyserve serve` with LLM batching on (the default) on the tiny CosyVoice2."""

from __future__ import annotations

import io
import threading

import httpx
import pytest
import soundfile as sf

from tests.support.metrics import metric
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Batching puts many requests into one step of the language model.",
    "Hello there.",
    "A third sentence, of middling length, for the mix.",
    "Streaming and whole-file requests share the same batch.",
    "One more, to fill the batch up to six requests in flight.",
]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batching-e2e")
    cfg = {
        "engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1},  # batching: default
        "dev": {"llm_greedy": True},
        "pool": {"max_queue": 4, "queue_timeout_s": 60, "request_timeout_s": 120},  # workers: default
        "voices": {"dir": str(tmp / "voices")},
    }
    with ServerProcess(tmp, cfg) as srv:
        yield srv


def synth(base: str, i: int) -> int:
    """Audio samples of request i (odd ones streamed), decoded from the WAV we get back."""
    body = {"text": TEXTS[i], "format": "wav", "stream": i % 2 == 1}
    r = httpx.post(base + "/v1/tts", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if body["stream"]:  # a streamed WAV has an open-ended size field: parse the PCM after the header
        return (len(r.content) - 44) // 2
    audio, rate = sf.read(io.BytesIO(r.content), dtype="int16")
    assert rate == 24000
    return len(audio)


def test_default_config_batches_concurrent_requests_and_each_gets_its_own_audio(server):
    ready = httpx.get(server.base_url + "/health/ready", timeout=10).json()
    assert ready["workers"] == 16  # default: engine.max_batch_size concurrent requests
    alone = [synth(server.base_url, i) for i in range(len(TEXTS))]
    before = httpx.get(server.base_url + "/metrics", timeout=10).text
    out: dict[int, int] = {}
    start = threading.Barrier(len(TEXTS))

    def call(i: int) -> None:
        start.wait()
        out[i] = synth(server.base_url, i)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [out.get(i) for i in range(len(TEXTS))] == alone  # greedy: same tokens, same audio length
    after = httpx.get(server.base_url + "/metrics", timeout=10).text
    steps = metric(after, "tts_llm_batch_size_count") - metric(before, "tts_llm_batch_size_count")
    seqs = metric(after, "tts_llm_batch_size_sum") - metric(before, "tts_llm_batch_size_sum")
    tokens = metric(after, "tts_llm_tokens_total") - metric(before, "tts_llm_tokens_total")
    assert steps > 0 and seqs / steps > 1.5, "the concurrent requests should have shared LLM steps"
    assert tokens >= seqs - len(TEXTS)  # a token per row and step, less the stops, plus the prefills
    assert metric(after, "tts_llm_step_seconds_count") == metric(after, "tts_llm_batch_size_count")
    forwards = metric(after, "tts_llm_prefill_batch_size_count") - metric(before, "tts_llm_prefill_batch_size_count")
    joined = metric(after, "tts_llm_prefill_batch_size_sum") - metric(before, "tts_llm_prefill_batch_size_sum")
    # each request prefilled once; on a CPU one by one (engine.prefill_batch: auto, off there: measured slower)
    assert joined == len(TEXTS) and forwards == len(TEXTS)
    assert metric(after, "tts_llm_prefill_seconds_count") == metric(after, "tts_llm_prefill_batch_size_count")
    for stage in ("frontend", "llm", "flow", "hift", "encode"):  # every request timed every stage
        name = f'tts_stage_seconds_count{{stage="{stage}"}}'
        assert metric(after, name) - metric(before, name) == len(TEXTS), stage
        assert metric(after, f'tts_stage_seconds_sum{{stage="{stage}"}}') > 0, stage
