"""FISH - epoch-based hot keys + heuristic worker assignment. Li et al.,
"FISH: a fine-grained scheme for time-evolving streams" (fish-time-evolving-streams).

Per source, with local state only (docs/algorithms.md, formulas reconstructed):

1. **Recent hot keys.** A SpaceSaving counter set of capacity ``capacity``
   (K, default 100): increment if present, insert if room, else ReplaceMin
   (the new key starts at ``c_min + 1``). ``N`` counts every message. After
   every ``epoch`` messages (E, default 10_000) every counter and ``N`` are
   multiplied by ``decay`` (alpha, default 0.5) and counters below 1 are
   dropped: decay per epoch, never per message.
2. **CHK.** A key is hot when ``f_k = (C[k] - E[k]) / N >= theta`` (default
   ``1 / (5 n)``) and ``N >= 1 / theta`` (before that one occurrence would
   make any key hot [ours]). ``E[k]`` is the SpaceSaving error: the ``c_min``
   the key inherited at ReplaceMin (0 if it took a free counter), decayed with
   its counter, so ``C[k] - E[k]`` is the key's guaranteed (decayed) count
   [ours]: docs/algorithms.md writes ``C[k] / N``, but ``C[k]`` over-counts by up
   to ``c_min``, and ``c_min / N`` reaches ``1 / K`` > ``theta`` for ``n >
   K / 5``, so every key just inserted by ReplaceMin looked hot (a cold key
   then used 2 workers instead of 1). A key with ``theta <= f_k < c_min / N``
   that keeps being evicted is the price: it stays cold. A hot key gets ``d_k = min(n, max(d_min,
   ceil(f_k * n)))`` candidates (``d_min`` = 2), a cold key 1. Classification
   runs per message on the live counters; the hot set is also recomputed at
   each epoch end, after decay, and the ``d_k`` set then or raised during an
   epoch never shrinks within that epoch.
3. **Candidates**: the first ``d_k`` distinct workers clockwise from the key
   on a consistent-hash ``Ring`` (``vnodes`` per worker), so worker
   add/remove moves few keys; ``d_k = 1`` is plain consistent hashing.
4. **Heuristic assignment**: route to the candidate with the smallest
   estimated waiting time ``W_w = U_w * T_w``, ``U_w = max(0, A_w - elapsed_w
   / T_w)``; ties go to the earlier candidate (fewer replicas).

Estimator (what a source can observe, nothing else; no configured capacity):

- ``A_w`` = messages this source sent to ``w`` since ``t0_w``. When ``U_w``
  reaches 0 the worker is presumed drained: ``A_w = 0, t0_w = now``. On each
  ack (``on_ack(w, signal, acked)``: ``acked`` messages are processed) the
  source resynchronises: ``A_w = sent_w - acked_w`` (its messages still
  unprocessed or in flight), ``t0_w = now``.
- ``T_w`` = per-message drain time of *this source's* messages: on an ack,
  sample ``(now - start) / acked`` where ``start`` = the later of the previous
  ack from ``w`` and the send time of the first message this ack covers (so
  idle time before the messages arrived is not counted); EWMA with weight
  ``ewma_weight`` (first sample taken as is). Send times are the clock at
  each ``route`` call (one per micro-batch).
- ``s`` sources: a worker interleaves all sources, so one source sees its
  own messages drain at ~``1/s`` of the worker's rate and measures ``T_w ~ s
  * t_w`` (``t_w`` = true service time). ``A_w`` and ``elapsed / T_w`` are in
  the same own-message units, and ``W_w = U_w * T_w ~ (s * U_w) * t_w`` = the
  worker's whole backlog times its service time: the factor ``s`` is
  accounted for by measuring, not by assuming ``s``. Only the ratio between
  workers matters for the choice.
- Before any ack from ``w``, ``T_w`` is the mean of the observed workers'
  estimates, or ``PRIOR_T_S`` if none: a neutral prior, equal for all.

Guarantee: cold keys use exactly one worker (their CH successor); a hot key
uses at most ``d_k <= n`` workers, more for hotter keys; heterogeneity is
learned from ack timings only. With a constant clock and no acks it reduces
to least-sent among the candidates, and routing one batch equals routing it
piecewise.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from runtime.grouping.base import Clock, register
from runtime.grouping.ch import MAX_VNODES, Ring, RingMembership, ring_distinct_successors
from runtime.kernels.jit import kernel
from runtime.kernels.sketches import (
    EMPTY,
    index_table_size,
    ss_reindex,
    ss_update_slot,
    tree_arrays,
)

PRIOR_T_S = 1e-3  # neutral per-message time before any ack (only ratios matter)
MIN_T_S = 1e-9
SEND_LOG_MAX = 4096  # route() calls remembered for send times (bounded memory)

# indices into the kernel's int64 state vector
_POS, _EPOCH, _STAMP = 1, 2, 3  # (slot 0 unused: the counter set keeps its size)


@njit(cache=True, inline="always")
def _chk(f: float, theta: float, d_min: int, n_alive: int) -> int:  # pragma: no cover
    if f < theta:
        return 1
    d = math.ceil(f * n_alive)
    if d < d_min:
        d = d_min
    if d > n_alive:
        d = n_alive
    return d


@kernel()
def fish_route(
    key_hashes: np.ndarray,
    succ: np.ndarray,
    owners: np.ndarray,
    now: float,
    ck: np.ndarray,
    cc: np.ndarray,
    c_err: np.ndarray,
    c_tree_slot: np.ndarray,
    c_tree_count: np.ndarray,
    c_index: np.ndarray,
    c_meta: np.ndarray,
    cd: np.ndarray,
    cstamp: np.ndarray,
    cand: np.ndarray,
    cand_n: np.ndarray,
    st_i: np.ndarray,
    st_f: np.ndarray,
    epoch_len: int,
    alpha: float,
    theta: float,
    d_min: int,
    n_alive: int,
    a_sent: np.ndarray,
    t0: np.ndarray,
    t_est: np.ndarray,
    sent: np.ndarray,
    seen: np.ndarray,
    drained: np.ndarray,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """The FISH loop over one micro-batch; all state is updated in place.

    ``succ`` = ring successor index of each key; ``ck/cc/c_err/c_tree_slot/
    c_tree_count/c_index/c_meta`` = the SpaceSaving counter set (``runtime.kernels.sketches``
    layout, ``c_meta = [size, total]``; ReplaceMin evicts the lowest-slot
    minimum, as a scan of the slots in order would; ``c_err`` = each
    counter's SpaceSaving error, decayed with it); ``cd/cstamp`` = each
    counter's d and the epoch its d was set; ``cand/cand_n`` = cached ring
    candidates per counter slot; ``st_i`` = [unused, pos in epoch, epoch,
    scratch stamp]; ``st_f`` = [N]. ``drained`` (scratch, one per worker) =
    ``(now - t0) / t_est``, computed once per batch (``now`` is constant) and
    reset to 0 when ``t0 = now``: the same values as computing it per message.
    """
    min_evidence = 1.0 / theta
    for x in range(drained.shape[0]):
        drained[x] = (now - t0[x]) / t_est[x]
    for j in range(key_hashes.shape[0]):
        h = key_hashes[j]
        epoch = st_i[_EPOCH]
        # 1. SpaceSaving update: +1 if present, insert if room, else ReplaceMin
        slot, new = ss_update_slot(ck, cc, c_err, c_tree_slot, c_tree_count, c_index, c_meta, h, 1)
        if new:
            cd[slot] = 1
            cstamp[slot] = -1
            cand_n[slot] = 0
        st_f[0] += 1.0
        n_total = st_f[0]
        # 2. CHK on the live counters; d never shrinks within its epoch
        d_live = 1
        if n_total >= min_evidence:
            # guaranteed count C - E, not C (module docstring, CHK)
            d_live = _chk((cc[slot] - c_err[slot]) / n_total, theta, d_min, n_alive)
        d_kept = cd[slot] if cstamp[slot] == epoch else 1
        d = d_live if d_live > d_kept else d_kept
        if d > d_kept:
            cd[slot] = d
            cstamp[slot] = epoch
        # 3-4. candidates and heuristic choice
        if d == 1:
            w = owners[succ[j]]
        else:
            if cand_n[slot] < d:
                st_i[_STAMP] += 1
                cand_n[slot] = ring_distinct_successors(
                    owners, succ[j], d, cand[slot], seen, st_i[_STAMP]
                )
            best = -1
            best_wait = 0.0
            for c in range(min(d, cand_n[slot])):
                x = cand[slot, c]
                u = a_sent[x] - drained[x]
                wait = u * t_est[x] if u > 0.0 else 0.0
                if best < 0 or wait < best_wait:
                    best = x
                    best_wait = wait
            w = best
        # account for the message: reset a drained worker first
        if a_sent[w] - drained[w] <= 0.0:
            a_sent[w] = 0.0
            t0[w] = now
            drained[w] = 0.0  # (now - now) / t_est
        a_sent[w] += 1.0
        sent[w] += 1
        out[j] = w
        # epoch end: decay, drop, recompute the hot set
        st_i[_POS] += 1
        if st_i[_POS] >= epoch_len:
            st_i[_POS] = 0
            st_i[_EPOCH] = epoch + 1
            st_f[0] *= alpha
            n_total = st_f[0]
            k = 0
            for i in range(c_meta[0]):
                c_i = cc[i] * alpha
                if c_i >= 1.0:
                    ck[k] = ck[i]
                    cc[k] = c_i
                    c_err[k] = c_err[i] * alpha
                    cand_n[k] = cand_n[i]
                    for c in range(cand_n[i]):
                        cand[k, c] = cand[i, c]
                    f = (c_i - c_err[k]) / n_total
                    if n_total >= min_evidence and f >= theta:
                        cd[k] = _chk(f, theta, d_min, n_alive)
                        cstamp[k] = epoch + 1
                    else:
                        cd[k] = 1
                        cstamp[k] = -1
                    k += 1
            c_meta[0] = k
            ss_reindex(ck, cc, c_tree_slot, c_tree_count, c_index, k)


@register
class FISH(RingMembership):
    """FISH grouping (see the module docstring for the estimator).

    Tunables:
        epoch: messages per epoch E, in ``[1, 10**9]`` (default 10_000).
        decay: per-epoch decay alpha, in ``(0, 1]`` (default 0.5).
        theta: hot threshold on ``(C[k] - E[k]) / N``, in ``(0, 1]``; default ``None``
            = ``1 / (5 n)``.
        capacity: counters K, in ``[1, 100_000]`` (default 100).
        d_min: candidates of a hot key at least, in ``[1, n]`` (default 2,
            clipped to ``n``).
        vnodes: ring virtual nodes per worker, in ``[1, 100_000]`` (default 100).
        ewma_weight: weight of a new ack-timing sample in ``T_w``, in
            ``(0, 1]`` (default 0.25).
        ring_seed: seed of the ring's points (default 0), the same on every
            source; the per-source ``seed`` is not used for key placement.
    """

    name = "fish"
    uses_feedback = True

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        epoch: int = 10_000,
        decay: float = 0.5,
        theta: float | None = None,
        capacity: int = 100,
        d_min: int = 2,
        vnodes: int = 100,
        ewma_weight: float = 0.25,
        ring_seed: int = 0,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        _check_int("epoch", epoch, 1, 10**9)
        _check_int("capacity", capacity, 1, 100_000)
        _check_int("d_min", d_min, 1, 1_000_000)
        _check_int("vnodes", vnodes, 1, MAX_VNODES)
        if not (isinstance(decay, (int, float)) and 0.0 < decay <= 1.0):
            raise ValueError(f"decay must be in (0, 1] (got {decay!r})")
        if theta is not None and not (isinstance(theta, (int, float)) and 0.0 < theta <= 1.0):
            raise ValueError(f"theta must be in (0, 1] or None (got {theta!r})")
        if not (isinstance(ewma_weight, (int, float)) and 0.0 < ewma_weight <= 1.0):
            raise ValueError(f"ewma_weight must be in (0, 1] (got {ewma_weight!r})")
        self.epoch = int(epoch)
        self.decay = float(decay)
        self.theta = 1.0 / (5 * self.n_workers) if theta is None else float(theta)
        self.capacity = int(capacity)
        self.d_min = int(d_min)
        self.vnodes = int(vnodes)
        self.ewma_weight = float(ewma_weight)
        # identical on every source: never the per-source ``seed``
        self.ring = Ring(self.n_workers, vnodes=self.vnodes, seed=int(ring_seed))
        k = self.capacity
        self._ck = np.zeros(k, dtype=np.uint64)
        self._cc = np.zeros(k, dtype=np.float64)
        self._c_err = np.zeros(k, dtype=np.float64)  # SpaceSaving errors (decayed)
        self._c_tree_slot, self._c_tree_count = tree_arrays(k, np.float64)
        self._c_index = np.full(index_table_size(k), EMPTY, dtype=np.int64)
        self._c_meta = np.zeros(2, dtype=np.int64)  # [size, total]
        self._cd = np.ones(k, dtype=np.int64)
        self._cstamp = np.full(k, -1, dtype=np.int64)
        self._cand_n = np.zeros(k, dtype=np.int64)
        self._st_i = np.zeros(4, dtype=np.int64)
        self._st_f = np.zeros(1, dtype=np.float64)
        self._alloc_workers(self.n_workers)

    def _alloc_workers(self, size: int) -> None:
        """(Re)size the per-worker arrays, keeping existing entries."""
        old = getattr(self, "_sent", np.zeros(0, dtype=np.int64))
        n_old = len(old)

        def grow(a: np.ndarray | None, fill: float, dtype: Any) -> np.ndarray:
            b = np.full(size, fill, dtype=dtype)
            if a is not None:
                b[:n_old] = a
            return b

        self._a = grow(getattr(self, "_a", None), 0.0, np.float64)
        self._t0 = grow(getattr(self, "_t0", None), 0.0, np.float64)
        self._t = grow(getattr(self, "_t", None), PRIOR_T_S, np.float64)
        self._sent = grow(getattr(self, "_sent", None), 0, np.int64)
        self._acked = grow(getattr(self, "_acked", None), 0, np.int64)
        self._last_ack = grow(getattr(self, "_last_ack", None), -math.inf, np.float64)
        self._observed = grow(getattr(self, "_observed", None), 0, np.bool_)
        self._seen = np.zeros(size, dtype=np.int64)
        self._drained = np.zeros(size, dtype=np.float64)
        self._cand = np.zeros((self.capacity, size), dtype=np.int32)
        self._cand_n[:] = 0
        self._log_t: list[float] = getattr(self, "_log_t", [])
        self._log_sent: list[np.ndarray] = [
            np.concatenate([s, np.zeros(size - len(s), dtype=np.int64)])
            for s in getattr(self, "_log_sent", [])
        ]

    # -- routing ---------------------------------------------------------------

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int32)
        if len(h) == 0:
            return out
        now = float(self.clock())
        fish_route(
            h,
            self.ring.successor_index(h),
            self.ring.owners,
            now,
            self._ck,
            self._cc,
            self._c_err,
            self._c_tree_slot,
            self._c_tree_count,
            self._c_index,
            self._c_meta,
            self._cd,
            self._cstamp,
            self._cand,
            self._cand_n,
            self._st_i,
            self._st_f,
            self.epoch,
            self.decay,
            self.theta,
            min(self.d_min, len(self.ring.workers)),
            len(self.ring.workers),
            self._a,
            self._t0,
            self._t,
            self._sent,
            self._seen,
            self._drained,
            out,
        )
        self._log_send(now)
        return out

    def _log_send(self, now: float) -> None:
        if self._log_t and self._log_t[-1] == now:
            self._log_sent[-1] = self._sent.copy()
        else:
            self._log_t.append(now)
            self._log_sent.append(self._sent.copy())
        if len(self._log_t) > 2 * SEND_LOG_MAX:
            del self._log_t[:SEND_LOG_MAX]
            del self._log_sent[:SEND_LOG_MAX]

    # -- feedback --------------------------------------------------------------

    def on_ack(self, worker: int, signal: int = 0, acked: int = 0) -> None:
        super().on_ack(worker, signal, acked)
        w = int(worker)
        if not 0 <= w < len(self._sent) or acked <= 0:
            return
        now = float(self.clock())
        first = int(self._acked[w]) + 1  # sequence number of the first message acked now
        acked = min(int(acked), int(self._sent[w] - self._acked[w]))
        if acked <= 0:
            return
        self._acked[w] += acked
        i = bisect.bisect_left(self._log_sent, first, key=lambda s: int(s[w]))
        sent_at = self._log_t[i] if i < len(self._log_t) else now
        start = max(self._last_ack[w], sent_at)
        self._last_ack[w] = now
        interval = now - start
        if interval > 0.0:
            sample = max(MIN_T_S, interval / acked)
            if self._observed[w]:
                self._t[w] += self.ewma_weight * (sample - self._t[w])
            else:
                self._t[w] = sample
                self._observed[w] = True
            prior = float(self._t[self._observed].mean())
            self._t[~self._observed] = prior
        self._a[w] = float(self._sent[w] - self._acked[w])
        self._t0[w] = now

    def on_workers_changed(self, alive: Sequence[int]) -> None:
        """Put exactly ``alive`` on the ring (``RingMembership``: only
        departed/new workers' keys move); per-worker state grows with new ids."""
        super().on_workers_changed(alive)
        if self.n_workers > len(self._sent):
            self._alloc_workers(self.n_workers)
        self._cand_n[:] = 0  # candidates depend on the ring

    # -- reporting -------------------------------------------------------------

    def hot_keys(self) -> dict[int, int]:
        """Currently tracked keys with ``d > 1`` this epoch: key hash -> d."""
        size, epoch = int(self._c_meta[0]), int(self._st_i[_EPOCH])
        return {
            int(self._ck[i]): int(self._cd[i])
            for i in range(size)
            if self._cstamp[i] == epoch and self._cd[i] > 1
        }

    def counters(self) -> tuple[dict[int, float], float]:
        """The counter set (key hash -> decayed count) and the decayed total ``N``."""
        size = int(self._c_meta[0])
        return {int(self._ck[i]): float(self._cc[i]) for i in range(size)}, float(self._st_f[0])

    def service_time_estimates(self) -> np.ndarray:
        """Per-worker ``T_w`` (seconds per own message), prior where unobserved."""
        return self._t.copy()

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["hot_keys"] = len(self.hot_keys())
        s["epoch"] = int(self._st_i[_EPOCH])
        s["t_est_s"] = self._t.tolist()
        return s


def _check_int(name: str, v: object, lo: int, hi: int) -> None:
    if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and lo <= v <= hi):
        raise ValueError(f"{name} must be an int in [{lo}, {hi}] (got {v!r})")
