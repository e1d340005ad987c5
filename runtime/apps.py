"""The applications run by the workers, with periodic aggregation.

Three applications (``app.kind``), each split the same way:

- a *worker state* (one per worker actor) that ``process``-es micro-batches of
  keys (and labels), vectorized with Arrow, and every ``app.aggregate_every_s``
  ``flush``-es the *delta since its last flush* as a small picklable partial;
- an *aggregator* (one per run) that ``merge``-s partials from every worker in
  any order and gives the final ``result()`` table (``result.parquet``).

Why deltas: a key may be split across workers (PKG, D-Choices, CG, FISH, SG),
so each worker only holds part of a key's count. Counts are sums, so summing
deltas from any workers, flushed at any points, gives exactly the
single-worker answer (tested with hypothesis). Heavy hitters are approximate:
there the partials are weighted SpaceSaving summaries, and merging them keeps
the sketch's one-sided guarantees (see ``HeavyHittersAggregator``).

Keys are Arrow strings (``string`` or ``large_string``); a null key is a key
like any other, so all nulls form one group, as in Spark's ``groupBy``.
Results are sorted with ``sort_result`` (by key, byte order, nulls last), which
``actors.spark_input.reference_result`` uses too, so tables compare with ``==``.

Pure: numpy/pyarrow/numba only, no Ray, no Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.hashing import hash_keys

if TYPE_CHECKING:
    from runtime.sketches import SpaceSaving

KINDS = ("wordcount", "naive-bayes", "heavy-hitters")

WORDCOUNT_SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64())])
NAIVE_BAYES_SCHEMA = pa.schema(
    [("key", pa.string()), ("label", pa.int64()), ("count", pa.int64())]
)
HEAVY_HITTERS_SCHEMA = pa.schema(
    [("key", pa.string()), ("count", pa.int64()), ("error", pa.int64())]
)

#: compact buffered count tables once they hold this many rows (bounds memory
#: when flush is rare); compaction never changes the answer
_COMPACT_ROWS = 262_144


class WorkerState(Protocol):
    def process(self, keys: pa.Array | pa.ChunkedArray, labels: np.ndarray | None = None) -> None: ...
    def flush(self) -> Any: ...
    def distinct_keys(self) -> int: ...


class Aggregator(Protocol):
    def merge(self, partial: Any) -> None: ...
    def result(self) -> pa.Table: ...


# --------------------------------------------------------------------------- helpers


def as_string_array(keys: Any) -> pa.Array:
    """Keys as one Arrow ``string`` array (accepts Arrow arrays, chunked arrays,
    numpy/object arrays and lists of str|None)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    elif not isinstance(keys, pa.Array):
        keys = pa.array(keys, type=pa.string())
    if keys.type != pa.string():
        if not (pa.types.is_large_string(keys.type) or pa.types.is_string_view(keys.type)
                or pa.types.is_null(keys.type)):
            raise TypeError(f"keys must be strings (got Arrow type {keys.type})")
        keys = keys.cast(pa.string())
    return keys


def sort_result(table: pa.Table, kind: str) -> pa.Table:
    """The canonical order of a result table.

    wordcount: by key; naive-bayes: by key, label; heavy-hitters: by count
    descending, then key. Keys compare in UTF-8 byte order, nulls last.
    """
    if kind == "heavy-hitters":
        order = [("count", "descending", "at_end"), ("key", "ascending", "at_end")]
    elif kind == "naive-bayes":
        order = [("key", "ascending", "at_end"), ("label", "ascending", "at_end")]
    else:
        order = [("key", "ascending", "at_end")]
    idx = pc.sort_indices(table, sort_keys=order)
    return table.take(idx).combine_chunks()


