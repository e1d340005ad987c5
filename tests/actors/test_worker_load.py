"""The worker's own load measurement and its small helpers (runtime.dataflow.worker),
driven directly with a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import FakeTime

from runtime.dataflow.latency import binned
from runtime.dataflow.worker import FlushCadence, LoadMeter, SourceSignals, TableRelay
from runtime.grouping.acg import FIRST_PLAN_S
from runtime.grouping.coordination import RateReport
from runtime.grouping.signals import WorkerSignals


def meter(ft: FakeTime, queue_capacity: int = 4, slot_s: float = 1.0) -> LoadMeter:
    return LoadMeter(queue_capacity, slot_s, ft.t, ft.clock)


def test_utilization_counts_batches_over_capacity(fake_time) -> None:
    m = meter(fake_time)
    assert m.utilization() == 0.0
    assert m.change(+1, 100) == 0.0
    m.change(+1, 50)
    assert (m.q_batches, m.q_msgs, m.utilization()) == (2, 150, 0.5)
    fake_time.sleep(0.25)
    assert m.change(-1, -100) == 0.25
    assert m.utilization() == 0.25


def test_queue_length_is_integrated_per_slot(fake_time) -> None:
    ft = fake_time
    m = meter(ft, slot_s=1.0)
    ft.sleep(0.5)
    m.change(+2, 200)  # 2 batches from 0.5 s to 1.5 s, then 1 until 2.5 s
    ft.sleep(1.0)
    m.change(-1, -100)
    ft.sleep(1.0)
    m.change(-1, -100)
    s = m.series(3.0)
    assert s.slot == [0, 1, 2, 3]
    assert s.queue_batches == pytest.approx([1.0, 1.5, 0.5, 0.0])
    assert s.queue_msgs == pytest.approx([100.0, 150.0, 50.0, 0.0])
    assert m.integrals(ft.t) == pytest.approx((3.0, 0.0))


def test_served_batches_count_in_the_slot_they_end_in(fake_time) -> None:
    ft = fake_time
    m = meter(ft, slot_s=1.0)
    t = ft.t
    m.served(10, t + 0.5, t + 1.25, binned(np.full(10, 0.01)))  # busy across a slot boundary
    m.served(5, t + 1.5, t + 1.75, binned(np.full(5, 0.02)))
    s = m.series(1.9)
    assert s.processed == [0, 15]
    assert s.busy == pytest.approx([0.5, 0.5])
    assert list(s.latency) == [1]
    assert m.integrals(t)[1] == pytest.approx(1.0)


def test_the_timeline_never_goes_back(fake_time) -> None:
    ft = fake_time
    m = meter(ft)
    ft.sleep(2.0)
    m.change(+1, 10)
    ft.t -= 1.0  # another thread's older clock reading
    assert m.now() == 2.0 and m.change(+1, 10) == 2.0


def test_restart_keeps_the_queue_and_starts_a_new_timeline(fake_time) -> None:
    ft = fake_time
    m = meter(ft)
    m.change(+1, 10)
    ft.sleep(3.0)
    m.restart(ft.t)
    assert (m.q_batches, m.q_msgs, m.last_t) == (1, 10, 0.0)
    ft.sleep(1.0)
    assert m.integrals(ft.t) == pytest.approx((1.0, 0.0))  # only since the restart


def test_rate_report_counts_time_with_work_only(fake_time) -> None:
    ft = fake_time
    m = meter(ft)
    ft.sleep(1.0)  # idle
    m.change(+1, 10)
    ft.sleep(0.5)
    m.served(10, ft.t - 0.5, ft.t, binned(np.zeros(10)))
    m.change(-1, -10)
    ft.sleep(1.0)  # idle again
    first = m.take_report()
    assert (first.processed, first.busy_s) == (10, pytest.approx(0.5))
    assert m.take_report() == RateReport(processed=0, busy_s=0.0)


def test_a_duty_cycled_workers_busy_seconds_are_a_slow_machines(fake_time) -> None:
    """With a stopped clock (a 0.3 duty cycle: stopped 0.7 s of every second),
    busy seconds are counted over the share of the window the process ran:
    a call served at full speed inside a running part, never stopped, is
    0.1 s of running work but 0.1 / 0.3 s of a 0.3 machine's; saturated
    (work all the time) the count is the window, as without the clock."""
    ft = fake_time
    stopped = [0.0]
    m = LoadMeter(4, 1.0, ft.t, ft.clock, stopped_clock=lambda: stopped[0])
    m.change(+1, 100)
    ft.sleep(0.1)  # served while running
    m.served(100, ft.t - 0.1, ft.t, binned(np.zeros(100)))
    m.change(-1, -100)
    ft.sleep(0.9)  # idle; the process was stopped 0.7 s of it
    stopped[0] += 0.7
    r = m.take_report()
    assert (r.processed, r.busy_s) == (100, pytest.approx(0.1 / 0.3))
    m.change(+1, 100)  # the next second: work all the time, stopped 0.7 s of it
    ft.sleep(0.3)
    stopped[0] += 0.7
    ft.sleep(0.7)
    r = m.take_report()
    assert r.busy_s == pytest.approx(1.0)
    # a window in which it ran under MIN_RUNNING_SHARE: busy seconds as they are
    ft.sleep(0.01)
    stopped[0] += 0.99
    ft.sleep(0.99)
    assert m.take_report().busy_s == pytest.approx(1.0)


class _DutyCycle:
    """A 0.3 duty cycle of 0.1 s periods from ``ft``'s start, as the real
    throttler publishes it (``actors.throttle.StoppedClock``): the stops
    ended so far, and the latest period's start. Read only while running."""

    def __init__(self, ft: FakeTime) -> None:
        self.ft, self.t0 = ft, ft.t

    def _periods(self) -> int:
        return int((self.ft.t - self.t0) / 0.1 + 1e-9)

    def __call__(self) -> float:
        return 0.07 * self._periods()

    def resumed(self) -> tuple[float, float]:
        return self.t0 + 0.1 * self._periods(), self()


