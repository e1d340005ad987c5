"""``Aggregate``: per-key count / sum / min / max / mean of one value column.

Equal to Spark 3.5's ``df.groupBy("key").agg(count("*"), sum(v), min(v),
max(v), avg(v))`` (``runtime.operators.reference.spark_reference`` computes
that; the e2e tests compare):

- ``count``: rows of the key, nulls in ``v`` included -> int64.
- ``sum``: of the non-null values; integer columns (int8..int64,
  uint8..uint32) -> int64, exact; float columns -> float64 (Spark casts each
  value to double and sums). NaN (or +inf with -inf) anywhere gives NaN.
- ``min``/``max``: keep the column's type (int stays int, float32 stays
  float32, strings compare by UTF-8 bytes, timestamps by time). Spark orders
  NaN above every other float: ``max`` is NaN as soon as one value is NaN,
  ``min`` only when every non-null value is NaN.
- ``mean``: float64, sum of the non-null values / their number (NaN counts
  as a value and makes the mean NaN).
- a key whose values are all null gets null ``sum``/``min``/``max``/``mean``
  (``count`` is still its row count); a null key is a key.

Not supported (refused before the run by ``check_value_type``, which the
runtime calls with the input's schema, or at the first batch): sum/mean of a
non-number (string, bool, timestamp, ...), of ``uint64`` (Spark reads it as
``decimal(20,0)``) and of decimals (Spark keeps them decimal with more digits;
exact decimal sums are not implemented); min/max of an unorderable type.

The partial state per key is ``rows, nn (non-null count), sum (int64 or
float64), min, max, nan (NaN count)``: all merge exactly by sum/min/max, so
any split of the stream gives the same table (float sums up to rounding order,
well within 1e-9 relative on real data). ``add`` only buffers the arrays; the
grouping runs at ``compact``/``finish`` and when the buffer exceeds
``COMPACT_ROWS`` rows.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from runtime.operators.state import (
    SlottedState,
    buffer_full,
    fold_due,
    keep_folded,
    merge_rows,
)
from runtime.operators.tables import chunked, sort_result, string_keys

AGGS = ("count", "sum", "min", "max", "mean")
_ALIASES = {"avg": "mean", "average": "mean", "cnt": "count", "total": "sum",
            "minimum": "min", "maximum": "max"}
_STRING = pa.string()
_INT64 = pa.int64()
_FLOAT64 = pa.float64()
_SUM0 = pc.ScalarAggregateOptions(skip_nulls=True, min_count=0)
#: the integer types Spark reads as integers (uint64 becomes decimal(20,0))
_EXACT_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64(),
               pa.uint8(), pa.uint16(), pa.uint32())


def _known(name: str) -> str:
    close = _ALIASES.get(name.lower()) if isinstance(name, str) else None
    if close is None and isinstance(name, str):
        m = difflib.get_close_matches(name.lower(), AGGS, n=1, cutoff=0.5)
        close = m[0] if m else None
    hint = f"; did you mean {close!r}?" if close else ""
    return f"app.aggs: unknown aggregate {name!r} (known: {', '.join(AGGS)}){hint}"


def check_aggs(aggs: Any) -> tuple[str, ...]:
    """``aggs`` as a tuple, or a one-line ``ValueError`` naming ``app.aggs``."""
    if isinstance(aggs, str) or not isinstance(aggs, Iterable):
        raise ValueError(f"app.aggs: must be a list of aggregates among {', '.join(AGGS)} "
                         f"(got {aggs!r})")
    out = tuple(aggs)
    if not out:
        raise ValueError(f"app.aggs: empty; list any of {', '.join(AGGS)}")
    for a in out:
        if a not in AGGS:
            raise ValueError(_known(a))
    for a in out:
        if out.count(a) > 1:
            raise ValueError(f"app.aggs: {a!r} listed twice")
    return out


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def check_value_type(arrow_type: pa.DataType, aggs: Iterable[str], column: str = "value") -> None:
    """Refuse (one-line ``ValueError`` naming ``app.value``) a value column of
    ``arrow_type`` that the requested ``aggs`` cannot handle exactly."""
    aggs = check_aggs(aggs)
    t = _plain(arrow_type)
    if "sum" in aggs or "mean" in aggs:
        if pa.types.is_decimal(t):
            raise ValueError(f"app.value: column {column!r} is {t}; sum/mean of decimals are "
                             "not supported (not exact here): cast it to double or integer units")
        if t == pa.uint64():
            raise ValueError(f"app.value: column {column!r} is uint64; sum/mean need int8..int64, "
                             "uint8..uint32 or float (Spark reads uint64 as decimal)")
        if not (t in _EXACT_INTS or pa.types.is_floating(t)):
            raise ValueError(f"app.value: column {column!r} is {t}; sum/mean need numbers")
    if "min" in aggs or "max" in aggs:
        probe = pa.table({"k": pa.array([], _STRING), "v": pa.array([], t)})
        try:
            probe.group_by("k").aggregate([("v", "min"), ("v", "max")])
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ValueError(f"app.value: column {column!r} is {t}; min/max need an orderable "
                             "type (numbers, strings, dates, timestamps)") from e


class AggregateState(SlottedState):
    """Unfolded ``keys``/``values`` arrays plus per-key partial tables."""

    __slots__ = ("keys", "values", "raw_rows", "tables", "table_rows", "big_rows", "value_type")

    def __init__(self) -> None:
        self.keys: list[pa.Array | pa.ChunkedArray] = []
        self.values: list[pa.Array | pa.ChunkedArray] = []
        self.raw_rows = 0
        self.tables: list[pa.Table] = []
        self.table_rows = 0
        self.big_rows = 0
        self.value_type: pa.DataType | None = None

    def __repr__(self) -> str:
        return (f"AggregateState(raw_rows={self.raw_rows}, tables={len(self.tables)}, "
                f"value_type={self.value_type})")


class Aggregate:
    """Per-key ``aggs`` (any of count, sum, min, max, mean) of column ``value``;
    result ``key`` then one column per aggregate, named and ordered as given,
    sorted by key (module docstring for the exact semantics).

    ``value_type``: the column's Arrow type if known before the run (checked
    now; also types an empty result's min/max/sum, else float64 is assumed).
    """

    mergeable = True

    def __init__(self, value: str, aggs: Iterable[str] = AGGS,
                 value_type: pa.DataType | None = None) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError(f"app.value: must be a column name (got {value!r})")
        if value in ("key", "key_hash"):
            raise ValueError(f"app.value: {value!r} is the routing key; name a value column")
        self.value = value
        self.aggs = check_aggs(aggs)
        self.columns = (value,)
        if value_type is not None:
            check_value_type(value_type, self.aggs, value)
        self.value_type = value_type
        self._need_sum = "sum" in self.aggs or "mean" in self.aggs
        self._need_min = "min" in self.aggs
        self._need_max = "max" in self.aggs

    # ---------------------------------------------------------------- schema

    def result_schema(self, value_type: pa.DataType | None = None) -> pa.Schema:
        """The result's schema for a value column of ``value_type``."""
        t = _plain(value_type or self.value_type or _FLOAT64)
        sum_t = _FLOAT64 if pa.types.is_floating(t) else _INT64
        types = {"count": _INT64, "sum": sum_t, "min": t, "max": t, "mean": _FLOAT64}
        return pa.schema([("key", _STRING), *((a, types[a]) for a in self.aggs)])

    # ---------------------------------------------------------------- contract

    def create(self) -> AggregateState:
        return AggregateState()

    def add(self, state: AggregateState, batch: pa.RecordBatch) -> AggregateState:
        keys = string_keys(batch.column("key"))
        state.keys.append(keys)
        state.values.append(batch.column(self.value))
        state.raw_rows += len(keys)
        if buffer_full(state):
            self._fold(state)
        return state

    def compact(self, state: AggregateState) -> AggregateState:
        return self._fold(state)

    def merge(self, a: AggregateState, b: AggregateState) -> AggregateState:
        out = merge_rows(AggregateState(), a, b)
        out.values = a.values + b.values
        out.value_type = a.value_type or b.value_type
        if fold_due(out):
            self._fold(out)
        return out

    def finish(self, state: AggregateState) -> pa.Table:
        self._fold(state)
        schema = self.result_schema(state.value_type)
        if not state.tables:
            return schema.empty_table()
        p = state.tables[0]
        is_float = pa.types.is_floating(_plain(state.value_type or _FLOAT64))
        cols: list[pa.ChunkedArray | pa.Array] = [p.column("key")]
        sums: Any = None
        means: Any = None
        if self._need_sum:
            empty = pc.equal(p.column("nn"), 0)
            sums = pc.if_else(empty, pa.scalar(None, p.column("sum").type), p.column("sum"))
            means = pc.divide(pc.cast(p.column("sum"), _FLOAT64), pc.cast(p.column("nn"), _FLOAT64))
            means = pc.if_else(empty, pa.scalar(None, _FLOAT64), means)
        for a in self.aggs:
            if a == "count":
                cols.append(p.column("rows"))
            elif a == "sum":
                cols.append(sums)
            elif a == "mean":
                cols.append(means)
            elif a == "min":
                m = p.column("min")
                if is_float:  # only NaNs: NaN (Spark: NaN is the largest value)
                    only_nan = pc.and_(pc.is_null(m), pc.greater(p.column("nan"), 0))
                    m = pc.if_else(only_nan, pa.scalar(float("nan"), m.type), m)
                cols.append(m)
            else:
                m = p.column("max")
                if is_float:  # any NaN: NaN
                    m = pc.if_else(pc.greater(p.column("nan"), 0),
                                   pa.scalar(float("nan"), m.type), m)
                cols.append(m)
        t = pa.table(cols, names=schema.names).cast(schema)
        return sort_result(t, "aggregate")

    # ---------------------------------------------------------------- folding

    def _partial(self, keys: pa.ChunkedArray, values: pa.ChunkedArray) -> pa.Table:
        """Per-key partial table of raw rows: key, rows, [nn, sum], [min], [max], [nan]."""
        t = values.type
        is_float = pa.types.is_floating(t)
        cols: dict[str, Any] = {"key": keys}
        aggs: list[tuple[Any, ...]] = [([], "count_all")]
        names = ["rows"]
        if self._need_sum:
            cols["s"] = values.cast(_FLOAT64 if is_float else _INT64)
            aggs += [("s", "count"), ("s", "sum", _SUM0)]
            names += ["nn", "sum"]
        if self._need_min or self._need_max:
            if is_float:
                nan = pc.is_nan(values)
                cols["m"] = pc.if_else(nan, pa.scalar(None, t), values)
                cols["n"] = nan.cast(_INT64)
                aggs.append(("n", "sum", _SUM0))
                names.append("nan")
            else:
                cols["m"] = values
            if self._need_min:
                aggs.append(("m", "min"))
                names.append("min")
            if self._need_max:
                aggs.append(("m", "max"))
                names.append("max")
        g = pa.table(cols).group_by("key", use_threads=False).aggregate(aggs)
        out_names = [
            "count_all" if isinstance(a[0], list) else f"{a[0]}_{a[1]}" for a in aggs
        ]
        return pa.table([g.column("key"), *(g.column(n) for n in out_names)],
                        names=["key", *names])

    def _merge_partials(self, tables: list[pa.Table]) -> pa.Table:
        tables = [t for t in tables if t.num_rows]
        if len(tables) <= 1:
            return tables[0] if tables else pa.table({})
        names = tables[0].column_names[1:]
        func = {"rows": "sum", "nn": "sum", "sum": "sum", "nan": "sum", "min": "min", "max": "max"}
        aggs = [(n, func[n], _SUM0) if func[n] == "sum" else (n, func[n]) for n in names]
        g = pa.concat_tables(tables).group_by("key", use_threads=False).aggregate(aggs)
        return pa.table([g.column("key"), *(g.column(f"{n}_{func[n]}") for n in names)],
                        names=["key", *names])

    def _fold(self, state: AggregateState) -> AggregateState:
        parts = list(state.tables)
        if state.raw_rows:
            vtype = state.value_type or self.value_type
            if vtype is None:  # first rows seen: refuse a type we cannot aggregate
                vtype = _plain(state.values[0].type)
                check_value_type(vtype, self.aggs, self.value)
            vtype = _plain(vtype)
            values = [v if v.type == vtype else v.cast(vtype) for v in state.values]
            state.value_type = vtype
            parts.append(self._partial(chunked(state.keys, _STRING), chunked(values, vtype)))
        t = self._merge_partials(parts)
        keep_folded(state, t)
        state.values = []
        return state

    def __repr__(self) -> str:
        return f"Aggregate(value={self.value!r}, aggs={list(self.aggs)!r})"


__all__ = ["AGGS", "Aggregate", "AggregateState", "check_aggs", "check_value_type"]
