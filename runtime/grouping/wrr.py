"""WRR - smooth weighted round-robin over the configured capacities [ours]
(docs/algorithms.md, "WRR"). A *reference*, not a real scheme.

Every message goes to the worker picked by smooth weighted round-robin
(nginx's algorithm): each pick adds every live worker's weight to its
``current`` credit, takes the worker with the most credit (ties: lowest id)
and subtracts the total weight from it. The weights are the workers'
*configured* capacities, told by the engine (``on_capacity``, at the start
and at every ``workers.changes`` entry as it happens) - which no real scheme
knows. So ``wrr`` is the upper bound that separates what a scheme loses from
what the runtime itself loses. Without capacities (``make_grouping("wrr",
n)`` alone) every weight is 1: plain round-robin.

Guarantee: over any window of picks with constant weights, worker ``w``
receives its share ``weight_w / total`` of the messages to within one
message (smoothness). Every key may reach every worker (replication like
SG). Sources start at a seed-chosen phase, as SG, so that they do not all
pick the same worker first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from runtime.grouping.base import Clock, Grouping, register
from runtime.kernels.jit import kernel


@kernel()
def _swrr(weight: np.ndarray, current: np.ndarray, total: float,
          out: np.ndarray) -> None:  # pragma: no cover - compiled
    n = weight.shape[0]
    for i in range(out.shape[0]):
        best = -1
        for w in range(n):
            if weight[w] <= 0.0:  # departed: never picked (its credit stays put)
                continue
            current[w] += weight[w]
            if best < 0 or current[w] > current[best]:
                best = w
        current[best] -= total
        out[i] = best


@register
class WeightedRoundRobin(Grouping):
    """Smooth WRR over the configured capacities (a reference: it is told them)."""

    name = "wrr"
    #: engines tell this scheme the configured capacities (``on_capacity``)
    knows_capacities: ClassVar[bool] = True

    def __init__(self, n_workers: int, seed: int = 0, clock: Clock | None = None) -> None:
        super().__init__(n_workers, seed, clock)
        self.capacity = np.ones(self.n_workers, dtype=np.float64)
        self._live_mask = np.ones(self.n_workers, dtype=bool)
        self.current = np.zeros(self.n_workers, dtype=np.float64)
        self._weights()
        phase = np.empty(self.seed % self.n_workers, dtype=np.int32)
        _swrr(self.weight, self.current, self.total, phase)

    def _weights(self) -> None:
        self.weight = np.where(self._live_mask, self.capacity, 0.0)
        self.total = float(self.weight.sum())

    def on_capacity(self, worker: int, capacity: float) -> None:
        if not capacity > 0:
            raise ValueError(f"capacity must be > 0 (got {capacity} for worker {worker})")
        self.capacity[int(worker)] = float(capacity)
        self._weights()

    def on_workers_changed(self, alive: Sequence[int]) -> None:
        target = self._checked_alive(alive)
        self._live_mask[:] = False
        self._live_mask[sorted(target)] = True
        self.current[~self._live_mask] = 0.0
        self._weights()

    def live_workers(self) -> list[int]:
        return np.flatnonzero(self._live_mask).tolist()

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        out = np.empty(len(key_hashes), dtype=np.int32)
        _swrr(self.weight, self.current, self.total, out)
        return out

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["weights"] = self.weight.tolist()
        return s
