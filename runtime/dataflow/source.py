"""A source: hash, route with its own grouping, send with backpressure.

``SourceCore`` is the plain class (no Ray). For every micro-batch of its shard
(``run.batch`` messages) it hashes the keys (``runtime.hashing``), routes them
with its *own* grouping instance (seed ``run.seed + index``), splits the batch
into per-worker sub-batches, queues each in its worker's outbox
(``runtime.dataflow.outbox``) and sends through a ``Transport`` while the worker has fewer than ``run.max_inflight``
unacknowledged calls. One call carries every sub-batch queued for that worker,
up to ``run.call_messages`` messages (``Part.join``: one Arrow batch, one
segmented ``Tag``), so a worker that fell behind by a few batches catches up
in one actor call instead of one per micro-batch; each sub-batch of a call is
acknowledged to the grouping as its own. A stopped or slow worker blocks its
source only once it has more than ``max_inflight + outbox`` (``outbox``
defaults to ``max_inflight``) batches' worth of messages unacknowledged, in
flight or queued - bounded memory, never a growing pile - and until then the
other workers keep being fed instead of idling behind it (head-of-line
blocking: a worker stopped by the duty-cycle throttler for 70 ms would
otherwise stall every worker of that source). A call holds at most ``CALL_S``
(0.1 s) of the worker's work too: the source measures from its acks how fast
each worker drains its messages (``runtime.dataflow.backpressure``), so a slow
worker's calls, acks and load reports are as frequent as a fast one's.
Every ack goes to ``grouping.on_ack(worker, signal, acked)`` as soon as it is
seen: CG moves virtual workers on piggybacked signals, FISH learns service
times from ack timings through the grouping's clock. The source never reads
the configured capacities.

A source *behind* its input (unpaced, or paced and late) routes several
micro-batches per *step*, up to ``STEP_MESSAGES`` (8,192) and the room below
every worker's memory bound: it hashes them, splits them by worker (one
``take`` per worker) and polls acks once for the step instead of once per
batch. The grouping still routes each batch alone and the replay log keeps
one entry per (batch, worker), so routing decisions, replay and results are
those of one batch per step. A step right after one that had to wait for a
worker (backpressure: the workers set the pace, not the source's CPU) and
any step with ``behind_linger_s`` 0 take one batch.

``run.rate`` (messages/s over all sources) is honoured by pacing each source at
``rate / sources`` on its own clock (``Pacer``). A message's latency starts when its
batch was due: its scheduled time when paced (a source that falls behind or
is blocked by backpressure does not hide that time: no coordinated
omission), or when the source took it from its shard at ``rate = 0``.

Reliability (``runtime.dataflow.reliability``, docs/reliability.md): batches are
numbered in shard order; every routed sub-batch is kept in a ``ReplayLog``
until the worker flush holding it is committed. When a worker dies (a send
fails with ``WorkerLost``, or the driver calls ``notify_worker_failed``) the
source fences it at the aggregator (``control.fence_worker`` -> its final
committed flush), removes it from the grouping and re-routes to live workers
exactly the sub-batches that flush does not cover. At the end of the stream it
asks the workers it still holds data for to commit (``control.commit``), so
when ``run`` returns nothing of this source is uncommitted. A restarted
source (``epoch`` > 0) resumes with a ``ResumePlan``: it skips what is
committed or processed and re-sends only the rest. The source's side of it -
membership, what to replay, when a failure is recovered, the resume - is
``runtime.dataflow.recovery``.

The Ray edge is ``actors.source.SourceActor`` (``source-<i>``); the
fault explorer (``runtime.sim.explore``) drives it in-process with its own transport
and a virtual clock.
"""

from __future__ import annotations

import collections
import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from runtime.dataflow.messages import SourceProgress, SourceStats
from runtime.dataflow.outbox import Outboxes
from runtime.dataflow.recovery import FailureLog, Membership, Resume, take_lost
from runtime.dataflow.reliability import (
    IDX_DTYPE,
    Entry,
    Part,
    ReplayLog,
    ResumePlan,
    WorkerLost,
    take,
)
from runtime.dataflow.settings import SourceSettings
from runtime.grouping.coordination import FIRST_PLAN_S, RoutedMeter, RoutedReport
from runtime.hashing import hash_arrow

Clock = Callable[[], float]

#: longest a source blocks on acks before looking at failure notices again
WAIT_SLICE_S = 0.25
#: a source blocked by backpressure this long asks the aggregator what is
#: committed (the acks that would tell it come only from the worker it waits on)
COMMIT_POLL_S = 0.5
#: most messages a source behind its input routes in one step (whole
#: micro-batches): one hash, split and ack poll for several batches
STEP_MESSAGES = 8192


class SourceFenced(RuntimeError):
    """A newer incarnation of this source exists: this one must stop."""


