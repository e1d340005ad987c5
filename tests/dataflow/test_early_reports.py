"""A coordinated scheme's first plan waits for nobody's long call or slow pace.

The controller plans once every worker reported a rate and every source its
routed load (``FIRST_PLAN_S`` in). A slow worker's first call, one
sub-batch, can be 0.5 s of work; a paced source may route one batch every
half second. Neither may hold the first report until then.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from conftest import DirectTransport, FakeTime

from runtime.dataflow.reliability import Flush, Part
from runtime.dataflow.settings import SourceSettings, WorkerSettings
from runtime.dataflow.source import SourceCore
from runtime.dataflow.worker import SERVE_PIECE_S, WorkerCore
from runtime.grouping import make_grouping
from runtime.grouping.coordination import FIRST_PLAN_S, VwTable
from runtime.hashing import hash_arrow
from runtime.operators import WorkerApp, builtin_operator


def _worker(ft: FakeTime, flushes: list[Flush], *, report_every_s: float | None) -> WorkerCore:
    # 1 ms a message at full speed, served at 0.2: 5 ms a message
    return WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                      WorkerSettings(service_us=1000.0, capacity=0.2, throttle="service",
                                     report_every_s=report_every_s),
                      clock=ft.clock, sleep=ft.sleep, t0=ft.t, sink=flushes.append)


def _call(n: int, emit_ts: float) -> list[Part]:
    keys = pa.array([f"k{i % 7}" for i in range(n)])
    records = pa.RecordBatch.from_arrays([keys], names=["key"])
    return [Part(None, records, hash_arrow(keys), np.array([emit_ts]))]


def test_a_reporting_worker_reports_its_rate_during_a_long_first_call() -> None:
    ft, flushes = FakeTime(), []
    w = _worker(ft, flushes, report_every_s=0.5)
    t0 = ft.t
    item = w.enqueue(0, _call(100, ft.t))  # 0.5 s of work
    assert w.step(timeout=0)
    assert item.ack is not None and item.ack.acked == 100
    early = [f for f in flushes if f.report is not None and f.report.processed > 0]
    assert early, "no rate report before the call ended"
    first = early[0].report
    # sent once FIRST_PLAN_S had passed, long before the call's 0.5 s: with
    # the messages served so far and the time it took (5 ms a message)
    assert first.processed < 100 and first.busy_s <= FIRST_PLAN_S + 2 * SERVE_PIECE_S
    assert first.processed / first.busy_s == pytest.approx(200.0, rel=0.25)
    assert ft.t - t0 == pytest.approx(0.5, rel=0.05)
    w.maybe_flush(force=True)
    assert sum(f.report.processed for f in flushes if f.report is not None) == 100
    assert w.processed == 100


def test_an_idle_worker_wakes_up_when_its_first_report_is_due() -> None:
    """A worker done with its first call before ``FIRST_PLAN_S`` waits for the
    next call no longer than until its report is due (the simulator's loop
    too: it used to wait a whole ``aggregate_every_s``, and the controller's
    first plan with it)."""
    ft, flushes = FakeTime(), []
    w = _worker(ft, flushes, report_every_s=0.5)
    w.enqueue(0, _call(4, ft.t))  # 20 ms of work
    assert w.step(timeout=0)
    assert flushes == []  # not due yet
    wait = w.idle_poll_s()
    assert wait == pytest.approx(FIRST_PLAN_S - 4 * 0.005, abs=0.005)
    ft.sleep(wait)
    assert not w.step(timeout=0)  # no call: the due flush goes
    assert len(flushes) == 1 and flushes[0].report.processed == 4


def test_a_worker_without_reports_flushes_only_between_calls() -> None:
    ft, flushes = FakeTime(), []
    w = _worker(ft, flushes, report_every_s=None)
    w.enqueue(0, _call(100, ft.t))
    assert w.step(timeout=0)
    assert flushes == [] and w.processed == 100  # aggregate_every_s (1 s) not due


class _Control:
    """The controller's side of a source's load reports, recorded; a commit
    is each worker's flush (no aggregator to lose it)."""

    def __init__(self, ft: FakeTime, workers: list[WorkerCore]) -> None:
        self.ft, self.workers, self.reports = ft, workers, []

    def report_routed(self, source, report) -> None:
        self.reports.append((self.ft.t, report))

    def poll_table(self, timeout):
        return None

    def commit(self, workers):
        return {w: self.workers[w].flush_now() for w in workers}


def _instant_workers(ft: FakeTime) -> list[WorkerCore]:
    return [WorkerCore(i, WorkerApp(builtin_operator("wordcount")),
                       WorkerSettings(service_us=0.0), clock=ft.clock, sleep=ft.sleep,
                       t0=ft.t) for i in range(2)]


def _run_paced(ft: FakeTime, grouping, workers: list[WorkerCore], control) -> SourceCore:
    """Three batches of 100 at 200 messages/s: one every 0.5 s."""
    src = SourceCore(0, grouping, DirectTransport(workers),
                     SourceSettings(n_workers=2, rate_per_source=200.0,
                                    report_every_s=0.5),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t, control=control)
    src.run([pa.table({"key": [f"k{i}" for i in range(100)]}) for _ in range(3)])
    return src


