"""A worker: bounded input queue, emulated service time, own load measurement.

``WorkerCore`` is the plain class (no Ray; tests drive it with a fake clock):

- ``submit(source, parts)`` enqueues one call's sub-batches into a bounded
  FIFO (``workers.queue_batches``; blocks when full: backpressure) and blocks
  until they have been processed, then returns the call's *ack*
  (``runtime.dataflow.messages.Ack``).
  The caller is one of many threads of a threaded actor; a single processing
  thread (``run_forever`` / ``step``) drains the queue in FIFO order.
- Processing = ``ServiceEmulator.serve(n)`` (per-message finish times, so
  latencies are per message: finish - the source's emit time) + the app's
  ``add(records, key_hashes)``.
- Every ``app.aggregate_every_s`` the app's partial (a delta) goes to ``sink``
  as a ``runtime.dataflow.reliability.Flush``: sequence number, the claims
  ``(source, batch, idx)`` it covers and the sources' watermarks. A sub-batch's
  ack names the flush that holds it (``flush_seq``) and the latest flush the
  aggregator committed (``committed_seq``): sources keep what they sent until
  it is committed and replay it if this worker dies (docs/reliability.md).
  ``fence_source(source, epoch)`` (a source restarted) rejects the dead
  incarnation's queued sub-batches and returns what was processed of it.

It composes one small class per other job:

- ``LoadMeter``: utilization ``U = queue length / queue capacity``, counted
  in calls (one call may carry several of a source's sub-batches), where the
  queue length counts the call in service and the capacity is
  ``min(queue_batches, sources * max_inflight)`` (the most calls that can ever
  be queued: one per in-flight slot of every source; with 2 sources x 2 in
  flight - the default is 1 source - a worker whose windows are all full is at
  U = 1). Same definition as the simulator's, which sends one sub-batch per call
  (docs/algorithms.md, "Metrics"). It is sampled on every enqueue/dequeue and
  integrated over time, per slot (``run.slot_s``): processed, mean queue length
  (msgs and batches), busy fraction, latency histogram.
- ``SourceSignals`` (CG): one ``LoadSignaler`` per source, all fed the same
  utilization, so each source gets at most one signal per slot, on its next ack.
- ``FlushCadence``: when the next flush is due.
- ``TableRelay`` (ACG): the controller's newest table, to each source once.

The Ray edge is ``actors.worker.WorkerActor`` (``worker-<i>``); the
fault explorer (``runtime.sim.explore``) drives it in-process on a virtual clock.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.dataflow.latency import Binned, LatencyHistogram, binned
from runtime.dataflow.messages import (
    Ack,
    WorkerFence,
    WorkerProgress,
    WorkerSeries,
    WorkerSnapshot,
    WorkerStats,
)
from runtime.dataflow.reliability import ClaimLog, Flush, Part, Tag
from runtime.dataflow.service import ServiceEmulator
from runtime.dataflow.settings import WorkerSettings
from runtime.grouping.coordination import FIRST_PLAN_S, RateMeter, RateReport
from runtime.grouping.signals import LoadSignaler, WorkerSignals
from runtime.reporting.metrics import DistinctKeys

Clock = Callable[[], float]

#: how early a throttle's period start may be seen on the run's timeline (its
#: throttler starts with the run) and still be this run's; and the shortest
#: span of periods that gives a running share
PERIOD_SLACK_S = 1e-3

#: a worker that reports its rate checks it for a change over windows of this
#: long (whole throttle periods under a duty cycle; ``LoadMeter.change_seen``)
PROBE_S = 0.1
#: ... each with at least this much time with work (less: too idle to tell)
PROBE_BUSY_S = 0.05
#: a worker whose last ``STEADY_PROBES`` probe windows (with at least
#: ``STEADY_BUSY_S`` of work each) all stayed within ``STEADY_DEV`` of its
#: latest report's rate is steady: its windows then count with
#: ``STEADY_BUSY_S`` of work when beyond ``STEADY_JUMP`` (two in a row, as any
#: change). A worker sped up 5x at 80% load is ~16% busy, too idle for
#: ``PROBE_BUSY_S``: without this its speed-up waited for a report (~0.6 s,
#: its backlog building on the workers it should relieve). A rate that swings
#: (no emulated work; a duty-cycled worker at partial load) is never steady,
#: and is judged as before. A steady worker's window of at least
#: ``STEADY_ALONE_S`` of work beyond ``STEADY_JUMP`` is a change on its own: a
#: worker that slowed 3x serves a call sized for its old rate for 0.3 s, and
#: its windows end with its calls.
STEADY_PROBES = 5
STEADY_BUSY_S = 0.01
STEADY_DEV = 0.1
STEADY_JUMP = 0.5
STEADY_ALONE_S = 0.2

#: until its first flush, a worker that reports its rate serves a longer call
#: in pieces of at most this much emulated work (``WorkerCore._serve``)
SERVE_PIECE_S = 0.02
#: an idle worker wakes up at least this often to flush when its cadence is
#: due (its first rate report ``FIRST_PLAN_S`` in, later ones every
#: ``report_every_s``), whether or not a call arrives
IDLE_POLL_S = 0.1


@dataclass
class QueuedCall:
    """One call's sub-batches (``Part``s), queued until processed together."""

    source: int
    parts: list[Part]
    n: int
    done: threading.Event = field(default_factory=threading.Event)
    ack: Ack | None = None
    error: BaseException | None = None

    @property
    def tag(self) -> Tag | None:
        """The first part's tag: every part of a call comes from one source
        incarnation (what fencing looks at)."""
        return self.parts[0].tag if self.parts else None


