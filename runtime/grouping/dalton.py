"""Dalton - learned partitioning with a contextual bandit. Zapridou, Mytilinis,
Ailamaki, "Dalton: Learned Partitioning for Distributed Data Streams", PVLDB
16(3), 2022; reference code ``ezapridou/Dalton`` (Flink ``partitioning/dalton``).

Per source, from the tuples this source routed and nothing else (no acks, no
capacities); "time" is this source's message counter ``t = 0, 1, ...``:

1. **Windows.** Slides of ``slide`` tuples (slide ``s = t // slide``); the
   window at slide ``s`` is slides ``s - S .. s`` with ``S = ceil(size /
   slide)`` (``size`` to ``size + slide`` tuples, as the reference's slide
   queue). ``L_w`` = tuples this source sent to ``w`` in the window.
2. **Hot keys.** Epochs = slides. Threshold = previous epoch's tuple count /
   ``n`` (``inf`` in epoch 0: nothing hot). A key whose count in the current
   epoch exceeds it is hot from that tuple until the end of the *next* epoch,
   and is no longer counted this epoch; a key hot again while still hot keeps
   its Q-row, a key whose row expired starts over at the initial values.
   Counts are exact while the window holds fewer than ``exact_keys`` (10,000)
   distinct keys, else a Count-Min sketch of 4 rows x 40 counters (the
   reference's ``CountMinSketch(0.05, 0.9)``); the mode is chosen at each
   epoch start.
3. **Routing.** A cold key goes to its hash worker ``H_1(k) mod n`` (KG's
   worker, ``kg.py``). A hot key asks the bandit (context = key, arms = the
   workers): with probability ``1 - explore`` (0.9) the argmax of its Q-row,
   ties to the hash worker (then lowest id); else a uniform worker, or a
   uniform one of the key's current window workers once the key is in the
   ``maxSplit`` set (it had ``maxSplit`` workers at its last reward).
4. **Learning.** After a hot tuple goes to ``w`` (state already updated):
   ``r = -(0.5 c_load + 0.5 c_red)``, ``c_load = (L_w - mean L) / max(L_w,
   mean L)``, ``c_red = |workers holding k in the window| / n``;
   ``Q[k, w] <- 0.9 Q[k, w] + 0.1 r`` (Q starts at -2, below every reward,
   so untried workers are only reached by exploring). ``maxSplit`` starts at
   2 and grows by one, up to ``min(6, n)``, when >= 70% of the Q-table's keys
   are in the ``maxSplit`` set (which then empties).

Guarantee (none on balance; it is learned): a cold key lives on exactly one
worker, its hash worker; a hot key's window worker set grows by at most one
worker per message and exploration stops widening it at ``maxSplit <=
min(6, n)`` (exploitation only picks the hash worker or a worker with a
learned Q-value, i.e. one the key was sent to since its row was created, so
it exceeds ``maxSplit`` only by returning to such a worker after it left
the window).

Not copied from the reference code (docs/algorithms.md):

- its window expiry clears the *key's* bit instead of the worker's, so a
  key's worker set never shrinks and ``c_red`` only grows. Here a key's
  workers are the live ``w`` with ``stamp[k, w] >= s - S`` (the last slide it
  was sent to ``w``): exactly the intended windowed set.
- its cooperative mode's threshold collapses to ~0 (every key hot): there is
  no cooperative mode here; each source runs one independent instance, with
  the single-partitioner threshold ``count / n``.

Decisions that are [ours]:

- Per-key state (Q-row, window stamps) is kept only for keys that were hot
  (a table, ``_tk_*``), while in the Q-table or holding a stamp in the
  window. A cold key's only worker is its hash worker, so when a key turns
  hot its hash worker is stamped with the current slide: with a threshold
  ``>= 1`` (``n <= slide``) the key had earlier tuples this epoch, all sent
  cold to it. Exact with exact counts and a fixed membership; approximate
  when the sketch over-estimates a key's first tuple, when ``n > slide``
  (every key turns hot on its first tuple; its cold tuples of epoch 0 are
  not stamped) and when its hash worker changed during the epoch.
- "Distinct keys" for the exact/sketch switch = distinct keys in the last
  ``S`` closed slides, by linear counting (Whang et al., TODS 1990) over
  ``2^16`` buckets with per-bucket last-slide stamps (O(1) per message). The
  reference uses the size of its key-assignment map, which never shrinks.
  If an epoch's exact table fills (``min(slide, 16384)`` keys), keys not in
  it use the sketch (which is always updated) for the rest of the epoch.
- A hot key's row expires at the first tuple of the epoch after next
  (reference: one tuple later, ``ts > expirationTs``).
- The ``maxSplit`` set holds Q-table keys only (a key leaves it with its
  Q-row) and a key leaves it when its window spread drops below ``maxSplit``
  (windowed sets shrink; the reference's never did); a key joins at spread
  ``>= maxSplit`` (reference ``==``).
- Membership: ``n`` above means the live workers. Departed workers are no
  arms (argmax and exploration skip them), hold no keys (``c_red``) and no
  load (their window loads, stamps and Q-column are reset, so a returning
  worker starts fresh); a cold key whose hash worker departed goes to its
  rendezvous stand-in, the same as ``Grouping._live`` (``reroute_dead``).
- Randomness: the reference seeds ``Random(3)`` once; here draw ``i`` of a
  source is ``mix64(base + i * golden)`` (SplitMix64 over a counter), ``base``
  from ``np.random.default_rng(seed)``, so the draws depend on the message
  order only, never on the batching. A uniform pick among ``k`` uses the
  high 64 bits of ``x * k`` (bias ``< k / 2^64``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.grouping.base import _HRW_SALT, Clock, Grouping, register
from runtime.grouping.fastmod import magic_of, mod_n, mulhi64
from runtime.hashing import choice_scalar, mix64_scalar
from runtime.kernels.jit import kernel
from runtime.kernels.sketches import (
    EMPTY,
    index_build,
    index_delete,
    index_find,
    index_insert,
    index_table_size,
)

# the reference's constants (ContextualBandits, State, HotStatistics)
Q_INIT = -2.0
LEARNING_RATE = 0.1
W_LOAD = 0.5
W_RED = 0.5
MAX_SPLIT_START = 2
MAX_SPLIT_CAP = 6
SPLIT_GROWTH = 0.7
CM_DEPTH = 4
CM_WIDTH = 40
# ours
LC_BITS = 16
LC_BUCKETS = 1 << LC_BITS
EXACT_TABLE_KEYS = 16_384
MAX_SLIDES = 10_000  # ceil(size / slide): rows of the per-slide load ring
MAX_WINDOW = 10**9
NEVER = -(1 << 40)  # a slide index older than every window
_CM_SALT = 0xC0_17_C0_17
_TK_INITIAL = 64

# indices into the kernel's int64 state vector
_T, _S, _POS, _TK, _EXACT, _EFILL, _OCC = 0, 1, 2, 3, 4, 5, 6
_NCUR, _NPREV, _MCUR, _MPREV, _SPLIT, _MGEN = 7, 8, 9, 10, 11, 12
_RNG, _AGGR, _NLIVE, _OCC_LIMIT, _CROSSED = 13, 14, 15, 16, 17
_N_STATE = 18


@kernel(inline=True)
def _draw(base: np.uint64, st: np.ndarray) -> np.uint64:  # pragma: no cover - compiled
    """The next 64-bit random draw of this source (counter ``st[_RNG]``)."""
    x = choice_scalar(base, st[_RNG])
    st[_RNG] += 1
    return x


@kernel(inline=True)
def _below(x: np.uint64, k: int) -> np.int64:  # pragma: no cover - compiled
    """``x`` mapped to ``0 .. k-1`` (high half of ``x * k``)."""
    return np.int64(mulhi64(x, np.uint64(k)))


@kernel(inline=True)
def _count(
    h: np.uint64, mixed: np.uint64, s: int, st: np.ndarray,
    ex_key: np.ndarray, ex_cnt: np.ndarray, ex_gen: np.ndarray, cm: np.ndarray,
) -> np.int64:  # pragma: no cover - compiled
    """Add one tuple of ``h`` to this epoch's counts; its count (exact or CM)."""
    # Count-Min, always updated (the fallback of a full exact table)
    x = choice_scalar(h, _CM_SALT)
    est = np.int64(1) << 62
    for r in range(cm.shape[0]):
        c = np.int64((((x >> np.uint64(16 * r)) & np.uint64(0xFFFF)) * np.uint64(cm.shape[1]))
                     >> np.uint64(16))
        v = cm[r, c] + 1
        cm[r, c] = v
        if v < est:
            est = v
    if st[_EXACT] == 0:
        return est
    # exact: generation-stamped open addressing; a slot of an older epoch is
    # empty (no deletions within an epoch, so probe chains stay intact)
    mask = ex_key.shape[0] - 1
    i = np.int64(mixed & np.uint64(mask))
    while True:
        if ex_gen[i] != s:
            if st[_EFILL] * 2 >= ex_key.shape[0]:
                return est  # table full this epoch: the sketch answers
            ex_gen[i] = s
            ex_key[i] = h
            ex_cnt[i] = 1
            st[_EFILL] += 1
            return np.int64(1)
        if ex_key[i] == h:
            ex_cnt[i] += 1
            return ex_cnt[i]
        i = (i + 1) & mask


