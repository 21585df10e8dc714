"""The soak's rests (no request in flight when RSS is read at rest) and its growth per hour."""

from __future__ import annotations

import math
import threading
import time

from bench.soak import Pause, growth


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
