"""PoRC - power of random choices. Nasir et al., "Consistent Grouping for
heterogeneous clusters" (CG paper), section 4.

Messages go to ``B`` equal bins. A bin's capacity is
``ceil((1 + eps) * m / B)`` where ``m`` counts the messages routed so far
*including the current one* [ours: the paper says "average load"; counting the
current message makes the bound hold after every single assignment]. A key
tries ``H_1(k), H_2(k), ...`` mod ``B`` and takes the first bin whose load is
below capacity, so light keys stay on their *principal* bin ``H_1(k) mod B``
and heavy keys spill onto a few more.

Guarantee: after every message, every bin's load is
``<= ceil((1 + eps) * m / B)`` (``m`` = messages so far): imbalance bounded by
``eps``; replication grows as ``eps`` shrinks.

Termination (two lines): before the ``m``-th message the loads sum to
``m - 1``, so the least-loaded bin holds ``<= floor((m - 1) / B) =
ceil(m / B) - 1 < ceil((1 + eps) * m / B)``: some bin always has room. The
probe sequence is deterministic per key; if ``PROBES_PER_BIN * B + 64`` probes
all hit full bins (probability ``< e**-8`` even when a single bin has room),
the key falls back to the least-loaded bin (lowest index), which has room by
the argument above. So each message costs O(B) in the worst case.

As a standalone scheme, bin ``b`` belongs to worker ``b mod n`` (``B / n``
bins per worker when ``n`` divides ``B``, which holds for the default). CG
and ACG route with the same ``PorcBins`` over their virtual workers
(``VirtualWorkerGrouping``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from runtime.grouping.base import Clock, Grouping, register
from runtime.grouping.fastmod import magic_of, mod_n
from runtime.hashing import choice_scalar
from runtime.kernels.jit import kernel

PROBES_PER_BIN = 8
MAX_BINS = 10_000_000
MAX_EPS = 10.0


@kernel(inline=True)
def least_loaded(loads: np.ndarray) -> np.int64:  # pragma: no cover - compiled
    """The first bin with the fewest messages: PoRC's fallback when no probe
    found a bin under its bound (one always has room)."""
    b = np.int64(0)
    for c in range(1, loads.shape[0]):
        if loads[c] < loads[b]:
            b = np.int64(c)
    return b


@kernel(inline=True)
def porc_core(
    key_hashes: np.ndarray,
    loads: np.ndarray,
    m: int,
    eps: float,
    memo: np.ndarray,
    owner: np.ndarray,
    out: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """PoRC over ``loads.shape[0]`` bins: ``out[j] = owner[bin of message j]``.

    ``loads`` (int64, per bin) is updated in place and must only grow; ``m``
    is the number of messages routed before this batch; returns the new
    ``m``. Same result for one batch or any split of it.

    Probe memo (same decisions, fewer probes): ``memo`` is a direct-mapped
    cache (``uint64[size, 3]``, size a power of two; one row = one cache
    line's worth, not three arrays) of ``(key, cap, p)``: when the key last came
    with capacity ``cap``, its probes ``1 .. p-1`` all hit full bins (counting
    the bin it took if that one filled up). Loads
    never decrease and a bin stays full while ``cap`` is unchanged, so a
    message of that key with the same ``cap`` may start probing at ``p``.
    A heavy key spread over ``r`` bins otherwise re-probes ~``r/2`` full bins
    per message (~30 at 64 workers).
    """
    n_bins = loads.shape[0]
    nb = np.uint64(n_bins)
    magic = magic_of(nb)
    mask = np.uint64(memo.shape[0] - 1)
    limit = PROBES_PER_BIN * n_bins + 64
    for j in range(key_hashes.shape[0]):
        h = key_hashes[j]
        m += 1
        cap = math.ceil((1.0 + eps) * m / n_bins)  # capacity_for(m, eps, n_bins)
        e = np.int64(h & mask)
        # selects, not branches: whether the memo hits is unpredictable
        hit = (memo[e, 0] == h) & (memo[e, 1] == np.uint64(cap))
        first = int(np.int64(memo[e, 2])) if hit else 1  # int64, never uint64 (mixed compares)
        b = np.int64(-1)
        i = first
        while i <= limit:
            c = np.int64(mod_n(choice_scalar(h, i), nb, magic))
            if loads[c] < cap:
                b = c
                break
            i += 1
        if b < 0:  # rare: fall back to the least-loaded bin, which has room
            b = least_loaded(loads)
        load = loads[b] + 1
        loads[b] = load
        # remember where this key's free bins start (probe i's bin may be full now)
        memo[e, 0] = h
        memo[e, 1] = np.uint64(cap)
        memo[e, 2] = np.uint64(i + 1 if load >= cap else i)
        out[j] = owner[b]
    return m


@kernel()
def porc_route(
    key_hashes: np.ndarray,
    loads: np.ndarray,
    m: int,
    eps: float,
    memo: np.ndarray,
    owner: np.ndarray,
    out: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """``porc_core`` as a kernel (PoRC and CG route through it)."""
    return porc_core(key_hashes, loads, m, eps, memo, owner, out)


@njit(cache=True)
def porc_assign(
    key_hashes: np.ndarray, loads: np.ndarray, m: int, eps: float, out: np.ndarray
) -> int:  # pragma: no cover - compiled
    """PoRC over ``loads.shape[0]`` bins, bins written to ``out``, no memo kept
    between calls (``loads`` may be changed between calls). Returns the new ``m``."""
    memo = np.zeros((1, 3), dtype=np.uint64)
    memo[0, 1] = MEMO_NO_CAP
    memo[0, 2] = 1
    owner = np.arange(loads.shape[0])
    return porc_core(key_hashes, loads, m, eps, memo, owner, out)


MEMO_SIZE = 4096
MEMO_NO_CAP = np.uint64(2**64 - 1)  # never equals a capacity


class ProbeMemo:
    """The probe memo of ``porc_core`` (direct-mapped, ``size`` a power of two):
    ``table[e] = (key, cap, p)`` as ``uint64``."""

    def __init__(self, size: int = MEMO_SIZE) -> None:
        self.table = np.zeros((size, 3), dtype=np.uint64)
        self.table[:, 1] = MEMO_NO_CAP
        self.table[:, 2] = 1


class PorcBins:
    """PoRC's state over ``n_bins`` equal bins - bin loads (only grow: the probe
    memo relies on it), messages routed ``m``, the probe memo - and its routing
    step. The PoRC scheme routes with it over its bins, CG over its VWs."""

    def __init__(self, n_bins: int, eps: float) -> None:
        self.eps = eps
        self.loads = np.zeros(n_bins, dtype=np.int64)
        self.m = 0
        self._memo = ProbeMemo()
        #: ``owner`` for ``route`` that yields the bins themselves
        self.bin_ids = np.arange(n_bins, dtype=np.int64)

    def route(self, key_hashes: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Route a micro-batch: ``owner[bin]`` (``owner``'s dtype) of each
        message's bin, updating the bin loads."""
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=owner.dtype)
        self.m = porc_route(h, self.loads, self.m, self.eps, self._memo.table, owner, out)
        return out