class Transport(Protocol):
    """How a source talks to workers (Ray object refs, or direct calls in tests)."""

    def send(self, worker: int, parts: list[Part]) -> Any:
        """Start processing sub-batches (one call); returns a token for ``wait``."""

    def wait(self, tokens: Sequence[Any], timeout: float | None) -> list[tuple[Any, Any]]:
        """Some finished tokens with their acks - or a ``WorkerLost`` instead of the
        ack when the worker died (at least one unless ``timeout`` expires)."""


class Control(Protocol):
    """Failure handling calls (the aggregator and workers; direct calls in tests)."""

    def fence_worker(self, worker: int, source: int) -> tuple[int, list[tuple[int, np.ndarray]]]:
        """Declare ``worker`` dead at the aggregator; its final committed flush and
        the ``(batch, idx)`` of ``source`` its committed flushes hold."""

    def commit(self, workers: Sequence[int]) -> dict[int, Any]:
        """Make each worker flush and wait for the commit: worker -> committed
        flush sequence, or a ``WorkerLost``."""

    def report_routed(self, source: int, report: RoutedReport) -> None:
        """A coordinated scheme's load report (``RoutedMeter.take``): what this
        source routed per VW; without waiting for the answer (``poll_table``)."""

    def poll_table(self, timeout: float | None = 0.0) -> Any:
        """The controller's table answered to the latest ``report_routed``, once
        it is there (else None after ``timeout`` seconds; None = wait for it)."""

    def committed(self) -> dict[int, int]:
        """Every worker's latest committed flush sequence (the aggregator's)."""


def as_record_batch(table: pa.Table | pa.RecordBatch) -> pa.RecordBatch:
    """A batch of the shard as one record batch (its columns contiguous)."""
    if isinstance(table, pa.RecordBatch):
        return table
    table = table.combine_chunks()  # one chunk per column: one batch
    batches = table.to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def rebatch(blocks: Iterable[pa.Table], rows: int) -> Iterator[pa.Table]:
    """``blocks`` (a stream, in order) cut into tables of ``rows`` rows, the
    last one shorter: the boundaries depend on the stream alone, not on how
    it is split into blocks. Zero-copy, except a batch across two blocks."""
    tail: pa.Table | None = None
    for block in blocks:
        if tail is not None:
            block = pa.concat_tables([tail, block])
        whole = block.num_rows - block.num_rows % rows
        for off in range(0, whole, rows):
            yield block.slice(off, rows)
        tail = block.slice(whole) if whole < block.num_rows else None
    if tail is not None:
        yield tail


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


class Pacer:
    """``run.rate`` for one source: the batch after ``routed`` messages is due
    at ``start + routed / rate``, even when the source is late (no coordinated
    omission); a source ahead of that schedule sleeps (``wait_until_due``). At
    ``rate = 0`` nothing is paced."""

    def __init__(self, rate_per_source: float, clock: Clock,
                 sleep: Callable[[float], None]) -> None:
        self.rate = float(rate_per_source)
        self.clock = clock
        self.sleep = sleep
        self.start = 0.0

    def due(self, routed: int, handed: float | None) -> float | None:
        """When the next batch was due (``handed``, a live stream's handover
        time, when not paced; None: when the source takes it)."""
        return self.start + routed / self.rate if self.rate > 0 else handed

    def behind(self, routed: int) -> bool:
        """The batch after ``routed`` messages is already due: unpaced (the input
        is there to take), or paced and late."""
        return self.rate <= 0 or self.start + routed / self.rate <= self.clock()

    def wait_until_due(self, routed: int, deadlines: Callable[[], Iterable[float]],
                       send_due: Callable[[], None],
                       take_acks: Callable[[float], bool] | None = None) -> None:
        """Wait until the batch after ``routed`` messages is due, waking at the
        earliest of ``deadlines()`` (a lingering outbox) to ``send_due()``.
        ``take_acks(timeout)`` waits instead of sleeping while calls are in
        flight: it takes the acks that come within ``timeout`` (returning at
        the first) and sends what they let go; False when nothing is in
        flight (then the pacer sleeps)."""
        if self.rate <= 0:
            return
        ahead = self.start + routed / self.rate - self.clock()
        if ahead <= 0:
            return
        end = self.clock() + ahead
        while (now := self.clock()) < end:
            linger = min(deadlines(), default=math.inf)  # when an outbox is due
            until = min(linger, end)
            if until > now and (take_acks is None or not take_acks(until - now)):
                self.sleep(until - now)
            if self.clock() >= linger:
                send_due()  # one is due (the others go early: no extra wake-up)


