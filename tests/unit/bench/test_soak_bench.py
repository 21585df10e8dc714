"""The soak's rests (no request in flight when RSS is read at rest) and its growth per hour."""

from __future__ import annotations

import argparse
import math
import os
import threading
import time
import types

import psutil

from bench.soak import Pause, Rest, growth, rest_lines, rss_parts


def test_a_rest_waits_for_the_request_in_flight_and_holds_back_the_next() -> None:
    pause, stop = Pause(), threading.Event()
    assert pause.enter(stop)  # a client is in a request
    rested = threading.Event()
    resting = threading.Thread(target=lambda: (pause.rest(), rested.set()))
    resting.start()
    assert not rested.wait(0.2)  # not while the request is in flight
    pause.leave()
    assert rested.wait(2)
    entered = threading.Event()
    client = threading.Thread(target=lambda: (pause.enter(stop), entered.set()))
    client.start()
    assert not entered.wait(0.2)  # no new request during the rest
    pause.resume()
    assert entered.wait(2)
    pause.leave()
    client.join(2)
    resting.join(2)


def test_a_stop_lets_a_client_held_in_a_rest_leave() -> None:
    pause, stop = Pause(), threading.Event()
    pause.rest(timeout=1)
    outcome: list[bool] = []
    client = threading.Thread(target=lambda: outcome.append(pause.enter(stop)))
    client.start()
    time.sleep(0.1)
    stop.set()
    client.join(3)
    assert outcome == [False]  # it stops instead of sending a request
    pause.leave()
    assert pause.busy == 0


def test_growth_is_the_slope_after_the_warmup_and_over_each_half() -> None:
    mb = 2**20
    # flat 1,000 MB for the first 10 minutes, then +60 MB/h for 30 minutes, then +120 MB/h for 30 minutes
    samples = [(60.0 * m, 1000 * mb) for m in range(0, 10)]
    samples += [(60.0 * m, (1000 + (m - 10)) * mb) for m in range(10, 40)]
    samples += [(60.0 * m, (1030 + 2 * (m - 40)) * mb) for m in range(40, 70)]
    whole, first, second = growth(samples, 10 * 60)
    assert abs(first - 60) < 1 and abs(second - 120) < 1
    assert 60 < whole < 120
    assert all(math.isnan(v) for v in growth(samples[:2], 0))  # too few samples for a slope


def test_the_rss_splits_into_anonymous_and_file_backed_pages() -> None:
    rss, anon, file = rss_parts(psutil.Process())  # this process: it has both, and they make up its RSS
    with open(f"/proc/{os.getpid()}/status") as f:
        kb = {k: float(v.split()[0]) * 1024 for k, _, v in (ln.partition(":") for ln in f)
              if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
    assert anon > 0 and file > 0 and anon + file == rss
    assert abs(rss - kb["VmRSS"]) < 0.1 * kb["VmRSS"]
    assert abs(file - kb["RssFile"] - kb["RssShmem"]) < 0.1 * file  # shared memory counts with the file-backed pages
    no_split = types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(rss=300.0))  # psutil without it
    rss, anon, file = rss_parts(no_split)
    assert rss == 300.0 and math.isnan(anon) and math.isnan(file)


def test_the_rests_table_shows_the_split_and_its_growth() -> None:
    mb = 2**20
    rests = [Rest(60.0 * m, 1000 * mb + m * mb, 500 * mb, 200 * mb, 900 * mb + m * mb, 100 * mb) for m in range(0, 70, 5)]
    rested = {k: growth([(r.t, getattr(r, k)) for r in rests], 600) for k in Rest._fields[1:]}
    args = argparse.Namespace(rest_every=5.0, rest_s=15.0)
    text = "\n".join(rest_lines(rests, rested, args))
    assert "RSS **+60.0 MB/h**" in text and "RSS anonymous +60.0 MB/h, file-backed " in text and "0.0 MB/h." in text
    assert "| anonymous (MB) | file-backed (MB) |" in text and "| 65.0 | 1065 | 500 | 200 | 965 | 100 |" in text


def test_a_slope_leaves_out_readings_that_were_not_taken() -> None:
    samples = [(3600.0 * h, v) for h, v in ((0, 0.0), (1, float("nan")), (2, 2 * 2**20), (3, 3 * 2**20))]
    assert abs(growth(samples, 0)[0] - 1.0) < 1e-9