def capacity_for(m: int, eps: float, n_bins: int) -> int:
    """Bin capacity after ``m`` messages, computed exactly as the kernel does."""
    return math.ceil((1.0 + eps) * m / n_bins)


def validate_eps(eps: float, name: str = "eps") -> float:
    if not (isinstance(eps, (int, float)) and 0.0 <= eps <= MAX_EPS and math.isfinite(eps)):
        raise ValueError(f"{name} must be in [0, {MAX_EPS}] (got {eps!r})")
    return float(eps)


def validate_virtual_per_worker(r: Any, hi: int) -> int:
    """``r`` as an int in ``[1, hi]``, or ``ValueError`` naming the bad value."""
    if not (isinstance(r, (int, np.integer)) and not isinstance(r, bool) and 1 <= r <= hi):
        raise ValueError(f"virtual_per_worker must be an int in [1, {hi}] (got {r!r})")
    return int(r)


def modulo_owner(n_items: int, n_workers: int) -> np.ndarray:
    """Item ``v`` on worker ``v mod n_workers`` (``int32[n_items]``): PoRC's
    bins, and the initial VW table of CG and ACG."""
    return (np.arange(n_items, dtype=np.int64) % n_workers).astype(np.int32)


class VirtualWorkerGrouping(Grouping):
    """Base of the schemes that route with PoRC over virtual workers (CG, ACG).

    Every source routes with ``PorcBins`` over ``n_virtual = n_workers *
    virtual_per_worker`` equal VWs, then VW -> worker through the table
    ``vw_owner``; ``_alive`` holds the live workers. Subclasses decide how the
    table changes (CG: the workers' load signals; ACG: the controller's
    tables; both: ``on_workers_changed``) and call ``_init_virtual_workers``
    once their tunables are valid.
    """

    virtual_per_worker: int
    n_virtual: int
    vw_owner: np.ndarray  # int32[n_virtual]
    _porc: PorcBins
    _alive: set[int]

    def _init_virtual_workers(self, eps: float, virtual_per_worker: int) -> None:
        """PoRC over ``n_workers * virtual_per_worker`` VWs, VW ``v`` on worker
        ``v mod n`` (``modulo_owner``), every worker live."""
        self.virtual_per_worker = virtual_per_worker
        self.n_virtual = self.n_workers * virtual_per_worker
        self.vw_owner = modulo_owner(self.n_virtual, self.n_workers)
        self._porc = PorcBins(self.n_virtual, eps)
        self._alive = set(range(self.n_workers))

    def route_virtual(self, key_hashes: np.ndarray) -> np.ndarray:
        """Route a micro-batch to VWs (``int64``), updating the VW loads."""
        return self._porc.route(key_hashes, self._porc.bin_ids)

    def live_workers(self) -> list[int]:
        return sorted(self._alive)

    def vw_per_worker(self) -> np.ndarray:
        """Number of VWs each worker currently owns (``int64[n_workers]``)."""
        return np.bincount(self.vw_owner, minlength=self.n_workers)

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["vw_per_worker"] = self.vw_per_worker().tolist()
        return s


