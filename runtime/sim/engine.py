"""The discrete-event core of the simulator: sources, FIFO workers, acks.

A queueing model of the real runtime (docs/design.md), simulated at micro-batch
granularity; no I/O, no wall clock, no Ray.

- Stream: as in the real runtime (``actors.spark_input.FeedLoad``), the
  stream is cut in order into blocks of ``shard_block_rows`` (65,536) messages
  dealt round-robin to the sources (block ``j`` to source ``j mod sources``),
  so the sources advance through a time-evolving stream together; each source
  reads its shard in micro-batches of ``run.batch``. (Inputs under one block go
  to source 0 only, as in the real runtime; lower ``shard_block_rows`` to
  spread small inputs.) With ``run.rate > 0`` each source is paced at
  ``rate / sources``: its ``k``-th batch is taken no earlier than
  ``k * batch * sources / rate``; with ``rate = 0`` as fast as backpressure
  allows.
- Source ``s`` routes each batch with its *own* grouping instance
  (``seed = run.seed + s``; local state only, clock = simulated time), splits
  it by worker and queues the sub-batches in per-worker outboxes. Each
  sub-batch is sent as a call of its own when its worker has fewer than
  ``run.max_inflight`` unacknowledged sub-batches from this source. (The real
  source, ``runtime/dataflow/source.py``, coalesces a worker's queued sub-batches into
  one call - ``run.call_messages``, ``run.linger_ms``, the drain-rate cap of
  ``runtime/dataflow/backpressure.py`` - which the simulator does not model.)
  The source takes its next batch only while no outbox holds more than
  ``outbox * run.batch`` messages (``outbox`` defaults to ``max_inflight``;
  a bound in messages, not sub-batches: a worker that receives small
  sub-batches - few virtual workers - does not block the source early);
  otherwise it blocks until that worker acknowledges. When a VW-table scheme
  (ACG) adopts a new table, the sub-batches still in its outboxes go where
  their VWs now are (they were never sent: no message migrates).
- Emit time of a message = when its batch was due at the source, as the real
  source stamps it: with ``run.rate > 0`` the batch's scheduled time
  ``k * batch * sources / rate`` (time a source spends behind schedule or
  blocked by backpressure is latency, no coordinated omission); with
  ``rate = 0`` when the source takes the batch from its shard. Transport
  source -> worker is instantaneous.
- Worker ``w``: one FIFO queue, one message at a time, service time
  ``service_us / capacity_w(t)`` with the capacity of the moment the message
  starts (``workers.changes`` apply at ``at_s``; every throttle mechanism is
  modelled as exact). ``finish_i = max(arrival_i, finish_{i-1}) + service``;
  latency = finish - emit.
- A sub-batch is acknowledged ``ack_delay_s`` after its last message
  finishes; the ack carries the acked count and a load signal.
- Utilization, as the real worker measures it (``runtime/dataflow/worker.py``):
  ``U_w = queue length in batches / queue capacity``, where a sub-batch counts
  from its arrival until its last message finishes and the queue capacity is
  ``min(workers.queue_batches, sources * run.max_inflight)`` batches (the most
  that can ever be queued). Load signals: each worker keeps one
  ``runtime.grouping.signals.LoadSignaler`` per source (configured from the grouping's
  ``busy_above`` / ``idle_below`` / ``slot_s``, e.g. CG), fed ``U_w`` at every
  change and asked ``take_signal`` when a batch of that source finishes, so
  each source gets at most one signal per slot from each worker (simulated
  with one integrating signaler per worker, see ``_WorkerSignals``).
  ``grouping.on_ack(worker, signal, acked)`` runs at the ack's simulated
  time, so ack-timing learners (FISH) see simulated time. Workers signal only
  to schemes that use feedback (``Grouping.uses_feedback``).
- The balancer never reads configured capacities.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.grouping import SCHEMES, Grouping, make_grouping
from runtime.grouping.coordination import FIRST_PLAN_S
from runtime.grouping.signals import LoadSignaler
from runtime.inputs.input_check import SHARD_BLOCK_ROWS
from runtime.sim import kernels

#: default delay between a sub-batch's last finish and its ack at the source
DEFAULT_ACK_DELAY_MS = 1.0
#: key x worker bitmaps (replication, keys per worker) up to this many cells;
#: beyond, distinct (key, worker) pairs are counted by sorting at the end
MAX_SEEN_CELLS = 1 << 28


@dataclass
class SimParams:
    """Everything the engine needs, in engine units (seconds)."""

    n_sources: int
    n_workers: int
    batch: int
    rate: float
    max_inflight: int
    seed: int
    service_us: float
    capacities: list[float]
    changes: list[tuple[float, int, float]] = field(default_factory=list)
    scheme: str = "kg"
    scheme_params: dict[str, Any] = field(default_factory=dict)
    slot_s: float = 0.5
    ack_delay_s: float = DEFAULT_ACK_DELAY_MS / 1e3
    queue_batches: int = 8
    shard_block_rows: int = SHARD_BLOCK_ROWS
    outbox: int | None = None  # sub-batches queued per worker at a source (None: max_inflight)
    report_every_s: float = 1.0  # workers' reports to a coordinator (app.aggregate_every_s)

    @property
    def outbox_max(self) -> int:
        return self.max_inflight if self.outbox is None else self.outbox

    @property
    def outbox_msgs(self) -> int:
        """Messages a source's outbox may hold for one worker before it blocks."""
        return self.outbox_max * self.batch

    @property
    def queue_capacity_batches(self) -> int:
        return min(self.queue_batches, self.n_sources * self.max_inflight)