class LoadReports:
    """A coordinated scheme's load reports: what this source routed per VW
    (``RoutedMeter``), sent to the controller (``control.report_routed``) every
    ``report_every_s``, and at the end. Until the controller's first plan
    reaches the source (``planned``), for at most ``report_every_s``, every
    ``FIRST_PLAN_S``: the answer to a report carries the table, and a source
    paced at one batch every half second would otherwise route its second
    batch, too, on the table it started with (on a cluster of slow and fast
    workers, a second of blind routing that the slow ones take seconds to
    work off)."""

    def __init__(self, source: int, n_virtual: int, control: Control,
                 report_every_s: float, clock: Clock) -> None:
        self.source = source
        self.control = control
        self.report_every_s = float(report_every_s)
        self.clock = clock
        self.meter = RoutedMeter(n_virtual, clock())
        self.sent = 0
        self.started = self.meter.since
        self.planned = False  # whether a table of the controller's reached the source

    def start(self, t: float) -> None:
        """The first window starts at ``t`` (the run's start)."""
        self.meter.since = self.started = t

    def early(self) -> bool:
        """Whether reports still go every ``FIRST_PLAN_S`` (see the class)."""
        return not self.planned and self.meter.since < self.started + self.report_every_s

    def deadline(self) -> float:
        """When the next report is due."""
        return self.meter.since + (FIRST_PLAN_S if self.early() else self.report_every_s)

    def send_due(self, vws: np.ndarray | None = None, final: bool = False,
                 queued: np.ndarray | None = None, spill: np.ndarray | None = None,
                 left: Callable[[], np.ndarray] | None = None) -> None:
        """Count ``vws`` (the VW of each message just routed) and ``spill``
        (``RoutedReport``); send the report if it is due, or ``final``, or
        with ``queued`` (the source has routed its whole input: what its
        outboxes hold per VW; ``RoutedReport``). ``left``: the source is
        draining, and a report that is due carries what its outboxes still
        hold (``left()``) as its ``queued``."""
        routed_all = queued is not None
        self.meter.routed(vws, spill)
        now = self.clock()
        if final or routed_all or now >= self.deadline():
            self.sent += 1
            if queued is None and left is not None and not final:
                queued = left()
            self.control.report_routed(self.source, self.meter.take(now, final, queued))

    def answer(self, timeout: float | None = 0.0) -> Any:
        """The controller's table answered to the latest report, once it is
        there (else None after ``timeout`` s; None = wait for it)."""
        return self.control.poll_table(timeout)


