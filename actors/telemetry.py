"""Live application metrics, exported by the actors themselves (``ray.util.metrics``).

Every metric is defined in ``runtime.reporting.live_metrics`` (``METRICS``, re-exported
here): named ``hs_*`` (Ray's Prometheus endpoint shows them as ``ray_hs_*``,
counters with a ``_total`` suffix) and tagged with ``run`` (the run's Ray
namespace, ``<topology name>-<UTC stamp>``) and ``actor`` (``worker-3``,
``source-0``, ``driver``), so that several runs never mix. Who updates what -
never per message:

- ``WorkerTelemetry`` (inside ``WorkerActor``): a daemon thread every
  ``TICK_S`` reads ``WorkerCore.telemetry_snapshot()`` (processed, queue,
  utilization and busy time integrated over the tick, capacity, time stopped
  by the throttle, latency percentiles of the tick), plus one histogram
  observation per processed sub-batch (its mean latency).
- ``SourceTelemetry`` (inside ``SourceActor``): a thread every ``TICK_S``
  reads the core's counters and its grouping's signal / migration counters
  and ``vw_per_worker()`` (CG: virtual workers owned per worker).
- ``RunTelemetry`` (the driver, ``run_pipeline``): progress and the current
  imbalance, on its polling loop.

Ray pushes each process's metrics to its node's metrics agent every
``metrics_report_interval_ms`` (10 s by default); ``ray_system_config()``
lowers that to ``REPORT_INTERVAL_MS`` for the clusters we start, so a live
view (``python -m runtime.top``) is ~1-2 s behind. ``HS_TELEMETRY=0`` turns
every update off. A failing metrics backend disables telemetry in that process
with one warning: it never fails a run.

The classes take a ``sink`` (default: ``RaySink``); tests pass a
``RecordingSink`` and need no Ray.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from runtime.dataflow.latency import LatencyHistogram
from runtime.dataflow.messages import Ack, WorkerSnapshot
from runtime.reporting import live_metrics
from runtime.reporting.live_metrics import METRICS  # the catalogue, used here and re-exported

if TYPE_CHECKING:
    from runtime.grouping import Grouping

log = logging.getLogger(__name__)

#: seconds between two updates by an actor's telemetry thread
TICK_S = 1.0
#: Ray's metrics push interval for clusters started by us (Ray's default: 10,000)
REPORT_INTERVAL_MS = int(os.environ.get("HS_METRICS_REPORT_MS", "1000"))


def enabled() -> bool:
    return os.environ.get("HS_TELEMETRY", "1").strip().lower() not in ("0", "false", "no", "off")


def ray_system_config() -> dict[str, Any]:
    """``ray.init(_system_config=...)`` for a cluster we start: push metrics every second."""
    if REPORT_INTERVAL_MS <= 0:
        return {}
    return {"metrics_report_interval_ms": REPORT_INTERVAL_MS}


# ============================================================================ sinks


class Sink(Protocol):
    def record(self, name: str, value: float, tags: dict[str, str]) -> None:
        """Counter: add ``value``; gauge: set it; histogram: observe it."""


class RaySink:
    """``ray.util.metrics`` objects, created lazily once per process."""

    _objects: dict[str, Any] = {}
    _lock = threading.Lock()

    def _metric(self, name: str) -> Any:
        m = self._objects.get(name)
        if m is None:
            with self._lock:
                m = self._objects.get(name)
                if m is None:
                    from ray.util import metrics as rm

                    spec = METRICS[name]
                    if spec.kind == "counter":
                        m = rm.Counter(name, spec.description, spec.tag_keys)
                    elif spec.kind == "gauge":
                        m = rm.Gauge(name, spec.description, spec.tag_keys)
                    else:
                        m = rm.Histogram(name, spec.description, list(spec.boundaries),
                                         spec.tag_keys)
                    self._objects[name] = m
        return m

    def record(self, name: str, value: float, tags: dict[str, str]) -> None:
        kind = METRICS[name].kind
        m = self._metric(name)
        if kind == "counter":
            if value > 0:
                m.inc(float(value), tags=tags)
        elif kind == "gauge":
            m.set(float(value), tags=tags)
        else:
            m.observe(float(value), tags=tags)


class RecordingSink:
    """Keeps every record (tests): ``last(name, **tags)``, ``total(name, **tags)``."""

    def __init__(self) -> None:
        self.records: list[tuple[str, float, dict[str, str]]] = []

    def record(self, name: str, value: float, tags: dict[str, str]) -> None:
        spec = METRICS[name]  # unknown names fail, as with Ray
        assert set(tags) == set(spec.tag_keys), (name, tags)
        if spec.kind == "counter" and value <= 0:
            return
        self.records.append((name, float(value), dict(tags)))

    def _match(self, name: str, tags: dict[str, str]) -> list[float]:
        return [v for n, v, t in self.records
                if n == name and all(t.get(k) == str(x) for k, x in tags.items())]

    def last(self, name: str, /, **tags: Any) -> float | None:
        vals = self._match(name, tags)
        return vals[-1] if vals else None

    def total(self, name: str, /, **tags: Any) -> float:
        return float(sum(self._match(name, tags)))


class _Emitter:
    """Base tags + the sink; the first failure disables it (one warning)."""

    def __init__(self, sink: Sink | None, run: str, actor: str) -> None:
        self.on = enabled()
        self.sink: Sink = sink if sink is not None else RaySink()
        self.tags = {"run": str(run), "actor": str(actor)}

    def __call__(self, metric: str, value: float, /, **extra: Any) -> None:
        if not self.on:
            return
        try:
            tags = self.tags if not extra else {**self.tags,
                                                **{k: str(v) for k, v in extra.items()}}
            self.sink.record(metric, value, tags)
        except Exception as e:  # noqa: BLE001 - metrics must never fail a run
            self.on = False
            log.warning("telemetry disabled for %s: %r", self.tags, e)


class _Ticker:
    """An actor's metrics updater: ``emit`` (base tags + the sink) and a daemon
    thread calling ``tick()`` every ``tick_s``; ``stop()`` ticks once more."""

    def __init__(self, core: Any, run: str, actor: str, sink: Sink | None,
                 wall: Callable[[], float], tick_s: float) -> None:
        self.core = core
        self.emit = _Emitter(sink, run, actor)
        self.wall = wall
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        raise NotImplementedError

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception as e:  # noqa: BLE001 - keep the actor running
            log.warning("telemetry tick failed: %r", e)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop = threading.Event()
        self._safe_tick()

        def loop() -> None:
            while not self._stop.wait(self.tick_s):
                self._safe_tick()

        self._thread = threading.Thread(target=loop, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        t = self._thread
        if t is None:
            return
        self._stop.set()
        t.join(timeout=5)
        self._thread = None
        self._safe_tick()


def _percentiles(counts: np.ndarray, max_s: float) -> tuple[float, float] | None:
    h = LatencyHistogram()
    h.counts = counts
    h.count = int(counts.sum())
    if h.count <= 0:
        return None
    h.max_s = max_s
    return h.percentile_s(50), h.percentile_s(99)


# ============================================================================ updaters


class WorkerTelemetry(_Ticker):
    """Worker metrics from ``core.telemetry_snapshot()`` (see the module docstring)."""

    def __init__(self, core: Any, run: str, actor: str, sink: Sink | None = None,
                 wall: Callable[[], float] = time.time, tick_s: float = TICK_S) -> None:
        super().__init__(core, run, actor, sink, wall, tick_s)
        self._prev: WorkerSnapshot | None = None

    def tick(self) -> None:
        if not self.emit.on:
            return
        s = self.core.telemetry_snapshot()
        p, self._prev = self._prev, s
        e = self.emit
        e(live_metrics.WORKER_PROCESSED, s.processed - (p.processed if p else 0))
        e(live_metrics.WORKER_QUEUE_MESSAGES, s.queue_msgs)
        e(live_metrics.WORKER_QUEUE_BATCHES, s.queue_batches)
        e(live_metrics.WORKER_CAPACITY, s.capacity)
        dt = s.t - p.t if p else 0.0
        if p is not None and dt > 0:
            e(live_metrics.WORKER_RATE, (s.processed - p.processed) / dt)
            u = (s.queue_batches_s - p.queue_batches_s) / dt / s.queue_capacity
            e(live_metrics.WORKER_UTILIZATION, max(0.0, u))
            e(live_metrics.WORKER_BUSY, min(1.0, max(0.0, (s.busy_s - p.busy_s) / dt)))
            stopped = (s.stopped_s - p.stopped_s) / dt
            e(live_metrics.WORKER_STOPPED, min(1.0, max(0.0, stopped)))
            pct = _percentiles(s.latency_counts - p.latency_counts, s.latency_max_s)
            if pct is not None:
                e(live_metrics.WORKER_LATENCY_P50, pct[0])
                e(live_metrics.WORKER_LATENCY_P99, pct[1])
        e(live_metrics.HEARTBEAT, self.wall())

    def batch_done(self, ack: Ack) -> None:
        """One observation per processed sub-batch: its messages' mean latency."""
        if ack.acked > 0 and self.emit.on:
            self.emit(live_metrics.WORKER_BATCH_LATENCY, ack.lat_sum_s / ack.acked)


