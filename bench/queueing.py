"""How deep the waiting room must be: a queueing model of admission under open-loop overload.

    python -m bench queueing [--places 2] [--cv 0.03,0.26] [--loads 1.5,3] [--rooms 0,1,2,3,4]

``places`` requests run at once (the admission limit), each taking a service time of mean 1
(spread by ``cv``, a normal truncated at 5 %); Poisson arrivals at ``load`` x the capacity;
a request finding ``places + room`` admitted is refused (a 503), else it waits FIFO for a
place. Printed per load and room: goodput (share of the capacity used), and the admitted
requests' latency p50 / p99 in service times, and that p99 over the p99 of one service time
(what a closed loop at the knee measures: the ratio issue 20's goal bounds by 2).

With no room this is Erlang's loss system (its blocking does not depend on the service time's
distribution: at 2 places and 1.5x, 53 % of the arrivals are refused and 71 % of the capacity
used); the waiting room trades latency for goodput. ``app/serving/limit/waiting.py`` lets a request wait at least one round of the running ones
(a room as deep as the places): docs/concurrency.md shows what this model and the benchmarks say.
"""

from __future__ import annotations

import argparse
import heapq
import random


def simulate(places: int, room: int, load: float, cv: float, arrivals: int = 200_000,
             seed: int = 1) -> dict[str, float]:
    """One run of ``arrivals`` Poisson arrivals; service times of mean 1."""
    rng = random.Random(seed)
    rate = load * places
    ends: list[float] = []  # heap: end times of the admitted requests still in the system
    free_at = [0.0] * places  # heap: when each place is next free (FIFO: a waiting request takes the first)
    t, latencies, refused = 0.0, [], 0
    for _ in range(arrivals):
        t += rng.expovariate(rate)
        while ends and ends[0] <= t:
            heapq.heappop(ends)
        if len(ends) >= places + room:
            refused += 1
            continue
        service = max(0.05, rng.gauss(1.0, cv))
        start = max(t, heapq.heappop(free_at))
        heapq.heappush(free_at, start + service)
        heapq.heappush(ends, start + service)
        latencies.append(start + service - t)
    latencies.sort()
    single = sorted(max(0.05, rng.gauss(1.0, cv)) for _ in range(20_000))
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    return {"goodput": len(latencies) / t / places, "refused": refused / arrivals,
            "p50": latencies[len(latencies) // 2], "p99": p99,
            "p99_vs_one": p99 / single[int(0.99 * (len(single) - 1))]}


def run_all(places: int, cvs: list[float], loads: list[float], rooms: list[int],
            arrivals: int = 200_000) -> list[str]:
    lines = ["| cv | load | room | goodput | p50 | p99 | p99 / one service's p99 |", "|---|---|---|---|---|---|---|"]
    for cv in cvs:
        for load in loads:
            for room in rooms:
                r = simulate(places, room, load, cv, arrivals)
                lines.append(f"| {cv:g} | {load:g}x | {room} | {r['goodput']:.3f} | {r['p50']:.2f} | {r['p99']:.2f} "
                             f"| {r['p99_vs_one']:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--places", type=int, default=2)
    ap.add_argument("--cv", type=floats, default=[0.03, 0.26], help="service time spread (full-size, tiny v2 here)")
    ap.add_argument("--loads", type=floats, default=[1.5, 3.0])
    ap.add_argument("--rooms", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2, 3, 4])
    ap.add_argument("--arrivals", type=int, default=200_000)
    args = ap.parse_args(argv)
    print(f"{args.places} places, Poisson arrivals, {args.arrivals} per row; latencies in mean service times")
    print("\n".join(run_all(args.places, args.cv, args.loads, args.rooms, args.arrivals)))
