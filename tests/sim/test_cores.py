"""The simulator over the runtime's own cores (runtime.sim.cores): its
virtual clock, and runs that are exact, deterministic and follow the
configured capacities."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from runtime.inputs import generators
from runtime.sim import simulate
from runtime.sim.cores import Deadlock, DutyCycle, VirtualTime, _Call, _Inbox


def test_threads_sleeping_at_once_take_the_longest_sleep_not_the_sum() -> None:
    vt = VirtualTime(t0=0.0)
    woke: list[tuple[str, float]] = []

    def sleeper(name: str, s: float) -> None:
        vt.sleep(s)
        woke.append((name, vt.now))

    vt.spawn("a", lambda: sleeper("a", 2.0))
    vt.spawn("b", lambda: sleeper("b", 0.5))
    vt.run()
    assert woke == [("b", 0.5), ("a", 2.0)]


def test_a_waiter_wakes_when_another_thread_makes_its_condition_true() -> None:
    vt = VirtualTime(t0=0.0)
    flag = threading.Event()
    seen: list[tuple[bool, float]] = []

    def waiter() -> None:
        seen.append((vt.wait_until(flag.is_set, timeout=10.0), vt.now))
        seen.append((vt.wait_until(lambda: False, timeout=1.0), vt.now))  # times out

    def setter() -> None:
        vt.sleep(3.0)
        flag.set()

    vt.spawn("waiter", waiter)
    vt.spawn("setter", setter)
    vt.run()
    assert seen == [(True, 3.0), (False, 4.0)]


def test_a_deadlock_is_an_error_not_a_hang() -> None:
    vt = VirtualTime(t0=0.0)
    vt.spawn("stuck", lambda: vt.wait_until(lambda: False))
    with pytest.raises(Deadlock):
        vt.run()


@pytest.mark.parametrize("transit_s", [0.0, 0.004])
def test_a_call_to_a_stopped_worker_reaches_it_when_it_runs_again(transit_s: float) -> None:
    """A duty-cycled worker (0.3: runs 30 ms of every 100 ms) takes in no call
    while stopped, as a SIGSTOPped process does: a call that arrives then (it
    travels ``transit_s``) is enqueued at the worker's next running moment, in
    send order; one that arrives while it runs, on arrival."""
    vt = VirtualTime(t0=0.0)
    duty = DutyCycle(SimpleNamespace(initial=[0.3], changes=[]), 0, 0.0, vt)
    assert duty.resume_at(0.02) == 0.02
    assert duty.resume_at(0.05) == pytest.approx(0.1)
    assert duty.resume_at(0.12) == 0.12
    got: list[tuple[float, list]] = []
    core = SimpleNamespace(enqueue=lambda source, parts: got.append((vt.now, parts)))
    inbox = _Inbox(vt, core, duty, transit_s)  # type: ignore[arg-type]
    sent = [False]

    def source() -> None:
        for at, part in ((0.01, "a"), (0.05, "b"), (0.07, "c"), (0.12, "d")):
            vt.sleep(at - vt.now)
            inbox.send(0, [part], _Call())
        sent[0] = True

    vt.spawn("source", source)
    vt.spawn("inbox", lambda: inbox.deliver(lambda: not sent[0]))
    vt.run()
    assert [parts for _, parts in got] == [["a"], ["b"], ["c"], ["d"]]
    # sent at 10, 50, 70 and 120 ms; the worker runs in [0, 30) and [100, 130) ms
    assert [t for t, _ in got] == pytest.approx([0.01 + transit_s, 0.1, 0.1, 0.12 + transit_s])


def test_a_duty_cycle_says_when_its_period_started_as_the_real_throttler_does() -> None:
    """``resumed()``: the latest period's start and the stops before it
    (``actors.throttle.StoppedClock.resumed``), read while the worker runs;
    after a change to 1 the periods go on, with no stop in them."""
    vt = VirtualTime(t0=2.0)
    duty = DutyCycle(SimpleNamespace(initial=[0.3], changes=[(0.2, 0, 1.0)]), 0, 2.0, vt)
    seen = []
    for at in (2.01, 2.109, 2.215, 2.35):
        vt.spawn("w", lambda at=at: (vt.sleep(at - vt.now), seen.append(duty.resumed())))
        vt.run()
    assert seen == [pytest.approx(x) for x in ((2.0, 0.0), (2.1, 0.07), (2.2, 0.14), (2.3, 0.14))]


def _topology(scheme: str, **over) -> dict:
    topo = {
        "name": f"cores-{scheme}",
        "input": {"format": "evolving-zipf", "messages": 30_000, "keys": 2_000, "skew": 1.0,
                  "seed": 2, "shift_every": 10_000},
        "sources": 2,
        "workers": {"count": 4, "capacity": [1, 1, 0.5, 0.25], "service_us": 100},
        "grouping": {"scheme": scheme},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.5},
        "run": {"batch": 500},
    }
    for k, v in over.items():
        topo[k] = {**topo.get(k, {}), **v} if isinstance(v, dict) else v
    return topo


def _numbers(report: dict) -> dict:
    """What must not change between two runs of one topology and seed (wall
    time and phases do)."""
    keep = ("messages", "duration_s", "throughput_msgs_per_s", "latency_ms", "imbalance",
            "replication", "migrations", "signals", "workers", "capacity_efficiency")
    return {k: report[k] for k in keep}


@pytest.mark.parametrize("scheme", ["kg", "pkg", "cg", "acg", "fish", "wrr"])
def test_a_run_over_the_cores_is_exact_and_deterministic(scheme: str) -> None:
    spec = _topology(scheme)["input"]
    exact = Counter(generators.generate(0, spec["messages"], spec)["key"].tolist())
    a = simulate(_topology(scheme))
    b = simulate(_topology(scheme))
    assert a.report["engine"] == "sim" and a.report["sim"]["model"] == "cores"
    assert dict(zip(a.result.column("key").to_pylist(), a.result.column("count").to_pylist(),
                    strict=True)) == dict(exact)
    assert a.report["messages"] == {"input": 30_000, "processed": 30_000}
    assert _numbers(a.report) == _numbers(b.report)
    assert a.result.equals(b.result)


def test_aggregates_with_nulls_over_the_cores_equal_the_exact_answer() -> None:
    """A generated stream's ``amount`` column has nulls (~5%), carried to the
    workers as records; keys split by acg."""
    topo = _topology("acg", app={"kind": "aggregate", "value": "amount",
                                 "aggs": ["count", "sum", "min", "max", "mean"]},
                     input={"format": "zipf", "messages": 20_000, "keys": 500, "seed": 4})
    from runtime.operators import table_diff

    cols = generators.generate(0, 20_000, topo["input"], columns=("amount",))
    rows = pa.table({c: pa.array(cols[c], from_pandas=True) for c in ("key", "amount")})
    aggs = ("count", "sum", "min", "max", "mean")
    exact = rows.group_by("key").aggregate(  # count: rows, as Spark's count(*)
        [("amount", "count", pc.CountOptions(mode="all")), *(("amount", a) for a in aggs[1:])])
    exact = exact.select(["key", *(f"amount_{a}" for a in aggs)]).rename_columns(["key", *aggs])
    got = simulate(topo)
    assert table_diff(got.result.sort_by("key"), exact.sort_by("key")) is None


def test_the_workers_follow_their_capacities() -> None:
    """wrr, told the capacities, gives each worker its share; a saturated run
    takes the time the capacities predict (the cores' own service emulation
    on the virtual clock)."""
    res = simulate(_topology("wrr"))
    processed = [w["processed"] for w in res.report["workers"]]
    shares = [p / 30_000 for p in processed]
    for got, want in zip(shares, [1 / 2.75, 1 / 2.75, 0.5 / 2.75, 0.25 / 2.75], strict=True):
        assert abs(got - want) < 0.01, shares
    assert res.report["capacity_efficiency"] > 0.95
