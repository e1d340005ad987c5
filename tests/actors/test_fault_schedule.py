"""The fault injector (actors.faults.FaultInjector) without Ray: what the
topology's ``faults`` and ``workers.changes`` say to do, when, and only once."""

from __future__ import annotations

from actors.faults import FaultInjector, Join, Kill, Leave, not_yet_added
from runtime.topology import Topology


def topology(**fields) -> Topology:
    data = {"name": "t", "input": {"format": "zipf", "messages": 1000, "keys": 10},
            "sources": 2, "workers": {"count": 3}}
    data.update(fields)
    return Topology.model_validate(data)


def timed(*kills: tuple[float, str]) -> list:
    return [(at_s, None, name) for at_s, name in kills]


def test_kills_come_in_time_order_each_once() -> None:
    inj = FaultInjector(timed((15.0, "source-1"), (10.0, "worker-2"), (10.0, "worker-0")))
    assert len(inj) == 3
    assert inj.due(9.99) == []
    assert inj.due(10.0) == [Kill(10.0, "worker-0"), Kill(10.0, "worker-2")]  # ties: by name
    assert inj.due(12.0) == [] and len(inj) == 1
    assert inj.due(99.0) == [Kill(15.0, "source-1")]
    assert inj.due(100.0) == [] and len(inj) == 0  # injected once


def test_a_late_poll_gets_every_overdue_action_with_its_own_at_s() -> None:
    inj = FaultInjector(timed((1.0, "worker-1"), (2.0, "source-0")), joins=[(1.5, None, 3)],
                        leaves=[(0.5, None, 2)])
    got = inj.due(60.0)
    assert [a.at_s for a in got] == [1.0, 2.0, 0.5, 1.5]  # the kills, then membership
    assert got == [Kill(1.0, "worker-1"), Kill(2.0, "source-0"), Leave(0.5, 2), Join(1.5, 3)]
    assert inj.due(61.0) == []


def test_a_count_trigger_fires_once_the_sources_have_that_many_acked() -> None:
    """``after_messages``: by progress, not by the clock - a slow machine
    delays it in time but not in the stream. Its ``at_s`` is when it was due."""
    inj = FaultInjector([(None, 50_000, "worker-1"), (2.0, None, "source-0"),
                         (None, 20_000, "aggregator")], leaves=[(None, 50_000, 0)])
    assert inj.due(100.0, acked=19_999) == [Kill(2.0, "source-0")]
    assert inj.due(101.0, acked=49_999) == [Kill(101.0, "aggregator", 20_000)]
    assert inj.due(102.5, acked=80_000) == [Kill(102.5, "worker-1", 50_000),
                                            Leave(102.5, 0, 50_000)]
    assert inj.due(1e9, acked=10**9) == [] and len(inj) == 0


def test_count_triggers_from_the_topology_and_a_restart_keeps_the_unfired() -> None:
    from actors.faults import still_to_inject

    topo = topology(faults=[{"after_messages": 300, "kill": "worker-2"},
                            {"after_messages": 900, "kill": "aggregator"},
                            {"at_s": 1, "kill": "source-1"}, {"at_s": 5, "kill": "worker-0"}],
                    workers={"count": 3, "changes": [{"after_messages": 600, "add": 1}]})
    inj = FaultInjector.of(topo)
    assert not_yet_added(topo) == [3]
    assert inj.due(0.5, acked=300) == [Kill(0.5, "worker-2", 300)]
    assert inj.due(0.9, acked=700) == [Join(0.9, 3, 600)]
    # the aggregator died at 2 s after worker-2 and source-1 did: the new attempt
    # injects what was not due yet (it counts its own acks from 0)
    failures = [{"actor": "worker-2", "after_messages": 300, "at_s": 0.5},
                {"actor": "source-1", "after_messages": None, "at_s": 1.0}]
    assert [f.kill for f in still_to_inject(topo.faults, 2.0, failures)] == [
        "aggregator", "worker-0"]


def test_kill_names_its_actor() -> None:
    k = Kill(3.0, "worker-12")
    assert (k.kind, k.index) == ("worker", 12)
    assert (Kill(0.0, "source-0").kind, Kill(0.0, "source-0").index) == ("source", 0)


def test_membership_changes_from_the_topology() -> None:
    topo = topology(workers={"count": 3, "changes": [
        {"at_s": 5, "add": 2}, {"at_s": 2, "remove": 1},
        {"at_s": 1, "worker": 0, "capacity": 0.5}]})  # a capacity change is not membership
    inj = FaultInjector.of(topo)
    assert not_yet_added(topo) == [3, 4]
    assert len(inj) == 3
    assert inj.due(1.0) == []
    assert inj.due(2.0) == [Leave(2.0, 1)]
    assert inj.due(5.0) == [Join(5.0, 3), Join(5.0, 4)]
    assert (Join.op, Leave.op) == ("add", "remove")  # report.json's membership_changes op
    assert len(inj) == 0