@dataclass
class EngineResult:
    """Raw outcome of a run (``runtime.sim.summary`` turns it into a report).

    Per-slot arrays are ``[slot, worker]`` over ``ceil(duration / slot_s)``
    slots of ``params.slot_s``, time-averaged over the slot.
    """

    params: SimParams
    n_messages: int
    duration_s: float
    latency_s: np.ndarray  # float32[n], NaN = never processed
    msg_worker: np.ndarray  # int32[n], -1 = never processed
    processed: np.ndarray  # int64[n_workers]
    keys_per_worker: np.ndarray  # int64[n_workers]
    distinct_keys: int
    lat_hist: np.ndarray  # int64[slots, LAT_BINS], completions by finish slot
    queue_batches: np.ndarray  # mean queue length in batches
    queue_msgs: np.ndarray  # mean queue length in messages
    busy: np.ndarray  # busy fraction
    capacity: np.ndarray  # capacity at each slot's middle
    vw: np.ndarray | None  # VWs per worker at each slot's end (mean over sources)
    grouping_stats: list[dict[str, Any]]
    inflight_at_end: int
    signals_emitted: dict[str, int]
    events: int
    coordinator: dict[str, Any] | None = None  # the scheme's controller (ACG), summarized


class _Batch:
    """A routed batch whose sub-batches are not all sent yet."""

    __slots__ = ("emit", "lo", "order", "sent", "starts", "vws")

    def __init__(self, lo: int, order: np.ndarray, starts: np.ndarray, emit: float,
                 vws: np.ndarray | None = None) -> None:
        self.lo = lo
        self.order = order
        self.starts = starts
        self.emit = emit  # when the batch was due (latency starts here)
        self.sent = starts[1:] == starts[:-1]  # empty sub-batches count as sent
        self.vws = vws  # VW of each message (offset from lo), for VW-table schemes


class _Source:
    __slots__ = ("end", "k", "next_lo", "pending", "unsent", "unsent_msgs")

    def __init__(self, begin: int, end: int, n_workers: int) -> None:
        self.next_lo = begin  # next message of this source's shard (permuted index)
        self.end = end
        self.k = 0  # batches taken so far
        self.pending: deque[_Batch] = deque()  # oldest first
        self.unsent = np.zeros(n_workers, dtype=np.int64)  # outbox length per worker
        self.unsent_msgs = np.zeros(n_workers, dtype=np.int64)  # messages in it


