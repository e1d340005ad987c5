"""The source actor (``source-<i>``): the Ray edge of
``runtime.dataflow.source.SourceCore``.

``SourceActor`` is a threaded actor so that ``progress()`` answers while
``run()`` is streaming. It reads its shard (a Ray Dataset, or a
``FedShard`` arriving chunk by chunk) in order, in batches of ``run.batch``
rows, or a live stream's micro-batches from its ``StreamInbox``; ``RayTransport``
sends sub-batches as ``worker.process.remote`` calls and ``RayControl`` reaches
the aggregator and the workers.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from runtime.dataflow.messages import SourceProgress, SourceStats, WorkerFence
from runtime.dataflow.recovery import plan_resume
from runtime.dataflow.reliability import (
    Part,
    ResumePlan,
    WorkerLost,
    peak_rss_mb,
    reset_peak_rss,
)
from runtime.dataflow.settings import SourceSettings
from runtime.dataflow.source import (
    STREAM_POLL_S,
    Cut,
    SourceCore,
    StreamInbox,
    rebatch,
)
from runtime.grouping.coordination import RoutedReport
from runtime.hashing import hash_arrow

# ============================================================================ Ray edge


class RayTransport:
    """Sub-batches as ``worker.process.remote`` calls; acks through ``ray.wait``.
    A call that fails because its worker actor died yields a ``WorkerLost``."""

    def __init__(self, source: int, workers: Sequence[Any]) -> None:
        import ray

        self._ray = ray
        self.source = source
        self.workers = list(workers)
        self._worker_of: dict[Any, int] = {}

    def send(self, worker: int, parts: list[Part]) -> Any:
        ref = self.workers[worker].process.remote(self.source, parts)
        self._worker_of[ref] = worker
        return ref

    def wait(self, tokens: Sequence[Any], timeout: float | None) -> list[tuple[Any, Any]]:
        ready, _ = self._ray.wait(list(tokens), num_returns=1, timeout=timeout)
        if ready:  # take every ack already available, not just the first
            more, _ = self._ray.wait(list(tokens), num_returns=len(tokens), timeout=0)
            ready = list({r: None for r in [*ready, *more]})
        try:
            acks: list[Any] = self._ray.get(ready)
        except self._ray.exceptions.RayActorError:
            acks = [self._get_one(r) for r in ready]
        for r in ready:
            self._worker_of.pop(r, None)
        return list(zip(ready, acks, strict=True))

    def _get_one(self, ref: Any) -> Any:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayActorError as e:
            return WorkerLost(self._worker_of.get(ref, -1), type(e).__name__)


class RayControl:
    """``Control`` over Ray: the aggregator's fence, the workers' ``commit_now``."""

    def __init__(self, aggregator: Any, workers: Sequence[Any]) -> None:
        import ray

        self._ray = ray
        self.aggregator = aggregator
        self.workers = list(workers)
        self._table_ref: Any = None

    def fence_worker(self, worker: int, source: int) -> tuple[int, list[Any]]:
        seq, held = self._ray.get(self.aggregator.fence_for_source.remote(worker, source))
        return int(seq), list(held)

    def commit(self, workers: Sequence[int]) -> dict[int, Any]:
        refs = {w: self.workers[w].commit_now.remote() for w in workers}
        out: dict[int, Any] = {}
        for w, ref in refs.items():
            try:
                out[w] = int(self._ray.get(ref))
            except self._ray.exceptions.RayActorError as e:
                out[w] = WorkerLost(w, type(e).__name__)
        return out

    def report_routed(self, source: int, report: RoutedReport) -> None:
        self._table_ref = self.aggregator.report_routed.remote(source, report)

    def committed(self) -> dict[int, int]:
        try:
            return dict(self._ray.get(self.aggregator.committed_seqs.remote()))
        except self._ray.exceptions.RayError:  # the aggregator is gone: nothing learnt
            return {}

    def poll_table(self, timeout: float | None = 0.0) -> Any:
        ref = self._table_ref
        if ref is None or not self._ray.wait([ref], timeout=timeout)[0]:
            return None
        self._table_ref = None
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayError:  # the aggregator is gone: the acks still carry tables
            return None

    def fence_source(self, source: int, epoch: int, live: Iterable[int]) -> ResumePlan:
        """Fence ``source``'s older incarnations on every live worker and plan
        the resume (``runtime.dataflow.recovery.plan_resume``)."""
        ray = self._ray
        refs = {w: self.workers[w].fence_source.remote(source, epoch) for w in live}

        def fence_on(w: int) -> WorkerFence | None:
            try:
                return ray.get(refs[w])
            except ray.exceptions.RayActorError:
                return None  # died meanwhile: fenced at the aggregator instead

        return plan_resume(refs, fence_on,
                           lambda w: ray.get(self.aggregator.fence_worker.remote(w)),
                           lambda: ray.get(self.aggregator.committed_claims.remote(source)))


class SourceActor:
    """Ray edge around ``SourceCore`` (threaded: ``progress`` answers during ``run``).

    ``epoch`` > 0: a restart of a dead source; ``run`` first fences the dead
    incarnation on the workers and resumes from its committed position.
    """

    def __init__(self, index: int, shard: Any, workers: Sequence[Any],
                 settings: SourceSettings, *, aggregator: Any = None, epoch: int = 0,
                 dead_workers: Sequence[int] = ()) -> None:
        """``shard``: the source's Ray Dataset, or its ``actors.shard_feed.FedShard``
        when the input arrives chunk by chunk; ``None`` for a live stream, whose
        micro-batches the driver hands over with ``feed``."""
        self._lock = threading.Lock()
        self._bind(index, shard, workers, settings, aggregator=aggregator, epoch=epoch,
                   dead_workers=dead_workers)

    def _bind(self, index: int, shard: Any, workers: Sequence[Any],
              settings: SourceSettings, *, aggregator: Any, epoch: int,
              dead_workers: Sequence[int]) -> None:
        """Everything a run needs, built anew (``__init__``, ``rebind``)."""
        self.shard = shard
        self.inbox = StreamInbox(settings.max_pending_rows) if shard is None else None
        self._cut: Cut | None = None
        self.batch = int(settings.batch)
        self.columns = list(settings.columns)  # what the app needs besides the key
        self.control = RayControl(aggregator, workers) if aggregator is not None else None
        self._prepared: Iterator[pa.Table] | None = None
        # the wall clock: tables' adoption times compare with the controller's
        self.core = SourceCore(index, settings.grouping(index, clock=time.time),
                               RayTransport(index, workers), settings, control=self.control,
                               epoch=epoch, dead_workers=dead_workers)

    def recycle(self) -> bool:
        """The run is over (``actors.pool``): its state dropped; ``False`` if
        this process cannot be reused (a run still going)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            del self.core, self.control, self.shard, self.inbox, self._prepared, self._cut
        finally:
            self._lock.release()
        return reset_peak_rss()

    def rebind(self, index: int, shard: Any, workers: Sequence[Any],
               settings: SourceSettings, *, aggregator: Any = None, epoch: int = 0,
               dead_workers: Sequence[int] = ()) -> int:
        """A recycled source becomes the next run's (``__init__``'s arguments); its pid."""
        with self._lock:
            self._bind(index, shard, workers, settings, aggregator=aggregator, epoch=epoch,
                       dead_workers=dead_workers)
        return os.getpid()

    def feed(self, table: pa.Table, handed_ts: float) -> int:
        """A live stream's rows for this source (blocks while the inbox is
        full); the rows now waiting."""
        assert self.inbox is not None, "feed: this source reads a shard, not a stream"
        self.inbox.put(table.select([self.core.key, *self.columns]), handed_ts)
        return self.inbox.rows

    def cut(self) -> None:
        """A checkpoint's cut after what was fed so far (returns at once)."""
        assert self.inbox is not None, "cut: this source reads a shard, not a stream"
        self._cut = Cut()
        self.inbox.put(self._cut)

    def reached_cut(self, timeout: float | None = None) -> bool:
        """Return once everything fed before the cut is committed (``False`` on
        ``timeout``); the source then waits for ``pass_cut``."""
        return self._cut is not None and self._cut.reached.wait(timeout)

    def pass_cut(self) -> None:
        """The checkpoint is saved: route what came after the cut."""
        if self._cut is not None:
            self._cut.go.set()

    def end_stream(self) -> None:
        """No more micro-batches: ``run`` returns once what came is committed."""
        if self.inbox is not None:
            self.inbox.close()

    def _stream_batches(self, inbox: StreamInbox) -> Iterator[tuple[pa.Table, float]]:
        """The inbox's tables in batches of ``batch`` rows; between them the
        core keeps taking acks and sending (``SourceCore.idle``)."""
        while True:
            got = inbox.get(timeout=0)
            if got is False:
                self.core.idle(STREAM_POLL_S)
                continue
            if got is None:
                return
            table, handed = got  # type: ignore[misc]
            if isinstance(table, Cut):
                self.core.drain()  # all before it committed
                self.core.acks_done_ts = None  # the stream has not ended
                table.reached.set()
                # no time-out: a source that went on would route rows from after
                # the cut into a state saved as holding only what came before it
                # (the driver always lets it go; a dead driver takes it along)
                table.go.wait()
                continue
            for off in range(0, table.num_rows, self.batch):
                yield table.slice(off, self.batch), handed

    def _batches(self) -> Iterator[pa.Table]:
        """The shard in order, in batches of ``batch`` rows: the same boundaries
        on every pass, which a restarted source relies on (batch numbers)."""
        import ray

        from actors.shard_feed import FedShard

        cols = [self.core.key, *self.columns]
        tables: Iterable[Any]
        if isinstance(self.shard, FedShard):  # arriving chunk by chunk
            tables = self.shard.tables(self._wait_for_input)
        else:
            ray.data.DataContext.get_current().execution_options.preserve_order = True
            # whole blocks, cut here: Ray Data's own re-batching costs ~0.4 ms per
            # batch of 1,000 rows, slicing a block ~0.05 ms (the same boundaries)
            tables = self.shard.iter_batches(batch_size=None, batch_format="pyarrow")
        blocks = ((b if isinstance(b, pa.Table) else pa.table(b)).select(cols) for b in tables)
        yield from rebatch(blocks, self.batch)

    def _wait_for_input(self, timeout: float) -> None:
        """The next chunk is not in yet: take acks and send meanwhile (before
        the run, as ``prepare`` reads the first batch, just wait)."""
        if self.core.t0 is None:
            time.sleep(timeout)
        else:
            self.core.idle(timeout)

    def prepare(self) -> None:
        """Start reading the shard before the run's clock starts: Ray Data's
        iterator takes ~1 s to deliver its first batch, which is loading, not
        streaming; and load the compiled routing kernels (an empty batch)."""
        self.core.grouping.route(np.zeros(0, dtype=np.uint64))
        hash_arrow(pa.array([], type=pa.string()))
        if self.inbox is not None:
            return
        it = self._batches()
        first = next(it, None)
        self._prepared = it if first is None else itertools.chain([first], it)

    def run(self, t0: float, run_id: str | None = None) -> SourceStats:
        """``run_id``: the run's name in live metrics (the driver passes its namespace)."""
        with self._lock:
            self.core.t0 = t0
            plan = None
            started = time.time()
            if self.core.epoch > 0 and self.control is not None:
                plan = self.control.fence_source(self.core.index, self.core.epoch,
                                                 sorted(self.core.members.live))
            self.resumed_ts = time.time()
            batches: Iterable[Any]
            if self.inbox is not None:
                batches = self._stream_batches(self.inbox)
            else:
                batches, self._prepared = self._prepared or self._batches(), None
            with _LiveMetrics(self.core, run_id):
                stats = self.core.run(batches, plan)
            return dataclasses.replace(stats, started_ts=started, resumed_ts=self.resumed_ts,
                                       peak_rss_mb=peak_rss_mb())

    def progress(self) -> SourceProgress:
        return self.core.progress()

    def worker_failed(self, worker: int) -> None:
        self.core.notify_worker_failed(worker)

    def worker_added(self, worker: int) -> None:
        self.core.notify_worker_added(worker)

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb()


def actor_class() -> Any:
    import ray

    return ray.remote(SourceActor)


class _LiveMetrics:
    """Source metrics (``actors.telemetry``) updated by a thread while ``core`` runs."""

    def __init__(self, core: SourceCore, run_id: str | None) -> None:
        from actors import telemetry

        run, name = telemetry.actor_identity()
        self.telemetry = telemetry.SourceTelemetry(core, run_id or run,
                                                   name or f"source-{core.index}")

    def __enter__(self) -> None:
        self.telemetry.start()

    def __exit__(self, *exc: object) -> None:
        self.telemetry.stop()  # one last update: the final counts
