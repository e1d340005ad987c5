"""Result-table helpers shared by the built-in operators and the reference.

Keys are Arrow ``string``; results sort by key in UTF-8 byte order with
nulls last, so two result tables compare with ``==`` (or
``reference.tables_equal`` when floats are involved).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

WORDCOUNT_SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64())])
NAIVE_BAYES_SCHEMA = pa.schema(
    [("key", pa.string()), ("label", pa.int64()), ("count", pa.int64())]
)
HEAVY_HITTERS_SCHEMA = pa.schema(
    [("key", pa.string()), ("count", pa.int64()), ("error", pa.int64())]
)

#: buffered rows above which an operator folds its buffer into counts; bounds
#: a worker's memory when flushes are rare and never changes the answer
COMPACT_ROWS = 262_144

_STRING = pa.string()


def as_string_array(keys: Any) -> pa.Array:
    """Keys as one Arrow ``string`` array (accepts Arrow arrays, chunked arrays,
    numpy/object arrays and lists of str|None)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    elif not isinstance(keys, pa.Array):
        keys = pa.array(keys, type=pa.string())
    if keys.type != _STRING:
        if not (pa.types.is_large_string(keys.type) or pa.types.is_string_view(keys.type)
                or pa.types.is_null(keys.type)):
            raise TypeError(f"keys must be strings (got Arrow type {keys.type})")
        keys = keys.cast(pa.string())
    return keys


def string_keys(keys: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``keys`` as Arrow ``string`` without combining chunks (no copy when it
    already is; ``large_string``/``string_view``/``null`` are cast)."""
    if keys.type == _STRING:
        return keys
    t = keys.type
    if not (pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t)):
        raise TypeError(f"keys must be strings (got Arrow type {t})")
    return keys.cast(_STRING)


def chunked(arrays: list[pa.Array | pa.ChunkedArray], type: pa.DataType) -> pa.ChunkedArray:
    """One ChunkedArray of ``type`` from arrays and chunked arrays (no copy)."""
    chunks: list[pa.Array] = []
    for a in arrays:
        if isinstance(a, pa.ChunkedArray):
            chunks.extend(a.chunks)
        else:
            chunks.append(a)
    return pa.chunked_array(chunks, type=type)


def sort_result(table: pa.Table, kind: str) -> pa.Table:
    """The canonical order of a result table.

    wordcount/aggregate: by key; naive-bayes: by key, label; heavy-hitters: by
    count descending, then key. Keys compare in UTF-8 byte order, nulls last.
    A windowed result (``app.window``) sorts by window first.
    """
    if kind == "heavy-hitters":
        order = [("count", "descending", "at_end"), ("key", "ascending", "at_end")]
    elif kind == "naive-bayes":
        order = [("key", "ascending", "at_end"), ("label", "ascending", "at_end")]
    else:
        order = [("key", "ascending", "at_end")]
    if "window_start" in table.column_names:
        order = [("window_start", "ascending", "at_end"), ("window_end", "ascending", "at_end"),
                 *order]
    idx = pc.sort_indices(table, sort_keys=order)
    return table.take(idx).combine_chunks()


__all__ = [
    "COMPACT_ROWS",
    "HEAVY_HITTERS_SCHEMA",
    "NAIVE_BAYES_SCHEMA",
    "WORDCOUNT_SCHEMA",
    "as_string_array",
    "chunked",
    "sort_result",
    "string_keys",
]
