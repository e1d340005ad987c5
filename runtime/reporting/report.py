"""One run report for both engines, and the run's outputs (docs/design.md "Output directory").

The report's shape is ``RunReport`` (``report.json``); ``build_report(topo,
measured)`` is the one function that builds it, for either engine, from
``RunMeasurements``: what an engine measured, in an engine-neutral shape
(``runtime.reporting.cores.measurements`` gathers it from the cores'
statistics, for ``actors.pipeline`` on Ray and for the simulator). Each
engine then adds its own sections (both: ``aggregator``; Ray: ``throttle``,
``cluster``, ``stream``, failures and memory; the simulator: ``input``,
``sim``). ``validate_report`` checks a report
against ``RunReport`` and the contract's required keys.

``timeseries(series)`` is ``timeseries.csv``, one row per ``run.slot_s`` slot,
``t_s`` = the slot's end: ``throughput_msgs_per_s`` (messages finished in the
slot / ``slot_s``), ``imbalance`` (``I(t) = max_w U_w - mean_w U_w``),
``latency_p50_ms``, ``latency_p99_ms`` (messages finishing in the slot), then
per worker ``queue_w{i}`` (mean queue length in messages), ``util_w{i}``
(``U_w``), ``capacity_w{i}`` (at the slot's middle), ``busy_w{i}`` (busy
fraction) and, for schemes with virtual workers, ``vw_w{i}`` (VWs owned at
the slot's end, mean over sources).

``write_run(out_dir, report, timeseries, result)`` writes ``report.json``,
``timeseries.csv``, ``result.parquet`` and ``report.png`` atomically: every
file is written into a hidden staging directory that is renamed into place
only once all are complete, so an interrupted run leaves nothing half-written.
"""

# no ``from __future__ import annotations``: TypedDict sees ``NotRequired`` only
# in evaluated annotations
import json
import os
import shutil
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from runtime.grouping.acg import coordinator_report
from runtime.reporting import metrics
from runtime.topology import Topology

#: the keys docs/design.md requires in every ``report.json``
REQUIRED_KEYS = (
    "name", "engine", "scheme", "messages", "duration_s", "throughput_msgs_per_s",
    "latency_ms", "imbalance", "replication", "migrations", "signals", "workers", "result",
)

#: what the report's measures mean (the same in both engines)
DEFINITIONS = {
    "utilization": "U_w = mean queue length in batches / queue_capacity_batches",
    "imbalance": "I(t) = max_w U_w(t) - mean_w U_w(t) per slot",
    "latency": "finish - emit (emit = when the batch was due at the source: "
               "its scheduled time when paced)",
}


# ============================================================================ the schema


class LatencyMs(TypedDict):
    mean: float
    p50: float
    p95: float
    p99: float
    max: float


class Imbalance(TypedDict):
    """``I(t)`` over the run's slots."""

    mean: float
    max: float


class Signals(TypedDict):
    increase: int
    decrease: int


class Messages(TypedDict):
    input: int
    processed: int
    replayed: NotRequired[int]  # Ray: re-sent after a worker's death


class WorkerReport(TypedDict):
    id: int
    capacity: float  # at the start
    final_capacity: float  # in the last slot
    processed: int
    utilization: float  # mean U_w over the slots
    keys: int  # distinct keys held
    busy_fraction: float  # service time / duration
    #: processed / service time: the rate it showed while busy (with emulated
    #: service time about capacity * 1e6 / service_us; without, its own work's)
    service_rate_msgs_per_s: float | None  # None: never busy
    mean_queue_msgs: float
    batches: int | None  # None: not counted (simulator)
    stopped_s: float | None  # time the throttler held it stopped; None: simulator
    signals_emitted: Signals | None  # None: counted for all workers only (simulator)
    latency_ms: LatencyMs | None  # None: not kept per worker (simulator)
    # Ray only: where it ran, and actors.faults's
    node_id: NotRequired[str]
    dead: NotRequired[bool]
    peak_rss_mb: NotRequired[float | None]


class SourceReport(TypedDict):
    """One source; the simulator measures only its grouping's statistics."""

    source: int
    routed: int | None
    acked: int | None
    batches: int | None
    calls: int | None
    sent_per_worker: list[int] | None
    route_s: float | None
    wait_s: float | None
    grouping: dict[str, Any]  # the source's grouping.stats()


