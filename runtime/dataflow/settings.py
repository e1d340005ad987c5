"""What each dataflow core is built from, derived from the topology once.

``SourceSettings``, ``WorkerSettings`` and ``AggregatorSettings`` hold a
core's tunables and the values the topology implies for it (``run.linger_ms``
as seconds, ``run.rate`` per source, a worker's queue capacity, a
coordinated scheme's report period...). Each has one ``from_topology``; both
engines build their cores from what it returns (``actors.pipeline`` hands the
settings to the Ray actors, ``runtime.sim.cores`` to the cores it drives), so
the simulator runs the real engine's configuration, not a copy of its
arithmetic. What is not a setting stays a constructor argument of the core:
its identity (``index``, ``worker_id``, a source's ``epoch``), the objects it
works with (the grouping, the app, the transport, the control, the
coordinator, the sink), its clock and what a restart carries over (dead
workers, a checkpointed state).

Frozen and picklable: the Ray actors get them as constructor arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.grouping.signals import WorkerSignals

if TYPE_CHECKING:
    from runtime.operators import BoundOperator
    from runtime.topology import Topology

#: default ``run.call_messages``: most messages per worker call
CALL_MESSAGES = 8192


@dataclass(frozen=True)
class SourceSettings:
    """A source's settings (the same for every source of a run).

    The core's: ``outbox``, batches' worth of messages an outbox may hold
    before the source blocks (default ``max_inflight``); ``linger_s``, how
    long an outbox may wait to fill its call (0: send at once), and
    ``behind_linger_s`` while the source is behind its input (default
    ``linger_s``); ``capacities`` and ``capacity_changes`` (``(at_s, worker,
    capacity)``), told only to reference schemes (WRR); ``report_every_s``,
    a coordinated scheme's load-report period.

    The edge's (what feeds the core, and its grouping): ``scheme``,
    ``grouping_params`` and ``seed`` (source ``i`` routes with seed ``seed +
    i``: ``grouping``), ``batch`` (rows per micro-batch), ``columns`` (what
    the app needs besides the key) and ``max_pending_rows`` (a live stream's
    inbox bound)."""

    n_workers: int
    max_inflight: int = 2
    outbox: int | None = None
    call_messages: int = CALL_MESSAGES
    linger_s: float = 0.0
    behind_linger_s: float | None = None
    rate_per_source: float = 0.0
    key: str = "key"
    vw_every_s: float = 0.5
    capacities: tuple[float, ...] | None = None
    capacity_changes: tuple[tuple[float, int, float], ...] = ()
    report_every_s: float = 1.0
    scheme: str = "kg"
    grouping_params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    seed: int = 0
    batch: int = 1000
    columns: tuple[str, ...] = ()
    max_pending_rows: int = 100_000

    @classmethod
    def from_topology(cls, topo: Topology, coordinator: Any = None) -> SourceSettings:
        """``coordinator``: the run's controller (coordinated schemes; its
        ``epoch_s`` is the load-report period), or None."""
        from runtime.reporting.cores import Capacities

        run, caps = topo.run, Capacities(topo)
        return cls(
            n_workers=topo.workers.total_count, max_inflight=run.max_inflight,
            call_messages=run.call_messages, linger_s=run.linger_ms / 1000,
            behind_linger_s=run.behind_linger_ms / 1000,
            rate_per_source=run.rate / topo.sources, key="key", vw_every_s=run.slot_s,
            capacities=tuple(caps.initial), capacity_changes=tuple(caps.changes),
            report_every_s=coordinator.epoch_s if coordinator is not None else 1.0,
            scheme=topo.grouping.scheme, grouping_params=topo.grouping_params(),
            seed=run.seed, batch=run.batch,
            columns=tuple(c for c in topo.app.columns_needed() if c != "key"),
            max_pending_rows=run.max_pending_rows)

    def grouping(self, index: int, clock: Callable[[], float] = time.time) -> Any:
        """Source ``index``'s own grouping instance (seed ``seed + index``)."""
        from runtime.grouping import make_grouping

        return make_grouping(self.scheme, self.n_workers, seed=self.seed + index, clock=clock,
                             **self.grouping_params)


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's settings. ``capacity``: its initial one (``throttle:
    service`` scales its service time by it); ``queue_batches``: its input
    queue's bound in calls; ``queue_capacity_batches``: the denominator of its
    utilization (default ``queue_batches``; docs/algorithms.md, "Metrics");
    ``signals``: CG's load signals (None: the scheme needs none);
    ``report_every_s``: coordinated schemes - every flush also carries a rate
    report, at least this often (None: no reports); ``report_jump``: and a
    worker whose rate moves by more than this (relative) flushes at once to
    say so (``LoadMeter.change_seen``; None: it never does)."""

    service_us: float
    capacity: float = 1.0
    throttle: str = "duty-cycle"
    queue_batches: int = 8
    queue_capacity_batches: int | None = None
    slot_s: float = 0.5
    signals: WorkerSignals | None = None
    aggregate_every_s: float = 1.0
    report_every_s: float | None = None
    report_jump: float | None = None

    @classmethod
    def from_topology(cls, topo: Topology, worker: int,
                      coordinator: Any = None) -> WorkerSettings:
        """Worker ``worker``'s; ``coordinator`` as in ``SourceSettings.from_topology``."""
        from runtime.grouping import SCHEMES
        from runtime.reporting.cores import Capacities

        wspec, run = topo.workers, topo.run
        return cls(
            service_us=wspec.service_us, capacity=Capacities(topo).initial[worker],
            throttle=wspec.throttle, queue_batches=wspec.queue_batches,
            # the most calls that can ever be queued: one per in-flight slot of every source
            queue_capacity_batches=min(wspec.queue_batches, topo.sources * run.max_inflight),
            slot_s=run.slot_s,
            signals=SCHEMES[topo.grouping.scheme].worker_signals(topo.grouping_params()),
            aggregate_every_s=topo.app.aggregate_every_s,
            report_every_s=coordinator.epoch_s if coordinator is not None else None,
            report_jump=coordinator.jump if coordinator is not None else None)


