"""How the runtime drives an operator: a worker's side and the aggregator's.

Both engines use these (the Ray actors and the simulator), so an operator's
result is computed the same way everywhere:

- ``WorkerApp``: ``add(records, key_hashes)`` per sub-batch; ``flush()`` ->
  the partial sent to the aggregator (``compact(state)``), and a fresh state.
  A non-mergeable operator is never reset: every flush sends a snapshot of
  the worker's whole state (its keys stay on that worker, docs/design.md).
- ``AggregatorApp``: ``merge(partial, worker)`` for every committed flush;
  ``result()`` -> ``finish`` of everything merged. For a non-mergeable
  operator only each worker's latest snapshot counts, and snapshots over
  disjoint key sets are merged once, at the end.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pyarrow as pa

from runtime.operators.contract import BoundOperator


class WorkerApp:
    """A worker's side of an operator (see the module docstring)."""

    def __init__(self, op: BoundOperator) -> None:
        self.op = op
        self.snapshots = not op.spec.mergeable
        self.wants_hash = op.spec.wants_key_hash
        self.state = op.create()

    def add(self, records: pa.RecordBatch, key_hashes: np.ndarray) -> None:
        if self.wants_hash:
            records = records.append_column("key_hash", pa.array(key_hashes, pa.uint64()))
        self.state = self.op.add(self.state, records)

    def flush(self) -> Any:
        """The partial for the aggregator (a mergeable operator starts afresh)."""
        self.state = self.op.compact(self.state)
        if self.snapshots:  # keep the state; the aggregator gets a copy of it
            return pickle.loads(pickle.dumps(self.state, pickle.HIGHEST_PROTOCOL))
        partial, self.state = self.state, self.op.create()
        return partial


class AggregatorApp:
    """The aggregator's side of an operator (see the module docstring)."""

    def __init__(self, op: BoundOperator) -> None:
        self.op = op
        self.snapshots = not op.spec.mergeable
        self.total = op.create()
        self._latest: dict[int, Any] = {}  # non-mergeable: worker -> its last snapshot
        self.partials = 0

    def merge(self, partial: Any, worker: int = 0) -> None:
        self.partials += 1
        if self.snapshots:
            self._latest[int(worker)] = partial
        else:
            self.total = self.op.merge(self.total, partial)

    def state(self) -> Any:
        """Everything merged so far (a live stream's checkpoint). Only a mergeable
        operator has one: a non-mergeable one's per-worker snapshots do not
        survive new workers."""
        if self.snapshots:
            raise ValueError(f"{self.op.spec.name}: a non-mergeable operator (mergeable = "
                             f"False) cannot be checkpointed")
        return self.total

    def restore(self, state: Any) -> None:
        """Start from a checkpoint's ``state`` (before any merge)."""
        if self.snapshots:
            raise ValueError(f"{self.op.spec.name}: a non-mergeable operator (mergeable = "
                             f"False) cannot resume from a checkpoint")
        self.total = state

    def window_stats(self) -> dict[str, Any] | None:
        """A windowed app's windows (``Windowed.describe``): open now and at
        most, records without an event time; ``None`` without ``app.window``."""
        from runtime.operators.windows import windowed_of

        win = windowed_of(self.op)
        if win is None:
            return None
        if not self.snapshots:
            return win.describe(self.total)
        stats = [win.describe(self._latest[w]) for w in sorted(self._latest)]
        return {"open": sum(s["open"] for s in stats),
                "peak_open": sum(s["peak_open"] for s in stats),
                "no_event_time": sum(s["no_event_time"] for s in stats), "closed_before": None}

    def emit_windows(self, watermark: int) -> pa.Table:
        """A live stream: take out every window that ends at or before
        ``watermark`` (ticks); their result rows."""
        from runtime.operators.windows import windowed_of

        win = windowed_of(self.op)
        assert win is not None and not self.snapshots
        return win.emit(self.total, watermark)

    def close_windows(self, watermark: int) -> None:
        """A resumed live stream: windows ending at or before ``watermark`` were
        emitted already."""
        from runtime.operators.windows import windowed_of

        win = windowed_of(self.op)
        assert win is not None and not self.snapshots
        win.close(self.total, watermark)

    def result(self) -> pa.Table:
        total = self.total
        if self.snapshots:  # each key on one worker: the snapshots' key sets are disjoint
            total = self.op.create()
            for worker in sorted(self._latest):
                total = self.op.merge(total, self._latest[worker])
        return self.op.finish(total)
