"""bench/probes/overload_pairs.py's pure parts: the gauge shares and the phase line."""

from __future__ import annotations

from bench.probes.overload_pairs import line, parse_args, shares


def test_shares_count_each_reading_once():
    assert shares([2.0, 2.0, 3.0, 1.0]) == "1: 25%, 2: 50%, 3: 25%"
    assert shares([]) == "-"


def test_a_phase_line_says_how_often_the_places_sat_idle():
    p = {"kind": "open", "value": 9.0, "throughput_rps": 5.35, "latency_p50_s": 0.602, "latency_p99_s": 1.223,
         "rejected": 139, "server_cores": 1.7, "client_cores": 0.04, "limits": [2.0, 2.0, 3.0, 3.0],
         "in_flight": [1, 4, 2, 3]}
    text = line(p)
    assert text.lstrip().startswith("open 9/s: 5.35 req/s, p50 602 p99 1223 ms, 503s 139, server 1.70 cores")
    # a place sat idle at two readings: 1 in flight under a limit of 2, and 2 under 3
    assert "limit 2: 50%, 3: 50%" in text and "(under the limit: 50% of readings)" in text


def test_the_pool_is_json_and_the_rates_a_list():
    args = parse_args(["--pool", '{"workers": 2, "max_queue": 2, "admission": "fixed"}', "--rates", "9, 18"])
    assert args.pool == {"workers": 2, "max_queue": 2, "admission": "fixed"} and args.rates == [9.0, 18.0]
    assert parse_args([]).pool == {}
