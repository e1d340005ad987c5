"""Frequency sketches on 64-bit key hashes: weighted SpaceSaving and lossy counting.

Both have a compiled core (``@njit`` functions over plain numpy arrays, so
groupings can call them from inside their own compiled routing loops) and a
small Python class for everything else.

SpaceSaving (Metwally, Agrawal, El Abbadi, ICDT 2005), *weighted*:
``k`` counters; ``update(key, w)`` adds ``w`` to the key's counter if tracked,
takes a free counter if any, else evicts the smallest counter ``c_min`` and
gives the new key ``c_min + w`` with error ``c_min``. Guarantees, for every
key ``x`` with true weight ``f_x`` out of total weight ``W``:

- a tracked key: ``count_x - error_x <= f_x <= count_x`` and
  ``error_x <= c_min <= W / k`` (never under-counts);
- an untracked key: ``f_x <= c_min`` (0 while counters are free);
- the counters sum to exactly ``W`` (eviction hands the old mass over);
- every key with ``f_x > W / k`` is tracked.

(River's SpaceSaving ignores the weight on eviction - new key gets
``c_min + 1`` - which under-counts with weights; we do not.)

Layout: slot arrays ``keys/counts/errors``, a winner (tournament) tree over
the slots (``tree_slot``/``tree_count``, see ``tree_arrays``) whose root is
the *lowest-slot* minimum counter - a function of the counters alone, not of
the order of past updates - and an open-addressing index (linear probing,
backward-shift deletion) from key to slot. An update is O(1) expected for the
index plus a walk up the tree that stops at the first match the slot did not
win: one step for a key far from the minimum, ``log2 k`` branch-light steps
for an eviction (the root's slot). Ties: the eviction rule used to be "the
binary heap's root", which depended on the heap's history; now it is always
the lowest slot among the minima.

Lossy counting (Manku and Motwani, VLDB 2002) with error ``eps``: buckets of
``w = ceil(1/eps)`` items; a new item enters with ``(f=1, delta=b-1)`` where
``b`` is the current bucket; at each bucket boundary entries with
``f + delta <= b`` are dropped. Guarantees after ``N`` items:
``f_x - eps*N <= f_est(x) <= f_x`` (an untracked item has ``f_x <= eps*N``),
``frequent(s)`` returns every item with ``f_x >= s*N`` and no item with
``f_x < (s - eps)*N``, using at most ``(1/eps) * log(eps*N)`` entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.hashing import mix64_scalar
from runtime.kernels.jit import kernel

EMPTY = -1

_A = np.ndarray
_SSArrays = tuple[_A, _A, _A, _A, _A, _A, _A]
_LCArrays = tuple[_A, _A, _A, _A, _A]

# Compiled kernels here never allocate and run with ``_nrt=False``: with
# numba's reference counting on, every call passing seven arrays costs ~14
# atomic inc/decrefs (measured: 90 ns per SpaceSaving update instead of 5).
# Callers' routing loops should do the same (allocate outside, pass ``out``).

# --------------------------------------------------------------------------
# shared open-addressing index: table[i] = slot id or EMPTY; slot keys in keys[]


@kernel(inline=True)
def _home(key: np.uint64, mask: int) -> np.int64:  # pragma: no cover - compiled
    return np.int64(mix64_scalar(key) & np.uint64(mask))


@kernel(inline=True)
def index_find(keys: np.ndarray, table: np.ndarray, key: np.uint64) -> int:  # pragma: no cover
    """Slot of ``key`` or ``EMPTY``."""
    mask = table.shape[0] - 1
    i = _home(key, mask)
    while True:
        s = table[i]
        if s == EMPTY:
            return EMPTY
        if keys[s] == key:
            return s
        i = (i + 1) & mask


@kernel(inline=True)
def index_insert(keys: np.ndarray, table: np.ndarray, slot: int) -> None:  # pragma: no cover
    """Index ``slot`` under ``keys[slot]`` (the key must not be indexed yet)."""
    mask = table.shape[0] - 1
    i = _home(keys[slot], mask)
    while table[i] != EMPTY:
        i = (i + 1) & mask
    table[i] = slot


@kernel(inline=True)
def index_delete(keys: np.ndarray, table: np.ndarray, key: np.uint64) -> None:  # pragma: no cover
    """Remove ``key`` (must be indexed); backward-shift keeps probe chains intact."""
    mask = table.shape[0] - 1
    i = _home(key, mask)
    while keys[table[i]] != key:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        s = table[j]
        if s == EMPTY:
            break
        k = _home(keys[s], mask)
        # leave s where it is if its home lies cyclically in (i, j]
        if i <= j:
            stays = i < k <= j
        else:
            stays = k > i or k <= j
        if stays:
            continue
        table[i] = s
        i = j
    table[i] = EMPTY


@kernel()
def index_build(keys: np.ndarray, table: np.ndarray, size: int) -> None:  # pragma: no cover
    """Index slots ``0 .. size-1`` into an empty ``table`` (one compiled call
    instead of one dispatch per key from Python)."""
    for s in range(size):
        index_insert(keys, table, s)


# --------------------------------------------------------------------------
# SpaceSaving core: a winner (tournament) tree over the slots


@kernel(inline=True)
def _tree_raise(
    tree_slot: np.ndarray, tree_count: np.ndarray, slot: int, c: float
) -> None:  # pragma: no cover - compiled
    """Slot ``slot``'s count went *up* to ``c``: replay its matches towards the root.

    A node whose old winner was not ``slot`` keeps its winner (the winner beat
    ``slot``'s old count, so it beats the higher one), and so do all nodes
    above it: the walk stops there. A hot key (far from the minimum) stops at
    its first match; an eviction (the root winner) replays ``log2 L`` matches.
    Ties: the left child (lower slots) wins, so the root is the lowest-slot
    minimum. The sibling's winner does not depend on the walk, so its loads
    overlap; the only dependency per level is one compare-and-select.
    """
    node = tree_slot.shape[0] // 2 + slot
    tree_count[node] = c
    w = slot
    while node > 1:
        p = node >> 1
        if tree_slot[p] != slot:
            break
        sib = node ^ 1
        cs = tree_count[sib]
        # the sibling wins if smaller, or equal and on the left (node is a right child)
        take = (cs < c) | ((cs == c) & ((node & 1) == 1))
        if take:
            c = cs
            w = tree_slot[sib]
        tree_count[p] = c
        tree_slot[p] = w
        node = p


@kernel(inline=True)
def _tree_match(
    tree_slot: np.ndarray, tree_count: np.ndarray, node: int
) -> None:  # pragma: no cover - compiled
    """Replay the match at inner ``node``: the child with the smaller count
    wins, ties to the left one (lower slots)."""
    left = 2 * node
    r = left + int(tree_count[left + 1] < tree_count[left])
    tree_count[node] = tree_count[r]
    tree_slot[node] = tree_slot[r]


@kernel(inline=True)
def _tree_fix(tree_slot: np.ndarray, tree_count: np.ndarray, node: int) -> None:  # pragma: no cover
    """Recompute the winners on the path from ``node``'s parent to the root."""
    while node > 1:
        node >>= 1
        _tree_match(tree_slot, tree_count, node)


@kernel(inline=True)
def ss_update_slot(
    keys: np.ndarray,
    counts: np.ndarray,
    errors: np.ndarray,
    tree_slot: np.ndarray,
    tree_count: np.ndarray,
    table: np.ndarray,
    meta: np.ndarray,
    key: np.uint64,
    weight: int,
) -> tuple[int, bool]:  # pragma: no cover - compiled
    """``ss_update`` that also says whether the key is new in its slot.

    A full summary evicts the lowest-slot minimum (the tree's root), which
    depends only on the current counters, never on the order of past updates.
    """
    meta[1] += weight
    s = index_find(keys, table, key)
    if s != EMPTY:
        c = counts[s] + weight
        counts[s] = c
        _tree_raise(tree_slot, tree_count, s, c)
        return s, False
    size = meta[0]
    if size < keys.shape[0]:
        s = size
        keys[s] = key
        counts[s] = weight
        errors[s] = 0
        meta[0] = size + 1
        index_insert(keys, table, s)
        leaf = tree_slot.shape[0] // 2 + s
        tree_count[leaf] = weight  # down from the empty-slot sentinel: a full replay
        _tree_fix(tree_slot, tree_count, leaf)
        return s, True
    # evict the minimum: the new key inherits c_min as (over-)count and error
    s = tree_slot[1]
    c_min = counts[s]
    index_delete(keys, table, keys[s])
    keys[s] = key
    errors[s] = c_min
    counts[s] = c_min + weight
    index_insert(keys, table, s)
    _tree_raise(tree_slot, tree_count, s, c_min + weight)
    return s, True


@kernel(inline=True)
def ss_update(
    keys: np.ndarray,
    counts: np.ndarray,
    errors: np.ndarray,
    tree_slot: np.ndarray,
    tree_count: np.ndarray,
    table: np.ndarray,
    meta: np.ndarray,
    key: np.uint64,
    weight: int,
) -> int:  # pragma: no cover - compiled
    """Add ``weight`` (>= 1) to ``key``; returns the key's slot. ``meta = [size, total]``."""
    s, _ = ss_update_slot(keys, counts, errors, tree_slot, tree_count, table, meta, key, weight)
    return s


@kernel(inline=True)
def ss_reindex(
    keys: np.ndarray,
    counts: np.ndarray,
    tree_slot: np.ndarray,
    tree_count: np.ndarray,
    table: np.ndarray,
    size: int,
) -> None:  # pragma: no cover - compiled
    """Rebuild index and tree over slots ``0 .. size-1`` (after the caller
    rewrote or compacted them); later slots are free. The tree is a function
    of the counters, so later evictions are as if it had been built incrementally."""
    table[:] = EMPTY
    half = tree_slot.shape[0] // 2
    for s in range(size):
        index_insert(keys, table, s)
        tree_count[half + s] = counts[s]
    for s in range(size, half):
        tree_count[half + s] = tree_count[0]  # the empty-slot sentinel
    for node in range(half - 1, 0, -1):
        _tree_match(tree_slot, tree_count, node)


def tree_arrays(capacity: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """An empty winner tree over ``capacity`` slots: ``(tree_slot, tree_count)``.

    ``2L`` nodes (``L`` = ``capacity`` rounded up to a power of two), node 1 the
    root, node ``L + s`` slot ``s``'s leaf, node ``2i``/``2i+1`` the children
    of ``i``; ``tree_slot[i]`` and ``tree_count[i]`` the slot winning at ``i``
    (smallest count, ties to the lower slot) and its count. Free slots hold
    the sentinel ``tree_count[0]`` (largest value of ``dtype``), so they never win.
    """
    half = 1 << max(0, int(capacity - 1).bit_length())
    big = np.iinfo(np.int64).max if np.dtype(dtype).kind in "iu" else np.inf
    tree_slot = np.zeros(2 * half, dtype=np.int64)
    tree_slot[half:] = np.arange(half)
    for node in range(half - 1, 0, -1):
        tree_slot[node] = tree_slot[2 * node]
    return tree_slot, np.full(2 * half, big, dtype=dtype)


@kernel()
def ss_update_many(
    keys: np.ndarray,
    counts: np.ndarray,
    errors: np.ndarray,
    tree_slot: np.ndarray,
    tree_count: np.ndarray,
    table: np.ndarray,
    meta: np.ndarray,
    key_hashes: np.ndarray,
    weights: np.ndarray,
) -> None:  # pragma: no cover - compiled
    for i in range(key_hashes.shape[0]):
        ss_update(
            keys, counts, errors, tree_slot, tree_count, table, meta, key_hashes[i], weights[i]
        )


def index_table_size(capacity: int) -> int:
    return 1 << max(3, int(4 * capacity - 1).bit_length())  # load factor <= 1/4


class SpaceSaving:
    """Weighted SpaceSaving summary with ``capacity`` counters (module docstring).

    ``capacity`` in ``[1, 10_000_000]``. Integer weights ``>= 1``.
    """

    def __init__(self, capacity: int = 100) -> None:
        if not 1 <= capacity <= 10_000_000:
            raise ValueError(f"capacity must be in [1, 10000000] (got {capacity})")
        self.capacity = int(capacity)
        self.keys = np.zeros(capacity, dtype=np.uint64)
        self.counts = np.zeros(capacity, dtype=np.int64)
        self.errors = np.zeros(capacity, dtype=np.int64)
        self.tree_slot, self.tree_count = tree_arrays(capacity, np.int64)
        self.table = np.full(index_table_size(capacity), EMPTY, dtype=np.int64)
        self.meta = np.zeros(2, dtype=np.int64)  # [size, total weight]

    @property
    def arrays(self) -> _SSArrays:
        """The state arrays, in ``ss_update`` argument order."""
        return (
            self.keys,
            self.counts,
            self.errors,
            self.tree_slot,
            self.tree_count,
            self.table,
            self.meta,
        )

    @property
    def size(self) -> int:
        return int(self.meta[0])

    @property
    def total(self) -> int:
        """Total weight seen ``W``."""
        return int(self.meta[1])

    def min_count(self) -> int:
        """``c_min``: the bound on any untracked key's weight (0 while not full)."""
        if self.size < self.capacity:
            return 0
        return int(self.tree_count[1])

    def update(self, key: int, weight: int = 1) -> None:
        if weight < 1:
            raise ValueError(f"weight must be >= 1 (got {weight})")
        ss_update(*self.arrays, np.uint64(key), int(weight))

    def update_many(self, key_hashes: np.ndarray, weights: np.ndarray | None = None) -> None:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        w = np.ones(len(h), dtype=np.int64) if weights is None else np.asarray(weights, np.int64)
        if len(w) != len(h):
            raise ValueError(f"weights has length {len(w)}, key_hashes {len(h)}")
        if len(w) and w.min() < 1:
            raise ValueError(f"weights must be >= 1 (got {int(w.min())})")
        ss_update_many(*self.arrays, h, np.ascontiguousarray(w))

    def estimate(self, key: int) -> int:
        """Upper bound on ``key``'s weight: its counter, or ``c_min`` if untracked."""
        s = index_find(self.keys, self.table, np.uint64(key))
        return self.min_count() if s == EMPTY else int(self.counts[s])

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tracked ``(keys, counts, errors)``, by decreasing count (ties by key)."""
        n = self.size
        k, c, e = self.keys[:n], self.counts[:n], self.errors[:n]
        order = np.lexsort((k, -c))
        return k[order].copy(), c[order].copy(), e[order].copy()

    @classmethod
    def from_items(
        cls, keys: np.ndarray, counts: np.ndarray, errors: np.ndarray, capacity: int, total: int
    ) -> SpaceSaving:
        """A summary holding exactly these counters (``len(keys) <= capacity``)."""
        ss = cls(capacity)
        n = len(keys)
        if n > capacity:
            raise ValueError(f"{n} counters do not fit in capacity {capacity}")
        ss.keys[:n] = keys
        ss.counts[:n] = counts
        ss.errors[:n] = errors
        ss.meta[:] = (n, total)
        ss_reindex(ss.keys, ss.counts, ss.tree_slot, ss.tree_count, ss.table, n)
        return ss


def merge_space_saving(
    summaries: Sequence[SpaceSaving], capacity: int | None = None
) -> SpaceSaving:
    """Merge SpaceSaving summaries of disjoint streams (e.g. per-worker) into one.

    Every key tracked by any input gets ``count = sum_i c_i(x)`` and
    ``error = sum_i e_i(x)``, where for an input that does not track ``x``
    ``c_i(x) = e_i(x) = c_min_i`` (its bound for untracked keys); the
    ``capacity`` (default: the largest input capacity) largest counts are kept.

    Merged error bound (``W = sum_i W_i``, ``k`` = capacity, inputs fresh
    SpaceSaving summaries with ``k_i >= k``):

    - tracked key: ``count - error <= f_x <= count`` and
      ``count - f_x <= error <= sum_i c_min_i <= W / k``;
    - untracked key: ``f_x <= c_min`` of the merged summary, and
      ``c_min <= 2 W / k`` (the kept counts sum to at most
      ``sum_i (W_i + k * c_min_i) <= 2W``).

    The counters no longer sum to ``W`` (missing keys are charged ``c_min_i``).
    """
    if not summaries:
        raise ValueError("summaries must not be empty")
    k = capacity or max(s.capacity for s in summaries)
    per_input = [s.items() for s in summaries]
    mins = [s.min_count() for s in summaries]
    all_keys = np.unique(np.concatenate([it[0] for it in per_input]))
    cnt = np.zeros(len(all_keys), dtype=np.int64)
    err = np.zeros(len(all_keys), dtype=np.int64)
    for (keys, counts, errors), c_min in zip(per_input, mins, strict=True):
        idx = np.searchsorted(all_keys, keys)
        c_i = np.full(len(all_keys), c_min, dtype=np.int64)
        e_i = np.full(len(all_keys), c_min, dtype=np.int64)
        c_i[idx] = counts
        e_i[idx] = errors
        cnt += c_i
        err += e_i
    order = np.lexsort((all_keys, -cnt))[:k]
    total = sum(s.total for s in summaries)
    return SpaceSaving.from_items(all_keys[order], cnt[order], err[order], k, total)


# --------------------------------------------------------------------------
# Lossy counting core: slot arrays keys/f/delta, index table; f == 0 = free slot


@kernel(inline=True)
def lc_update(
    keys: np.ndarray,
    f: np.ndarray,
    delta: np.ndarray,
    table: np.ndarray,
    meta: np.ndarray,
    key: np.uint64,
) -> bool:  # pragma: no cover - compiled
    """Count one item. ``meta = [n_items, size, bucket width w, current bucket
    b = (n_items - 1) // w + 1 for the next item, items left in it]`` (the
    bucket kept as counters: no 64-bit division per item).

    Returns True when the caller must grow the arrays (size above half of
    the slot capacity) before the next update.
    """
    meta[0] += 1
    bucket = meta[3]
    s = index_find(keys, table, key)
    if s != EMPTY:
        f[s] += 1
    else:
        s = meta[1]
        keys[s] = key
        f[s] = 1
        delta[s] = bucket - 1
        meta[1] = s + 1
        index_insert(keys, table, s)
    left = meta[4] - 1
    if left == 0:  # the item closed its bucket
        _lc_prune(keys, f, delta, table, meta, bucket)
        meta[3] = bucket + 1
        left = meta[2]
    meta[4] = left
    return 2 * meta[1] > keys.shape[0]


@kernel(inline=True)
def _lc_prune(
    keys: np.ndarray,
    f: np.ndarray,
    delta: np.ndarray,
    table: np.ndarray,
    meta: np.ndarray,
    bucket: int,
) -> None:  # pragma: no cover - compiled
    """Drop entries with ``f + delta <= bucket``; compact slots and reindex."""
    size = meta[1]
    j = 0
    for s in range(size):
        if f[s] + delta[s] > bucket:
            keys[j] = keys[s]
            f[j] = f[s]
            delta[j] = delta[s]
            j += 1
    for s in range(j, size):
        f[s] = 0
    meta[1] = j
    table[:] = EMPTY
    for s in range(j):
        index_insert(keys, table, s)


@kernel()
def lc_update_many(
    keys: np.ndarray,
    f: np.ndarray,
    delta: np.ndarray,
    table: np.ndarray,
    meta: np.ndarray,
    key_hashes: np.ndarray,
    start: int,
) -> int:  # pragma: no cover - compiled
    """Count ``key_hashes[start:]`` until the arrays must grow; returns the next index."""
    for i in range(start, key_hashes.shape[0]):
        if lc_update(keys, f, delta, table, meta, key_hashes[i]):
            return i + 1
    return key_hashes.shape[0]


class LossyCounting:
    """Manku-Motwani lossy counting with error ``eps`` in ``(0, 1)``."""

    def __init__(self, eps: float = 0.001, initial_slots: int = 1024) -> None:
        if not 0.0 < eps < 1.0:
            raise ValueError(f"eps must be in (0, 1) (got {eps})")
        self.eps = float(eps)
        self.width = int(np.ceil(1.0 / eps))
        # [n_items, size, width, current bucket, items left in it]
        self.meta = np.array([0, 0, self.width, 1, self.width], dtype=np.int64)
        self._alloc(max(16, 1 << int(initial_slots - 1).bit_length()))

    def _alloc(self, slots: int) -> None:
        self.keys = np.zeros(slots, dtype=np.uint64)
        self.f = np.zeros(slots, dtype=np.int64)
        self.delta = np.zeros(slots, dtype=np.int64)
        self.table = np.full(2 * slots, EMPTY, dtype=np.int64)

    def grow(self) -> None:
        """Double the slot capacity, keeping the entries."""
        keys, f, delta = self.keys, self.f, self.delta
        n = int(self.meta[1])
        self._alloc(2 * len(keys))
        self.keys[:n], self.f[:n], self.delta[:n] = keys[:n], f[:n], delta[:n]
        index_build(self.keys, self.table, n)

    @property
    def arrays(self) -> _LCArrays:
        """State arrays in ``lc_update`` argument order (re-fetch after ``grow``)."""
        return (self.keys, self.f, self.delta, self.table, self.meta)

    @property
    def n_items(self) -> int:
        return int(self.meta[0])

    @property
    def size(self) -> int:
        return int(self.meta[1])

    def update(self, key: int) -> None:
        if lc_update(*self.arrays, np.uint64(key)):
            self.grow()

    def update_many(self, key_hashes: np.ndarray) -> None:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        done = 0
        while done < len(h):
            done = lc_update_many(*self.arrays, h, done)
            if done < len(h) or 2 * self.size > len(self.keys):
                self.grow()

    def estimate(self, key: int) -> int:
        """``f_est``: ``f_x - eps*N <= f_est <= f_x`` (0 if untracked)."""
        s = index_find(self.keys, self.table, np.uint64(key))
        return 0 if s == EMPTY else int(self.f[s])

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All tracked ``(keys, f, delta)``."""
        n = self.size
        return self.keys[:n].copy(), self.f[:n].copy(), self.delta[:n].copy()

    def frequent(self, support: float) -> tuple[np.ndarray, np.ndarray]:
        """Items with ``f_est >= (support - eps) * N``: ``(keys, f_est)``, by decreasing f.

        Complete (every item with ``f >= support * N``) for ``support > eps``.
        """
        k, f, _ = self.entries()
        keep = f >= (support - self.eps) * self.n_items
        k, f = k[keep], f[keep]
        order = np.lexsort((k, -f))
        return k[order], f[order]


@kernel()
def set_insert(table: np.ndarray, values: np.ndarray) -> int:  # pragma: no cover - numba
    """Insert ``values`` into ``table``, an open-addressing set of uint64 with
    linear probing (0 marks an empty slot: zeros are skipped; ``len(table)`` a
    power of two, kept at most half full by the caller). Returns how many were
    new."""
    mask = np.uint64(len(table) - 1)
    new = 0
    for v in values:
        if v == 0:
            continue
        i = v & mask
        while True:
            t = table[i]
            if t == v:
                break
            if t == 0:
                table[i] = v
                new += 1
                break
            i = (i + np.uint64(1)) & mask
    return new
