"""Exactly-once under failures, without Ray: the replay log, claims, the commit
ledger, resume plans, grouping removal, and whole source -> worker -> aggregator
runs where a worker dies and a source restarts (direct calls, fake clock)."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pytest

from actors.aggregator import AggregatorCore
from actors.source import SourceCore
from actors.worker import WorkerCore
from runtime.apps import make_app
from runtime.grouping import make_grouping
from runtime.reliability import (
    ClaimLog,
    CommitLedger,
    Entry,
    FaultSchedule,
    Flush,
    ReplayLog,
    Tag,
    WorkerLost,
    resume_plan,
)


def _idx(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int32)


# --------------------------------------------------------------------------- replay log


def test_replay_log_keeps_until_committed_and_replays_exactly_the_uncovered() -> None:
    log = ReplayLog()
    e = [log.add(Entry(w, b, _idx(0, 1), None, None, 0.0)) for b, w in
         [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]]
    assert log.watermark(3) == 0 and log.messages == 10
    log.acked(e[0], flush_seq=1, committed_seq=0)
    log.acked(e[2], flush_seq=2, committed_seq=0)
    log.acked(e[1], flush_seq=1, committed_seq=1)  # worker 1 committed flush 1
    assert log.watermark(3) == 0  # e[0] (worker 0, flush 1) not committed yet
    log.committed(0, 1)
    assert log.watermark(3) == 1 and len(log) == 3
    # worker 0 dies with flush 1 committed: flush 2 (e[2]) and the unacked e[3] replay
    lost = log.take(0, committed_seq=1)
    assert [(x.batch, x.flush_seq) for x in lost] == [(1, 2), (2, None)]
    assert log.pending_workers() == [1] and log.watermark(3) == 2
    log.committed(1, 5)
    assert len(log) == 1  # e[4] was never acked: no flush holds it yet
    log.acked(e[4], flush_seq=2, committed_seq=2)
    assert len(log) == 0 and log.watermark(3) == 3 and log.messages == 0


def test_replay_log_watermark_holds_for_a_replayed_older_batch() -> None:
    log = ReplayLog()
    a = log.add(Entry(0, 4, _idx(0), None, None, 0.0))
    log.add(Entry(1, 7, _idx(0), None, None, 0.0))
    (lost,) = log.take(0, 0)
    assert lost is a and log.watermark(8) == 7
    log.add(Entry(1, 4, _idx(0), None, None, 0.0, replay=True))  # re-routed
    assert log.watermark(8) == 4


# --------------------------------------------------------------------------- claims + ledger


def _tag(batch: int, idx: np.ndarray, epoch: int = 0, wm: int = 0, source: int = 0) -> Tag:
    return Tag(source, epoch, batch, idx, wm)


def test_claim_log_flushes_fences_dedups_and_prunes() -> None:
    c = ClaimLog()
    assert c.processed(_tag(0, _idx(0, 1, 2))) == 1
    f1 = c.close(7, "p1")
    assert (f1.worker, f1.seq, f1.messages) == (7, 1, 3)
    assert [(b, i.tolist()) for b, i in f1.claims[0]] == [(0, [0, 1, 2])]
    assert c.processed(_tag(1, _idx(5), wm=1)) == 2
    keep = c.filter_new(_tag(1, _idx(4, 5, 6)))
    assert keep is not None and keep.tolist() == [0, 2] and c.duplicates == 1
    assert c.filter_new(_tag(2, _idx(5))) is None
    # watermark 1: batch 0 is committed everywhere, its claims are pruned
    ans = c.fence(0, epoch=1)
    assert [(b, i.tolist(), s) for b, i, s in ans["claims"]] == [(1, [5], 2)]
    assert ans["watermark"] == 1
    assert not c.admits(_tag(3, _idx(0), epoch=0)) and c.admits(_tag(3, _idx(0), epoch=1))


def test_ledger_commits_in_order_ignores_duplicates_and_fences() -> None:
    agg = AggregatorCore("wordcount", {})
    t = make_app("wordcount").new_worker_state()

    def flush(worker: int, seq: int, keys: list[str]) -> Flush:
        t.process(pa.array(keys))
        return Flush(worker, seq, t.flush(), {0: [(seq, _idx(*range(len(keys))))]}, {0: 0},
                     len(keys))

    assert agg.commit(flush(0, 1, ["a"])) == ("commit", 1)
    f3 = flush(0, 3, ["c"])
    assert agg.commit(f3) == ("pending", 1)  # early: waits for 2
    assert agg.commit(flush(0, 2, ["b"])) == ("commit", 3)
    assert agg.commit(f3)[0] == "duplicate"
    assert agg.commit(flush(1, 1, ["x"])) == ("commit", 1)
    assert agg.fence_worker(1) == 1
    assert agg.commit(flush(1, 2, ["y"]))[0] == "fenced"
    got = dict(zip(*agg.result().to_pydict().values(), strict=True))
    assert got == {"a": 1, "b": 1, "c": 1, "x": 1}
    st = agg.stats()
    assert st["committed_messages"] == {"0": 3, "1": 1} and st["fenced_workers"] == [1]
    assert [b for b, _ in agg.committed_claims(0)["claims"]] == [1, 2, 3, 1]  # commit order


def test_ledger_prunes_claims_below_the_watermark() -> None:
    led = CommitLedger()
    led.record(Flush(0, 1, None, {0: [(0, _idx(1)), (3, _idx(2))]}, {0: 0}, 2))
    led.record(Flush(0, 2, None, {0: [(4, _idx(0))]}, {0: 3}, 1))
    assert [b for b, _ in led.claims_of(0)["claims"]] == [3, 4]
    assert led.claims_of(0)["watermark"] == 3


def test_resume_plan_skips_claimed_and_retains_uncommitted() -> None:
    fences = {
        0: {"claims": [(5, _idx(0, 1), 3), (6, _idx(2), 4)], "watermark": 5, "committed_seq": 3},
        2: {"claims": [(4, _idx(9), 1), (6, _idx(0), 2)], "watermark": 4, "committed_seq": 1},
    }
    committed = {"claims": [(6, _idx(1)), (3, _idx(0))], "watermark": 2}  # a dead worker's
    plan = resume_plan(fences, committed)
    assert plan.start_batch == 5 and plan.last_claimed_batch == 6
    todo, retain = plan.split(6, 4)
    assert todo.tolist() == [3]
    assert sorted((w, i.tolist(), s) for w, i, s in retain) == [(0, [2], 4), (2, [0], 2)]
    todo, retain = plan.split(5, 3)
    assert todo.tolist() == [2] and retain == []  # worker 0 committed flush 3
    assert plan.split(9, 2)[0].tolist() == [0, 1]


def test_fault_schedule_pops_due_faults_in_order() -> None:
    fs = FaultSchedule([(15.0, "source-1"), (10.0, "worker-3")])
    assert fs.due(9.9) == [] and len(fs) == 2
    assert fs.due(12.0) == [(10.0, "worker-3")]
    assert fs.due(99.0) == [(15.0, "source-1")] and len(fs) == 0


# --------------------------------------------------------------------------- whole runs


class FakeTime:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class Cluster:
    """Workers + aggregator with direct calls. ``kill(w)``: the worker's process
    is gone - nothing it holds is flushed again, calls to it fail."""

    def __init__(self, n: int, ft: FakeTime) -> None:
        self.ft = ft
        app = make_app("wordcount")
        self.agg = AggregatorCore("wordcount", {})
        self.dead: set[int] = set()
        self.workers = [WorkerCore(i, app.new_worker_state(), service_us=50.0, clock=ft.clock,
                                   sleep=ft.sleep, t0=ft.t, sink=self._sink(i),
                                   aggregate_every_s=0.02, queue_batches=64)
                        for i in range(n)]

    def _sink(self, i: int):
        def commit(flush: Flush) -> None:
            if i not in self.dead:
                _, seq = self.agg.commit(flush)
                self.workers[i].on_committed(seq)
        return commit

    def kill(self, w: int) -> None:
        self.dead.add(w)

    # Control
    def fence_worker(self, w: int, source: int):
        return self.agg.fence_for_source(w, source)

    def commit(self, workers):
        out = {}
        for w in workers:
            out[w] = (WorkerLost(w) if w in self.dead
                      else self.workers[w].wait_committed(self.workers[w].flush_now(), 0))
        return out

    def finish(self) -> dict:
        for i, w in enumerate(self.workers):
            if i not in self.dead:
                w.finish()
        return dict(zip(*self.agg.result().to_pydict().values(), strict=True))


class Transport:
    """One source's calls; ``wait`` processes the oldest outstanding sub-batch."""

    def __init__(self, cluster: Cluster, source: int) -> None:
        self.c = cluster
        self.source = source
        self.items: dict[int, tuple[int, object]] = {}
        self.next = 0

    def send(self, worker, keys, labels, emit_ts, tag=None):
        tok = self.next
        self.next += 1
        item = None
        if worker not in self.c.dead:
            item = self.c.workers[worker].enqueue(self.source, keys, labels, emit_ts, tag)
        self.items[tok] = (worker, item)
        return tok

    def wait(self, tokens, timeout):
        if timeout == 0:
            return []
        tok = min(tokens)
        w, item = self.items.pop(tok)
        if w in self.c.dead:
            return [(tok, WorkerLost(w))]
        while not item.done.is_set():
            assert self.c.workers[w].step(timeout=0)
        return [(tok, item.ack)]