class SourceCore:
    """One source's routing loop; see the module docstring.

    It routes and orchestrates; its parts each do one job: ``outboxes``
    (``runtime.dataflow.outbox``: per-worker queues, calls in flight, the call cap,
    linger and the memory bound), ``pacer`` (``run.rate``), ``members`` and
    ``failures`` (``runtime.dataflow.recovery``: the live workers, the replays of a dead
    one's sub-batches), ``log`` (``runtime.dataflow.reliability.ReplayLog``: every
    sub-batch until committed), ``load_reports`` (coordinated schemes) and,
    after a restart, ``resume``."""

    def __init__(
        self,
        index: int,
        grouping: Any,
        transport: Transport,
        settings: SourceSettings,
        *,
        clock: Clock = time.time,
        sleep: Callable[[float], None] = time.sleep,
        t0: float | None = None,
        control: Control | None = None,
        epoch: int = 0,
        dead_workers: Iterable[int] = (),
    ) -> None:
        """``settings``: this source's (``runtime.dataflow.settings``);
        ``epoch`` > 0: a restart, ``dead_workers`` the workers it must not
        route to (fenced before it started)."""
        st = self.settings = settings
        self.index = int(index)
        self.grouping = grouping
        self.transport = transport
        self.n_workers = int(st.n_workers)
        self.key = st.key
        self.clock = clock
        self.sleep = sleep
        self.t0 = t0
        self.control = control
        self.epoch = int(epoch)
        self.outboxes = Outboxes(
            self.n_workers, max_inflight=int(st.max_inflight),
            outbox_batches=int(st.max_inflight) if st.outbox is None else int(st.outbox),
            call_messages=st.call_messages, linger_s=st.linger_s, clock=clock,
            behind_linger_s=st.behind_linger_s)
        self.pacer = Pacer(st.rate_per_source, clock, sleep)
        self.log = ReplayLog()
        self.members = Membership(self.n_workers, grouping, dead_workers)
        self.failures = FailureLog()
        self.resume: Resume | None = None  # a restart's pass over what it sent before
        self.next_batch = 0  # sequence number of the next batch of the shard
        self.done = False
        self.acks_done_ts: float | None = None  # the stream's last ack (before commits)
        # -- stats
        self.routed = 0  # messages sent to workers
        self.acked = 0
        self.batches = 0
        self.sent_per_worker = np.zeros(self.n_workers, dtype=np.int64)
        self.acked_per_worker = np.zeros(self.n_workers, dtype=np.int64)
        self.lat_sum_s = 0.0
        self.route_s = 0.0
        self.wait_s = 0.0
        self.retained_peak = 0  # most messages held in the replay log at once
        self.retained_peak_bytes = 0  # and bytes
        self.rerouted = 0  # unsent messages moved by a new VW table (coordinated schemes)
        self.blocked = False  # the last step waited for a worker to get below its memory bound
        self._step: list[tuple[pa.Table, float | None, int]] = []  # run's batches not routed yet
        self._step_rows = 0  # their messages
        self.vw_every_s = float(st.vw_every_s)
        self.vw_history: list[tuple[float, list[int]]] = []
        self._next_vw = -np.inf
        self.load_reports = (LoadReports(self.index, grouping.n_virtual, control,
                                         st.report_every_s, clock)
                             if grouping.coordinated and control is not None else None)
        self._draining = False  # between the report of its whole input routed and the final
        # reference schemes (WRR) are told the configured capacities as they change
        self._cap_changes: list[tuple[float, int, float]] = []
        if self.grouping.knows_capacities:
            for w, c in enumerate(st.capacities or [1.0] * self.n_workers):
                self.grouping.on_capacity(w, c)
            self._cap_changes = sorted((float(a), int(w), float(c))
                                       for a, w, c in st.capacity_changes)

    # ------------------------------------------------------------------ acks
    def _handle(self, done: list[tuple[Any, Any]]) -> None:
        for token, ack in done:
            call = self.outboxes.inflight.get(token)
            if call is None:  # its worker was declared dead meanwhile
                continue
            if isinstance(ack, BaseException):
                if not isinstance(ack, WorkerLost):
                    raise ack
                if call.worker not in self.members.live:  # sent after it departed: a bug,
                    raise RuntimeError(  # said loudly (its messages would wait forever)
                        f"source-{self.index}: scheme {self.grouping.name!r} routed to "
                        f"worker {call.worker} after it departed")
                self._worker_lost(call.worker, str(ack))  # drops the call with the others
                continue
            if ack.rejected:
                raise SourceFenced(f"source-{self.index} epoch {self.epoch} was fenced off")
            self.outboxes.acked(token, self.clock())
            n = ack.acked
            self.acked += n
            self.acked_per_worker[call.worker] += n
            self.lat_sum_s += ack.lat_sum_s
            for entry in call.entries:
                self.log.acked(entry, ack.flush_seq, ack.committed_seq)
                if entry.replay:
                    self.failures.settle([entry], self.clock())
            self.grouping.on_ack(ack.worker, ack.signal, n)
            self._take_table(ack.table)
        self._record_vw()

    def _acks_within(self, timeout: float) -> bool:
        """Take the acks that come within ``timeout`` (returning at the first);
        False, without waiting, when nothing is in flight."""
        if not self.outboxes.inflight:
            return False
        self._handle(self.transport.wait(list(self.outboxes.inflight), timeout))
        return True

    def _wait_some(self, timeout: float | None = None) -> None:
        self._report_load()  # a blocked source still reports (what it routed)
        self._check_notices()
        t = self.clock()
        if self._acks_within(WAIT_SLICE_S if timeout is None else timeout):
            self.wait_s += self.clock() - t
            self._check_notices()

    # ------------------------------------------------------------------ failures
    def notify_worker_failed(self, worker: int) -> None:
        """Thread-safe: the driver saw ``worker`` die; handled by the streaming thread."""
        self.members.notify_failed(worker)

    def notify_worker_added(self, worker: int) -> None:
        """Thread-safe: ``worker`` joined (elasticity); routed to from the next batch."""
        self.members.notify_added(worker)

    def _check_notices(self) -> None:
        if self.load_reports is not None:
            self._take_table(self.load_reports.answer())
        if self._cap_changes and self.t0 is not None:
            now_s = self.clock() - self.t0
            while self._cap_changes and self._cap_changes[0][0] <= now_s:
                _, w, c = self._cap_changes.pop(0)
                self.grouping.on_capacity(w, c)
        failed, added = self.members.take_notices()
        for w in added:
            self.members.add(w, self.clock())
        for w in failed:
            self._worker_lost(w, "notified")

    def _worker_lost(self, w: int, cause: str = "") -> None:
        """Fence ``w``, stop routing to it, re-route what its committed flushes miss."""
        if w not in self.members.live:
            return
        if len(self.members.live) == 1:
            raise RuntimeError(f"source-{self.index}: the last live worker ({w}) died: {cause}")
        detected = self.clock()
        committed, held = (self.control.fence_worker(w, self.index)
                           if self.control is not None else (0, []))
        if self.resume is not None:
            self.resume.worker_lost(w, committed)
        self.members.remove(w)
        self.outboxes.forget(w)
        loss = take_lost(self.log, w, committed, held)
        self.acked += loss.committed_unacked
        self.acked -= loss.acked_again
        self.acked_per_worker[w] -= loss.acked_again
        replays = [self._route_entries([(e.batch, e.idx, e.emit_ts)], e.records, e.hashes,
                                       replay=True) for e in loss.lost]
        self.failures.lost({
            "worker": w, "cause": cause, "detected_ts": detected, "committed_seq": committed,
            "replayed_batches": len({e.batch for e in loss.lost}),
            "replayed_subbatches": len(loss.lost),
            "replayed_messages": int(sum(len(e.idx) for e in loss.lost)),
            "replayed_after_ack": int(loss.acked_again),
        }, loss, replays, self.clock())
        self._flush()

    def _split_queued(self, w: int, e: Entry) -> list[Entry] | None:
        """A sub-batch still in worker ``w``'s outbox, split by where its VWs are
        now (None: all still on ``w``)."""
        dest = self.grouping.owner_of(e.vws) if e.vws is not None else None
        if dest is None or (dest == w).all():
            return None
        self.log.remove(e)
        parts = [self.log.add(e.subset(np.flatnonzero(dest == u), int(u)))
                 for u in np.unique(dest)]
        for part in parts:
            if part.worker != w:
                self.sent_per_worker[w] -= len(part.idx)
                self.sent_per_worker[part.worker] += len(part.idx)
                self.rerouted += len(part.idx)
        if e.replay:  # a death waiting for this replay now waits for its parts
            self.failures.split(e, parts)
        return parts

    def _take_table(self, table: Any) -> None:
        """A coordinated scheme's table (on an ack, or the answer to a load
        report): a newer one re-routes what the outboxes still hold (routed,
        never sent); sent sub-batches stay (no message migrates)."""
        if table is not None and self.grouping.on_table(table):
            if self.load_reports is not None:
                self.load_reports.planned = True
            for part in self.outboxes.reroute(self._split_queued):
                self.outboxes.queue(part)
            self._flush()

    def _report_load(self, vws: np.ndarray | None = None, final: bool = False,
                     routed_all: bool = False) -> None:
        """Coordinated schemes: a load report when due (``LoadReports``); the
        controller's answer is its latest table. ``routed_all``: the source
        has routed its whole input, and its outboxes hold what the workers
        have left to do of it - the answer is planned for the workers to
        finish together (acg's end plan), and the source waits for it and
        re-routes its outboxes before it drains them (the controller plans
        until every source's has come). The ``final`` report, once drained,
        says this source's stream ended, and the source waits for (and
        adopts) the answer: every source ends on the controller's last
        table."""
        if self.load_reports is None:
            return
        n_virtual = self.grouping.n_virtual
        queued = self.outboxes.queued_vws(n_virtual) if routed_all else None
        # draining: each report says what the outboxes still hold - the end
        # plan comes when the last source has routed its whole input, which
        # may be seconds after this one did (the sources' shares of a finite
        # input end apart), and plans these outboxes as they are then
        left = functools.partial(self.outboxes.queued_vws, n_virtual) if self._draining else None
        self.load_reports.send_due(vws, final, queued, self.grouping.take_spill(), left)
        if final or routed_all:
            self._take_table(self.load_reports.answer(timeout=None))

    def _record_vw(self, force: bool = False) -> None:
        if self.t0 is None:
            return
        now = self.clock()
        if force or now >= self._next_vw:
            per = self.grouping.vw_per_worker()
            if per is None:
                return
            self._next_vw = now + self.vw_every_s
            self.vw_history.append((now - self.t0, [int(x) for x in per]))

    # ------------------------------------------------------------------ main loop
    def _route_entries(self, batches: Sequence[tuple[int, np.ndarray, float]],
                       records: pa.RecordBatch, hashes: np.ndarray,
                       replay: bool = False) -> list[Entry]:
        """Route one step's micro-batches: ``batches`` is each one's ``(batch,
        positions, emit time)``, ``records`` and their key ``hashes`` hold their
        messages in that order. Each batch is routed as if alone (the grouping
        sees the same calls); the step is split by worker once and queues one
        retained ``Entry`` per (batch, destination worker): the entries of a
        worker are slices of one ``take`` (a call copies what it sends:
        ``Part.join``; the take lives until its last slice is released, so
        memory may exceed the log's count by one step per worker)."""
        sizes = [len(pos) for _, pos, _ in batches]
        cuts = np.cumsum([0, *sizes])
        vws = None
        if self.grouping.coordinated:  # keep each message's VW: a new table re-routes
            self.grouping.on_held(self.outboxes.held_n(), self.outboxes.drain_rates.rate,
                                  self.pacer.behind(self.routed + int(cuts[-1])),
                                  self.outboxes.drain_bounds(self.clock()))
            vws = _concat([self.grouping.route_virtual(hashes[cuts[j]:cuts[j + 1]])
                           for j in range(len(batches))])
            dest = np.asarray(self.grouping.owner_of(vws), dtype=np.int64)
            self._report_load(vws)
        else:
            dest = np.asarray(_concat([self.grouping.route(hashes[cuts[j]:cuts[j + 1]])
                                       for j in range(len(batches))]), dtype=np.int64)
        k = len(batches)
        cell = dest * k + np.repeat(np.arange(k), sizes) if k > 1 else dest
        cells = self.n_workers * k  # (worker, batch) cells, worker-major
        order = np.argsort(cell.astype(np.uint16) if cells <= 1 << 16 else cell, kind="stable")
        counts = np.bincount(cell, minlength=cells).reshape(self.n_workers, k)
        per_worker = counts.sum(axis=1)
        ends = np.cumsum(per_worker)
        pos = _concat([p for _, p, _ in batches])
        order_arrow = pa.array(order)  # each worker's take: a slice of it
        out = []
        # (the loop runs per worker and batch: plain ints, not numpy scalars)
        for w, (row, n, end) in enumerate(zip(counts.tolist(), per_worker.tolist(),
                                              ends.tolist(), strict=True)):
            if not n:
                continue
            sel = order[end - n:end]
            recs, hs, ps = take(records, order_arrow.slice(end - n, n)), hashes[sel], pos[sel]
            vv = None if vws is None else vws[sel]
            cols = [j for j, c in enumerate(row) if c]
            whole = len(cols) == 1  # one entry: no slicing
            off = 0
            for j in cols:
                c = row[j]
                b, _, emit = batches[j]
                e = self.log.add(Entry(
                    w, b, ps[off:off + c], recs if whole else recs.slice(off, c),
                    hs[off:off + c], emit, replay=replay,
                    vws=None if vv is None else vv[off:off + c]))
                self.outboxes.queue(e)
                out.append(e)
                off += c
        self.sent_per_worker += per_worker
        self.retained_peak = max(self.retained_peak, self.log.messages)
        self.retained_peak_bytes = max(self.retained_peak_bytes, self.log.nbytes)
        return out

    def send_batch(self, table: pa.Table, emit_ts: float | None = None, *,
                   batch: int | None = None, idx: np.ndarray | None = None) -> None:
        """Route one micro-batch (``send_step`` of one).

        ``emit_ts``: when the batch was due (its messages' latency starts
        there); default now. ``batch``: its sequence number (default: the next
        one); ``idx``: the positions of ``table``'s rows in that batch
        (default: all, in order).
        """
        self.send_step([(table, emit_ts, batch)], idx)

    def send_step(self, batches: Sequence[tuple[pa.Table, float | None, int | None]],
                  idx: np.ndarray | None = None) -> None:
        """Route micro-batches ``(table, emit_ts, batch)`` in one step, queue
        their per-worker sub-batches in the workers' outboxes and send what the
        in-flight windows allow (time spent in an outbox is latency). One step
        hashes and splits its batches together and polls acks once: a source
        behind its input routes several per step (``STEP_MESSAGES``).
        ``idx`` (one batch only): the positions of its rows in that batch."""
        t = self.clock()
        todo = []
        for table, emit_ts, batch in batches:
            if table.num_rows == 0:
                continue
            if batch is None:
                batch = self.next_batch
                self.next_batch += 1
            pos = (np.arange(table.num_rows, dtype=IDX_DTYPE) if idx is None
                   else np.asarray(idx, IDX_DTYPE))
            todo.append((table, (batch, pos, t if emit_ts is None else emit_ts)))
        if not todo:
            return
        if self.grouping.coordinated and not self.pacer.behind(
                self.routed + sum(tb.num_rows for tb, _ in todo)):
            # a source keeping up with its input takes the acks already there
            # first: the routing's admission reads what each worker still holds
            # (and an ack may carry a newer table); one behind routes at once
            self._wait_some(timeout=0)
        tables = [tb for tb, _ in todo]
        records = as_record_batch(tables[0] if len(tables) == 1 else pa.concat_tables(tables))
        hashes = hash_arrow(records.column(self.key))  # the only time a key is hashed
        self._route_entries([item for _, item in todo], records, hashes)
        self.route_s += self.clock() - t
        self.routed += records.num_rows
        self.batches += len(todo)
        self.outboxes.saw_batch(max(tb.num_rows for tb in tables))
        self._flush()
        # backpressure: the memory bound blocks this source on a worker that
        # holds too much, while the others keep being fed instead of idling
        # behind it
        blocked = self.clock()
        self.blocked = False
        while self.outboxes.over_bound():
            self.blocked = True
            self._flush(force=True)  # blocked: nothing lingers
            self._wait_some()
            blocked = self._learn_commits(blocked)
        # opportunistic: take acks that are already there, without blocking
        self._wait_some(timeout=0)
        self._flush()

    def _learn_commits(self, since: float) -> float:
        """Blocked since ``since``: every ``COMMIT_POLL_S``, release what the
        aggregator committed (the other workers get no calls, so no acks, while
        this source waits: without it their processed messages would stay in the
        replay log for as long as the stall lasts)."""
        now = self.clock()
        if self.control is None or now - since < COMMIT_POLL_S:
            return since
        for w, seq in self.control.committed().items():
            if w in self.members.live:
                self.log.committed(int(w), int(seq))
        return now

    def _flush(self, force: bool = False) -> None:
        """Send what the outboxes let go (``Outboxes.flush``), each call one
        ``Part`` tagged with this source's watermark."""
        watermark = self.log.watermark(self.next_batch)

        def send(w: int, entries: list[Entry]) -> Any:
            return self.transport.send(w, [Part.join(self.index, self.epoch, watermark,
                                                     entries)])

        self.outboxes.flush(send, force, behind=self.pacer.behind(self.routed),
                            next_data_at=self.pacer.due(self.routed, None))

    def idle(self, timeout: float) -> None:
        """Nothing to route yet (a live stream between micro-batches): for at
        most ``timeout`` s take acks and send what the outboxes hold, so no
        routed message waits for the next data - nor a step being filled (a
        shard whose next chunk is not in yet)."""
        self._send()
        if self.outboxes.busy():
            self._flush(force=True)  # no data to wait for: nothing lingers
            self._wait_some(timeout)
            self._flush(force=True)
        else:
            self._wait_some(0)  # load reports and notices still go on
            self.sleep(timeout)

    def run(self, batches: Iterable[pa.Table | tuple[pa.Table, float]],
            plan: ResumePlan | None = None) -> SourceStats:
        """Stream ``batches`` (the shard from its start); ``plan``: a restarted
        source's resume plan (batches before ``plan.start_batch`` are skipped).
        A live stream's batches are ``(table, handed_ts)``: its messages'
        latency starts when Spark handed them over."""
        start = self.clock()
        if self.t0 is None:
            self.t0 = start
        self.pacer.start = start
        if self.load_reports is not None:  # the reports' windows start with the run
            self.load_reports.start(max(start, self.t0))
        self._record_vw(force=True)
        resume = self.resume = Resume(plan) if plan is not None else None
        room = 0  # most messages the step being filled may take
        for b, item in enumerate(batches):
            table, handed = item if isinstance(item, tuple) else (item, None)
            if resume is not None and resume.covers(b):
                self._send()
                self._check_notices()
                if not resume.skips(b):
                    self._resume_batch(resume, b, table, self.pacer.due(self.routed, handed))
                self.next_batch = b + 1
                self._pace()
                continue
            if not self._step:
                room = self._step_room()
            # paced: the batch was due at its scheduled time, even if we are late
            self._step.append((table, self.pacer.due(self.routed + self._step_rows, handed), b))
            self._step_rows += table.num_rows
            # a source behind its input takes the batches that are due in one
            # step, up to its room; a live stream's batch goes at once
            if (handed is None and self._step_rows + table.num_rows <= room
                    and self.pacer.behind(self.routed + self._step_rows)):
                continue
            self._send()
            self._pace()
        self._send()
        self._report_load(routed_all=True)  # the answer re-routes the outboxes for the end
        self._draining = True
        self.drain()
        self._draining = False
        self._report_load(final=True)
        self._record_vw(force=True)
        self.done = True
        return self.stats(start)

    def _send(self) -> None:
        """Route the step ``run`` is filling (``_step``), if any."""
        step, self._step, self._step_rows = self._step, [], 0
        if step:
            self._check_notices()
            self.send_step(step)
            self.next_batch = step[-1][2] + 1

    def _step_room(self) -> int:
        """Most messages the next step may route: ``STEP_MESSAGES``, and no
        more than any worker can take below its memory bound (the bound holds
        as with one batch per step: a step of one batch may overshoot it).
        None beyond one batch when outboxes never linger behind the input
        (``behind_linger_s`` 0: each batch is sent on its own), nor after a
        step that had to wait for a worker (the workers, not the source's
        CPU, set the pace: a source routes, then takes acks and tables, batch
        by batch)."""
        if self.outboxes.behind_linger_s <= 0 or self.blocked:
            return 0
        room = (self.outboxes.bounds() - self.outboxes.held_n()).min()
        return int(min(STEP_MESSAGES, room))

    def _pace(self) -> None:
        """Wait until the next batch is due (``run.rate``), sending meanwhile
        lingering sub-batches, and a coordinated scheme's load reports while
        they are early (``LoadReports.early``: until the first plan reached
        the source - a source paced at one batch every half second must not
        hold the controller's first plan, nor wait for it, until its second
        batch). Later reports go as the source routes: sent while it sleeps, they would
        cover one batch, then two, or none, and the controller would read that
        as loads that jump (on the stress grid at 0.8 load that doubled acg's
        moves and its replication)."""
        reports = self.load_reports
        if reports is None or not reports.early():
            self.pacer.wait_until_due(self.routed, self.outboxes.linger_deadlines,
                                      lambda: self._flush(force=True), self._take_acks)
            return

        def deadlines() -> Iterable[float]:
            if reports.early():
                yield reports.deadline()
            yield from self.outboxes.linger_deadlines()

        def send_due() -> None:
            self._flush(force=True)
            self._report_load()
            self._check_notices()

        self.pacer.wait_until_due(self.routed, deadlines, send_due, self._take_acks)

    def _take_acks(self, timeout: float) -> bool:
        """Between paced batches: take the acks that come within ``timeout``
        (returning at the first) and send what they let go, so a worker whose
        calls are back gets its next one now, not at the next batch (a slow
        worker's calls hold ``CALL_S`` of its work: at a batch every 160 ms,
        two calls per batch starved it while its outbox grew). False, without
        waiting, when nothing is in flight. No load report goes from here
        (``_pace``)."""
        if not self._acks_within(timeout):
            return False
        self._check_notices()
        self._flush()
        return True

    def _resume_batch(self, resume: Resume, b: int, table: pa.Table,
                      due: float | None) -> None:
        """Batch ``b``, which a dead incarnation may have sent: retain what live
        workers hold uncommitted, send only the rest."""
        records = as_record_batch(table)
        hashes = hash_arrow(records.column(self.key))
        emit = self.clock() if due is None else due
        todo, retained = resume.split(b, records, hashes, emit, self.members.live)
        for e in retained:
            self.log.add(e)
        if len(todo):
            self.send_batch(table.take(pa.array(todo)), due, batch=b, idx=todo)

    def drain(self) -> None:
        """End of stream: wait for every ack, then until every sub-batch this
        source sent is committed (replaying for workers that die meanwhile)."""
        while True:
            while self.outboxes.busy():
                self._flush(force=True)
                self._wait_some()
            if self.acks_done_ts is None:
                self.acks_done_ts = self.clock()
            if self.control is None or not len(self.log):
                return
            for w, r in self.control.commit(self.log.pending_workers()).items():
                if isinstance(r, WorkerLost):
                    self._worker_lost(w, str(r))
                else:
                    self.log.committed(w, int(r))
            self._check_notices()

    def progress(self) -> SourceProgress:
        return SourceProgress(source=self.index, routed=self.routed, acked=self.acked,
                              done=self.done, epoch=self.epoch, retained=self.log.messages,
                              failures=[dict(f) for f in self.failures.records])

    def stats(self, start: float | None = None) -> SourceStats:
        g = self.grouping.stats()
        return SourceStats(
            source=self.index,
            routed=self.routed,
            acked=self.acked,
            batches=self.batches,
            calls=self.outboxes.calls,
            sent_per_worker=self.sent_per_worker.tolist(),
            grouping=g,
            migrations=int(g.get("migrations", 0)),
            signals=dict(g.get("signals", {"increase": 0, "decrease": 0})),
            route_s=self.route_s,
            wait_s=self.wait_s,
            elapsed_s=(self.clock() - start) if start is not None else None,
            end_ts=self.acks_done_ts if self.acks_done_ts is not None else self.clock(),
            committed_ts=self.clock(),
            vw_history=self.vw_history,
            epoch=self.epoch,
            failures=self.failures.records,
            resume=self.resume.stats if self.resume is not None else None,
            live_workers=sorted(self.members.live),
            retained_peak_messages=self.retained_peak,
            retained_peak_bytes=self.retained_peak_bytes,
            joins=self.members.joins,
            rerouted_messages=self.rerouted,
        )


