"""The queueing model behind the waiting room's depth (bench/queueing.py)."""

from __future__ import annotations

import pytest

from bench.queueing import run_all, simulate


def erlang_b(places: int, offered: float) -> float:
    b = 1.0
    for k in range(1, places + 1):
        b = offered * b / (k + offered * b)
    return b


@pytest.mark.parametrize("cv", [0.03, 0.3])
def test_with_no_room_it_is_erlangs_loss_system_whatever_the_service_spread(cv):
    r = simulate(places=2, room=0, load=1.5, cv=cv, arrivals=40_000)
    assert r["refused"] == pytest.approx(erlang_b(2, 3.0), abs=0.015)  # 0.529 of the arrivals
    assert r["p50"] == pytest.approx(1.0, abs=0.05)  # nobody waits


def test_a_deeper_room_buys_goodput_with_latency():
    rows = [simulate(places=2, room=room, load=1.5, cv=0.26, arrivals=40_000) for room in (0, 1, 2)]
    goodputs, p99s = [r["goodput"] for r in rows], [r["p99"] for r in rows]
    assert goodputs == sorted(goodputs) and goodputs[2] - goodputs[0] > 0.2
    assert p99s == sorted(p99s) and p99s[2] > 1.5 * p99s[0]


def test_the_table_has_a_row_per_spread_load_and_room():
    assert len(run_all(2, [0.1], [1.5, 3.0], [0, 1], arrivals=2_000)) == 2 + 4