def _words(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"w{r}" for r in np.minimum(rng.zipf(1.3, size=n), 300)]


def _batches(data: list[str], size: int = 500) -> list[pa.Table]:
    return [pa.table({"key": data[i:i + size]}) for i in range(0, len(data), size)]


def _source(cluster: Cluster, index: int, scheme: str, ft: FakeTime, **kw) -> SourceCore:
    n = len(cluster.workers)
    return SourceCore(index, make_grouping(scheme, n, seed=index, clock=ft.clock),
                      Transport(cluster, index), n_workers=n, max_inflight=2, clock=ft.clock,
                      sleep=ft.sleep, t0=ft.t, control=cluster, **kw)


@pytest.mark.parametrize("scheme", ["kg", "cg", "fish", "pkg", "ch", "sg"])
def test_worker_death_mid_stream_is_exact(scheme: str) -> None:
    ft = FakeTime()
    c = Cluster(4, ft)
    data0, data1 = _words(30_000, 1), _words(20_000, 2)

    def killing(batches, at: int):
        for b, t in enumerate(batches):
            if b == at:
                c.kill(2)
            yield t

    s0 = _source(c, 0, scheme, ft)
    st0 = s0.run(killing(_batches(data0), 25))
    (f,) = st0["failures"]
    assert f["worker"] == 2 and f["replayed_messages"] > 0 and f["recovered_ts"] is not None
    if scheme == "kg":  # acked but uncommitted work was replayed too
        assert f["replayed_after_ack"] > 0
    assert st0["live_workers"] == [0, 1, 3] and len(s0.log) == 0
    s1 = _source(c, 1, scheme, ft)  # finds out by sending to it
    st1 = s1.run(_batches(data1))
    assert st1["acked"] == 20_000 and st0["acked"] == 30_000
    got = c.finish()
    assert got == dict(collections.Counter(data0 + data1))
    assert c.agg.stats()["fenced_workers"] == [2]


