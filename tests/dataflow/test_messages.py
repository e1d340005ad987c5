"""The typed messages between the dataflow cores (runtime.dataflow.messages):
frozen, and unchanged by a trip through pickle (how Ray carries them)."""

from __future__ import annotations

import dataclasses
import pickle

import pyarrow as pa
import pytest
from conftest import DirectTransport, FakeTime

from runtime.dataflow.aggregator import AggregatorCore
from runtime.dataflow.messages import SourceStats, WorkerSeries, WorkerStats
from runtime.dataflow.settings import AggregatorSettings, SourceSettings, WorkerSettings
from runtime.dataflow.source import SourceCore
from runtime.dataflow.worker import WorkerCore
from runtime.grouping import make_grouping
from runtime.operators import WorkerApp, builtin_operator


def test_the_cores_statistics_are_typed_and_cross_ray() -> None:
    ft = FakeTime()
    flushes: list = []
    workers = [WorkerCore(i, WorkerApp(builtin_operator("wordcount")),
                          WorkerSettings(service_us=10.0), clock=ft.clock, sleep=ft.sleep,
                          t0=ft.t, sink=flushes.append) for i in range(2)]
    src = SourceCore(0, make_grouping("sg", 2, seed=0), DirectTransport(workers),
                     SourceSettings(n_workers=2), clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    stats = src.run([pa.table({"key": [f"k{i}" for i in range(100)]}) for _ in range(5)])
    assert isinstance(stats, SourceStats) and stats.acked == 500
    finished = [w.finish() for w in workers]
    assert all(isinstance(w, WorkerStats) and isinstance(w.series, WorkerSeries)
               for w in finished)
    assert sum(w.processed for w in finished) == 500
    agg = AggregatorCore(AggregatorSettings({"kind": "wordcount"}))
    for flush in flushes:
        agg.commit(flush)
    agg_stats = agg.stats()
    assert agg_stats.partials == len(flushes) > 0 and "coordinator" not in agg_stats.as_report()
    assert list(agg_stats.as_report()) == [  # report.json's aggregator section
        "partials", "committed_seq", "committed_messages", "fenced_workers",
        "duplicate_flushes", "rejected_flushes", "out_of_order_flushes", "claims_held",
        "early_flushes", "peak_rss_mb"]
    for message in (stats, *finished, agg_stats):
        back = pickle.loads(pickle.dumps(message))
        assert type(back) is type(message) and repr(back) == repr(message)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, dataclasses.fields(message)[0].name, 0)
