"""One report for both engines (``runtime.reporting.report``): the Ray engine's
measurements, gathered from fixture inputs, and a simulated run of the same
topology give reports of one shape that validate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from runtime.dataflow.latency import LatencyHistogram
from runtime.dataflow.messages import AggregatorStats, SourceStats, WorkerSeries, WorkerStats
from runtime.reporting import report as report_mod
from runtime.reporting.cores import Capacities, measurements
from runtime.sim import simulate
from runtime.topology import Topology, load_topology

N_WORKERS, N_SLOTS, SLOT_S = 3, 4, 0.5
GROUPING_STATS = {"migrations": 2, "signals": {"increase": 1, "decrease": 3},  # cg's
                  "vw_per_worker": [10, 10, 10], "idle_queue": [], "busy_queue": []}


@pytest.fixture
def topo() -> Topology:
    return load_topology({
        "name": "schema",
        "input": {"format": "zipf", "messages": 3_000, "keys": 100},
        "sources": 2,
        "workers": {"count": N_WORKERS, "capacity": [1, 1, 0.5], "service_us": 100,
                    "changes": [{"at_s": 1.0, "worker": 2, "capacity": 1.0}]},
        "grouping": {"scheme": "cg"},
        "run": {"batch": 500, "slot_s": SLOT_S},
    })


def ray_report(topo: Topology) -> dict[str, Any]:
    """What the actors would report for a 1.8 s run of 3,000 messages."""
    lat = LatencyHistogram()
    lat.add(np.full(1000, 0.002))
    workers = [WorkerStats(
        id=i, processed=1000, batches=2, keys=40 + i, flushes=2, stopped_s=0.1 * i,
        latency=lat.to_sparse(), signals_emitted={"increase": i, "decrease": 1},
        queue_capacity_batches=4,
        series=WorkerSeries(slot=[0, 1, 2], processed=[400, 400, 200],
                            queue_msgs=[500.0, 250.0, 0.0], queue_batches=[2.0, 1.0, 0.0],
                            busy=[1.0, 0.8, 0.2], latency={0: lat.to_sparse()}),
    ) for i in range(N_WORKERS)]
    sources = [SourceStats(
        source=s, routed=1500, acked=1500, batches=3, calls=6,
        sent_per_worker=[500, 500, 500], grouping=GROUPING_STATS, migrations=0,
        signals={"increase": 0, "decrease": 0}, route_s=0.01, wait_s=1.5, elapsed_s=1.8,
        end_ts=101.8, committed_ts=101.9, vw_history=[(0.0, [4, 4, 4]), (1.2, [5, 4, 3])],
        epoch=0, failures=[], resume=None, live_workers=[0, 1, 2], retained_peak_messages=0,
        retained_peak_bytes=0, joins=[], rerouted_messages=0,
    ) for s in range(2)]
    aggregator = AggregatorStats(
        partials=6, committed_seq={}, committed_messages={}, fenced_workers=[],
        duplicate_flushes=0, rejected_flushes=0, out_of_order_flushes=0, claims_held=0,
        early_flushes=0, peak_rss_mb=None)
    m = measurements(topo, Capacities(topo), 3000, 1.8, 2.5, sources, workers,
                     pa.table({"key": ["k"] * 100, "count": [30] * 100}), aggregator)
    return dict(report_mod.build_report(topo, m))


def sim_report(topo: Topology) -> dict[str, Any]:
    """A simulated run of the same topology: the part of its report that
    ``build_report`` makes (the simulator adds ``aggregator``, ``input``,
    ``sim``, ``result`` and ``phases``)."""
    full = simulate(topo).report
    built = ray_report(topo)
    assert set(full) >= set(built)
    return {k: full[k] for k in built}


def written(report: dict[str, Any], rows: int = 100) -> dict[str, Any]:
    """As ``write_run`` completes it."""
    return {**report, "result": {"path": "result.parquet", "rows": rows}}


def paths(value: Any, at: str = "") -> dict[str, bool]:
    """Every key's path (a list by its first element: ``workers[].id``) -> null?"""
    out = {at: value is None}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(paths(v, f"{at}.{k}"))
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        out.update(paths(value[0], f"{at}[]"))
    return out


