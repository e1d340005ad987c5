"""Input files: checks before anything starts, and the one key convention.

``preflight(topo)`` looks at an input file with pyarrow (schema, first rows;
never the whole file) so that the common data problems - an unreadable or
corrupt file, an empty dataset, a key (or label) column that does not exist -
end with exit 2 and one line *before* Ray and Spark start (~10 s). The real
runtime still reads the data with Spark and re-checks there (JSON schemas are
only known once Spark has read the whole file).

Odd data that is legitimate is not an error; both engines treat it the same:

- Keys are strings: a non-string key column is converted like Spark's
  ``CAST(key AS STRING)`` (``spark_strings``): integers ``5`` -> ``"5"``,
  booleans ``"true"``, floating point as Java prints it (``5.0``, ``1.0E7``),
  dates ``2024-01-31``. Routing hashes that string, so a key routes to the
  same worker in ``runtime.run`` and ``runtime.simulate``, and the result's
  ``key`` column is a string (docs/design.md).
- CSV is read without type inference: a key is its text (``"007"`` stays
  ``"007"``); an empty field, quoted (``""``) or not, is a null key (Spark's
  CSV defaults, checked against Spark 3.5).
- Null keys are one key: routed with ``runtime.hashing.NULL_HASH`` and counted
  in one result row whose key is null (as Spark's ``groupBy``). Nothing is
  dropped.
- naive-bayes labels are cast to int64 like Spark's ``CAST(label AS BIGINT)``;
  a row whose label is null or not a number is dropped (an example without a
  class teaches nothing). No row left is an error.
- The stream is cut in order into blocks of at most ``SHARD_BLOCK_ROWS`` rows,
  dealt round-robin to the sources (``actors.spark_input.FeedLoad``; the
  simulator's ``shard_order``).
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from runtime.topology import Topology, TopologyError

#: rows per block when the input is dealt to the sources (both engines)
SHARD_BLOCK_ROWS = 65_536

# --------------------------------------------------------------------------- messages


def no_column(field: str, column: str, path: str | None, names: list[str]) -> TopologyError:
    return TopologyError(f"{field}: no column {column!r} in {path} "
                         f"(available: {', '.join(names) or 'none'})")


def no_rows(path: str | None, what: str = "rows", why: str = "empty dataset") -> TopologyError:
    return TopologyError(f"input.path: no {what} in {path!r} ({why})")


class UnreadableInput(TopologyError):
    """pyarrow cannot parse the file (for JSON, Spark may still: it is laxer)."""


def unreadable(fmt: str, path: str | None, err: BaseException) -> TopologyError:
    """``input.path: cannot read 'x' as csv (<the reader's own words>)``."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = lines[0] if lines else err.__class__.__name__
    for marker in ("Invalid: ", "IOError: ", "NotImplemented: "):
        if marker in text:  # pyarrow wraps the real problem in context
            text = text.rsplit(marker, 1)[1]
    if len(text) > 160:
        text = text[:157] + "..."
    return UnreadableInput(f"input.path: cannot read {path!r} as {fmt} ({text})")


# --------------------------------------------------------------------------- reading


def csv_format(key: str, label: str | None = None) -> Any:
    """pyarrow's CSV format with Spark's defaults (header, no type inference
    for the key and label, an empty field - quoted ``""`` too - is null)."""
    import pyarrow.csv as pacsv
    import pyarrow.dataset as ds

    types = {c: pa.string() for c in (key, label) if c}
    convert = pacsv.ConvertOptions(column_types=types, null_values=[""],
                                   strings_can_be_null=True, quoted_strings_can_be_null=True)
    return ds.CsvFileFormat(convert_options=convert)


def has_data_files(directory: Any) -> bool:
    """Whether ``directory`` holds a file Spark reads (not hidden: ``.x``, ``_x``)."""
    return any(f.is_file() and not f.name.startswith((".", "_"))
               for f in directory.rglob("*"))


def open_dataset(topo: Topology) -> Any:
    """The input file (or directory) as a ``pyarrow.dataset``; one-line errors."""
    import pyarrow.dataset as ds

    spec = topo.input
    path = topo.input_path()
    where = str(path) if path is not None else spec.path
    if path is not None and not path.exists():
        raise TopologyError(f"input.path: file not found (got {spec.path!r})")
    if path is not None and path.is_file() and path.stat().st_size == 0:
        raise no_rows(spec.path, why="empty file")
    if path is not None and path.is_dir() and not has_data_files(path):
        raise no_rows(spec.path, why="no data files in the directory")
    fmt: Any = spec.format
    if fmt == "csv":
        fmt = csv_format(spec.key, spec.label if topo.app.kind == "naive-bayes" else None)
    try:
        return ds.dataset(where, format=fmt)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise unreadable(spec.format, spec.path, e) from None


def check_window_column(topo: Topology, type_: pa.DataType) -> None:
    """``app.window``'s column must hold event times its lengths fit: whole
    numbers (lengths in its units) or timestamps (seconds, or with a unit)."""
    from runtime.operators import OperatorError
    from runtime.operators.windows import WindowLengths, time_unit

    assert topo.app.window is not None
    try:
        WindowLengths.of(topo.app.window).ticks(time_unit(type_, topo.app.window.column))
    except OperatorError as e:
        raise TopologyError(str(e)) from None


def preflight(topo: Topology) -> None:
    """Fail with one line (``TopologyError``) if the input file cannot feed a run.

    Checks the file exists and is readable, the key (and, for naive-bayes,
    the label) column exists, and there is at least one row. Reads the schema
    and the first rows only. For JSON, whose schema Spark infers from the
    whole file, a file pyarrow cannot parse is left to Spark, and the columns
    are those of the first block.
    """
    if topo.input.generated:
        from runtime.inputs.generators import GENERATED_COLUMNS

        for field, col in topo.app_input_columns():
            if col not in GENERATED_COLUMNS:
                raise TopologyError(f"{field}: a generated stream has no column {col!r} "
                                    f"(it offers: key, {', '.join(GENERATED_COLUMNS)})")
        if topo.app.window is not None:
            check_window_column(topo, pa.int64() if topo.app.window.column != "amount"
                                else pa.float64())
        return
    path = topo.input_path()
    if path is None:  # a remote URI: Spark will tell
        return
    if topo.input.stream and not has_data_files(path):
        return  # a live stream may start empty: the run waits for the first file
    if path.is_file():
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            raise TopologyError(f"input.path: cannot read {topo.input.path!r} "
                                f"({e.strerror or e.__class__.__name__})") from None
    need = [("input.key", topo.input.key)]
    if topo.app.kind == "naive-bayes":
        need.append(("input.label", topo.input.label))
    need += topo.app_input_columns()
    if topo.input.format == "json":
        # Spark infers a JSON schema from the whole file and accepts what pyarrow
        # refuses (a field that is a number here and a string there): when
        # pyarrow cannot read the first block, Spark decides (actors.spark_input)
        if path.is_file() and path.stat().st_size == 0:
            raise no_rows(topo.input.path, why="empty file")
        try:
            names = list(open_dataset(topo).schema.names)
        except UnreadableInput:
            return
        for field, col in need:
            if col not in names:
                raise no_column(field, col, topo.input.path, names)
        return
    dataset = open_dataset(topo)
    names = list(dataset.schema.names)
    for field, col in need:
        if col not in names:
            raise no_column(field, col, topo.input.path, names)
    if topo.app.window is not None and topo.input.format != "csv":  # CSV: read as a number
        check_window_column(topo, dataset.schema.field(topo.app.window.column).type)
    try:
        first = dataset.head(1, columns=[c for _, c in need if c in names] or None)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise unreadable(topo.input.format, topo.input.path, e) from None
    if first.num_rows == 0:
        raise no_rows(topo.input.path)


# --------------------------------------------------------------------------- Spark's casts


def _java_float(x: float, shortest: str) -> str:
    """Java's ``Double.toString`` / ``Float.toString`` (what Spark's ``CAST(x AS
    STRING)`` prints) of ``x``, given the shortest round-trip text of ``x``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    _, digits, exponent = Decimal(shortest.lstrip("-")).as_tuple()
    assert isinstance(exponent, int)
    exp10 = len(digits) + exponent - 1
    text = "".join(map(str, digits)).rstrip("0") or "0"
    sign = "-" if x < 0 else ""
    if -3 <= exp10 < 7:  # positional, at least one digit after the point
        if exp10 >= 0:
            whole, frac = text[: exp10 + 1].ljust(exp10 + 1, "0"), text[exp10 + 1:]
        else:
            whole, frac = "0", "0" * (-exp10 - 1) + text
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{text[0]}.{text[1:] or '0'}E{exp10}"


def spark_strings(values: pa.Array) -> pa.Array:
    """``values`` as Arrow strings, the way Spark's ``CAST(x AS STRING)`` prints them."""
    t = values.type
    if pa.types.is_string(t):
        return values
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t):
        return values.cast(pa.string())
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_date(t):
        return pc.cast(values, pa.string())
    if pa.types.is_floating(t):
        import numpy as np

        single = t == pa.float32()
        return pa.array([None if v is None else
                         _java_float(v, str(np.float32(v)) if single else repr(v))
                         for v in values.to_pylist()], type=pa.string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([None if v is None else v.decode("utf-8", "replace")
                         for v in values.to_pylist()], type=pa.string())
    try:
        return pc.cast(values, pa.string())
    except (pa.ArrowException, ValueError):
        return pa.array([None if v is None else str(v) for v in values.to_pylist()],
                        type=pa.string())


def _to_long(v: Any) -> int | None:
    """Spark's (non-ANSI) ``CAST(v AS BIGINT)`` of one value; None when it is null."""
    if v is None or isinstance(v, bool):
        return None if v is None else int(v)
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and abs(v) < 2**63 else None
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    s = str(v).strip()
    sign, body = (s[0], s[1:]) if s[:1] in ("+", "-") else ("", s)
    whole, _, frac = body.partition(".")
    if not whole.isdigit() or (frac and not frac.isdigit()):
        return None  # "x", "", "1e3": null
    n = int(sign + whole)
    return n if -(2**63) <= n < 2**63 else None


def spark_longs(values: pa.Array) -> pa.Array:
    """``values`` as int64 the way Spark's ``CAST(x AS BIGINT)`` does (null when not
    a number; decimals truncated)."""
    if pa.types.is_integer(values.type):
        return values.cast(pa.int64())
    return pa.array([_to_long(v) for v in values.to_pylist()], type=pa.int64())


# --------------------------------------------------------------------------- the app


#: Arrow types of the generated streams' columns (``runtime.inputs.generators``)
_GENERATED_TYPES = {"ts": pa.int64(), "label": pa.int64(), "value": pa.int64(),
                    "amount": pa.float64()}


def _value_type(topo: Topology) -> pa.DataType | None:
    """The aggregate's value column type in the input, when known before Spark reads it."""
    column = str(topo.app.value)
    if topo.input.generated:
        return _GENERATED_TYPES.get(column)
    if topo.input_path() is None or topo.input.format == "json":
        return None  # a remote URI, or a schema only Spark knows
    try:
        schema = open_dataset(topo).schema
    except TopologyError:
        return None  # preflight reports it
    return schema.field(column).type if column in schema.names else None


def check_app(topo: Topology) -> Any:
    """The app's operator, ready to run, or one line (``TopologyError``) on why
    it cannot: an operator that cannot be imported or built (``app.operator``,
    ``app.params``), a non-mergeable operator under a scheme that splits keys
    or with faults / workers joining and leaving (which move keys), an
    aggregate over a value column that cannot be summed (``app.value``)."""
    from runtime.grouping import SCHEMES
    from runtime.operators import (
        OperatorError,
        check_value_type,
        operator_for_app,
        require_mergeable,
    )

    try:
        op = operator_for_app(topo.app.model_dump(), topo.base_dir)
        require_mergeable(op.spec, topo.grouping.scheme,
                          SCHEMES[topo.grouping.scheme].splits_keys)
    except (OperatorError, ValueError, TypeError) as e:
        raise TopologyError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if not op.spec.mergeable and (topo.faults or topo.workers.membership):
        raise TopologyError(f"{op.spec.field}: {op.spec.name}: not mergeable, so every key must "
                            "stay on one worker; faults and workers.changes add/remove move "
                            "keys between workers")
    if topo.app.kind == "aggregate":
        vt = _value_type(topo)
        if vt is not None:
            try:
                check_value_type(vt, topo.app.aggs or (), str(topo.app.value))
            except ValueError as e:
                raise TopologyError(str(e)) from None
    return op


def shard_block_rows(topo: Topology) -> int:
    """Rows per Ray block when sharding: at least ~4 blocks per source when the
    input size is known from the topology, so that small inputs are dealt to
    every source (one big block would leave the other sources empty)."""
    hint = topo.input.limit
    if topo.input.generated:
        hint = min(topo.input.messages, hint or topo.input.messages)
    if hint is None:
        return SHARD_BLOCK_ROWS
    return int(min(SHARD_BLOCK_ROWS, max(1000, math.ceil(hint / (4 * topo.sources)))))