class _WorkerSignals:
    """A worker's load signals: its queue history, fed in time order to a ``LoadSignaler``.

    The real worker keeps one ``LoadSignaler`` per source, all fed the same
    utilization; their slot means are therefore identical and only "which
    slot did this source already get" differs. So one signaler integrates
    and ``take(source, t)`` applies ``LoadSignaler.take_signal``'s rule per
    source: the latest completed slot's signal, nonzero at most once per slot
    and source (S times fewer observations than S copies).
    """

    __slots__ = ("arrivals", "finishes", "q", "qcap", "signaler", "taken", "emitted")

    def __init__(self, signaler: LoadSignaler, qcap: int, n_sources: int) -> None:
        self.signaler = signaler
        self.qcap = float(qcap)
        self.q = 0
        self.arrivals: deque[float] = deque()
        self.finishes: deque[float] = deque()
        self.taken = [-(2**62)] * n_sources
        self.emitted = {"increase": 0, "decrease": 0}
        signaler.observe(0.0, 0.0)

    def feed(self, t: float) -> None:
        """Observe every queue change up to ``t`` (arrivals before finishes on ties)."""
        arr, fin = self.arrivals, self.finishes
        observe = self.signaler.observe
        while True:
            ta = arr[0] if arr else math.inf
            tf = fin[0] if fin else math.inf
            if ta <= tf and ta <= t:
                arr.popleft()
                self.q += 1
                te = ta
            elif tf <= t:
                fin.popleft()
                self.q -= 1
                te = tf
            else:
                return
            observe(te, self.q / self.qcap)

    def take(self, source: int, t: float) -> int:
        """Source ``source``'s signal at ``t`` (after ``feed(t)``): +1, -1 or 0."""
        sig = self.signaler
        u = sig.utilization_of_last_slot(t)
        prev = math.floor(t / sig.slot_s) - 1
        if math.isnan(u) or prev <= self.taken[source]:
            return 0
        self.taken[source] = prev
        if u > sig.busy_above:
            self.emitted["decrease"] += 1
            return -1
        if u < sig.idle_below:
            self.emitted["increase"] += 1
            return 1
        return 0


