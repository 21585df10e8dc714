"""Adaptive admission: how many requests run at once, and how many may wait, from measured latency.

Two decisions, both against a latency **budget** (``target_s``): ``budget_s`` when the
operator sets one (``pool.admission_budget_s``), else ``tolerance`` x the unloaded
latency, the median latency of the requests that ran alone (nothing else running from their
start to their end; at a limit of 1 every one does) in the last ``unloaded_horizon_s`` (a
shared host's speed drifts; the probes re-measure it); until one has, the lowest window
median seen stands in, and before any window the lowest latency (never a recent loaded one,
or the budget would rise with the load it admits).

* **The limit** (``value``): requests of average size running at once. The pool leases no
  more slots than this; admission.py weighs requests by size once their plan is known.
* **The waiting room**: a request that cannot run at once is admitted to wait (FIFO) if
  its wait (the work beyond the limit, and its own place, drained at ``rate()``: the
  throughput measured at this limit, else the best measured below it, else one at a time)
  is at most ``wait_rounds`` (1) rounds of the running ones (limit / rate, Little's law), or
  if its predicted latency, that wait plus its service at this limit, is within the budget;
  else it is refused at once, its ``Retry-After`` that predicted wait. The queue keeps the
  running places busy between (Poisson) arrivals: one round of it carries ~95 % of the
  capacity at 1.5x overload where none carries 71 % (``bench/queueing.py``); the budget alone
  held less than one round where two running take nearly twice as long as one. With an
  operator's ``budget_s`` only the budget test admits a wait (it is a promise). Nor
  does a request wait whose predicted wait is past ``max_wait_s`` (the pool's queue timeout:
  with requests of tens of seconds, a real model on a CPU, the budget alone would let it wait
  only to be refused when the timeout ran out).

How the limit moves (the **controller**):

* **Samples.** One per finished request whose latency says something about capacity: its
  engine time without the time the engine sat blocked on a slow client (queue wait is the
  waiting room's business), divided by its weight, so a 4096-character text and "hello"
  both read as "the latency of an average request". Requests admitted before the limit
  last changed are not used to move it again (one change per round trip, as TCP does);
  after a step down, neither are those admitted before the requests running beyond the new
  limit have finished (they ran beside them: their latency is the old level's).
* **Rule** (at most once per ``window_s``, once enough fresh samples are in): with m the
  median fresh sample and g = target / m, the limit becomes ``limit x g``, at most halved
  and at most x1.5 per step, within a dead band of +-10 % (a real number; the gate uses its
  integer part n; a growth step adds at least one). By Little's law one step under
  saturation lands on ``throughput x target``. Growth past the known levels is that fast only
  while the latency is under target / ``fast_ratio``; nearer the budget it probes one more at a
  time, once the current level is known. It only grows when the places were kept busy since
  the last step (the limit reached, and the time-weighted running load at least 90 % of n,
  n - 1/2 from 5 up) and more was offered than they hold: the time-weighted admitted load,
  running and waiting, plus the refused as if they had run a median latency, at least
  n + 1/2 (Little's law). So neither an idle server's limit nor a lightly loaded one's (whose
  bursts touch the limit for an instant) creeps up to the ceiling, and a closed loop of n
  clients does not push it past n.
* **Levels: the knee.** What was measured at each n is remembered for ``probe_after_s`` seconds
  *of load* (windows whose places were kept busy; an idle or lightly loaded server's levels do
  not age, so the next overload starts from the knee the last one found instead of probing its
  neighbours again in its first seconds), the last ``level_windows`` windows of it, and a level
  is judged by them pooled (one window of a dozen requests is too noisy to tell 2 from 3 running
  on a busy CPU): the median of their latency medians and, from windows where the places were
  kept busy (the time-weighted running load L at least 90 % of n, as above), the throughput mean
  L / mean latency (Little's law with the load that was really there: a lightly loaded window
  must not read as capacity; at n - 1/2, 75 % at 2, a light load's bursty second or the window
  that straddled a step from light to heavy load read as level 2's throughput, that of the
  arrivals, and held the limit above the knee until it expired), known once they hold
  ``level_samples`` requests (``clear_samples`` when it is clearly worse than the best level
  fully known). Levels are compared by a **score**, the
  throughput discounted for the latency it costs, X(n) / n ** ``latency_weight`` (1/8: see
  ``_score``), so one more running must buy ~6 % more throughput at 2 and under 1 % at 16.
  Levels are compared **paired** (``_paired``): at n, another level's throughput counts relative
  to n's own measured within ``pair_s`` of it (the windows just before and after its probe),
  scaled to n's latest, since a shared host's speed drifts more within a minute than two
  neighbouring levels differ.
  Within the budget the limit settles on the knee, the fewest running requests that score
  within ``min_gain`` (3 %) of the best score seen: it steps down to n - 1 when that
  level did, grows to a known n + 1 only while n did not and n + 1 scored more, and never
  grows back onto a level that missed the budget. (More requests running that finish no
  faster only add latency; on a GIL-bound CPU model they even slow it down.) Growing onto a
  known level needs it to have scored twice ``min_gain`` more than this one (a hysteresis: a
  level just within ``min_gain`` of the best, stepped down from, is not stepped back onto when
  its estimate wobbles). (With throughput alone and 3 %, on tiny v2, where 2, 3 and 4 running
  finish about as many, a lucky estimate of 3 or 4 held the limit there for minutes at a time,
  at 1.5-2x the latency of 2; a limiter simulation with that curve and this host's drift,
  ``tests/unit/serving/test_limiter.py``, keeps 2 ~89 % of the time with the score against
  ~76 %.) When it cannot grow and n - 1 is unknown or stale it probes n - 1
  (until n - 1 is known), so under sustained load it re-checks its neighbours every
  ``probe_after_s``.
* **Bounds.** Never above ``ceiling``, never below 1.

Pure and synchronous (a clock is injected), so the tests drive it with synthetic latencies.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

log = logging.getLogger("cosyserve.admission")


class Window(NamedTuple):
    """What one window measured at a level."""

    median_s: float  # the median latency of its fresh samples
    at: float  # when it closed (the clock's time)
    samples: int
    mean_s: float  # their mean latency
    running: float | None  # the time-weighted running load, if the places were kept busy (else None)
    loaded_s: float  # seconds of load seen by then: what ages it (``_trusted``)


@dataclass(frozen=True)
class LimiterConfig:
    ceiling: int  # hard: the limit never goes above (pool.workers + pool.max_queue)
    initial: float  # where the limit starts (the lifespan picks it from the machine)
    budget_s: float | None = None  # target latency of an average request; None: tolerance x unloaded latency
    tolerance: float = 2.5  # the automatic target, in unloaded latencies
    max_wait_s: float | None = None  # no request waits to run if its predicted wait is longer (pool.queue_timeout_s)
    wait_rounds: float = 1.0  # a request may always wait this many rounds of the running ones (within max_wait_s)
    window_s: float = 1.0  # at most one step per window
    min_samples: int = 3  # fresh samples a step needs (fewer when the limit itself is lower)
    deadband: float = 0.1  # no step while the median is within +-10 % of the target
    max_down: float = 0.5  # a step at most halves the limit ...
    max_up: float = 1.5  # ... and at most multiplies it by 1.5
    unloaded_samples: int = 32  # latencies of lone requests kept for the unloaded latency ...
    unloaded_horizon_s: float = 240.0  # ... for this long (a machine's speed drifts: shared hosts)
    probe_after_s: float = 300.0  # what a level gave is trusted for this many seconds of load (then probed again)
    min_gain: float = 0.03  # one more request in flight must add this share of score (below)
    latency_weight: float = 0.125  # levels are scored by throughput / n ** latency_weight (the latency they add)
    level_windows: int = 8  # a level is judged by its last this many windows, pooled
    pair_s: float = 3.0  # another level is compared with this one's windows measured within this of its own
    history_windows: int = 600  # windows kept per level (within probe_after_s) for those comparisons
    level_samples: int = 24  # requests a level's throughput needs before the knee search trusts it
    clear_samples: int = 8  # ... or this many when it finished under clear_share of the best known level
    clear_share: float = 0.8
    fast_ratio: float = 2.0  # latency under target / fast_ratio: grow by the headroom, else probe one more
    ema_alpha: float = 0.2  # average latency (for the predicted wait)

    def __post_init__(self) -> None:
        if self.ceiling < 1:
            raise ValueError("ceiling must be at least 1")
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError("budget_s must be positive (or None: automatic)")
        if self.max_wait_s is not None and self.max_wait_s <= 0:
            raise ValueError("max_wait_s must be positive (or None: no bound beyond the budget)")
        if self.tolerance <= 1:
            raise ValueError("tolerance must be above 1")
        if self.window_s <= 0 or self.min_samples < 1 or self.probe_after_s < 0:
            raise ValueError("window_s must be positive, min_samples at least 1, probe_after_s 0 or more")
        if not (0 < self.max_down < 1 < self.max_up) or not (0 <= self.deadband < 1):
            raise ValueError("need 0 < max_down < 1 < max_up and 0 <= deadband < 1")


class LatencyLimit:
    """The controller. ``value`` is the limit in average-size requests (an int, 1..ceiling)."""

    def __init__(self, config: LimiterConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self.limit = float(min(config.ceiling, max(1.0, config.initial)))
        self._fresh: list[float] = []  # samples of requests admitted since the last change
        self._alone: deque[tuple[float, float]] = deque(maxlen=config.unloaded_samples)  # (latency, when)
        self._lowest_s = math.inf  # stand-ins for the unloaded latency: the lowest sample ...
        self._lowest_window_s = math.inf  # ... and the lowest window median (since the start)
        self._avg_s: float | None = None
        self._changed_at = -math.inf  # requests admitted before this saw another limit
        self._draining = False  # stepped down: requests beyond the new limit are still running
        self._hears_running = False  # note_load is given the running count (else no drain is awaited)
        self._stepped_at = clock()
        self._levels: dict[int, deque[Window]] = {}  # value -> its last windows
        self._loaded_s = 0.0  # seconds of windows whose places were kept busy: the clock levels age by
        self._peak_load = 0.0  # since the last step
        self._load, self._load_at, self._area = 0.0, self._stepped_at, 0.0  # running load x seconds, this window
        self._demand_area = 0.0  # admitted load (running and waiting) x seconds, this window
        self._refused = 0  # since the last step
        self.steps = 0  # changes made (observable)

    # -- what it says ----------------------------------------------------------------------------
    @property
    def value(self) -> int:
        return max(1, min(self.config.ceiling, int(self.limit + 1e-9)))

    @property
    def unloaded_s(self) -> float | None:
        """Median latency of recent lone requests, else the lowest window median seen, else the lowest
        latency seen (None before any)."""
        horizon = self._clock() - self.config.unloaded_horizon_s
        lone = [x for x, when in self._alone if when >= horizon]
        if lone:
            return statistics.median(lone)
        for stand_in in (self._lowest_window_s, self._lowest_s):
            if stand_in < math.inf:
                return stand_in
        return None

    @property
    def target_s(self) -> float | None:
        if self.config.budget_s is not None:
            return self.config.budget_s
        unloaded = self.unloaded_s
        return None if unloaded is None else self.config.tolerance * unloaded

    @property
    def average_s(self) -> float | None:
        """Moving average of the samples (the latency of an average request now)."""
        return self._avg_s

    def allows(self, load: float, weight: float = 1.0) -> bool:
        """Admit a request of ``weight`` on top of ``load`` (all admitted, in average requests)?

        It runs at once (an idle server always has room), or it may wait: its predicted latency,
        the wait plus its service at the current limit, is within the budget, and the wait within
        ``max_wait_s`` (the pool's queue timeout, which would refuse it after the wait anyway).
        """
        if load <= 0 or load + weight <= self.value + 1e-9:
            return True
        target, rate = self.target_s, self.rate()
        if target is None or rate is None:
            return False  # nothing measured yet: no waiting room
        wait = self._wait_s(load, weight, rate)
        if self.config.max_wait_s is not None and wait > self.config.max_wait_s:
            return False
        round_s = self.value / rate  # one round: the running ones all finish once (Little's law)
        if self.config.budget_s is None and wait <= self.config.wait_rounds * round_s * (1.0 + 1e-9):
            return True  # automatic budget: a queue as deep as the running set keeps the places busy
        service = weight * round_s
        return wait + service <= target * (1.0 + self.config.deadband)

    def predicted_wait_s(self, load: float, weight: float = 1.0) -> float:
        """Seconds a request of ``weight`` arriving now would wait to run (0: it runs at once):
        the work beyond the limit, and its own place, drained at ``rate()``."""
        if load <= 0 or load + weight <= self.value + 1e-9:
            return 0.0
        rate = self.rate()
        if rate is None:
            target = self.target_s or 1.0
            rate = self.value / target
        return self._wait_s(load, weight, rate)

    def _wait_s(self, load: float, weight: float, rate: float) -> float:
        """The work beyond the limit, and the request's own place, drained at ``rate``."""
        return (max(0.0, load - self.value) + weight) / rate

    def rate(self) -> float | None:
        """Average requests finished per second at the current limit, as well as it is known: measured
        there (n / its median latency), else the best measured at a lower limit (or a higher one
        scaled by n / k), else one at a time at the average latency (no overlap assumed: errs
        towards a shorter waiting room)."""
        n = self.value
        here = self._throughput(n)
        if here is not None:
            return here
        # a level k above n: n finish at least k's rate x n / k (each runs no slower with fewer running)
        measured = [x * min(1.0, n / k) for k in self._levels if (x := self._throughput(k)) is not None]
        if measured:
            return max(measured)
        return 1.0 / self._avg_s if self._avg_s else None

    def _trusted(self, w: Window) -> bool:
        """``w`` was measured within the last ``probe_after_s`` seconds of load (older ones are forgotten:
        probed again)."""
        return self._loaded_s - w.loaded_s <= self.config.probe_after_s

    def _history(self, level: int) -> list[Window]:
        """``level``'s trusted windows, oldest first."""
        return [w for w in self._levels.get(level, ()) if self._trusted(w)]

    def _windows(self, level: int) -> list[Window]:
        """The last ``level_windows`` of ``level``'s windows, if trusted: what it is judged by (read from the
        end: the admission test asks for the rate at every request)."""
        last = list(itertools.islice(reversed(self._levels.get(level, ())), self.config.level_windows))
        return [w for w in reversed(last) if self._trusted(w)]

    def _missed(self, level: int, target: float) -> bool:
        """``level`` has trusted windows (within ``probe_after_s`` of load) and their latency missed the target."""
        windows = self._windows(level)
        return bool(windows) and statistics.median(w.median_s for w in windows) > target * (1.0 + self.config.deadband)

    def _throughput(self, level: int, strict: bool = False) -> float | None:
        """Requests per second at ``level``, if known lately: its busy windows pooled (Little's law, the mean
        running load over the mean latency), once they hold ``level_samples`` requests, or already
        ``clear_samples`` when it is clearly worse (under ``clear_share`` of the best level fully known):
        a probe of a level far off the knee need not dwell there."""
        busy = [w for w in self._windows(level) if w.running is not None]
        if not busy:
            return None
        count, rate = self._pooled(busy)
        if count >= self.config.level_samples:
            return rate
        if strict or count < self.config.clear_samples:
            return None
        others = [x for k in self._levels if k != level and (x := self._throughput(k, strict=True)) is not None]
        return rate if others and rate < self.config.clear_share * max(others) else None

    @staticmethod
    def _pooled(busy: list[Window]) -> tuple[int, float]:
        """Requests in busy windows and their throughput pooled: mean running load over mean latency."""
        count = sum(w.samples for w in busy)
        running = sum(w.running * w.samples for w in busy) / count  # type: ignore[operator]
        return count, running / (sum(w.mean_s * w.samples for w in busy) / count)

    def _near(self, n: int, level: int) -> float | None:
        """``n``'s throughput from its busy windows measured within ``pair_s`` of ``level``'s (the windows
        next to a probe, before and after it), once they hold ``level_samples`` requests; else None."""
        times = [w.at for w in self._windows(level) if w.running is not None]
        reach = self.config.pair_s
        near = [w for w in self._history(n) if w.running is not None and any(abs(w.at - t) <= reach for t in times)]
        if not near:
            return None
        count, rate = self._pooled(near)
        return rate if count >= self.config.level_samples else None

    def _paired(self, n: int) -> dict[int, float | None]:
        """Every level's throughput as seen from ``n`` now: another level's relative to ``n``'s measured
        within ``pair_s`` of it (a paired comparison), times ``n``'s latest; unpaired when ``n`` has no
        windows next to it. A shared host's speed drifts by a tenth and more within a minute, so levels
        measured minutes apart compare the host's minutes as much as the levels: in the limiter's
        simulation of tiny v2's flat curve the knee is held 99 % of the time on a steady host and, on a
        drifting one, 86 % compared unpaired, 95 % paired (``tests/unit/serving/test_limiter.py``)."""
        xs = {k: self._throughput(k) for k in self._levels}
        here = xs.get(n)
        for k, x in xs.items():
            if x is not None and here is not None and k != n and (then := self._near(n, k)) is not None:
                xs[k] = x * here / then
        return xs

    def _score(self, level: int, x: float) -> float:
        """``level``'s throughput ``x`` discounted for the latency it adds: X(n) / n ** latency_weight.

        By Little's law the latency at n is n / X(n), so this is X ** (1 - w) x (X / L) ** w: a blend of
        throughput and Kleinrock's power (throughput over delay, whose maximum is the knee). One more request
        running must add about ``latency_weight`` / n of throughput to score higher: 6 % at 2 (where it adds
        half the latency), 0.8 % at 16 (a GPU batch, where it adds little).
        """
        return x / level ** self.config.latency_weight

    def _decide(self, n: int, ratio: float, crowded: bool, target: float) -> float:
        """The next limit, at value ``n`` whose fresh median latency is ``target / ratio``."""
        cfg, old = self.config, self.limit
        # a level never measured has no score; the others' throughputs as seen from n (paired)
        scores = {k: None if x is None else self._score(k, x) for k, x in self._paired(n).items()}
        here, below, above = (scores.get(k) for k in (n, n - 1, n + 1))
        known = [x for x in scores.values() if x is not None]
        enough = (1.0 - cfg.min_gain) * max(known) if known else None  # within min_gain of the best seen
        if ratio < 1.0 - cfg.deadband:
            return old * max(ratio, cfg.max_down)  # over budget: Little's law says how far down
        if here is not None and below is not None and enough is not None and below >= enough:
            return n - 0.5  # one fewer in flight finishes about as many as the best: the knee is below
        if ratio > 1.0 + cfg.deadband and crowded:
            if above is not None:  # known: one more, if n is short of the knee and n + 1 finished more
                short = here is not None and enough is not None and here < enough
                gains = here is not None and above > here * (1.0 + 2 * cfg.min_gain)  # hysteresis: see the knee
                if short and gains and not self._missed(n + 1, target):
                    return n + 1.0
            elif ratio >= cfg.fast_ratio or here is not None:  # unknown: far below the budget, grow by the
                # headroom (up to max_up); else one more, once n is known (a probe)
                new = max(old * min(ratio, cfg.max_up), n + 1.0) if ratio >= cfg.fast_ratio else n + 1.0
                missed = [k for k in self._levels if k > n and self._missed(k, target)]
                if missed:
                    new = min(new, min(missed) - 1e-6)
                if new >= n + 1.0:
                    return new
        if here is not None and below is None and n > 1:
            return n - 0.5  # at the budget or the knee with the level below unknown (or stale): probe it
        return old

    # -- what it hears ---------------------------------------------------------------------------
    def note_load(self, load: float, running: int | None = None) -> None:
        """The admitted load after every change (admission, sizing, start, release): the peak tells whether
        the limit was reached, the time-weighted running part whether the places were kept busy.
        ``running``: requests holding a place now; after a step down, once they fit the new limit,
        requests admitted from then on are the new level's samples."""
        now = self._clock()
        self._integrate(now)
        self._load = load
        self._peak_load = max(self._peak_load, load)
        self._hears_running = self._hears_running or running is not None
        if self._draining and running is not None and running <= self.value:
            self._draining = False
            self._changed_at = now
            self._fresh.clear()

    def _integrate(self, now: float) -> None:
        span = max(0.0, now - self._load_at)
        self._area += min(self._load, float(self.value)) * span
        self._demand_area += self._load * span
        self._load_at = now

    def note_refused(self) -> None:
        self._refused += 1

    def observe(self, latency_s: float, *, admitted_at: float, alone: bool = False) -> None:
        """One finished request's latency (already divided by its weight); may step the limit."""
        latency_s = max(1e-6, float(latency_s))
        self._lowest_s = min(self._lowest_s, latency_s)
        if alone:
            self._alone.append((latency_s, self._clock()))
        a = self.config.ema_alpha
        self._avg_s = latency_s if self._avg_s is None else self._avg_s + a * (latency_s - self._avg_s)
        if admitted_at >= self._changed_at and not self._draining:
            self._fresh.append(latency_s)
        self._maybe_step()

    def _maybe_step(self) -> None:
        now = self._clock()
        need = min(self.config.min_samples, self.value)
        target = self.target_s
        if target is None or len(self._fresh) < need or now - self._stepped_at < self.config.window_s:
            return
        median = statistics.median(self._fresh)
        ratio = target / median
        self._lowest_window_s = min(self._lowest_window_s, median)
        n = self.value
        pressed = self._refused > 0 or self._peak_load + 1.0 > n + 1e-9
        self._integrate(now)
        span = max(1e-9, now - self._stepped_at)
        running = self._area / span  # time-weighted, this window
        busy = pressed and running >= n - min(0.5, 0.1 * n)
        if busy:
            self._loaded_s += span
        # the load offered (Little's law): admitted, running or waiting, and the refused as if they had run
        offered = (self._demand_area + self._refused * median) / span
        windows = self._levels.setdefault(n, deque(maxlen=self.config.history_windows))
        windows.append(Window(median, now, len(self._fresh), statistics.fmean(self._fresh),
                              running if busy else None, self._loaded_s))
        old = self.limit
        new = self._decide(n, ratio, busy and offered >= n + 0.5, target)
        new = min(float(self.config.ceiling), max(1.0, new))
        self._stepped_at = now
        self._area = self._demand_area = 0.0
        self._fresh.clear()
        self._refused = 0
        self._peak_load = 0.0
        if int(new + 1e-9) != n and log.isEnabledFor(logging.DEBUG):  # the levels' throughputs cost a scan
            log.debug("admission limit %d -> %d: median %.3f s, target %.3f s%s; throughput known %s", n,
                      int(new + 1e-9), median, target, ", places kept busy" if busy else "",
                      {k: round(x, 2) for k, x in sorted(self._paired(n).items()) if x is not None})
        if new != old:
            self._draining = self._hears_running and int(new + 1e-9) < n
            self.limit = new
            self._changed_at = now
            self.steps += 1
