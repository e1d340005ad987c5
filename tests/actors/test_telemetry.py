"""Live metrics (actors.telemetry) without Ray: a recording sink, a fake clock."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import numpy as np
import pytest

from actors import telemetry
from actors.telemetry import METRICS, RecordingSink, RunTelemetry, SourceTelemetry, WorkerTelemetry
from runtime.dataflow.reliability import Part
from runtime.dataflow.settings import WorkerSettings
from runtime.dataflow.worker import WorkerCore
from runtime.grouping import make_grouping
from runtime.operators import WorkerApp, builtin_operator


def test_metric_names_and_tags_are_valid() -> None:
    for name, spec in METRICS.items():
        assert re.fullmatch(r"hs_[a-z0-9_]+", name), name
        assert spec.kind in ("counter", "gauge", "histogram")
        assert spec.tag_keys[:2] == ("run", "actor")
        assert spec.description
        if spec.kind == "histogram":
            assert list(spec.boundaries) == sorted(spec.boundaries) and spec.boundaries[0] > 0


def test_worker_metrics_from_snapshots(fake_time) -> None:
    ft = fake_time
    core = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                      WorkerSettings(service_us=100.0, capacity=0.5, queue_batches=4,
                                     queue_capacity_batches=2),
                      clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    sink = RecordingSink()
    tm = WorkerTelemetry(core, "demo-1", "worker-0", sink=sink, wall=lambda: 123.0)
    keys = [f"k{i % 7}" for i in range(1000)]
    items = [core.enqueue(0, [Part.of(keys, ft.t)]) for _ in range(2)]
    tm.tick()  # baseline: 2 batches queued, nothing processed
    assert sink.last("hs_worker_queue_batches", actor="worker-0") == 2
    assert sink.last("hs_worker_queue_messages") == 2000
    assert sink.last("hs_worker_capacity") == 0.5
    assert sink.last("hs_worker_rate") is None  # needs two snapshots
    t0 = ft.t
    assert core.step(timeout=0) and core.step(timeout=0)  # ~2 x 1000 x 100 us
    t1, t2 = items[0].ack.done_ts, items[1].ack.done_ts
    assert t2 == ft.t  # 1000 messages of 100 us each
    assert (t1 - t0, t2 - t0) == (pytest.approx(0.1), pytest.approx(0.2))
    for it in items:
        tm.batch_done(it.ack)
    tm.tick()
    assert sink.total("hs_worker_processed", run="demo-1", actor="worker-0") == 2000
    assert sink.last("hs_worker_rate") == pytest.approx(2000 / (t2 - t0))
    # 2 batches in the system for 0.1 s, then 1 for 0.1 s; capacity 2 batches
    assert sink.last("hs_worker_utilization") == pytest.approx((2 * 0.1 + 0.1) / 0.2 / 2)
    assert sink.last("hs_worker_busy") == pytest.approx(1.0)
    assert sink.last("hs_worker_stopped") == 0.0
    assert sink.last("hs_worker_queue_batches") == 0
    # latencies 0.1, 0.2, ..., 200 ms (both batches emitted at t0): the 1,000th is
    # 100 ms, the 1,980th 198 ms; a percentile is the geometric middle of its 2% bin
    assert sink.last("hs_worker_latency_p50_seconds") == pytest.approx(0.1, rel=0.01)
    assert sink.last("hs_worker_latency_p99_seconds") == pytest.approx(0.198, rel=0.01)
    batch_lat = [v for n, v, _ in sink.records if n == "hs_worker_batch_latency_seconds"]
    assert batch_lat == pytest.approx([items[0].ack.lat_sum_s / 1000,
                                       items[1].ack.lat_sum_s / 1000])
    assert batch_lat[0] < batch_lat[1]
    assert sink.last("hs_heartbeat_seconds") == 123.0
    # nothing new: the counter is not incremented, rates go to 0
    ft.sleep(1.0)
    tm.tick()
    assert sink.total("hs_worker_processed") == 2000
    assert sink.last("hs_worker_rate") == 0.0 and sink.last("hs_worker_utilization") == 0.0
    core.set_capacity(0.3)
    tm.tick()
    assert sink.last("hs_worker_capacity") == 0.3


def test_source_metrics_counters_and_vw_ownership() -> None:
    g = make_grouping("cg", 4, seed=0, virtual_per_worker=5)
    core = SimpleNamespace(routed=0, acked=0, grouping=g)
    sink = RecordingSink()
    tm = SourceTelemetry(core, "r", "source-1", sink=sink)
    tm.tick()
    assert sink.total("hs_source_routed") == 0  # counters only ever add > 0
    assert [sink.last("hs_source_vw_owned", worker=w) for w in range(4)] == [5, 5, 5, 5]
    core.routed, core.acked = 3000, 1000
    for _ in range(3):  # worker 0 is idle, worker 3 busy: CG moves VWs from 3 to 0
        g.on_ack(0, +1, 100)
        g.on_ack(3, -1, 100)
    tm.tick()
    core.routed, core.acked = 5000, 5000
    tm.tick()
    assert sink.total("hs_source_routed", actor="source-1") == 5000
    assert sink.total("hs_source_acked") == 5000
    assert sink.total("hs_source_signals", kind="increase") == 3
    assert sink.total("hs_source_signals", kind="decrease") == 3
    assert sink.total("hs_source_migrations") == g.migrations > 0
    owned = [sink.last("hs_source_vw_owned", worker=w) for w in range(4)]
    assert owned == np.asarray(g.vw_per_worker()).tolist() and sum(owned) == 20
    assert owned[0] > 5 > owned[3]


def test_source_without_virtual_workers() -> None:
    core = SimpleNamespace(routed=10, acked=10, grouping=make_grouping("pkg", 3, seed=0))
    sink = RecordingSink()
    SourceTelemetry(core, "r", "source-0", sink=sink).tick()
    assert sink.total("hs_source_routed") == 10
    assert sink.last("hs_source_vw_owned") is None


def test_run_metrics() -> None:
    sink = RecordingSink()
    rt = RunTelemetry("demo-2", name="demo", scheme="cg", app="wordcount", workers=4,
                      sources=2, messages=1000, sink=sink)
    rt.update(400, None)
    rt.update(1000, 0.25)
    assert sink.last("hs_run_info", scheme="cg", name="demo", workers=4) == 1
    assert sink.last("hs_run_messages", actor="driver") == 1000
    assert sink.last("hs_run_acked") == 1000
    assert sink.last("hs_run_imbalance") == 0.25


def test_failing_backend_disables_telemetry_once(caplog) -> None:
    class Broken:
        calls = 0

        def record(self, name, value, tags):
            Broken.calls += 1
            raise RuntimeError("no metrics agent")

    core = SimpleNamespace(routed=1, acked=1, grouping=make_grouping("kg", 2, seed=0))
    tm = SourceTelemetry(core, "r", "source-0", sink=Broken())
    tm.tick()
    tm.tick()
    assert Broken.calls == 1 and not tm.emit.on
    assert "telemetry disabled" in caplog.text


def test_switched_off_by_environment(monkeypatch) -> None:
    monkeypatch.setenv("HS_TELEMETRY", "0")
    sink = RecordingSink()
    RunTelemetry("r", name="n", scheme="kg", app="wordcount", workers=1, sources=1,
                 messages=1, sink=sink).update(1, 0.0)
    assert sink.records == []


def test_thread_ticks_and_final_update() -> None:
    core = SimpleNamespace(routed=0, acked=0, grouping=make_grouping("kg", 2, seed=0))
    sink = RecordingSink()
    tm = SourceTelemetry(core, "r", "source-0", sink=sink, tick_s=0.01)
    tm.start()
    core.routed = core.acked = 7
    deadline = time.monotonic() + 10  # the thread's own ticks, every 10 ms, report it
    while sink.total("hs_source_routed") != 7 and time.monotonic() < deadline:
        time.sleep(0.002)
    assert sink.total("hs_source_routed") == 7
    tm.stop()
    # an hour between ticks: only start() and stop() tick
    slow = SourceTelemetry(core, "r", "source-1", sink=sink, tick_s=3600.0)
    slow.start()
    core.routed = core.acked = 9
    slow.stop()  # ticks once more after the thread ended
    assert sink.total("hs_source_routed", actor="source-1") == 9
    assert telemetry.ray_system_config() in ({}, {"metrics_report_interval_ms":
                                                  telemetry.REPORT_INTERVAL_MS})