class CapacityChange(TypedDict):
    at_s: float
    worker: int
    capacity: float


class VwOwnership(TypedDict):
    """Virtual workers owned (mean over sources) at each slot's end."""

    t_s: list[float]
    per_worker: list[list[float]]  # [worker][slot]
    final: list[float]


class Settings(TypedDict):
    """The settings the run used: the topology's, plus what follows from them."""

    sources: int
    workers: int  # every worker of the run, added ones included
    service_us: float
    throttle: str
    batch: int
    max_inflight: int
    rate: float
    call_messages: int
    linger_ms: float
    slot_s: float
    queue_batches: int
    queue_capacity_batches: int  # U_w's denominator: min(queue_batches, sources * max_inflight)
    ack_delay_ms: float | None  # always None (no engine models an ack delay; kept in the schema)
    grouping: dict[str, Any]


class Phases(TypedDict):
    """Where the run's wall time went, in seconds (``runtime.reporting.phases``):
    ``first_message`` is a time since the command's start, the others are
    durations (``startup + input + stream + finish = total``)."""

    startup: float
    input: float
    first_message: float
    stream: float
    finish: float
    total: NotRequired[float]
    finish_parts: NotRequired[dict[str, float]]  # outputs, plot, shutdown
    startup_parts: NotRequired[dict[str, float]]  # python, ray, spark (the first run)
    input_parts: NotRequired[dict[str, float]]  # real engine: plan, first_block, sources
    final: NotRequired[bool]  # False: written before the plot and the shut-down


class ResultFile(TypedDict):
    path: str
    rows: int


class RunReport(TypedDict):
    """``report.json``. ``result`` is set when the outputs are written."""

    name: str
    engine: Literal["ray", "sim"]
    scheme: str
    app: str
    messages: Messages
    duration_s: float
    load_s: float | None  # Ray: the wait for the input's first block; None: simulator
    throughput_msgs_per_s: float
    capacity_efficiency: float | None  # throughput / full-speed rate; None: service_us 0
    latency_ms: LatencyMs
    imbalance: Imbalance
    replication: float
    distinct_keys: int
    migrations: int
    signals: Signals  # the sources' groupings received
    signals_emitted: Signals  # the workers sent
    in_flight_at_end: int | None  # the simulator: messages unprocessed at its end; None: Ray
    workers: list[WorkerReport]
    sources: list[SourceReport]
    capacity_changes: list[CapacityChange]
    topology: Settings
    definitions: dict[str, str]
    coordinator: NotRequired[dict[str, Any]]  # schemes with a controller (acg)
    vw_ownership: NotRequired[VwOwnership]  # schemes with virtual workers
    result: NotRequired[ResultFile]
    phases: NotRequired[Phases]  # every run's report.json has it (``write_run`` checks)
    # the Ray engine's own sections
    aggregator: NotRequired[dict[str, Any]]
    throttle: NotRequired[dict[str, Any]]
    cluster: NotRequired[dict[str, Any]]
    stream: NotRequired[dict[str, Any]]
    failures: NotRequired[list[Any]]
    peak_rss_mb: NotRequired[dict[str, float]]
    dead_workers: NotRequired[list[int]]
    membership_changes: NotRequired[list[Any]]
    source_restarts: NotRequired[list[Any]]
    verify: NotRequired[dict[str, Any]]
    # the simulator's own sections
    input: NotRequired[str]
    sim: NotRequired[dict[str, Any]]


# ============================================================================ the input


@dataclass
class SlotSeries:
    """Per-slot measurements: row ``k`` is the slot ``[k, k + 1) * slot_s``;
    ``[slot, worker]`` arrays have one column per worker."""

    slot_s: float
    finished: np.ndarray  # [slot] messages finished in the slot
    queue_msgs: np.ndarray  # [slot, worker] mean queue length in messages
    utilization: np.ndarray  # [slot, worker] U_w
    capacity: np.ndarray  # [slot, worker] at the slot's middle
    busy: np.ndarray  # [slot, worker] busy fraction
    vw: np.ndarray | None  # [slot, worker] VWs owned at the slot's end; None: no VWs
    latency_p50_ms: np.ndarray | Sequence[float]  # [slot] of the messages finishing in it
    latency_p99_ms: np.ndarray | Sequence[float]

    @property
    def t_s(self) -> np.ndarray:
        return (np.arange(len(self.finished)) + 1) * self.slot_s


