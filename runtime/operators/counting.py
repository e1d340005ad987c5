"""Exact counting operators: ``WordCount`` (per key) and ``NaiveBayes`` (per key, label).

``add`` only appends the batch's arrays (O(1) per batch); the counting is done
with Arrow's hash aggregation when a state is compacted (before a flush leaves
the worker), when its buffer exceeds ``COMPACT_ROWS`` rows (bounded memory) or
when merged partials pile up, and in ``finish``. Counts are sums, so any split
of the stream into batches, workers and flushes, merged in any order, gives
exactly the single-worker answer (Spark's ``groupBy().count()``).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from runtime.operators.state import (
    SlottedState,
    buffer_full,
    fold_due,
    keep_folded,
    merge_rows,
)
from runtime.operators.tables import (
    NAIVE_BAYES_SCHEMA,
    WORDCOUNT_SCHEMA,
    chunked,
    sort_result,
    string_keys,
)

_STRING = pa.string()
_INT64 = pa.int64()


class CountState(SlottedState):
    """Uncounted rows (``keys``/``labels``: lists of Arrow arrays) plus count
    tables not yet summed together (``tables``, each ``by + [count]``)."""

    __slots__ = ("keys", "labels", "raw_rows", "tables", "table_rows", "big_rows")

    def __init__(self) -> None:
        self.keys: list[pa.Array | pa.ChunkedArray] = []
        self.labels: list[pa.Array | pa.ChunkedArray] = []
        self.raw_rows = 0
        self.tables: list[pa.Table] = []
        self.table_rows = 0  # rows in ``tables``
        self.big_rows = 0  # rows of the largest table (the running total)

    def __repr__(self) -> str:
        return (f"CountState(raw_rows={self.raw_rows}, tables={len(self.tables)}, "
                f"table_rows={self.table_rows})")


def _sum_counts(tables: list[pa.Table], by: list[str], schema: pa.Schema) -> pa.Table:
    """Group the count tables by ``by`` and sum ``count`` (exact, int64)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return schema.empty_table()
    if len(tables) == 1:
        return tables[0]
    t = pa.concat_tables(tables).group_by(by, use_threads=False).aggregate([("count", "sum")])
    return t.rename_columns([*by, "count"]).select(schema.names).cast(schema)


class _Counting:
    """Shared by ``WordCount`` and ``NaiveBayes``: count rows per ``by``
    (``key``, plus the input column ``label`` when it is set)."""

    mergeable = True
    kind = ""
    schema = WORDCOUNT_SCHEMA
    by: list[str] = ["key"]
    label: str | None = None

    def create(self) -> CountState:
        return CountState()

    def add(self, state: CountState, batch: pa.RecordBatch) -> CountState:
        keys = string_keys(batch.column("key"))
        if self.label is not None:
            labels = batch.column(self.label)
            state.labels.append(labels if labels.type == _INT64 else labels.cast(_INT64))
        state.keys.append(keys)
        state.raw_rows += len(keys)
        if buffer_full(state):
            self._fold(state)
        return state

    def _count_raw(self, state: CountState) -> pa.Table:  # pragma: no cover - abstract
        raise NotImplementedError

    def _fold(self, state: CountState) -> CountState:
        """Count the raw rows and sum all tables into one (in place; the state
        means the same multiset of rows afterwards)."""
        parts = list(state.tables)
        if state.raw_rows:
            parts.append(self._count_raw(state))
        t = _sum_counts(parts, self.by, self.schema)
        keep_folded(state, t)
        state.labels = []
        return state

    def compact(self, state: CountState) -> CountState:
        return self._fold(state)

    def merge(self, a: CountState, b: CountState) -> CountState:
        out = merge_rows(CountState(), a, b)
        out.labels = a.labels + b.labels
        if fold_due(out):
            self._fold(out)
        return out

    def finish(self, state: CountState) -> pa.Table:
        self._fold(state)
        t = state.tables[0] if state.tables else self.schema.empty_table()
        return sort_result(t.cast(self.schema), self.kind)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class WordCount(_Counting):
    """Rows per key: result ``key`` (string), ``count`` (int64), sorted by key
    (byte order, nulls last); a null key is one group, as in Spark's groupBy."""

    kind = "wordcount"
    schema = WORDCOUNT_SCHEMA
    by = ["key"]
    columns: tuple[str, ...] = ()

    def _count_raw(self, state: CountState) -> pa.Table:
        vc = pc.value_counts(chunked(state.keys, _STRING))
        return pa.table([vc.field(0), vc.field(1)], schema=self.schema)


class NaiveBayes(_Counting):
    """Rows per (key, label): result ``key``, ``label`` (int64), ``count``
    (int64), sorted by key then label. ``label``: the input column holding the
    class (cast to int64; a null label is a group of its own)."""

    kind = "naive-bayes"
    schema = NAIVE_BAYES_SCHEMA
    by = ["key", "label"]

    def __init__(self, label: str = "label") -> None:
        if not isinstance(label, str) or not label or label in ("key", "key_hash"):
            raise ValueError(f"app.label: must be a column name other than key (got {label!r})")
        self.label = label
        self.columns = (label,)

    def _count_raw(self, state: CountState) -> pa.Table:
        t = pa.table({"key": chunked(state.keys, _STRING),
                      "label": chunked(state.labels, _INT64)})
        counts = t.group_by(["key", "label"], use_threads=False).aggregate([([], "count_all")])
        return counts.rename_columns(["key", "label", "count"]).select(self.schema.names)

    def __repr__(self) -> str:
        return f"NaiveBayes(label={self.label!r})"


__all__ = ["CountState", "NaiveBayes", "WordCount"]