@pytest.mark.parametrize("scheme", ["kg", "cg", "fish"])
def test_two_workers_dying_together_both_recover_exactly(scheme: str) -> None:
    """Workers 2 and 3 die in the same instant: replays of worker 2's work that
    went to worker 3 are lost again and re-routed; both failures still end
    recovered (no replay waits forever) and the count is exact."""
    ft = FakeTime()
    c = Cluster(4, ft)
    data = _words(30_000, 4)

    def killing(batches):
        for b, t in enumerate(batches):
            if b == 25:
                c.kill(2)
                c.kill(3)
            yield t

    st = _source(c, 0, scheme, ft).run(killing(_batches(data)))
    assert sorted(f["worker"] for f in st["failures"]) == [2, 3]
    assert all(f["recovered_ts"] is not None for f in st["failures"]), st["failures"]
    assert st["live_workers"] == [0, 1] and st["acked"] == 30_000
    assert c.finish() == dict(collections.Counter(data))


def test_notified_worker_death_without_traffic_to_it() -> None:
    ft = FakeTime()
    c = Cluster(3, ft)
    s = _source(c, 0, "kg", ft)
    s.notify_worker_failed(1)
    c.kill(1)
    data = _words(5000, 3)
    st = s.run(_batches(data))
    assert st["failures"][0]["replayed_messages"] == 0
    assert c.finish() == dict(collections.Counter(data))


class SourceDied(Exception):
    pass


@pytest.mark.parametrize("scheme", ["kg", "cg", "fish"])
def test_source_restart_resumes_without_loss_or_double_counting(scheme: str) -> None:
    ft = FakeTime()
    c = Cluster(4, ft)
    data = _words(40_000, 4)
    batches = _batches(data)

    def dying(at: int):
        for b, t in enumerate(batches):
            if b == at:
                raise SourceDied
            yield t

    old = _source(c, 0, scheme, ft)
    with pytest.raises(SourceDied):
        old.run(dying(40))
    # the dead incarnation left sub-batches queued and processed-but-unacked
    assert old._inflight and len(old.log)
    queued = sum(w._queue.qsize() for w in c.workers)
    assert queued > 0
    new = _source(c, 0, scheme, ft, epoch=1)
    plan = resume_plan({w: c.workers[w].fence_source(0, 1) for w in range(4)},
                       c.agg.committed_claims(0))
    assert 0 < plan.start_batch <= 40
    st = new.run(batches, plan)
    r = st["resume"]
    assert r["skipped_batches"] == plan.start_batch and r["skipped_messages"] > 0
    assert sum(w.claims.rejected for w in c.workers) > 0  # the dead one's queued batches
    assert c.finish() == dict(collections.Counter(data))


