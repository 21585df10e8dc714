"""bench/abuse.py's pure parts: options, the polite client's statuses, the adversaries' tallies, goals, report."""

from __future__ import annotations

import pytest

from bench.abuse import PHASES, parse_args, statuses
from bench.lib.abuse_clients import Tally, request_head, status_of
from bench.lib.load import Result
from bench.report import (
    abuse_goals,
    abuse_markdown,
    abuse_row,
    answers_text,
    reference,
    server_log,
    server_refusal_p99_ms,
    storm_rates,
)

MB = 1024 * 1024


def polite(rps: float, p99: float | None, ok: int = 10) -> dict:
    return {"throughput_rps": rps, "latency_p50_s": p99 and p99 / 2, "latency_p99_s": p99, "ok": ok}


def phase(name: str, adversary: str | None, rps: float, p99: float | None, **kw) -> dict:
    return {"name": name, "adversary": adversary, "clients": 4, "polite": polite(rps, p99, kw.pop("ok", 10)),
            "polite_statuses": kw.pop("statuses", {}), "rss_start": 800 * MB, "rss_peak": kw.pop("peak", 810 * MB),
            "cpu": {"server": 0.9, "bench": 0.02, "adversary": 0.1}, "tally": kw.pop("tally", None), **kw}


def test_the_alone_phase_runs_first_and_last_around_the_chosen_adversaries():
    args = parse_args(["--only", "dribblers, storm-64", "--phase-s", "5"])
    assert args.phases == ["alone", "dribblers", "storm-64", "alone-again"] and args.phase_s == 5
    assert parse_args([]).phases == ["alone", *PHASES, "alone-again"]
    with pytest.raises(SystemExit):
        parse_args(["--only", "nonsense"])


def test_the_polite_clients_other_answers_are_counted_by_status_with_their_retry_after():
    rs = [Result(0, 200, 0.3, 0.1, 10, "ok"), Result(0, 503, 0.01, None, 0, "rejected", retry_after="2"),
          Result(0, 503, 0.01, None, 0, "rejected", retry_after="2"), Result(0, 0, 120, None, 0, "timeout"),
          Result(0, 500, 0.2, None, 0, "error")]
    assert statuses(rs) == {"503 (Retry-After 2)": 2, "no answer (timeout)": 1, "500": 1}


def test_raw_answers_and_requests():
    assert status_of(b"HTTP/1.1 413 Payload Too Large\r\n") == "413"
    assert status_of(b"\x15\x03") == "garbled"
    head = request_head("127.0.0.1", "/v1/tts", 209715200)
    assert head.startswith(b"POST /v1/tts HTTP/1.1\r\n") and b"Content-Length: 209715200\r\n" in head
    assert head.endswith(b"\r\n\r\n")
    chunked = request_head("127.0.0.1", "/v1/tts", None)
    assert b"Transfer-Encoding: chunked\r\n" in chunked and b"Content-Length" not in chunked


def test_a_tally_counts_answers_with_their_times_and_bytes():
    t = Tally("huge", 1)
    t.count("413", 0.5, 70_000)
    t.count("413", 0.7, 90_000)
    t.count("open at end", 30.0, 5 * MB)
    text = answers_text(t.__dict__)
    assert text.startswith("413 x2, open at end x1; after p50 700 ms, max 30000 ms") and "sent max 5.0 MiB" in text


def test_the_reference_is_the_mean_of_the_alone_phases():
    ref = reference([phase("alone", None, 3.0, 0.4), phase("dribblers", "dribble", 1.0, 2.0),
                     phase("alone-again", None, 2.0, 0.6)])
    assert ref == {"throughput_rps": 2.5, "latency_p99_s": 0.5, "runs": 2}


