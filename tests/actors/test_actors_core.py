"""The actors' plain classes without Ray: worker, source, aggregator, fake clock."""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from conftest import FakeTime

from runtime.dataflow.aggregator import AggregatorCore
from runtime.dataflow.messages import Ack
from runtime.dataflow.reliability import Part
from runtime.dataflow.settings import AggregatorSettings, SourceSettings, WorkerSettings
from runtime.dataflow.source import SourceCore, rebatch
from runtime.dataflow.worker import WorkerCore
from runtime.grouping import make_grouping
from runtime.grouping.signals import WorkerSignals
from runtime.operators import WorkerApp, builtin_operator


class DirectTransport:
    """Sends enqueue into the worker; ``wait`` lets the workers process in FIFO order."""

    def __init__(self, workers: list[WorkerCore], source: int = 0) -> None:
        self.workers = workers
        self.source = source
        self.items: dict[int, tuple[int, object]] = {}
        self.next = 0
        self.max_inflight_seen = collections.Counter()

    def send(self, worker, parts):
        item = self.workers[worker].enqueue(self.source, parts)
        tok = self.next
        self.next += 1
        self.items[tok] = (worker, item)
        inflight = sum(1 for w, _ in self.items.values() if w == worker)
        self.max_inflight_seen[worker] = max(self.max_inflight_seen[worker], inflight)
        return tok

    def wait(self, tokens, timeout):
        if timeout == 0:
            return []
        tok = tokens[0]  # process the oldest outstanding batch of that worker
        w, item = self.items.pop(tok)
        while not item.done.is_set():
            assert self.workers[w].step(timeout=0)
        return [(tok, item.ack)]


def words(n: int, n_keys: int = 50, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.3, size=n), n_keys)
    return [f"w{r}" for r in ranks]


def make_workers(n: int, ft: FakeTime, sink: list, **kw) -> list[WorkerCore]:
    """``kw``: ``WorkerSettings`` fields."""
    op = builtin_operator("wordcount")
    settings = WorkerSettings(service_us=100.0, aggregate_every_s=0.05, **kw)
    return [WorkerCore(i, WorkerApp(op), settings, clock=ft.clock, sleep=ft.sleep, t0=ft.t,
                       sink=sink.append)
            for i in range(n)]


@pytest.mark.parametrize("scheme", ["kg", "sg", "pkg", "cg"])
def test_source_to_workers_to_aggregator_is_exact(scheme: str) -> None:
    ft = FakeTime()
    partials: list = []
    workers = make_workers(4, ft, partials, queue_batches=4, queue_capacity_batches=2)
    transport = DirectTransport(workers)
    g = make_grouping(scheme, 4, seed=3, clock=ft.clock)
    src = SourceCore(0, g, transport, SourceSettings(n_workers=4, max_inflight=2), clock=ft.clock,
                     sleep=ft.sleep, t0=ft.t)
    data = words(20_000)
    batches = [pa.table({"key": data[i:i + 1000]}) for i in range(0, len(data), 1000)]
    stats = src.run(batches)
    assert stats.routed == stats.acked == 20_000
    assert max(transport.max_inflight_seen.values()) <= 2  # backpressure window
    assert sum(w.processed for w in workers) == 20_000
    for w in workers:
        w.finish()
    agg = AggregatorCore(AggregatorSettings({"kind": "wordcount"}))
    for p in partials:
        agg.merge(p)
    got = dict(zip(*agg.result().to_pydict().values(), strict=True))
    assert got == dict(collections.Counter(data))
    assert sum(stats.sent_per_worker) == 20_000
    if scheme == "kg":  # one worker per key: keys held add up to the distinct keys
        assert sum(w.distinct_keys for w in workers) == len(set(data))


def test_a_coordinator_that_fails_loses_no_committed_flush() -> None:
    """The aggregator applies a flush before it asks the coordinator for a
    plan: a coordinator that raises (a bug) fails the commit call - the
    worker then fails the run - but what was committed stays committed (it
    was once admitted and never applied, and every later flush of that
    worker waited for it)."""
    ft = FakeTime()
    flushes: list = []
    (w,) = make_workers(1, ft, flushes)
    w.enqueue(0, [Part.of(pa.array(["a", "b", "a"]), ft.t)])
    assert w.step(0) and w.maybe_flush(force=True)

    class Broken:
        def tick(self, now: float) -> None:
            raise ValueError("a bug in the plan")

    agg = AggregatorCore(AggregatorSettings({"kind": "wordcount"}), Broken())
    with pytest.raises(ValueError, match="a bug in the plan"):
        agg.commit(flushes[0])
    assert agg.committed_seq(0) == flushes[0].seq
    assert dict(zip(*agg.result().to_pydict().values(), strict=True)) == {"a": 2, "b": 1}