def _sum_counts(tables: list[pa.Table], by: list[str], schema: pa.Schema) -> pa.Table:
    """Group the count tables by ``by`` and sum ``count`` (exact, int64)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return schema.empty_table()
    if len(tables) == 1:
        return tables[0]
    t = pa.concat_tables(tables).group_by(by, use_threads=False).aggregate([("count", "sum")])
    return t.rename_columns([*by, "count"]).select(schema.names).cast(schema)


class _DistinctKeys:
    """The distinct keys a worker has ever held (nulls count as one key)."""

    def __init__(self) -> None:
        self._seen = pa.array([], type=pa.string())

    def add(self, keys: pa.Array) -> None:
        if len(keys):
            self._seen = pc.unique(pa.concat_arrays([self._seen, keys]))

    def __len__(self) -> int:
        return len(self._seen)


# --------------------------------------------------------------------------- wordcount


class CountState:
    """Exact counts per key (wordcount) or per (key, label) (naive-bayes).

    ``process`` costs one Arrow ``value_counts`` / ``group_by`` per batch;
    ``flush`` returns the delta as a table with the app's schema and resets it.
    """

    def __init__(self, with_labels: bool) -> None:
        self.with_labels = with_labels
        self.schema = NAIVE_BAYES_SCHEMA if with_labels else WORDCOUNT_SCHEMA
        self.by = ["key", "label"] if with_labels else ["key"]
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._keys = _DistinctKeys()
        self.processed = 0

    def process(self, keys: pa.Array | pa.ChunkedArray, labels: np.ndarray | None = None) -> None:
        keys = as_string_array(keys)
        if self.with_labels:
            if labels is None:
                raise ValueError("naive-bayes: process() needs labels")
            lab = np.asarray(labels, dtype=np.int64)
            if len(lab) != len(keys):
                raise ValueError(f"labels has length {len(lab)}, keys {len(keys)}")
            t = pa.table({"key": keys, "label": lab})
            counts = t.group_by(["key", "label"], use_threads=False).aggregate(
                [([], "count_all")]
            )
            counts = counts.rename_columns(["key", "label", "count"]).select(self.schema.names)
        else:
            vc = pc.value_counts(keys)
            counts = pa.table([vc.field(0), vc.field(1)], schema=self.schema)
        self.processed += len(keys)
        self._pending.append(counts)
        self._pending_rows += counts.num_rows
        if self._pending_rows > _COMPACT_ROWS:
            self._compact()

    def _compact(self) -> pa.Table:
        t = _sum_counts(self._pending, self.by, self.schema)
        self._pending = [t] if t.num_rows else []
        self._pending_rows = t.num_rows
        return t

    def flush(self) -> pa.Table:
        """The counts since the last flush (``count`` > 0 on every row); resets."""
        t = self._compact()
        self._keys.add(t.column("key").combine_chunks())
        self._pending, self._pending_rows = [], 0
        return t

    def distinct_keys(self) -> int:
        """Distinct keys this worker has ever held (including unflushed ones)."""
        if self._pending:
            self._keys.add(self._compact().column("key").combine_chunks())
        return len(self._keys)


class CountAggregator:
    """Sums count partials from any workers, in any order, exactly."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        with_labels = kind == "naive-bayes"
        self.schema = NAIVE_BAYES_SCHEMA if with_labels else WORDCOUNT_SCHEMA
        self.by = ["key", "label"] if with_labels else ["key"]
        self._total = self.schema.empty_table()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.partials = 0

    def merge(self, partial: pa.Table) -> None:
        if partial.schema.names != self.schema.names:
            raise ValueError(
                f"{self.kind}: partial has columns {partial.schema.names}, "
                f"expected {self.schema.names}"
            )
        self.partials += 1
        if partial.num_rows:
            self._pending.append(partial)
            self._pending_rows += partial.num_rows
            if self._pending_rows > max(_COMPACT_ROWS, self._total.num_rows):
                self._compact()

    def _compact(self) -> None:
        if self._pending:
            self._total = _sum_counts([self._total, *self._pending], self.by, self.schema)
            self._pending, self._pending_rows = [], 0

    def result(self) -> pa.Table:
        self._compact()
        return sort_result(self._total.cast(self.schema), self.kind)


# --------------------------------------------------------------------------- heavy hitters


class HeavyHittersState:
    """A weighted SpaceSaving summary of the keys since the last flush.

    Each batch is pre-aggregated (``value_counts``) and fed as weighted
    updates, so the sketch costs one update per distinct key of a batch. The
    sketch works on 64-bit key hashes; the worker remembers the original
    string of every hash it saw since the last flush (a 64-bit collision
    between two keys would merge them - negligible below billions of keys).
    """

    def __init__(self, counters: int) -> None:
        from runtime.sketches import SpaceSaving  # numba-compiled: only when used

        self._new_sketch = SpaceSaving
        self.counters = counters
        self._sketch = SpaceSaving(counters)
        self._names: dict[int, str | None] = {}
        self._keys = _DistinctKeys()
        self.processed = 0

    def process(self, keys: pa.Array | pa.ChunkedArray, labels: np.ndarray | None = None) -> None:
        keys = as_string_array(keys)
        if not len(keys):
            return
        vc = pc.value_counts(keys)
        uniq = vc.field(0)
        names = uniq.to_pylist()
        hashes = hash_keys(names)
        self._names.update(zip(hashes.tolist(), names, strict=True))
        self._sketch.update_many(hashes, vc.field(1).to_numpy())
        self._keys.add(uniq)
        self.processed += len(keys)

    def flush(self) -> dict[str, Any]:
        """The summary since the last flush (picklable dict); resets the sketch."""
        sk = self._sketch
        h, c, e = sk.items()
        names = self._names
        part = {
            "hashes": h,
            "keys": [names[x] for x in h.tolist()],
            "counts": c,
            "errors": e,
            "capacity": sk.capacity,
            "total": sk.total,
        }
        self._sketch = self._new_sketch(self.counters)
        self._names = {}
        return part

    def distinct_keys(self) -> int:
        return len(self._keys)