def test_a_storms_goodput_counts_the_200s_overlap_with_the_window():
    tally = {"ok": [[0.0, 2.0], [9.0, 2.0]], "rejected": {"1.0": 1, "5.0": 2, "11.0": 1, "11.1": 5}}
    rates = storm_rates(tally, 1.0, 11.0)
    assert rates["goodput_rps"] == pytest.approx((0.5 + 1.0) / 10) and rates["rejected_per_s"] == pytest.approx(0.4)
    storm = Tally("storm", 8)
    storm.count("200")
    storm.count("503", 0.004)
    assert answers_text(storm.__dict__) == "200 x1, 503 x1; the non-200s after p50 4 ms, max 4 ms"


def test_goals_pass_and_fail_per_phase():
    giant = Tally("giant", 2)
    for s in (0.01, 0.02, 0.03):
        giant.count("413 /v1/tts", s, MB)
    huge = Tally("huge", 1)
    huge.count("413", 0.1, 200 * MB)
    storm = {"goodput_rps": 2.0, "rejected_per_s": 900.0, "total_rps": 2.6}
    phases = [phase("alone", None, 3.0, 0.4), phase("dribblers", "dribble", 0.0, None, ok=0,
                                                    statuses={"503 (Retry-After 1)": 2}),
              phase("giant-fields", "giant", 2.9, 0.5, tally=giant.__dict__, server_4xx_p99_ms=12.0),
              phase("huge-body", "huge", 2.8, 0.45, peak=1200 * MB, tally=huge.__dict__),
              phase("storm-8", "storm", 0.6, 0.4, storm=storm), phase("alone-again", None, 3.0, 0.4)]
    goals = {(g["phase"], g["goal"]): g["pass"] for g in abuse_goals(phases)}
    assert goals[("dribblers", "polite goodput vs alone")] is False
    assert goals[("dribblers", "polite p99 vs alone")] is False  # not one 200: fails, not n/a
    assert goals[("dribblers", "polite 5xx answers")] is False
    assert goals[("giant-fields", "polite goodput vs alone")] is True
    assert goals[("giant-fields", "every giant field refused (4xx)")] is True
    assert goals[("giant-fields", "4xx answer time p99, as the server timed it (without the pacer's hold)")] is True
    assert goals[("huge-body", "server RSS growth (peak - phase start)")] is False
    assert goals[("huge-body", "bytes sent before the answer or close (max)")] is False
    assert goals[("storm-8", "all 200s/s (storm + polite) vs polite alone")] is False  # 2.6 / 3.0
    assert ("storm-8", "polite 5xx answers") not in goals  # the storm's goal is the server's goodput


def test_long_job_goals_grade_the_polite_client_and_the_websocket_against_http():
    def long_tally(kind: str, audio_s: float, wall_s: float) -> dict:
        return {**Tally(kind, 1).__dict__, "audio_s": audio_s, "audio_wall_s": wall_s}

    phases = [phase("alone", None, 3.0, 0.4),
              phase("ws-long", "ws-long", 2.3, 0.9, tally=long_tally("ws-long", 100.0, 100.0)),
              phase("http-long", "http-long", 2.5, 0.7, tally=long_tally("http-long", 140.0, 100.0)),
              phase("alone-again", None, 3.0, 0.4)]
    goals = {(g["phase"], g["goal"]): (g["value"], g["pass"]) for g in abuse_goals(phases)}
    assert goals[("ws-long", "polite goodput vs alone")] == ("0.77", False)  # 2.3 / 3.0 < 0.8
    assert goals[("ws-long", "polite p99 vs alone")] == ("2.25", False)  # 0.9 / 0.4 > 2
    assert goals[("http-long", "polite goodput vs alone")] == ("0.83", True)
    assert goals[("http-long", "polite p99 vs alone")] == ("1.75", True)
    assert goals[("ws-long, http-long", "WS utterance's audio-s per s: HTTP's over the WebSocket's")] == ("1.40", False)
    assert ("ws-long", "polite 5xx answers") not in goals  # the long-job phases have the goals only


