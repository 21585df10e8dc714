"""A realistic cosyserve traffic mix for locust.

    locust -f locustfiles/locustfile.py --host http://127.0.0.1:8000
    make loadtest                       # starts a local server and runs this headless

The mix: short and long texts; whole files and streams; wav, mp3, pcm and opus;
the native ``POST /v1/tts`` and the OpenAI ``POST /v1/audio/speech`` surfaces.

Reported per request name:

* ``<surface> <format> <short|long> [stream]``: the request, timed to the LAST
  byte of the body (locust's own stream mode stops the clock at the headers).
* ``TTFA <path> stream``: time to the first audio byte of every stream, as its
  own row (request type ``TTFA``).
* ``rejected <name>``: a 503 from admission control. That is the server doing its
  job under overload, so it is a success with its own name, not a failure.

Anything else (4xx, 5xx, a broken or empty body) is a failure.
Environment: ``COSYSERVE_LOCUST_WAIT="min,max"`` seconds between a user's
requests (default 0.2,1.0); ``COSYSERVE_LOCUST_VOICE`` (default ``alloy``, an
OpenAI name the server maps onto its preset speakers).
"""

from __future__ import annotations

import os
import random
import time

from locust import HttpUser, between, task

SHORT_TEXTS = (
    "Hello there.",
    "Your order has shipped.",
    "Turn left at the next corner.",
    "The meeting starts in five minutes.",
)
LONG_TEXTS = (
    ("The quick brown fox jumps over the lazy dog near the quiet river bank. Later that evening, the fox "
     "returned to its den, tired but satisfied, while the dog slept on, unaware of anything at all."),
    ("Thank you for calling. All of our agents are busy helping other customers right now. Please stay on "
     "the line and your call will be answered in the order it was received. You can also visit our website."),
    ("In the morning the market opens early, and the first traders arrive before sunrise to set up their "
     "stalls. By noon the square is crowded with people buying bread, fruit, and fresh flowers."),
)
WAIT = tuple(float(x) for x in os.environ.get("COSYSERVE_LOCUST_WAIT", "0.2,1.0").split(","))
VOICE = os.environ.get("COSYSERVE_LOCUST_VOICE", "alloy")


class TTSUser(HttpUser):
    wait_time = between(WAIT[0], WAIT[-1])

    # -- native /v1/tts -----------------------------------------------------------------------------
    @task(4)
    def native_short_wav(self) -> None:
        self.native("wav", random.choice(SHORT_TEXTS), "short", stream=False)

    @task(2)
    def native_long_pcm_stream(self) -> None:
        self.native("pcm", random.choice(LONG_TEXTS), "long", stream=True)

    @task(1)
    def native_short_mp3_stream(self) -> None:
        self.native("mp3", random.choice(SHORT_TEXTS), "short", stream=True)

    @task(1)
    def native_long_opus(self) -> None:
        self.native("opus", random.choice(LONG_TEXTS), "long", stream=False)

    # -- OpenAI /v1/audio/speech (it always streams, except flac) -------------------------------------
    @task(3)
    def openai_short_mp3(self) -> None:
        self.openai("mp3", random.choice(SHORT_TEXTS), "short")

    @task(1)
    def openai_long_wav(self) -> None:
        self.openai("wav", random.choice(LONG_TEXTS), "long")

    @task(1)
    def openai_short_opus(self) -> None:
        self.openai("opus", random.choice(SHORT_TEXTS), "short")

    @task(1)
    def openai_long_pcm(self) -> None:
        self.openai("pcm", random.choice(LONG_TEXTS), "long")

    # -- helpers ----------------------------------------------------------------------------------------
    def native(self, fmt: str, text: str, size: str, stream: bool) -> None:
        body = {"text": text, "format": fmt, "stream": stream}
        name = f"/v1/tts {fmt} {size}{' stream' if stream else ''}"
        self.call("/v1/tts", body, name, ttfa_name="TTFA /v1/tts stream" if stream else None)

    def openai(self, fmt: str, text: str, size: str) -> None:
        body = {"model": "tts-1", "voice": VOICE, "input": text, "response_format": fmt}
        self.call("/v1/audio/speech", body, f"/v1/audio/speech {fmt} {size} stream",
                  ttfa_name="TTFA /v1/audio/speech stream")

    def call(self, path: str, body: dict, name: str, ttfa_name: str | None) -> None:
        t0 = time.perf_counter()
        with self.client.post(path, json=body, name=name, stream=True, catch_response=True) as r:
            if r.status_code == 503:
                r.request_meta["name"] = f"rejected {name}"
                r.success()
                return
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            first: float | None = None
            size = 0
            try:
                for part in r.iter_content(chunk_size=None):
                    if part and first is None:
                        first = time.perf_counter() - t0
                    size += len(part)
            except Exception as exc:  # noqa: BLE001 - any way a body can break after the headers is a failure
                r.failure(f"body aborted after {size} bytes: {type(exc).__name__}")
                return
            r.request_meta["response_time"] = (time.perf_counter() - t0) * 1000
            r.request_meta["response_length"] = size
            if size == 0:
                r.failure("empty body")
                return
            r.success()
        if ttfa_name is not None and first is not None:
            self.environment.events.request.fire(
                request_type="TTFA", name=ttfa_name, response_time=first * 1000, response_length=0,
                exception=None, context={},
            )
