"""The simulator: the runtime's own cores, ``SourceCore``, ``WorkerCore``
and ``AggregatorCore`` (``runtime.dataflow``) - the very code the Ray actors
run, with their outboxes, call coalescing, linger, steps, replay logs and
commits - on a virtual clock instead of wall time, with in-process calls
instead of Ray's.

``python -m runtime.simulate TOPOLOGY`` (``runtime.sim.api.simulate`` in Python).

How time passes (``VirtualTime``): every source and every worker is a thread,
but exactly one runs at a time, and only blocking moves the clock. A thread
blocks by sleeping (a worker's emulated service time; the CPU a source spends
routing and sending, ``ROUTE_S_PER_MESSAGE`` and ``SEND_S_PER_CALL``) or by
waiting for a condition (a source for acks, a worker for work) with an
optional time-out. When the running thread blocks, the next to run is the
first blocked thread (in blocking order) whose condition now holds; if none
does, the clock jumps to the earliest wake-up. So sources and workers run in
parallel in virtual time, each as its own process would, and a run is a
function of its topology and seed: the same report numbers, every time.

What it models as the real engine does: everything inside the cores, and
the throttle. ``workers.throttle: duty-cycle`` (and ``cpulimit``, a duty
cycle too) stops and continues a slow worker as ``actors.throttle`` does: every
0.1 s it runs for its capacity's share of the period, then stays stopped to
the period's end (``DutyCycle``: the stopped seconds the worker's service
emulator reads, as from the real throttler's ``StoppedClock``); ``service``
scales the service time by the capacity. A call from a source reaches its
worker ``CALL_TRANSIT_S`` after it was sent (Ray's delivery, as measured in
real runs on these machines), and a stopped worker takes in no call: as a
SIGSTOPped process, it counts a call that arrived while it was stopped in
its queue only when it runs again (``_Inbox``) - what its utilization, and
with it CG's signals, see on the real engine. An ack is back at its source
``ACK_TRANSIT_S`` after the worker ended the call. The CPU a call costs the
source is modelled (``SEND_S_PER_CALL``).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import itertools
import math
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from runtime.dataflow.aggregator import AggregatorCore
from runtime.dataflow.messages import AggregatorStats, SourceStats
from runtime.dataflow.reliability import Flush, Part
from runtime.dataflow.settings import CoreSettings, coordinator_for
from runtime.dataflow.source import SourceCore
from runtime.dataflow.worker import WorkerCore
from runtime.grouping.coordination import RoutedReport
from runtime.inputs.input_check import shard_block_rows
from runtime.operators import WorkerApp
from runtime.reporting import report as report_mod
from runtime.reporting.cores import Capacities, counts_input_keys, measurements
from runtime.sim.inputs import SimInput
from runtime.topology import Topology

#: a source's CPU per message routed (hash, route, split, queue), measured
#: outside Ray on this project's machines (docs/benchmarks.md, "steps")
ROUTE_S_PER_MESSAGE = 130e-9
#: a source's CPU per actor call (Ray's argument preparation and submission:
#: 320-610 us measured, docs/benchmarks.md)
SEND_S_PER_CALL = 400e-6
#: how long a call takes to reach its worker (from the source's send to the
#: worker's taking it in): the median measured inside real runs on this
#: project's 2-core machines, sources, workers and Spark sharing them
#: (3.4-3.6 ms to full-speed workers; docs/benchmarks.md, "Simulator and real
#: engine"). The ack's way back is ``ACK_TRANSIT_S``.
CALL_TRANSIT_S = 3.5e-3
#: how long an ack takes back to its source (from the worker's end of the
#: call to the source's seeing it): the median measured inside real runs on
#: this project's machines, over the acks a waiting source received (1.3 ms;
#: docs/benchmarks.md, "Simulator and real engine")
ACK_TRANSIT_S = 1.3e-3
#: the clock starts here (a wall-clock-like number: the cores add seconds to it)
T0 = 1_000_000.0


class Deadlock(RuntimeError):
    """Every thread waits for a condition that no other thread can make true."""


class VirtualTime:
    """Threads taking turns on one virtual clock (see the module docstring).
    The running thread hands over to the next by releasing that thread's own
    turn lock (one wake-up per turn, not one per thread)."""

    def __init__(self, t0: float = T0) -> None:
        self.now = t0
        self._lock = threading.Lock()
        #: blocked threads in blocking order (a dict keeps insertion order):
        #: name -> (wake-up time, order, condition or None)
        self._blocked: dict[str, tuple[float, int, Callable[[], bool] | None]] = {}
        #: those of them with a condition, in the same order (what ``_next`` scans)
        self._waiting: dict[str, Callable[[], bool]] = {}
        #: each thread's turn: a lock held while it must wait (a plain lock
        #: hands over with one wake-up, without an Event's condition)
        self._turn: dict[str, threading.Lock] = {}
        self._order = itertools.count()
        self._local = threading.local()
        self._threads: list[threading.Thread] = []
        self.error: BaseException | None = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self._block(self.now + max(0.0, float(seconds)), None)

    def wait_until(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``ready()`` (True) or ``timeout`` virtual seconds (its value)."""
        if ready():
            return True
        if timeout is not None and timeout <= 0:
            return False
        self._block(math.inf if timeout is None else self.now + timeout, ready)
        return ready()

    def spawn(self, name: str, fn: Callable[[], Any]) -> None:
        turn = self._turn[name] = threading.Lock()
        turn.acquire()  # held while the thread may not run: ``_next`` releases it

        def body() -> None:
            self._local.name = name
            turn.acquire()
            try:
                if self.error is None:
                    fn()
            except BaseException as e:  # noqa: BLE001 - the run reports the first one
                if self.error is None:
                    self.error = e
            finally:
                with self._lock:
                    self._next()

        with self._lock:
            self._blocked[name] = (self.now, next(self._order), None)
        t = threading.Thread(target=body, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def run(self) -> None:
        """Run every spawned thread to its end; raise the first error."""
        with self._lock:
            self._next()
        for t in self._threads:
            t.join()
        if self.error is not None:
            raise self.error

    def _block(self, wake: float, ready: Callable[[], bool] | None) -> None:
        if self.error is not None:
            raise _Stop()
        me = self._local.name
        turn = self._turn[me]
        with self._lock:
            self._blocked[me] = (wake, next(self._order), ready)
            if ready is not None:
                self._waiting[me] = ready
            self._next()
        turn.acquire()
        if self.error is not None:
            raise _Stop()

    def _next(self) -> None:
        """Pick who runs next and wake it (the caller holds the lock): the
        first blocked thread whose condition holds, else the earliest wake-up."""
        pick = None
        if self.error is None:
            for name, ready in self._waiting.items():
                if ready():
                    pick = name
                    break
        elif self._waiting:
            pick = next(iter(self._waiting))
        if pick is None and self._blocked:
            # (wake-up, order): the orders are distinct, so the conditions are never compared
            pick, (wake, _, _) = min(self._blocked.items(), key=operator.itemgetter(1))
            if math.isinf(wake):
                if self.error is None:
                    self.error = Deadlock(f"every thread waits: {sorted(self._blocked)}")
            else:
                self.now = max(self.now, wake)
        if pick is not None:
            del self._blocked[pick]
            self._waiting.pop(pick, None)
            self._turn[pick].release()


class _Stop(BaseException):
    """Another thread failed: this one unwinds."""


class _Call:
    """A call on its way to a worker: its ``QueuedCall`` once delivered."""

    __slots__ = ("queued",)

    def __init__(self) -> None:
        self.queued: Any = None

    def done(self) -> bool:
        return self.queued is not None and self.queued.done.is_set()


class _Inbox:
    """A worker's calls on their way: each reaches the worker (is counted in
    its queue) ``transit_s`` after it was sent - and a duty-cycled worker's
    only when it runs: a stopped process takes in no call (Ray hands it over,
    and the worker counts it, when the process runs again;
    ``DutyCycle.resume_at``). In send order. A thread of its own on the
    virtual clock does the deliveries."""

    def __init__(self, vt: VirtualTime, core: WorkerCore, duty: DutyCycle | None,
                 transit_s: float = CALL_TRANSIT_S) -> None:
        self.vt, self.core, self.duty, self.transit_s = vt, core, duty, float(transit_s)
        self.waiting: collections.deque[tuple[float, int, list[Part], _Call]] = (
            collections.deque())

    def send(self, source: int, parts: list[Part], call: _Call) -> None:
        at = self.vt.now + self.transit_s
        if self.duty is not None:
            at = self.duty.resume_at(at - self.duty.t0) + self.duty.t0
        if not self.waiting and at <= self.vt.now:  # no transit, running: at once
            call.queued = self.core.enqueue(source, parts)
        else:  # (behind the calls already waiting: in send order)
            self.waiting.append((max(at, self.waiting[-1][0]) if self.waiting else at,
                                 source, parts, call))

    def deliver(self, running: Callable[[], bool]) -> None:
        """The inbox's thread: until the sources have ended (and all is delivered)."""
        waiting, vt = self.waiting, self.vt
        while True:
            vt.wait_until(lambda: bool(waiting) or not running())
            if not waiting:
                return
            at, source, parts, call = waiting[0]
            if at > vt.now:
                vt.sleep(at - vt.now)
            waiting.popleft()
            call.queued = self.core.enqueue(source, parts)


def _more_done(calls: Sequence[_Call], answered: int) -> bool:
    """Whether more than ``answered`` of ``calls`` are done (checked on every
    hand-over while a source waits)."""
    k = 0
    for c in calls:
        if c.done():
            k += 1
            if k > answered:
                return True
    return False


class _Transport:
    """A source's calls, in-process: ``send`` queues a call at its worker
    through the worker's ``_Inbox`` (the source pays ``SEND_S_PER_CALL``);
    ``wait`` blocks until an ack is back: ``ACK_TRANSIT_S`` after its worker
    ended the call."""

    def __init__(self, vt: VirtualTime, inboxes: Sequence[_Inbox], source: int) -> None:
        self.vt, self.inboxes, self.source = vt, inboxes, source
        self.calls: dict[int, _Call] = {}
        self._tokens = itertools.count()

    def send(self, worker: int, parts: list[Part]) -> int:
        self.vt.sleep(SEND_S_PER_CALL)
        tok = next(self._tokens)
        call = self.calls[tok] = _Call()
        self.inboxes[worker].send(self.source, parts, call)
        return tok

    def _back_at(self, call: _Call) -> float:
        """When ``call``'s ack is back at the source (inf: not answered yet)."""
        if not call.done():
            return math.inf
        ack = call.queued.ack
        return self.vt.now if ack is None else ack.done_ts + ACK_TRANSIT_S

    def wait(self, tokens: Sequence[int], timeout: float | None) -> list[tuple[int, Any]]:
        vt, calls = self.vt, [self.calls[t] for t in tokens]
        end = math.inf if timeout is None else vt.now + timeout
        while True:
            back = [self._back_at(c) for c in calls]
            first = min(back, default=math.inf)
            due = vt.now + 1e-9  # what is back by now (1 ns: the clock's float sums)
            if first <= due or vt.now >= end:
                break
            answered = sum(1 for b in back if b < math.inf)
            until = min(first, end)  # the next ack back, or the time-out
            vt.wait_until(functools.partial(_more_done, calls, answered),
                          None if math.isinf(until) else until - vt.now)
        return [(t, self.calls.pop(t).queued.ack)
                for t, b in zip(tokens, back, strict=True) if b <= due]


class _Control:
    """``runtime.dataflow.source.Control`` for one source, in-process: the
    aggregator and the workers called directly (no failures are simulated)."""

    def __init__(self, agg: AggregatorCore, workers: Sequence[WorkerCore], source: int) -> None:
        self.agg, self.workers, self.source = agg, workers, source
        self.table: Any = None  # the answer to this source's last load report

    def fence_worker(self, worker: int, source: int) -> tuple[int, list[Any]]:
        return self.agg.fence_for_source(worker, source)

    def commit(self, workers: Sequence[int]) -> dict[int, Any]:
        return {w: self.workers[w].wait_committed(self.workers[w].flush_now(), 0)
                for w in workers}

    def report_routed(self, source: int, report: RoutedReport) -> None:
        self.table = self.agg.report_routed(source, report)

    def poll_table(self, timeout: float | None = 0.0) -> Any:
        table, self.table = self.table, None
        return table

    def committed(self) -> dict[int, int]:
        return {int(w): int(s) for w, s in self.agg.ledger.committed_seq.items()}


def _shards(inp: SimInput, sources: int, batch: int, block_rows: int) -> list[list[np.ndarray]]:
    """As the real runtime shards its input (``actors.spark_input.FeedLoad``):
    blocks of ``block_rows`` messages dealt round-robin to the sources; each
    source reads its blocks in order, in batches of ``batch`` (the message
    indices of each batch)."""
    blocks = [np.arange(lo, min(lo + block_rows, inp.n)) for lo in range(0, inp.n, block_rows)]
    out = []
    for s in range(sources):
        mine = blocks[s::sources]
        rows = np.concatenate(mine) if mine else np.zeros(0, dtype=np.int64)
        out.append([rows[lo:lo + batch] for lo in range(0, len(rows), batch)])
    return out


#: the duty-cycle throttler's period (``actors.throttle.DutyCycleThrottler``)
THROTTLE_PERIOD_S = 0.1


class DutyCycle:
    """One worker under a SIGSTOP/SIGCONT duty cycle on the virtual clock:
    period ``k`` starts at ``t0 + k * period_s``; the worker runs for its
    capacity at that moment times ``period_s``, then stays stopped to the
    period's end (a capacity of 1: never stopped). ``sleep(d)`` returns when
    the worker has run ``d`` seconds (a stopped process's sleep does not end);
    calling it gives the seconds stopped since ``t0`` (what
    ``actors.throttle.StoppedClock`` publishes for a real worker), so the
    service emulator counts the stops out of its service time."""

    def __init__(self, caps: Capacities, worker: int, t0: float, vt: VirtualTime,
                 period_s: float = THROTTLE_PERIOD_S) -> None:
        self.t0, self.vt, self.period_s = t0, vt, float(period_s)
        #: (first period, capacity) from it on, in order (``caps.changes`` is sorted)
        self.steps = [(0, float(caps.initial[worker]))] + [
            (math.ceil(at / self.period_s - 1e-9), float(c))
            for at, w, c in caps.changes if w == worker]
        self._firsts = [first for first, _ in self.steps]
        self._caps = [c for _, c in self.steps]

    def __call__(self) -> float:
        return self.stopped(self.vt.now - self.t0)

    def resumed(self) -> tuple[float, float]:
        """The latest period's start (virtual time) and the seconds stopped
        before it: what the real throttler publishes at each period's start
        (``actors.throttle.StoppedClock.resumed``). The worker reads it only
        while it runs, so in that period's running part."""
        k = max(0, math.floor((self.vt.now - self.t0) / self.period_s + 1e-9))
        return self.t0 + k * self.period_s, self.stopped(k * self.period_s)

    def sleep(self, seconds: float) -> None:
        self.vt.sleep(self.running_for(self.vt.now - self.t0, seconds))

    def capacity(self, k: int) -> float:
        """The capacity of period ``k`` (that of the last step starting at or before it)."""
        return self._caps[max(0, bisect.bisect_right(self._firsts, k) - 1)]

    def running_for(self, t: float, seconds: float) -> float:
        """From ``t``: the wall seconds in which the worker runs ``seconds``."""
        p, left, at = self.period_s, max(0.0, float(seconds)), t
        while True:
            k = max(0, math.floor(at / p + 1e-9))
            on_end = (k + self.capacity(k)) * p
            if at < on_end:
                if left <= on_end - at:
                    return at + left - t
                left -= on_end - at
            at = (k + 1) * p

    def resume_at(self, t: float) -> float:
        """The first moment at or after ``t`` at which the worker runs."""
        p = self.period_s
        k = max(0, math.floor(t / p + 1e-9))
        return t if t < (k + self.capacity(k)) * p else (k + 1) * p

    def stopped(self, t: float) -> float:
        """Seconds stopped in ``[0, t)``."""
        p = self.period_s
        k = max(0, math.floor(t / p + 1e-9))  # periods wholly before t (the k-th holds t)
        total, cap = 0.0, self.steps[0][1]
        for i, (first, c) in enumerate(self.steps):
            if first > k:
                break
            last = self.steps[i + 1][0] if i + 1 < len(self.steps) else k
            total += max(0, min(last, k) - first) * (1.0 - c) * p
            cap = c
        return total + max(0.0, t - k * p - cap * p)


#: a simulated worker's input queue, in calls: never full (a call reaches its
#: worker at once; the sources' in-flight windows bound what waits)
SIM_QUEUE_BATCHES = 1 << 20


def core_settings(topo: Topology, coordinator: Any) -> CoreSettings:
    """What the simulated cores are built from: the real engine's settings
    (``actors.pipeline.core_settings``), but for the workers' queue
    (``SIM_QUEUE_BATCHES``; the utilization's denominator stays the
    topology's) and their throttle: ``cpulimit`` is simulated as the duty
    cycle it is (``DutyCycle``)."""
    settings = CoreSettings.from_topology(topo, coordinator)
    return dataclasses.replace(settings, workers=tuple(
        dataclasses.replace(w, throttle="service" if w.throttle == "service" else "duty-cycle",
                            queue_batches=SIM_QUEUE_BATCHES)
        for w in settings.workers))


def simulate_cores(topo: Topology, inp: SimInput, *, block_rows: int | None = None,
                   progress: Callable[[int], None] | None = None,
                   transit_s: float = CALL_TRANSIT_S,
                   ) -> tuple[report_mod.RunMeasurements, pa.Table, AggregatorStats]:
    """Run ``topo`` over ``inp`` on the cores; the measurements, the result
    table and the aggregator's statistics. ``block_rows``: the stream's blocks
    dealt to the sources (default: the real runtime's, ``shard_block_rows``);
    ``progress(n)``: ``n`` more messages acked; ``transit_s``: how long a
    call takes to reach its worker (``_Inbox``)."""
    vt = VirtualTime()
    caps = Capacities(topo)
    n = topo.workers.total_count
    coordinator = coordinator_for(topo)
    settings = core_settings(topo, coordinator)
    agg = AggregatorCore(settings.aggregator, coordinator=coordinator, clock=vt.clock)
    workers: list[WorkerCore] = []

    def sink(w: int) -> Callable[[Flush], None]:
        def commit(flush: Flush) -> None:
            answer = agg.commit(flush)
            workers[w].on_table(answer.table)
            workers[w].on_committed(answer.committed_seq)
        return commit

    t0 = vt.now
    inboxes: list[_Inbox] = []
    for w in range(n):
        duty = (None if settings.workers[w].throttle == "service"
                else DutyCycle(caps, w, t0, vt))
        workers.append(WorkerCore(w, WorkerApp(settings.aggregator.operator()),
                                  settings.workers[w], sink=sink(w), t0=t0, clock=vt.clock,
                                  sleep=vt.sleep if duty is None else duty.sleep,
                                  stopped_clock=duty))
        inboxes.append(_Inbox(vt, workers[-1], duty, transit_s))
    for core in workers:  # virtual time needs no slicing: one sleep per call
        core.service.slice_s = math.inf
    agg.start_run(t0)
    src = settings.source
    shards = _shards(inp, topo.sources, src.batch, block_rows or shard_block_rows(topo))
    cores = [SourceCore(s, src.grouping(s, clock=vt.clock), _Transport(vt, inboxes, s), src,
                        clock=vt.clock, sleep=vt.sleep, t0=t0, control=_Control(agg, workers, s))
             for s in range(topo.sources)]
    stats: dict[int, SourceStats] = {}
    running = [len(cores)]

    def source(s: int) -> None:
        core = cores[s]
        routed, acked = [0], [0]
        send_step = core.send_step

        def paid_step(batches: Any, idx: Any = None) -> None:  # the routing CPU, in virtual time
            send_step(batches, idx)
            vt.sleep((core.routed - routed[0]) * ROUTE_S_PER_MESSAGE)
            routed[0] = core.routed
            if progress is not None and core.acked > acked[0]:
                progress(core.acked - acked[0])
                acked[0] = core.acked

        core.send_step = paid_step  # type: ignore[method-assign]
        stats[s] = core.run(pa.Table.from_batches([inp.records(idx)]) for idx in shards[s])
        if progress is not None and core.acked > acked[0]:
            progress(core.acked - acked[0])
        running[0] -= 1

    def worker(w: int) -> None:
        core = workers[w]
        while True:
            vt.wait_until(lambda: core.pending() > 0 or running[0] == 0,
                          core.idle_poll_s())
            if core.pending() == 0 and running[0] == 0:
                return
            core.step(timeout=0)

    def capacity_changes() -> None:
        for at_s, w, c in caps.changes:
            vt.sleep(t0 + at_s - vt.now)
            workers[w].set_capacity(c)

    for s in range(len(cores)):
        vt.spawn(f"source-{s}", functools.partial(source, s))
    for w in range(n):
        vt.spawn(f"worker-{w}", functools.partial(worker, w))
        vt.spawn(f"inbox-{w}", functools.partial(inboxes[w].deliver, lambda: running[0] > 0))
    if caps.changes:
        vt.spawn("capacities", capacity_changes)
    vt.run()
    worker_stats = [core.finish() for core in workers]
    result = agg.result()
    agg_stats = agg.stats()
    source_stats = [stats[s] for s in range(len(cores))]
    duration_s = max(max(s.end_ts for s in source_stats) - t0, 1e-9)
    distinct = (int(np.count_nonzero(np.bincount(inp.key_ids, minlength=len(inp.keys))))
                if counts_input_keys(topo) else None)  # (the result's keys otherwise)
    measured = measurements(topo, caps, inp.n, duration_s, 0.0, source_stats, worker_stats, result,
                            agg_stats, distinct, engine="sim")
    return measured, result, agg_stats