@dataclass
class WorkerTotals:
    """One worker's counts over the whole run (``None``: not measured)."""

    capacity: float  # at the start
    processed: int
    keys: int
    batches: int | None = None
    stopped_s: float | None = None
    signals_emitted: Signals | None = None
    latency_ms: LatencyMs | None = None


@dataclass
class RunMeasurements:
    """What an engine measured in one run: ``build_report``'s input."""

    engine: Literal["ray", "sim"]
    messages_input: int
    messages_processed: int
    duration_s: float
    latency_ms: LatencyMs  # over every message
    series: SlotSeries
    workers: list[WorkerTotals]
    sources: list[SourceReport]
    distinct_keys: int  # replication's denominator
    signals_emitted: Signals
    queue_capacity_batches: int
    #: what the capacities allow at full speed, averaged over the run; None: service_us 0
    full_speed_msgs_per_s: float | None
    coordinator: dict[str, Any] | None = None  # the scheme's controller, summarized
    load_s: float | None = None
    in_flight_at_end: int | None = None
    ack_delay_ms: float | None = None


def latency_ms(summary: Mapping[str, float]) -> LatencyMs:
    """A ``{"mean", "p50", "p95", "p99", "max"}`` summary as ``LatencyMs``."""
    return LatencyMs(mean=summary["mean"], p50=summary["p50"], p95=summary["p95"],
                     p99=summary["p99"], max=summary["max"])


# ============================================================================ building


def build_report(topo: Topology, m: RunMeasurements) -> RunReport:
    """``report.json`` (without ``result``) from either engine's measurements."""
    s = m.series
    util = s.utilization
    duration = m.duration_s
    throughput = m.messages_processed / duration if duration > 0 else 0.0
    groupings = [src["grouping"] for src in m.sources]
    imbalance = metrics.imbalance_summary(util)
    final_caps = s.capacity[-1] if len(s.capacity) else [w.capacity for w in m.workers]
    busy_s = [float(s.busy[:, i].sum() * s.slot_s) for i in range(len(m.workers))]
    workers = [
        WorkerReport(
            id=i, capacity=float(w.capacity), final_capacity=float(final_caps[i]),
            processed=int(w.processed), utilization=float(util[:, i].mean()), keys=int(w.keys),
            busy_fraction=busy_s[i] / duration if duration > 0 else 0.0,
            service_rate_msgs_per_s=(w.processed / busy_s[i] if busy_s[i] > 0 else None),
            mean_queue_msgs=float(s.queue_msgs[:, i].mean()),
            batches=w.batches, stopped_s=w.stopped_s, signals_emitted=w.signals_emitted,
            latency_ms=w.latency_ms)
        for i, w in enumerate(m.workers)
    ]
    run, wspec = topo.run, topo.workers
    report = RunReport(
        name=topo.name,
        engine=m.engine,
        scheme=topo.grouping.scheme,
        app=topo.app.kind,
        messages=Messages(input=int(m.messages_input), processed=int(m.messages_processed)),
        duration_s=duration,
        load_s=m.load_s,
        throughput_msgs_per_s=throughput,
        capacity_efficiency=(throughput / m.full_speed_msgs_per_s
                             if m.full_speed_msgs_per_s else None),
        latency_ms=m.latency_ms,
        imbalance=Imbalance(mean=imbalance["mean"], max=imbalance["max"]),
        replication=metrics.replication([w.keys for w in m.workers], m.distinct_keys),
        distinct_keys=int(m.distinct_keys),
        migrations=sum(int(g.get("migrations", 0)) for g in groupings),
        signals=Signals(
            increase=sum(int(g.get("signals", {}).get("increase", 0)) for g in groupings),
            decrease=sum(int(g.get("signals", {}).get("decrease", 0)) for g in groupings)),
        signals_emitted=m.signals_emitted,
        in_flight_at_end=m.in_flight_at_end,
        workers=workers,
        sources=m.sources,
        capacity_changes=[
            CapacityChange(at_s=float(c.at_s), worker=int(c.worker), capacity=float(c.capacity))
            for c in sorted(wspec.changes, key=lambda c: (c.at_s, c.worker, c.capacity))],
        topology=Settings(
            sources=topo.sources, workers=len(m.workers), service_us=wspec.service_us,
            throttle=wspec.throttle, batch=run.batch, max_inflight=run.max_inflight,
            rate=run.rate, call_messages=run.call_messages, linger_ms=run.linger_ms,
            slot_s=run.slot_s, queue_batches=wspec.queue_batches,
            queue_capacity_batches=m.queue_capacity_batches, ack_delay_ms=m.ack_delay_ms,
            grouping=topo.grouping_params()),
        definitions=dict(DEFINITIONS),
    )
    if m.coordinator is not None:
        report["coordinator"] = coordinator_report(
            m.coordinator, [g.get("tables_adopted", []) for g in groupings], duration)
    if s.vw is not None:
        vw = np.asarray(s.vw, dtype=np.float64)
        report["vw_ownership"] = VwOwnership(
            t_s=[float(t) for t in s.t_s], per_worker=vw.T.tolist(),
            final=vw[-1].tolist() if len(vw) else [])
    return report


