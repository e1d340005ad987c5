"""CH - consistent hashing with virtual nodes. Karger et al., STOC 1997.

Each worker owns ``vnodes`` points on a 64-bit ring (``mmh3`` of
``f"{worker}:{replica}"``, seeded); a key goes to the owner of the first point
clockwise from its hash (``points[i] >= h``, wrapping around).

Guarantee: one worker per key (memory-optimal, like KG), and elasticity with
minimal movement: adding a worker moves only keys *to* it, removing a worker
moves only *its* keys, ~1/n of the key space either way; no other key changes
owner. With ``V`` virtual nodes a worker's share of the ring is within
``O(sqrt(log n / V))`` of ``1/n`` w.h.p.; load under skew is still KG-like.

The ``Ring`` class is shared (CHBL, Gedik, FISH build on it): ``points``
(sorted ``uint64``), ``owners`` (``int32``), ``lookup``, ``successor_index``,
``add_worker``, ``remove_worker``, ``set_workers``; ``ring_distinct_successors``
is the compiled clockwise walk collecting the first ``d`` distinct workers.
``RingMembership`` is the base of the schemes whose live workers are exactly
their ring's (CH, FISH).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import mmh3
import numpy as np
from numba import njit

from runtime.grouping.base import Clock, Grouping, register
from runtime.kernels.jit import kernel

MAX_VNODES = 100_000


def vnode_points(worker: int, vnodes: int, seed: int = 0) -> np.ndarray:
    """The ring positions of ``worker``'s ``vnodes`` virtual nodes (``uint64``).

    ``mmh3.hash64(f"{worker}:{replica}", seed)`` (first 64 bits, unsigned);
    the seed is taken modulo ``2**32`` (Murmur3's seed width). A point depends
    only on ``(worker, replica, seed)``, so every source builds the same ring
    and adding a worker never moves another worker's points.
    """
    s = int(seed) & 0xFFFFFFFF
    h64 = mmh3.hash64
    return np.fromiter(
        (h64(f"{worker}:{r}".encode(), s, signed=False)[0] for r in range(vnodes)),
        dtype=np.uint64,
        count=vnodes,
    )


class Ring:
    """A consistent-hash ring: ``vnodes`` points per worker, sorted.

    ``points`` is sorted ascending (ties, astronomically rare, broken by owner
    id so the order is deterministic); ``owners[i]`` owns ``points[i]``. Keys
    are placed at their 64-bit hash as given (callers pass key hashes
    unchanged). A key's owner is the clockwise successor: the first point
    ``>= h``, wrapping to index 0 past the largest point.
    """

    def __init__(self, n_workers: int, vnodes: int = 100, seed: int = 0) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1 (got {n_workers})")
        if not 1 <= vnodes <= MAX_VNODES:
            raise ValueError(f"vnodes must be in [1, {MAX_VNODES}] (got {vnodes})")
        self.vnodes = int(vnodes)
        self.seed = int(seed)
        self._workers: set[int] = set()
        self.points = np.empty(0, dtype=np.uint64)
        self.owners = np.empty(0, dtype=np.int32)
        self._insert(range(int(n_workers)))

    @property
    def workers(self) -> list[int]:
        """The workers currently on the ring, ascending."""
        return sorted(self._workers)

    def __len__(self) -> int:
        return len(self.points)

    def _insert(self, workers: Iterable[int]) -> None:
        new = [int(w) for w in workers if int(w) not in self._workers]
        if not new:
            return
        for w in new:
            if w < 0:
                raise ValueError(f"worker ids must be >= 0 (got {w})")
        pts = [self.points] + [vnode_points(w, self.vnodes, self.seed) for w in new]
        own = [self.owners] + [np.full(self.vnodes, w, dtype=np.int32) for w in new]
        points = np.concatenate(pts)
        owners = np.concatenate(own)
        order = np.lexsort((owners, points))  # by point, then owner
        self.points = np.ascontiguousarray(points[order])
        self.owners = np.ascontiguousarray(owners[order])
        self._workers.update(new)
        self._build_index()

    def _build_index(self) -> None:
        """Bucket table over the top bits of the hash: the successor of ``h``
        is found by scanning from ``first[h >> shift]`` (~0.25 steps on average
        with 4 buckets per point) instead of a binary search."""
        bits = max(1, min(24, int(np.ceil(np.log2(max(2, len(self.points))))) + 2))
        self._shift = np.uint64(64 - bits)
        starts = np.arange(1 << bits, dtype=np.uint64) << self._shift
        self._first = np.searchsorted(self.points, starts, side="left").astype(np.int64)

    @property
    def first(self) -> np.ndarray:
        """Bucket index: ``first[b]`` = first point ``>= b << shift`` (``int64``)."""
        return self._first

    @property
    def shift(self) -> np.uint64:
        """The bucket of hash ``h`` is ``h >> shift``."""
        return self._shift

    def add_worker(self, worker: int) -> None:
        """Add ``worker``'s virtual nodes; other points stay where they are."""
        self._insert([worker])

    def remove_worker(self, worker: int) -> None:
        """Remove ``worker``'s virtual nodes; other points stay where they are.

        Raises ``ValueError`` if ``worker`` is not on the ring or is the last one.
        """
        worker = int(worker)
        if worker not in self._workers:
            raise ValueError(f"worker {worker} is not on the ring")
        if len(self._workers) == 1:
            raise ValueError(f"cannot remove worker {worker}: the ring would be empty")
        keep = self.owners != worker
        self.points = np.ascontiguousarray(self.points[keep])
        self.owners = np.ascontiguousarray(self.owners[keep])
        self._workers.discard(worker)
        self._build_index()

    def set_workers(self, alive: Iterable[int]) -> int:
        """Put exactly ``alive`` on the ring: new workers' points are added first,
        then departed workers' are removed (only their keys move). Returns the
        number of virtual nodes added or removed."""
        target = {int(w) for w in alive}
        if not target:
            raise ValueError("alive must contain at least one worker")
        if min(target) < 0:
            raise ValueError(f"worker ids must be >= 0 (got {min(target)})")
        current = set(self._workers)
        for w in sorted(target - current):
            self.add_worker(w)
        for w in sorted(current - target):
            self.remove_worker(w)
        return self.vnodes * len(target ^ current)

    def successor_index(self, key_hashes: np.ndarray) -> np.ndarray:
        """Index into ``points`` of each key's clockwise successor (``int64``)."""
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int64)
        ring_successors(self.points, self._first, self._shift, h, out)
        return out

    def lookup(self, key_hashes: np.ndarray) -> np.ndarray:
        """The worker owning each key (``int32``), vectorized."""
        return self.owners[self.successor_index(key_hashes)]

    def distinct_successors(self, key_hash: int, d: int) -> np.ndarray:
        """The first ``min(d, #workers)`` distinct workers clockwise from one key."""
        start = int(self.successor_index(np.array([key_hash], dtype=np.uint64))[0])
        out = np.empty(max(1, d), dtype=np.int32)
        seen = np.zeros(int(self.owners.max()) + 1, dtype=np.int64)
        k = ring_distinct_successors(self.owners, start, d, out, seen, 1)
        return out[:k].copy()


