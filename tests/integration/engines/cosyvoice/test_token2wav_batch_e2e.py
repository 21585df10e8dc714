"""End to end: a real `cosyserve serve` with batched token2wav on (tiny CosyVoice2), and first_chunk_tokens."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.support.metrics import metric
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TEXT = "Six requests of the same sentence finish their tokens at the same step."


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("t2w-e2e")
    cfg = {
        "engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1, "token2wav_batch": "on"},
        "dev": {"llm_greedy": True},
        "pool": {"max_queue": 4, "queue_timeout_s": 60, "request_timeout_s": 120},
        "voices": {"dir": str(tmp / "voices")},
    }
    with ServerProcess(tmp, cfg) as srv:
        yield srv


def pcm_samples(base: str, body: dict) -> int:
    r = httpx.post(base + "/v1/tts", json={"text": TEXT, "format": "pcm", **body}, timeout=120)
    assert r.status_code == 200, r.text
    return len(r.content) // 2


def test_concurrent_requests_share_flow_rounds_and_get_their_own_audio(server):
    alone = pcm_samples(server.base_url, {})
    before = httpx.get(server.base_url + "/metrics", timeout=10).text
    out: dict[int, int] = {}
    start = threading.Barrier(6)

    def call(i: int) -> None:
        start.wait()
        out[i] = pcm_samples(server.base_url, {})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [out.get(i) for i in range(6)] == [alone] * 6  # greedy: the same tokens, the same audio length
    after = httpx.get(server.base_url + "/metrics", timeout=10).text
    rounds = metric(after, "tts_token2wav_batch_size_count") - metric(before, "tts_token2wav_batch_size_count")
    calls = metric(after, "tts_token2wav_batch_size_sum") - metric(before, "tts_token2wav_batch_size_sum")
    assert calls == 6  # one flow call per whole-file request
    assert rounds < calls, "the six final calls (their LLM ended at the same step) should have shared rounds"
    assert metric(after, "tts_token2wav_round_seconds_count") == metric(after, "tts_token2wav_batch_size_count")


def test_a_stream_with_a_small_first_chunk_carries_the_same_audio(server):
    whole = pcm_samples(server.base_url, {})
    assert pcm_samples(server.base_url, {"stream": True, "first_chunk_tokens": 5}) == whole
    r = httpx.post(server.base_url + "/v1/tts", json={"text": TEXT, "stream": True, "first_chunk_tokens": 26},
                   timeout=30)
    assert r.status_code == 400  # the installed CosyVoice2 has a fixed 25-token hop: its range is 5..25
    assert r.json()["error"]["code"] == "invalid_first_chunk_tokens" and "between 5 and 25" in r.json()["error"]["message"]