@kernel(inline=True)
def _tk_remove(
    slot: int, st: np.ndarray, tk_key: np.ndarray, tk_index: np.ndarray, tk_hot: np.ndarray,
    tk_last: np.ndarray, tk_mem: np.ndarray, tk_q: np.ndarray, tk_stamp: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Drop tracked ``slot``: unindex it, move the last slot into its place."""
    index_delete(tk_key, tk_index, tk_key[slot])
    last = st[_TK] - 1
    if slot != last:
        mask = tk_index.shape[0] - 1
        i = np.int64(mix64_scalar(tk_key[last]) & np.uint64(mask))  # sketches._home
        while tk_index[i] != last:
            i = (i + 1) & mask
        tk_index[i] = slot
        tk_key[slot] = tk_key[last]
        tk_hot[slot] = tk_hot[last]
        tk_last[slot] = tk_last[last]
        tk_mem[slot] = tk_mem[last]
        for w in range(tk_q.shape[1]):
            tk_q[slot, w] = tk_q[last, w]
            tk_stamp[slot, w] = tk_stamp[last, w]
    st[_TK] = last


@kernel(inline=True)
def _home(
    h: np.uint64, nn: np.uint64, magic: np.uint64, dead: np.ndarray, live: np.ndarray, n_live: int
) -> np.int64:  # pragma: no cover - compiled
    """The key's hash worker (KG's), or its rendezvous stand-in if departed."""
    w = np.int64(mod_n(choice_scalar(h, 1), nn, magic))
    if dead[w] == 0:
        return w
    best = live[0]
    best_score = choice_scalar(h, _HRW_SALT + best)
    for a in range(1, n_live):
        x = live[a]
        score = choice_scalar(h, _HRW_SALT + x)
        if score > best_score:
            best = x
            best_score = score
    return best


@kernel(inline=True)
def _new_slide(
    st: np.ndarray, stf: np.ndarray, slide: int, n_slides: int, ring: np.ndarray,
    loads: np.ndarray, lc_cnt: np.ndarray, cm: np.ndarray,
    tk_key: np.ndarray, tk_index: np.ndarray, tk_hot: np.ndarray, tk_last: np.ndarray,
    tk_mem: np.ndarray, tk_q: np.ndarray, tk_stamp: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Slide (= epoch) ``s + 1`` starts: window expiry, threshold, counting
    mode, fresh counts, Q-table epochs, and forgetting untracked keys."""
    st[_POS] = 0
    s = st[_S] + 1
    st[_S] = s
    row = s % (n_slides + 1)
    # the slide s - S - 1 leaves the window (it used this row)
    for w in range(loads.shape[0]):
        st[_AGGR] -= ring[row, w]
        loads[w] -= ring[row, w]
        ring[row, w] = 0
    st[_OCC] -= lc_cnt[row]
    lc_cnt[row] = 0
    # hot statistics: threshold = the last epoch's count / n, mode, fresh counts
    stf[0] = slide / st[_NLIVE]
    st[_EXACT] = 1 if st[_OCC] < st[_OCC_LIMIT] else 0
    st[_EFILL] = 0
    for r in range(cm.shape[0]):
        for c in range(cm.shape[1]):
            cm[r, c] = 0
    # the Q-table moves one epoch on (rows last hot in epoch s - 2 expire)
    st[_NPREV] = st[_NCUR]
    st[_NCUR] = 0
    st[_MPREV] = st[_MCUR]
    st[_MCUR] = 0
    # forget keys neither in the Q-table nor in the window
    i = 0
    while i < st[_TK]:
        if tk_hot[i] < s - 1 and tk_last[i] < s - n_slides:
            _tk_remove(i, st, tk_key, tk_index, tk_hot, tk_last, tk_mem, tk_q, tk_stamp)
        else:
            i += 1