class _Slots:
    """Per-slot accumulators on the run's timeline (slot k = [k*slot_s, (k+1)*slot_s))."""

    def __init__(self, slot_s: float) -> None:
        self.slot_s = slot_s
        self.processed: dict[int, int] = {}
        self.queue_msgs_area: dict[int, float] = {}
        self.queue_batches_area: dict[int, float] = {}
        self.busy_s: dict[int, float] = {}
        self.latency: dict[int, LatencyHistogram] = {}

    def add_interval(self, acc: dict[int, float], t_a: float, t_b: float, weight: float) -> None:
        """Add ``weight * overlap`` of [t_a, t_b) to every slot it overlaps."""
        if t_b <= t_a or weight == 0:
            return
        k = math.floor(t_a / self.slot_s)
        while True:
            end = (k + 1) * self.slot_s
            span = min(end, t_b) - max(k * self.slot_s, t_a)
            if span > 0:
                acc[k] = acc.get(k, 0.0) + weight * span
            if end >= t_b:
                break
            k += 1

    def slot_of(self, t: float) -> int:
        return math.floor(t / self.slot_s)


class _RateWindow:
    """A ``RateMeter`` and the window it measures: where the window started
    on the run's timeline (and the seconds stopped before), and the first
    and the latest throttle period start seen since (``LoadMeter``)."""

    def __init__(self, t: float, stopped: float) -> None:
        self.rate = RateMeter()
        self.start = (t, stopped)
        self.periods: tuple[tuple[float, float], tuple[float, float]] | None = None

    def saw_period(self, t: float, stopped: float) -> None:
        first = (t, stopped) if self.periods is None else self.periods[0]
        self.periods = (first, (t, stopped))

    def length(self, now: float) -> float:
        """Its length so far: of the whole periods in it, if any were seen."""
        if self.periods is not None:
            return self.periods[1][0] - self.periods[0][0]
        return now - self.start[0]

    def take(self, now: float, stopped_now: float) -> RateReport:
        """The report up to ``now`` (``stopped_now``); the next window starts there."""
        t, stopped = self.start
        self.start = (now, stopped_now)
        span = self.periods
        if span is not None:
            self.periods = (span[1], span[1])  # consecutive spans tile the timeline
            (t0, s0), (t1, s1) = span
            if t1 - t0 > PERIOD_SLACK_S:
                # The running share of whole periods: a window ends wherever
                # a flush falls (only ever while the process runs), and its
                # share is up to a running part high - a 0.3 worker's first
                # 0.11 s window ran 0.36 of it, and the first plan took it for
                # a 0.36 worker (seconds of tail latency at the start)
                return self.rate.take(t1 - t0, s1 - s0)
        return self.rate.take(now - t, stopped_now - stopped)


