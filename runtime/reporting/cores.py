"""A run's measurements from the dataflow cores' own statistics, for either
engine that runs them (``actors.pipeline`` on Ray; the simulator over the
cores): ``SourceCore.run``'s and ``WorkerCore.finish``'s statistics, the
aggregator's, and its result, as ``runtime.reporting.report``'s
engine-neutral ``RunMeasurements``; ``Capacities``: every worker's
configured capacity over time."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from runtime.dataflow.latency import LatencyHistogram
from runtime.dataflow.messages import AggregatorStats, SourceStats, WorkerSeries, WorkerStats
from runtime.reporting import report as report_mod
from runtime.topology import Topology


class Capacities:
    """The capacity of every worker over time (initial values + ``workers.changes``)."""

    def __init__(self, topo: Topology) -> None:
        # workers added mid-run (workers.changes add) exist from the start, idle
        self.initial = topo.workers.capacities() + [m.capacity for m, _ in topo.workers.added()]
        self.changes = sorted((c.at_s, c.worker, c.capacity) for c in topo.workers.changes)

    def at(self, t_s: float) -> list[float]:
        caps = list(self.initial)
        for at, w, c in self.changes:
            if at <= t_s:
                caps[w] = c
        return caps

    def mean_total(self, duration_s: float) -> float:
        """Time-weighted mean of the total capacity over ``[0, duration_s]``."""
        if duration_s <= 0:
            return float(sum(self.initial))
        edges = [0.0] + [a for a, _, _ in self.changes if 0 < a < duration_s] + [duration_s]
        total = 0.0
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            total += sum(self.at(a)) * (b - a)
        return total / duration_s


def counts_input_keys(topo: Topology) -> bool:
    """Heavy-hitters' result is only the top-k, an operator's anything: the
    input's distinct keys are counted instead (replication's denominator)."""
    return topo.app.kind in ("heavy-hitters", "operator")


def measurements(
    topo: Topology,
    caps: Capacities,
    total: int,
    duration_s: float,
    load_s: float,
    source_stats: list[SourceStats],
    worker_stats: list[WorkerStats],
    result: Any,
    agg_stats: AggregatorStats,
    distinct_keys: int | None = None,
    engine: Literal["ray", "sim"] = "ray",
) -> report_mod.RunMeasurements:
    """The actors' statistics as ``runtime.reporting.report``'s engine-neutral input.

    Workers' series are cut or zero-padded to the run's slots; ``U_w`` uses
    each worker's own queue capacity; virtual workers are the mean over
    sources of each one's last table at a slot's end; ``distinct_keys``
    (replication's denominator) defaults to the result's keys."""
    n = len(worker_stats)
    slot_s = topo.run.slot_s
    n_slots = max(1, math.ceil(duration_s / slot_s))
    series = [w.series for w in worker_stats]
    qcap = [w.queue_capacity_batches for w in worker_stats]

    def col(s: WorkerSeries, name: str) -> np.ndarray:
        v = np.asarray(getattr(s, name)[:n_slots], dtype=np.float64)
        return np.pad(v, (0, n_slots - len(v)))

    processed = np.stack([col(s, "processed") for s in series], axis=1)  # [slot, worker]
    t_s = (np.arange(n_slots) + 1) * slot_s
    p50, p99 = [], []
    for k in range(n_slots):
        h = LatencyHistogram()
        for s in series:
            part = s.latency.get(k)
            if part is not None:
                h.merge(LatencyHistogram.from_sparse(part))
        p50.append(h.percentile_s(50) * 1e3)
        p99.append(h.percentile_s(99) * 1e3)
    slots = report_mod.SlotSeries(
        slot_s=slot_s,
        finished=processed.sum(axis=1),
        queue_msgs=np.stack([col(s, "queue_msgs") for s in series], axis=1),
        utilization=np.stack([col(s, "queue_batches") / c
                              for s, c in zip(series, qcap, strict=True)], axis=1),
        capacity=np.array([caps.at(t - slot_s / 2) for t in t_s]),
        busy=np.stack([col(s, "busy") for s in series], axis=1),
        vw=_vw_series(source_stats, t_s, n),
        latency_p50_ms=p50, latency_p99_ms=p99)

    latency = LatencyHistogram()
    for w in worker_stats:
        latency.merge(LatencyHistogram.from_sparse(w.latency))
    full_rate = topo.workers.service_us and 1e6 / topo.workers.service_us
    return report_mod.RunMeasurements(
        engine=engine,
        messages_input=int(total),
        messages_processed=int(sum(w.processed for w in worker_stats)),
        in_flight_at_end=(int(total) - int(sum(w.processed for w in worker_stats))
                          if engine == "sim" else None),
        duration_s=duration_s,
        latency_ms=report_mod.latency_ms(latency.summary_ms()),
        series=slots,
        workers=[report_mod.WorkerTotals(
            capacity=caps.initial[i], processed=int(w.processed), keys=int(w.keys),
            batches=int(w.batches), stopped_s=float(w.stopped_s),
            signals_emitted=report_mod.Signals(increase=int(w.signals_emitted["increase"]),
                                               decrease=int(w.signals_emitted["decrease"])),
            latency_ms=report_mod.latency_ms(
                LatencyHistogram.from_sparse(w.latency).summary_ms()))
            for i, w in enumerate(worker_stats)],
        sources=[report_mod.SourceReport(
            source=s.source, routed=s.routed, acked=s.acked, batches=s.batches,
            calls=s.calls, sent_per_worker=s.sent_per_worker, route_s=s.route_s,
            wait_s=s.wait_s, grouping=s.grouping)
            for s in source_stats],
        distinct_keys=distinct_keys or _distinct_result_keys(result, topo.app.kind),
        signals_emitted=report_mod.Signals(
            increase=sum(int(w.signals_emitted["increase"]) for w in worker_stats),
            decrease=sum(int(w.signals_emitted["decrease"]) for w in worker_stats)),
        queue_capacity_batches=min(topo.workers.queue_batches,
                                   topo.sources * topo.run.max_inflight),
        full_speed_msgs_per_s=caps.mean_total(duration_s) * full_rate if full_rate else None,
        coordinator=agg_stats.coordinator,
        load_s=load_s,
    )


def _vw_series(source_stats: list[SourceStats], t_s: np.ndarray, n: int) -> np.ndarray | None:
    """Mean over sources of each worker's virtual-worker count at every slot end."""
    hist = [s.vw_history or [] for s in source_stats]
    if not any(hist):
        return None
    out = np.zeros((len(t_s), n))
    for h in hist:
        times = np.array([t for t, _ in h])
        vals = np.array([v for _, v in h], dtype=np.float64)
        idx = np.clip(np.searchsorted(times, t_s, side="right") - 1, 0, len(h) - 1)
        out += vals[idx]
    return out / len([h for h in hist if h])


def _distinct_result_keys(result: Any, kind: str) -> int:
    if "key" not in result.column_names:
        return result.num_rows
    if kind == "wordcount":
        return result.num_rows
    import pyarrow.compute as pc

    return len(pc.unique(result.column("key")))