class SourceTelemetry(_Ticker):
    """Source metrics from the core's counters and its grouping."""

    def __init__(self, core: Any, run: str, actor: str, sink: Sink | None = None,
                 wall: Callable[[], float] = time.time, tick_s: float = TICK_S) -> None:
        super().__init__(core, run, actor, sink, wall, tick_s)
        self._prev: dict[str, int] = {}

    def _add(self, name: str, value: int, **extra: Any) -> None:
        key = name + "|" + "|".join(f"{k}={v}" for k, v in extra.items())
        d = int(value) - self._prev.get(key, 0)
        if d > 0:
            self.emit(name, d, **extra)
            self._prev[key] = int(value)

    def tick(self) -> None:
        if not self.emit.on:
            return
        c = self.core
        g: Grouping = c.grouping
        self._add(live_metrics.SOURCE_ROUTED, c.routed)
        self._add(live_metrics.SOURCE_ACKED, c.acked)
        self._add(live_metrics.SOURCE_MIGRATIONS, g.migrations)
        for kind, v in dict(g.signals).items():
            self._add(live_metrics.SOURCE_SIGNALS, v, kind=kind)
        per = g.vw_per_worker()
        if per is not None:
            for w, v in enumerate(np.asarray(per).tolist()):
                self.emit(live_metrics.SOURCE_VW_OWNED, v, worker=w)
        self.emit(live_metrics.HEARTBEAT, self.wall())