@kernel()
def dalton_route(
    key_hashes: np.ndarray, out: np.ndarray, st: np.ndarray, stf: np.ndarray,
    rng_base: np.uint64, slide: int, n_slides: int, explore: float,
    dead: np.ndarray, live: np.ndarray, ring: np.ndarray, loads: np.ndarray,
    lc_stamp: np.ndarray, lc_cnt: np.ndarray,
    ex_key: np.ndarray, ex_cnt: np.ndarray, ex_gen: np.ndarray, cm: np.ndarray,
    tk_key: np.ndarray, tk_index: np.ndarray, tk_hot: np.ndarray, tk_last: np.ndarray,
    tk_mem: np.ndarray, tk_q: np.ndarray, tk_stamp: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Route ``key_hashes`` in order, one message at a time (module docstring).

    Returns how many messages were routed: fewer than all when the tracked-key
    table is full (the caller grows it and calls again with the rest; the
    table is an exact map, so its capacity never changes a decision).
    ``st``/``stf`` = scalar state (``_T``...; ``stf[0]`` = threshold).
    ``ring[s % (S + 1), w]`` = tuples sent to ``w`` in slide ``s``.
    """
    n = loads.shape[0]
    nn = np.uint64(n)
    magic = magic_of(nn)
    n_rows = n_slides + 1
    tk_cap = tk_key.shape[0]
    for j in range(key_hashes.shape[0]):
        if st[_TK] >= tk_cap:
            return j
        h = key_hashes[j]
        n_live = st[_NLIVE]
        # ---- a new slide (= epoch) starts
        if st[_POS] == slide:
            _new_slide(st, stf, slide, n_slides, ring, loads, lc_cnt, cm,
                       tk_key, tk_index, tk_hot, tk_last, tk_mem, tk_q, tk_stamp)
        s = st[_S]
        oldest = s - n_slides
        mixed = mix64_scalar(h)
        # ---- hot or cold
        slot = index_find(tk_key, tk_index, h)
        if slot == EMPTY or tk_hot[slot] != s:  # not yet hot this epoch: count it
            c = _count(h, mixed, s, st, ex_key, ex_cnt, ex_gen, cm)
            if c > stf[0]:
                st[_CROSSED] += 1
                if slot == EMPTY:
                    slot = int(st[_TK])
                    st[_TK] = slot + 1
                    tk_key[slot] = h
                    tk_hot[slot] = NEVER
                    tk_last[slot] = NEVER
                    tk_mem[slot] = -1
                    for a in range(n):
                        tk_stamp[slot, a] = NEVER
                    index_insert(tk_key, tk_index, slot)
                    if stf[0] >= 1.0:  # it had earlier (cold) tuples this epoch
                        hw = _home(h, nn, magic, dead, live, n_live)
                        tk_stamp[slot, hw] = s
                        tk_last[slot] = s
                member = tk_mem[slot] == st[_MGEN]
                if tk_hot[slot] == s - 1:  # still in the Q-table: keep its row
                    st[_NPREV] -= 1
                    if member:
                        st[_MPREV] -= 1
                        st[_MCUR] += 1
                else:  # a new row
                    for a in range(n):
                        tk_q[slot, a] = Q_INIT
                    tk_mem[slot] = -1
                st[_NCUR] += 1
                tk_hot[slot] = s
        hot = slot != EMPTY and tk_hot[slot] >= s - 1
        # ---- route
        home = _home(h, nn, magic, dead, live, n_live)
        w = home
        if hot:
            u = np.float64(_draw(rng_base, st) >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            if u < 1.0 - explore:  # exploit: argmax, ties to the hash worker
                best = tk_q[slot, home]
                for a in range(n_live):
                    x = live[a]
                    if tk_q[slot, x] > best:
                        best = tk_q[slot, x]
                        w = x
            elif tk_mem[slot] == st[_MGEN]:  # explore among its current workers
                k = 0
                for a in range(n_live):
                    if tk_stamp[slot, live[a]] >= oldest:
                        k += 1
                if k == 0:
                    w = live[_below(_draw(rng_base, st), n_live)]
                else:
                    pick = _below(_draw(rng_base, st), k)
                    for a in range(n_live):
                        x = live[a]
                        if tk_stamp[slot, x] >= oldest:
                            if pick == 0:
                                w = x
                                break
                            pick -= 1
            else:
                w = live[_below(_draw(rng_base, st), n_live)]
        out[j] = w
        # ---- state
        row = s % n_rows
        ring[row, w] += 1
        loads[w] += 1
        st[_AGGR] += 1
        b = np.int64(mixed >> np.uint64(64 - LC_BITS))
        prev = np.int64(lc_stamp[b])
        if prev != s:
            if prev >= oldest:
                lc_cnt[prev % n_rows] -= 1
            else:
                st[_OCC] += 1
            lc_cnt[row] += 1
            lc_stamp[b] = s
        if slot != EMPTY:
            tk_stamp[slot, w] = s
            tk_last[slot] = s
        # ---- learn
        if hot:
            kf = 0
            for a in range(n_live):
                if tk_stamp[slot, live[a]] >= oldest:
                    kf += 1
            mean = st[_AGGR] / n_live
            lw = np.float64(loads[w])
            c_load = (lw - mean) / max(lw, mean)
            c_red = kf / n_live
            reward = -(W_LOAD * c_load + W_RED * c_red)
            tk_q[slot, w] = (1.0 - LEARNING_RATE) * tk_q[slot, w] + LEARNING_RATE * reward
            cur = tk_hot[slot] == s
            member = tk_mem[slot] == st[_MGEN]
            if kf >= st[_SPLIT] and not member:
                tk_mem[slot] = st[_MGEN]
                st[_MCUR if cur else _MPREV] += 1
            elif kf < st[_SPLIT] and member:
                tk_mem[slot] = -1
                st[_MCUR if cur else _MPREV] -= 1
            cap = MAX_SPLIT_CAP if n_live > MAX_SPLIT_CAP else n_live
            if st[_SPLIT] < cap and (st[_MCUR] + st[_MPREV]) >= SPLIT_GROWTH * (
                st[_NCUR] + st[_NPREV]
            ):
                st[_SPLIT] += 1
                st[_MGEN] += 1
                st[_MCUR] = 0
                st[_MPREV] = 0
        st[_T] += 1
        st[_POS] += 1
    return key_hashes.shape[0]


def _check_int(name: str, v: object, lo: int, hi: int) -> int:
    if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and lo <= v <= hi):
        raise ValueError(f"{name} must be an int in [{lo}, {hi}] (got {v!r})")
    return int(v)


def occupancy_limit(exact_keys: int, buckets: int = LC_BUCKETS) -> int:
    """Occupied linear-counting buckets at which the distinct-key estimate
    ``-B ln(1 - occupied / B)`` reaches ``exact_keys``."""
    return math.ceil(buckets * -math.expm1(-exact_keys / buckets))


@register
class Dalton(Grouping):
    """Dalton grouping, one independent instance per source (module docstring).

    Tunables:
        size: window length in tuples, in ``[1, 10**9]`` (default 60_000).
        slide: slide = epoch length in tuples, in ``[1, size]`` (default
            1_000), with ``ceil(size / slide) <= 10_000``.
        explore: epsilon-greedy exploration probability, in ``[0, 1]``
            (default 0.1).
        exact_keys: distinct keys in the window below which hot-key counts
            are exact (else Count-Min 40 x 4), in ``[0, 10**6]`` (default
            10_000).
    """

    name = "dalton"

    # the tracked-key table (``_alloc_tracked``): one slot per key that was hot
    _tk_key: np.ndarray
    _tk_hot: np.ndarray
    _tk_last: np.ndarray
    _tk_mem: np.ndarray
    _tk_q: np.ndarray
    _tk_stamp: np.ndarray
    _tk_index: np.ndarray

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        *,
        size: int = 60_000,
        slide: int = 1_000,
        explore: float = 0.1,
        exact_keys: int = 10_000,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        self.size = _check_int("size", size, 1, MAX_WINDOW)
        self.slide = _check_int("slide", slide, 1, self.size)
        self.n_slides = -(-self.size // self.slide)
        if self.n_slides > MAX_SLIDES:
            raise ValueError(
                f"size must be <= {MAX_SLIDES} * slide (got size={size}, slide={slide})"
            )
        if not (isinstance(explore, (int, float)) and not isinstance(explore, bool)
                and 0.0 <= explore <= 1.0):
            raise ValueError(f"explore must be in [0, 1] (got {explore!r})")
        self.explore = float(explore)
        self.exact_keys = _check_int("exact_keys", exact_keys, 0, 1_000_000)
        n = self.n_workers
        rows = self.n_slides + 1
        self._rng_base = np.random.default_rng(self.seed).integers(
            0, 2**64 - 1, dtype=np.uint64, endpoint=True
        )
        self._st = np.zeros(_N_STATE, dtype=np.int64)
        self._st[_EXACT] = 1 if self.exact_keys > 0 else 0
        self._st[_SPLIT] = MAX_SPLIT_START
        self._st[_NLIVE] = n
        self._st[_OCC_LIMIT] = occupancy_limit(self.exact_keys)
        self._stf = np.array([math.inf])
        self._dead_mask = np.zeros(n, dtype=np.uint8)
        self._live_ids = np.arange(n, dtype=np.int64)
        self._ring = np.zeros((rows, n), dtype=np.int64)
        self._loads = np.zeros(n, dtype=np.int64)
        self._lc_stamp = np.full(LC_BUCKETS, np.iinfo(np.int32).min, dtype=np.int32)
        self._lc_cnt = np.zeros(rows, dtype=np.int64)
        ex_size = 1 << max(4, (2 * min(self.slide, EXACT_TABLE_KEYS) - 1).bit_length())
        self._ex_key = np.zeros(ex_size, dtype=np.uint64)
        self._ex_cnt = np.zeros(ex_size, dtype=np.int64)
        self._ex_gen = np.full(ex_size, -1, dtype=np.int64)
        self._cm = np.zeros((CM_DEPTH, CM_WIDTH), dtype=np.int64)
        self._alloc_tracked(max(_TK_INITIAL, 4 * n))

    # -- the tracked-key table -------------------------------------------------

    def _alloc_tracked(self, cap: int) -> None:
        """(Re)allocate the tracked-key table with ``cap`` slots, keeping entries."""
        n = self.n_workers
        size = int(self._st[_TK])
        old = getattr(self, "_tk_key", None)  # None while constructing
        key = np.zeros(cap, dtype=np.uint64)
        hot = np.full(cap, NEVER, dtype=np.int64)
        last = np.full(cap, NEVER, dtype=np.int64)
        mem = np.full(cap, -1, dtype=np.int64)
        q = np.full((cap, n), Q_INIT)
        stamp = np.full((cap, n), NEVER, dtype=np.int64)
        if old is not None:
            key[:size] = self._tk_key[:size]
            hot[:size] = self._tk_hot[:size]
            last[:size] = self._tk_last[:size]
            mem[:size] = self._tk_mem[:size]
            q[:size] = self._tk_q[:size]
            stamp[:size] = self._tk_stamp[:size]
        index = np.full(index_table_size(cap), EMPTY, dtype=np.int64)
        index_build(key, index, size)
        self._tk_key, self._tk_hot, self._tk_last, self._tk_mem = key, hot, last, mem
        self._tk_q, self._tk_stamp, self._tk_index = q, stamp, index

    # -- routing ---------------------------------------------------------------

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int32)
        done = 0
        while done < len(h):
            done += dalton_route(
                h[done:], out[done:], self._st, self._stf, self._rng_base,
                self.slide, self.n_slides, self.explore,
                self._dead_mask, self._live_ids, self._ring, self._loads,
                self._lc_stamp, self._lc_cnt,
                self._ex_key, self._ex_cnt, self._ex_gen, self._cm,
                self._tk_key, self._tk_index, self._tk_hot, self._tk_last,
                self._tk_mem, self._tk_q, self._tk_stamp,
            )
            if done < len(h):
                self._alloc_tracked(2 * len(self._tk_key))
        return out

    # -- membership ------------------------------------------------------------

    def on_workers_changed(self, alive: Sequence[int]) -> None:
        """Route to exactly ``alive`` (ids in ``[0, n_workers)``): departed
        workers stop being arms; their window loads, key stamps and Q-column
        are reset, so a returning worker starts fresh."""
        before = self._dead_mask.astype(bool)
        super().on_workers_changed(alive)  # validates; sets ``_dead``
        dead = np.zeros(self.n_workers, dtype=bool) if self._dead is None else self._dead
        for w in np.flatnonzero(dead & ~before):
            self._ring[:, w] = 0
            self._loads[w] = 0
            self._tk_q[:, w] = Q_INIT
            self._tk_stamp[:, w] = NEVER
        self._dead_mask = dead.astype(np.uint8)
        live = np.flatnonzero(~dead)
        self._live_ids = np.zeros(self.n_workers, dtype=np.int64)
        self._live_ids[: len(live)] = live
        self._st[_NLIVE] = len(live)
        self._st[_AGGR] = int(self._loads.sum())

    # -- introspection (tests, reports) ----------------------------------------

    @property
    def threshold(self) -> float:
        """This epoch's hot threshold (a count above it makes a key hot)."""
        return float(self._stf[0])

    @property
    def max_split(self) -> int:
        return int(self._st[_SPLIT])

    @property
    def exact_counting(self) -> bool:
        """True if this epoch counts exactly (else Count-Min)."""
        return bool(self._st[_EXACT])

    def window_loads(self) -> np.ndarray:
        """``L_w``: tuples sent to each worker in the current window."""
        return self._loads.copy()

    def _slot(self, key_hash: int) -> int:
        size = int(self._st[_TK])
        hits = np.flatnonzero(self._tk_key[:size] == np.uint64(key_hash))
        return int(hits[0]) if len(hits) else -1

    def hot_keys(self) -> list[int]:
        """Keys in the Q-table (hot this epoch or the previous one)."""
        size, s = int(self._st[_TK]), int(self._st[_S])
        return [int(k) for k in self._tk_key[:size][self._tk_hot[:size] >= s - 1]]

    def q_values(self, key_hash: int) -> np.ndarray | None:
        """A Q-table row (copy), or None if the key is not in the Q-table."""
        slot = self._slot(key_hash)
        if slot < 0 or self._tk_hot[slot] < self._st[_S] - 1:
            return None
        return self._tk_q[slot].copy()

    def key_workers(self, key_hash: int) -> list[int]:
        """Live workers holding a tracked key in the current window (``c_red``'s
        set); ``[]`` for a key that was never hot or has left the window."""
        slot = self._slot(key_hash)
        if slot < 0:
            return []
        oldest = int(self._st[_S]) - self.n_slides
        held = (self._tk_stamp[slot] >= oldest) & (self._dead_mask == 0)
        return np.flatnonzero(held).tolist()

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["hot_keys"] = len(self.hot_keys())
        s["max_split"] = self.max_split
        s["exact_counting"] = self.exact_counting
        s["hot_crossings"] = int(self._st[_CROSSED])
        return s