def assert_same_keys(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The same keys at every level, except below what one of them leaves null."""
    pa_, pb = paths(a), paths(b)
    nulls = {p for p, null in (pa_ | pb).items() if null}
    odd = [p for p in set(pa_) ^ set(pb)
           if not any(p.startswith(n + ".") or p.startswith(n + "[]") for n in nulls)]
    assert not odd, f"keys in one report only: {sorted(odd)}"


def test_both_engines_build_one_shape(topo: Topology) -> None:
    ray, sim = ray_report(topo), sim_report(topo)
    assert (ray["engine"], sim["engine"]) == ("ray", "sim")
    for rep in (ray, sim):
        report_mod.validate_report(written(rep))
        json.dumps(rep)  # plain JSON all the way down
    assert_same_keys(ray, sim)
    assert set(ray) >= set(report_mod.REQUIRED_KEYS) - {"result"}


def test_the_measures_agree_on_what_both_engines_count(topo: Topology) -> None:
    ray, sim = ray_report(topo), sim_report(topo)
    for rep in (ray, sim):
        assert rep["messages"] == {"input": 3000, "processed": 3000}
        assert rep["throughput_msgs_per_s"] == pytest.approx(3000 / rep["duration_s"])
        assert len(rep["sources"]) == 2 and rep["sources"][1]["source"] == 1
        assert rep["capacity_changes"] == [{"at_s": 1.0, "worker": 2, "capacity": 1.0}]
        assert rep["topology"]["ack_delay_ms"] is None
    assert ray["migrations"] == 4 and ray["signals"] == {"increase": 2, "decrease": 6}
    assert ray["replication"] == pytest.approx(123 / 100)
    assert ray["topology"]["queue_capacity_batches"] == 4
    assert [w["final_capacity"] for w in ray["workers"]] == [1.0, 1.0, 1.0]
    # capacity 2.5 until 1.0 s, 3 after, at 10,000 msgs/s each at full speed
    full_speed = (2.5 * 1.0 + 3 * 0.8) / 1.8 * 1e4
    assert ray["capacity_efficiency"] == pytest.approx((3000 / 1.8) / full_speed)
    assert ray["signals_emitted"] == {"increase": 3, "decrease": 3}
    assert ray["vw_ownership"]["final"] == [5.0, 4.0, 3.0]
    assert ray["workers"][2]["stopped_s"] == pytest.approx(0.2)
    assert ray["in_flight_at_end"] is None and sim["in_flight_at_end"] == 0
    assert sum(sim["vw_ownership"]["final"]) == pytest.approx(10 * N_WORKERS)  # VWs only move


def test_no_capacity_efficiency_without_a_service_time(topo: Topology) -> None:
    free = topo.model_copy(update={"workers": topo.workers.model_copy(
        update={"service_us": 0.0})})
    assert ray_report(free)["capacity_efficiency"] is None


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.pop("latency_ms"), "missing keys: latency_ms"),
    (lambda r: r.update(sources=2), "report.sources: expected a list, got 2"),
    (lambda r: r.update(engine="spark"), "report.engine: expected one of"),
    (lambda r: r["workers"][1].update(keys=1.5), r"report.workers\[1\].keys: expected int"),
    (lambda r: r["workers"][0].pop("utilization"), r"workers\[0\]: missing keys: utilization"),
    (lambda r: r["messages"].update(processed=True), "messages.processed: expected int"),
])
def test_validation_names_the_misfit(topo: Topology, change: Any, message: str) -> None:
    rep = written(ray_report(topo))
    change(rep)
    with pytest.raises(ValueError, match=message):
        report_mod.validate_report(rep)


def test_a_simulated_run_reports_the_schema(tmp_path: Path) -> None:
    r = simulate({"name": "small", "input": {"format": "zipf", "messages": 5_000, "keys": 500},
                  "workers": {"count": 3, "service_us": 20}, "grouping": {"scheme": "acg"},
                  "run": {"batch": 250, "slot_s": 0.05}})
    report_mod.validate_report(r.report)
    assert "coordinator" in r.report and "vw_ownership" in r.report
    r.write(tmp_path / "run", plot=False)
    on_disk = json.loads((tmp_path / "run" / "report.json").read_text())
    report_mod.validate_report(on_disk)
    assert_same_keys(on_disk, r.report)