def test_service_time_and_latency_are_per_message() -> None:
    ft = FakeTime()
    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")), WorkerSettings(service_us=1000.0),
                   clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    emit = ft.t
    w.enqueue(0, [Part.of(pa.array(["a"] * 100), emit)])
    w.enqueue(0, [Part.of(pa.array(["b"] * 100), emit)])
    assert w.step(0) and w.step(0)
    # 200 messages of 1 ms from an idle worker: message i finishes (i + 1) ms after emission
    # (the histogram's bins are within 2.3%; the count, sum and max are exact)
    assert w.latency.max_s == pytest.approx(0.2)
    assert w.latency.count == 200
    assert w.latency.sum_s / 200 == pytest.approx(0.1005)
    stats = w.finish()
    assert stats.processed == 200 and stats.keys == 2


def test_service_mode_capacity_scales_rate() -> None:
    ft = FakeTime()
    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=100.0, capacity=0.25, throttle="service"),
                   clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    t = ft.t
    for _ in range(20):
        w.enqueue(0, [Part.of(pa.array(["a"] * 500), ft.t)])
        w.step(0)
    assert ft.t - t == pytest.approx(10_000 * 100e-6 / 0.25)  # 400 us per message
    w.set_capacity(1.0)
    assert w.service.cost_s == pytest.approx(100e-6)
    # in duty-cycle mode capacity is NOT applied by the emulator (applied once, by SIGSTOP)
    d = WorkerCore(1, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=100.0, capacity=0.25, throttle="duty-cycle"),
                   clock=ft.clock, sleep=ft.sleep)
    assert d.service.cost_s == pytest.approx(100e-6)


def test_signals_one_per_slot_per_source_from_queue_utilization() -> None:
    ft = FakeTime(0.0)
    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=0.0, queue_batches=4, queue_capacity_batches=4,
                                  slot_s=1.0, signals=WorkerSignals(slot_s=1.0, busy_above=0.85,
                                                                    idle_below=0.75)),
                   clock=ft.clock, sleep=ft.sleep, t0=0.0)
    # slot 0: queue full (4 of 4) the whole slot, for both sources
    for s in (0, 1, 0, 1):
        w.enqueue(s, [Part.of(pa.array(["x"] * 10), ft.t)])
    ft.t = 1.01
    acks = [w._queue.queue[0]]
    assert w.step(0)
    first = acks[0].ack
    assert first.signal == -1 and first.worker == 0 and first.acked == 10
    assert w.step(0)  # source 1's first ack after slot 0: its own decrease signal
    assert w._queue.queue[0].source == 0
    w.step(0)
    w.step(0)
    # both acks above were in slot 1: each source got exactly one signal for slot 0
    ft.t = 2.5  # slot 1 was mostly empty -> idle
    w.enqueue(0, [Part.of(pa.array(["y"] * 10), ft.t)])
    item = w._queue.queue[0]
    w.step(0)
    assert item.ack.signal == 1
    stats = w.finish()
    assert stats.signals_emitted == {"increase": 1, "decrease": 2}
    s = stats.series
    assert s.queue_batches[0] == pytest.approx(4.0)
    assert s.processed[1] == 40


def test_worker_time_series_slots() -> None:
    ft = FakeTime(0.0)
    # slots of 0.55 s: no batch ends on a slot boundary (where float rounding decides)
    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=1000.0, slot_s=0.55), clock=ft.clock, sleep=ft.sleep,
                   t0=0.0)
    for _ in range(10):
        w.enqueue(0, [Part.of(pa.array(["k"] * 100), ft.t)])
        w.step(0)  # 0.1 s per batch: busy from 0 to 1.0 s
    series = w.finish().series
    assert series.slot == [0, 1]
    assert series.processed == [500, 500]  # batches ending at 0.1..0.5 s, 0.6..1.0 s
    assert series.busy == pytest.approx([1.0, 0.45 / 0.55])