class LoadMeter:
    """A worker's own load, on the run's timeline (seconds since ``t0`` on ``clock``).

    The queue length (batches and messages, counting the batch in service)
    changes on every enqueue and dequeue (``change``); between changes it is
    integrated per slot, and so is the time a batch was in service
    (``served``). ``rate`` is what a coordinated scheme's controller gets:
    messages served and seconds with work, since its last ``take_report``.

    Not thread-safe: the worker calls it under one lock, reading the clock
    under that lock, so that observations stay in time order.
    """

    def __init__(self, queue_capacity: int, slot_s: float, t0: float, clock: Clock,
                 stopped_clock: Clock | None = None) -> None:
        """``stopped_clock``: the seconds this process has been kept stopped
        (a duty-cycle throttle's; ``RateMeter`` then counts busy seconds as a
        slow machine's), or None. One with a ``resumed()`` method (``(time on
        ``clock`` of the latest period's start, seconds stopped before it)``,
        or None) also says when the throttle's periods start: a rate report
        then takes its running share from the whole periods between the
        period starts it saw (``take_report``)."""
        self.queue_capacity = int(queue_capacity)
        self.clock = clock
        self.stopped_clock = stopped_clock
        self._resumed: Callable[[], tuple[float, float] | None] | None = getattr(
            stopped_clock, "resumed", None)
        self.q_batches = 0  # in the system: queued + in service
        self.q_msgs = 0
        self.slots = _Slots(slot_s)
        self.restart(t0)

    def restart(self, t0: float) -> None:
        """Start the timeline at ``t0``: empty slots and rate; the queue stays."""
        self.t0 = float(t0)
        self.last_t = self.rel(self.clock())
        #: the rate reports' window (``take_report``) and the change probes'
        #: (``change_seen``)
        self.report = _RateWindow(self.last_t, 0.0)
        self.probe = _RateWindow(self.last_t, 0.0)
        self._windows = (self.report, self.probe)
        self.last_stopped = self._stopped()  # (the windows see its period start)
        for w in self._windows:
            w.start = (self.last_t, self.last_stopped)
        #: the latest report's rate (None: none with a rate yet), and the
        #: previous probe's deviation from it (0: within the threshold, or no sample)
        self._ref: float | None = None
        self._probe_dev = 0.0
        self._lenient = False  # the next probe window may have little work
        self._steady = 0  # probe windows in a row within STEADY_DEV of the rate
        self.slots = _Slots(self.slots.slot_s)

    @property
    def rate(self) -> RateMeter:
        """The rate reports' meter."""
        return self.report.rate

    def _stopped(self) -> float:
        """The seconds stopped so far; notes the latest period start, if told."""
        if self._resumed is not None:
            seen = self._resumed()
            if seen is not None:
                t, stopped = self.rel(seen[0]), float(seen[1])
                if t >= -PERIOD_SLACK_S:  # not a start of a previous run's throttle
                    for w in self._windows:
                        w.saw_period(t, stopped)
                return stopped
        return 0.0 if self.stopped_clock is None else float(self.stopped_clock())

    def rel(self, t: float) -> float:
        """Clock time ``t`` on the run's timeline."""
        return t - self.t0

    def now(self) -> float:
        """The clock on the timeline, never before the last observation."""
        return max(self.rel(self.clock()), self.last_t)

    def utilization(self) -> float:
        return self.q_batches / self.queue_capacity

    def account(self, now_rel: float) -> None:
        """Integrate the queue length up to ``now_rel``."""
        s = self.slots
        s.add_interval(s.queue_msgs_area, self.last_t, now_rel, self.q_msgs)
        s.add_interval(s.queue_batches_area, self.last_t, now_rel, self.q_batches)
        stopped = self._stopped()
        if self.q_batches > 0:  # the rate meters' busy time: time with work
            for w in self._windows:
                w.rate.working(now_rel - self.last_t, stopped - self.last_stopped)
        self.last_t = max(self.last_t, now_rel)
        self.last_stopped = stopped

    def change(self, d_batches: int, d_msgs: int) -> float:
        """The queue grew (or shrank) now; returns now on the timeline."""
        now_rel = self.now()
        self.account(now_rel)
        self.q_batches += d_batches
        self.q_msgs += d_msgs
        return now_rel

    def served(self, n: int, t_start: float, t_end: float, latency: Binned | None,
               credited: int = 0) -> None:
        """A batch of ``n`` messages was in service from ``t_start`` to
        ``t_end`` (clock times); ``latency``: their latencies, counted
        (``latency.binned``: the worker counts a call's latencies once);
        ``credited``: of them, those the rate meter already counted (a call
        served in pieces, ``WorkerCore._serve``)."""
        s = self.slots
        rel_end = self.rel(t_end)
        k = s.slot_of(rel_end)
        s.processed[k] = s.processed.get(k, 0) + n
        s.add_interval(s.busy_s, self.rel(t_start), rel_end, 1.0)
        h = s.latency.get(k)
        if h is None:
            h = s.latency[k] = LatencyHistogram()
        h.add_binned(latency)
        self.credit(n - credited)

    def credit(self, n: int) -> None:
        """``n`` messages served (the rate meters count them)."""
        for w in self._windows:
            w.rate.served(n)

    def take_report(self, recent: tuple[int, float] | None = None) -> RateReport:
        """The rate report up to now (then it starts afresh); ``recent``: a
        change seen (``change_seen``), which the report carries."""
        self.account(self.now())
        out = self.report.take(self.last_t, self.last_stopped)
        if recent is not None:
            self._ref = recent[0] / recent[1]
            return RateReport(out.processed, out.busy_s, recent)
        if out.busy_s >= PROBE_BUSY_S and out.processed > 0:
            self._ref = out.processed / out.busy_s
        return out

    def change_seen(self, jump: float) -> tuple[int, float] | None:
        """Whether this worker's rate moved by more than ``jump`` (relative)
        from its latest report's: two probe windows in a row (``PROBE_S``
        each, with ``PROBE_BUSY_S`` of work, or ``STEADY_BUSY_S`` for a
        steady worker's beyond ``STEADY_JUMP``) beyond it the same way, or one
        of a steady worker's with ``STEADY_ALONE_S`` of work; then
        the later one's (messages, busy seconds), which is the reference from
        then on, else None. A capacity change is then said at once, not when
        the next report is due."""
        now = self.now()
        if self.probe.length(now) < PROBE_S - PERIOD_SLACK_S:
            return None
        self.account(now)
        r = self.probe.take(self.last_t, self.last_stopped)
        if (not self._ref or r.busy_s < STEADY_BUSY_S
                or (r.busy_s < PROBE_BUSY_S and r.processed == 0)):
            self._probe_dev = 0.0
            return None
        dev = r.processed / r.busy_s / self._ref - 1.0
        steady, self._steady = (self._steady >= STEADY_PROBES,
                                self._steady + 1 if abs(dev) <= STEADY_DEV else 0)
        # lenient: a steady worker's window, or the one after a steady
        # worker's window beyond ``jump`` or its change seen (the change may
        # have fallen inside that one)
        lenient, self._lenient = steady or self._lenient, False
        if abs(dev) <= jump or (r.busy_s < PROBE_BUSY_S
                                and not (lenient and abs(dev) > STEADY_JUMP)):
            self._probe_dev = 0.0
            return None
        if self._probe_dev * dev > 0 or (steady and abs(dev) > STEADY_JUMP
                                         and r.busy_s >= STEADY_ALONE_S):
            # a steady worker's change may have fallen inside the window: the
            # next one, the same way beyond ``jump`` of this rate, says the
            # rest of it at once (a worker that was not steady starts afresh)
            self._probe_dev, self._steady, self._lenient = (dev if lenient else 0.0), 0, lenient
            self._ref = r.processed / r.busy_s  # (as the report that carries it will)
            return (r.processed, r.busy_s)
        self._probe_dev, self._lenient = dev, steady
        return None

    def integrals(self, t: float) -> tuple[float, float]:
        """Since the start, up to clock time ``t``: queue length (batches) x
        seconds, and seconds in service."""
        self.account(max(self.rel(t), self.last_t))
        s = self.slots
        return float(sum(s.queue_batches_area.values())), float(sum(s.busy_s.values()))

    def series(self, now_rel: float) -> WorkerSeries:
        """Per-slot time series from slot 0 to the one holding ``now_rel``."""
        self.account(now_rel)
        s = self.slots
        slots = range(0, max(s.slot_of(now_rel), 0) + 1)
        slot_s = s.slot_s
        return WorkerSeries(
            slot=list(slots),
            processed=[s.processed.get(k, 0) for k in slots],
            queue_msgs=[s.queue_msgs_area.get(k, 0.0) / slot_s for k in slots],
            queue_batches=[s.queue_batches_area.get(k, 0.0) / slot_s for k in slots],
            busy=[s.busy_s.get(k, 0.0) / slot_s for k in slots],
            latency={k: h.to_sparse() for k, h in s.latency.items()},
        )