def timeseries(s: SlotSeries) -> pd.DataFrame:
    """``timeseries.csv``'s frame (columns: this module's docstring)."""
    cols: dict[str, Any] = {
        "t_s": s.t_s,
        "throughput_msgs_per_s": s.finished / s.slot_s,
        "imbalance": metrics.imbalance(s.utilization),
        "latency_p50_ms": s.latency_p50_ms,
        "latency_p99_ms": s.latency_p99_ms,
    }
    for prefix, arr in (("queue", s.queue_msgs), ("util", s.utilization),
                        ("capacity", s.capacity), ("busy", s.busy), ("vw", s.vw)):
        if arr is not None:
            for w in range(arr.shape[1]):
                cols[f"{prefix}_w{w}"] = arr[:, w]
    return pd.DataFrame(cols)


# ============================================================================ checking


def validate_report(report: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless ``report`` has the contract's keys and every
    key ``RunReport`` describes has its type (extra keys are welcome); the
    message names the first misfit, e.g. ``workers[2].keys``."""
    missing = [k for k in REQUIRED_KEYS if k not in report]
    if missing:
        raise ValueError(f"report is missing keys: {', '.join(missing)}")
    _check(report, RunReport, "report")


def _check(value: Any, tp: Any, where: str) -> None:
    if tp is Any:
        return
    if typing.is_typeddict(tp):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected an object, got {value!r:.80}")
        missing = sorted(tp.__required_keys__ - set(value))
        if missing:
            raise ValueError(f"{where}: missing keys: {', '.join(missing)}")
        hints = typing.get_type_hints(tp)
        for key, v in value.items():
            if key in hints:
                _check(v, hints[key], f"{where}.{key}")
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        errors = []
        for alt in args:
            try:
                _check(value, alt, where)
            except ValueError as e:
                errors.append(str(e))
            else:
                return
        raise ValueError(" or ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where}: expected one of {list(args)}, got {value!r:.80}")
    elif origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {value!r:.80}")
        for i, v in enumerate(value):
            _check(v, args[0], f"{where}[{i}]")
    elif origin is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected an object, got {value!r:.80}")
        for k, v in value.items():
            _check(v, args[1], f"{where}.{k}")
    elif tp is type(None):
        if value is not None:
            raise ValueError(f"{where}: expected null, got {value!r:.80}")
    elif not _is_instance(value, tp):
        raise ValueError(f"{where}: expected {tp.__name__}, got {value!r:.80}")


def _is_instance(value: Any, tp: type) -> bool:
    """JSON's view: a bool is no number, an int is a float."""
    if tp in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if tp is float else tp)


# ============================================================================ writing


def default_out_dir(name: str, root: str | os.PathLike[str] = "runs") -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return Path(root) / f"{name}-{stamp}"


