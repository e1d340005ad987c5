"""The simulator's input: a message stream as dense key ids plus a key table.

- Generated formats (``zipf``, ``evolving-zipf``) use the very functions of
  ``runtime.inputs.generators`` that Spark runs, so both engines see the same
  stream, message for message (``generate`` = ``key_ids`` + ``k<id>``
  strings; only the distinct keys are turned into strings and hashed here).
- File formats (parquet, csv, json = newline-delimited JSON) are read with
  pyarrow directly: the simulator is the fast what-if tool. The real runtime
  reads the same files through Spark (RayDP); row order is the file's order.
  ``input.limit`` keeps the first rows; ``input.key`` names the routing key.

Keys are strings, as in the real runtime (``runtime.inputs.input_check``): a
non-string key column is converted the way Spark's ``CAST(key AS STRING)``
prints it, CSV is read as text (``"007"`` stays ``"007"``, an empty field is
null), and the string is hashed with Murmur3 (null = ``NULL_HASH``, one key),
so a key routes exactly as in the real runtime and the result table's ``key``
column is a string (docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.dataflow.reliability import take
from runtime.hashing import hash_keys
from runtime.inputs import generators
from runtime.inputs.input_check import (
    no_column,
    no_rows,
    open_dataset,
    spark_longs,
    spark_strings,
    unreadable,
)
from runtime.topology import Topology

#: generated streams are produced in chunks of this many messages
GEN_CHUNK = 1 << 21


@dataclass
class SimInput:
    """A stream of ``n`` messages over ``len(keys)`` distinct keys.

    ``key_ids[i]`` indexes ``keys`` (the original keys, as strings) and
    ``key_hashes`` (their 64-bit routing hashes). ``label_ids``/``labels``
    hold naive-bayes classes (None for other apps); ``columns`` the other
    columns the app needs, one value per message (aggregate, operator).
    """

    key_ids: np.ndarray
    keys: pa.Array
    key_hashes: np.ndarray
    label_ids: np.ndarray | None = None
    labels: pa.Array | None = None
    description: str = ""
    columns: dict[str, pa.Array] | None = None

    def records(self, idx: np.ndarray) -> pa.RecordBatch:
        """Messages ``idx`` as the workers get them: ``key`` + the app's columns."""
        cols = {"key": take(self.keys, self.key_ids[idx])}
        if self.label_ids is not None and self.labels is not None:
            lab = take(self.labels, self.label_ids[idx])
            cols["label"] = lab.cast(pa.int64())
        if self.columns:
            sel = pa.array(np.asarray(idx, dtype=np.int64))
            for name, col in self.columns.items():
                cols[name] = col.take(sel)
        return pa.record_batch(cols)

    @property
    def n(self) -> int:
        return int(self.key_ids.shape[0])

    def message_hashes(self) -> np.ndarray:
        """``uint64[n]`` routing hash of every message."""
        return self.key_hashes[self.key_ids]


def _dense(ids: np.ndarray, n_space: int) -> tuple[np.ndarray, np.ndarray]:
    """Remap ids in ``[0, n_space)`` to dense ids over the ids present: (dense, present)."""
    if n_space <= 4 * max(len(ids), 1):
        present = np.flatnonzero(np.bincount(ids, minlength=n_space))
    else:
        present = np.unique(ids)
    remap = np.full(n_space, -1, dtype=np.int64)
    remap[present] = np.arange(len(present))
    dtype = np.int32 if len(present) < 2**31 else np.int64
    return remap[ids].astype(dtype), present