class SourceSignals:
    """One ``LoadSignaler`` per source (none without ``settings``), all fed
    the same utilization samples. Not thread-safe (the worker's lock)."""

    def __init__(self, settings: WorkerSignals | None) -> None:
        self.settings = settings
        self._by_source: dict[int, LoadSignaler] = {}

    def wants(self, source: int) -> bool:
        """Whether ``source`` needs a signaler (signals are on, it has none yet)."""
        return self.settings is not None and source not in self._by_source

    def add(self, source: int, now_rel: float, utilization: float) -> None:
        """Give ``source`` a signaler that starts from the current sample."""
        if self.settings is not None and source not in self._by_source:
            sig = LoadSignaler.of(self.settings)
            sig.observe(now_rel, utilization)
            self._by_source[source] = sig

    def observe(self, now_rel: float, utilization: float) -> None:
        for sig in self._by_source.values():
            sig.observe(now_rel, utilization)

    def get(self, source: int) -> LoadSignaler | None:
        return self._by_source.get(source)

    def emitted(self) -> dict[str, int]:
        """Signals emitted to all sources together."""
        total = {"increase": 0, "decrease": 0}
        for sig in self._by_source.values():
            for key in total:
                total[key] += sig.emitted[key]
        return total


class FlushCadence:
    """When a worker flushes: every ``aggregate_every_s``. A coordinated
    scheme's worker (``report_every_s`` set) also reports its rate in every
    flush, so it flushes at least every ``report_every_s`` - and, until the
    controller's first table reaches it (``planned``), for at most
    ``report_every_s``, every ``FIRST_PLAN_S``: the controller's first plan
    needs every worker's rate, and a report with almost no time with work in
    it (the first calls still on their way) gives none, so the first plan
    would otherwise wait a whole ``report_every_s`` for the next one."""

    def __init__(self, aggregate_every_s: float, report_every_s: float | None,
                 now: float) -> None:
        self.aggregate_every_s = float(aggregate_every_s)
        self.report_every_s = report_every_s
        self.restart(now)

    @property
    def reports(self) -> bool:
        """Whether flushes carry a rate report."""
        return self.report_every_s is not None

    def restart(self, now: float) -> None:
        self.last = self.started = now
        self.planned = False
        self.every_s = (self.aggregate_every_s if self.report_every_s is None
                        else min(self.aggregate_every_s, self.report_every_s, FIRST_PLAN_S))

    def due(self, now: float) -> bool:
        return now - self.last >= self.every_s

    def due_in(self, now: float) -> float:
        """Seconds until the next flush is due (<= 0: it is)."""
        return self.last + self.every_s - now

    def flushed(self, now: float) -> None:
        self.last = now
        if self.report_every_s is not None and (
                self.planned or now - self.started >= self.report_every_s):
            self.every_s = min(self.aggregate_every_s, self.report_every_s)


