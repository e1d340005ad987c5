"""The aggregator: merges the workers' periodic partials into the final table.

``AggregatorCore`` drives the app's operator on the aggregator's side
(``runtime.operators.AggregatorApp``: merge every committed partial, ``finish``
at the end), built from its ``AggregatorSettings`` (the topology's ``app``). Workers' flushes arrive through ``commit(flush)``: each is merged *and* recorded in the
``runtime.dataflow.reliability.CommitLedger`` in the same call - a flush is committed
atomically or not at all - in sequence order per worker (an early one waits
for the gap to fill), duplicates ignored, and nothing more from a worker once
``fence_worker`` declared it dead. ``merge(partial)`` (no bookkeeping) stays
for plain partials. A plain (single-threaded) Ray actor, so calls run one at a
time in arrival order (``actors.aggregator`` wraps this class with
``ray.remote``; the fault explorer, ``runtime.sim.explore``, calls it directly).

For a coordinated scheme (ACG) the aggregator also hosts the scheme's
controller (``coordinator``): a flush's ``report`` (the worker's service
rate) and the sources' ``report_routed`` (per-VW load) feed it, every
commit answer carries its current VW table back to the worker (which relays
it to the sources on acks), a fenced worker leaves it and ``worker_added``
joins one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from runtime.dataflow.messages import AggregatorStats, CommitAnswer, CommittedClaims, Verdict
from runtime.dataflow.reliability import CommitLedger, Flush, peak_rss_mb
from runtime.dataflow.settings import AggregatorSettings
from runtime.grouping.coordination import RoutedReport


class AggregatorCore:
    """``settings``: the app section its operator is built from, here
    (``AggregatorSettings.operator``)."""

    def __init__(self, settings: AggregatorSettings, coordinator: Any = None,
                 clock: Callable[[], float] = time.time, state: Any = None) -> None:
        """``coordinator``: a coordinated scheme's controller (else None);
        ``state``: a live stream's checkpointed state to start from (``snapshot``)."""
        from runtime.operators import AggregatorApp

        self.settings = settings
        self.coordinator = coordinator
        self.clock = clock
        self.app = AggregatorApp(settings.operator())
        if state is not None:
            self.app.restore(state)
        self.partials = 0
        self.ledger = CommitLedger()
        self._early: dict[int, dict[int, Flush]] = {}  # worker -> seq -> flush

    def merge(self, partial: Any) -> None:
        if isinstance(partial, Flush):
            self.commit(partial)
            return
        self.app.merge(partial)
        self.partials += 1

    def commit(self, flush: Flush) -> CommitAnswer:
        """Commit a worker's flush; the answer carries the verdict, the
        worker's committed sequence and the coordinator's current table."""
        admitted = self.ledger.admit(flush)
        if admitted == "gap":
            self._early.setdefault(flush.worker, {})[flush.seq] = flush
            verdict = Verdict.PENDING
        elif admitted == "commit":
            self._apply(flush)
            early = self._early.get(flush.worker, {})
            nxt = early.pop(flush.seq + 1, None)
            while nxt is not None:
                self._apply(nxt)
                nxt = early.pop(nxt.seq + 1, None)
            verdict = Verdict.COMMIT
        else:
            verdict = Verdict(admitted)
        table = None
        if self.coordinator is not None:  # after the flush is applied: a coordinator
            now = self.clock()  # that fails loses no committed data
            if flush.report is not None and admitted != "fenced":
                self.coordinator.report_from(flush.worker, flush.report, now)
            self.coordinator.tick(now)
            table = self.coordinator.table()
        return CommitAnswer(verdict, self.ledger.committed_seq.get(flush.worker, 0), table)

    def _apply(self, flush: Flush) -> None:
        self.app.merge(flush.partial, flush.worker)
        self.partials += 1
        self.ledger.record(flush)

    def fence_worker(self, worker: int) -> int:
        """Declare ``worker`` dead; its final committed flush sequence."""
        self._early.pop(int(worker), None)
        if self.coordinator is not None:
            self.coordinator.remove_worker(worker)
        return self.ledger.fence_worker(worker)

    def report_routed(self, source: int, report: RoutedReport) -> Any:
        """A source's per-VW routed counts (coordinated schemes), once per epoch;
        the answer is the coordinator's current table (a plan may be due)."""
        if self.coordinator is None:
            return None
        self.coordinator.routed_from(source, report)
        self.coordinator.tick(self.clock())
        return self.coordinator.table()

    def worker_added(self, worker: int) -> None:
        """``worker`` joined the run (elasticity): the coordinator gives it VWs."""
        if self.coordinator is not None:
            self.coordinator.add_worker(worker)

    def start_run(self, t0: float) -> None:
        """The run's clock starts (the coordinator's first plan is due soon after)."""
        if self.coordinator is not None:
            self.coordinator.start(t0)

    def fence_for_source(self, worker: int, source: int) -> tuple[int, list[Any]]:
        """Declare ``worker`` dead; its final committed flush and the ``(batch,
        idx)`` of ``source`` its committed flushes hold."""
        seq = self.fence_worker(worker)
        return seq, self.ledger.worker_claims(worker, source)

    def committed_claims(self, source: int) -> CommittedClaims:
        return self.ledger.claims_of(source)

    def committed_seq(self, worker: int) -> int:
        return self.ledger.committed_seq.get(int(worker), 0)

    def committed_seqs(self) -> dict[int, int]:
        """Every worker's latest committed flush (a blocked source's replay log
        releases with it)."""
        return {int(w): int(s) for w, s in self.ledger.committed_seq.items()}

    def result(self) -> pa.Table:
        return self.app.result()

    def emit_windows(self, watermark: int) -> pa.Table:
        """A windowed live stream at a checkpoint's cut: the windows its
        watermark passed (``AggregatorApp.emit_windows``)."""
        return self.app.emit_windows(watermark)

    def close_windows(self, watermark: int) -> None:
        self.app.close_windows(watermark)

    def snapshot(self) -> Any:
        """The committed state (a live stream's checkpoint); taken between two
        calls, so no flush is half in it."""
        return self.app.state()

    def stats(self) -> AggregatorStats:
        return AggregatorStats(
            partials=self.partials, **self.ledger.stats(),
            early_flushes=sum(len(v) for v in self._early.values()),
            peak_rss_mb=peak_rss_mb(),
            coordinator=self.coordinator.summary() if self.coordinator is not None else None,
            windows=self.app.window_stats())