def test_source_restart_after_a_worker_death_uses_committed_claims() -> None:
    """Worker 1 dies (its committed flushes hold claims of recent batches), then
    the source dies: the new incarnation must not re-send what worker 1 committed."""
    ft = FakeTime()
    c = Cluster(3, ft)
    data = _words(30_000, 5)
    batches = _batches(data)

    def events():
        for b, t in enumerate(batches):
            if b == 20:
                c.kill(1)
            if b == 35:
                raise SourceDied
            yield t

    old = _source(c, 0, "kg", ft)
    with pytest.raises(SourceDied):
        old.run(events())
    new = _source(c, 0, "kg", ft, epoch=1, dead_workers=[1])
    plan = resume_plan({w: c.workers[w].fence_source(0, 1) for w in (0, 2)},
                       c.agg.committed_claims(0))
    new.run(batches, plan)
    assert c.finish() == dict(collections.Counter(data))


@pytest.mark.parametrize("scheme", ["ch", "fish", "cg", "kg"])
def test_worker_added_then_one_retired_mid_stream_is_exact(scheme: str) -> None:
    """Elasticity at the source: worker 3 joins at batch 15 (it existed idle),
    worker 0 is retired at batch 40 (fenced like a dead worker: its uncommitted
    work is re-routed, nothing lost)."""
    ft = FakeTime()
    c = Cluster(4, ft)
    data = _words(40_000, 6)
    s = _source(c, 0, scheme, ft, dead_workers=[3])

    def events():
        for b, t in enumerate(_batches(data)):
            if b == 15:
                s.notify_worker_added(3)
            if b == 40:
                s.notify_worker_failed(0)
                c.kill(0)
            yield t

    st = s.run(events())
    assert st["joins"][0]["worker"] == 3 and st["live_workers"] == [1, 2, 3]
    assert c.workers[3].processed > 0
    assert c.finish() == dict(collections.Counter(data))


def test_topology_membership_changes_split_from_capacity_changes() -> None:
    from runtime.topology import TopologyError, load_topology

    t = load_topology({"workers": {"count": 4, "changes": [
        {"at_s": 1, "worker": 0, "capacity": 0.5}, {"at_s": 2, "add": 2, "capacity": 0.5},
        {"at_s": 4, "remove": 5}, {"at_s": 5, "worker": 4, "capacity": 1.0}]}})
    w = t.workers
    assert [c.worker for c in w.changes] == [0, 4]
    assert w.total_count == 6 and w.added() == [(2.0, 4, 0.5), (2.0, 5, 0.5)]
    assert [m.remove for m in w.membership] == [None, 5]
    with pytest.raises(TopologyError, match="exactly one of add or remove"):
        load_topology({"workers": {"changes": [{"at_s": 1, "add": 1, "remove": 0}]}})
    with pytest.raises(TopologyError, match="remove: worker 7 does not exist"):
        load_topology({"workers": {"count": 4, "changes": [{"at_s": 1, "remove": 7}]}})


def test_replay_skips_what_the_dead_worker_committed_without_the_ack_being_seen() -> None:
    log = ReplayLog()
    a = log.add(Entry(0, 3, _idx(0, 1, 2), pa.array(["x", "y", "z"]), None, 0.0))
    log.add(Entry(0, 4, _idx(5), pa.array(["w"]), None, 0.0))
    # worker 0 committed all of a (flush 2) and message 5 of batch 4 was not committed
    lost = log.take(0, committed_seq=2, committed=[(3, _idx(0, 1, 2)), (4, _idx(7))])
    assert [(e.batch, e.idx.tolist()) for e in lost] == [(4, [5])] and a.flush_seq is None
    log = ReplayLog()
    log.add(Entry(0, 3, _idx(0, 1, 2), pa.array(["x", "y", "z"]), None, 0.0))
    (part,) = log.take(0, 0, committed=[(3, _idx(1))])
    assert part.idx.tolist() == [0, 2] and part.keys.to_pylist() == ["x", "z"]


@pytest.mark.parametrize("scheme", ["kg", "ch"])
def test_worker_dying_after_committing_unacked_work_is_not_double_counted(scheme: str) -> None:
    """The worker processes and commits what it holds, then dies before any of
    those acks reach the source: the source must not replay them."""
    ft = FakeTime()
    c = Cluster(3, ft)
    data = _words(20_000, 8)

    def events():
        for b, t in enumerate(_batches(data)):
            if b == 20:
                w = c.workers[1]
                while w.step(timeout=0):
                    pass
                w.wait_committed(w.flush_now(), 0)
                c.kill(1)
            yield t

    s = _source(c, 0, scheme, ft)
    st = s.run(events())
    assert st["failures"][0]["worker"] == 1
    assert c.finish() == dict(collections.Counter(data))
