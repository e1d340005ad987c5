"""Gedik's hybrid partitioning function. B. Gedik, "Partitioning functions for
stateful data parallelism in stream processing", VLDB Journal 23(4), 2014.

Lookup (Algorithm 1): an explicit hash table for heavy keys, consistent
hashing (``Ring``) for the rest; O(1) table probe, then a binary search on the
ring. Every ``rebuild_every`` messages of this source the table is rebuilt:

- Frequencies (4.1.2): lossy counting with error ``eps_lc = lc_ratio * delta``
  over the messages since the previous rebuild (a tumbling window [ours]; the
  paper emulates a sliding window with three staggered lossy counters).
- Threshold (4.1.3, 4.1.4, linear resource functions): the tolerated relative
  imbalance ``theta = (alpha - 1) / (1 + alpha / (n - 1))`` (eq. 15) and
  ``delta = sigma * theta / n`` (eq. 17); tracked keys are the lossy-counting
  items with ``f >= delta - eps_lc``.
- Construction (4.2): ``heuristic`` = ``readj`` (default: start from the old
  mapping, apply the move or swap with the best utility gain per frequency
  moved among those that strictly reduce the balance penalty, until none
  reduces the balance penalty; at most 5 moves per item), ``scan`` (items by
  decreasing frequency, each to its best placement) or ``redist`` (repeatedly
  the unplaced item and placement with the best utility per frequency).
  Utility ``U = rho + gamma`` (the paper's default U^APM): balance penalty
  ``rho = (max_w L_w - min_w L_w) / (theta * mean_w L_w)`` and migration
  penalty ``gamma = migrated mass / (tracked mass / n)`` (eqs. 18-19).
  [ours] ``L_w`` is this source's local load: the window's consistent-hash
  traffic per worker (corrected for keys entering/leaving the table) plus the
  tracked keys' counts, rather than tracked keys alone, so the table also
  compensates the hashed tail's imbalance.

Guarantee (paper): O(1) lookup, table size ``<= 1/delta`` keys, one worker
per key between rebuilds; an untracked key carries at most ``delta`` of the
load, i.e. ``sigma`` of the tolerated imbalance. Migration: a rebuild moves
only table keys (the ring is fixed for fixed ``n``); ``stats()`` reports the
moved fraction of state per rebuild (state ~ frequency, ``beta_s(x) = x``:
moved messages of the window / window size) and its ratio to the ideal
``1/n`` of consistent hashing (``relative_migration``, eq. 12).

Tunables:
    rebuild_every: messages between rebuilds, in ``[100, 1e9]`` (default 50_000).
    heuristic: ``"readj"`` (default), ``"scan"`` or ``"redist"``.
    alpha: tolerated max/min load ratio, in ``(1, 10]`` (default 1.2).
    sigma: share of the tolerated imbalance left to untracked keys, in
        ``(0, 1]`` (default 0.1).
    lc_ratio: lossy-counting error as a fraction of ``delta``, in
        ``(0, 1)`` (default 0.1).
    vnodes: virtual nodes per worker on the ring, in ``[1, 100_000]`` (default 100).
    ring_seed: ring seed, identical on every source (default 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.grouping.base import Clock, Grouping, register
from runtime.grouping.ch import MAX_VNODES, Ring, ring_successor
from runtime.kernels.jit import kernel
from runtime.kernels.sketches import EMPTY, LossyCounting, index_build, index_find, lc_update

HEURISTICS = ("readj", "scan", "redist")
MAX_MOVES_PER_ITEM = 5  # the paper's c: "limited and unlimited did not differ"


@kernel()
def _gedik_route(
    key_hashes: np.ndarray,
    start: int,
    out: np.ndarray,
    points: np.ndarray,
    first: np.ndarray,
    shift: np.uint64,
    owners: np.ndarray,
    t_keys: np.ndarray,
    t_workers: np.ndarray,
    t_index: np.ndarray,
    lc_keys: np.ndarray,
    lc_f: np.ndarray,
    lc_delta: np.ndarray,
    lc_index: np.ndarray,
    lc_meta: np.ndarray,
    loads: np.ndarray,
    tail: np.ndarray,
    state: np.ndarray,
    rebuild_every: int,
) -> int:  # pragma: no cover - compiled
    """Route from ``start`` until the batch ends, a rebuild is due or the lossy
    counter must grow; returns the next index. ``state = [m, messages left
    until the next rebuild]`` (a countdown: no division per message)."""
    for i in range(start, key_hashes.shape[0]):
        h = key_hashes[i]
        grow = lc_update(lc_keys, lc_f, lc_delta, lc_index, lc_meta, h)
        s = index_find(t_keys, t_index, h)
        if s != EMPTY:
            w = t_workers[s]
        else:
            w = owners[ring_successor(points, first, shift, h)]
            tail[w] += 1
        loads[w] += 1
        out[i] = w
        state[0] += 1
        left = state[1] - 1
        if left == 0:
            left = rebuild_every
        state[1] = left
        if grow or left == rebuild_every:
            return i + 1
    return key_hashes.shape[0]


@kernel(inline=True)
def _ind(b: bool) -> float:  # pragma: no cover - compiled
    return 1.0 if b else 0.0


@kernel(inline=True)
def _range_after(loads: np.ndarray, a: int, b: int, delta: float) -> float:  # pragma: no cover
    """``max - min`` of ``loads`` after moving ``delta`` from worker ``a`` to ``b``."""
    hi = -1e300
    lo = 1e300
    for w in range(loads.shape[0]):
        x = loads[w]
        if w == a:
            x -= delta
        elif w == b:
            x += delta
        hi = max(hi, x)
        lo = min(lo, x)
    return hi - lo


@kernel()
def _readjust(
    counts: np.ndarray,
    old: np.ndarray,
    loads: np.ndarray,
    assign: np.ndarray,
    moves: np.ndarray,
    scale_rho: float,
    scale_gamma: float,
    mig0: float,
) -> int:  # pragma: no cover - compiled
    """``readj`` (Gedik 4.2, Algorithm 4): improve the previous mapping by moves
    and swaps.

    ``counts[r]``: tracked item r's window count; ``old[r]``: its previous
    worker ``p_t``; ``assign``: the start mapping, improved in place;
    ``loads``: per-worker load without tracked items (float64, scratch: holds
    the final loads on return); ``moves[r]``: times item r moved (at most
    ``MAX_MOVES_PER_ITEM``). Each step applies the move (item to another
    worker) or swap (with a lighter item) with the best utility gain per
    frequency moved among those that strictly reduce the balance penalty;
    stops when none does. Utility ``U = rho + gamma`` with ``scale_rho =
    1/(theta*mean load)``, ``scale_gamma = 1/ideal``; ``mig0``: migration of
    items leaving the table. Returns the number of steps taken.
    """
    n = loads.shape[0]
    r_items = counts.shape[0]
    mig = mig0
    steps = 0
    for r in range(r_items):
        loads[assign[r]] += counts[r]
    while True:
        imax = 0
        imin = 0
        for w in range(n):
            if loads[w] > loads[imax]:
                imax = w
            if loads[w] < loads[imin]:
                imin = w
        rng0 = loads[imax] - loads[imin]
        u = rng0 * scale_rho + mig * scale_gamma
        best_gain = -1e300  # Algorithm 4: g <- -inf; any balance gain qualifies
        best_a = -1
        best_b = -1
        best_j = -1
        best_dm = 0.0
        for a in range(r_items):
            if moves[a] >= MAX_MOVES_PER_ITEM:
                continue
            wa = assign[a]
            ca = counts[a]
            # moves a -> j (transfer ca from wa to j)
            for j in range(n):
                if j == wa or not (wa == imax or j == imin):
                    continue
                new_rng = _range_after(loads, wa, j, ca)
                if new_rng >= rng0:
                    continue
                dm = ca * (_ind(old[a] == wa) - _ind(old[a] == j))
                gain = (u - (new_rng * scale_rho + (mig + dm) * scale_gamma)) / ca
                if gain > best_gain:
                    best_gain, best_a, best_b, best_j, best_dm = gain, a, -1, j, dm
            # swaps a <-> b with a heavier (transfer ca - cb from wa to wb)
            for b in range(r_items):
                wb = assign[b]
                cb = counts[b]
                if wb == wa or cb >= ca or moves[b] >= MAX_MOVES_PER_ITEM:
                    continue
                if not (wa == imax or wb == imin):
                    continue
                new_rng = _range_after(loads, wa, wb, ca - cb)
                if new_rng >= rng0:
                    continue
                dm = ca * (_ind(old[a] == wa) - _ind(old[a] == wb)) + cb * (
                    _ind(old[b] == wb) - _ind(old[b] == wa)
                )
                gain = (u - (new_rng * scale_rho + (mig + dm) * scale_gamma)) / (ca - cb)
                if gain > best_gain:
                    best_gain, best_a, best_b, best_j, best_dm = gain, a, b, wb, dm
        if best_a < 0:
            break
        wa = assign[best_a]
        if best_b < 0:
            loads[wa] -= counts[best_a]
            loads[best_j] += counts[best_a]
        else:
            d = counts[best_a] - counts[best_b]
            loads[wa] -= d
            loads[best_j] += d
            assign[best_b] = wa
            moves[best_b] += 1
        assign[best_a] = best_j
        moves[best_a] += 1
        mig += best_dm
        steps += 1
    return steps


@kernel(inline=True)
def _candidate(old_w: int, k: int) -> int:  # pragma: no cover - compiled
    """The ``k``-th worker (``k`` in ``[0, n)``) tried for an item last on
    ``old_w``: ``old_w`` first, so ties avoid migration, then the others
    ascending."""
    return old_w if k == 0 else (k - 1 if k - 1 < old_w else k)


@kernel(inline=True)
def _utility_with(
    loads: np.ndarray,
    w: int,
    c: float,
    old_w: int,
    mig: float,
    scale_rho: float,
    scale_gamma: float,
) -> float:  # pragma: no cover - compiled
    """Utility ``U = rho + gamma`` once an item of count ``c``, last on
    ``old_w``, is placed on worker ``w`` (``loads`` is left as it was)."""
    n = loads.shape[0]
    loads[w] += c
    hi = loads[0]
    lo = loads[0]
    for v in range(1, n):
        hi = max(hi, loads[v])
        lo = min(lo, loads[v])
    loads[w] -= c
    dm = c if w != old_w else 0.0
    return (hi - lo) * scale_rho + (mig + dm) * scale_gamma


@kernel(inline=True)
def _place(
    counts: np.ndarray,
    old: np.ndarray,
    loads: np.ndarray,
    assign: np.ndarray,
    r: int,
    w: int,
    mig: float,
) -> float:  # pragma: no cover - compiled
    """Place item ``r`` on worker ``w``; returns the migration so far."""
    assign[r] = w
    loads[w] += counts[r]
    if w != old[r]:
        mig += counts[r]
    return mig


@kernel()
def _scan(
    counts: np.ndarray,
    old: np.ndarray,
    loads: np.ndarray,
    assign: np.ndarray,
    scale_rho: float,
    scale_gamma: float,
    mig0: float,
) -> int:  # pragma: no cover - compiled
    """``scan`` (Gedik 4.2): build the mapping from scratch, placing the items
    in the order given (``counts`` sorted decreasing), each on the worker where
    the utility ``U = rho + gamma`` is lowest (tried from its old worker on, so
    ties avoid migration). ``assign`` gets the mapping; ``loads``, ``old``,
    ``scale_rho``, ``scale_gamma``, ``mig0`` as for ``_readjust``. Returns the
    number of steps taken (one per item).
    """
    n = loads.shape[0]
    r_items = counts.shape[0]
    mig = mig0
    for r in range(r_items):
        best_u = 1e300
        best_w = -1
        for k in range(n):
            w = _candidate(old[r], k)
            util = _utility_with(loads, w, counts[r], old[r], mig, scale_rho, scale_gamma)
            if util < best_u:
                best_u, best_w = util, w
        mig = _place(counts, old, loads, assign, r, best_w, mig)
    return r_items


@kernel()
def _redist(
    counts: np.ndarray,
    old: np.ndarray,
    loads: np.ndarray,
    assign: np.ndarray,
    placed: np.ndarray,
    scale_rho: float,
    scale_gamma: float,
    mig0: float,
) -> int:  # pragma: no cover - compiled
    """``redist`` (Gedik 4.2): build the mapping from scratch, one item per
    step: among all unplaced items and workers, the placement with the lowest
    utility per frequency ``U / count`` (workers tried from the item's old one
    on, so ties avoid migration). ``placed`` (all 0 on entry) marks the placed
    items; ``assign`` gets the mapping; ``loads``, ``old``, ``scale_rho``,
    ``scale_gamma``, ``mig0`` as for ``_readjust``. Returns the number of
    steps taken (one per item).
    """
    n = loads.shape[0]
    r_items = counts.shape[0]
    mig = mig0
    for _ in range(r_items):
        best_u = 1e300
        best_r = -1
        best_w = -1
        for r in range(r_items):
            if placed[r]:
                continue
            for k in range(n):
                w = _candidate(old[r], k)
                util = _utility_with(loads, w, counts[r], old[r], mig, scale_rho, scale_gamma)
                util /= counts[r]
                if util < best_u:
                    best_u, best_r, best_w = util, r, w
        placed[best_r] = 1
        mig = _place(counts, old, loads, assign, best_r, best_w, mig)
    return r_items


@register
class GedikPartitioning(Grouping):
    """Hybrid explicit-table + consistent-hash partitioning (module docstring)."""

    name = "gedik"

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        rebuild_every: int = 50_000,
        heuristic: str = "readj",
        alpha: float = 1.2,
        sigma: float = 0.1,
        lc_ratio: float = 0.1,
        vnodes: int = 100,
        ring_seed: int = 0,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        if not 100 <= rebuild_every <= 1_000_000_000:
            raise ValueError(f"rebuild_every must be in [100, 1e9] (got {rebuild_every})")
        if heuristic not in HEURISTICS:
            raise ValueError(f"heuristic must be one of {HEURISTICS} (got {heuristic!r})")
        if not 1.0 < alpha <= 10.0:
            raise ValueError(f"alpha must be in (1, 10] (got {alpha})")
        if not 0.0 < sigma <= 1.0:
            raise ValueError(f"sigma must be in (0, 1] (got {sigma})")
        if not 0.0 < lc_ratio < 1.0:
            raise ValueError(f"lc_ratio must be in (0, 1) (got {lc_ratio})")
        if not 1 <= vnodes <= MAX_VNODES:
            raise ValueError(f"vnodes must be in [1, {MAX_VNODES}] (got {vnodes})")
        n = self.n_workers
        self.rebuild_every = int(rebuild_every)
        self.heuristic = heuristic
        self.alpha = float(alpha)
        self.sigma = float(sigma)
        self.theta = (alpha - 1.0) / (1.0 + alpha / (n - 1)) if n > 1 else alpha - 1.0
        self.delta = self.sigma * self.theta / n
        self.lc_eps = lc_ratio * self.delta
        self.ring = Ring(n, vnodes=int(vnodes), seed=int(ring_seed))
        self.loads = np.zeros(n, dtype=np.int64)
        self._tail = np.zeros(n, dtype=np.int64)  # ring-routed messages this window
        self._state = np.array([0, self.rebuild_every], dtype=np.int64)  # [m, left]
        self._lc = LossyCounting(self.lc_eps)
        self._set_table(np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int32))
        self.rebuild_log: list[dict[str, float]] = []

    # -- explicit table -------------------------------------------------
    def _set_table(self, keys: np.ndarray, workers: np.ndarray) -> None:
        size = max(4, 1 << int(2 * len(keys)).bit_length())
        self._t_keys = np.ascontiguousarray(keys, dtype=np.uint64)
        self._t_workers = np.ascontiguousarray(workers, dtype=np.int32)
        self._t_index = np.full(2 * size, EMPTY, dtype=np.int64)
        index_build(self._t_keys, self._t_index, len(keys))

    @property
    def table(self) -> dict[int, int]:
        """The explicit hash: heavy key hash -> worker."""
        return dict(zip(self._t_keys.tolist(), self._t_workers.tolist(), strict=True))

    def lookup(self, key_hashes: np.ndarray) -> np.ndarray:
        """Where each key goes now (table first, then the ring); no state change."""
        h = np.asarray(key_hashes, dtype=np.uint64)
        out = self.ring.lookup(h).astype(np.int32)
        table = self.table
        for i, k in enumerate(h.tolist()):
            if k in table:
                out[i] = table[k]
        return out

    # -- routing --------------------------------------------------------
    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int32)
        i = 0
        while i < len(h):
            i = _gedik_route(
                h, i, out, self.ring.points, self.ring.first, self.ring.shift, self.ring.owners,
                self._t_keys, self._t_workers, self._t_index, *self._lc.arrays,
                self.loads, self._tail, self._state, self.rebuild_every,
            )  # fmt: skip
            if 2 * self._lc.size > len(self._lc.keys):
                self._lc.grow()
            if self._state[0] % self.rebuild_every == 0 and self._state[0] > 0:
                self.rebuild()
        return self._live(h, out)

    def rebuild(self) -> dict[str, float]:
        """Rebuild the explicit table from this window's frequencies (Gedik 4.2)."""
        n = self.n_workers
        window = max(1, self._lc.n_items)
        new_keys, new_counts = self._lc.frequent(self.delta)
        old_keys = self._t_keys
        old_workers = self._t_workers
        old_map = dict(zip(old_keys.tolist(), old_workers.tolist(), strict=True))
        new_set = set(new_keys.tolist())
        # items leaving the table fall back to the ring: their migration is fixed
        gone = np.array([k for k in old_keys.tolist() if k not in new_set], dtype=np.uint64)
        gone_counts = np.array([self._lc.estimate(int(k)) for k in gone], dtype=np.float64)
        gone_ring = self.ring.lookup(gone) if len(gone) else np.empty(0, dtype=np.int32)
        gone_old = np.array([old_map[int(k)] for k in gone], dtype=np.int32)
        mig0 = float(gone_counts[gone_ring != gone_old].sum())
        ring_new = self.ring.lookup(new_keys) if len(new_keys) else np.empty(0, dtype=np.int32)
        old_new = np.array(
            [old_map.get(k, int(r)) for k, r in zip(new_keys.tolist(), ring_new, strict=True)],
            dtype=np.int32,
        )
        counts = new_counts.astype(np.float64)
        # base load: the window's ring traffic, minus keys now tracked (they were
        # ring-routed unless already in the table), plus keys leaving the table
        base = self._tail.astype(np.float64)
        was_ring = np.array([k not in old_map for k in new_keys.tolist()], dtype=bool)
        np.subtract.at(base, ring_new[was_ring], counts[was_ring])
        np.add.at(base, gone_ring, gone_counts)
        np.maximum(base, 0.0, out=base)
        mean_load = (base.sum() + counts.sum()) / n
        scale_rho = 1.0 / (self.theta * mean_load) if mean_load > 0 else 0.0
        ideal = (counts.sum() + gone_counts.sum()) / n
        scale_gamma = 1.0 / ideal if ideal > 0 else 0.0
        assign = old_new.copy()
        if self.heuristic == "readj":
            moves = np.zeros(len(counts), dtype=np.int64)
            steps = _readjust(counts, old_new, base, assign, moves, scale_rho, scale_gamma, mig0)
        elif self.heuristic == "scan":  # in frequent()'s order: by decreasing frequency
            steps = _scan(counts, old_new, base, assign, scale_rho, scale_gamma, mig0)
        else:
            placed = np.zeros(len(counts), dtype=np.int64)
            steps = _redist(counts, old_new, base, assign, placed, scale_rho, scale_gamma, mig0)
        moved = assign != old_new
        moved_mass = mig0 + float(counts[moved].sum())
        moved_keys = int(moved.sum()) + int((gone_ring != gone_old).sum())
        self._set_table(new_keys, assign)
        fraction = moved_mass / window
        entry = {
            "at_message": float(self._state[0]),
            "tracked": float(len(new_keys)),
            "steps": float(steps),
            "moved_keys": float(moved_keys),
            "migration_fraction": fraction,
            "relative_migration": fraction * n,
            "expected_imbalance": float((base.max() - base.mean()) / window),
        }
        self.rebuild_log.append(entry)
        self.migrations += moved_keys
        self._lc = LossyCounting(self.lc_eps, initial_slots=len(self._lc.keys))
        self._tail[:] = 0
        return entry

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        log = self.rebuild_log
        s["rebuilds"] = len(log)
        s["table_size"] = len(self._t_keys)
        s["migration_fraction"] = [e["migration_fraction"] for e in log]
        s["relative_migration"] = [e["relative_migration"] for e in log]
        s["migration_fraction_mean"] = float(np.mean(s["migration_fraction"])) if log else 0.0
        s["ideal_migration_fraction"] = 1.0 / self.n_workers
        return s
