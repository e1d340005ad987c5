"""Emulated per-message service time on a virtual clock (pure, no Ray).

A worker "serves" a batch of ``n`` messages by sleeping until its virtual
clock ``vc = start + n * cost_s``, where ``start = vc`` if the previous batch
ended at most ``burst_s`` ago (consecutive work: the last sleep's overshoot
and the app's compute in between are paid back) and ``start = now`` otherwise
(the worker was idle: idle time is not service, and no credit is given for
it, so a batch never takes less wall time than its service). Sleeping until
the virtual clock (instead of ``sleep(n * cost)``) keeps the achieved rate at
``1 / cost_s`` within 1-2% at >= 100 messages per call (docs/design.md, "Facts
about the platform").

Composition with a SIGSTOP/SIGCONT duty cycle: a stopped process's sleep keeps
running in wall time, so sleep alone would barely be slowed by the throttler.
We sleep in slices of ~1 ms and, after each slice, add the time the process
was stopped during it to the virtual clock: that time was not service.
How long it was stopped comes from ``stopped_clock`` when the throttler tells
(``actors.throttle.StoppedClock``: the duty-cycle throttler publishes every
process's stopped seconds), exactly; otherwise it is guessed as any time
beyond what was requested that exceeds the normal sleep overshoot
(``tolerance_s``) - which also takes a late wake-up (another thread holding
the GIL, a busy CPU) for a stop: measured here, up to 9% of an unthrottled
worker's time in a busy actor, hence the published clock. A ``service``
throttle stops nothing, so its workers pass a clock that never moves: a
late wake-up is paid back like any overshoot (``WorkerCore``).
(The part of a stop that falls inside the requested slice still counts as
service: on average half a slice per stop, +0.005 of full rate at a 100 ms
period - measured 0.111 for a 0.1 duty cycle.)
Time stopped *outside* the sleeps (while the app computes) is lost too: the
next batch starts ``now``, not at the virtual clock.

Capacity is applied exactly once:
- ``duty-cycle`` / ``cpulimit``: ``capacity_scale = 1`` (the throttler slows
  the process), ``cost_s = service_us``;
- ``service``: ``capacity_scale = capacity``, ``cost_s = service_us / capacity``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class ServiceEmulator:
    """Sleep-based service time with a virtual clock; see the module docstring.

    ``serve(n)`` blocks until the batch is done and returns the ``n`` finish
    times (on ``clock``): message ``j`` finishes at ``start + (j + 1) * cost``,
    stretched by any stopped time detected during the batch, so latencies are
    per message and the last finish time is the batch's completion.
    """

    def __init__(
        self,
        service_us: float,
        capacity_scale: float = 1.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
        *,
        burst_s: float = 0.005,
        slice_s: float = 0.001,
        tolerance_s: float = 0.0005,
        stopped_clock: Clock | None = None,
    ) -> None:
        if service_us < 0:
            raise ValueError(f"service_us must be >= 0 (got {service_us})")
        self.service_us = float(service_us)
        self.clock = clock
        self.sleep = sleep
        self.burst_s = float(burst_s)
        self.slice_s = float(slice_s)
        self.tolerance_s = float(tolerance_s)
        #: seconds this process has been stopped so far (None: guess from overshoot)
        self.stopped_clock = stopped_clock
        self.vc = -np.inf
        self.stopped_s = 0.0  # total time detected as "process was stopped"
        self.served = 0

        self.set_capacity_scale(capacity_scale)

    def set_capacity_scale(self, capacity_scale: float) -> None:
        if not capacity_scale > 0:
            raise ValueError(f"capacity_scale must be > 0 (got {capacity_scale})")
        self.capacity_scale = float(capacity_scale)
        self.cost_s = self.service_us * 1e-6 / self.capacity_scale

    def serve(self, n: int) -> np.ndarray:
        """Serve ``n`` messages; returns their finish times (float64[n])."""
        now = self.clock()
        if n <= 0:
            return np.zeros(0)
        self.served += n
        if self.cost_s <= 0:
            return np.full(n, now)
        start = self.vc if now - self.vc <= self.burst_s else now
        self.vc = start + n * self.cost_s
        stalled = 0.0
        while True:
            now = self.clock()
            remaining = self.vc - now
            if remaining <= 0:
                break
            want = min(self.slice_s, remaining)
            if self.stopped_clock is not None:
                before = self.stopped_clock()
                self.sleep(want)
                extra = self.stopped_clock() - before
            else:
                self.sleep(want)
                extra = self.clock() - now - want
                if extra <= self.tolerance_s:  # the normal overshoot
                    extra = 0.0
            if extra > 0:  # stopped while sleeping: that was not service
                self.vc += extra
                stalled += extra
        self.stopped_s += stalled
        span = self.vc - start
        return start + np.arange(1, n + 1, dtype=np.float64) * (span / n)