def test_a_paced_source_sends_its_first_load_report_while_it_waits() -> None:
    """At 200 messages/s and batches of 100, the second batch is due 0.5 s in;
    the first load report still goes FIRST_PLAN_S in."""
    ft = FakeTime()
    workers = _instant_workers(ft)
    control = _Control(ft, workers)
    t0 = ft.t
    _run_paced(ft, make_grouping("acg", 2, seed=0), workers, control)
    times = [t - t0 for t, r in control.reports if not r.final]
    assert times and times[0] == pytest.approx(FIRST_PLAN_S, abs=0.01)
    assert control.reports[0][1].vw_counts.sum() == 100  # the first batch, routed at 0


class _Planner(_Control):
    """The controller's first plan is made 0.11 s in (after every worker's
    first report): a load report answered after that gets its table."""

    def __init__(self, ft: FakeTime, workers: list[WorkerCore], table: VwTable) -> None:
        super().__init__(ft, workers)
        self.t0, self.table, self.answer = ft.t, table, None

    def report_routed(self, source, report) -> None:
        super().report_routed(source, report)
        self.answer = self.table if self.ft.t - self.t0 > 0.11 else VwTable(0, self.table.owner)

    def poll_table(self, timeout):
        answer, self.answer = self.answer, None
        return answer


def test_a_paced_source_takes_the_first_plan_before_its_second_batch() -> None:
    """The first plan misses the first report (0.1 s in). Until a plan
    reaches it, a paced source reports every FIRST_PLAN_S while it waits, so
    its second batch (0.5 s in) goes by the plan, not blind; once planned it
    reports only as it routes."""
    ft = FakeTime()
    workers = _instant_workers(ft)
    grouping = make_grouping("acg", 2, seed=0)
    plan = VwTable(1, np.zeros(grouping.n_virtual, dtype=np.int32))  # all on worker 0
    plan.owner[0] = 1  # (every worker keeps a VW)
    control = _Planner(ft, workers, plan)
    t0 = ft.t
    src = _run_paced(ft, grouping, workers, control)
    times = [round(t - t0, 3) for t, r in control.reports if not r.final]
    assert times[:2] == pytest.approx([FIRST_PLAN_S, 2 * FIRST_PLAN_S], abs=0.01)
    assert grouping.adopted and grouping.adopted[0][1] == 1
    assert grouping.adopted[0][0] - t0 < 0.5  # before the second batch was due
    assert all(t >= 0.5 - 0.01 for t in times[2:])  # then only as it routes
    assert sum(src.sent_per_worker) == 300
    assert src.sent_per_worker[1] < 100 + 100  # batches 2 and 3 by the plan: few to worker 1


class _QueuedTransport:
    """Calls queue at their workers and are served only as the source waits
    for acks, the oldest first (``DirectTransport`` serves each as it is sent,
    so no outbox ever holds anything)."""

    def __init__(self, workers: list[WorkerCore]) -> None:
        self.workers, self.calls, self.n = workers, {}, 0

    def send(self, worker: int, parts: list) -> int:
        self.n += 1
        self.calls[self.n] = (worker, self.workers[worker].enqueue(0, parts))
        return self.n

    def wait(self, tokens, timeout):
        t = min(tokens)
        worker, item = self.calls.pop(t)
        while item.ack is None:
            assert self.workers[worker].step(timeout=0)
        return [(t, item.ack)]


def test_a_draining_source_says_what_its_outboxes_still_hold() -> None:
    """Once a source has routed its whole input, each of its reports that is
    due carries what its outboxes still hold per VW (``queued``) until its
    final one. acg's end plan is made when the last source has routed its
    whole input, which may be seconds after this one did, and must plan this
    source's outboxes as they are then: on a held-out 12-worker cluster one
    source's counts were 3.1 s old, and the slowest worker drained alone for
    a second (0.939 of capacity; 0.997 with fresh counts)."""
    ft = FakeTime()
    workers = [WorkerCore(i, WorkerApp(builtin_operator("wordcount")),
                          WorkerSettings(service_us=1000.0, capacity=0.2, throttle="service"),
                          clock=ft.clock, sleep=ft.sleep, t0=ft.t) for i in range(2)]
    control = _Control(ft, workers)
    src = SourceCore(0, make_grouping("acg", 2, seed=0), _QueuedTransport(workers),
                     SourceSettings(n_workers=2, report_every_s=0.5, outbox=20),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t, control=control)
    src.run([pa.table({"key": [f"k{i}" for i in range(100)]}) for _ in range(6)])
    left = [(t, r) for t, r in control.reports if r.queued is not None]
    assert len(left) >= 3  # the report of its whole input routed, then the drain's
    totals = [int(r.queued.sum()) for _, r in left]
    assert totals[0] > 0 and totals == sorted(totals, reverse=True) and totals[-1] < totals[0]
    gaps = np.diff([t for t, _ in left])
    assert (gaps >= 0.5 - 1e-9).all()  # as often as the reports are due, no more
    last = control.reports[-1][1]
    assert last.final and last.queued is None
    assert sum(src.sent_per_worker) == 600 and sum(w.processed for w in workers) == 600
