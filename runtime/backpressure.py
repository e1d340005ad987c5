"""How much a source keeps queued for each worker, in time rather than messages.

A source bounds each worker's unacknowledged messages (in flight or queued in
its outbox) by ``(max_inflight + outbox) x batch`` - the memory bound - and
coalesces a worker's queued sub-batches into calls of up to ``call_messages``.
Counted in messages alone, both are blind to how fast the worker is: at 0.3 of
full speed the 4,000 messages that are 0.8 s of work for a fast worker are
2.7 s for the slow one, and one coalesced call is seconds long. The slow
worker's backlog then holds its source back long after a better routing table
arrived (only outboxes are re-routed, not calls in flight), its acks and load
reports come seconds apart, and at the end of the stream the fast workers idle
while it drains.

``DrainRates`` measures, from the acks alone, how fast each worker drains
*this source's* messages (its share of the worker, so the sources' bounds add
up to the worker's real backlog), and turns the message bounds into time
bounds: at most ``backlog_s`` of work unacknowledged and ``call_s`` of work
per call, never more than the message bounds. A worker not measured yet gets
the message bounds. With no emulated work the measured rates are so high that
nothing changes.

Pure and clock-free: the source passes the times in.
"""

from __future__ import annotations

import math

import numpy as np

#: at most this many seconds of a worker's work unacknowledged per source
BACKLOG_S = 0.5
#: at most this many seconds of work in one call
CALL_S = 0.1
#: time constant of the drain-rate estimates (seconds of acks)
RATE_TAU_S = 1.0
#: a backlog bound never goes below this many messages
MIN_BACKLOG = 64


class DrainRates:
    """Per worker: messages of this source acknowledged per second of service.

    A call's service interval starts when it was sent or when the worker's
    previous call from this source was acknowledged, whichever is later (a
    source's calls to a worker are served in order), and ends at its ack.
    """

    def __init__(self, n_workers: int, backlog_s: float = BACKLOG_S,
                 call_s: float = CALL_S, tau_s: float = RATE_TAU_S) -> None:
        self.backlog_s = float(backlog_s)
        self.call_s = float(call_s)
        self.tau_s = float(tau_s)
        self.rate = np.zeros(int(n_workers), dtype=np.float64)  # 0: not measured
        self._last_ack = np.full(int(n_workers), -math.inf)

    def acked(self, worker: int, n: int, sent_at: float, now: float) -> None:
        """A call of ``n`` messages sent at ``sent_at`` was acknowledged at ``now``."""
        w = int(worker)
        start = max(float(sent_at), self._last_ack[w])
        self._last_ack[w] = max(self._last_ack[w], float(now))
        dt = float(now) - start
        if n <= 0 or dt <= 0:
            return
        sample = n / dt
        if self.rate[w] <= 0:
            self.rate[w] = sample
        else:
            self.rate[w] += (1.0 - math.exp(-dt / self.tau_s)) * (sample - self.rate[w])

    def forget(self, worker: int) -> None:
        """``worker`` left: a worker that joins with its id starts unmeasured."""
        self.rate[int(worker)] = 0.0
        self._last_ack[int(worker)] = -math.inf

    def bounds(self, msg_bound: int) -> np.ndarray:
        """Per worker, the most unacknowledged messages before the source blocks:
        ``backlog_s`` of work, at least ``MIN_BACKLOG``, at most ``msg_bound``."""
        b = np.full(len(self.rate), float(msg_bound))
        known = self.rate > 0
        b[known] = np.clip(self.rate[known] * self.backlog_s, MIN_BACKLOG, msg_bound)
        return b.astype(np.int64)

    def call_cap(self, worker: int, call_messages: int) -> int:
        """Most messages in one call to ``worker``: ``call_s`` of work, at most
        ``call_messages`` (a call always takes at least one queued sub-batch)."""
        r = self.rate[int(worker)]
        if r <= 0:
            return int(call_messages)
        return int(min(call_messages, max(1.0, r * self.call_s)))
