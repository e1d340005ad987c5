"""Compiled inner loops of the simulator (numba): per-message work stays here.

The event loop in ``engine.py`` runs in Python at micro-batch granularity;
everything that touches single messages (splitting a routed batch by worker,
the FIFO finish-time recurrence, latency bookkeeping) is one call per batch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: latency histogram: bin 0 holds latencies <= LAT_LO_S, then LAT_BINS_PER_DECADE
#: log-spaced bins per decade up to LAT_LO_S * 10**LAT_DECADES (last bin is open)
LAT_LO_S = 1e-6
LAT_BINS_PER_DECADE = 50
LAT_DECADES = 11
LAT_BINS = 2 + LAT_BINS_PER_DECADE * LAT_DECADES


@njit(cache=True)
def split_by_worker(workers: np.ndarray, n_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Counting sort of a routed batch: ``(order, starts)``.

    ``order[starts[w]:starts[w+1]]`` are the batch offsets routed to ``w``, in
    their original (FIFO) order.
    """
    m = workers.shape[0]
    starts = np.zeros(n_workers + 1, dtype=np.int64)
    for i in range(m):
        starts[workers[i] + 1] += 1
    for w in range(n_workers):
        starts[w + 1] += starts[w]
    fill = starts[:-1].copy()
    order = np.empty(m, dtype=np.int64)
    for i in range(m):
        w = workers[i]
        order[fill[w]] = i
        fill[w] += 1
    return order, starts


@njit(cache=True, inline="always")
def _lat_bin(lat: float) -> int:
    if lat <= LAT_LO_S:
        return 0
    b = 1 + int(math.log10(lat / LAT_LO_S) * LAT_BINS_PER_DECADE)
    return b if b < LAT_BINS else LAT_BINS - 1


@njit(cache=True, inline="always")
def _add_area(area: np.ndarray, w: int, t0: float, t1: float, value: float,
              slot_s: float) -> None:
    """Add ``value`` held over ``[t0, t1)`` to worker ``w``'s per-slot integrals."""
    if t1 <= t0:
        return
    k = int(t0 / slot_s)
    t = t0
    while t < t1:
        end = (k + 1) * slot_s
        seg_end = t1 if t1 < end else end
        area[w, k] += value * (seg_end - t)
        t = seg_end
        k += 1


@njit(cache=True)
def dispatch_batch(
    sent: np.ndarray,
    starts: np.ndarray,
    order: np.ndarray,
    lo: int,
    now_s: float,
    emit_s: float,
    inflight: np.ndarray,
    max_inflight: int,
    free_at: np.ndarray,
    service_s: float,
    sched_t: np.ndarray,
    sched_c: np.ndarray,
    key_ids: np.ndarray,
    latency_s: np.ndarray,
    msg_worker: np.ndarray,
    seen: np.ndarray,
    use_seen: bool,
    slot_s: float,
    lat_hist: np.ndarray,
    busy_area: np.ndarray,
    done_area: np.ndarray,
    qbatch_area: np.ndarray,
    qmsg_area: np.ndarray,
    processed: np.ndarray,
    out_w: np.ndarray,
    out_fin: np.ndarray,
    out_m: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Send a routed batch's sub-batches that are not yet ``sent`` and whose
    worker has a free in-flight slot (``inflight[w] < max_inflight``); mark
    them sent.

    Each sub-batch joins worker ``w``'s FIFO queue at ``now_s``; its
    messages' latency counts from ``emit_s`` (when the batch was due at the
    source, see ``engine``). Its messages are served one after the other,
    ``finish_i = max(arrival, finish_{i-1}) + service_s / capacity_w(start_i)``
    (capacity from the worker's schedule at the moment the message starts).

    Per-slot integrals (``[worker, slot]``, slots of ``slot_s``): busy time,
    completions (``done_area``), queue length in batches and in messages - a sub-batch counts in its
    worker's queue from arrival until its last message finishes, as the real
    worker counts it. ``lat_hist[slot, bin]`` counts completions.

    Returns how many sub-batches were sent (their worker, last finish time
    and size are in ``out_*``).
    """
    n_workers = starts.shape[0] - 1
    n_sent = 0
    for w in range(n_workers):
        if sent[w] or inflight[w] >= max_inflight:
            continue
        sent[w] = True
        a = starts[w]
        b = starts[w + 1]
        t = free_at[w]
        if t < now_s:
            t = now_s
        t_start = t
        j = 0
        while sched_t[w, j + 1] <= t:
            j += 1
        for i in range(a, b):
            while sched_t[w, j + 1] <= t:
                j += 1
            t += service_s / sched_c[w, j]
            g = lo + order[i]
            lat = t - emit_s
            latency_s[g] = lat
            msg_worker[g] = w
            if use_seen:
                seen[w, key_ids[g]] = True
            k = int(t / slot_s)
            lat_hist[k, _lat_bin(lat)] += 1
            done_area[w, k] += 1
        m = b - a
        free_at[w] = t
        inflight[w] += 1
        processed[w] += m
        _add_area(busy_area, w, t_start, t, 1.0, slot_s)
        _add_area(qbatch_area, w, now_s, t, 1.0, slot_s)
        _add_area(qmsg_area, w, now_s, t, float(m), slot_s)
        out_w[n_sent] = w
        out_fin[n_sent] = t
        out_m[n_sent] = m
        n_sent += 1
    return n_sent


def hist_percentiles(hist: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """Per-row latency percentiles (s) from a ``[rows, LAT_BINS]`` histogram.

    A bin reports its geometric midpoint (relative error <= 2.3% at 50 bins
    per decade); rows without completions give NaN.
    """
    hist = np.asarray(hist, dtype=np.float64)
    rows = hist.shape[0]
    out = np.full((rows, len(qs)), np.nan)
    total = hist.sum(axis=1)
    cum = np.cumsum(hist, axis=1)
    edges = LAT_LO_S * 10.0 ** (np.arange(LAT_BINS) / LAT_BINS_PER_DECADE)
    mids = np.empty(LAT_BINS)
    mids[0] = 0.0
    mids[1:] = np.sqrt(edges[:-1] * edges[1:])
    has = total > 0
    for j, q in enumerate(qs):
        target = np.maximum(q / 100.0 * total, 1.0)  # the ceil(q% * n)-th completion
        b = np.minimum((cum < target[:, None]).sum(axis=1), LAT_BINS - 1)
        out[has, j] = mids[b[has]]
    return out