def _two_reports(ft: FakeTime, stopped_clock) -> tuple[float, float]:
    """A saturated 0.3 worker (200 us a message at full speed) flushing 9 ms
    and 15 ms into its second and third periods: its two reports' rates."""
    ft.t = 0.0
    m = LoadMeter(4, 1.0, ft.t, ft.clock, stopped_clock=stopped_clock)
    m.change(+1, 1000)  # work all the time
    rates = []
    for served in ((0.03, 150, 0.0), (0.109, 45, 0.1), None, (0.13, 105, 0.109), (0.215, 75, 0.2),
                   None):
        if served is None:  # the flush
            r = m.take_report()
            rates.append(r.processed / r.busy_s)
            continue
        ft.t, n, start = served
        m.served(n, start, ft.t, binned(np.zeros(n)))
    return rates[0], rates[1]


def test_a_duty_cycled_workers_running_share_is_taken_over_whole_periods(fake_time) -> None:
    """A flush falls wherever the process runs, so a window's own share is
    up to a running part high: the first 0.109 s ran 0.039 of it, a rate of
    1,789 for a 1,500 msgs/s worker. Over the whole periods between the
    period starts it saw, it is 1,500: the first report, and every one after
    (each span starts at the last's end)."""
    ft = fake_time
    assert _two_reports(ft, _DutyCycle(ft)) == pytest.approx((1500.0, 1500.0))
    # told only the stops (no period starts): the window's own share
    window_only = _two_reports(ft, lambda: 0.07 * int(ft.t / 0.1 + 1e-9))
    assert window_only[0] == pytest.approx(1789.0, rel=1e-3)


