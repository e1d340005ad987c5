"""Emulated per-message service time on a virtual clock (pure, no Ray).

A worker "serves" a batch of ``n`` messages by sleeping until its virtual
clock ``vc = max(vc, now - burst_s) + n * cost_s``. Sleeping until the
virtual clock (instead of ``sleep(n * cost)``) pays back ``time.sleep``'s
overshoot on later calls, so the achieved rate matches ``1 / cost_s`` within
1-2% at >= 100 messages per call (DESIGN.md, "Facts about the platform").

Composition with a SIGSTOP/SIGCONT duty cycle: a stopped process's sleep keeps
running in wall time, so sleep alone would barely be slowed by the throttler.
We sleep in slices of ~1 ms and, after each slice, add any time beyond what
was requested to the virtual clock when it exceeds the normal sleep overshoot
(``tolerance_s``): that time the process was stopped, and it was not service.
(The part of a stop that falls inside the requested slice still counts as
service: on average half a slice per stop, +0.005 of full rate at a 100 ms
period - measured 0.111 for a 0.1 duty cycle.)
Time stopped *outside* the sleeps (while the app computes) is lost too,
because ``max(vc, now - burst_s)`` never credits idle time beyond ``burst_s``.

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
    ) -> None:
        if service_us < 0:
            raise ValueError(f"service_us must be >= 0 (got {service_us})")
        self.service_us = float(service_us)
        self.clock = clock
        self.sleep = sleep
        self.burst_s = float(burst_s)
        self.slice_s = float(slice_s)
        self.tolerance_s = float(tolerance_s)
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
        start = max(self.vc, now - self.burst_s)
        self.vc = start + n * self.cost_s
        stalled = 0.0
        while True:
            now = self.clock()
            remaining = self.vc - now
            if remaining <= 0:
                break
            want = min(self.slice_s, remaining)
            self.sleep(want)
            extra = self.clock() - now - want
            if extra > self.tolerance_s:  # stopped while sleeping: that was not service
                self.vc += extra
                stalled += extra
        self.stopped_s += stalled
        span = self.vc - start
        return start + np.arange(1, n + 1, dtype=np.float64) * (span / n)
