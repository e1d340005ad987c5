"""``HeavyHitters``: the ``top_k`` most frequent keys from weighted SpaceSaving.

Weighted SpaceSaving summaries (``runtime.kernels.sketches``), merged one-sidedly:

- ``add`` buffers the batch's ``key_hash`` (uint64, shipped by the source;
  ``runtime.hashing.hash_arrow`` if absent) and ``key`` arrays;
- the buffer is folded into the worker's SpaceSaving sketch (``counters``
  counters over key hashes) at ``compact`` and whenever it exceeds
  ``COMPACT_ROWS`` rows: each distinct hash of the buffer is one weighted
  update with its exact count there, in a fixed order (count descending,
  then hash), so the worker's summary depends only on its rows between folds;
- ``compact`` freezes the sketch into a summary ``(hashes, counts, errors,
  capacity, total)`` with the names (original keys) of its tracked hashes;
- ``merge`` collects summaries and folds them with
  ``runtime.kernels.sketches.merge_space_saving`` every ``fold_every`` (one-level merge
  of fresh summaries: ``error <= W / counters``); each fold keeps the one-sided
  guarantees exactly: every reported ``count`` is an upper bound on the key's
  true count and ``count - error`` a lower bound.

With ``counters`` >= the distinct keys, nothing is evicted and the result is
exact (``error == 0``), equal to Spark's top-k.
A 64-bit collision between two keys would merge them (negligible below
billions of keys).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.operators.state import SlottedState
from runtime.operators.tables import (
    COMPACT_ROWS,
    HEAVY_HITTERS_SCHEMA,
    chunked,
    sort_result,
    string_keys,
)

if TYPE_CHECKING:
    from runtime.kernels.sketches import SpaceSaving

_STRING = pa.string()

#: a frozen summary: (hashes uint64, counts int64, errors int64, capacity, total)
Summary = tuple[np.ndarray, np.ndarray, np.ndarray, int, int]


class HeavyHittersState(SlottedState):
    """A live sketch plus its unfed buffer (worker side), frozen summaries
    (after ``compact``/``merge``) and the names of the tracked hashes."""

    __slots__ = ("sketch", "hashes", "keys", "raw_rows", "parts", "names")

    def __init__(self) -> None:
        self.sketch: SpaceSaving | None = None
        self.hashes: list[np.ndarray] = []
        self.keys: list[pa.Array | pa.ChunkedArray] = []
        self.raw_rows = 0
        self.parts: list[Summary] = []
        self.names: dict[int, str | None] = {}

    def __repr__(self) -> str:
        return (f"HeavyHittersState(raw_rows={self.raw_rows}, parts={len(self.parts)}, "
                f"live={self.sketch is not None})")


class HeavyHitters:
    """Top ``top_k`` keys by count from ``counters``-counter SpaceSaving
    summaries: result ``key``, ``count``, ``error`` (int64), by count
    descending then key; ``count - error <= true count <= count``."""

    mergeable = True
    wants_key_hash = True
    columns: tuple[str, ...] = ()

    def __init__(self, counters: int = 1000, top_k: int = 100, fold_every: int = 64) -> None:
        for name, v, hi in (("counters", counters, 10_000_000), ("top_k", top_k, None),
                            ("fold_every", fold_every, None)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 or (
                    hi is not None and v > hi):
                rng = f"in [1, {hi}]" if hi else ">= 1"
                raise ValueError(f"app.{name}: must be an integer {rng} (got {v!r})")
        self.counters = int(counters)
        self.top_k = int(top_k)
        self.fold_every = int(fold_every)

    def create(self) -> HeavyHittersState:
        return HeavyHittersState()

    def add(self, state: HeavyHittersState, batch: pa.RecordBatch) -> HeavyHittersState:
        keys = batch.column("key")
        i = batch.schema.get_field_index("key_hash")
        if i >= 0:
            hashes = np.asarray(batch.column(i))
        else:
            from runtime.hashing import hash_arrow

            hashes = hash_arrow(keys)
        state.hashes.append(hashes)
        state.keys.append(keys)
        state.raw_rows += len(hashes)
        if state.raw_rows > COMPACT_ROWS:
            self._feed(state)
        return state

    def _feed(self, state: HeavyHittersState) -> None:
        """Fold the buffer into the live sketch (one weighted update per
        distinct hash, count descending then hash) and keep the names of the
        tracked hashes only."""
        if not state.raw_rows:
            return
        from runtime.kernels.sketches import SpaceSaving

        h = np.concatenate(state.hashes) if len(state.hashes) > 1 else state.hashes[0]
        h = np.ascontiguousarray(h, dtype=np.uint64)
        keys = chunked([string_keys(k) for k in state.keys], _STRING)
        h_arr = pa.array(h)
        vc = pc.value_counts(h_arr)
        uniq = vc.field(0).to_numpy()
        counts = vc.field(1).to_numpy().astype(np.int64)
        order = np.lexsort((uniq, -counts))
        if state.sketch is None:
            state.sketch = SpaceSaving(self.counters)
        sk = state.sketch
        sk.update_many(uniq[order], counts[order])
        tracked = sk.keys[: sk.size]
        known = state.names
        need = uniq[np.isin(uniq, tracked)]
        if len(known):
            need = need[~np.isin(need, np.fromiter(known, np.uint64, len(known)))]
        if len(need):
            first = pc.index_in(pa.array(need), value_set=h_arr)
            known.update(zip(need.tolist(), keys.take(first).to_pylist(), strict=True))
        if len(known) > sk.size:
            state.names = {x: known[x] for x in tracked.tolist()}
        state.hashes, state.keys, state.raw_rows = [], [], 0

    def _freeze(self, state: HeavyHittersState) -> HeavyHittersState:
        """Live sketch -> a frozen summary (in place; same stream summarized)."""
        self._feed(state)
        sk = state.sketch
        if sk is not None:
            if sk.size:
                h, c, e = sk.items()
                state.parts.append((h, c, e, sk.capacity, sk.total))
            state.sketch = None
        return state

    def _fold(self, state: HeavyHittersState) -> None:
        from runtime.kernels.sketches import SpaceSaving, merge_space_saving

        if len(state.parts) < 2:
            return
        merged = merge_space_saving([SpaceSaving.from_items(*p) for p in state.parts],
                                    capacity=self.counters)
        h, c, e = merged.items()
        state.parts = [(h, c, e, merged.capacity, merged.total)]
        names = state.names
        state.names = {x: names[x] for x in h.tolist()}

    def compact(self, state: HeavyHittersState) -> HeavyHittersState:
        return self._freeze(state)

    def merge(self, a: HeavyHittersState, b: HeavyHittersState) -> HeavyHittersState:
        self._freeze(a)
        self._freeze(b)
        if len(b.names) > len(a.names):
            a, b = b, a
        out = HeavyHittersState()
        out.parts = a.parts + b.parts
        out.names = a.names  # the larger dict, updated in place (a is consumed)
        out.names.update(b.names)
        if len(out.parts) > self.fold_every:
            self._fold(out)
        return out

    def finish(self, state: HeavyHittersState) -> pa.Table:
        self._freeze(state)
        self._fold(state)
        if not state.parts:
            return HEAVY_HITTERS_SCHEMA.empty_table()
        h, c, e, _, _ = state.parts[0]
        names = state.names
        t = pa.table(
            {
                "key": pa.array([names[x] for x in h.tolist()], type=pa.string()),
                "count": pa.array(c, type=pa.int64()),
                "error": pa.array(e, type=pa.int64()),
            },
            schema=HEAVY_HITTERS_SCHEMA,
        )
        return sort_result(t, "heavy-hitters").slice(0, self.top_k)

    def __repr__(self) -> str:
        return f"HeavyHitters(counters={self.counters}, top_k={self.top_k})"


__all__ = ["HeavyHitters", "HeavyHittersState"]
