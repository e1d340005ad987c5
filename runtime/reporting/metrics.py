"""Metric definitions shared by both engines (names as in docs/algorithms.md).

- Utilization ``U_w(t) = L_w(t) / c_w`` (queue length over capacity).
- Imbalance ``I(t) = max_w U_w(t) - mean_w U_w(t)``.
- Replication = sum over workers of distinct keys held / distinct keys.
- Latency = finish - emit time per message: mean, p50, p95, p99, max (ms).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.kernels.sketches import set_insert


class DistinctKeys:
    """The distinct keys a worker has held, counted from the keys' 64-bit
    hashes (the sources compute them once; a collision between two keys is
    negligible below billions of keys): what replication is computed from.

    An open-addressing hash set of the hashes (``runtime.kernels.sketches.
    set_insert``): O(1) per message, where sorting a buffer of them with
    ``np.unique`` took a quarter of a worker's CPU at 250k msgs/s (py-spy)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._table = np.zeros(max(16, 1 << (int(capacity) - 1).bit_length()), dtype=np.uint64)
        self._size = 0
        self._has_zero = False  # the table's empty marker is 0: that hash is kept apart

    def add(self, hashes: np.ndarray) -> None:
        h = np.ascontiguousarray(hashes, dtype=np.uint64)
        if not len(h):
            return
        while 2 * (self._size + len(h)) > len(self._table):  # load <= 1/2 whatever comes
            old = self._table[self._table != 0]
            self._table = np.zeros(2 * len(self._table), dtype=np.uint64)
            self._size = set_insert(self._table, old)
        self._size += set_insert(self._table, h)
        if not self._has_zero and bool((h == 0).any()):
            self._has_zero = True

    def __len__(self) -> int:
        return self._size + int(self._has_zero)


def latency_summary_ms(latencies_s: np.ndarray | Sequence[float]) -> dict[str, float]:
    lat = np.asarray(latencies_s, dtype=np.float64) * 1e3
    if lat.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    return {"mean": float(lat.mean()), "p50": float(p50), "p95": float(p95),
            "p99": float(p99), "max": float(lat.max())}


def imbalance(utilization: np.ndarray) -> np.ndarray:
    """I(t) for a ``[time, worker]`` utilization matrix."""
    u = np.asarray(utilization, dtype=np.float64)
    if u.ndim == 1:
        u = u[None, :]
    if u.shape[0] == 0:
        return np.zeros(0)
    return u.max(axis=1) - u.mean(axis=1)


def imbalance_summary(utilization: np.ndarray) -> dict[str, float]:
    i = imbalance(utilization)
    return {"mean": float(i.mean()) if i.size else 0.0, "max": float(i.max()) if i.size else 0.0}


def replication(keys_per_worker: Sequence[int], distinct_keys: int) -> float:
    """Memory cost: sum of distinct keys held per worker / distinct keys (KG = 1)."""
    return float(sum(keys_per_worker)) / distinct_keys if distinct_keys else 0.0
