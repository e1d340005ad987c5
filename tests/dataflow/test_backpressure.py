"""Backpressure in seconds of work (runtime.dataflow.backpressure.DrainRates)."""

import math

import numpy as np
import pyarrow as pa
import pytest

from runtime.dataflow.backpressure import CALL_S, DrainRates
from runtime.dataflow.messages import Ack
from runtime.dataflow.settings import SourceSettings
from runtime.dataflow.source import SourceCore
from runtime.grouping import make_grouping


def test_unmeasured_workers_get_one_sub_batch_per_call():
    """Until its first ack, a worker's call is one sub-batch, sent at once: a
    slow worker's first call must not carry seconds of its work."""
    d = DrainRates(3)
    assert d.call_cap(1, 8192) == 1


def test_first_call_sets_the_rate_from_send_to_ack():
    d = DrainRates(2)
    d.acked(0, 500, sent_at=10.0, now=10.5)  # 500 messages in 0.5 s
    assert d.rate[0] == pytest.approx(1000.0)
    assert d.rate[1] == 0.0
    assert d.call_cap(0, 8192) == int(1000 * CALL_S)  # 0.1 s of work at 1,000/s
    assert d.call_cap(1, 8192) == 1


def test_a_call_queued_behind_another_is_timed_from_the_previous_ack():
    d = DrainRates(1)
    d.acked(0, 100, sent_at=0.0, now=0.1)  # 1,000/s
    # sent at 0.05 while the first was in service: served from 0.1 to 0.2
    d.acked(0, 100, sent_at=0.05, now=0.2)
    assert d.rate[0] == pytest.approx(1000.0)


def test_the_estimate_moves_by_the_time_weight_of_the_sample():
    d = DrainRates(1, tau_s=1.0)
    d.acked(0, 1000, sent_at=0.0, now=1.0)  # 1,000/s
    d.acked(0, 250, sent_at=1.0, now=2.0)  # 250/s over 1 s
    alpha = 1.0 - math.exp(-1.0)
    assert d.rate[0] == pytest.approx(1000.0 + alpha * (250.0 - 1000.0))


def test_call_caps_are_clipped_to_one_message_and_call_messages():
    d = DrainRates(2)
    d.acked(0, 1, sent_at=0.0, now=1.0)  # 1 msg/s: 0.1 messages of work per call
    d.acked(1, 10**6, sent_at=0.0, now=1.0)  # fast: far above call_messages
    assert d.call_cap(0, 8192) == 1
    assert d.call_cap(1, 8192) == 8192


def test_empty_or_instant_acks_change_nothing_and_forget_resets():
    d = DrainRates(1)
    d.acked(0, 0, sent_at=0.0, now=1.0)
    d.acked(0, 10, sent_at=1.0, now=1.0)
    assert d.rate[0] == 0.0
    d.acked(0, 10, sent_at=1.0, now=1.01)
    assert d.rate[0] > 0
    d.forget(0)
    assert d.rate[0] == 0.0
    assert d.call_cap(0, 100) == 1
    d.acked(0, 10, sent_at=0.0, now=0.5)  # the old last-ack time is gone too
    assert d.rate[0] == pytest.approx(20.0)


