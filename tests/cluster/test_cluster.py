"""Three cosyserve replicas behind a real nginx running the shipped deploy/nginx/cosyserve.conf.

The replicas run the fake engine in its sleeping mode (dev.fake_chunk_delay_s): each
request holds a slot for 3 x DELAY_S without burning CPU, so capacity is set by the slots
and not by the two cores of a CI machine. Steady open-loop load from httpx throughout.

- rolling restart (SIGTERM each replica in turn, start it again): not one request fails;
- one replica SIGKILLed: only streams already flowing from it fail; every other request,
  and every request started after the kill, succeeds (nginx retries the rest elsewhere);
- capacity adds up: three replicas admit >= 2.7x one replica's throughput, with no 503
  below their combined capacity and 503 + Retry-After past it.

The replicas run the default admission (adaptive; checked below), the same gate as a single
server's HTTP requests and WebSocket sessions.

`make test-cluster` runs these with -s to print the figures that docs/deploy.md quotes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support.load import Load, Outcome, rate_ok
from tests.support.nginx import Nginx
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

WORKERS = 4  # slots per replica
QUEUE = 8  # admitted requests waiting per replica (pool.max_queue): room for latency spikes on a busy CI box
DELAY_S = 0.1  # fake engine: sleep before each of its 3 chunks -> 0.3 s per request
SERVICE_S = 3 * DELAY_S
REPLICA_RPS = WORKERS / SERVICE_S  # what one replica can complete per second (13.3)


def replica_config(voices: Path) -> dict:
    return {
        "dev": {"fake_engine": True, "fake_chunk_delay_s": DELAY_S},
        "pool": {"workers": WORKERS, "max_queue": QUEUE},
        "server": {"drain_delay_s": 1.0, "drain_timeout_s": 10, "access_log": False, "log_level": "warning"},
        "voices": {"dir": str(voices)},
    }


@pytest.fixture
def replicas(tmp_path):
    servers = []
    try:
        for i in range(3):
            (tmp_path / f"r{i}").mkdir()
            servers.append(ServerProcess(tmp_path / f"r{i}", replica_config(tmp_path / "voices")).start(timeout=60))
        yield servers
    finally:
        for s in servers:
            s.stop()


def addr(server: ServerProcess) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def balancer(tmp_path, replicas):
    with Nginx(tmp_path / "nginx", [addr(s) for s in replicas]) as lb:
        yield lb


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.ok]


def summary(outcomes: list[Outcome]) -> str:
    bad = failures(outcomes)
    kinds: dict[str, int] = {}
    for o in bad:
        kinds[o.error or "?"] = kinds.get(o.error or "?", 0) + 1
    return f"{len(outcomes)} requests, {len(bad)} failed {kinds or ''}"


def restart(server: ServerProcess) -> tuple[float, float]:
    """SIGTERM, wait for the drained exit, start again on the same port; (drain s, start s)."""
    t0 = time.monotonic()
    assert server.stop(signal.SIGTERM, timeout=30) == 0, server.log()
    t1 = time.monotonic()
    server.start(timeout=60)
    return t1 - t0, time.monotonic() - t1


def test_rolling_restart_under_steady_load_fails_no_request(replicas, balancer):
    # 40% of the cluster: the two replicas left while one restarts run at 60%, with headroom for a
    # shared CI box whose cores also start the restarted replica
    load = Load(balancer.base_url, rate=0.4 * 3 * REPLICA_RPS)
    t0 = time.monotonic()
    load.start()
    try:
        time.sleep(2.0)
        times, phases = [], []
        for server in replicas:
            t = time.monotonic()
            times.append(restart(server))
            phases.append((t - t0, time.monotonic() - t0))
            time.sleep(1.5)  # back in the pool (nginx tries it again after fail_timeout) before the next one
    finally:
        outcomes = load.stop()
    served = {o.upstream.split(", ")[-1] for o in outcomes if o.ok and o.upstream}
    print(f"\nrolling restart at {load.rate:.1f} req/s: {summary(outcomes)}; "
          + "; ".join(f"replica {i}: drained in {d:.2f} s, ready again in {s:.2f} s" for i, (d, s) in enumerate(times))
          + f"; restarts at {', '.join(f'{a:.1f}-{b:.1f} s' for a, b in phases)}"
          + "".join(f"\n  failed at {o.start - t0:.2f} s: {o.error} via {o.upstream}" for o in failures(outcomes)))
    assert len(outcomes) > 100
    assert failures(outcomes) == []
    assert served == {addr(s) for s in replicas}  # every replica served, before and after its restart


def test_sigkill_fails_only_the_streams_flowing_from_the_killed_replica(replicas, balancer):
    victim = replicas[1]
    load = Load(balancer.base_url, rate=0.5 * 3 * REPLICA_RPS).start()
    try:
        time.sleep(3.0)
        inflight = httpx.get(victim.base_url + "/metrics", timeout=5).text
        killed_at = time.monotonic()
        victim.stop(signal.SIGKILL)
        time.sleep(5.0)
    finally:
        outcomes = load.stop()
    on_victim = next(float(line.split()[-1]) for line in inflight.splitlines()
                     if line.startswith("tts_inflight_requests "))
    bad = failures(outcomes)
    after = [o for o in outcomes if o.start > killed_at]
    print(f"\nSIGKILL of one of three replicas at {load.rate:.1f} req/s: {summary(outcomes)}; "
          f"{on_victim:.0f} request(s) in flight on it just before the kill; "
          f"{len(after)} request(s) started after the kill, {len(failures(after))} failed")
    for o in bad:  # in flight at the kill, a stream, already answering from the victim
        assert o.start <= killed_at <= o.end, o
        assert o.stream and o.status == 200 and o.upstream == addr(victim), o
    assert len(bad) <= on_victim + 1  # (+1: one admitted between the scrape and the kill)
    assert len(after) > 50 and failures(after) == []


def admitted(base_url: str, rate: float, seconds: float = 6.0, warmup_s: float = 1.5) -> tuple[float, list[Outcome]]:
    """Successful requests per second under open-loop load at ``rate`` (after a warm-up), and all outcomes."""
    load = Load(base_url, rate=rate, stream_share=0.0)
    t0 = time.monotonic()
    outcomes = load.run_for(seconds)
    return rate_ok(outcomes, t0 + warmup_s, t0 + seconds), outcomes


def test_the_replicas_run_the_default_adaptive_admission(replicas):
    """The cluster tests exercise the admission users get: adaptive (sized by hand here, so it starts at its
    ceiling, workers + max_queue, and follows measured latency from there)."""
    for server in replicas:
        text = httpx.get(server.base_url + "/metrics", timeout=5).text
        assert f'tts_admission_limit{{mode="adaptive"}} {float(WORKERS + QUEUE)}' in text, text[-2000:]
        assert f"tts_admission_ceiling {float(WORKERS + QUEUE)}" in text


def test_capacity_adds_up_and_503s_come_only_past_the_combined_capacity(replicas, balancer):
    one_rps, one_out = admitted(replicas[0].base_url, rate=2 * REPLICA_RPS)  # one replica, no balancer
    three_rps, three_out = admitted(balancer.base_url, rate=2 * 3 * REPLICA_RPS)
    below_rps, below_out = admitted(balancer.base_url, rate=0.8 * 3 * REPLICA_RPS)
    ratio = three_rps / one_rps
    print(f"\ncapacity ({WORKERS} slots + {QUEUE} queued per replica, {SERVICE_S:.1f} s per request, "
          f"{REPLICA_RPS:.1f} req/s per replica in theory):\n"
          f"  one replica (direct) offered {2 * REPLICA_RPS:.1f} req/s: admitted {one_rps:.1f} req/s; {summary(one_out)}\n"
          f"  three replicas offered {6 * REPLICA_RPS:.1f} req/s: admitted {three_rps:.1f} req/s = {ratio:.2f}x one; "
          f"{summary(three_out)}\n"
          f"  three replicas offered {0.8 * 3 * REPLICA_RPS:.1f} req/s (80% of combined): admitted {below_rps:.1f} req/s; "
          f"{summary(below_out)}")
    assert ratio >= 2.7
    assert failures(below_out) == []  # below the combined capacity: not one 503
    for out in (one_out, three_out):  # past it: refusals are 503 with Retry-After, nothing else
        refused = failures(out)
        assert refused, "the overload phase was not past capacity"
        assert all(o.status == 503 and o.retry_after for o in refused), {o.error for o in refused}