class HeavyHittersAggregator:
    """Merges per-worker SpaceSaving summaries; ``result()`` is the top ``top_k``.

    Summaries are buffered and merged together with
    ``runtime.sketches.merge_space_saving`` (one-level merge of fresh
    summaries: ``error <= W / counters``). Buffers are folded into the running
    summary every ``fold_every`` partials; each fold keeps the invariants
    exactly - every reported ``count`` is an upper bound on the key's true
    count and ``count - error`` a lower bound - while the error can grow by the
    fold levels. With ``counters`` >= the distinct keys of every partial,
    nothing is evicted and the result is exact (``error == 0``).
    """

    def __init__(self, counters: int, top_k: int, fold_every: int = 64) -> None:
        self.counters = counters
        self.top_k = top_k
        self.fold_every = fold_every
        self._summary: SpaceSaving | None = None
        self._pending: list[SpaceSaving] = []
        self._names: dict[int, str | None] = {}
        self.partials = 0

    def merge(self, partial: dict[str, Any]) -> None:
        self.partials += 1
        h = np.asarray(partial["hashes"], dtype=np.uint64)
        if not len(h):
            return
        self._names.update(zip(h.tolist(), partial["keys"], strict=True))
        from runtime.sketches import SpaceSaving

        self._pending.append(
            SpaceSaving.from_items(
                h,
                np.asarray(partial["counts"], np.int64),
                np.asarray(partial["errors"], np.int64),
                int(partial["capacity"]),
                int(partial["total"]),
            )
        )
        if len(self._pending) >= self.fold_every:
            self._fold()

    def _fold(self) -> None:
        if not self._pending:
            return
        from runtime.sketches import merge_space_saving

        parts = ([self._summary] if self._summary is not None else []) + self._pending
        self._summary = merge_space_saving(parts, capacity=self.counters)
        self._pending = []
        kept = set(self._summary.items()[0].tolist())
        self._names = {x: k for x, k in self._names.items() if x in kept}

    def result(self) -> pa.Table:
        self._fold()
        if self._summary is None:
            return HEAVY_HITTERS_SCHEMA.empty_table()
        h, c, e = self._summary.items()
        t = pa.table(
            {
                "key": pa.array([self._names[x] for x in h.tolist()], type=pa.string()),
                "count": pa.array(c, type=pa.int64()),
                "error": pa.array(e, type=pa.int64()),
            },
            schema=HEAVY_HITTERS_SCHEMA,
        )
        return sort_result(t, "heavy-hitters").slice(0, self.top_k)

    @property
    def total(self) -> int:
        """Messages summarized so far."""
        self._fold()
        return 0 if self._summary is None else self._summary.total


# --------------------------------------------------------------------------- registry


class App:
    """An application: a factory of worker states and of the aggregator."""

    def __init__(self, kind: str, counters: int = 1000, top_k: int = 100) -> None:
        if kind not in KINDS:
            raise ValueError(f"app.kind: unknown application {kind!r} (known: {', '.join(KINDS)})")
        if counters < 1:
            raise ValueError(f"app.counters: must be >= 1 (got {counters})")
        if top_k < 1:
            raise ValueError(f"app.top_k: must be >= 1 (got {top_k})")
        self.kind = kind
        self.counters = counters
        self.top_k = top_k

    @property
    def needs_labels(self) -> bool:
        return self.kind == "naive-bayes"

    def new_worker_state(self) -> WorkerState:
        if self.kind == "heavy-hitters":
            return HeavyHittersState(self.counters)
        return CountState(with_labels=self.needs_labels)

    def new_aggregator(self) -> Aggregator:
        if self.kind == "heavy-hitters":
            return HeavyHittersAggregator(self.counters, self.top_k)
        return CountAggregator(self.kind)

    def __repr__(self) -> str:
        return f"App({self.kind!r}, counters={self.counters}, top_k={self.top_k})"


def make_app(kind: str, **params: Any) -> App:
    """``make_app("heavy-hitters", counters=1000, top_k=100)``.

    Accepts the ``app`` section's fields (``make_app(**topo.app.model_dump())``);
    ``aggregate_every_s`` (used by the
    actors, not here) is ignored.
    """
    params.pop("aggregate_every_s", None)
    unknown = set(params) - {"counters", "top_k"}
    if unknown:
        raise ValueError(f"app: unknown parameter(s) {sorted(unknown)} for {kind!r}")
    return App(kind, **params)


__all__ = [
    "KINDS",
    "App",
    "Aggregator",
    "WorkerState",
    "make_app",
    "sort_result",
    "as_string_array",
]
