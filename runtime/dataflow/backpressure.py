"""How much work a source puts in one call, in time rather than messages.

A source coalesces a worker's queued sub-batches into one call of up to
``run.call_messages`` messages. Counted in messages alone, that is blind to
how fast the worker is: at 0.3 of full speed a call of 4,000 messages is
2.7 s of work (0.8 s for a fast worker), and the worker acknowledges it,
flushes and reports its load only when the call is done. A slow worker's
feedback then comes seconds apart - the adaptive scheme waits that long for
its first plan - and when a better routing table arrives, the work in
flight (which is not re-routed) still holds the source back.

``DrainRates`` measures, from the acks alone, how fast each worker drains
*this source's* messages, and caps a call at ``call_s`` of that work (never
above ``call_messages``): a slow worker's calls are as short in time as a fast
one's. A worker with no call acknowledged yet gets one sub-batch per call,
sent at once (its first call must not carry seconds of its work); one whose
calls were acknowledged in no measurable time gets ``call_messages``. With no
emulated work ``call_s`` of measured work exceeds ``call_messages``, so the cap
is ``call_messages``, as without this class.

The cap's effect on the real engine, and a *backlog* bound in seconds that was
tried and dropped (it blocks every worker's messages behind one worker's
transient overload), are measured in docs/benchmarks.md, "Heterogeneity
(real engine)".

Pure and clock-free: the source passes the times in.
"""

from __future__ import annotations

import math

import numpy as np

#: at most this many seconds of a worker's work in one call
CALL_S = 0.1
#: time constant of the drain-rate estimates (seconds of acks)
RATE_TAU_S = 1.0


class DrainRates:
    """Per worker: messages of this source acknowledged per second of service.

    A call's service interval starts when it was sent or when the worker's
    previous call from this source was acknowledged, whichever is later (a
    source's calls to a worker are served in order), and ends at its ack.
    """

    def __init__(self, n_workers: int, call_s: float = CALL_S,
                 tau_s: float = RATE_TAU_S) -> None:
        self.call_s = float(call_s)
        self.tau_s = float(tau_s)
        self.rate = np.zeros(int(n_workers), dtype=np.float64)  # 0: not measured
        #: whether any call to the worker was acknowledged yet
        self.measured = np.zeros(int(n_workers), dtype=bool)
        self._last_ack = np.full(int(n_workers), -math.inf)
        #: changes whenever a rate or ``measured`` may have (``call_caps`` is cached)
        self.version = 0
        self._caps: tuple[int, int, np.ndarray] | None = None  # (version, call_messages, caps)

    def acked(self, worker: int, n: int, sent_at: float, now: float) -> None:
        """A call of ``n`` messages sent at ``sent_at`` was acknowledged at ``now``."""
        w = int(worker)
        self.version += 1
        start = max(float(sent_at), self._last_ack[w])
        self._last_ack[w] = max(self._last_ack[w], float(now))
        dt = float(now) - start
        if n > 0:
            self.measured[w] = True
        if n <= 0 or dt <= 0:
            return
        sample = n / dt
        if self.rate[w] <= 0:
            self.rate[w] = sample
        else:
            self.rate[w] += (1.0 - math.exp(-dt / self.tau_s)) * (sample - self.rate[w])

    def last_ack(self, worker: int) -> float:
        """When the worker's latest call from this source was acknowledged."""
        return float(self._last_ack[int(worker)])

    def forget(self, worker: int) -> None:
        """``worker`` left: a worker that joins with its id starts unmeasured."""
        self.version += 1
        self.rate[int(worker)] = 0.0
        self.measured[int(worker)] = False
        self._last_ack[int(worker)] = -math.inf

    def call_cap(self, worker: int, call_messages: int) -> int:
        """Most messages in one call to ``worker``: ``call_s`` of work, at most
        ``call_messages`` (a call always takes at least one queued sub-batch).
        Until a call to the worker was acknowledged, 1: one sub-batch per
        call, sent at once - a slow worker's first call must not carry seconds
        of its work (at startup it would hold the sources behind it)."""
        return int(self.call_caps(call_messages)[int(worker)])

    def call_caps(self, call_messages: int) -> np.ndarray:
        """``call_cap`` of every worker (int64, read-only: computed again only
        after an ack or a departure)."""
        cached = self._caps
        if cached is not None and cached[0] == self.version and cached[1] == call_messages:
            return cached[2]
        caps = self._call_caps(call_messages)
        caps.flags.writeable = False
        self._caps = (self.version, call_messages, caps)
        return caps

    def _call_caps(self, call_messages: int) -> np.ndarray:
        caps = np.minimum(float(call_messages),
                          np.maximum(1.0, self.rate * self.call_s)).astype(np.int64)
        caps[self.rate <= 0] = int(call_messages)  # acknowledged in no measurable time
        caps[~self.measured] = 1
        return caps