def test_a_worker_that_slows_says_so_after_two_probe_windows(fake_time) -> None:
    """Saturated at 5,000 msgs/s, then at 2,500: ``change_seen`` says nothing
    while the rate stays within ``jump`` of the latest report's (4,500 is),
    and once two probe windows (``PROBE_S``) in a row are beyond it, the
    second one's count; the report that carries it makes that the new
    reference, so the slower rate is said once."""
    ft = fake_time
    m = meter(ft)
    m.change(+1, 10**6)  # work all the time
    seen = []

    def serve(rate: float, seconds: float) -> None:
        for _ in range(round(seconds / 0.02)):  # calls of 20 ms
            ft.sleep(0.02)
            n = round(rate * 0.02)
            m.served(n, ft.t - 0.02, ft.t, binned(np.zeros(n)))
            got = m.change_seen(0.25)
            if got is not None:
                seen.append((round(ft.t - start, 2), got))

    start = ft.t
    serve(5000.0, 0.5)
    assert m.take_report().processed == 2500  # the reference: 5,000 msgs/s
    serve(4500.0, 0.5)  # 10% off: not a change
    assert seen == []
    serve(2500.0, 0.3)
    assert [t for t, _ in seen] == [1.2] and seen[0][1] == (250, pytest.approx(0.1))
    r = m.take_report(seen[0][1])
    assert r.recent == (250, pytest.approx(0.1))
    serve(2500.0, 0.5)
    assert len(seen) == 1


def _serve_partly(ft: FakeTime, m: LoadMeter, rate: float, busy: float, seconds: float,
                  seen: list, start: float) -> None:
    """Calls every 20 ms, each served at ``rate`` msgs/s and taking ``busy``
    of the 20 ms (idle the rest); ``change_seen`` after each, what it says
    noted in ``seen`` as (seconds since ``start``, its answer)."""
    for _ in range(round(seconds / 0.02)):
        work = 0.02 * busy
        n = round(rate * work)
        m.change(+1, n)
        ft.sleep(work)
        m.served(n, ft.t - work, ft.t, binned(np.zeros(n)))
        m.change(-1, -n)
        ft.sleep(0.02 - work)
        got = m.change_seen(0.25)
        if got is not None:
            seen.append((round(ft.t - start, 2), got))


def test_a_steady_worker_that_speeds_up_says_so_while_mostly_idle(fake_time) -> None:
    """A worker steady at 1,000 msgs/s and 80% busy becomes 5x faster with
    the same arrivals: 16% busy, 0.016 s of work per probe window, too little
    for ``PROBE_BUSY_S``. Steady for ``STEADY_PROBES`` windows before, its
    windows count with ``STEADY_BUSY_S`` of work when beyond ``STEADY_JUMP``:
    the speed-up is said after two windows, and nothing more after it."""
    ft = fake_time
    m, seen, start = meter(ft), [], fake_time.t
    _serve_partly(ft, m, 1000.0, 0.8, 0.5, seen, start)
    assert m.take_report().processed == 400  # the reference: 1,000 msgs/s
    _serve_partly(ft, m, 1000.0, 0.8, 0.5, seen, start)
    assert seen == []
    _serve_partly(ft, m, 5000.0, 0.16, 0.2, seen, start)
    assert [t for t, _ in seen] == [1.2]
    n, busy = seen[0][1]
    assert n / busy == pytest.approx(5000.0)
    m.take_report(seen[0][1])
    _serve_partly(ft, m, 5000.0, 0.16, 1.0, seen, start)
    assert len(seen) == 1


def test_a_steady_worker_that_slows_in_a_long_call_says_so_after_it(fake_time) -> None:
    """Saturated and steady at 5,000 msgs/s, a worker slows to 1,000 and its
    next calls (sized for the old rate) take 0.25 s each: the first call's
    window, at least ``STEADY_ALONE_S`` of work beyond ``STEADY_JUMP``, is
    the change on its own."""
    ft = fake_time
    m, seen, start = meter(ft), [], fake_time.t
    m.change(+1, 10**6)  # work all the time
    _serve_partly(ft, m, 5000.0, 1.0, 0.5, seen, start)
    assert m.take_report().processed == 2500
    _serve_partly(ft, m, 5000.0, 1.0, 0.6, seen, start)
    for _ in range(2):
        ft.sleep(0.25)
        m.served(250, ft.t - 0.25, ft.t, binned(np.zeros(250)))
        got = m.change_seen(0.25)
        if got is not None:
            seen.append((round(ft.t - start, 2), got))
    assert [t for t, _ in seen] == [1.35] and seen[0][1] == (250, pytest.approx(0.25))