def _wait_for(condition, timeout_s: float = 10.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_bounded_queue_blocks_and_worker_thread_drains() -> None:
    """12 callers, a queue of 2 batches and no processing thread yet: 2 batches
    are queued and the other 10 callers block in ``put``; the thread, once
    started, drains them all."""
    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=100.0, queue_batches=2))
    acks = []
    callers = [threading.Thread(target=lambda i=i: acks.append(
        w.submit(i % 3, [Part.of(pa.array([f"k{i}"] * 50), 0.0)])), daemon=True)
        for i in range(12)]
    for c in callers:
        c.start()
    # a caller counts its batch (queue_msgs) before its put, blocked or not
    assert _wait_for(lambda: w.progress().queue_msgs == 600)
    assert w._queue.qsize() == 2 and w._queue.full()  # the other 10 wait to put
    assert acks == [] and all(c.is_alive() for c in callers)
    th = threading.Thread(target=w.run_forever, daemon=True)
    th.start()
    for c in callers:
        c.join(timeout=10)
    assert not any(c.is_alive() for c in callers)  # released
    w.stop()
    th.join(timeout=5)
    assert not th.is_alive()
    assert len(acks) == 12 and sum(a.acked for a in acks) == 600
    assert w.progress().queue_msgs == 0
    assert w.finish().keys == 12


def test_source_honours_rate() -> None:
    ft = FakeTime()
    partials: list = []
    workers = make_workers(2, ft, partials)
    for w in workers:
        w.service = type(w.service)(0.0, clock=ft.clock, sleep=ft.sleep)  # no service time
    src = SourceCore(0, make_grouping("sg", 2, seed=0), DirectTransport(workers),
                     SourceSettings(n_workers=2, rate_per_source=5_000.0), clock=ft.clock,
                     sleep=ft.sleep, t0=ft.t)
    t = ft.t
    src.run([pa.table({"key": [f"k{i}" for i in range(500)]}) for _ in range(20)])
    assert ft.t - t == pytest.approx(10_000 / 5_000.0)
    assert src.acked == 10_000


class RecordingGrouping:
    """Wraps a grouping and records every ack it is fed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.acks: list[tuple[int, int, int]] = []

    def route(self, h):
        return self.inner.route(h)

    def on_ack(self, worker: int, signal: int = 0, acked: int = 0) -> None:
        self.acks.append((worker, signal, acked))
        self.inner.on_ack(worker, signal, acked)

    def stats(self):
        return self.inner.stats()

    def __getattr__(self, name: str):  # every other hook: the wrapped grouping's
        return getattr(self.inner, name)


def test_every_ack_reaches_the_grouping_with_signals() -> None:
    ft = FakeTime(0.0)
    op = builtin_operator("wordcount")
    sig = WorkerSignals(slot_s=0.1, busy_above=0.85, idle_below=0.75)
    workers = [WorkerCore(i, WorkerApp(op),
                          WorkerSettings(service_us=200.0, signals=sig, queue_capacity_batches=2),
                          clock=ft.clock, sleep=ft.sleep, t0=0.0)
               for i in range(3)]
    g = RecordingGrouping(make_grouping("cg", 3, seed=0))
    src = SourceCore(0, g, DirectTransport(workers), SourceSettings(n_workers=3), clock=ft.clock,
                     sleep=ft.sleep, t0=0.0)
    stats = src.run([pa.table({"key": [f"k{i % 97}" for i in range(900)]}) for _ in range(30)])
    assert sum(a for _, _, a in g.acks) == 27_000 == stats.acked
    signals = [s for _, s, _ in g.acks if s]
    assert signals  # piggybacked on acks
    assert stats.signals["increase"] + stats.signals["decrease"] == len(signals)


def test_latency_counts_from_the_scheduled_time_when_the_source_falls_behind() -> None:
    """Offered 2x what the one worker can do: the source is held back by
    backpressure, and that wait must show up as latency (no coordinated omission).
    """
    ft = FakeTime(0.0)
    workers = make_workers(1, ft, [])  # 100 us/message: 10,000 msgs/s
    # calls of one batch: with fake time the worker only runs while the source waits
    src = SourceCore(0, make_grouping("kg", 1, seed=0), DirectTransport(workers),
                     SourceSettings(n_workers=1, rate_per_source=20_000.0, call_messages=100),
                     clock=ft.clock, sleep=ft.sleep, t0=0.0)
    src.run([pa.table({"key": ["a"] * 100}) for _ in range(100)])  # 10,000 messages
    # the worker's pace (10,000 messages of 100 us), not the offered rate (0.5 s); with
    # fake time the worker runs while the source waits: from the first batch on (a
    # paced source takes acks between its batches)
    assert ft.t == pytest.approx(1.0)
    mean = src.lat_sum_s / src.acked
    # batch j's messages are due at its scheduled time, j x 5 ms; message k of it is
    # done at j x 10 ms + (k + 1) x 100 us: a mean of 252.55 ms. Stamping at send
    # time would hide the wait and give ~a batch's service time
    j, k = np.arange(100)[:, None], np.arange(100)[None, :]
    done = j * 0.01 + (k + 1) * 100e-6
    assert mean == pytest.approx(float((done - j * 100 / 20_000.0).mean()))


def test_a_paced_source_takes_acks_while_it_waits_for_its_next_batch() -> None:
    """A batch every 100 ms (10 ms of work), a window of one call: the source
    takes the ack while it waits for its next batch (with fake time the worker
    runs only while the source waits for acks - a source that slept between
    batches would leave it idle until the memory bound blocked the source),
    so every message is done its service time after it was due."""
    ft = FakeTime(0.0)
    workers = make_workers(1, ft, [])  # 100 us/message
    src = SourceCore(0, make_grouping("kg", 1, seed=0), DirectTransport(workers),
                     SourceSettings(n_workers=1, rate_per_source=1_000.0, max_inflight=1),
                     clock=ft.clock, sleep=ft.sleep, t0=0.0)
    src.run([pa.table({"key": ["a"] * 100}) for _ in range(10)])
    assert src.acked == 1_000 and src.stats().calls == 10
    # message k of each batch is done (k + 1) x 100 us after the batch was due
    assert src.lat_sum_s / src.acked == pytest.approx(float(np.mean((np.arange(100) + 1) * 100e-6)))


def test_an_outbox_lingers_only_if_more_can_come_before_its_deadline() -> None:
    """Below its fill target an outbox waits ``linger_s`` to fill its call -
    unless the source's next messages are routed after that deadline."""
    from runtime.dataflow.outbox import Outboxes
    from runtime.dataflow.reliability import Entry

    ft = FakeTime(0.0)
    sent: list[int] = []

    def send(w: int, entries: list) -> int:
        sent.append(sum(len(e.idx) for e in entries))
        return len(sent)

    ob = Outboxes(1, max_inflight=2, outbox_batches=2, call_messages=1_000, linger_s=0.01,
                  clock=ft.clock)
    ob.saw_batch(1_000)
    ob.drain_rates.acked(0, 1_000, 0.0, 0.001)  # a fast worker: calls of up to 1,000
    ob.queue(Entry(0, 0, np.arange(10, dtype=np.int64), None, np.zeros(10, np.uint64), 0.0))
    ob.flush(send)  # no next batch known: it lingers
    ob.flush(send, next_data_at=0.005)  # the next batch comes within the linger: it waits
    assert sent == []
    ob.flush(send, next_data_at=0.1)  # nothing comes before its deadline: it goes now
    assert sent == [10]


