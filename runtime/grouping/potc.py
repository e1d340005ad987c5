"""PoTC - power of two choices on *messages*. Azar et al., "Balanced
allocations", STOC 1994 / SIAM J. Comput. 1999; used as a baseline in Nasir et
al., ICDE 2015 (section 2).

Every message draws two distinct random workers and goes to the one with the
lower local count (what this source sent), ties to the first draw.

Guarantee (balls into bins): after ``m`` messages the most loaded worker is at
most ``m/n + ln ln n / ln 2 + O(1)`` w.h.p. (vs ``ln n / ln ln n`` extra for a
single random choice). The key is ignored, so a key can end up on every worker
(replication -> n, like SG).

Randomness (batching invariance): the draws of message number ``j`` of this
source are a pure function of ``(seed, j)`` - a SplitMix64-style counter
``x_j = mix(seed) + j * golden`` finalized with ``mix64`` - not of how many
generator calls happened before, so routing one batch of N equals N batches
of 1. Correctness of the draw: ``a = r1 mod n`` is uniform up to ``2^-64 n``
bias; ``b = (a + 1 + r2 mod (n-1)) mod n`` is uniform over the ``n - 1``
workers other than ``a``, so the pair is a uniform distinct pair.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from runtime.grouping.base import Clock, Grouping, register
from runtime.grouping.fastmod import magic_of, mod_n
from runtime.hashing import mix64, mix64_scalar


def potc_stream_key(seed: int) -> np.uint64:
    """The per-source stream key derived from ``seed`` (uint64)."""
    return np.uint64(mix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0])


@njit(cache=True)
def potc_candidates(
    stream_key: np.uint64, start: int, m: int, n_workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """The two distinct random workers of messages ``start .. start+m-1``.

    Pure function of ``(stream_key, message index)``; ``c1 != c2`` for
    ``n >= 2`` and both are 0 for ``n == 1``.
    """
    c1 = np.empty(m, dtype=np.int32)
    c2 = np.empty(m, dtype=np.int32)
    n = np.uint64(n_workers)
    n1 = np.uint64(max(1, n_workers - 1))
    magic = magic_of(n)
    magic1 = magic_of(n1)
    for i in range(m):
        x = stream_key + np.uint64(start + i) * np.uint64(0x9E3779B97F4A7C15)
        r1 = mix64_scalar(x)
        r2 = mix64_scalar(x ^ np.uint64(0xD1B54A32D192ED03))
        a = mod_n(r1, n, magic)
        if n_workers > 1:
            b = a + np.uint64(1) + mod_n(r2, n1, magic1)  # in [1, 2n - 1)
            if b >= n:
                b -= n
        else:
            b = a
        c1[i] = np.int32(a)
        c2[i] = np.int32(b)
    return c1, c2


@njit(cache=True)
def _potc_select(c1: np.ndarray, c2: np.ndarray, loads: np.ndarray) -> np.ndarray:
    """Greedy selector: the less loaded draw, ties to the first; updates ``loads``."""
    m = c1.shape[0]
    out = np.empty(m, dtype=np.int32)
    for i in range(m):
        a = c1[i]
        b = c2[i]
        w = b if loads[b] < loads[a] else a
        loads[w] += 1
        out[i] = w
    return out


@register
class PowerOfTwoChoices(Grouping):
    """Power of two choices per message (seeded, counter-based randomness).

    No tunables; ``seed`` selects the random stream (sources should use
    different seeds).
    """

    name = "potc"

    def __init__(self, n_workers: int, seed: int = 0, clock: Clock | None = None) -> None:
        super().__init__(n_workers, seed, clock)
        self.loads = np.zeros(self.n_workers, dtype=np.int64)
        self._stream_key = potc_stream_key(self.seed)
        self._sent = 0  # messages routed so far = index of the next message

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        m = len(key_hashes)
        c1, c2 = potc_candidates(self._stream_key, self._sent, m, self.n_workers)
        self._sent += m
        return self._live(key_hashes, _potc_select(c1, c2, self.loads))
