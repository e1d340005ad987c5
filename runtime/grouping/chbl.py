"""CHBL - consistent hashing with bounded loads. Mirrokni, Thorup, Zadimoghaddam,
"Consistent hashing with bounded loads", SODA 2018.

Workers sit on a consistent-hash ring (``Ring``: ``vnodes`` points per worker).
Message number ``m`` of this source (counting itself) may go to a worker whose
local count is below the capacity ``ceil((1 + eps) * m / n)``; the key starts
at its clockwise successor and walks clockwise to the first point whose owner
has room.

Guarantee: no worker ever holds more than ``ceil((1 + eps) * m / n)`` of this
source's ``m`` messages (the capacity only grows with ``m``, and a worker is
chosen only while below it). The walk always ends: the ``n`` workers hold
``m - 1 < n * (1 + eps) * m / n`` messages, so one is below capacity, and every
worker owns ring points. Keys whose successor has room stay put (consistent
hashing's ~1/n movement); the price of the bound is that a hot key overflows
to the next workers on the ring.

Tunables:
    eps: load slack, in ``(0, 10]`` (default 0.25; smaller = tighter balance,
        more keys displaced from their home worker).
    vnodes: virtual nodes per worker, in ``[1, 100_000]`` (default 100).
    ring_seed: seed of the ring's point positions (default 0). Every source
        must use the same ``ring_seed`` so that keys start at the same worker;
        it is deliberately separate from the per-source ``seed``, which this
        scheme does not need (no randomness).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.grouping.base import Clock, Grouping, register
from runtime.grouping.ch import MAX_VNODES, Ring
from runtime.kernels.jit import kernel


@kernel()
def _chbl_walk(
    start: np.ndarray,
    owners: np.ndarray,
    loads: np.ndarray,
    state: np.ndarray,
    one_eps: float,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Greedy loop: walk clockwise from ``start[i]`` to an owner below capacity."""
    n = loads.shape[0]
    n_points = owners.shape[0]
    for i in range(start.shape[0]):
        state[0] += 1
        cap = np.ceil(one_eps * state[0] / n)
        j = start[i]
        w = owners[j]
        while loads[w] >= cap:
            j += 1
            if j == n_points:
                j = 0
            w = owners[j]
        loads[w] += 1
        out[i] = w


@register
class ConsistentHashingBoundedLoads(Grouping):
    """Consistent hashing with bounded loads (see module docstring)."""

    name = "chbl"

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        eps: float = 0.25,
        vnodes: int = 100,
        ring_seed: int = 0,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        if not 0.0 < eps <= 10.0:
            raise ValueError(f"eps must be in (0, 10] (got {eps})")
        if not 1 <= vnodes <= MAX_VNODES:
            raise ValueError(f"vnodes must be in [1, {MAX_VNODES}] (got {vnodes})")
        self.eps = float(eps)
        self.vnodes = int(vnodes)
        self.ring = Ring(self.n_workers, vnodes=self.vnodes, seed=int(ring_seed))
        self.loads = np.zeros(self.n_workers, dtype=np.int64)
        self._state = np.zeros(1, dtype=np.int64)  # messages routed m

    def capacity(self, m: int | None = None) -> int:
        """``ceil((1 + eps) * m / n)`` (default: the current ``m``)."""
        m = int(self._state[0]) if m is None else m
        return int(np.ceil((1.0 + self.eps) * m / self.n_workers))

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        h = np.asarray(key_hashes, dtype=np.uint64)
        start = self.ring.successor_index(h)
        out = np.empty(len(h), dtype=np.int32)
        _chbl_walk(start, self.ring.owners, self.loads, self._state, 1.0 + self.eps, out)
        return self._live(h, out)

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["capacity"] = self.capacity()
        return s