def test_outboxes_are_bounded_and_keep_fifo_per_worker() -> None:
    """One worker 50x slower: the source holds at most ``max_inflight + outbox``
    batches' worth of unacknowledged messages per worker (in flight or queued),
    and each worker sees its sub-batches in routing order (emit times never go
    backwards)."""
    ft = FakeTime()
    partials: list = []
    workers = make_workers(2, ft, partials)
    workers[1].service = type(workers[1].service)(5_000.0, clock=ft.clock, sleep=ft.sleep)
    transport = DirectTransport(workers)
    seen: dict[int, list[float]] = {0: [], 1: []}
    send = transport.send

    def recording_send(worker, parts):
        seen[worker] += [t for p in parts for t in p.emit_ts]
        return send(worker, parts)

    transport.send = recording_send
    src = SourceCore(0, make_grouping("sg", 2, seed=0), transport,
                     SourceSettings(n_workers=2, max_inflight=2, outbox=3, call_messages=100),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    longest = 0
    flush = src._flush

    def watching_flush(force: bool = False) -> None:
        nonlocal longest
        longest = max(longest, int(src.outboxes.held_n().max()))
        flush(force)

    src._flush = watching_flush
    stats = src.run([pa.table({"key": [f"k{i}" for i in range(100)]}) for _ in range(40)])
    assert stats.acked == 4_000
    assert 5 * 100 < longest <= 5 * 100 + 50  # the bound, plus the half batch just routed
    assert max(transport.max_inflight_seen.values()) <= 2
    for w in (0, 1):
        assert seen[w] == sorted(seen[w]) and len(seen[w]) == 40


def test_queued_sub_batches_are_coalesced_into_calls_up_to_the_cap() -> None:
    """A worker that cannot keep up gets its queued sub-batches in few calls:
    one part per call, several segments (batches) in routing order, never more
    than ``call_messages`` messages unless one sub-batch alone is bigger; the
    acks release every sub-batch of a call and the count is exact."""
    ft = FakeTime()
    partials: list = []
    workers = make_workers(2, ft, partials)
    transport = DirectTransport(workers)
    calls: list[tuple[int, list[Part]]] = []
    send = transport.send

    def recording_send(worker, parts):
        calls.append((worker, parts))
        return send(worker, parts)

    transport.send = recording_send
    src = SourceCore(0, make_grouping("sg", 2, seed=0), transport,
                     SourceSettings(n_workers=2, max_inflight=1, outbox=10, call_messages=700),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    keys = [f"k{i % 37}" for i in range(100)]
    stats = src.run([pa.table({"key": keys}) for _ in range(60)])  # 50 per worker and batch
    assert stats.acked == 6_000 and stats.calls == len(calls)
    assert all(len(parts) == 1 for _, parts in calls)
    sizes = [len(parts[0]) for _, parts in calls]
    assert max(sizes) <= 700 and max(sizes) > 50  # coalesced, capped
    for w in (0, 1):
        tags = [parts[0].tag for x, parts in calls if x == w]
        batches = np.concatenate([t.batches for t in tags])
        assert batches.tolist() == list(range(60))  # every batch once, in routing order
        for t, (_, parts) in zip(tags, [c for c in calls if c[0] == w], strict=True):
            assert t.counts.sum() == len(t.idx) == len(parts[0].hashes)
            assert len(parts[0].emit_ts) == len(t.batches)
    # nothing confirms a commit (the sink is a list): the replay log keeps every
    # sub-batch (60 batches x 2 workers), each acked with the flush that holds it
    held = [e for w in (0, 1) for e in src.log.entries(w)]
    assert len(held) == len(src.log) == 120
    assert all(e.flush_seq is not None for e in held)
    total: collections.Counter = collections.Counter()
    for w in workers:
        w.maybe_flush(force=True)
    for p in partials:
        t = builtin_operator("wordcount").finish(p.partial)
        total.update(dict(zip(t.column("key").to_pylist(), t.column("count").to_pylist(),
                              strict=True)))
    assert total == collections.Counter(keys * 60)


class InstantAcks(DirectTransport):
    """Workers with no emulated work whose acks are there as soon as anyone looks."""

    def wait(self, tokens, timeout):
        return [x for tok in tokens for x in DirectTransport.wait(self, [tok], None)]


def _calls_of(linger_s: float, rate: float = 0.0, behind_linger_s: float | None = None
              ) -> tuple[list[tuple[float, int, float]], dict, collections.Counter]:
    """A source (sg over 2 workers, batches of 100) with ``linger_s`` (and
    ``behind_linger_s``): each call's (time sent, messages, its oldest
    message's emit time), the stats and the count."""
    ft = FakeTime()
    partials: list = []
    op = builtin_operator("wordcount")
    workers = [WorkerCore(i, WorkerApp(op), WorkerSettings(service_us=0.0, aggregate_every_s=0.05),
                          clock=ft.clock, sleep=ft.sleep, t0=ft.t, sink=partials.append)
               for i in range(2)]
    transport = InstantAcks(workers)
    calls: list[tuple[float, int, float]] = []
    send = transport.send

    def recording_send(worker, parts):
        calls.append((ft.t, sum(len(p) for p in parts), min(min(p.emit_ts) for p in parts)))
        return send(worker, parts)

    transport.send = recording_send
    src = SourceCore(0, make_grouping("sg", 2, seed=0), transport,
                     SourceSettings(n_workers=2, max_inflight=2, linger_s=linger_s,
                                    behind_linger_s=behind_linger_s, rate_per_source=rate,
                                    call_messages=200),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    keys = [f"k{i % 37}" for i in range(100)]
    stats = src.run([pa.table({"key": keys}) for _ in range(60)])  # 50 per worker and batch
    total: collections.Counter = collections.Counter()
    for w in workers:
        w.finish()
    for p in partials:
        t = builtin_operator("wordcount").finish(p.partial)
        total.update(dict(zip(t.column("key").to_pylist(), t.column("count").to_pylist(),
                              strict=True)))
    assert total == collections.Counter(keys * 60)
    assert stats.acked == 6_000
    return calls, stats, total


def test_lingering_outboxes_fill_calls_across_micro_batches() -> None:
    """Routing as fast as it can, a source holds a worker's sub-batches back
    until they fill a call (``call_messages`` = 200; the acks take no time,
    so that is the cap):
    calls carry four micro-batches' shares instead of one, and the count is
    exact. A worker's first call (no ack seen yet) is one share, sent at once."""
    eager, eager_stats, _ = _calls_of(0.0)
    filled, stats, _ = _calls_of(0.005)
    assert [n for _, n, _ in eager] == [50] * 120  # the windows were never full
    # 3,000 per worker: 50 first, then 14 full calls, and the 150 left at the end
    assert [n for _, n, _ in filled] == [50, 50] + [200] * 28 + [150, 150]
    assert stats.calls == 32 and eager_stats.calls == 120


def _steps_of(behind_linger_s: float, rate: float = 0.0
              ) -> tuple[list[int], list[tuple[int, int, tuple[int, ...]]]]:
    """An sg source over 2 workers routing 60 batches of 100 (linger 0,
    ``behind_linger_s``, paced at ``rate``): how many batches each step
    routed, and every sub-batch sent as (worker, batch, positions), sorted.
    Asserts that the grouping saw each batch alone and the exact count."""
    from runtime.dataflow.source import STEP_MESSAGES

    ft = FakeTime()
    partials: list = []
    workers = make_workers(2, ft, partials)
    transport = InstantAcks(workers)
    segments: list[tuple[int, int, tuple[int, ...]]] = []  # (worker, batch, positions)
    send = transport.send

    def recording_send(worker, parts):
        for p in parts:
            ends = np.cumsum(p.tag.counts)
            for b, e, c in zip(p.tag.batches, ends, p.tag.counts, strict=True):
                segments.append((worker, int(b), tuple(p.tag.idx[e - c:e].tolist())))
        return send(worker, parts)

    transport.send = recording_send
    grouping = make_grouping("sg", 2, seed=0)
    routed: list[int] = []
    route = grouping.route
    grouping.route = lambda h: (routed.append(len(h)), route(h))[1]
    src = SourceCore(0, grouping, transport,
                     SourceSettings(n_workers=2, max_inflight=2, linger_s=0.0,
                                    behind_linger_s=behind_linger_s, rate_per_source=rate),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    steps: list[int] = []
    send_step = src.send_step

    def counting_step(batches, idx=None):
        steps.append(len(batches))
        return send_step(batches, idx)

    src.send_step = counting_step
    keys = [f"k{i % 37}" for i in range(100)]
    stats = src.run([pa.table({"key": keys}) for _ in range(60)])
    assert stats.acked == 6_000 and stats.batches == 60
    assert routed == [100] * 60  # each batch routed alone, in order
    assert sorted((b, len(idx)) for _, b, idx in segments) == [
        (b, 50) for b in range(60) for _ in (0, 1)]  # sg: one sub-batch of 50 per worker
    for w in workers:
        w.finish()
    total: collections.Counter = collections.Counter()
    for p in partials:
        t = builtin_operator("wordcount").finish(p.partial)
        total.update(dict(zip(t.column("key").to_pylist(), t.column("count").to_pylist(),
                              strict=True)))
    assert total == collections.Counter(keys * 60)
    assert sum(steps) == 60 and max(steps) * 100 <= STEP_MESSAGES
    return steps, sorted(segments)


def test_a_source_behind_its_input_routes_several_batches_per_step() -> None:
    """Unpaced, with outboxes that linger behind the input, a source routes
    several micro-batches per step (one hash, split and ack poll for all of
    them) - the first alone, while the workers' memory bounds are still one
    batch's worth; with ``behind_linger_s`` 0, or paced on schedule, one batch
    per step as before."""
    steps, sent = _steps_of(0.005)
    assert steps[0] == 1 and len(steps) < 10
    one_steps, one_sent = _steps_of(0.0)
    assert one_steps == [1] * 60
    assert sent == one_sent  # the same sub-batches: batch, worker and positions
    assert _steps_of(0.005, rate=1_000.0)[0] == [1] * 60


def test_a_step_being_filled_goes_when_the_source_waits_for_input() -> None:
    """A shard whose next chunk is not in yet makes the source idle
    (``SourceActor._wait_for_input``): the batches of the step it was filling
    are routed and sent then, not when the next chunk comes."""
    ft = FakeTime()
    workers = make_workers(2, ft, [])
    src = SourceCore(0, make_grouping("sg", 2, seed=0), InstantAcks(workers),
                     SourceSettings(n_workers=2, linger_s=0.0, behind_linger_s=0.005),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    at_idle: list[tuple[int, int]] = []

    def chunks():
        for _chunk in range(3):
            for _ in range(5):
                yield pa.table({"key": [f"k{i}" for i in range(100)]})
            src.idle(0.01)  # waiting for the next chunk
            at_idle.append((src.routed, int(src.outboxes.queued_n.sum())))

    stats = src.run(chunks())
    assert stats.acked == 1_500
    assert at_idle == [(500, 0), (1_000, 0), (1_500, 0)]


def test_a_step_stays_below_the_memory_bound_and_a_blocked_source_steps_one_batch() -> None:
    """A slow worker: the source holds no more than with one batch per step
    (``test_outboxes_are_bounded_and_keep_fifo_per_worker``), and after a
    step that waited for the worker, the next one routes a single batch."""
    ft = FakeTime()
    workers = make_workers(2, ft, [])
    workers[1].service = type(workers[1].service)(5_000.0, clock=ft.clock, sleep=ft.sleep)
    src = SourceCore(0, make_grouping("sg", 2, seed=0), DirectTransport(workers),
                     SourceSettings(n_workers=2, max_inflight=2, outbox=3, call_messages=100,
                                    linger_s=0.005),
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    after_blocked: list[int] = []
    send_step = src.send_step

    def watching_step(batches, idx=None):
        if src.blocked:
            after_blocked.append(len(batches))
        return send_step(batches, idx)

    src.send_step = watching_step
    stats = src.run([pa.table({"key": [f"k{i}" for i in range(100)]}) for _ in range(40)])
    assert stats.acked == 4_000
    assert after_blocked and set(after_blocked) == {1}


def test_a_call_of_one_sliced_entry_sends_only_its_rows() -> None:
    """A step's entries are slices of one ``take`` per worker; a call copies
    them (``Part.join``), so it pickles its own rows, not the parent's."""
    import pickle

    from runtime.dataflow.reliability import Entry

    parent = pa.record_batch({"key": pa.array([f"key-{i:06d}" for i in range(10_000)])})
    hashes = np.arange(10_000, dtype=np.uint64)
    entry = Entry(0, 3, np.arange(10, dtype=np.int32), parent.slice(100, 10), hashes[100:110], 0.0)
    part = Part.join(0, 0, 0, [entry])
    assert part.records.column("key").to_pylist() == [f"key-{i:06d}" for i in range(100, 110)]
    assert len(pickle.dumps(part, protocol=5)) < 2_000 < len(pickle.dumps(parent, protocol=5))


def test_a_paced_source_does_not_linger_when_nothing_can_come_meanwhile() -> None:
    """Paced at 1,000 msgs/s (a batch every 0.1 s), nothing fills a call
    within ``linger_s`` (5 ms): every call leaves when its micro-batch was
    due, not after lingering for nothing. A faster pace, whose next batch
    comes within the linger, fills the calls."""
    calls, stats, _ = _calls_of(0.005, rate=1_000.0)
    assert stats.calls == len(calls) == 120
    for sent, n, emit in calls:
        assert n == 50 and sent == emit
    fast, stats, _ = _calls_of(0.005, rate=100_000.0)  # a batch every ms: 5 fill a call
    assert [n for _, n, _ in fast[:2]] == [50, 50]  # a worker's first call goes alone
    assert max(n for _, n, _ in fast) > 50


def test_a_source_behind_its_input_lingers_behind_linger_s() -> None:
    """``behind_linger_s`` applies while the next batch is already due: an
    unpaced source with ``linger_s`` 0 still fills its calls, while a paced
    one on schedule keeps ``linger_s`` (here every call leaves when its
    micro-batch was due, since nothing comes within 5 ms - not 60 s later)."""
    unpaced, stats, _ = _calls_of(0.0, behind_linger_s=0.005)
    assert [n for _, n, _ in unpaced] == [50, 50] + [200] * 28 + [150, 150]
    paced, stats, _ = _calls_of(0.005, rate=1_000.0, behind_linger_s=60.0)
    assert stats.calls == len(paced) == 120
    for sent, n, emit in paced:  # nothing comes within 5 ms: no linger at all
        assert n == 50 and sent == emit


def test_pacer_behind_is_an_unpaced_source_or_a_late_one() -> None:
    from runtime.dataflow.source import Pacer

    now = [10.0]
    unpaced = Pacer(0.0, lambda: now[0], lambda s: None)
    assert unpaced.behind(0) and unpaced.behind(10**9)
    paced = Pacer(1_000.0, lambda: now[0], lambda s: None)
    paced.start = 10.0
    assert paced.behind(0)  # the first batch is due at the start
    assert not paced.behind(500)  # due at 10.5 s
    now[0] = 10.5
    assert paced.behind(500)


def test_a_dead_processing_thread_fails_waiting_batches_instead_of_hanging() -> None:
    """A flush that raises (e.g. an aggregator without ``commit``) kills the
    processing thread: every batch queued before or after gets the error."""

    def broken_sink(_flush: object) -> None:
        raise AttributeError("no commit")

    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=0.0, queue_batches=4, aggregate_every_s=0.01),
                   sink=broken_sink)
    w.start_run(w.clock())
    results: list[object] = []  # per call: its ack, or the exception it raised

    def call() -> None:
        try:
            results.append(w.submit(0, [Part.of(pa.array(["x"] * 10), 0.0)]))
        except BaseException as e:  # noqa: BLE001 - checked by the test
            results.append(e)

    loop_errors: list[BaseException] = []

    def loop_body() -> None:
        try:
            w.run_forever()
        except BaseException as e:  # noqa: BLE001 - checked by the test
            loop_errors.append(e)

    callers = [threading.Thread(target=call) for _ in range(6)]
    for c in callers:
        c.start()
    loop = threading.Thread(target=loop_body)
    loop.start()
    loop.join(timeout=10)
    for c in callers:
        c.join(timeout=10)
    assert not loop.is_alive() and not any(c.is_alive() for c in callers)
    # the processing thread died of the sink's error, and re-raised it
    assert len(loop_errors) == 1 and isinstance(loop_errors[0], AttributeError)
    assert str(loop_errors[0]) == "no commit"
    # every caller returned: processed before the failing flush (an ack), or failed
    assert len(results) == 6
    failed = [r for r in results if isinstance(r, BaseException)]
    acked = [r for r in results if not isinstance(r, BaseException)]
    assert all(isinstance(a, Ack) and a.acked == 10 for a in acked), acked
    assert all("processing thread died" in str(e) for e in failed), failed
    late = threading.Thread(target=call)
    late.start()
    late.join(timeout=10)
    assert not late.is_alive() and len(results) == 7
    assert isinstance(results[-1], RuntimeError)
    assert str(results[-1]) == "worker-0 processing thread died: AttributeError('no commit')"


@pytest.mark.parametrize("seed", range(5))
def test_rebatch_cuts_the_stream_the_same_whatever_its_blocks(seed: int) -> None:
    """A shard read block by block and cut by the source gives the batches Ray
    Data's ``iter_batches(batch_size=...)`` gave: ``rows`` rows each, the last
    shorter, boundaries set by the stream alone (a restart relies on them)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 5_000))
    stream = pa.table({"key": [f"k{i}" for i in range(n)], "value": np.arange(n)})
    cuts = np.sort(rng.integers(0, n + 1, size=int(rng.integers(0, 12))))
    bounds = [0, *cuts.tolist(), n]
    blocks = [stream.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    rows = int(rng.integers(1, 1_200))
    got = list(rebatch(blocks, rows))
    assert [t.num_rows for t in got] == [min(rows, n - i) for i in range(0, n, rows)]
    assert (pa.concat_tables(got).equals(stream) if got else n == 0)


def test_a_reporting_worker_flushes_early_until_the_first_table_reaches_it() -> None:
    """A coordinated scheme's worker reports every ``FIRST_PLAN_S`` until the
    controller's first table comes back to it, then every ``report_every_s``:
    a first report with too little time with work in it to give a rate must
    not hold the first plan for a whole ``report_every_s``."""
    from runtime.grouping.coordination import FIRST_PLAN_S, VwTable

    ft = FakeTime(0.0)
    flushes: list[float] = []
    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=0.0, report_every_s=0.5, aggregate_every_s=1.0),
                   sink=lambda f: flushes.append(ft.t), clock=ft.clock, sleep=ft.sleep, t0=0.0)
    step = FIRST_PLAN_S * 1.01  # (a little over: sums of floats)
    for _ in range(3):  # no table yet: every FIRST_PLAN_S
        ft.sleep(step)
        assert w.maybe_flush()
    assert len(flushes) == 3 and w.flushes == 3
    w.on_table(VwTable(1, np.zeros(4, dtype=np.int32)))
    ft.sleep(step)
    assert w.maybe_flush()  # the flush that was due; from here on, every 0.5 s
    ft.sleep(step)
    assert not w.maybe_flush()
    ft.sleep(0.5 - FIRST_PLAN_S)
    assert w.maybe_flush()


def test_a_reused_process_captures_the_next_runs_prints_and_closes_the_last_file(
        tmp_path, monkeypatch) -> None:
    """``actors.operator_output.capture`` once per run: a process reused by
    the next run (``actors.pool``) prints into that run's ``operators.log``
    only, and the last run's file is closed (no descriptor leaks per run)."""
    import os
    import sys

    from actors.operator_output import capture

    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    assert capture(str(first), "worker-1")
    print("one")
    fd = sys.stdout.fd  # type: ignore[attr-defined]
    assert capture(str(second), "worker-1")
    print("two", end="")
    sys.stdout.flush()
    assert first.read_text() == "[worker-1] one\n"
    assert second.read_text() == "[worker-1] two\n"
    with pytest.raises(OSError):
        os.fstat(fd)
    assert not capture(str(tmp_path / "gone" / "c.log"), "worker-1")  # not on this node
    os.close(sys.stdout.fd)  # type: ignore[attr-defined]