class RunTelemetry:
    """The driver's metrics for one run: info, progress, imbalance (no thread).

    Every gauge is set again on each ``update``: Ray's metrics agent drops a gauge
    that was not refreshed within two report intervals."""

    def __init__(self, run: str, *, name: str, scheme: str, app: str, workers: int,
                 sources: int, messages: int, sink: Sink | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.emit = _Emitter(sink, run, "driver")
        self.wall = wall
        self.info = {"name": name, "scheme": scheme, "app": app, "workers": workers,
                     "sources": sources}
        self.messages = int(messages)
        self.update(0, None)

    def update(self, acked: int, imbalance: float | None, *, messages: int | None = None,
               lag: int | None = None, watermark: tuple[int, str] | None = None,
               windows_open: int | None = None) -> None:
        """``messages``: the input so far (a live stream's grows); ``lag``: a live
        stream's messages handed over and not yet processed; a windowed live
        stream's ``watermark`` (ticks, unit) and windows not emitted yet."""
        if messages is not None:
            self.messages = int(messages)
        self.emit(live_metrics.RUN_INFO, 1, **self.info)
        self.emit(live_metrics.RUN_MESSAGES, self.messages)
        self.emit(live_metrics.RUN_ACKED, acked)
        if imbalance is not None:
            self.emit(live_metrics.RUN_IMBALANCE, imbalance)
        if lag is not None:
            self.emit(live_metrics.RUN_LAG, lag)
        if watermark is not None:
            self.emit(live_metrics.RUN_WATERMARK, watermark[0], unit=watermark[1])
        if windows_open is not None:
            self.emit(live_metrics.RUN_WINDOWS_OPEN, windows_open)
        self.emit(live_metrics.HEARTBEAT, self.wall())


def actor_identity() -> tuple[str, str]:
    """``(namespace, name)`` of the calling Ray actor. The namespace is the job's:
    an actor created with ``options(namespace=...)`` is only *named* there, so the
    driver passes the run's namespace explicitly."""
    import ray

    ctx = ray.get_runtime_context()
    name = ""
    try:
        name = ctx.get_actor_name() or ""
    except Exception:  # noqa: BLE001 - older Ray / not an actor
        pass
    return str(ctx.namespace), name


def prometheus_endpoints(address: str | None = "auto") -> list[str]:
    """``host:port`` of every alive node's Prometheus metrics endpoint, via Ray's API
    (connects to the cluster at ``address`` and disconnects)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        return sorted(f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}"
                      for n in ray.nodes() if n.get("Alive") and n.get("MetricsExportPort"))
    finally:
        if started:
            ray.shutdown()
