"""Spark's own answer for the built-in operators, and comparing result tables.

``spark_reference(df, app)`` computes with the PySpark DataFrame API (imported
only when called) the exact result the operators must produce, in their schema
and order; ``tables_equal``/``table_diff`` compare two result tables (integers
and strings exactly, floats within a relative tolerance, NaN == NaN, null ==
null). ``actors.spark_input.reference_result`` calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.operators.aggregate import Aggregate
from runtime.operators.registry import BUILTINS
from runtime.operators.tables import (
    HEAVY_HITTERS_SCHEMA,
    NAIVE_BAYES_SCHEMA,
    WORDCOUNT_SCHEMA,
    sort_result,
)
from runtime.operators.windows import TIMESTAMP, WINDOW_COLUMNS, WindowLengths

#: Spark computes the answer of every built-in operator
_REFERENCE_KINDS = tuple(BUILTINS)


def _collect_arrow(df: Any, schema: pa.Schema) -> pa.Table:
    """Collect a (small) DataFrame to the driver as Arrow, in ``schema``."""
    batches = df._collect_as_arrow()
    if not batches:
        return schema.empty_table()
    return pa.Table.from_batches(batches).select(schema.names).cast(schema)


def spark_reference(df: Any, app: Mapping[str, Any] | str,
                    value_type: pa.DataType | None = None) -> pa.Table:
    """Spark's answer for ``app`` (an ``app:`` section mapping, or a kind).

    ``df`` has a ``key`` column (cast to string here, as the input does) and
    the app's columns. wordcount: ``groupBy(key).count()``; naive-bayes:
    ``groupBy(key, label).count()``; heavy-hitters: the ``top_k`` keys by
    exact count (ties by key, null last), error 0; aggregate:
    ``groupBy(key).agg(count("*"), sum(v), min(v), max(v), avg(v))`` with the
    aggs in order and named as given, cast to ``Aggregate.result_schema``
    (``value_type``: the value column's Arrow type; default: Spark's).
    """
    from pyspark.sql import functions as F

    spec: Mapping[str, Any] = {"kind": app} if isinstance(app, str) else app
    kind = spec.get("kind")
    if kind not in _REFERENCE_KINDS:
        raise ValueError(f"app.kind: no Spark reference for {kind!r} "
                         f"(known: {', '.join(_REFERENCE_KINDS)})")
    df = df.withColumn("key", F.col("key").cast("string"))
    by: list[str] = []  # the window's columns, first (none without app.window)
    window_type: pa.DataType = pa.int64()
    if spec.get("window") is not None:
        df, window_type = _with_windows(df, spec["window"])
        by = list(WINDOW_COLUMNS)

    def collect(d: Any, schema: pa.Schema) -> pa.Table:
        if by:
            schema = pa.schema([pa.field(c, window_type) for c in by] + list(schema))
        return sort_result(_collect_arrow(d, schema), kind)

    if kind == "naive-bayes":
        return collect(df.groupBy(*by, "key", "label").count(), NAIVE_BAYES_SCHEMA)
    if kind == "wordcount":
        return collect(df.groupBy(*by, "key").count(), WORDCOUNT_SCHEMA)
    if kind == "heavy-hitters":
        from pyspark.sql import Window

        top_k = int(spec.get("top_k") or 100)
        # the cut at top_k breaks ties like sort_result: count desc, key asc, null last
        rank = F.row_number().over(Window.partitionBy(*[F.col(c) for c in by] or [F.lit(0)])
                                   .orderBy(F.desc("count"), F.asc_nulls_last("key")))
        ranked = (df.groupBy(*by, "key").count().withColumn("_rank", rank)
                  .where(F.col("_rank") <= top_k).drop("_rank")
                  .withColumn("error", F.lit(0).cast("long")))
        return collect(ranked, HEAVY_HITTERS_SCHEMA)
    value = spec.get("value")
    if not isinstance(value, str):
        raise ValueError(f"app.value: required for kind 'aggregate' (got {value!r})")
    op = Aggregate(value, spec.get("aggs") or ("count", "sum", "min", "max", "mean"))
    if value_type is None:
        from pyspark.sql.pandas.types import to_arrow_type

        value_type = to_arrow_type(df.schema[value].dataType)
    spark_fn = {"count": lambda c: F.count(F.lit(1)), "sum": F.sum, "min": F.min,
                "max": F.max, "mean": F.avg}
    exprs = [spark_fn[a](F.col(value)).alias(a) for a in op.aggs]
    return collect(df.groupBy(*by, "key").agg(*exprs), op.result_schema(value_type))


def _with_windows(df: Any, window: Any) -> tuple[Any, pa.DataType]:
    """``df`` with one row per (record, window holding it) and the window as
    ``window_start``/``window_end`` (Spark's ``window()``; a record without an
    event time in none); the columns' Arrow type."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType

    w = WindowLengths.of(window)
    col = F.col(f"`{w.column}`")
    integral = isinstance(df.schema[w.column].dataType, IntegralType)
    if integral:  # whole numbers: Spark windows timestamps, so count ticks as seconds
        size, slide, _ = w.ticks("int")
        win = F.window(F.timestamp_seconds(col), f"{size} seconds", f"{slide} seconds")
    else:
        size, slide, _ = w.ticks("us")
        win = F.window(col, f"{size} microseconds", f"{slide} microseconds")
    start, end = F.col("_window.start"), F.col("_window.end")
    if integral:
        start, end = start.cast("long"), end.cast("long")
    others = [F.col(f"`{c}`") for c in df.columns]
    out = (df.withColumn("_window", win).where(F.col("_window").isNotNull())
           .select(start.alias(WINDOW_COLUMNS[0]), end.alias(WINDOW_COLUMNS[1]), *others))
    return out, (pa.int64() if integral else TIMESTAMP)


