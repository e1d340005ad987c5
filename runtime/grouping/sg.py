"""SG - shuffle grouping (round-robin per source). Nasir et al., ICDE 2015.

Guarantee: per-source message counts differ by at most one between workers.
Every key ends up on every worker (replication -> n). Each source starts at a
seed-chosen offset so that sources do not all hit worker 0 first.
"""

from __future__ import annotations

import numpy as np

from runtime.grouping.base import Clock, Grouping, register


@register
class ShuffleGrouping(Grouping):
    name = "sg"

    def __init__(self, n_workers: int, seed: int = 0, clock: Clock | None = None) -> None:
        super().__init__(n_workers, seed, clock)
        self._next = int(np.random.default_rng(seed).integers(n_workers))

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        m = len(key_hashes)
        out = ((np.arange(m, dtype=np.int64) + self._next) % self.n_workers).astype(np.int32)
        self._next = (self._next + m) % self.n_workers
        return self._live(key_hashes, out)