@dataclass(frozen=True)
class AggregatorSettings:
    """The aggregator's settings: the topology's ``app`` section and the
    directory a user's operator file is relative to (``base_dir``). The
    aggregator builds its operator from them in its own process
    (``operator``): a user's operator module is imported there."""

    app: Mapping[str, Any] = field(hash=False)
    base_dir: str = "."

    @classmethod
    def from_topology(cls, topo: Topology) -> AggregatorSettings:
        return cls(topo.app.model_dump(), str(topo.base_dir))

    def operator(self) -> BoundOperator:
        from runtime.operators import operator_for_app

        return operator_for_app(self.app, self.base_dir)


@dataclass(frozen=True)
class CoreSettings:
    """Every core's settings for one run: the sources' (one for all), each
    worker's (``workers[i]``: worker ``i``'s) and the aggregator's."""

    source: SourceSettings
    workers: tuple[WorkerSettings, ...]
    aggregator: AggregatorSettings

    @classmethod
    def from_topology(cls, topo: Topology, coordinator: Any = None) -> CoreSettings:
        return cls(SourceSettings.from_topology(topo, coordinator),
                   tuple(WorkerSettings.from_topology(topo, w, coordinator)
                         for w in range(topo.workers.total_count)),
                   AggregatorSettings.from_topology(topo))


def coordinator_for(topo: Topology, alive: Iterable[int] | None = None) -> Any:
    """The run-wide controller ``topo``'s scheme needs (coordinated schemes:
    ACG), or None; ``alive``: the workers routed to from the start (default
    all)."""
    from runtime.grouping import SCHEMES

    scheme = SCHEMES[topo.grouping.scheme]
    if not scheme.coordinated:
        return None
    n = topo.workers.total_count
    return scheme.coordinator(n, topo.grouping_params(),
                              alive=range(n) if alive is None else list(alive),
                              sources=topo.sources)