def test_a_worker_whose_rate_swings_gets_no_lenient_windows(fake_time) -> None:
    """A worker whose probe windows swing by 40% around its rate (no
    emulated work: calls of microseconds) is never steady: a speed-up with
    less than ``PROBE_BUSY_S`` of work per window is not said, as before."""
    ft = fake_time
    m, seen, start = meter(ft), [], fake_time.t
    for i in range(5):
        _serve_partly(ft, m, 1000.0 * (1.4 if i % 2 else 0.7), 0.8, 0.1, seen, start)
    assert m.take_report().processed > 0
    for i in range(10):
        _serve_partly(ft, m, 1000.0 * (1.4 if i % 2 else 0.7), 0.8, 0.1, seen, start)
    assert seen == []
    _serve_partly(ft, m, 5000.0, 0.16, 1.0, seen, start)
    assert seen == []


def test_a_report_of_nothing_served_is_no_reference_for_a_change(fake_time) -> None:
    """A worker busy without serving anything (its call stalled) reports a
    rate of 0: no reference to measure a change against (no division by it),
    so its probes say nothing until a report with a rate comes."""
    ft = fake_time
    m = meter(ft)
    m.change(+1, 100)
    ft.sleep(0.5)
    assert m.take_report().processed == 0
    for _ in range(10):
        ft.sleep(0.05)
        m.served(50, ft.t - 0.05, ft.t, binned(np.zeros(50)))
        assert m.change_seen(0.25) is None


def test_each_source_gets_its_own_signaler_fed_the_same_samples() -> None:
    off = SourceSignals(None)
    assert not off.wants(0)
    off.add(0, 0.0, 1.0)
    assert off.get(0) is None
    sig = SourceSignals(WorkerSignals(1.0, 0.8, 0.2))
    assert sig.wants(0)
    sig.add(0, 0.0, 1.0)
    sig.add(1, 0.0, 1.0)
    assert not sig.wants(0)
    sig.observe(1.0, 0.0)  # slot 0 was busy throughout: send less
    a, b = sig.get(0), sig.get(1)
    assert a is not None and b is not None
    assert a.take_signal(1.5) == -1 and b.take_signal(1.5) == -1
    assert a.take_signal(1.6) == 0  # one signal per slot
    assert b.take_signal(2.5) == 1  # slot 1 was idle: send more
    assert sig.emitted() == {"increase": 1, "decrease": 2}


def test_flush_cadence() -> None:
    c = FlushCadence(1.0, None, now=10.0)
    assert not c.reports and not c.due(10.99) and c.due(11.0)
    c.flushed(11.0)
    assert not c.due(11.5) and c.due(12.0)
    coordinated = FlushCadence(5.0, 2.0, now=0.0)
    assert coordinated.reports
    assert coordinated.every_s == min(2.0, FIRST_PLAN_S)  # the first report comes early
    coordinated.flushed(1.0)  # no table of the controller's yet: reports stay early
    assert coordinated.every_s == min(2.0, FIRST_PLAN_S)
    coordinated.planned = True  # the first table came (WorkerCore.on_table)
    coordinated.flushed(1.1)
    assert coordinated.every_s == 2.0
    coordinated.restart(3.0)
    assert coordinated.every_s == min(2.0, FIRST_PLAN_S) and coordinated.last == 3.0
    assert not coordinated.planned  # a new run waits for its own first plan
    coordinated.flushed(4.9)
    assert coordinated.every_s == min(2.0, FIRST_PLAN_S)
    coordinated.flushed(5.0)  # no plan after report_every_s: the usual cadence anyway
    assert coordinated.every_s == 2.0


def test_each_source_gets_each_newer_table_once() -> None:
    relay = TableRelay()
    assert relay.take_new(0) is None
    t1, t2 = SimpleNamespace(version=1), SimpleNamespace(version=2)
    relay.offer(t1)
    assert relay.take_new(0) is t1 and relay.take_new(0) is None
    relay.offer(t2)
    relay.offer(t1)  # an older answer arriving late changes nothing
    relay.offer(None)
    assert relay.take_new(0) is t2 and relay.take_new(1) is t2
    assert relay.take_new(1) is None
