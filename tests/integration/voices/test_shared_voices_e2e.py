"""Two real ``cosyserve serve`` processes on one voices directory (replicas on one RWX volume).

A voice registered through one is usable through the other within 1 s, a deleted
one disappears from both, and concurrent registrations of one name through the
two give exactly one 201 and one 409. The engine is the real tiny CosyVoice2,
so the voice the second server speaks with is features the first one computed.
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from tests.support.server import ServerProcess
from tests.support.sounds import voice_wav

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

TEXT = "Hello there, this is a registered voice speaking."

VISIBLE_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, tiny_models):
    root = tmp_path_factory.mktemp("shared")
    voices = root / "voices"
    servers = []
    try:
        for name in ("a", "b"):
            (root / name).mkdir()
            config = {"engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1}, "pool": {"workers": 2},
                      "server": {"drain_timeout_s": 10}, "voices": {"dir": str(voices), "sync_interval_s": 0.25}}
            servers.append(ServerProcess(root / name, config).start(timeout=300))
        yield servers
    finally:
        for s in servers:
            s.stop()


def register(http: httpx.Client, name: str) -> httpx.Response:
    return http.post("/v1/voices", data={"name": name, "transcript": "hello there, this is my voice"},
                     files={"audio": (f"{name}.wav", voice_wav(2.0), "audio/wav")})


def seconds_until(cond, limit: float = 5.0) -> float:
    """Poll ``cond()`` every 20 ms; return how long it took to hold (AssertionError after ``limit``)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"not reached within {limit} s")
        time.sleep(0.02)
    return time.monotonic() - t0


def test_registered_through_one_usable_through_the_other_and_deleted_everywhere(replicas):
    a, b = replicas
    with httpx.Client(base_url=a.base_url, timeout=120) as ha, httpx.Client(base_url=b.base_url, timeout=120) as hb:
        r = register(ha, "shared")
        assert r.status_code == 201, r.text
        card = r.json()
        took = seconds_until(lambda: hb.get("/v1/voices/shared").status_code == 200)
        print(f"\nvoice registered through A visible through B after {took:.3f} s")
        assert took < VISIBLE_WITHIN_S
        assert hb.get("/v1/voices/shared").json() == card
        assert "shared" in [v["name"] for v in hb.get("/v1/voices").json()["voices"]]
        spoken = hb.post("/v1/tts", json={"text": TEXT, "voice": "shared"})
        assert spoken.status_code == 200, spoken.text
        pcm, rate = sf.read(io.BytesIO(spoken.content), dtype="int16")
        assert rate == 24000 and len(pcm) > rate // 10

        assert hb.delete("/v1/voices/shared").status_code == 204
        took = seconds_until(lambda: ha.get("/v1/voices/shared").status_code == 404)
        print(f"voice deleted through B gone from A after {took:.3f} s")
        assert took < VISIBLE_WITHIN_S
        gone = ha.post("/v1/tts", json={"text": TEXT, "voice": "shared"})
        assert gone.status_code == 400 and gone.json()["error"]["code"] == "unknown_voice"
        assert "shared" not in [v["name"] for v in ha.get("/v1/voices").json()["voices"]]


def _register_at(server: ServerProcess, name: str, start: threading.Barrier, statuses: dict, key: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        start.wait()
        statuses[key] = register(http, name).status_code


def test_concurrent_registrations_of_one_name_through_both_give_one_201_and_one_409(replicas):
    a, b = replicas
    for round_ in range(3):
        name = f"race{round_}"
        start = threading.Barrier(2)
        statuses: dict[str, int] = {}
        threads = [threading.Thread(target=_register_at, args=(s, name, start, statuses, k))
                   for s, k in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert sorted(statuses.values()) == [201, 409], statuses
        winner = a if statuses["a"] == 201 else b
        loser = b if winner is a else a
        with httpx.Client(base_url=loser.base_url, timeout=30) as http:  # the loser serves the winner's voice
            seconds_until(lambda n=name: http.get(f"/v1/voices/{n}").status_code == 200, VISIBLE_WITHIN_S)
            assert http.delete(f"/v1/voices/{name}").status_code == 204
    voices = Path(a.config_path).parent.parent / "voices"
    assert sorted(p.name for p in voices.iterdir()) == []  # no leftovers of the losing writes