def test_a_slow_workers_calls_hold_call_s_of_its_work():
    """Worker 1 drains 10x slower: once measured, the source's calls to it hold
    ~CALL_S of its work; worker 0's are capped at its own, 10x larger."""
    now = [0.0]
    served = {0: 20000.0, 1: 2000.0}  # msgs/s

    class Transport:
        def __init__(self):
            self.calls = {}
            self.busy_until = {0: 0.0, 1: 0.0}
            self.sizes = {0: [], 1: []}
            self.n = 0

        def send(self, w, parts):
            n = sum(len(p) for p in parts)
            start = max(now[0], self.busy_until[w])
            self.busy_until[w] = start + n / served[w]
            self.n += 1
            self.calls[self.n] = (w, n, self.busy_until[w])
            self.sizes[w].append(n)
            return self.n

        def wait(self, tokens, timeout):
            due = min(self.calls[t][2] for t in tokens)
            if timeout is None or timeout > 0:  # time passes only while blocked
                now[0] = max(now[0], min(due, now[0] + (timeout or due)))
            out = []
            for t in tokens:
                w, n, end = self.calls[t]
                if end <= now[0]:
                    del self.calls[t]
                    out.append((t, Ack(w, n, 0, 0.0, 0.0, now[0], 1, 0)))
            return out

    tr = Transport()
    src = SourceCore(0, make_grouping("sg", 2, seed=0), tr,
                     SourceSettings(n_workers=2, max_inflight=2, outbox=40), clock=lambda: now[0])
    for _ in range(200):
        src.send_batch(pa.table({"key": [f"k{i}" for i in range(100)]}))
    src.drain()
    assert src.acked == 20000
    assert src.outboxes.drain_rates.rate[1] == pytest.approx(served[1], rel=0.05)
    # without the cap the slow worker's calls grow to its whole outbox
    late = tr.sizes[1][len(tr.sizes[1]) // 2:]
    assert max(late) <= served[1] * CALL_S * 1.05 + 50  # + one sub-batch
    assert max(tr.sizes[0]) > 3 * max(late)


def test_the_memory_bound_is_in_calls_of_the_workers_own_work():
    """Per worker, the bound is ``max_inflight + outbox`` batches, or as many
    full calls when the worker drains fast enough for calls to be larger: a
    fast worker gets calls of many micro-batches, a slow one keeps the batch
    bound (what it holds stays a fraction of a second of its work)."""
    from runtime.dataflow.outbox import Outboxes

    o = Outboxes(3, max_inflight=2, outbox_batches=2, call_messages=8192, linger_s=0.0,
                 clock=lambda: 0.0)
    o.saw_batch(1000)
    o.drain_rates.acked(0, 5000, sent_at=0.0, now=0.01)  # 500,000/s: cap 8,192
    o.drain_rates.acked(1, 100, sent_at=0.0, now=0.1)  # 1,000/s: cap 100
    # worker 2 never answered: one sub-batch per call, the batch bound
    assert o.bounds().tolist() == [4 * 8192, 4 * 1000, 4 * 1000]


def test_an_overdue_call_bounds_its_workers_drain_rate():
    """The acks measure a worker's drain rate; a call still unanswered bounds
    it from above as it ages (its messages over the time since its service
    began: its sending or the previous ack, whichever is later). A worker
    that slows is then held at its new pace by the sources' admission at
    once, not after the acks' average has caught up. A worker never answered
    is bounded by its oldest call's age; a call not yet overdue bounds
    nothing the rate does not."""
    from runtime.dataflow.outbox import Outboxes
    from runtime.dataflow.reliability import Entry

    now = [0.0]
    o = Outboxes(3, max_inflight=2, outbox_batches=2, call_messages=8192, linger_s=0.0,
                 clock=lambda: now[0])
    o.drain_rates.acked(0, 1000, sent_at=0.0, now=0.1)  # 10,000 msgs/s
    o.drain_rates.acked(1, 1000, sent_at=0.0, now=0.1)
    now[0] = 0.2
    for w in range(3):
        for _ in range(2):
            o.queue(Entry(w, 0, np.arange(500), None, np.zeros(500, np.uint64), 0.0))
    sent = []
    o.flush(lambda w, entries: sent.append(w) or (w, len(sent)), force=True)
    assert o.calls_per_worker.tolist() == [1, 1, 2]  # one call of 1,000; two of one sub-batch
    o.drain_rates.acked(1, 100, sent_at=0.1, now=0.22)  # an earlier call of worker 1's answered
    now[0] = 0.25
    bounds = o.drain_bounds(now[0])
    assert bounds[0] == pytest.approx(1000 / 0.05)  # sent at 0.2: not overdue, above its rate
    assert bounds[1] == pytest.approx(1000 / 0.03)  # in service since the ack at 0.22
    assert bounds[2] == pytest.approx(500 / 0.05)  # never answered: its oldest call's age
    now[0] = 0.7  # worker 0 slowed: its call is 0.5 s old, 5x the 0.1 s it should take
    assert o.drain_bounds(now[0])[0] == pytest.approx(2000.0)
    assert o.drain_rates.rate[0] == pytest.approx(10_000.0)  # the acks know nothing yet