class Engine:
    """One simulation run over ``key_ids`` (dense ids) with routing hashes.

    ``progress(n)`` (optional) is called with the number of messages newly
    acknowledged, every so often.
    """

    def __init__(
        self,
        params: SimParams,
        key_ids: np.ndarray,
        message_hashes: np.ndarray,
        n_keys: int,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        p = params
        self.p = p
        self.n = int(len(key_ids))
        self.key_ids = np.ascontiguousarray(key_ids)
        self.hashes = np.ascontiguousarray(message_hashes, dtype=np.uint64)
        self.n_keys = int(n_keys)
        self.progress = progress
        self.now = 0.0
        nw = p.n_workers
        self.groupings: list[Grouping] = [
            make_grouping(p.scheme, nw, seed=p.seed + s, clock=self._clock, **p.scheme_params)
            for s in range(p.n_sources)
        ]
        g0 = self.groupings[0]
        scheme = SCHEMES[p.scheme]
        #: workers signal only to schemes that listen; others skip the bookkeeping
        settings = scheme.worker_signals(p.scheme_params)
        self.signaling = settings is not None
        self.wsig: list[_WorkerSignals] = []
        if settings is not None:
            self.wsig = [
                _WorkerSignals(LoadSignaler.of(settings), p.queue_capacity_batches, p.n_sources)
                for _ in range(nw)
            ]
        #: a scheme's run-wide controller (ACG): workers report every
        #: ``report_every_s`` (their flushes), its tables reach the sources on acks
        self.controller = (scheme.coordinator(nw, p.scheme_params, t0=0.0)
                           if scheme.coordinated else None)
        self.table: Any = None
        self._reported_slot = 0
        self._last_report = 0.0
        self.vw_arrivals = (np.zeros(self.controller.n_virtual, dtype=np.int64)
                            if self.controller is not None else None)
        self._track_vw = g0.vw_per_worker() is not None
        #: reference schemes (WRR) are told the configured capacities as they change
        self.tell_capacities = scheme.knows_capacities
        if self.tell_capacities:
            for g in self.groupings:
                for w, c in enumerate(p.capacities):
                    g.on_capacity(w, c)

        # capacity schedule per worker: sched_t[w, j] <= t < sched_t[w, j+1] -> sched_c[w, j]
        per_w: list[list[tuple[float, float]]] = [[(0.0, c)] for c in p.capacities]
        for at_s, w, c in sorted(p.changes, key=lambda x: x[0]):
            if at_s <= 0.0:
                per_w[w][0] = (0.0, c)
            else:
                per_w[w].append((at_s, c))
        k = max(len(x) for x in per_w) + 1
        self.sched_t = np.full((nw, k), np.inf)
        self.sched_c = np.ones((nw, k))
        for w, lst in enumerate(per_w):
            for j, (t, c) in enumerate(lst):
                self.sched_t[w, j] = t
                self.sched_c[w, j] = c
            self.sched_c[w, len(lst):] = lst[-1][1]
        self.min_cap = float(min(c for lst in per_w for _, c in lst))
        self.service_s = p.service_us / 1e6

        self.inflight = np.zeros((p.n_sources, nw), dtype=np.int64)
        self.free_at = np.zeros(nw)
        self.processed = np.zeros(nw, dtype=np.int64)
        self.latency_s = np.full(self.n, np.nan, dtype=np.float32)
        self.msg_worker = np.full(self.n, -1, dtype=np.int32)
        self.use_seen = nw * max(self.n_keys, 1) <= MAX_SEEN_CELLS
        self.seen = np.zeros((nw, self.n_keys) if self.use_seen else (1, 1), dtype=np.bool_)
        rows = 64
        self.lat_hist = np.zeros((rows, kernels.LAT_BINS), dtype=np.int64)
        self.busy_area = np.zeros((nw, rows))
        self.done_area = np.zeros((nw, rows))
        self.qbatch_area = np.zeros((nw, rows))
        self.qmsg_area = np.zeros((nw, rows))
        self.out_w = np.zeros(nw, dtype=np.int32)
        self.out_fin = np.zeros(nw)
        self.out_m = np.zeros(nw, dtype=np.int64)
        self.heap: list[tuple[float, int, int, int, int, float]] = []
        self.seq = 0
        self.perm, bounds = shard_order(self.n, p.n_sources, p.shard_block_rows)
        if self.perm is not None:  # messages in source-major order: batches are contiguous
            self.key_ids = self.key_ids[self.perm]
            self.hashes = self.hashes[self.perm]
        self.sources = [_Source(int(bounds[s]), int(bounds[s + 1]), nw)
                        for s in range(p.n_sources)]
        self.vw_snapshots: list[np.ndarray] = []
        self.events = 0

    def _clock(self) -> float:
        return self.now

    # ------------------------------------------------------------------ storage

    def _ensure_rows(self, m: int) -> None:
        """Per-slot arrays long enough for a batch of ``m`` messages sent now."""
        # the batch cannot end later than this (all of it on the slowest worker)
        t_end = max(self.now, float(self.free_at.max())) + m * self.service_s / self.min_cap
        need = int(t_end / self.p.slot_s) + 2
        rows = self.lat_hist.shape[0]
        if need > rows:
            rows = max(need, 2 * rows)
            h = np.zeros((rows, kernels.LAT_BINS), dtype=np.int64)
            h[: self.lat_hist.shape[0]] = self.lat_hist
            self.lat_hist = h
            self.busy_area = _grow_cols(self.busy_area, rows)
            self.done_area = _grow_cols(self.done_area, rows)
            self.qbatch_area = _grow_cols(self.qbatch_area, rows)
            self.qmsg_area = _grow_cols(self.qmsg_area, rows)

    # ------------------------------------------------------------------ sources

    def _dispatch(self, s: int) -> None:
        """Source ``s`` at ``now``: send queued sub-batches while the windows
        allow, then take and route new batches until an outbox is over its
        bound, the rate says wait, or the shard is done."""
        p = self.p
        st = self.sources[s]
        while True:
            self._send_pending(s, st)
            if (st.unsent_msgs > p.outbox_msgs).any():
                return  # blocked: an ack from that worker dispatches again
            lo = st.next_lo
            if lo >= st.end:
                return
            emit = self.now
            if p.rate > 0:
                emit = st.k * p.batch * p.n_sources / p.rate
                if emit > self.now:
                    self._push(emit, s, -1, 0, 0.0)
                    return
            hi = min(st.end, lo + p.batch)
            vws = None
            if self.vw_arrivals is not None:
                g = self.groupings[s]
                vws = g.route_virtual(self.hashes[lo:hi])
                self.vw_arrivals += np.bincount(vws, minlength=len(self.vw_arrivals))
                workers = g.owner_of(vws)
            else:
                workers = self.groupings[s].route(self.hashes[lo:hi])
            order, starts = kernels.split_by_worker(
                np.ascontiguousarray(workers, dtype=np.int32), p.n_workers)
            b = _Batch(lo, order, starts, emit, vws)
            st.unsent += ~b.sent
            st.unsent_msgs += np.diff(starts)
            st.pending.append(b)
            st.next_lo = hi
            st.k += 1

    def _send_pending(self, s: int, st: _Source) -> None:
        """Every queued sub-batch whose worker has a free in-flight slot, oldest
        batch first (so each worker gets its sub-batches in routing order)."""
        p = self.p
        inflight = self.inflight[s]
        # workers with a free window and something queued: the only ones that can send
        want = (inflight < p.max_inflight) & (st.unsent > 0)
        if not want.any():
            return
        self._ensure_rows(p.batch)
        for b in st.pending:
            if not (want & ~b.sent).any():
                continue
            n_sent = kernels.dispatch_batch(
                b.sent, b.starts, b.order, b.lo, self.now, b.emit,
                self.inflight[s], p.max_inflight, self.free_at, self.service_s,
                self.sched_t, self.sched_c, self.key_ids, self.latency_s, self.msg_worker,
                self.seen, self.use_seen, p.slot_s, self.lat_hist, self.busy_area,
                self.done_area, self.qbatch_area, self.qmsg_area, self.processed,
                self.out_w, self.out_fin, self.out_m,
            )
            ack = p.ack_delay_s
            for i in range(n_sent):
                w = int(self.out_w[i])
                fin = float(self.out_fin[i])
                st.unsent[w] -= 1
                st.unsent_msgs[w] -= int(self.out_m[i])
                self._push(fin + ack, s, w, int(self.out_m[i]), fin)
                if self.signaling:
                    self.wsig[w].arrivals.append(self.now)
                    self.wsig[w].finishes.append(fin)
            if n_sent:
                want &= (inflight < p.max_inflight) & (st.unsent > 0)
                if not want.any():
                    break
        while st.pending and st.pending[0].sent.all():
            st.pending.popleft()

    def _push(self, t: float, s: int, w: int, m: int, fin: float) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, s, w, m, fin))

    # ------------------------------------------------------------------ main loop

    def run(self) -> EngineResult:
        p = self.p
        heap = self.heap
        ts_next = p.slot_s
        pending_progress = 0
        for s in range(p.n_sources):
            self._dispatch(s)
        if self.tell_capacities:
            for i, (at_s, _w, _c) in enumerate(p.changes):
                self._push(float(at_s), -1, -3, i, 0.0)
        if self.controller is not None:
            # workers report early once (a slot in), then every report_every_s
            self._push(min(p.report_every_s, max(p.slot_s, FIRST_PLAN_S)), -1, -2, 0, 0.0)
        while heap:
            t, _, s, w, m, fin = heapq.heappop(heap)
            self.events += 1
            if self._track_vw:
                while ts_next <= t:
                    self.vw_snapshots.append(self._vw_now())
                    ts_next += p.slot_s
            self.now = t
            if w == -3:  # a capacity change, told to a reference scheme
                _, cw, cc = p.changes[m]
                for g in self.groupings:
                    g.on_capacity(int(cw), float(cc))
                continue
            if w == -2:  # workers report to the controller
                self._report(t)
                if heap:
                    nxt = (math.floor(t / p.report_every_s + 1e-9) + 1) * p.report_every_s
                    self._push(nxt, -1, -2, 0, 0.0)
                continue
            if w < 0:  # rate timer
                self._dispatch(s)
                continue
            self.inflight[s, w] -= 1
            signal = 0
            if self.signaling:
                ws = self.wsig[w]
                ws.feed(fin)
                signal = ws.take(s, fin)
            self.groupings[s].on_ack(w, signal, m)
            if self.table is not None and self.groupings[s].on_table(self.table):
                self._reroute(s)
                self._dispatch(s)
            pending_progress += m
            if pending_progress >= 200_000 and self.progress is not None:
                self.progress(pending_progress)
                pending_progress = 0
            if self.sources[s].unsent[w]:  # it was waiting for this worker's window
                self._dispatch(s)
        if self.progress is not None and pending_progress:
            self.progress(pending_progress)
        return self._finish()

    def _reroute(self, s: int) -> None:
        """A new VW table at source ``s``: its sub-batches still in an outbox
        (routed, not sent) go where their VWs are now."""
        g = self.groupings[s]
        st = self.sources[s]
        nw = self.p.n_workers
        moved = []
        for b in st.pending:
            if b.vws is None:
                continue
            for w in np.flatnonzero(~b.sent):
                idx = b.order[b.starts[w]:b.starts[w + 1]]
                dest = g.owner_of(b.vws[idx])
                if (dest == w).all():
                    continue
                b.sent[w] = True
                st.unsent[w] -= 1
                st.unsent_msgs[w] -= len(idx)
                order, starts = kernels.split_by_worker(dest.astype(np.int32), nw)
                nb = _Batch(b.lo, idx[order], starts, b.emit, b.vws)
                st.unsent += ~nb.sent
                st.unsent_msgs += np.diff(starts)
                moved.append(nb)
        st.pending.extend(moved)

    def _report(self, t: float) -> None:
        """Every worker reports what it did in the completed slots since its
        last report (completions and busy time), the VW arrivals go with them,
        and the controller may publish a table (taken by sources on acks)."""
        ctl = self.controller
        assert ctl is not None and self.vw_arrivals is not None
        k = int(t / self.p.slot_s + 1e-9)
        lo = self._reported_slot
        done = self.done_area[:, lo:k].sum(axis=1)
        busy = self.busy_area[:, lo:k].sum(axis=1)
        self._reported_slot = max(lo, k)
        since, self._last_report = self._last_report, t
        for w in range(self.p.n_workers):
            ctl.report(w, int(done[w]), float(busy[w]), t)
        ids = np.flatnonzero(self.vw_arrivals)  # what the sources routed per VW
        ctl.report_routed(0, since, t, ids, self.vw_arrivals[ids])
        self.vw_arrivals[:] = 0
        table = ctl.tick(t)
        if table is not None:
            self.table = table

    def _unpermute(self, a: np.ndarray) -> np.ndarray:
        """A per-message array back in stream order."""
        if self.perm is None:
            return a
        out = np.empty_like(a)
        out[self.perm] = a
        return out

    def _vw_now(self) -> np.ndarray:
        return np.mean(
            [np.asarray(g.vw_per_worker(), dtype=np.float64)  # type: ignore[attr-defined]
             for g in self.groupings], axis=0)

    # ------------------------------------------------------------------ results

    def _finish(self) -> EngineResult:
        p = self.p
        nw = p.n_workers
        duration = float(self.free_at.max()) if self.processed.sum() else 0.0
        rows = max(1, math.ceil(duration / p.slot_s - 1e-9))
        lat_hist = self.lat_hist[:rows].copy()
        lat_hist[-1] += self.lat_hist[rows:].sum(axis=0)  # finishes exactly at the end
        mids = (np.arange(rows) + 0.5) * p.slot_s
        capacity = np.empty((rows, nw))
        for w in range(nw):
            j = np.searchsorted(self.sched_t[w], mids, side="right") - 1
            capacity[:, w] = self.sched_c[w, np.maximum(j, 0)]
        vw = None
        if self._track_vw:
            snaps = self.vw_snapshots[:rows]
            while len(snaps) < rows:
                snaps.append(self._vw_now())
            vw = np.vstack(snaps)
        if self.use_seen:
            keys_per_worker = self.seen.sum(axis=1).astype(np.int64)
            distinct = int(self.seen.any(axis=0).sum())
        else:
            done = self.msg_worker >= 0
            pairs = np.unique(self.key_ids[done].astype(np.int64) * nw + self.msg_worker[done])
            keys_per_worker = np.bincount(pairs % nw, minlength=nw).astype(np.int64)
            distinct = int(np.unique(pairs // nw).size)
        emitted = {"increase": 0, "decrease": 0}
        for ws in self.wsig:
            for k in emitted:
                emitted[k] += ws.emitted[k]

        def per_slot(area: np.ndarray) -> np.ndarray:
            return _fit_cols(area, rows).T / p.slot_s

        return EngineResult(
            params=p, n_messages=self.n, duration_s=duration,
            latency_s=self._unpermute(self.latency_s), msg_worker=self._unpermute(self.msg_worker),
            processed=self.processed.copy(),
            keys_per_worker=keys_per_worker, distinct_keys=distinct, lat_hist=lat_hist,
            queue_batches=per_slot(self.qbatch_area), queue_msgs=per_slot(self.qmsg_area),
            busy=per_slot(self.busy_area), capacity=capacity, vw=vw,
            grouping_stats=[g.stats() for g in self.groupings],
            inflight_at_end=int(self.inflight.sum()), signals_emitted=emitted,
            events=self.events,
            coordinator=self.controller.summary() if self.controller is not None else None,
        )


def shard_order(n: int, n_sources: int, block_rows: int) -> tuple[np.ndarray | None, np.ndarray]:
    """Messages in source-major order and each source's range in it.

    Blocks of ``block_rows`` messages go round-robin to the sources; returns
    ``(perm, bounds)``: source ``s`` reads ``perm[bounds[s]:bounds[s+1]]``
    (message indices, stream order kept), ``perm`` None when it is the
    identity (one source, or a single block).
    """
    n_blocks = -(-n // block_rows) if n else 0
    if n_sources == 1 or n_blocks <= 1:
        bounds = np.full(n_sources + 1, n, dtype=np.int64)
        bounds[0] = 0
        return None, bounds
    parts: list[np.ndarray] = []
    bounds = np.zeros(n_sources + 1, dtype=np.int64)
    for s in range(n_sources):
        for j in range(s, n_blocks, n_sources):
            parts.append(np.arange(j * block_rows, min(n, (j + 1) * block_rows), dtype=np.int64))
        bounds[s + 1] = sum(len(x) for x in parts)
    return np.concatenate(parts), bounds


def _grow_cols(a: np.ndarray, cols: int) -> np.ndarray:
    out = np.zeros((a.shape[0], cols), dtype=a.dtype)
    out[:, : a.shape[1]] = a
    return out


def _fit_cols(a: np.ndarray, cols: int) -> np.ndarray:
    if a.shape[1] >= cols:
        return a[:, :cols]
    return _grow_cols(a, cols)
