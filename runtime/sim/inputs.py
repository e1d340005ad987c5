"""The simulator's input: a message stream as dense key ids plus a key table.

- Generated formats (``zipf``, ``evolving-zipf``) use the very functions of
  ``runtime.generators`` that Spark runs, so both engines see the same
  stream, message for message (``generate`` = ``key_ids`` + ``k<id>``
  strings; only the distinct keys are turned into strings and hashed here).
- File formats (parquet, csv, json = newline-delimited JSON) are read with
  pyarrow directly: the simulator is the fast what-if tool. The real runtime
  reads the same files through Spark (RayDP); row order is the file's order.
  ``input.limit`` keeps the first rows; ``input.key`` names the routing key.

Keys keep their original value for results (as strings: the result table's
``key`` column is a string, DESIGN.md); hashing follows ``runtime.hashing``
(strings with Murmur3, integers with ``fmix64``, null = ``NULL_HASH``), so a
key routes exactly as in the real runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from runtime import generators
from runtime.hashing import hash_keys
from runtime.topology import Topology, TopologyError

#: generated streams are produced in chunks of this many messages
GEN_CHUNK = 1 << 21


@dataclass
class SimInput:
    """A stream of ``n`` messages over ``len(keys)`` distinct keys.

    ``key_ids[i]`` indexes ``keys`` (the original keys, as strings) and
    ``key_hashes`` (their 64-bit routing hashes). ``label_ids``/``labels``
    hold naive-bayes classes (None for other apps).
    """

    key_ids: np.ndarray
    keys: pa.Array
    key_hashes: np.ndarray
    label_ids: np.ndarray | None = None
    labels: pa.Array | None = None
    description: str = ""

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
    desc = (f"{spec.format}(messages={n}, keys={spec.keys}, skew={spec.skew}, "
            f"seed={spec.seed}{f', shift_every={shift}' if shift else ''})")
    return SimInput(dense, keys, hash_keys(strings), label_ids, labels, desc)


def _encode(col: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Dictionary-encode a column: (int ids, distinct values), nulls as one value."""
    enc = pc.dictionary_encode(col, null_encoding="encode").combine_chunks()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int32), enc.dictionary


def _hash_values(values: pa.Array) -> np.ndarray:
    t = values.type
    if pa.types.is_integer(t) and values.null_count == 0:
        return hash_keys(values.to_numpy(zero_copy_only=False).astype(np.int64))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_integer(t):
        return hash_keys(values.to_pylist())
    # other types (float, date, ...) route by their string form, as in Spark's cast
    return hash_keys(pc.cast(values, pa.string()).to_pylist())


def file_input(topo: Topology, *, with_labels: bool) -> SimInput:
    spec = topo.input
    path = topo.input_path()
    assert path is not None
    if not path.exists():
        raise TopologyError(f"input.path: file not found (got {spec.path!r})")
    fmt = spec.format
    try:
        dataset = ds.dataset(str(path), format=fmt)
    except (pa.ArrowInvalid, OSError) as e:
        raise TopologyError(f"input.path: cannot read as {fmt} ({str(e).splitlines()[0]})") from None
    names = dataset.schema.names
    cols = [spec.key] + ([spec.label] if with_labels else [])
    for field, col in zip(("input.key", "input.label"), cols, strict=False):
        if col not in names:
            raise TopologyError(
                f"{field}: column {col!r} not in {spec.path} (columns: {', '.join(names)})")
    try:
        table = (dataset.head(spec.limit, columns=cols) if spec.limit
                 else dataset.to_table(columns=cols))
    except (pa.ArrowInvalid, OSError) as e:
        raise TopologyError(f"input.path: cannot read as {fmt} ({str(e).splitlines()[0]})") from None
    ids, values = _encode(table.column(spec.key))
    hashes = _hash_values(values)
    keys = values if pa.types.is_string(values.type) else pc.cast(values, pa.string())
    label_ids = labels = None
    if with_labels:
        label_ids, labels = _encode(table.column(spec.label))
    return SimInput(ids, keys, hashes, label_ids, labels,
                    f"{fmt}:{spec.path} (key={spec.key!r}, rows={table.num_rows})")


def load_input(topo: Topology) -> SimInput:
    """The topology's input stream (generated or read from a file)."""
    with_labels = topo.app.kind == "naive-bayes"
    if topo.input.generated:
        return generated_input(topo, with_labels=with_labels)
    return file_input(topo, with_labels=with_labels)
