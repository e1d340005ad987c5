"""The messages between the dataflow cores, typed: what a worker answers a
source's call with (``Ack``), and what the aggregator answers a worker's flush
with (``CommitAnswer``, its ``Verdict``); what a restarted source reads to
plan its resume (``WorkerFence`` from each live worker, ``CommittedClaims``
from the aggregator); and what the cores report at the end
of a run (``SourceStats``, ``WorkerStats`` with its ``WorkerSeries``,
``AggregatorStats``) and while it runs (``SourceProgress``,
``WorkerProgress``, ``WorkerSnapshot``), which
the driver turns into the run's report (``runtime.reporting.cores``). Both
engines carry these as they are (Ray pickles them; the simulator passes them
by reference)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Ack:
    """A worker's answer to one call: its sub-batches were processed (or, for
    a fenced-off source incarnation, ``rejected`` unprocessed)."""

    worker: int
    acked: int  # messages processed (0 when rejected)
    signal: int  # CG's piggybacked load signal: +1 increase, -1 decrease, 0 none
    lat_sum_s: float  # the call's messages' latencies, summed
    lat_max_s: float
    done_ts: float  # when it was processed (the worker's clock)
    flush_seq: int  # the flush that holds these messages
    committed_seq: int  # the newest flush the aggregator committed
    rejected: bool = False
    table: Any = None  # a coordinated scheme's newest VW table, once per source


@dataclass(frozen=True, slots=True)
class WorkerFence:
    """A worker's answer to ``fence_source`` (``ClaimLog.fence``): what it
    holds of the restarted source - claims ``(batch, idx, flush_seq)``, the
    latest watermark it saw and its newest committed flush."""

    claims: list[tuple[int, Any, int]]  # idx: int32 message indices
    watermark: int
    committed_seq: int


@dataclass(frozen=True, slots=True)
class CommittedClaims:
    """The aggregator's answer to ``committed_claims`` (``CommitLedger.claims_of``):
    the source's committed claims ``(batch, idx)`` at or after its watermark."""

    claims: list[tuple[int, Any]]
    watermark: int


class Verdict(enum.Enum):
    """What the aggregator did with a flush."""

    COMMIT = "commit"  # merged (and any early flushes it unblocked)
    DUPLICATE = "duplicate"  # committed before: ignored
    FENCED = "fenced"  # its worker was declared dead: refused
    PENDING = "pending"  # arrived before an earlier one: committed when that comes


@dataclass(frozen=True, slots=True)
class CommitAnswer:
    """The aggregator's answer to a flush."""

    verdict: Verdict
    committed_seq: int  # the worker's newest committed flush
    table: Any = None  # the coordinator's current VW table (None without one)


@dataclass(frozen=True, slots=True)
class SourceStats:
    """A source's statistics at the end of its run (``SourceCore.run``);
    times are on the source's clock. ``grouping``: its grouping's own
    ``stats()``; ``failures``: a record per worker death it handled
    (``FailureLog.records``); ``resume``: a restart's counters
    (``Resume.stats``), or None. The edge's: when the actor's ``run``
    started, when it resumed (after fencing a dead incarnation) and its peak
    RSS (None in the simulator)."""

    source: int
    routed: int  # messages sent to workers
    acked: int
    batches: int
    calls: int
    sent_per_worker: list[int]
    grouping: dict[str, Any]
    migrations: int
    signals: dict[str, int]  # {"increase": n, "decrease": n}
    route_s: float
    wait_s: float
    elapsed_s: float | None
    end_ts: float  # the stream's last ack (before the commits)
    committed_ts: float
    vw_history: list[tuple[float, list[int]]]  # (seconds since t0, VWs per worker)
    epoch: int
    failures: list[dict[str, Any]]
    resume: dict[str, Any] | None
    live_workers: list[int]
    retained_peak_messages: int
    retained_peak_bytes: int
    joins: list[Any]
    rerouted_messages: int
    started_ts: float | None = None
    resumed_ts: float | None = None
    peak_rss_mb: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerSeries:
    """A worker's per-slot time series (``run.slot_s``), slot 0 to its last:
    messages processed, mean queue length (messages, calls), busy fraction,
    and a sparse latency histogram per slot that has one."""

    slot: list[int] = field(default_factory=list)
    processed: list[int] = field(default_factory=list)
    queue_msgs: list[float] = field(default_factory=list)
    queue_batches: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    latency: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # slot -> sparse


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A worker's statistics at the end of its run (``WorkerCore.finish``),
    or a dead worker's as the aggregator's ledger has them (``dead``).
    ``latency``: its sparse histogram (``LatencyHistogram.to_sparse``). The
    edge's: its process id and peak RSS (None in the simulator)."""

    id: int
    processed: int
    batches: int
    keys: int
    flushes: int
    stopped_s: float
    latency: tuple[Any, ...]
    signals_emitted: dict[str, int]  # {"increase": n, "decrease": n}
    queue_capacity_batches: int
    series: WorkerSeries
    committed_seq: int = 0
    rejected_batches: int = 0
    duplicate_messages: int = 0
    dead: bool = False
    pid: int | None = None
    peak_rss_mb: float | None = None


@dataclass(frozen=True, slots=True)
class AggregatorStats:
    """The aggregator's statistics (``AggregatorCore.stats``); report.json's
    ``aggregator`` section is ``as_report()``. Per worker (keys are the
    worker ids as strings, as in JSON): its newest committed flush and the
    messages its committed flushes hold. ``coordinator``: a coordinated
    scheme's controller summary; ``windows``: a windowed app's
    (``AggregatorApp.window_stats``). Those two are left out of the report
    when None."""

    partials: int
    committed_seq: dict[str, int]
    committed_messages: dict[str, int]
    fenced_workers: list[int]
    duplicate_flushes: int
    rejected_flushes: int
    out_of_order_flushes: int
    claims_held: int
    early_flushes: int
    peak_rss_mb: float | None
    coordinator: dict[str, Any] | None = None
    windows: dict[str, Any] | None = None

    def as_report(self) -> dict[str, Any]:
        """The report's ``aggregator`` section (its keys are a contract)."""
        optional = ("coordinator", "windows")
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None or f.name not in optional:
                out[f.name] = v
        return out


@dataclass(frozen=True, slots=True)
class SourceProgress:
    """A source's counters while it runs (``SourceCore.progress``: the driver's
    progress bar and supervisor). ``retained``: messages in its replay log;
    ``failures``: its records so far of the worker deaths it handled."""

    source: int
    routed: int
    acked: int
    done: bool
    epoch: int
    retained: int
    failures: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class WorkerProgress:
    """A worker's answer to the driver's ping (``WorkerCore.progress``)."""

    worker: int
    processed: int
    utilization: float
    queue_msgs: int


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """A worker's cumulative counters since ``start_run`` at ``t`` (its
    clock), for live metrics (``WorkerCore.telemetry_snapshot``): the
    difference of two gives rates, mean utilization (``queue_batches_s`` over
    ``queue_capacity``), the busy and stopped fractions, and the interval's
    latency histogram (``latency_counts``, ``LatencyHistogram``'s bins)."""

    t: float
    processed: int
    batches: int
    queue_msgs: int
    queue_batches: int
    queue_capacity: int
    capacity: float
    queue_batches_s: float
    busy_s: float
    stopped_s: float
    latency_counts: Any  # np.ndarray of int64, one per bin
    latency_max_s: float
