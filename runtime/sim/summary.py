"""The simulator's side of the run report: an ``EngineResult`` gathered into
``runtime.reporting.report.RunMeasurements``, the engine-neutral input of the one
report builder, and the application's result.

What the simulator measures for the shared definitions
(``runtime.reporting.report.DEFINITIONS``): queue lengths, busy time and capacities
time-averaged over each ``run.slot_s`` slot; ``U_w`` = mean queue length in
batches / queue capacity (``min(workers.queue_batches, sources *
max_inflight)``); latency exact over every message for the report, per slot
from log-binned histograms (within ~2.3%); the full-speed rate ``sum_w c_w *
1e6 / service_us`` with ``c_w`` averaged over the run (capacity changes).
Not measured: batches, throttler stops and signals per worker, per-source
counts (the report says ``null``); the Ray engine has no ack delay to model.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from runtime.operators import AggregatorApp, WorkerApp, operator_for_app
from runtime.reporting import metrics, report
from runtime.sim.engine import EngineResult
from runtime.sim.inputs import SimInput
from runtime.sim.kernels import hist_percentiles
from runtime.topology import Topology

#: messages a simulated worker adds to its operator per call
ADD_CHUNK = 65_536


def result_table(topo: Topology, inp: SimInput, er: EngineResult) -> pa.Table:
    """The application's result, computed by the very operators the real
    runtime runs (``runtime.operators``): every worker adds the messages it
    processed, in order, and flushes; the aggregator merges the partials of
    all workers and finishes. Keys split across workers are merged exactly as
    in a real run."""
    op = operator_for_app(topo.app.model_dump(), topo.base_dir)
    agg = AggregatorApp(op)
    for w in range(er.params.n_workers):
        idx = np.flatnonzero(er.msg_worker == w)
        app = WorkerApp(op)
        for lo in range(0, len(idx), ADD_CHUNK):
            sel = idx[lo:lo + ADD_CHUNK]
            app.add(inp.records(sel), inp.key_hashes[inp.key_ids[sel]])
        agg.merge(app.flush(), w)
    return agg.result()


def utilization(er: EngineResult) -> np.ndarray:
    """``U[slot, worker]`` = mean queue length in batches / queue capacity."""
    return er.queue_batches / er.params.queue_capacity_batches


def slot_series(er: EngineResult) -> report.SlotSeries:
    p = er.params
    pct = hist_percentiles(er.lat_hist, (50.0, 99.0)) * 1e3
    return report.SlotSeries(
        slot_s=p.slot_s, finished=er.lat_hist.sum(axis=1), queue_msgs=er.queue_msgs,
        utilization=utilization(er), capacity=er.capacity, busy=er.busy, vw=er.vw,
        latency_p50_ms=pct[:, 0], latency_p99_ms=pct[:, 1])


def mean_capacity(er: EngineResult) -> np.ndarray:
    """Each worker's capacity averaged over ``[0, duration]``."""
    p = er.params
    caps = np.array(p.capacities, dtype=np.float64)
    if er.duration_s <= 0 or not p.changes:
        return caps
    out = np.zeros_like(caps)
    for w in range(len(caps)):
        pts = [(0.0, caps[w])] + sorted((t, c) for t, ww, c in p.changes if ww == w)
        cur_t, cur_c = 0.0, caps[w]
        for t, c in pts[1:]:
            t = min(t, er.duration_s)
            out[w] += cur_c * (t - cur_t)
            cur_t, cur_c = t, c
        out[w] += cur_c * (er.duration_s - cur_t)
        out[w] /= er.duration_s
    return out


def measurements(er: EngineResult) -> report.RunMeasurements:
    p = er.params
    processed_mask = ~np.isnan(er.latency_s)
    return report.RunMeasurements(
        engine="sim",
        messages_input=er.n_messages,
        messages_processed=int(processed_mask.sum()),
        duration_s=er.duration_s,
        latency_ms=report.latency_ms(metrics.latency_summary_ms(er.latency_s[processed_mask])),
        series=slot_series(er),
        workers=[report.WorkerTotals(capacity=float(p.capacities[w]),
                                     processed=int(er.processed[w]),
                                     keys=int(er.keys_per_worker[w]))
                 for w in range(p.n_workers)],
        sources=[report.SourceReport(source=i, routed=None, acked=None, batches=None,
                                     calls=None, sent_per_worker=None, route_s=None,
                                     wait_s=None, grouping=g)
                 for i, g in enumerate(er.grouping_stats)],
        distinct_keys=er.distinct_keys,
        signals_emitted=report.Signals(increase=er.signals_emitted["increase"],
                                       decrease=er.signals_emitted["decrease"]),
        queue_capacity_batches=p.queue_capacity_batches,
        full_speed_msgs_per_s=(float(mean_capacity(er).sum()) * 1e6 / p.service_us
                               if p.service_us > 0 else None),
        coordinator=er.coordinator,
        in_flight_at_end=er.inflight_at_end,
        ack_delay_ms=p.ack_delay_s * 1e3,
    )