def write_run(
    out_dir: str | os.PathLike[str],
    report: Mapping[str, Any],
    timeseries: pd.DataFrame,
    result: pa.Table,
    *,
    plot: bool = True,
) -> Path:
    """Write a run's outputs into ``out_dir`` atomically; returns the directory."""
    out = Path(out_dir)
    report = {**report, "result": {"path": "result.parquet", "rows": result.num_rows}}
    validate_report(report)
    if "phases" not in report:
        raise ValueError("report is missing keys: phases")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    # a run directory gets the modes of any directory the user makes (the
    # umask's), as a live stream's files do - not mkdtemp's private 0700
    os.chmod(stage, 0o777 & ~_umask())
    try:
        pq.write_table(result, stage / "result.parquet")
        timeseries.to_csv(stage / "timeseries.csv", index=False)
        (stage / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        if plot:
            from runtime.reporting.plots import plot_run

            plot_run(report, timeseries, stage / "report.png")
        if out.exists() and any(out.iterdir()):
            # an existing, non-empty --out: file by file, report.json last, so a
            # report.json on disk always describes complete outputs
            for f in sorted(stage.iterdir(), key=lambda f: f.name == "report.json"):
                os.replace(f, out / f.name)
            stage.rmdir()
        else:  # absent or empty: one rename (POSIX replaces an empty directory)
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out


def write_plot(out_dir: str | os.PathLike[str], report: Mapping[str, Any],
               timeseries: pd.DataFrame | None = None) -> Path:
    """``report.png`` for a run whose other outputs are written (``write_run``
    with ``plot=False``: the result first, the plot after); ``timeseries``
    default: ``timeseries.csv``. Atomic: a reader sees no half-written file."""
    from runtime.reporting.plots import plot_run

    out = Path(out_dir)
    ts = timeseries if timeseries is not None else pd.read_csv(out / "timeseries.csv")
    tmp = out / ".report.png.tmp.png"
    try:
        plot_run(dict(report), ts, tmp)
        os.replace(tmp, out / "report.png")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out / "report.png"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_parquet_atomic(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Write ``path`` through a hidden temporary file and a rename: a reader
    sees the previous file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_result(out_dir: str | os.PathLike[str], result: pa.Table) -> Path:
    """Replace ``out_dir/result.parquet`` atomically (a live stream's answer so far)."""
    return write_parquet_atomic(result, Path(out_dir) / "result.parquet")


def summary_table(report: dict[str, Any]) -> str:
    """The final summary printed on stdout."""
    lat = report["latency_ms"]
    rows = [
        ("engine / scheme", f"{report['engine']} / {report['scheme']}"),
        ("messages (input / processed)",
         f"{report['messages']['input']:,} / {report['messages']['processed']:,}"),
        ("duration", f"{report['duration_s']:.2f} s"),
        ("throughput", f"{report['throughput_msgs_per_s']:,.0f} msgs/s"),
    ]
    if report.get("capacity_efficiency") is not None:
        rows.append(("capacity efficiency", f"{report['capacity_efficiency']:.3f}"))
    rows += [
        ("latency p50 / p99 / max",
         f"{lat['p50']:.1f} / {lat['p99']:.1f} / {lat['max']:.1f} ms"),
        ("imbalance I(t) mean / max",
         f"{report['imbalance']['mean']:.3f} / {report['imbalance']['max']:.3f}"),
        ("replication (KG = 1)", f"{report['replication']:.3f}"),
        ("migrations / signals +/-",
         f"{report['migrations']} / {report['signals']['increase']} / "
         f"{report['signals']['decrease']}"),
    ]
    if report.get("phases"):
        from runtime.reporting.phases import summary_rows

        rows += summary_rows(report["phases"])
    width = max(len(r[0]) for r in rows)
    lines = [f"{a:<{width}}  {b}" for a, b in rows]
    lines.append("")
    lines.append(f"{'worker':>6} {'capacity':>8} {'processed':>10} {'util':>6} {'keys':>8} "
                 f"{'service msgs/s':>14}")
    for w in report["workers"]:
        rate = w.get("service_rate_msgs_per_s")
        lines.append(f"{w['id']:>6} {w['capacity']:>8.2f} {w['processed']:>10,} "
                     f"{w['utilization']:>6.2f} {w['keys']:>8,} "
                     f"{'-' if rate is None else f'{rate:,.0f}':>14}")
    return "\n".join(lines)
