"""The source actor: hash, route with its own grouping, send with backpressure.

``SourceCore`` is the plain class (no Ray). For every micro-batch of its shard
(``run.batch`` messages) it hashes the keys (``runtime.hashing``), routes them
with its *own* grouping instance (seed ``run.seed + index``), splits the batch
into per-worker sub-batches, queues each in its worker's outbox and sends
through a ``Transport`` while the worker has fewer than ``run.max_inflight``
unacknowledged sub-batches. A stopped or slow worker blocks its source only
once its outbox holds more than ``outbox`` (default ``max_inflight``)
sub-batches - bounded memory, never a growing pile - and until then the other
workers keep being fed instead of idling behind it (head-of-line blocking:
a worker stopped by the duty-cycle throttler for 70 ms would otherwise stall
every worker of that source).
Every ack goes to ``grouping.on_ack(worker, signal, acked)`` as soon as it is
seen: CG moves virtual workers on piggybacked signals, FISH learns service
times from ack timings through the grouping's clock. The source never reads
the configured capacities.

``run.rate`` (messages/s over all sources) is honoured by pacing each source at
``rate / sources`` on its own clock. A message's latency starts when its
batch was due: its scheduled time when paced (a source that falls behind or
is blocked by backpressure does not hide that time: no coordinated
omission), or when the source took it from its shard at ``rate = 0``.

``SourceActor`` at the bottom is the Ray edge (``source-<i>``): a threaded
actor so that ``progress()`` answers while ``run()`` is streaming.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from runtime.hashing import hash_keys

Clock = Callable[[], float]


class Transport(Protocol):
    """How a source talks to workers (Ray object refs, or direct calls in tests)."""

    def send(self, worker: int, keys: pa.Array, labels: np.ndarray | None,
             emit_ts: float) -> Any:
        """Start processing a sub-batch; returns a token for ``wait``."""

    def wait(self, tokens: Sequence[Any], timeout: float | None) -> list[tuple[Any, dict]]:
        """Some finished tokens with their acks (at least one unless ``timeout`` expires)."""


def keys_of(table: pa.Table, key: str) -> pa.Array:
    col = table.column(key)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def hash_arrow_keys(keys: pa.Array) -> np.ndarray:
    if pa.types.is_integer(keys.type) and keys.null_count == 0:
        return hash_keys(keys.to_numpy())
    return hash_keys(keys.to_numpy(zero_copy_only=False))


class SourceCore:
    """One source's routing loop; see the module docstring."""

    def __init__(
        self,
        index: int,
        grouping: Any,
        transport: Transport,
        *,
        n_workers: int,
        max_inflight: int = 2,
        outbox: int | None = None,
        rate_per_source: float = 0.0,
        key: str = "key",
        label: str | None = None,
        vw_every_s: float = 0.5,
        clock: Clock = time.time,
        sleep: Callable[[float], None] = time.sleep,
        t0: float | None = None,
    ) -> None:
        self.index = int(index)
        self.grouping = grouping
        self.transport = transport
        self.n_workers = int(n_workers)
        self.max_inflight = int(max_inflight)
        self.outbox_max = self.max_inflight if outbox is None else int(outbox)
        # per worker: routed sub-batches waiting for a free in-flight slot (FIFO)
        self._outbox: list[collections.deque] = [collections.deque()
                                                 for _ in range(self.n_workers)]
        self.rate = float(rate_per_source)
        self.key = key
        self.label = label
        self.clock = clock
        self.sleep = sleep
        self.t0 = t0
        self.routed = 0  # messages sent to workers
        self.acked = 0
        self.batches = 0
        self.sent_per_worker = np.zeros(self.n_workers, dtype=np.int64)
        self.acked_per_worker = np.zeros(self.n_workers, dtype=np.int64)
        self.lat_sum_s = 0.0
        self._inflight: dict[Any, int] = {}  # token -> worker
        self._inflight_per_worker = np.zeros(self.n_workers, dtype=np.int64)
        self.vw_every_s = float(vw_every_s)
        self.vw_history: list[tuple[float, list[int]]] = []
        self._next_vw = -np.inf
        self.route_s = 0.0
        self.wait_s = 0.0
        self.done = False

    # ------------------------------------------------------------------ acks
    def _handle(self, done: list[tuple[Any, dict]]) -> None:
        for token, ack in done:
            w = self._inflight.pop(token)
            self._inflight_per_worker[w] -= 1
            n = int(ack["acked"])
            self.acked += n
            self.acked_per_worker[w] += n
            self.lat_sum_s += float(ack.get("lat_sum_s", 0.0))
            self.grouping.on_ack(int(ack["worker"]), int(ack.get("signal", 0)), n)
        self._record_vw()

    def _wait_some(self, timeout: float | None = None) -> None:
        if not self._inflight:
            return
        t = self.clock()
        self._handle(self.transport.wait(list(self._inflight), timeout))
        self.wait_s += self.clock() - t

    def _record_vw(self, force: bool = False) -> None:
        per = getattr(self.grouping, "vw_per_worker", None)
        if per is None or self.t0 is None:
            return
        now = self.clock()
        if force or now >= self._next_vw:
            self._next_vw = now + self.vw_every_s
            self.vw_history.append((now - self.t0, [int(x) for x in per()]))

    # ------------------------------------------------------------------ main loop
    def send_batch(self, table: pa.Table, emit_ts: float | None = None) -> None:
        """Route one micro-batch, queue its per-worker sub-batches in the
        workers' outboxes and send what the in-flight windows allow.

        ``emit_ts``: when the batch was due (its messages' latency starts
        there); default now. Time spent in an outbox is latency.
        """
        t = self.clock()
        emit = t if emit_ts is None else emit_ts
        keys = keys_of(table, self.key)
        n = len(keys)
        if n == 0:
            return
        labels = None
        if self.label is not None:
            labels = np.asarray(table.column(self.label).to_numpy(), dtype=np.int64)
        dest = np.asarray(self.grouping.route(hash_arrow_keys(keys)), dtype=np.int64)
        order = np.argsort(dest, kind="stable")
        counts = np.bincount(dest, minlength=self.n_workers)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        self.route_s += self.clock() - t
        for w in np.flatnonzero(counts):
            idx = order[bounds[w]:bounds[w + 1]]
            self._outbox[w].append((keys.take(pa.array(idx)),
                                    labels[idx] if labels is not None else None, emit))
            self.sent_per_worker[w] += len(idx)
        self.routed += n
        self.batches += 1
        self._flush()
        # backpressure: a worker whose outbox is over its bound blocks this source
        # (memory per worker <= max_inflight + outbox sub-batches); the others
        # keep being fed meanwhile instead of idling behind it
        while any(len(q) > self.outbox_max for q in self._outbox):
            self._wait_some()
            self._flush()
        # opportunistic: take acks that are already there, without blocking
        self._wait_some(timeout=0)
        self._flush()

    def _flush(self) -> None:
        """Send queued sub-batches, oldest first, while the windows allow."""
        for w, q in enumerate(self._outbox):
            while q and self._inflight_per_worker[w] < self.max_inflight:
                sub_keys, sub_labels, emit = q.popleft()
                token = self.transport.send(w, sub_keys, sub_labels, emit)
                self._inflight[token] = w
                self._inflight_per_worker[w] += 1

    def run(self, batches: Iterable[pa.Table]) -> dict[str, Any]:
        start = self.clock()
        if self.t0 is None:
            self.t0 = start
        self._record_vw(force=True)
        for table in batches:
            # paced: the batch was due at its scheduled time, even if we are late
            self.send_batch(table, start + self.routed / self.rate if self.rate > 0 else None)
            if self.rate > 0:
                ahead = start + self.routed / self.rate - self.clock()
                if ahead > 0:
                    self.sleep(ahead)
        while self._inflight or any(self._outbox):
            self._wait_some()
            self._flush()
        self._record_vw(force=True)
        self.done = True
        return self.stats(start)

    def progress(self) -> dict[str, Any]:
        return {"source": self.index, "routed": self.routed, "acked": self.acked,
                "done": self.done}

    def stats(self, start: float | None = None) -> dict[str, Any]:
        g = self.grouping.stats()
        return {
            "source": self.index,
            "routed": self.routed,
            "acked": self.acked,
            "batches": self.batches,
            "sent_per_worker": self.sent_per_worker.tolist(),
            "grouping": g,
            "migrations": int(g.get("migrations", 0)),
            "signals": dict(g.get("signals", {"increase": 0, "decrease": 0})),
            "route_s": self.route_s,
            "wait_s": self.wait_s,
            "elapsed_s": (self.clock() - start) if start is not None else None,
            "end_ts": self.clock(),
            "vw_history": self.vw_history,
        }