@kernel(inline=True)
def ring_successor(
    points: np.ndarray, first: np.ndarray, shift: np.uint64, h: np.uint64
) -> int:  # pragma: no cover - compiled
    """Index of the first ring point ``>= h``, wrapping to 0: the bucket index
    (``first[h >> shift]``, ~0.25 scan steps) instead of a binary search (~10
    unpredictable branches). For compiled loops; ``Ring.successor_index`` is
    the vectorized form."""
    n_points = points.shape[0]
    i = first[h >> shift]
    while i < n_points and points[i] < h:
        i += 1
    return i if i < n_points else 0


@njit(cache=True)
def ring_successors(
    points: np.ndarray, first: np.ndarray, shift: np.uint64, key_hashes: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """``out[j]`` = index of the first point ``>= key_hashes[j]``, wrapping to 0."""
    for j in range(key_hashes.shape[0]):
        out[j] = ring_successor(points, first, shift, key_hashes[j])


@njit(cache=True)
def ring_distinct_successors(
    owners: np.ndarray, start: int, d: int, out: np.ndarray, seen: np.ndarray, stamp: int
) -> int:  # pragma: no cover - compiled
    """Walk clockwise from ``start``, writing the first ``d`` distinct owners to ``out``.

    ``seen`` is a per-worker scratch array (size > max worker id) marked with
    ``stamp``: pass a fresh stamp per call to avoid clearing it. Returns how
    many workers were written (``< d`` only if the ring has fewer workers).
    """
    n_points = owners.shape[0]
    k = 0
    i = start
    for _ in range(n_points):
        w = owners[i]
        if seen[w] != stamp:
            seen[w] = stamp
            out[k] = w
            k += 1
            if k >= d:
                break
        i += 1
        if i == n_points:
            i = 0
    return k


class RingMembership(Grouping):
    """Base of the schemes whose membership is their ``ring`` (CH, FISH).

    ``on_workers_changed(alive)`` makes the ring hold exactly ``alive``
    (``Ring.set_workers``: only departed/new workers' keys move); a new worker
    id ``>= n_workers`` grows ``n_workers`` (elastic scale-out); ``migrations``
    counts virtual nodes added or removed. ``live_workers()`` is the ring's.
    """

    ring: Ring

    def on_workers_changed(self, alive: Sequence[int]) -> None:
        self.migrations += self.ring.set_workers(alive)
        self.n_workers = max(self.n_workers, max(self.ring.workers) + 1)

    def live_workers(self) -> list[int]:
        return self.ring.workers


@register
class ConsistentHashing(RingMembership):
    """CH grouping: the key's clockwise successor on a ring of virtual nodes.

    Tunables:
        vnodes: virtual nodes per worker, in ``[1, 100_000]`` (default 100;
            more = smoother shares, larger ring).
        ring_seed: seed of the ring's points (default 0). It must be the same
            on every source; the per-source ``seed`` is not used.

    Membership (``RingMembership``): departed workers' points are removed
    (only their keys move), new workers' points are added (only keys taken
    over by them move), and ids ``>= n_workers`` grow ``n_workers``.
    """

    name = "ch"
    splits_keys = False  # one worker per key (until the membership changes)

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        vnodes: int = 100,
        ring_seed: int = 0,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        if not 1 <= vnodes <= MAX_VNODES:
            raise ValueError(f"vnodes must be in [1, {MAX_VNODES}] (got {vnodes})")
        self.vnodes = int(vnodes)
        # the ring must be identical on every source, so it never uses the
        # per-source ``seed``
        self.ring = Ring(n_workers, vnodes=vnodes, seed=int(ring_seed))

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        return self.ring.lookup(key_hashes)

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["ring_workers"] = len(self.ring.workers)
        return s
