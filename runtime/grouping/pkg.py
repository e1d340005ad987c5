"""PKG - partial key grouping. Nasir et al., "The power of both choices:
practical load balancing for distributed stream processing engines", ICDE 2015.

Each key has two candidate workers, ``c1 = H_1(k) mod n`` and
``c2 = H_2(k) mod n`` (forced distinct: if equal, ``c2 = (c2 + 1) mod n``, as
Apache Storm does); a message goes to the candidate with the lower *local*
count (what this source sent), ties to ``c1``.

Guarantee: every key lives on at most two workers (exactly its two candidates,
identical on every source), so memory is at most 2x KG. With local load
estimation the imbalance stays close to the optimum as long as the top key's
frequency ``p_1 <= 2/n`` (paper, section 4).

Structure (Storm's ``PartialKeyGrouping``): a deterministic candidate function
(``pkg_candidates``, module-level, the same on every machine) and a stateful
selector (``_pkg_select``, the compiled greedy loop over local counts),
which evaluates the same candidate function per message (``pkg_pair``,
inlined) instead of materializing the candidate arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from runtime.grouping.base import Clock, Grouping, register
from runtime.grouping.fastmod import magic_of, mod_n
from runtime.hashing import choice_scalar
from runtime.kernels.jit import kernel


@kernel(inline=True)
def pkg_pair(
    h: np.uint64, nn: np.uint64, magic: np.uint64
) -> tuple[np.int64, np.int64]:  # pragma: no cover
    """One key's candidates ``(c1, c2)`` (``magic = mod_magic(n)``); compiled, inlined."""
    a = mod_n(choice_scalar(h, 1), nn, magic)
    b = mod_n(choice_scalar(h, 2), nn, magic)
    if a == b:
        b += np.uint64(1)
        if b == nn:
            b = np.uint64(0)
    return np.int64(a), np.int64(b)


@njit(cache=True)
def pkg_candidates(key_hashes: np.ndarray, n_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """The two candidate workers of every key: ``(c1, c2)``, ``int32[m]`` each.

    ``c1 = H_1 mod n``, ``c2 = H_2 mod n``, ``c2 = (c2 + 1) mod n`` if equal
    (so ``c1 != c2`` whenever ``n >= 2``). Pure function of the hash; the
    routing kernels call the same ``pkg_pair``.
    """
    m = key_hashes.shape[0]
    c1 = np.empty(m, dtype=np.int32)
    c2 = np.empty(m, dtype=np.int32)
    nn = np.uint64(n_workers)
    magic = magic_of(nn)
    for i in range(m):
        a, b = pkg_pair(key_hashes[i], nn, magic)
        c1[i] = a
        c2[i] = b
    return c1, c2


@kernel()
def _pkg_select(
    key_hashes: np.ndarray, loads: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover
    """Greedy selector: the less loaded candidate, ties to ``c1``; updates ``loads``."""
    nn = np.uint64(loads.shape[0])
    magic = magic_of(nn)
    for i in range(key_hashes.shape[0]):
        a, b = pkg_pair(key_hashes[i], nn, magic)
        w = b if loads[b] < loads[a] else a
        loads[w] += 1
        out[i] = w


@register
class PartialKeyGrouping(Grouping):
    """Partial key grouping (two choices per key, local load estimation).

    No tunables. ``loads`` holds this source's per-worker message counts.
    """

    name = "pkg"

    def __init__(self, n_workers: int, seed: int = 0, clock: Clock | None = None) -> None:
        super().__init__(n_workers, seed, clock)
        self.loads = np.zeros(self.n_workers, dtype=np.int64)

    def candidates(self, key_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two candidates of each key (see ``pkg_candidates``)."""
        return pkg_candidates(np.ascontiguousarray(key_hashes, dtype=np.uint64), self.n_workers)

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int32)
        _pkg_select(h, self.loads, out)
        return self._live(h, out)
