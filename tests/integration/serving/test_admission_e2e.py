"""End to end on the real tiny CosyVoice2 with the default settings: overload is shed at once and
admitted requests stay fast (issue 20).

The bound is on how many requests are in flight, measured with Little's law from the clients'
own numbers (mean in flight = completions per second x mean latency), not on wall-clock time:
on a busy shared machine both sides of the law slow down together, so the test holds there too.
Before adaptive admission the defaults admitted 16 running + 16 queued requests: the 2 x BOUND
closed-loop clients were all in flight at once (a latency of 2 x BOUND service times each) and
nothing was refused.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

import httpx
import pytest

from app.lifespan import CPU_START_PER_CORE
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
# requests in flight the defaults may keep: running, what the limit starts at on this machine and up to two steps
# above it (the knee search probes its neighbours); waiting, one round of those (app/serving/admission/limit/waiting.py); 8 on 2 cores
BOUND = 2 * (CPU_START_PER_CORE * max(2, os.cpu_count() or 1) + 2)
CLIENTS = 2 * BOUND  # the old defaults (16 + 16) had every one of them in flight
BURST = 6 * CPU_START_PER_CORE * max(2, os.cpu_count() or 1)  # at once: 12 on 2 cores
SUSTAIN_S, MAX_SUSTAIN_S, DONE = 15.0, 120.0, 8  # the sustained phase: its least and most seconds, the served it needs


def stream(url: str) -> tuple[int, float, float, str | None]:
    """One streamed PCM request: (status, start, seconds to the last byte, Retry-After)."""
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/tts", json={"text": TEXT, "format": "pcm", "stream": True},
                      timeout=300) as r:
        for _ in r.iter_raw():
            pass
        return r.status_code, t0, time.monotonic() - t0, r.headers.get("retry-after")


def concurrently(n: int, fn) -> list:
    out: list = []
    lock = threading.Lock()

    def run() -> None:
        result = fn()
        with lock:
            out.append(result)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return out


def metric(url: str, line_start: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(line_start)))


def test_overload_with_the_defaults_sheds_at_once_and_keeps_few_requests_in_flight(tiny_models, tmp_path):
    config = {  # no pool section: what a user gets
        "engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1},
        "server": {"drain_timeout_s": 30, "access_log": False},
        "voices": {"dir": str(tmp_path / "voices")},
    }
    with ServerProcess(tmp_path, config) as srv:
        url = srv.base_url
        assert "admission: adaptive" in srv.log()
        alone = [stream(url) for _ in range(3)]
        assert all(status == 200 for status, *_ in alone)

        burst = concurrently(BURST, lambda: stream(url))  # far past what the cores finish at once
        admitted = [s for status, _, s, _ in burst if status == 200]
        refused = [(s, ra) for status, _, s, ra in burst if status == 503]
        assert len(admitted) + len(refused) == len(burst), {status for status, *_ in burst}
        assert 1 <= len(admitted) <= BOUND and refused
        assert all(ra is not None and int(ra) >= 1 for _, ra in refused)
        # refused without waiting for engine work (the API tests time this exactly; here BURST threads connect
        # at once on a busy machine, so only compared with the admitted ones)
        assert statistics.median(s for s, _ in refused) < 0.5 * statistics.median(admitted)

        # sustained overload: CLIENTS closed-loop clients (a refused one retries 0.1 s later), for at least
        # SUSTAIN_S and until DONE requests started after the first 3 s have been served: a slower machine runs
        # longer rather than judging from fewer samples (on a 2-core host one request takes ~0.7 s alone and a
        # few seconds under this load); never past MAX_SUSTAIN_S
        t0 = time.monotonic()
        served_late = []  # requests started after the first 3 s and served (one entry each)

        def go_on() -> bool:
            now = time.monotonic()
            return now < t0 + SUSTAIN_S or (len(served_late) < DONE and now < t0 + MAX_SUSTAIN_S)

        def client() -> list:
            mine = []
            while go_on():
                status, start, s, _ = stream(url)
                mine.append((status, start, s))
                if status == 200 and start >= t0 + 3.0:
                    served_late.append(start)
                if status == 503:
                    time.sleep(0.1)
            return mine

        seen = [r for mine in concurrently(CLIENTS, client) for r in mine]
        assert {status for status, _, _ in seen} <= {200, 503}
        done = [(start, s) for status, start, s in seen if status == 200 and start >= t0 + 3.0]  # after 3 s
        assert len(done) >= DONE and any(status == 503 for status, _, _ in seen), (
            f"{len(done)} served in {time.monotonic() - t0:.0f} s of overload")
        span = max(start + s for start, s in done) - min(start for start, _ in done)
        in_flight = len(done) / span * statistics.mean(s for _, s in done)  # Little's law
        assert in_flight <= BOUND, (in_flight, sorted(s for _, s in done))
        assert metric(url, 'tts_rejected_total{reason="over_budget"}') >= len(refused)
        assert metric(url, 'tts_admission_limit{mode="adaptive"}') < 16  # below the 16 workers it may use
