"""The live metrics of a run: names, kinds, tags and help texts, in one place.

``actors.telemetry`` exports them from the actors (``ray.util.metrics``);
``runtime.top`` reads them back from Ray's Prometheus endpoints. Both import
the names from here. Every metric is named ``hs_*``; Prometheus shows it as
``ray_hs_*`` (``PROMETHEUS_PREFIX``), a counter with a ``_total`` suffix
(``exported``). Every metric is tagged with ``run`` (the run's Ray namespace)
and ``actor`` (``worker-3``, ``source-0``, ``driver``); a few take more tags.
No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass

#: every metric's name starts with it
NAME_PREFIX = "hs_"
#: what Ray's Prometheus endpoint puts before a metric's name
RAY_PREFIX = "ray_"
PROMETHEUS_PREFIX = RAY_PREFIX + NAME_PREFIX
BASE_TAGS = ("run", "actor")
LATENCY_BOUNDARIES_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
                        1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

# workers (actor = worker-<i>)
WORKER_PROCESSED = "hs_worker_processed"
WORKER_RATE = "hs_worker_rate"
WORKER_QUEUE_MESSAGES = "hs_worker_queue_messages"
WORKER_QUEUE_BATCHES = "hs_worker_queue_batches"
WORKER_UTILIZATION = "hs_worker_utilization"
WORKER_BUSY = "hs_worker_busy"
WORKER_CAPACITY = "hs_worker_capacity"
WORKER_STOPPED = "hs_worker_stopped"
WORKER_LATENCY_P50 = "hs_worker_latency_p50_seconds"
WORKER_LATENCY_P99 = "hs_worker_latency_p99_seconds"
WORKER_BATCH_LATENCY = "hs_worker_batch_latency_seconds"
# sources (actor = source-<i>)
SOURCE_ROUTED = "hs_source_routed"
SOURCE_ACKED = "hs_source_acked"
SOURCE_SIGNALS = "hs_source_signals"
SOURCE_MIGRATIONS = "hs_source_migrations"
SOURCE_VW_OWNED = "hs_source_vw_owned"
# the run (actor = driver)
RUN_INFO = "hs_run_info"
RUN_MESSAGES = "hs_run_messages"
RUN_ACKED = "hs_run_acked"
RUN_IMBALANCE = "hs_run_imbalance"
RUN_LAG = "hs_run_lag"
RUN_WATERMARK = "hs_run_watermark"
RUN_WINDOWS_OPEN = "hs_run_windows_open"
# every actor
HEARTBEAT = "hs_heartbeat_seconds"


@dataclass(frozen=True)
class MetricSpec:
    kind: str  # counter | gauge | histogram
    description: str
    extra_tags: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()

    @property
    def tag_keys(self) -> tuple[str, ...]:
        return BASE_TAGS + self.extra_tags


METRICS: dict[str, MetricSpec] = {
    WORKER_PROCESSED: MetricSpec("counter", "Messages processed by the worker."),
    WORKER_RATE: MetricSpec("gauge", "Messages/s processed over the last tick."),
    WORKER_QUEUE_MESSAGES: MetricSpec(
        "gauge", "Messages in the worker's queue (queued + in service), now."),
    WORKER_QUEUE_BATCHES: MetricSpec(
        "gauge", "Sub-batches in the worker's queue (queued + in service), now."),
    WORKER_UTILIZATION: MetricSpec(
        "gauge", "Mean queue length / queue capacity (batches) over the last tick: "
                 "the report's utilization U."),
    WORKER_BUSY: MetricSpec("gauge", "Fraction of the last tick spent serving."),
    WORKER_CAPACITY: MetricSpec(
        "gauge", "Configured capacity of the worker (fraction of full speed), now."),
    WORKER_STOPPED: MetricSpec(
        "gauge", "Fraction of the last tick the worker process was seen stopped by "
                 "the throttle (SIGSTOP) while serving."),
    WORKER_LATENCY_P50: MetricSpec(
        "gauge", "Median message latency over the last tick."),
    WORKER_LATENCY_P99: MetricSpec(
        "gauge", "99th percentile message latency over the last tick."),
    WORKER_BATCH_LATENCY: MetricSpec(
        "histogram", "Mean message latency of each processed sub-batch.",
        boundaries=LATENCY_BOUNDARIES_S),
    SOURCE_ROUTED: MetricSpec("counter", "Messages routed by the source."),
    SOURCE_ACKED: MetricSpec("counter", "Messages acknowledged to the source."),
    SOURCE_SIGNALS: MetricSpec(
        "counter", "Load signals received by the source's grouping, by kind "
                   "(increase / decrease).", ("kind",)),
    SOURCE_MIGRATIONS: MetricSpec(
        "counter", "Virtual workers (or keys) moved by the source's grouping."),
    SOURCE_VW_OWNED: MetricSpec(
        "gauge", "Virtual workers the source's grouping maps to each worker (CG).",
        ("worker",)),
    RUN_INFO: MetricSpec(
        "gauge", "1 for every run; its topology name, scheme and app as tags.",
        ("name", "scheme", "app", "workers", "sources")),
    RUN_MESSAGES: MetricSpec("gauge", "Input messages of the run."),
    RUN_ACKED: MetricSpec("gauge", "Messages processed and acknowledged so far."),
    RUN_IMBALANCE: MetricSpec(
        "gauge", "Current imbalance: max - mean of the workers' utilization."),
    RUN_LAG: MetricSpec(
        "gauge", "Live stream: messages Spark handed over that are not processed yet."),
    RUN_WATERMARK: MetricSpec(
        "gauge", "Windowed live stream: the newest event time handed over, in the event "
                 "column's ticks (unit: int = its own units, us = microseconds since the epoch).",
        ("unit",)),
    RUN_WINDOWS_OPEN: MetricSpec(
        "gauge", "Windowed live stream: windows held by the aggregator, not emitted yet."),
    HEARTBEAT: MetricSpec(
        "gauge", "Unix time of the actor's last telemetry update (staleness check)."),
}


def exported(name: str) -> str:
    """The name a metric's samples carry on Ray's Prometheus endpoint, less
    ``RAY_PREFIX``: a counter's gets ``_total``. Unknown names raise ``KeyError``."""
    return name + "_total" if METRICS[name].kind == "counter" else name
