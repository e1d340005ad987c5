"""Count-based baselines and metrics used only by the paper reproduction.

These are the *papers'* comparison points, not runtime schemes (they need a
routing table or the whole stream in advance, so no real source could run
them): Nasir et al., "Partial key grouping" (TPDS / ICDE 2015), section 6.2:

- On-Greedy: a new key goes to the currently least-loaded worker, forever.
- Off-Greedy: keys sorted by decreasing total frequency, each to the worker
  with the least assigned frequency so far (LPT); knows the whole stream.
- static PoTC: a new key goes to the less loaded of its two hashed candidates
  (PKG's candidates), forever: power of two choices *without* key splitting.
- PKG with a global load oracle (one load vector for all sources) and with
  local estimation (``S`` sources, each counting only what it sent).

Everything works on dense integer key ids (``0..n_keys-1``) plus the keys'
64-bit hashes; loads are message counts (no queueing).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from runtime.grouping import make_grouping
from runtime.grouping.pkg import pkg_candidates


@njit(cache=True)
def on_greedy(ids: np.ndarray, n_keys: int, n_workers: int) -> np.ndarray:
    """On-Greedy: first occurrence of a key picks the least-loaded worker (lowest id on ties)."""
    table = np.full(n_keys, -1, dtype=np.int32)
    loads = np.zeros(n_workers, dtype=np.int64)
    out = np.empty(ids.shape[0], dtype=np.int32)
    for i in range(ids.shape[0]):
        k = ids[i]
        w = table[k]
        if w < 0:
            w = 0
            for c in range(1, n_workers):
                if loads[c] < loads[w]:
                    w = c
            table[k] = w
        loads[w] += 1
        out[i] = w
    return out


@njit(cache=True)
def _lpt_table(order: np.ndarray, freq: np.ndarray, n_workers: int) -> np.ndarray:
    table = np.zeros(freq.shape[0], dtype=np.int32)
    loads = np.zeros(n_workers, dtype=np.int64)
    for j in range(order.shape[0]):
        k = order[j]
        w = 0
        for c in range(1, n_workers):
            if loads[c] < loads[w]:
                w = c
        table[k] = w
        loads[w] += freq[k]
    return table


def off_greedy(ids: np.ndarray, n_keys: int, n_workers: int) -> np.ndarray:
    """Off-Greedy: keys by decreasing frequency to the least-loaded worker, then route the stream."""
    freq = np.bincount(ids, minlength=n_keys).astype(np.int64)
    order = np.argsort(-freq, kind="stable").astype(np.int64)
    table = _lpt_table(order, freq, n_workers)
    return table[ids]


@njit(cache=True)
def _static_potc(ids: np.ndarray, c1k: np.ndarray, c2k: np.ndarray, n_workers: int) -> np.ndarray:
    table = np.full(c1k.shape[0], -1, dtype=np.int32)
    loads = np.zeros(n_workers, dtype=np.int64)
    out = np.empty(ids.shape[0], dtype=np.int32)
    for i in range(ids.shape[0]):
        k = ids[i]
        w = table[k]
        if w < 0:
            a = c1k[k]
            b = c2k[k]
            w = b if loads[b] < loads[a] else a
            table[k] = w
        loads[w] += 1
        out[i] = w
    return out


def static_potc(ids: np.ndarray, key_hashes: np.ndarray, n_workers: int) -> np.ndarray:
    """PoTC without key splitting: a key's first message fixes it on the less loaded candidate.

    ``key_hashes[k]`` is the hash of key id ``k``; the candidates are PKG's.
    """
    c1k, c2k = pkg_candidates(np.ascontiguousarray(key_hashes, dtype=np.uint64), n_workers)
    return _static_potc(ids, c1k, c2k, n_workers)


def pkg_sources(msg_hashes: np.ndarray, n_workers: int, n_sources: int) -> np.ndarray:
    """PKG with ``n_sources`` sources fed round-robin, each with its own local counts.

    ``n_sources=1`` is the global oracle (the single source sees every message).
    """
    out = np.empty(len(msg_hashes), dtype=np.int32)
    for s in range(n_sources):
        g = make_grouping("pkg", n_workers, seed=s)
        out[s::n_sources] = g.route(np.ascontiguousarray(msg_hashes[s::n_sources]))
    return out


@njit(cache=True)
def imbalance_trace(workers: np.ndarray, n_workers: int, n_points: int):
    """``I(t) = max_w L_w(t) - mean_w L_w(t)`` (message counts) at ``n_points`` evenly spaced t.

    Returns ``(t, I)``, both float64 arrays of length ``n_points`` (t = messages so far).
    """
    m = workers.shape[0]
    loads = np.zeros(n_workers, dtype=np.int64)
    ts = np.empty(n_points, dtype=np.float64)
    imb = np.empty(n_points, dtype=np.float64)
    p = 0
    next_t = max(1, (m * (p + 1)) // n_points)
    for i in range(m):
        loads[workers[i]] += 1
        if i + 1 == next_t and p < n_points:
            mx = loads.max()
            ts[p] = i + 1
            imb[p] = mx - (i + 1) / n_workers
            p += 1
            next_t = max(i + 2, (m * (p + 1)) // n_points)
    return ts[:p], imb[:p]


def avg_fraction_imbalance(workers: np.ndarray, n_workers: int, n_points: int = 200) -> float:
    """PKG paper's "fraction of average imbalance": mean over time of ``I(t) / t``."""
    t, imb = imbalance_trace(np.ascontiguousarray(workers, dtype=np.int32), n_workers, n_points)
    return float(np.mean(imb / t)) if len(t) else 0.0


def final_imbalance(workers: np.ndarray, n_workers: int) -> tuple[float, float]:
    """End-of-stream ``(max - mean) / mean`` (CG paper Table 1) and ``(max - mean) / m``."""
    loads = np.bincount(workers, minlength=n_workers).astype(np.float64)
    m = loads.sum()
    mean = m / n_workers
    return float((loads.max() - mean) / mean), float((loads.max() - mean) / m)


def replication(ids: np.ndarray, workers: np.ndarray, n_keys: int, n_workers: int) -> float:
    """Distinct (key, worker) pairs / distinct keys: 1.0 for KG, up to ``n`` for SG."""
    pairs = np.unique(ids.astype(np.int64) * n_workers + workers.astype(np.int64))
    distinct = int(np.count_nonzero(np.bincount(ids, minlength=n_keys)))
    return float(len(pairs)) / distinct if distinct else 0.0
