"""What the coordinated schemes' controller, sources and workers share
(``acg`` today): the versioned VW -> worker table that travels on commits and
acks, the meters a worker (``RateMeter``: served messages and busy time) and
a source (``RoutedMeter``: messages routed per VW) report, and when the first
report is due. The dataflow cores (``runtime.dataflow``) use these without
importing any scheme; the scheme's controller (``runtime.grouping.acg``)
consumes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: workers report (and the controller plans) this early for the first time
FIRST_PLAN_S = 0.1


@dataclass(frozen=True)
class VwTable:
    """A versioned VW -> worker table (what travels on commits and acks);
    ``share``: each worker's share of the cluster's measured service rate
    when the table was made (0 for departed workers; None: not measured -
    the sources' admission bound is off)."""

    version: int
    owner: np.ndarray  # int32[B]
    share: np.ndarray | None = None  # float64[n_workers]


@dataclass(frozen=True, slots=True)
class RateReport:
    """A worker's ``RateMeter.take``: messages served and seconds busy since
    its previous report (it travels on the worker's flush); ``recent``: the
    worker saw its rate change (``LoadMeter.change_seen``) - its (messages,
    busy seconds) since, or None."""

    processed: int
    busy_s: float
    recent: tuple[int, float] | None = None


@dataclass(frozen=True, slots=True)
class RoutedReport:
    """A source's ``RoutedMeter.take``: messages routed per VW over ``[since,
    now)`` (the VWs with any, and their counts); ``final``: the source's last
    report (its stream has ended and what it sent is committed);
    ``queued`` (only once the source has routed its whole input, before its
    drain): the messages its outboxes hold per VW, routed and not sent;
    ``spill`` (or None: none): per VW, the messages whose first PoRC choice
    it was minus those routed to it, over the same window - the sources'
    admission (``acg.porc_admit_route``) sent them elsewhere, so ``vw_counts
    + spill`` is what the keys asked for, whatever the table."""

    since: float
    now: float
    vw_ids: np.ndarray  # int32
    vw_counts: np.ndarray  # int64
    final: bool = False
    queued: np.ndarray | None = None  # int64, one per VW
    spill: np.ndarray | None = None  # int64, one per VW


#: a window in which the worker ran less than this share (stopped the rest)
#: counts its busy seconds as they are: too little running time to scale by
MIN_RUNNING_SHARE = 0.02


class RateMeter:
    """What a worker measures for the controller between two reports: messages
    served and the seconds it had work (queued or in service: time stopped
    then counts - that is what a slow machine is; idle time does not). Not
    thread-safe (the worker holds a lock).

    A process slowed by a stop-and-go duty cycle (``actors.throttle``) is
    not slow at every moment: a call that fits in a running part is served
    at full speed, one that meets a stop waits it out. At partial load its
    busy time says 1.4-1.6x its capacity one window and less the next
    (wordcount-hetero at 0.8x on the real engine: 0.3 workers measured at
    1,700-1,970 msgs/s for 1,200). When the worker knows its stopped time
    (``working``'s ``stopped``, ``take``'s ``window_s`` and
    ``window_stopped_s``), its busy seconds are counted as a slow machine's:
    its running seconds with work over the share of the window it ran,
    ``(busy - stopped while busy) / (1 - stopped / window)`` - the window's
    service rate is then the process's running rate times its running
    share, its capacity, at any load. Never stopped: busy seconds as they are."""

    def __init__(self) -> None:
        self.processed = 0
        self.busy_s = 0.0
        self.busy_stopped_s = 0.0  # of ``busy_s``, stopped

    def served(self, n: int) -> None:
        self.processed += int(n)

    def working(self, seconds: float, stopped: float = 0.0) -> None:
        """``seconds`` with work, ``stopped`` of them stopped."""
        self.busy_s += max(0.0, float(seconds))
        self.busy_stopped_s += min(max(0.0, float(stopped)), max(0.0, float(seconds)))

    def take(self, window_s: float = 0.0, window_stopped_s: float = 0.0) -> RateReport:
        """The report since the previous ``take`` (then starts afresh);
        ``window_s``: the seconds since then, ``window_stopped_s`` of them
        stopped (0: not known, or never stopped)."""
        busy = self.busy_s
        running = 1.0 - window_stopped_s / window_s if window_s > 0 else 1.0
        if window_stopped_s > 0 and running >= MIN_RUNNING_SHARE:
            busy = (busy - self.busy_stopped_s) / running
        out = RateReport(self.processed, busy)
        self.processed, self.busy_s, self.busy_stopped_s = 0, 0.0, 0.0
        return out


class RoutedMeter:
    """What a source routed per VW since its last report (its offered load: not
    censored by backpressure, unlike what a worker receives)."""

    def __init__(self, n_virtual: int, since: float) -> None:
        self.counts = np.zeros(n_virtual, dtype=np.int64)
        self.spill = np.zeros(n_virtual, dtype=np.int64)
        self.since = since

    def routed(self, vws: np.ndarray | None, spill: np.ndarray | None = None) -> None:
        """Count ``vws`` (each message's VW) and ``spill`` (per VW, first
        choices minus arrivals: ``RoutedReport``)."""
        if vws is not None:
            self.counts += np.bincount(vws, minlength=len(self.counts))
        if spill is not None:
            self.spill += spill

    def take(self, now: float, final: bool = False,
             queued: np.ndarray | None = None) -> RoutedReport:
        """The report over ``[since, now)``; the next window starts at ``now``.
        ``final``, ``queued``: as ``RoutedReport``'s."""
        ids = np.flatnonzero(self.counts).astype(np.int32)
        spill = self.spill.copy() if self.spill.any() else None
        out = RoutedReport(self.since, now, ids, self.counts[ids], final, queued, spill)
        self.counts = np.zeros_like(self.counts)
        self.spill = np.zeros_like(self.spill)
        self.since = now
        return out