def generated_input(topo: Topology, *, with_labels: bool) -> SimInput:
    spec = topo.input
    n = spec.messages if spec.limit is None else min(spec.messages, spec.limit)
    shift = spec.shift_every if spec.format == "evolving-zipf" else None
    cdf = generators.zipf_cdf(spec.keys, spec.skew)
    parts = []
    for start in range(0, n, GEN_CHUNK):
        parts.append(generators.key_ids(
            start, min(GEN_CHUNK, n - start), n_keys=spec.keys, skew=spec.skew,
            seed=spec.seed, shift_every=shift, cdf=cdf))
    raw = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    dense, present = _dense(raw, spec.keys)
    strings = generators.key_strings(present)
    keys = pa.array(strings.tolist(), type=pa.string())
    label_ids = labels = None
    if with_labels:
        lab = np.concatenate([
            generators.labels(raw[s:s + GEN_CHUNK], s, classes=spec.classes, seed=spec.seed)
            for s in range(0, n, GEN_CHUNK)
        ]) if n else np.zeros(0, dtype=np.int64)
        label_ids = lab.astype(np.int32)
        labels = pa.array(np.arange(spec.classes, dtype=np.int64))
    columns = {}
    for _, name in topo.app_input_columns():  # the payload, as Spark's executor makes it
        if name == "ts":
            columns[name] = pa.array(np.arange(n, dtype=np.int64))
        else:
            columns[name] = pa.array(generators.payload(name, 0, n, spec.seed), from_pandas=True)
    desc = (f"{spec.format}(messages={n}, keys={spec.keys}, skew={spec.skew}, "
            f"seed={spec.seed}{f', shift_every={shift}' if shift else ''})")
    return SimInput(dense, keys, hash_keys(strings), label_ids, labels, desc, columns or None)


def _encode(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Dictionary-encode a column: (int ids, distinct values), nulls as one value."""
    enc = pc.dictionary_encode(col, null_encoding="encode")
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    if pa.types.is_null(enc.type):  # an all-null column: one (null) value
        return np.zeros(len(col), dtype=np.int32), pa.array([None], type=pa.string())
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int32), enc.dictionary


def _string_keys(col: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """Key column -> (ids, distinct keys as Spark prints them, their hashes).

    A non-string column is converted like Spark's ``CAST(key AS STRING)``
    (``runtime.inputs.input_check.spark_strings``), then hashed as that string, so a
    key routes exactly as in the real runtime; nulls are one key (NULL_HASH).
    """
    ids, values = _encode(col)
    if not pa.types.is_string(values.type):
        strings = spark_strings(values)
        remap, keys = _encode(strings)  # distinct values may print alike
        ids = remap[ids]
        values = keys
    return ids, values, hash_keys(values.to_pylist())


def file_input(topo: Topology, *, with_labels: bool) -> SimInput:
    """An input file read with pyarrow, with the real runtime's conventions
    (``runtime.inputs.input_check``): CSV as text, keys as Spark prints them, null
    keys one key, naive-bayes rows without an integer label dropped."""
    spec = topo.input
    fmt = spec.format
    dataset = open_dataset(topo)  # a remote URI (s3://...) goes to pyarrow's file systems
    names = dataset.schema.names
    need = [("input.key", spec.key)] + ([("input.label", spec.label)] if with_labels else [])
    need += topo.app_input_columns()
    for field, col in need:
        if col not in names:
            raise no_column(field, col, spec.path, names)
    cols = list(dict.fromkeys(c for _, c in need))
    try:
        table = (dataset.head(spec.limit, columns=cols) if spec.limit and not with_labels
                 else dataset.to_table(columns=cols))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise unreadable(fmt, spec.path, e) from None
    label_ids = labels = None
    if with_labels:  # as Spark: CAST(label AS BIGINT), rows without one dropped, then limit
        lab = spark_longs(table.column(spec.label).combine_chunks())
        keep = pc.is_valid(lab)
        table = table.filter(keep)
        lab = lab.filter(keep)
        if spec.limit:
            table, lab = table.slice(0, spec.limit), lab.slice(0, spec.limit)
        if table.num_rows:
            label_ids, labels = _encode(lab)
    if table.num_rows == 0:
        raise no_rows(spec.path, "rows with a label" if with_labels else "rows")
    ids, keys, hashes = _string_keys(table.column(spec.key))
    columns = {c: table.column(c).combine_chunks() for _, c in topo.app_input_columns()}
    return SimInput(ids, keys, hashes, label_ids, labels,
                    f"{fmt}:{spec.path} (key={spec.key!r}, rows={table.num_rows})",
                    columns or None)


def load_input(topo: Topology) -> SimInput:
    """The topology's input stream (generated or read from a file)."""
    with_labels = topo.app.kind == "naive-bayes"
    if topo.input.generated:
        return generated_input(topo, with_labels=with_labels)
    return file_input(topo, with_labels=with_labels)