def test_slow_heads_are_graded_on_every_client_closed_within_the_head_deadline():
    slow = Tally("slow-head", 3)
    for after in (10.0, 10.1, 12.5):
        slow.count("408", after, 2)
    slow.count("open at end", 4.0, 1)
    phases = [phase("alone", None, 3.0, 0.4), phase("slow-heads", "slow-head", 2.9, 0.4, tally=slow.__dict__),
              phase("alone-again", None, 3.0, 0.4)]
    goals = {(g["phase"], g["goal"]): (g["value"], g["pass"]) for g in abuse_goals(phases)}
    assert goals[("slow-heads", "slow heads answered or closed by the server (each client at least once)")] == (
        "3 of 3 clients", True)
    assert goals[("slow-heads", "longest a slow head stayed open before its answer or close (s)")] == ("12.5", False)
    assert goals[("slow-heads", "polite goodput vs alone")][1] is True
    assert parse_args(["--only", "slow-heads"]).phases == ["alone", "slow-heads", "alone-again"]


def test_lines_and_report_name_every_phase():
    tally = Tally("dribble", 4)
    tally.count("408", 30.0, 31)
    phases = [phase("alone", None, 3.0, 0.4), phase("dribblers", "dribble", 2.9, 0.5, tally=tally.__dict__),
              phase("alone-again", None, 3.0, 0.4)]
    ref = reference(phases)
    row = abuse_row(phases[1], ref)
    assert row[1] == "2.90 (0.97)" and "dribble x4: 408 x1" in row[7] and "sent max 31 B" in row[7]
    results = {"phases": phases, "started": "now", "cores": 2, "loadavg_start": [0.1], "loadavg_end": [0.2],
               "model": "tiny", "phase_s": 30.0, "lead_s": 3.0, "load_generator": "normal",
               "goals": abuse_goals(phases)}
    md = abuse_markdown(results)
    assert "did not run" not in md
    assert "did not run" in abuse_markdown({**results, "server_gone_before": "storm-64"})
    assert "| dribblers | 2.90 (0.97) |" in md and "| dribblers | polite goodput vs alone | 0.97 | >= 0.9 | PASS |" in md


LOG = """\
2026-12-03 17:59:50,634 INFO cosyserve.access: 3d2d POST /v1/tts 200 337.0ms ttfa=150.1ms audio=2.12s stages=llm=119ms
2026-12-03 17:59:54,077 INFO cosyserve.access: f297 POST /v1/tts 413 39.1ms ttfa=- audio=0.00s
2026-12-03 17:59:54,177 INFO cosyserve.access: f298 POST /v1/tts 413 11.0ms ttfa=- audio=0.00s
2026-12-03 17:59:54,377 INFO cosyserve.access: f29a POST /v1/tts 413 102.0ms ttfa=- audio=0.00s held=100ms
2026-12-03 17:59:55,000 INFO cosyserve.access: f299 POST /v1/tts 500 30000.0ms ttfa=- audio=0.00s aborted
2026-12-03 17:53:55,703 INFO cosyserve.ws: 10ab WS /v1/audio/speech/stream utterances=0 chars=0 audio=0.00s 5.0s close=1000
2026-12-03 17:53:55,704 INFO uvicorn.error: connection open
"""


def test_the_server_log_gives_each_answer_its_count_and_server_side_times():
    log = server_log(LOG)
    assert list(log) == ["POST /v1/tts 200", "POST /v1/tts 413", "POST /v1/tts 500 aborted", "WS close=1000"]
    assert log["POST /v1/tts 413"] == {"count": 3, "p50_ms": 39.1, "p99_ms": 102.0, "max_ms": 102.0}
    assert log["WS close=1000"]["max_ms"] == 5000.0
    assert server_refusal_p99_ms(LOG) == 39.1 and server_refusal_p99_ms("") is None  # 102 - 100 held: 2 ms
    assert server_refusal_p99_ms(LOG, held=True) == 100.0