@register
class PowerOfRandomChoices(Grouping):
    """PoRC grouping over ``bins`` equal bins, bin ``b`` -> worker ``b mod n``.

    Tunables:
        eps: imbalance slack, in ``[0, 10]`` (default 0.01). Smaller = tighter
            balance, more bins per heavy key (more memory).
        bins: number of bins ``B``, in ``[n_workers, 10_000_000]``; default
            ``None`` = ``10 * n_workers`` (10 bins per worker, as the paper's
            experiments).
    """

    name = "porc"

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        eps: float = 0.01,
        bins: int | None = None,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        self.eps = validate_eps(eps)
        n_bins = 10 * self.n_workers if bins is None else bins
        if not (isinstance(n_bins, (int, np.integer)) and self.n_workers <= n_bins <= MAX_BINS):
            raise ValueError(
                f"bins must be an int in [n_workers={self.n_workers}, {MAX_BINS}] (got {bins!r})"
            )
        self.bins = int(n_bins)
        self._porc = PorcBins(self.bins, self.eps)
        self._bin_worker = modulo_owner(self.bins, self.n_workers)

    @property
    def loads(self) -> np.ndarray:
        """Messages per bin (``int64[bins]``)."""
        return self._porc.loads

    @property
    def m(self) -> int:
        """Messages routed so far."""
        return self._porc.m

    def route_bins(self, key_hashes: np.ndarray) -> np.ndarray:
        """Route a micro-batch to bins (``int64``), updating the bin loads."""
        return self._porc.route(key_hashes, self._porc.bin_ids)

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        return self._live(key_hashes, self._porc.route(key_hashes, self._bin_worker))

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["bins"] = self.bins
        s["max_bin_load"] = int(self.loads.max()) if self.m else 0
        return s