def test_faults_from_the_topology() -> None:
    topo = topology(faults=[{"at_s": 3, "kill": "worker-2"}, {"at_s": 1, "kill": "source-1"}])
    inj = FaultInjector.of(topo)
    assert inj.due(3.0) == [Kill(1.0, "source-1"), Kill(3.0, "worker-2")]
    assert FaultInjector.of(topology()).due(1e9) == []


def test_a_kill_never_takes_the_last_live_worker() -> None:
    refused = FaultInjector.kill_refused
    assert refused(Kill(1.0, "worker-1"), dead=set(), inactive=set(), n_workers=3) == ""
    assert refused(Kill(1.0, "worker-1"), dead={1}, inactive=set(), n_workers=3) == (
        "already dead")
    assert refused(Kill(1.0, "worker-2"), dead={0, 1}, inactive=set(), n_workers=3) == (
        "not injected: it is the last live worker")
    # sources restart
    assert refused(Kill(1.0, "source-0"), dead={0, 1}, inactive=set(), n_workers=3) == ""


def test_a_kill_counts_workers_not_joined_yet_as_not_live() -> None:
    refused = FaultInjector.kill_refused
    # worker-3 joins later: killing it now would have it join dead
    assert refused(Kill(1.0, "worker-3"), dead=set(), inactive={3}, n_workers=4) == (
        "not injected: it has not joined yet")
    # worker-0 dead, worker-3 not joined: of 4, worker-1 and worker-2 are live
    assert refused(Kill(1.0, "worker-1"), dead={0}, inactive={3}, n_workers=4) == ""
    assert refused(Kill(1.0, "worker-2"), dead={0, 1}, inactive={3}, n_workers=4) == (
        "not injected: it is the last live worker")


def test_a_leave_needs_a_live_worker_and_another_one() -> None:
    refused = FaultInjector.leave_refused
    assert refused(Leave(1.0, 0), dead=set(), inactive={3}, n_workers=4) == ""
    assert refused(Leave(1.0, 0), dead={0}, inactive=set(), n_workers=4) == (
        "not live: nothing to remove")
    assert refused(Leave(1.0, 3), dead=set(), inactive={3}, n_workers=4) == (
        "not live: nothing to remove")
    assert refused(Leave(1.0, 2), dead={0}, inactive={3}, n_workers=4) == ""  # 1 stays
    assert refused(Leave(1.0, 2), dead={0, 1}, inactive={3}, n_workers=4) == (
        "not removed: it is the last live worker")


def test_a_dead_workers_stats_and_every_peak_rss_come_from_typed_stats() -> None:
    """The supervisor's end of a run without Ray: a dead worker's statistics,
    rebuilt from the aggregator's ledger, go through the report's measurements
    like a live one's; peak RSS merges what each actor measured itself."""
    import dataclasses

    import pyarrow as pa

    from actors.faults import ActorProcesses, _dead_worker_stats
    from runtime.dataflow.messages import AggregatorStats, SourceStats
    from runtime.reporting.cores import Capacities, measurements

    topo = topology()
    dead = _dead_worker_stats(1, committed=300)
    assert dead.dead and dead.processed == 300 and dead.series.slot == []
    live = [dataclasses.replace(dead, id=i, dead=False, processed=350, peak_rss_mb=90.0 + i)
            for i in (0, 2)]
    source = SourceStats(
        source=0, routed=1000, acked=1000, batches=1, calls=3, sent_per_worker=[350, 300, 350],
        grouping={}, migrations=0, signals={"increase": 0, "decrease": 0}, route_s=0.0,
        wait_s=0.0, elapsed_s=1.0, end_ts=1.0, committed_ts=1.0, vw_history=[], epoch=1,
        failures=[], resume=None, live_workers=[0, 2], retained_peak_messages=0,
        retained_peak_bytes=0, joins=[], rerouted_messages=0, peak_rss_mb=70.0)
    agg = AggregatorStats(
        partials=3, committed_seq={}, committed_messages={"1": 300}, fenced_workers=[1],
        duplicate_flushes=0, rejected_flushes=0, out_of_order_flushes=0, claims_held=0,
        early_flushes=0, peak_rss_mb=120.0)
    workers = [live[0], dead, live[1]]
    m = measurements(topo, Capacities(topo), 1000, 1.0, 0.0, [source], workers,
                     pa.table({"key": ["a"], "count": [1000]}), agg)
    assert m.messages_processed == 1000
    procs = ActorProcesses.__new__(ActorProcesses)  # no Ray: nothing sampled here
    procs.peak_rss = {}
    assert procs.peaks([source], workers, agg) == {
        "aggregator": 120.0, "source-0.1": 70.0, "worker-0": 90.0, "worker-2": 92.0}