# ------------------------------------------------------------------ comparing


def _show(v: Any) -> str:
    return repr(v)[:60]


def table_diff(got: pa.Table, want: pa.Table, rel: float = 1e-9) -> str | None:
    """``None`` if the tables are equal, else the first difference (one line).

    Same column names and types, same number of rows, and row by row: floats
    within ``rel`` relative (NaN == NaN, inf == inf of the same sign), every
    other type exactly; null matches only null.
    """
    if got.column_names != want.column_names:
        return f"columns {got.column_names} != {want.column_names}"
    for g_f, w_f in zip(got.schema, want.schema, strict=True):
        if g_f.type != w_f.type:
            return f"column {g_f.name!r}: type {g_f.type} != {w_f.type}"
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows != {want.num_rows}"
    keys = got.column("key").to_pylist() if "key" in got.column_names else None

    def at(i: int) -> str:
        return f"row {i}" + (f" (key {keys[i]!r})" if keys is not None else "")

    for name in got.column_names:
        g = got.column(name).combine_chunks()
        w = want.column(name).combine_chunks()
        g_null = g.is_null().to_numpy(zero_copy_only=False)
        w_null = w.is_null().to_numpy(zero_copy_only=False)
        if (g_null != w_null).any():
            i = int(np.flatnonzero(g_null != w_null)[0])
            return f"column {name!r} {at(i)}: {_show(g[i].as_py())} != {_show(w[i].as_py())}"
        if pa.types.is_floating(g.type):
            gv = pc.fill_null(g.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
            wv = pc.fill_null(w.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
            with np.errstate(invalid="ignore", over="ignore"):
                same = (gv == wv) | (np.isnan(gv) & np.isnan(wv)) | (
                    np.isfinite(gv) & np.isfinite(wv)
                    & (np.abs(gv - wv) <= rel * np.maximum(np.abs(gv), np.abs(wv))))
            if not same.all():
                i = int(np.flatnonzero(~same)[0])
                return f"column {name!r} {at(i)}: {gv[i]!r} != {wv[i]!r} (rel {rel})"
        elif not g.equals(w):
            gl, wl = g.to_pylist(), w.to_pylist()
            i = next((j for j, (a, b) in enumerate(zip(gl, wl, strict=True)) if a != b), 0)
            return f"column {name!r} {at(i)}: {_show(gl[i])} != {_show(wl[i])}"
    return None


def tables_equal(got: pa.Table, want: pa.Table, rel: float = 1e-9) -> bool:
    """``table_diff(got, want, rel) is None``."""
    return table_diff(got, want, rel) is None


__all__ = ["spark_reference", "table_diff", "tables_equal"]
