"""Turn an engine run into the shared outputs: report dict, time series, result.

Definitions match the real runtime's report (``actors/pipeline.py``), so the
two engines compare column for column:
- time series: one row per ``run.slot_s`` slot, ``t_s`` = the slot's end;
  ``throughput_msgs_per_s`` = messages finished in the slot / ``slot_s``;
  ``queue_w{i}`` = mean queue length in messages over the slot;
  ``util_w{i}`` = ``U_w`` = mean queue length in batches / queue capacity
  (``min(workers.queue_batches, sources * max_inflight)``);
  ``imbalance`` = ``I(t) = max_w U_w - mean_w U_w`` (recomputable from the
  util columns); ``capacity_w{i}`` at the slot's middle; ``busy_w{i}`` = busy
  fraction (extra); ``vw_w{i}`` = VWs owned (mean over sources) at the slot's
  end; latency percentiles of the messages finishing in the slot
  (log-binned, within ~2.3%);
- report: ``latency_ms`` exact over every message; ``imbalance`` mean / max
  of I(t) over the slots; ``workers[].utilization`` = mean ``U_w`` over the
  slots, ``busy_fraction`` = service time / duration;
  ``capacity_efficiency`` = throughput / full-speed rate of the cluster,
  ``sum_w c_w * 1e6 / service_us`` with ``c_w`` averaged over the run
  (capacity changes); null when ``service_us`` is 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from runtime import metrics
from runtime.grouping.acg import coordinator_report
from runtime.operators import AggregatorApp, WorkerApp, operator_for_app
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


def timeseries(er: EngineResult) -> pd.DataFrame:
    p = er.params
    rows = er.lat_hist.shape[0]
    util = utilization(er)
    pct = hist_percentiles(er.lat_hist, (50.0, 99.0)) * 1e3
    cols: dict[str, Any] = {
        "t_s": (np.arange(rows) + 1) * p.slot_s,
        "throughput_msgs_per_s": er.lat_hist.sum(axis=1) / p.slot_s,
        "imbalance": metrics.imbalance(util),
        "latency_p50_ms": pct[:, 0],
        "latency_p99_ms": pct[:, 1],
    }
    nw = p.n_workers
    for prefix, arr in (("queue", er.queue_msgs), ("util", util), ("capacity", er.capacity),
                        ("busy", er.busy), ("vw", er.vw)):
        if arr is not None:
            for w in range(nw):
                cols[f"{prefix}_w{w}"] = arr[:, w]
    return pd.DataFrame(cols)


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


def build_report(topo: Topology, er: EngineResult) -> dict[str, Any]:
    p = er.params
    processed_mask = ~np.isnan(er.latency_s)
    n_processed = int(processed_mask.sum())
    duration = er.duration_s
    throughput = n_processed / duration if duration > 0 else 0.0
    util = utilization(er)
    stats = er.grouping_stats
    if p.service_us > 0:
        full_rate = float(mean_capacity(er).sum()) * 1e6 / p.service_us
        efficiency: float | None = throughput / full_rate
    else:
        efficiency = None
    final_caps = er.capacity[-1] if len(er.capacity) else np.array(p.capacities)
    workers = [
        {
            "id": w,
            "capacity": float(p.capacities[w]),
            "final_capacity": float(final_caps[w]),
            "processed": int(er.processed[w]),
            "utilization": float(util[:, w].mean()),
            "keys": int(er.keys_per_worker[w]),
            "busy_fraction": float(er.busy[:, w].sum() * p.slot_s / duration)
            if duration > 0 else 0.0,
            "mean_queue_msgs": float(er.queue_msgs[:, w].mean()),
        }
        for w in range(p.n_workers)
    ]
    report: dict[str, Any] = {
        "name": topo.name,
        "engine": "sim",
        "scheme": p.scheme,
        "messages": {"input": er.n_messages, "processed": n_processed},
        "duration_s": duration,
        "throughput_msgs_per_s": throughput,
        "capacity_efficiency": efficiency,
        "latency_ms": metrics.latency_summary_ms(er.latency_s[processed_mask]),
        "imbalance": metrics.imbalance_summary(util),
        "replication": metrics.replication(er.keys_per_worker.tolist(), er.distinct_keys),
        "migrations": int(sum(s["migrations"] for s in stats)),
        "signals": {k: int(sum(s["signals"][k] for s in stats)) for k in ("increase", "decrease")},
        "workers": workers,
        "capacity_changes": [
            {"at_s": t, "worker": w, "capacity": c} for t, w, c in p.changes
        ],
        "distinct_keys": er.distinct_keys,
        "in_flight_at_end": er.inflight_at_end,
        "sources": p.n_sources,
        "batch": p.batch,
        "rate": p.rate,
        "max_inflight": p.max_inflight,
        "queue_capacity_batches": p.queue_capacity_batches,
        "signals_emitted": er.signals_emitted,
        "service_us": p.service_us,
        "ack_delay_ms": p.ack_delay_s * 1e3,
        "topology": {"sources": topo.sources, "workers": topo.workers.count,
                     "service_us": topo.workers.service_us,
                     "throttle": topo.workers.throttle, "batch": topo.run.batch,
                     "max_inflight": topo.run.max_inflight, "rate": topo.run.rate,
                     "slot_s": topo.run.slot_s, "queue_batches": topo.workers.queue_batches,
                     "grouping": topo.grouping_params()},
        "definitions": {
            "utilization": "U_w = mean queue length in batches / queue_capacity_batches",
            "imbalance": "I(t) = max_w U_w(t) - mean_w U_w(t) per slot",
            "latency": "finish - emit (emit = when the batch was due at the source: "
                       "its scheduled time when paced)",
        },
    }
    if er.coordinator is not None:
        report["coordinator"] = coordinator_report(
            er.coordinator, [g.get("tables_adopted", []) for g in stats], duration)
    if er.vw is not None:
        report["vw_per_worker_end"] = [float(x) for x in er.vw[-1]]
    return report