# ============================================================================ Ray edge


class RayTransport:
    """Sub-batches as ``worker.process.remote`` calls; acks through ``ray.wait``."""

    def __init__(self, source: int, workers: Sequence[Any]) -> None:
        import ray

        self._ray = ray
        self.source = source
        self.workers = list(workers)

    def send(self, worker: int, keys: pa.Array, labels: np.ndarray | None,
             emit_ts: float) -> Any:
        return self.workers[worker].process.remote(self.source, keys, labels, emit_ts)

    def wait(self, tokens: Sequence[Any], timeout: float | None) -> list[tuple[Any, dict]]:
        ready, _ = self._ray.wait(list(tokens), num_returns=1, timeout=timeout)
        if ready:  # take every ack already available, not just the first
            more, _ = self._ray.wait(list(tokens), num_returns=len(tokens), timeout=0)
            ready = list({r: None for r in [*ready, *more]})
        acks = self._ray.get(ready)
        return list(zip(ready, acks, strict=True))


class SourceActor:
    """Ray edge around ``SourceCore`` (threaded: ``progress`` answers during ``run``)."""

    def __init__(self, index: int, shard: Any, workers: Sequence[Any], scheme: str,
                 n_workers: int, seed: int, grouping_params: dict[str, Any], *,
                 batch: int, max_inflight: int, rate_per_source: float, key: str,
                 label: str | None, vw_every_s: float = 0.5) -> None:
        from runtime.grouping import make_grouping

        self.shard = shard
        self.batch = int(batch)
        grouping = make_grouping(scheme, n_workers, seed=seed, clock=time.monotonic,
                                 **grouping_params)
        self.core = SourceCore(index, grouping, RayTransport(index, workers),
                               n_workers=n_workers, max_inflight=max_inflight,
                               rate_per_source=rate_per_source, key=key, label=label,
                               vw_every_s=vw_every_s)
        self._lock = threading.Lock()

    def _batches(self) -> Iterable[pa.Table]:
        cols = [self.core.key] + ([self.core.label] if self.core.label else [])
        for b in self.shard.iter_batches(batch_size=self.batch, batch_format="pyarrow"):
            yield b.select(cols) if isinstance(b, pa.Table) else pa.table(b).select(cols)

    def run(self, t0: float, run_id: str | None = None) -> dict[str, Any]:
        """``run_id``: the run's name in live metrics (the driver passes its namespace)."""
        with self._lock:
            self.core.t0 = t0
            with _LiveMetrics(self.core, run_id):
                return self.core.run(self._batches())

    def progress(self) -> dict[str, Any]:
        return self.core.progress()


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