class TableRelay:
    """The controller's newest VW table (ACG, from the commit answers), handed
    to each source once, on its next ack."""

    def __init__(self) -> None:
        self.table: Any = None
        self._sent: dict[int, int] = {}  # source -> version it got

    def offer(self, table: Any) -> None:
        if table is not None and (self.table is None or table.version > self.table.version):
            self.table = table

    def take_new(self, source: int) -> Any:
        """The newest table if ``source`` has not had it yet, else None."""
        table = self.table
        if table is None or self._sent.get(source, 0) >= table.version:
            return None
        self._sent[source] = table.version
        return table


class WorkerCore:
    """One worker's logic; see the module docstring. Thread-safe ``submit``."""

    def __init__(
        self,
        worker_id: int,
        app: Any,
        settings: WorkerSettings,
        *,
        sink: Callable[[Flush], None] | None = None,
        t0: float | None = None,
        clock: Clock = time.time,
        sleep: Callable[[float], None] = time.sleep,
        stopped_clock: Clock | None = None,
    ) -> None:
        """``settings``: this worker's (``runtime.dataflow.settings``); with
        ``report_every_s`` (coordinated schemes: ACG) flushes also carry a
        rate report (``FlushCadence``) and the controller's tables come back
        (``on_table``). ``sink``: where flushes go (the aggregator's commit)."""
        st = self.settings = settings
        self.worker_id = int(worker_id)
        #: the app's worker side: ``add(records, key_hashes)`` per sub-batch,
        #: ``flush()`` -> the partial sent to the aggregator
        self.app = app
        self._keys = DistinctKeys()
        self.throttle = st.throttle
        self.clock = clock
        self.capacity = float(st.capacity)
        scale = self.capacity if st.throttle == "service" else 1.0
        # ``service``: nothing ever stops this process, so a late wake-up (a
        # busy CPU, the GIL) is paid back, not taken for a stop; the duty
        # cycles say their stops (``stopped_clock``) or leave them to a guess
        self.service = ServiceEmulator(
            st.service_us, scale, clock=clock, sleep=sleep,
            stopped_clock=_never_stopped if st.throttle == "service" else stopped_clock)
        self.queue_batches = int(st.queue_batches)
        self._queue: queue.Queue[QueuedCall | None] = queue.Queue(maxsize=self.queue_batches)
        #: why the processing thread died, if it did (then every batch fails fast)
        self._dead: BaseException | None = None
        #: guards ``load``, ``_signals`` and the totals (latency, processed, batches)
        self._lock = threading.Lock()
        self.load = LoadMeter(st.queue_capacity_batches or st.queue_batches, st.slot_s,
                              clock() if t0 is None else float(t0), clock,
                              stopped_clock=stopped_clock)
        self._signals = SourceSignals(st.signals)
        self._cadence = FlushCadence(st.aggregate_every_s, st.report_every_s, clock())
        self._tables = TableRelay()
        self.sink = sink
        self.latency = LatencyHistogram()
        self.processed = 0
        self.batches = 0
        self.flushes = 0
        self._stop = threading.Event()
        #: held while a batch is applied to the app state and while flushing, so
        #: claims, state and flushes stay consistent for ``fence_source``
        self._proc_lock = threading.RLock()
        self.claims = ClaimLog()
        self._committed = threading.Condition()

    @property
    def distinct_keys(self) -> int:
        """Distinct keys this worker has processed (replication's numerator)."""
        return len(self._keys)

    def utilization_now(self) -> float:
        return self.load.utilization()

    def _changed(self, d_batches: int, d_msgs: int) -> None:
        with self._lock:  # the clock is read under the lock: observations stay ordered
            now_rel = self.load.change(d_batches, d_msgs)
            self._signals.observe(now_rel, max(0.0, self.load.utilization()))

    def start_run(self, t0: float) -> None:
        """Align the slots with the run's start (``t0`` on ``clock``); before any batch."""
        with self._lock:
            self.load.restart(t0)
            self._cadence.restart(self.clock())

    # ------------------------------------------------------------------ input side
    def submit(self, source: int, parts: list[Part]) -> Ack:
        """Enqueue one call's sub-batches and block until they are processed;
        returns the call's ack."""
        item = self.enqueue(source, parts)
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.ack is not None
        return item.ack

    def enqueue(self, source: int, parts: list[Part]) -> QueuedCall:
        """Queue one call's sub-batches (blocks while the queue is full); the
        caller waits on the returned call's ``done`` for its ack."""
        item = QueuedCall(int(source), list(parts), sum(len(p) for p in parts))
        if self._signals.wants(item.source):
            with self._lock:
                self._signals.add(item.source, self.load.now(),
                                  max(0.0, self.load.utilization()))
        # counted before the put: a caller blocked on a full queue is waiting in it too
        self._changed(+1, item.n)
        self._queue.put(item)  # blocks while the queue is full
        if self._dead is not None:  # the processing thread is gone: nobody will take it
            self._fail_queued()
        return item

    # ------------------------------------------------------------------ processing
    def step(self, timeout: float | None = None) -> bool:
        """Process one queued batch (False if none arrived within ``timeout``)."""
        try:
            item = self._queue.get(timeout=timeout) if timeout != 0 else self._queue.get_nowait()
        except queue.Empty:
            self.maybe_flush()
            return False
        if item is None:
            return False
        try:
            self._process(item)
        except BaseException as e:  # the caller gets the error instead of hanging
            item.error = e
            item.done.set()
            raise
        self.maybe_flush()
        return True

    def _process(self, item: QueuedCall) -> None:
        if self._fenced(item):
            return
        t_start = self.clock()
        finish, credited = self._serve(item.n)
        applied_seq = self._apply(item, self.claims.open_seq)
        if applied_seq is None:
            return
        t_end = self.clock()
        lat = _latencies(item, finish, t_end)
        counted = binned(lat)  # once, for the slot's histogram and the total
        with self._lock:
            self.load.served(item.n, t_start, t_end, counted, credited=credited)
            self.latency.add_binned(counted)
            self.processed += item.n
            self.batches += 1
        self._changed(-1, -item.n)
        item.ack = self._ack(item, counted, t_end, applied_seq)
        item.parts = []
        item.done.set()

    def _serve(self, n: int) -> tuple[np.ndarray, int]:
        """The emulated service of a call of ``n`` messages: their finish
        times, and how many of them the rate meter was already credited. Until
        its first flush, a worker that reports its rate (a coordinated scheme)
        serves a call longer than ``SERVE_PIECE_S`` of work in pieces,
        crediting each and flushing between them when the flush is due: its
        first report must not wait for the end of a long call (a 0.2 worker's
        first call, one sub-batch, can be 0.5 s of work: the controller's
        first plan waited for it). Later calls hold ``CALL_S`` of its work
        (the sources measure it); reports at calls' ends average over them."""
        cost = self.service.cost_s
        if (not self._cadence.reports or self.flushes > 0 or cost <= 0
                or n * cost <= SERVE_PIECE_S):
            return self.service.serve(n), 0
        piece = max(1, int(SERVE_PIECE_S / cost))
        finish, done = [], 0
        while done < n:
            k = min(piece, n - done)
            finish.append(self.service.serve(k))
            done += k
            if done < n:
                with self._lock:
                    self.load.credit(k)
                self.maybe_flush()
        return np.concatenate(finish), n - k

    def _fenced(self, item: QueuedCall) -> bool:
        """Whether ``item`` comes from a fenced-off (dead) source incarnation;
        if so it is answered as rejected, not processed."""
        if item.tag is None:
            return False
        with self._proc_lock:
            if self.claims.admits(item.tag):
                return False
            self.claims.rejected += 1
            self._changed(-1, -item.n)
            item.ack = Ack(self.worker_id, 0, 0, 0.0, 0.0, self.clock(),
                           self.claims.open_seq, self.claims.committed_seq, rejected=True)
            item.parts = []
            item.done.set()
            return True

    def _apply(self, item: QueuedCall, flush_seq: int) -> int | None:
        """Add ``item`` to the app's state, except messages this worker already
        processed (same source, batch and index: a replay never counts twice
        here); the flush that holds it, or None if its source was fenced while
        it was in service."""
        with self._proc_lock:
            if self._fenced(item):
                return None
            parts = [p if p.tag is None else _new_only(p, self.claims) for p in item.parts]
            for p in parts:
                if len(p):
                    self.app.add(p.records, p.hashes)
                    self._keys.add(p.hashes)
                if p.tag is not None:
                    flush_seq = self.claims.processed(p.tag)
        return flush_seq

    def _ack(self, item: QueuedCall, lat: Binned | None, t_end: float, flush_seq: int) -> Ack:
        """``lat``: the call's latencies (``latency.binned``: their sum and max)."""
        signal = 0
        sig = self._signals.get(item.source)
        if sig is not None:
            with self._lock:
                signal = sig.take_signal(self.load.last_t)
        return Ack(self.worker_id, item.n, signal,
                   lat[2] if item.n and lat is not None else 0.0,
                   lat[3] if item.n and lat is not None else 0.0,
                   t_end, flush_seq, self.claims.committed_seq,
                   table=self._tables.take_new(item.source))

    def maybe_flush(self, force: bool = False) -> bool:
        """Flush if one is due (or ``force``), or if this worker saw its rate
        change (``LoadMeter.change_seen``: its report says so at once)."""
        now = self.clock()
        if self._dead is not None:
            return False  # (a failed worker's flushes could never commit)
        change = None
        if self.settings.report_jump is not None and self._cadence.reports:
            with self._lock:
                change = self.load.change_seen(self.settings.report_jump)
        if not force and change is None and not self._cadence.due(now):
            return False
        with self._proc_lock:  # the sink is called in sequence order
            self._cadence.flushed(now)
            flush = self.claims.close(self.worker_id, self.app.flush())
            if self._cadence.reports:
                with self._lock:
                    flush.report = self.load.take_report(change)
            self.flushes += 1
            if self.sink is not None:
                self.sink(flush)
        return True

    def flush_now(self) -> int:
        """Flush now (unless nothing is open); returns the newest flush sequence."""
        with self._proc_lock:
            if self.claims.open_messages:
                self.maybe_flush(force=True)
            return self.claims.open_seq - 1

    def on_table(self, table: Any) -> None:
        """The controller's latest VW table (from the commit answers)."""
        self._tables.offer(table)
        if table is not None:
            self._cadence.planned = True

    def on_committed(self, seq: int) -> None:
        """The aggregator committed flush ``seq`` (and every earlier one)."""
        with self._committed:
            self.claims.on_committed(seq)
            self._committed.notify_all()

    def wait_committed(self, seq: int, timeout: float | None = None) -> int:
        """Block until flush ``seq`` is committed (or ``timeout``); the committed
        seq. A worker that failed (``fail``) raises why instead."""
        with self._committed:
            self._committed.wait_for(
                lambda: self.claims.committed_seq >= seq or self._dead is not None, timeout)
            if self._dead is not None:
                raise self.death()
            return self.claims.committed_seq

    def fence_source(self, source: int, epoch: int) -> WorkerFence:
        """``source`` restarted as incarnation ``epoch``: see ``ClaimLog.fence``.
        Waits for a batch in service; queued ones of older incarnations are
        rejected when dequeued."""
        with self._proc_lock:
            return self.claims.fence(source, epoch)

    def pending(self) -> int:
        """Calls waiting in the queue (not the one in service)."""
        return len(self._queue.queue)  # ``qsize()`` without its lock: a deque's len is atomic

    def idle_poll_s(self) -> float:
        """How long the processing loop waits for a call before it checks
        whether a flush is due: until it is, at most ``IDLE_POLL_S`` (the
        simulator's loop too)."""
        # (a microsecond at least: a clock that advances by exactly the wait
        # must get past the due time, not stop a rounding error short of it)
        return max(1e-6, min(IDLE_POLL_S, self._cadence.due_in(self.clock())))

    def run_forever(self) -> None:
        """The processing thread: drain FIFO until ``stop()``. If it dies, every
        queued (and later) batch fails with the error instead of waiting forever."""
        try:
            while not self._stop.is_set():
                self.step(timeout=self.idle_poll_s())
        except BaseException as e:
            self._dead = e
            self._fail_queued()
            raise

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item.error = self.death()
                item.done.set()

    def death(self) -> BaseException:
        """Why this worker cannot take more work: the user operator's own
        one-line error when that is the cause, else the processing thread's."""
        from runtime.operators import find_operator_error

        return find_operator_error(self._dead) or RuntimeError(
            f"worker-{self.worker_id} processing thread died: {self._dead!r}")

    def fail(self, error: BaseException) -> None:
        """Stop taking work: every queued and later call fails with ``error``."""
        self._dead = error
        self._fail_queued()
        with self._committed:  # a commit waiter learns nothing will commit
            self._committed.notify_all()

    def stop(self) -> None:
        self._stop.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass

    # ------------------------------------------------------------------ control + reports
    def set_capacity(self, capacity: float) -> None:
        """Record a capacity change; in ``service`` mode it also rescales service time."""
        self.capacity = float(capacity)
        if self.throttle == "service":
            self.service.set_capacity_scale(self.capacity)

    def progress(self) -> WorkerProgress:
        return WorkerProgress(worker=self.worker_id, processed=self.processed,
                              utilization=self.utilization_now(), queue_msgs=self.load.q_msgs)

    def telemetry_snapshot(self) -> WorkerSnapshot:
        """Cumulative counters since ``start_run`` for live metrics (read ~1/s by
        ``actors.telemetry``)."""
        now = self.clock()
        with self._lock:
            queue_batches_s, busy_s = self.load.integrals(now)
            return WorkerSnapshot(
                t=now,
                processed=self.processed,
                batches=self.batches,
                queue_msgs=self.load.q_msgs,
                queue_batches=self.load.q_batches,
                queue_capacity=self.load.queue_capacity,
                capacity=self.capacity,
                queue_batches_s=queue_batches_s,
                busy_s=busy_s,
                stopped_s=float(self.service.stopped_s),
                latency_counts=self.latency.counts.copy(),
                latency_max_s=self.latency.max_s,
            )

    def finish(self) -> WorkerStats:
        """Final flush and the worker's statistics and per-slot time series."""
        self.maybe_flush(force=True)
        now_rel = self.load.rel(self.clock())
        with self._lock:
            series = self.load.series(now_rel)
            signals = self._signals.emitted()
        return WorkerStats(
            id=self.worker_id,
            processed=self.processed,
            batches=self.batches,
            keys=self.distinct_keys,
            flushes=self.flushes,
            committed_seq=self.claims.committed_seq,
            rejected_batches=self.claims.rejected,
            duplicate_messages=self.claims.duplicates,
            stopped_s=self.service.stopped_s,
            latency=self.latency.to_sparse(),
            signals_emitted=signals,
            queue_capacity_batches=self.load.queue_capacity,
            series=series,
        )


def _never_stopped() -> float:
    """The stopped seconds of a process that nothing stops (``throttle: service``)."""
    return 0.0


def _new_only(part: Part, claims: ClaimLog) -> Part:
    """``part`` without the messages ``claims`` says were processed already."""
    assert part.tag is not None
    keep = claims.filter_new(part.tag)
    return part if keep is None else part.select(keep)


def _latencies(item: QueuedCall, finish: np.ndarray, t_end: float) -> np.ndarray:
    """Per message of ``item``: its finish time (``finish`` from the service
    emulator) - its emit time; app compute after the emulated service delays
    the whole batch, which ended at ``t_end``."""
    if item.n:
        finish = finish + max(0.0, t_end - float(finish[-1]))
    emit = (item.parts[0].emit_per_message() if len(item.parts) == 1
            else np.concatenate([p.emit_per_message() for p in item.parts]))
    return np.maximum(finish - emit, 0.0)
