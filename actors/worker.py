"""The worker actor (``worker-<i>``): the Ray edge of
``runtime.dataflow.worker.WorkerCore``.

``WorkerActor`` runs the core's processing loop in a thread and its commits in
another: each flush goes to the aggregator as ``commit.remote(flush)``, and the
answer (verdict, committed sequence, the controller's table) comes back to the
core. Calls from the sources are served concurrently (a threaded actor); each
blocks until its sub-batches are processed and returns the ack.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from typing import Any

import numpy as np

from runtime.dataflow.messages import (
    Ack,
    CommitAnswer,
    Verdict,
    WorkerFence,
    WorkerProgress,
    WorkerStats,
)
from runtime.dataflow.reliability import Flush, Part, peak_rss_mb, reset_peak_rss
from runtime.dataflow.settings import WorkerSettings
from runtime.dataflow.worker import WorkerCore
from runtime.reporting.metrics import DistinctKeys

# ============================================================================ Ray edge


class WorkerActor:
    """Ray edge around ``WorkerCore``: a threaded actor with one processing thread.

    ``process`` (many concurrent calls) enqueues and waits for the ack; flushes
    go to the aggregator's ``commit`` asynchronously, in sequence order; a
    committer thread waits for each result in order and tells the core what is
    committed (acks carry it). A flush refused as ``fenced`` means this worker
    was declared dead and its work replayed elsewhere: the process exits.
    """

    def __init__(self, worker_id: int, app: dict[str, Any], base_dir: str,
                 aggregator: Any, settings: WorkerSettings) -> None:
        """``app``: the topology's ``app`` section (the operator is built here;
        ``base_dir`` resolves a user's file)."""
        import ray

        self._ray = ray
        self._bind(worker_id, app, base_dir, aggregator, settings)

    def _bind(self, worker_id: int, app: dict[str, Any], base_dir: str,
              aggregator: Any, settings: WorkerSettings) -> None:
        """Everything a run needs, built anew (``__init__``, ``rebind``)."""
        from runtime.operators import WorkerApp, operator_for_app

        self._agg = aggregator
        #: why this worker cannot go on (its processing thread died, or the
        #: operator failed merging a flush); every call raises it from then on
        self._crash: BaseException | None = None
        self._commits: queue.Queue[tuple[int, Any] | None] = queue.Queue()
        self._inflight_commits = 0
        self._commit_lock = threading.Condition()
        self._stopped_clock: Any = None
        if settings.throttle == "duty-cycle":
            from actors.throttle import StoppedClock

            self._stopped_clock = StoppedClock()  # what the throttler says, exactly
        self.core = WorkerCore(worker_id, WorkerApp(operator_for_app(app, base_dir)), settings,
                               sink=self._sink, stopped_clock=self._stopped_clock)
        self._warm_up()
        self._telemetry: Any = None  # live metrics (actors.telemetry), from start_run
        self._thread = threading.Thread(target=self._loop, name=f"worker-{worker_id}", daemon=True)
        self._thread.start()
        self._committer = threading.Thread(target=self._commit_loop, daemon=True,
                                           name=f"worker-{worker_id}-commits")
        self._committer.start()

    def recycle(self) -> bool:
        """The run is over and this process waits for the next one
        (``actors.pool``): the threads stopped, the run's state dropped.
        ``False``: it cannot be reused (its peak RSS would carry this run's)."""
        self._stop_processing()
        self._commits.put(None)
        self._committer.join(timeout=30)
        if self._thread.is_alive() or self._committer.is_alive():
            return False
        if self._stopped_clock is not None:
            self._stopped_clock.close()
        del self.core, self._agg
        return reset_peak_rss()

    def rebind(self, worker_id: int, app: dict[str, Any], base_dir: str,
               aggregator: Any, settings: WorkerSettings) -> int:
        """A recycled worker becomes the next run's (``__init__``'s arguments); its pid."""
        self._bind(worker_id, app, base_dir, aggregator, settings)
        return os.getpid()

    def capture_output(self, path: str, name: str) -> bool:
        """The operator's prints go to the run's ``operators.log`` (``actors.operator_output``)."""
        from actors.operator_output import capture

        return capture(path, name)

    def _warm_up(self) -> None:
        """Pay the one-time costs of the flush path now, before the run's clock
        starts: the first compact of an operator's state (lazy imports: 0.17 s
        of CPU measured for the word count) and the first Ray serialization of
        a flush (0.07 s). Paid mid-run, they stalled the first flush - 2 s of
        wall time for a worker throttled to 0.1. A fresh state's flush is part
        of the operator contract (an idle worker flushes too) and leaves it fresh.
        Also the distinct-keys set's first call (loading its compiled kernel:
        up to 1 s on a busy machine; mid-run it was the p99 at 80% load)."""
        partial = self.core.app.flush()
        self._ray.put(Flush(self.core.worker_id, 0, partial, {}, {}, 0))
        DistinctKeys().add(np.ones(1, dtype=np.uint64))

    def _loop(self) -> None:
        try:
            self.core.run_forever()
        except BaseException:  # keep the actor answering; report in finish()
            self._crash = self.core.death()

    def _sink(self, flush: Flush) -> None:
        with self._commit_lock:
            self._inflight_commits += 1
        self._commits.put((flush.seq, self._agg.commit.remote(flush)))

    def _commit_loop(self) -> None:
        while True:
            job = self._commits.get()
            if job is None:
                return
            _, ref = job
            table, committed = None, 0
            try:
                answer: CommitAnswer = self._ray.get(ref)
                if answer.verdict is Verdict.FENCED:
                    os._exit(1)  # declared dead; sources replayed our uncommitted work
                table, committed = answer.table, answer.committed_seq
            except self._ray.exceptions.RayActorError:
                pass  # the aggregator is gone: nothing commits (the driver notices its
                # death and restarts the run)
            except Exception as e:  # noqa: BLE001 - the commit itself failed: this flush
                # is not committed and none after it can be, so the run cannot finish;
                # every call says so from now on (waiting would hang the run)
                from runtime.operators import find_operator_error

                self._crash = find_operator_error(e) or e  # the operator's merge, or a bug
                self.core.fail(self._crash)
            self.core.on_table(table)
            self.core.on_committed(committed)
            with self._commit_lock:
                self._inflight_commits -= 1
                self._commit_lock.notify_all()

    def _wait_commits(self, timeout: float = 60.0) -> None:
        with self._commit_lock:
            self._commit_lock.wait_for(lambda: self._inflight_commits == 0, timeout)

    def _raise_if_crashed(self) -> None:
        if self._crash is not None:
            raise self._crash

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return self._ray.get_runtime_context().get_node_id()

    def process(self, source: int, parts: list[Part]) -> Ack:
        self._raise_if_crashed()
        ack = self.core.submit(source, parts)
        if self._telemetry is not None:
            self._telemetry.batch_done(ack)
        return ack

    def set_capacity(self, capacity: float) -> None:
        self.core.set_capacity(capacity)

    def fence_source(self, source: int, epoch: int) -> WorkerFence:
        return self.core.fence_source(source, epoch)

    def commit_now(self, timeout: float = 30.0) -> int:
        """Flush what is open and wait for the aggregator; the committed sequence."""
        self._raise_if_crashed()
        return self.core.wait_committed(self.core.flush_now(), timeout)

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb()

    def start_run(self, t0: float, run_id: str | None = None) -> None:
        """``run_id``: the run's name in live metrics (the driver passes its namespace)."""
        if self._stopped_clock is not None:  # the throttler has published: read it now
            self._stopped_clock.rearm()
        self.core.start_run(t0)
        if self._telemetry is None:
            from actors import telemetry

            run, name = telemetry.actor_identity()
            self._telemetry = telemetry.WorkerTelemetry(
                self.core, run_id or run, name or f"worker-{self.core.worker_id}")
            self._telemetry.start()

    def progress(self) -> WorkerProgress:
        return self.core.progress()

    def _stop_processing(self) -> None:
        """The processing thread ends; live metrics get one last update."""
        self.core.stop()
        self._thread.join(timeout=30)
        if self._telemetry is not None:
            self._telemetry.stop()  # one last update with everything processed

    def finish(self) -> WorkerStats:
        self._stop_processing()
        self._raise_if_crashed()
        stats = self.core.finish()
        self._wait_commits()
        return dataclasses.replace(stats, committed_seq=self.core.claims.committed_seq,
                                   pid=os.getpid(), peak_rss_mb=peak_rss_mb())


def actor_class() -> Any:
    import ray

    return ray.remote(WorkerActor)