class Cut:
    """A checkpoint's cut in a live stream (``SourceActor.cut``): the source sets
    ``reached`` once everything fed before it is committed, then routes nothing
    fed after it until ``go`` - the aggregator's state then holds exactly what
    came before the cut."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()


class StreamInbox:
    """A live stream's micro-batches waiting at a source (thread-safe).

    ``put`` blocks while ``max_rows`` rows or more are waiting (Spark's next
    micro-batch waits with it: bounded memory when the input outpaces the
    cluster); a table larger than the bound still goes in once the inbox is
    empty. ``close`` ends the stream: ``get`` then returns ``None`` once the
    inbox is empty."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = int(max_rows)
        self.rows = 0
        self.closed = False
        self._q: collections.deque[tuple[pa.Table, float]] = collections.deque()
        self._cv = threading.Condition()

    def put(self, table: pa.Table | Cut, handed_ts: float = 0.0) -> None:
        """Queue a table - or a ``Cut`` (never blocks)."""
        if isinstance(table, Cut):
            with self._cv:
                self._q.append((table, handed_ts))  # type: ignore[arg-type]
                self._cv.notify_all()
            return
        with self._cv:
            if self.closed:
                raise RuntimeError("StreamInbox.put: the stream has ended")
            self._cv.wait_for(lambda: self.rows == 0 or self.rows < self.max_rows)
            self._q.append((table, handed_ts))
            self.rows += table.num_rows
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()

    def get(self, timeout: float) -> tuple[pa.Table, float] | None | bool:
        """The oldest ``(table, handed_ts)``; ``None`` at the end of the stream;
        ``False`` if nothing came within ``timeout`` s."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._q or self.closed, timeout):
                return False
            if not self._q:
                return None
            table, ts = self._q.popleft()
            if not isinstance(table, Cut):
                self.rows -= table.num_rows
            self._cv.notify_all()
            return table, ts


#: a live stream's source waits this long for data before it takes acks again
STREAM_POLL_S = 0.02
