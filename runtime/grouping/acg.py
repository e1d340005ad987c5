"""ACG - adaptive consistent grouping [ours] (docs/algorithms.md, "ACG").

Consistent grouping's routing with a controller that measures instead of
signalling:

- **Routing** (every source, as CG): PoRC (``porc_route``) over ``B = n *
  virtual_per_worker`` virtual workers (VWs), then VW -> worker through a
  table. ``eps`` (default 2, not CG's 0.01) bounds every VW's load by
  ``(1 + eps)`` times the mean while keeping light keys on one VW
  (replication).
- **What is measured** is independent of the table, so the controller has no
  feedback loop to oscillate in: each worker measures its *service rate*
  (messages processed / seconds spent serving them: time stopped *during*
  service counts - that is what a slow machine is - time idle does not) and
  piggybacks it on messages it already sends (its flushes to the
  aggregator); each source counts the messages it routed per VW (PoRC
  balances VWs whatever their owner) and sends the counts once per epoch.
  Counting where messages are routed matters: what a worker *receives* is
  censored by backpressure, so an overloaded worker's VWs would look light.
- **One table for every source**: one ``AcgController`` (in the aggregator on
  the real engine, in the engine itself in the simulator) turns the reports
  into a table: every ``epoch_s`` it re-estimates the rates (EWMA, time
  constant ``tau_s``, reset when two samples in a row deviate by more than
  ``jump`` - a capacity change, planned for at once: the report that confirms
  it pulls the next plan forward; a speed-up needs one sample when the
  worker was idle and the cluster is short, ``SPEEDUP_IDLE``) and the per-VW loads (EWMA, time constant
  ``load_tau_s``, reset when a VW's count leaves its estimate by
  ``LOAD_JUMP_Z`` standard errors and 2x, the same way two ticks in a row - a
  hot key that moved), and runs ``plan_table``:
  the integer min-max allocation of VWs (smallest ``max_w load_w / rate_w``)
  by local search from the current table (moves, then swaps), applied only
  when the predicted bottleneck improves by at least ``min_gain``
  (hysteresis: a balanced cluster makes no moves), giving a VW back to a
  worker that held it before (its keys' state is there) unless a new one is
  ``HELD_PREFERENCE`` better. Each new table has a
  version; it travels back to the workers with the commit answers and from
  them, on acks, to the sources, which adopt any newer version
  (``on_ack(..., table=...)``).
- **Backlogs** (``AcgController.backlog``): per worker, what its VWs were
  routed minus what it served, since it was last idle; a plan counts the
  part beyond the smallest (in seconds of work) as load to drain within
  ``drain_s``, unless the cluster has no spare capacity to drain into
  (saturated: the workers idle for < 5% of the total rate), so a slow worker
  left with a backlog - the first moments' blind routing, a hot key that
  landed on it - sheds VWs until it has drained.
- **Admission** (``porc_admit_route``, each source): a PoRC choice is taken
  only if its worker had at most ``1 + admit`` times its share of the rates
  (the table carries them) of the source's recent messages and holds at most
  ``admit_backlog_s`` more of the source's work than the least-held worker;
  else the key tries its next PoRC choices. Only frequent keys (in the probe
  memo) are shed; a source behind its input routes with no bound. The
  reports carry where the admission moved messages from (``spill``), and the
  loads are planned from what the keys asked for.
- **Membership** follows one deterministic rule on the sources and in the
  controller (``reassign_departed`` / ``rebalance_joined``), so a departure
  is handled at once on every source without waiting for the controller,
  and the tables still agree; a new worker starts at the mean rate.
- Every live worker keeps >= 1 VW. No message migration (as CG): a move
  redirects future messages only; the aggregator's merge keeps results exact.

Guarantee: every VW's load is ``<= ceil((1 + eps) * m / B)`` per source
(PoRC); with rates measured exactly and loads stationary, the table's
bottleneck is within ``min_gain`` of what local search reaches from it.
Without a controller (``make_grouping("acg", n)`` alone) it routes as a
static CG table with ``virtual_per_worker`` VWs per worker.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.grouping.base import Clock, register
from runtime.grouping.coordination import FIRST_PLAN_S, RateReport, RoutedReport, VwTable
from runtime.grouping.fastmod import magic_of, mod_n
from runtime.grouping.porc import (
    MEMO_SIZE,
    PROBES_PER_BIN,
    ProbeMemo,
    VirtualWorkerGrouping,
    least_loaded,
    modulo_owner,
    validate_eps,
    validate_virtual_per_worker,
)
from runtime.hashing import choice_scalar
from runtime.kernels.jit import kernel

MAX_VIRTUAL_PER_WORKER = 1000
#: arrivals are put on a timeline of buckets this long (seconds)
BUCKET_S = 0.05
#: at most this many buckets are folded at once (a long silence is not replayed)
MAX_BUCKETS = 2000
#: rate samples per worker kept for the report
RECENT = 8
#: a plan must improve the bottleneck by this many standard errors of its estimate
NOISE_Z = 2.0
#: a worker's rate sample needs at least this much busy time in its window
MIN_BUSY_S = 0.02
#: a plan moves a VW to a worker that never held it (so its keys' state goes
#: to one more worker: replication) only for a bottleneck this much lower than
#: the best move back to one that did (``plan_table``'s ``held``)
HELD_PREFERENCE = 0.05
#: a VW whose routed count is this many standard errors (and at least 2x) away
#: from its estimate, in the same direction two ticks in a row, starts over
#: from the last tick's count: a hot key moved
LOAD_JUMP_Z = 6.0
#: a worker's backlog (messages routed to it and not served yet) counts in
#: the plan as extra load that drains it within this many seconds
DRAIN_S = 1.0
#: a worker busy for less than this fraction of a report's window was idle in
#: it: its backlog is counted again from there (from zero); and a cluster whose
#: workers were idle for less than ``1 - IDLE_BUSY`` of its total rate is
#: saturated (``AcgController._drain``)
IDLE_BUSY = 0.95
#: a rate sample beyond ``jump`` above the estimate resets it at once, with no
#: second sample to confirm it, from a worker idle for at least this share of
#: its report's window while the cluster is short of capacity (its VWs' load
#: above ``IDLE_BUSY`` of its measured rates): a speed-up the plan needs now
SPEEDUP_IDLE = 0.25
#: ... if it is more than ``SPEEDUP_Z`` times the relative spread of the
#: worker's previous ``SPEEDUP_SAMPLES`` samples away (and there are that many)
SPEEDUP_Z = 3.0
SPEEDUP_SAMPLES = 4
#: report times kept per worker (backlog estimates interpolate in them)
REPORT_LOG = 256
#: a source routes to a worker at most ``1 + ADMIT`` times the worker's share of
#: the cluster's rate, over its last ``ADMIT_WINDOW`` messages (``porc_admit_route``)
ADMIT = 0.2
ADMIT_WINDOW = 1500
#: ... and not to a worker holding this many seconds of its work (this
#: source's messages unacknowledged) beyond the least-held worker
ADMIT_BACKLOG_S = 0.2


# ============================================================================ admission

#: a worker's recent count may exceed its bound by this many messages (so a
#: short window's counting noise on a slow worker does not spill light keys)
ADMIT_SLACK_MSGS = 4.0
#: at most this many probes past a key's first PoRC choice look for a VW whose
#: worker is within its bound; then the first PoRC choice is taken
ADMIT_PROBES = 32
#: the decayed counts are rescaled when their growing unit passes this
_RESCALE = 1e100


@kernel()
def porc_admit_route(
    key_hashes: np.ndarray,
    loads: np.ndarray,
    m: int,
    eps: float,
    memo: np.ndarray,
    vw_owner: np.ndarray,
    bound: np.ndarray,
    held_s: np.ndarray,
    msg_s: np.ndarray,
    held_over: float,
    vw_recent: np.ndarray,
    w_recent: np.ndarray,
    state: np.ndarray,
    spill: np.ndarray,
    out: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """PoRC over the VWs (``porc_core``'s choices, bounds and memo) with a
    per-worker admission test on top; ``out[j]`` = message ``j``'s VW.

    ``vw_recent[v]`` / ``w_recent[w]``: messages routed to VW ``v`` / worker
    ``w`` over a window decaying by ``state[2]`` per message (``1 - 1 /
    window``), kept in a unit ``state[0]`` that grows by ``1 / state[2]`` per
    message (so no count is touched by the decay); ``state[1]``: all the
    messages, in that unit; ``state[3]``: messages that admission sent past
    their first PoRC choice, and ``spill`` per VW (``RoutedReport.spill``)
    those whose first choice it was minus those it took in their stead. A VW that PoRC accepts is taken only if its owner
    ``w`` stays within ``bound[w]`` (its share of the cluster's rate times ``1
    + delta``) of the recent messages, plus ``ADMIT_SLACK_MSGS``; otherwise the
    key tries its next PoRC choices, for at most ``ADMIT_PROBES`` more, and
    falls back to its first PoRC choice. The memo keeps ``porc_core``'s
    meaning (probes before ``p`` hit full VWs): it records the first PoRC
    choice, never a VW skipped by admission (whose bound may relax).
    Returns the new ``m``; the same result for one batch or any split."""
    n_bins = loads.shape[0]
    nb = np.uint64(n_bins)
    magic = magic_of(nb)
    mask = np.uint64(memo.shape[0] - 1)
    limit = PROBES_PER_BIN * n_bins + 64
    g = state[0]
    total = state[1]
    grow = 1.0 / state[2]
    least = held_s[0]  # the least-held worker's seconds of work
    for x in range(1, held_s.shape[0]):
        least = min(least, held_s[x])
    for j in range(key_hashes.shape[0]):
        h = key_hashes[j]
        m += 1
        g *= grow
        if g > _RESCALE:
            for v in range(n_bins):
                vw_recent[v] /= g
            for w in range(w_recent.shape[0]):
                w_recent[w] /= g
            total /= g
            g = 1.0
        cap = math.ceil((1.0 + eps) * m / n_bins)
        e = np.int64(h & mask)
        # a key in the memo came recently (its slot was not taken since): a
        # frequent key - only those are shed (a light key keeps its one VW:
        # shedding it would add a holder for little load)
        recent = memo[e, 0] == h
        hit = recent & (memo[e, 1] == np.uint64(cap))
        first = int(np.int64(memo[e, 2])) if hit else 1
        # the key's place in [0, 1): a worker over its backlog bound sheds
        # the keys below a point that rises with its excess - the same keys
        # each time (each gets one more holder), not every key that comes
        u = -1.0  # computed once needed
        b0 = np.int64(-1)  # the first VW PoRC accepts
        p0 = 0
        b = np.int64(-1)  # the one taken
        room = total + g
        i = first
        while i <= limit:
            c = np.int64(mod_n(choice_scalar(h, i), nb, magic))
            if loads[c] < cap:
                if b0 < 0:
                    b0 = c
                    p0 = i
                w = vw_owner[c]
                if not recent:
                    b = c
                    break
                if w_recent[w] + g <= bound[w] * room + ADMIT_SLACK_MSGS * g:
                    over = held_s[w] + msg_s[w] - least
                    if over <= 0.5 * held_over:
                        b = c
                        break
                    if u < 0.0:
                        u = float(choice_scalar(h, 0) >> np.uint64(11)) * (
                            1.0 / 9007199254740992.0)
                    if over <= held_over * (0.5 + 0.5 * u):
                        b = c
                        break
                if i - p0 >= ADMIT_PROBES:
                    break
            i += 1
        if b0 < 0:  # rare: fall back to the least-loaded bin, which has room
            b0 = least_loaded(loads)
            p0 = i
        if b < 0:
            b = b0
        elif b != b0:
            state[3] += 1.0
            spill[b0] += 1
            spill[b] -= 1
        load = loads[b] + 1
        loads[b] = load
        memo[e, 0] = h
        memo[e, 1] = np.uint64(cap)
        memo[e, 2] = np.uint64(p0 + 1 if (b == b0 and load >= cap) else p0)
        vw_recent[b] += g
        w_recent[vw_owner[b]] += g
        wb = vw_owner[b]
        held_s[wb] += msg_s[wb]
        if msg_s[wb] > 0.0 and held_s[wb] - msg_s[wb] <= least:
            least = held_s[0]
            for x in range(1, held_s.shape[0]):
                least = min(least, held_s[x])
        total += g
        out[j] = b
    state[0] = g
    state[1] = total
    return m


# ============================================================================ the table


def initial_table(n_workers: int, n_virtual: int, alive: Iterable[int] | None = None
                  ) -> np.ndarray:
    """VW ``v`` on worker ``v mod n``; VWs of workers not in ``alive`` handed out
    by ``reassign_departed``."""
    owner = modulo_owner(n_virtual, n_workers)
    if alive is not None:
        owner = reassign_departed(owner, set(alive))
    return owner


def reassign_departed(owner: np.ndarray, alive: set[int]) -> np.ndarray:
    """Give the VWs of workers not in ``alive`` away, one by one (ascending VW
    id), each to the live worker holding the fewest (ties: lowest id).
    Deterministic: every source and the controller compute the same table."""
    if not alive:
        raise ValueError("alive must contain at least one worker")
    gone = [v for v in range(len(owner)) if int(owner[v]) not in alive]
    if not gone:
        return owner
    out = owner.copy()
    count = {w: 0 for w in alive}
    for w in out.tolist():
        if w in count:
            count[w] += 1
    for v in gone:
        dst = min(count, key=lambda x: (count[x], x))
        out[v] = dst
        count[dst] += 1
    return out


def rebalance_joined(owner: np.ndarray, alive: set[int], joined: Iterable[int]) -> np.ndarray:
    """Each worker of ``joined`` (ascending) takes VWs one by one from the live
    worker holding the most (ties: lowest id; its highest VW id first) until
    it holds ``B // |alive|`` or taking would leave the giver with no more than
    the taker. Deterministic, as ``reassign_departed``."""
    out = owner.copy()
    share = len(out) // max(len(alive), 1)
    for w in sorted(set(joined) & alive):
        while True:
            counts = np.bincount(out, minlength=max(alive) + 1)
            mine = int(counts[w])
            if mine >= share:
                break
            src = max((x for x in alive if x != w), key=lambda x: (counts[x], -x), default=None)
            if src is None or counts[src] <= mine + 1:
                break
            out[int(np.flatnonzero(out == src)[-1])] = w
    return out


def bottleneck(owner: np.ndarray, vw_load: np.ndarray, rate: np.ndarray,
               alive: Sequence[int], extra: np.ndarray | None = None) -> float:
    """``max_w load_w / rate_w`` over the live workers (the table's predicted
    time per unit of input: lower = more throughput); ``extra[w]``: load of
    worker ``w`` that no VW carries (a backlog to drain)."""
    load = np.bincount(owner, weights=vw_load, minlength=len(rate))
    if extra is not None:
        load = load + extra
    a = np.asarray(alive, dtype=np.int64)
    return float((load[a] / rate[a]).max())


def _best_step(score: np.ndarray, limit: float,
               cost: np.ndarray | None) -> tuple[int, int, float]:
    """Among the steps whose ``score`` is below ``limit`` (they improve), the
    one with the smallest ``score x cost``: its index and that value (inf:
    no step improves)."""
    p = np.where(score < limit, score if cost is None else score * cost, np.inf)
    i, j = np.unravel_index(int(np.argmin(p)), p.shape)
    return int(i), int(j), float(p[i, j])


def _search(owner: np.ndarray, lam: np.ndarray, r: np.ndarray, live: np.ndarray,
            steps: int, min_step: float, extra: np.ndarray,
            cost: np.ndarray | None) -> np.ndarray:
    """Local search for the min-max table (see ``plan_table``); ``cost[v,
    w]``: the factor on the score of a step that gives VW ``v`` to worker
    ``w`` (None: 1 everywhere)."""
    n = len(r)
    new = owner.copy()
    load = np.bincount(new, weights=lam, minlength=n) + extra
    count = np.bincount(new, minlength=n)
    others = np.flatnonzero(live)
    for _ in range(steps):
        util = np.where(live, load / r, -np.inf)
        b = int(np.argmax(util))
        ub = util[b]
        mine = np.flatnonzero(new == b)
        limit = ub * (1 - min_step)  # a step must lower b's utilization this far
        # (score x cost, vw, to worker, swap vw)
        best: tuple[float, int, int, int] | None = None
        if count[b] > 1:
            # move v (of b) to u: score = max(new util of b, new util of u)
            lv = lam[mine][:, None]
            score = np.maximum((load[b] - lv) / r[b], (load[others][None, :] + lv) / r[others])
            score[:, others == b] = np.inf
            i, j, s = _best_step(score, limit,
                                 None if cost is None else cost[np.ix_(mine, others)])
            if s < np.inf:
                best = (s, int(mine[i]), int(others[j]), -1)
        theirs = np.flatnonzero(live[new] & (new != b))
        if len(theirs):
            # swap v (of b) with v2 (of u = new[v2]), lighter than v
            d = lam[mine][:, None] - lam[theirs][None, :]
            u = new[theirs]
            score = np.maximum((load[b] - d) / r[b], (load[u][None, :] + d) / r[u][None, :])
            score[d <= 0] = np.inf
            i, j, s = _best_step(score, limit, None if cost is None else np.maximum(
                cost[mine][:, u], cost[theirs, b][None, :]))
            if s < np.inf and (best is None or s < best[0] * (1 - 1e-12)):
                best = (s, int(mine[i]), int(u[j]), int(theirs[j]))
        if best is None:
            break
        _, v, u2, v2 = best
        new[v] = u2
        load[b] -= lam[v]
        load[u2] += lam[v]
        if v2 >= 0:
            new[v2] = b
            load[u2] -= lam[v2]
            load[b] += lam[v2]
        else:
            count[b] -= 1
            count[u2] += 1
    return new


def _repair(owner: np.ndarray, lam: np.ndarray, r: np.ndarray, live: np.ndarray,
            target: float, extra: np.ndarray, held: np.ndarray | None) -> np.ndarray | None:
    """Few moves from ``owner`` to a table whose bottleneck is ``<= target``:
    each worker over ``target * rate`` sheds VWs (the smallest one that ends
    its excess alone, else its largest) to the live worker they fit best
    (least room left) - among those that held the VW before, if any fits
    (``held``); None if a VW fits nowhere."""
    n = len(r)
    new = owner.copy()
    load = np.bincount(new, weights=lam, minlength=n) + extra
    cap = np.where(live, target * r, 0.0)
    for b in np.argsort(-(load - cap), kind="stable"):
        b = int(b)
        if not live[b]:
            continue
        while load[b] > cap[b] * (1 + 1e-12):
            mine = np.flatnonzero(new == b)
            if len(mine) <= 1:
                return None
            excess = load[b] - cap[b]
            enough = mine[lam[mine] >= excess]
            v = int(enough[np.argmin(lam[enough])]) if len(enough) else int(
                mine[np.argmax(lam[mine])])
            room = cap - load - lam[v]
            room[~live] = -np.inf
            room[b] = -np.inf
            fits = np.flatnonzero(room >= -1e-12 * max(cap.max(), 1.0))
            if not len(fits):
                return None
            if held is not None and held[v, fits].any():
                fits = fits[held[v, fits]]
            u = int(fits[np.argmin(room[fits])])
            new[v] = u
            load[b] -= lam[v]
            load[u] += lam[v]
    return new


def plan_table(owner: np.ndarray, vw_load: np.ndarray, rate: np.ndarray,
               alive: Sequence[int], *, min_gain: float = 0.02, slack: float = 0.01,
               min_step: float = 0.005, max_steps: int | None = None,
               extra: np.ndarray | None = None, held: np.ndarray | None = None,
               prefer: float = HELD_PREFERENCE) -> tuple[np.ndarray, int]:
    """A min-max VW allocation, reached with few moves from ``owner``.

    ``vw_load[v]``: VW ``v``'s load (any unit); ``rate[w]``: worker ``w``'s
    service rate (same unit per second; > 0 for live workers); ``extra[w]``
    (default 0): load of worker ``w`` that stays whatever its VWs (the
    controller's backlog-drain term), counted in every worker's utilization.
    ``held[v, w]`` (optional, bool): worker ``w`` has held VW ``v`` - its
    keys' state is there already, so giving ``v`` back to ``w`` adds no
    replication; a step that gives a VW to a worker that never held it must
    then score ``1 + prefer`` times better than one that does.

    1. Local search for the best bottleneck ``T*`` (``max_w load_w /
       rate_w``): repeatedly relieve the bottleneck worker ``b`` by the move
       of one of its VWs - or the swap of one with a lighter VW of another
       worker - that gives the smallest ``max(util_b, util_other)``, if that
       is below ``util_b``. Each step lowers the sorted vector of
       utilizations lexicographically, so it terminates.
    2. Hysteresis: nothing changes unless ``T*`` is at least ``min_gain``
       below the current bottleneck.
    3. Few moves: a repair from ``owner`` to the target ``min(T* (1 + slack),
       current (1 - min_gain))`` (overloaded workers shed VWs, best fit, to
       a worker that held them when one fits) is used when it moves fewer
       VWs than the search's table.

    A worker never gives its last VW; ties break on the lowest ids, so the
    result is a function of the inputs alone. Returns ``(table, moved VWs)``
    (the input table itself and 0 when nothing changes).
    """
    n = len(rate)
    live = np.zeros(n, dtype=bool)
    live[np.asarray(alive, dtype=np.int64)] = True
    if not live.any():
        raise ValueError("alive must contain at least one worker")
    lam = np.asarray(vw_load, dtype=np.float64)
    r = np.where(live, np.asarray(rate, dtype=np.float64), 1.0)
    if (r <= 0).any() or not np.isfinite(r).all():
        raise ValueError("every live worker's rate must be > 0 and finite")
    cur = np.asarray(owner, dtype=np.int32)
    ext = np.zeros(n) if extra is None else np.where(live, np.asarray(extra, np.float64), 0.0)

    def worst(table: np.ndarray) -> float:
        return float(((np.bincount(table, weights=lam, minlength=n) + ext) / r)[live].max())

    before = worst(cur)
    cost = None if held is None or prefer <= 0 else np.where(held, 1.0, 1.0 + prefer)
    best = _search(cur, lam, r, live, max_steps if max_steps is not None else 4 * len(cur),
                   min_step, ext, cost)
    t_best = worst(best)
    if not t_best <= before * (1.0 - min_gain):
        return cur, 0
    fixed = _repair(cur, lam, r, live, min(t_best * (1 + slack), before * (1 - min_gain)),
                    ext, None if cost is None else held)
    if fixed is not None and (fixed != cur).sum() < (best != cur).sum():
        best = fixed
    return best, int((best != cur).sum())


# ============================================================================ the controller


def _interp(t: float, ts: list[float], cum: list[np.ndarray], w: int) -> float:
    """Worker ``w``'s entry of the cumulative counts ``cum`` (at times ``ts``,
    ascending) at time ``t``, linear in between, constant outside."""
    i = bisect.bisect_right(ts, t)
    if i == 0:
        return float(cum[0][w])
    if i == len(ts):
        return float(cum[-1][w])
    t0, t1 = ts[i - 1], ts[i]
    a, b = float(cum[i - 1][w]), float(cum[i][w])
    return a + (b - a) * (t - t0) / (t1 - t0) if t1 > t0 else b


class _ArrivalBuckets:
    """Per-VW arrivals on a timeline of ``bucket_s`` buckets.

    Sources report at their own (staggered) times, each report covering its
    own window: its counts are spread evenly over that window. A bucket is
    *complete* once every reporting source's reports reach past its end; only
    complete buckets are used, oldest first, so a VW's load never looks
    doubled or absent because one source's report fell into an interval and
    another's did not. Counts for a bucket already taken (a source silent
    for longer than the controller waited) go to the oldest open one."""

    def __init__(self, n_virtual: int, t0: float, bucket_s: float) -> None:
        self.n_virtual = n_virtual
        self.bucket_s = bucket_s
        self.t0 = t0
        self._next = 0  # the oldest bucket not taken yet
        self._open: dict[int, np.ndarray] = {}

    def add(self, ids: np.ndarray, counts: np.ndarray, a: float, b: float) -> None:
        a, b = max(a, self.t0), max(b, self.t0)
        if b <= a or not len(ids):
            return
        d = self.bucket_s
        k0, k1 = int((a - self.t0) // d), int(math.ceil((b - self.t0) / d))
        c = np.asarray(counts, dtype=np.float64)
        first = max(k0, self._next)
        # the share for buckets already taken goes to the oldest open one:
        # late, never lost (the backlogs count every arrival)
        late = max(0.0, min(b, self.t0 + first * d) - a) / (b - a)
        for k in range(first, max(k1, first + 1)):
            lo, hi = self.t0 + k * d, self.t0 + (k + 1) * d
            share = max(0.0, min(b, hi) - max(a, lo)) / (b - a) + (late if k == first else 0.0)
            if share > 0:
                row = self._open.get(k)
                if row is None:
                    row = self._open[k] = np.zeros(self.n_virtual)
                np.add.at(row, ids, c * share)

    def take_complete(self, horizon: float) -> tuple[int, list[np.ndarray]]:
        """The buckets ending at or before ``horizon`` (oldest first), removed,
        and the index of the first; after a long silence only the last
        ``MAX_BUCKETS`` of them."""
        end = int((horizon - self.t0) / self.bucket_s + 1e-9)  # (0.5 / 0.05: 10, not 9)
        first = max(self._next, end - MAX_BUCKETS)
        out = [self._open.pop(k, None) for k in range(first, end)]
        for k in [k for k in self._open if k < end]:
            del self._open[k]
        self._next = max(self._next, end)
        return first, [np.zeros(self.n_virtual) if x is None else x for x in out]


@dataclass
class _Rate:
    """One worker's service-rate estimate (msgs/s of busy time)."""

    value: float | None = None
    processed: int = 0  # since the last sample
    busy_s: float = 0.0
    last_report: float | None = None
    pending_jump: float = 0.0  # previous sample's relative deviation (0: none)
    seen_s: float = 0.0  # busy seconds behind the estimate (EWMA warm-up)
    recent: list[tuple[float, float]] = field(default_factory=list)  # (sample, busy s)
    rel_var: float = 0.0  # EWMA of squared relative deviations of the samples
    noise: float = 1.0  # relative standard error of ``value``
    # -- the backlog (``AcgController.backlog``)
    served: float = 0.0  # messages served since the start
    served_log: list[tuple[float, float]] = field(default_factory=list)  # (t, served)
    prev_report: float = 0.0  # the previous report's time (its window's start)
    #: (t, served before t): the worker was idle at t - its backlog counts from there
    anchor: tuple[float, float] = (0.0, 0.0)
    idle_frac: float = 1.0  # the share of its latest report's window it had no work
    #: a change the worker saw in its own rate (``RateReport.recent``): the
    #: (processed, busy s) after it, the new rate at the next ``_update_rates``
    changed_to: tuple[int, float] | None = None

    @property
    def idle(self) -> bool:
        """Whether it was idle in its latest report's window (``IDLE_BUSY``)."""
        return self.idle_frac > 1.0 - IDLE_BUSY

    def confirms_jump(self, dev: float, jump: float) -> bool:
        """Whether a sample ``dev`` (relative) off the estimate is the second
        deviation beyond ``jump`` in a row, in the same direction: the
        capacity changed."""
        return abs(dev) > jump and self.pending_jump * dev > 0


@dataclass
class AcgStats:
    plans: int = 0  # tables published (each moved >= 1 VW)
    moves: int = 0  # VWs moved by plans
    membership_moves: int = 0  # VWs moved by departures / joins
    rate_resets: int = 0  # capacity changes detected
    speedups: int = 0  # of them, speed-ups taken from one sample (``SPEEDUP_IDLE``)
    load_resets: int = 0  # VW loads that jumped (a hot key moved)
    end_plans: int = 0  # plans of the backlogs left at the stream's end (``_end_plan``)
    #: per table: (t, version, moved[, predicted gain, gain needed])
    history: list[tuple[float, ...]] = field(default_factory=list)


class AcgController:
    """Turns workers' reports into VW tables; pure, clock passed in.

    ``report(worker, processed, busy_s, now)`` adds what a worker measured
    since its previous report, ``report_routed(source, since, now, vw_ids,
    vw_counts)`` what a source routed; ``tick(now)`` re-plans every
    ``epoch_s`` and returns the new ``VwTable`` (or None when nothing
    changed). ``table()`` is the current one.
    """

    def __init__(self, n_workers: int, n_virtual: int, *, epoch_s: float = 0.5,
                 tau_s: float = 2.0, load_tau_s: float = 4.0, jump: float = 0.25,
                 min_gain: float = 0.02, drain_s: float = DRAIN_S,
                 alive: Iterable[int] | None = None,
                 t0: float | None = None, sources: int | None = None) -> None:
        self.n_workers = int(n_workers)
        #: the run's sources, if known: the first loads wait for each one's
        #: first report (for at most two epochs: a source may die before it)
        self.sources = None if sources is None else int(sources)
        self.n_virtual = int(n_virtual)
        self.epoch_s = float(epoch_s)
        self.tau_s = float(tau_s)
        self.load_tau_s = float(load_tau_s)
        self.jump = float(jump)
        self.min_gain = float(min_gain)
        self.drain_s = float(drain_s)  # 0: backlogs do not count in plans
        self.alive = set(range(self.n_workers)) if alive is None else {int(w) for w in alive}
        self.owner = initial_table(self.n_workers, self.n_virtual, self.alive)
        #: [v, w]: worker ``w`` has held VW ``v`` (its keys' state is there).
        #: Replaced, never written in place: the controller reaches the
        #: aggregator through Ray, whose numpy arrays come back read-only
        self.held = self.owner[:, None] == np.arange(self.n_workers)
        self.version = 0
        self._share: np.ndarray | None = None  # the rate shares the table was made with
        self.rates = [_Rate() for _ in range(self.n_workers)]
        self.vw_rate: np.ndarray | None = None  # msgs/s per VW (EWMA)
        self._load_seen_s = 0.0
        self._load_pending = np.zeros(n_virtual, dtype=np.int8)  # last tick: +1 up, -1 down
        self._routed_to: dict[int, float] = {}  # per source: its load reports reach here
        #: per source: the time between its last two reports (a source paced
        #: at one batch per second reports that seldom, and is not silent)
        self._report_gap: dict[int, float] = {}
        self._ended: set[int] = set()  # the sources whose stream ended (source_ended)
        #: per source that routed its whole input: what its outboxes held per VW then
        self._queued: dict[int, np.ndarray] = {}
        #: arrivals per worker since the start, at the end of each bucket taken
        #: (each VW's counts go to its owner in the table of that time)
        self._arr_t: list[float] = []
        self._arr_cum: list[np.ndarray] = []
        self._owner_log: list[tuple[float, np.ndarray]] = []  # (since, table)
        self.started = False  # reports and ticks before ``start`` are ignored
        self.finished = False  # a source reached its end: no more plans
        self.t0 = 0.0
        self._last_tick = 0.0
        self._next_plan = math.inf  # when the next plan is due (``start``, ``tick``)
        self.stats = AcgStats()
        if t0 is not None:
            self.start(t0)

    # -- inputs -----------------------------------------------------------------

    def report(self, worker: int, processed: int, busy_s: float, now: float) -> None:
        """What ``worker`` measured since its previous report: messages served
        and the seconds spent serving them."""
        w = int(worker)
        if not self.started or not 0 <= w < self.n_workers:
            return
        st = self.rates[w]
        st.processed += int(processed)
        st.busy_s += max(0.0, float(busy_s))
        st.last_report = float(now)
        # the backlog: served messages over time, and where it was last empty
        before = st.served
        st.served += int(processed)
        st.served_log = [*st.served_log[-(REPORT_LOG - 1):], (float(now), st.served)]
        window = float(now) - st.prev_report
        st.idle_frac = min(1.0, max(0.0, 1.0 - float(busy_s) / window)) if window > 0 else 0.0
        if st.idle:
            # idle in [prev_report, now]: empty at some time; if it was idle
            # first, it worked through the window's last busy_s seconds and had
            # served `before` when it started (if it worked first and then
            # idled, that undercounts what it served: the estimate of its
            # backlog now is <= 0, as it is)
            st.anchor = (float(now) - float(busy_s), before)
        st.prev_report = float(now)
        if (st.value and st.busy_s >= MIN_BUSY_S
                and self._rate_changed(st, (st.processed / st.busy_s - st.value) / st.value)):
            # a capacity change, known now: planned at once, not at the next
            # epoch (up to ``epoch_s`` later; ``_update_rates`` resets the rate)
            self._next_plan = min(self._next_plan, float(now))

    def report_routed(self, source: int, since: float, now: float, vw_ids: np.ndarray,
                      vw_counts: np.ndarray, spill: np.ndarray | None = None) -> None:
        """What ``source`` routed per VW over ``[since, now)``; ``spill``: per
        VW, what its admission routed elsewhere (``RoutedReport.spill``)."""
        if not self.started:
            return
        ids = np.asarray(vw_ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < self.n_virtual)
        self._arrivals.add(ids[ok], np.asarray(vw_counts)[ok], float(since), float(now))
        if spill is not None and len(spill) == self.n_virtual:
            nz = np.flatnonzero(spill)
            self._spills.add(nz, np.asarray(spill)[nz], float(since), float(now))
        last = self._routed_to.get(int(source))
        if last is not None and float(now) > last:
            self._report_gap[int(source)] = float(now) - last
        self._routed_to[int(source)] = max(last if last is not None else -math.inf, float(now))

    def report_from(self, worker: int, report: RateReport, now: float) -> None:
        """A worker's ``RateMeter.take()`` report, received at ``now``. One
        that says the worker saw its own rate change (``recent``: its rate
        since, ``LoadMeter.change_seen``) and is beyond ``jump`` of the
        estimate resets the rate to it and plans at once: a capacity change
        is known ~0.2 s after it, not after two epochs' samples (~1 s), the
        first of which may straddle the change and look like less of one."""
        self.report(worker, report.processed, report.busy_s, now)
        w = int(worker)
        if report.recent is None or not self.started or not 0 <= w < self.n_workers:
            return
        st = self.rates[w]
        n, busy = report.recent
        if st.value and busy > 0 and abs(n / busy - st.value) > self.jump * st.value:
            st.changed_to = (int(n), float(busy))
            self._next_plan = min(self._next_plan, float(now))

    def routed_from(self, source: int, report: RoutedReport) -> None:
        """A source's ``RoutedMeter.take()`` report. The one that says it has
        routed its whole input (with its outboxes' ``queued`` counts) ends the
        planning once every source's has come, with an end plan
        (``_end_plan``); until then a draining source's reports bring its
        counts up to date (they may be seconds old by the last source's);
        its last one (``final``, after its drain) says its stream ended
        (``source_ended``)."""
        self.report_routed(source, report.since, report.now, report.vw_ids, report.vw_counts,
                           report.spill)
        if report.queued is not None:
            self._queued[int(source)] = np.asarray(report.queued, dtype=np.float64)
            if self.sources is None or len(set(self._queued) | self._ended) >= self.sources:
                self._end_plan(report.now)
                self.finish()  # nothing more is routed: its last table stands
        if report.final:
            self.source_ended(source)

    def source_ended(self, source: int) -> None:
        """``source``'s stream ended: the loads stop waiting for its reports,
        and once every source's has ended (or, with the sources unknown, at
        the first), the planning ends (``finish``). The others keep being
        planned for: a source that ends early (a short input dealt to it, a
        share of none) must not freeze the table the rest of the stream is
        routed on."""
        self._ended.add(int(source))
        self._routed_to.pop(int(source), None)
        if self.sources is None or len(self._ended) >= self.sources:
            self.finish()

    def finish(self) -> None:
        """The stream is ending: no more plans. A source that reports its end
        afterwards gets the current table, so the last sources to end all end
        on the same (the controller's last) table."""
        self.finished = True

    def start(self, t0: float) -> None:
        """The run starts at ``t0``: the estimates' clocks start there, and the
        first plan is due early (until then every worker holds R VWs)."""
        self.started = True
        self.t0 = float(t0)
        self._last_tick = float(t0)
        self._next_plan = float(t0) + min(FIRST_PLAN_S, self.epoch_s)
        self._arrivals = _ArrivalBuckets(self.n_virtual, float(t0), BUCKET_S)
        self._spills = _ArrivalBuckets(self.n_virtual, float(t0), BUCKET_S)
        self._routed_to, self._report_gap = {}, {}
        self._arr_t, self._arr_cum = [float(t0)], [np.zeros(self.n_workers)]
        self._owner_log = [(float(t0), self.owner.copy())]
        for st in self.rates:
            st.last_report = float(t0)
            st.prev_report = float(t0)
            st.anchor = (float(t0), st.served)
            st.served_log = [(float(t0), st.served)]

    def remove_worker(self, worker: int) -> VwTable | None:
        w = int(worker)
        if w not in self.alive or len(self.alive) == 1:
            return None
        self.alive.discard(w)
        return self._publish(reassign_departed(self.owner, self.alive), membership=True)

    def add_worker(self, worker: int) -> VwTable | None:
        w = int(worker)
        if w in self.alive or not 0 <= w < self.n_workers:
            return None
        self.alive.add(w)
        self.rates[w] = _Rate()  # starts at the mean rate (see _rate_vector)
        self.held = self.held & (np.arange(self.n_workers) != w)  # a new process: no state
        if self.started:
            # its backlog counts from now (arrivals before belong to others)
            t = self._arr_t[-1] if self._arr_t else self._last_tick
            self.rates[w].prev_report = self.rates[w].last_report = t
            self.rates[w].anchor = (t, 0.0)
            self.rates[w].served_log = [(t, 0.0)]
        return self._publish(rebalance_joined(self.owner, self.alive, [w]), membership=True)

    # -- planning ---------------------------------------------------------------

    def table(self) -> VwTable:
        return VwTable(self.version, self.owner.copy(),
                       None if self._share is None else self._share.copy())

    def _rate_share(self) -> np.ndarray | None:
        """Each live worker's share of the measured total rate (0 for the
        departed); None before any rate is measured."""
        rate = self._rate_vector()
        if rate is None:
            return None
        out = np.zeros(self.n_workers)
        alive = sorted(self.alive)
        out[alive] = rate[alive] / float(np.sum(rate[alive]))
        return out

    def _update_rates(self, now: float) -> None:
        for w in sorted(self.alive):
            st = self.rates[w]
            if st.last_report is not None and now - st.last_report > 2 * self.epoch_s:
                # no report for two epochs: busy all along without finishing (stopped)
                st.busy_s += now - st.last_report
                st.last_report = now
            # the worker saw its capacity change: the sample is its rate since,
            # not this window's (which straddles the change), and it is a jump
            seen, st.changed_to = st.changed_to, None
            if seen is not None:
                st.processed, st.busy_s = seen
            if st.busy_s < MIN_BUSY_S:
                continue
            if st.value is None and st.processed == 0 and st.busy_s < self.epoch_s:
                # its first calls are still in service (or its kernels compiling):
                # no rate yet - a 0 would plan it at a thousandth of the others
                continue
            sample = st.processed / st.busy_s
            st.seen_s += st.busy_s
            # EWMA (time constant tau_s of busy time) that averages all samples
            # while it is younger than tau_s: the first ones are short
            alpha = max(1.0 - math.exp(-st.busy_s / self.tau_s), st.busy_s / st.seen_s)
            if st.value is None or st.value <= 0:
                st.value, st.rel_var = sample, 0.0
            else:
                dev = (sample - st.value) / st.value
                if seen is not None or self._rate_changed(st, dev):  # the capacity changed
                    # a speed-up taken from one sample may have straddled it:
                    # the next sample further up in the same direction confirms more
                    one = seen is None and not st.confirms_jump(dev, self.jump)
                    st.value, st.seen_s, st.rel_var = sample, st.busy_s, 0.0
                    st.pending_jump = dev if one else 0.0
                    self.stats.rate_resets += 1
                    self.stats.speedups += one
                else:
                    st.pending_jump = dev if abs(dev) > self.jump else 0.0
                    st.value += alpha * (sample - st.value)
                    st.rel_var += alpha * (dev * dev - st.rel_var)
            st.recent = [*st.recent[-(RECENT - 1):], (sample, st.busy_s)]
            # standard error of an EWMA of samples with this variance
            st.noise = math.sqrt(st.rel_var * alpha / (2.0 - alpha))
            st.processed, st.busy_s = 0, 0.0

    def _rate_changed(self, st: _Rate, dev: float) -> bool:
        """Whether a sample ``dev`` (relative) off ``st``'s estimate is a
        capacity change: the second beyond ``jump`` in a row, the same way;
        or one above it from a worker idle ``SPEEDUP_IDLE`` of its window
        while the cluster is short of capacity, more than ``SPEEDUP_Z`` times
        the spread of the worker's previous samples off. When a fast worker slows, the
        plan spreads its load over the rates it knows; if another worker sped
        up at the same time (a fast role that moves), the cluster looks short
        until the speed-up is confirmed, every worker is planned above its
        rate and queues build everywhere for an epoch or two. A worker idle
        for a quarter of its window while the plan is short is not noise."""
        if st.confirms_jump(dev, self.jump):
            return True
        if dev <= self.jump or st.idle_frac < SPEEDUP_IDLE or self.vw_rate is None:
            return False
        # ... and well beyond the spread of its previous samples: a worker's
        # rate with no emulated work swings 2-3x from one report to the next
        prev = [x for x, _ in st.recent[-SPEEDUP_SAMPLES:]]
        mean = float(np.mean(prev)) if prev else 0.0
        if (len(prev) < SPEEDUP_SAMPLES or mean <= 0
                or dev <= SPEEDUP_Z * float(np.std(prev)) / mean):
            return False
        known = sum(v for w in self.alive if (v := self.rates[w].value) is not None)
        return float(self.vw_rate.sum()) > IDLE_BUSY * known

    def _update_loads(self, now: float) -> None:
        """Fold the complete buckets of routed messages into the per-VW load
        estimates: a bucket is complete when every source that still reports
        (one silent for two epochs - done, or dead - does not hold the others
        back) reported past it."""
        self._last_tick = now
        if not self._routed_to:  # no source reported yet: no bucket is complete
            return
        if (self.sources is not None and len(self._routed_to) + len(self._ended) < self.sources
                and now - self.t0 < 2 * self.epoch_s):
            return  # a source's first report is still on its way
        reporting = [t for s, t in self._routed_to.items()
                     if now - t <= max(2 * self.epoch_s, 2 * self._report_gap.get(s, 0.0))]
        # every source silent: nothing is complete past the oldest report (the
        # buckets after it would be taken empty, and its counts for them,
        # arriving later, dropped)
        horizon = min(reporting or self._routed_to.values())
        d = self._arrivals.bucket_s
        first, buckets = self._arrivals.take_complete(horizon)
        self._add_arrivals(first, buckets, d)  # the backlogs: where messages went
        # the loads: what the keys asked for (the sources' admission may have
        # sent some of a VW's messages elsewhere; the plan places the VW whole)
        _, spills = self._spills.take_complete(horizon)
        buckets = [a + s for a, s in zip(buckets, spills, strict=True)]
        jumped = self._load_jumps(buckets, d)
        for counts in buckets:
            sample = counts / d
            if self.vw_rate is None:
                if sample.sum() <= 0:
                    continue
                self.vw_rate, self._load_seen_s = sample, d
                continue
            self._load_seen_s += d
            # an EWMA that averages everything seen while it is younger than its
            # time constant (the first samples are few and noisy)
            alpha = max(1.0 - math.exp(-d / self.load_tau_s), d / self._load_seen_s)
            self.vw_rate += alpha * (sample - self.vw_rate)
        if jumped is not None and self.vw_rate is not None:
            self.vw_rate[jumped] = np.sum(buckets, axis=0)[jumped] / (len(buckets) * d)

    def _owner_at(self, t: float) -> np.ndarray:
        """The controller's table at time ``t``."""
        i = bisect.bisect_right([s for s, _ in self._owner_log], t) - 1
        return self._owner_log[max(i, 0)][1]

    def _add_arrivals(self, first: int, buckets: list[np.ndarray], d: float) -> None:
        """Each bucket's routed counts, per worker: a VW's go to its owner in
        the table of the bucket's middle (a source adopts a table a fraction
        of a second after it is made, and re-routes what its outboxes hold)."""
        for i, counts in enumerate(buckets):
            a = self.t0 + (first + i) * d
            per = np.bincount(self._owner_at(a + d / 2), weights=counts,
                              minlength=self.n_workers)
            if a > self._arr_t[-1]:  # a silence skipped: nothing arrived in it
                self._arr_t.append(a)
                self._arr_cum.append(self._arr_cum[-1])
            self._arr_t.append(a + d)
            self._arr_cum.append(self._arr_cum[-1] + per)
        # what no backlog estimate can need again: before every anchor (and
        # before the buckets still to come, for the tables)
        oldest = min([self._arr_t[-1], *(self.rates[w].anchor[0] for w in self.alive)])
        cut = bisect.bisect_right(self._arr_t, oldest) - 1
        if cut > 0:
            del self._arr_t[:cut], self._arr_cum[:cut]
        if len(self._owner_log) > 1:
            keep = bisect.bisect_right([s for s, _ in self._owner_log], oldest) - 1
            if keep > 0:
                del self._owner_log[:keep]

    def backlog(self) -> np.ndarray:
        """Per worker, messages routed to it that it has not served, as far
        as the reports tell (0 for departed workers): the arrivals its VWs
        received since it was last idle (``IDLE_BUSY``; the start, at first)
        minus what it served since then, at the latest time both the sources'
        and its own reports cover. Each count is exact; what is estimated is
        which worker a VW's messages went to while the sources adopted a new
        table (the owner at each bucket's middle)."""
        out = np.zeros(self.n_workers)
        if not self._arr_t:
            return out
        t_arr = self._arr_t[-1]
        for w in self.alive:
            st = self.rates[w]
            if not st.served_log:
                continue
            t_a, served_a = st.anchor
            tau = min(t_arr, st.served_log[-1][0])
            if tau <= t_a:
                continue
            arrived = _interp(tau, self._arr_t, self._arr_cum, w) - _interp(
                t_a, self._arr_t, self._arr_cum, w)
            ts = [t for t, _ in st.served_log]
            served = float(np.interp(tau, ts, [v for _, v in st.served_log])) - served_a
            out[w] = max(0.0, arrived - served)
        return out

    def _load_jumps(self, buckets: list[np.ndarray], d: float) -> np.ndarray | None:
        """The VWs whose routed counts over ``buckets`` left their estimates
        beyond counting noise: ``LOAD_JUMP_Z`` standard errors (Poisson) of the
        count the estimate predicts - scaled to the buckets' total, so a
        stream that slows down or speeds up as a whole moves nothing - and by
        at least 2x, in the same direction as on the previous tick (a burst
        does not last two ticks; a hot key that moved does). Such a VW's
        estimate starts over from this tick's count, while the ``load_tau_s``
        average keeps every other VW's steady."""
        if self.vw_rate is None or not buckets or self.vw_rate.sum() <= 0:
            return None
        got = np.sum(buckets, axis=0)
        if got.sum() <= 0:
            return None
        expect = self.vw_rate * (got.sum() / self.vw_rate.sum())
        z = np.abs(got - expect) / np.sqrt(expect + 1.0)
        up = (z > LOAD_JUMP_Z) & (got > 2.0 * expect)
        down = (z > LOAD_JUMP_Z) & (got < 0.5 * expect)
        prev = self._load_pending
        jumped = (up & (prev > 0)) | (down & (prev < 0))
        self._load_pending = np.where(up, 1, np.where(down, -1, 0)).astype(np.int8)
        self._load_pending[jumped] = 0
        self.stats.load_resets += int(jumped.sum())
        return jumped if jumped.any() else None

    def _rate_vector(self) -> np.ndarray | None:
        """Every worker's rate; one not measured yet is at the mean, one that
        stopped (rate 0) at a thousandth of it (plans need rates > 0)."""
        known = [v for w in self.alive if (v := self.rates[w].value) is not None]
        mean = float(np.mean(known)) if known else 0.0
        if mean <= 0:
            return None
        vals = [self.rates[w].value for w in range(self.n_workers)]
        return np.array([mean if v is None else max(v, 1e-3 * mean) for v in vals])

    def _drain(self, rate: np.ndarray) -> np.ndarray:
        """Per worker, the load (msgs/s) that drains its backlog within
        ``drain_s`` - the part of it beyond the smallest backlog of a live
        worker, in seconds of work. None when the cluster has no spare
        capacity to drain into: the rate its workers were idle for in their
        latest reports (``rate x idle share``) below ``1 - IDLE_BUSY`` of the
        total. Then the backlogs are the sources' memory bounds filling, in
        messages, and one slow worker briefly short of work must not make
        them look like seconds of misplaced load."""
        out = np.zeros(self.n_workers)
        if self.drain_s <= 0:
            return out
        alive = sorted(self.alive)
        spare = sum(rate[w] * self.rates[w].idle_frac for w in alive)
        if spare < (1.0 - IDLE_BUSY) * float(np.sum(rate[alive])):
            return out  # saturated: every backlog is the sources' memory bound
        secs = self.backlog()[alive] / rate[alive]
        out[alive] = np.maximum(secs - secs.min(), 0.0) * rate[alive] / self.drain_s
        return out

    def _move_backlog(self, owner: np.ndarray, lam: np.ndarray,
                      taken: np.ndarray | None = None) -> None:
        """A new table moves the backlog with the VWs: a source re-routes what
        its outboxes hold for a moved VW to its new owner. ``taken[v]``: the
        messages VW ``v`` takes along, when the sources said (the end plan);
        otherwise each worker's backlog is taken as spread over its VWs like
        their loads ``lam``, so a VW moved from ``x`` to ``y`` takes ``B_x
        lam_v / lam_x`` with it (what is already in ``x``'s queue stays: the
        estimate errs toward ``y``, and is corrected when ``y`` is next idle)."""
        b = self.backlog()
        load = np.bincount(self.owner, weights=lam, minlength=self.n_workers)
        for v in np.flatnonzero(owner != self.owner):
            x, y = int(self.owner[v]), int(owner[v])
            if taken is not None:
                share = float(taken[v])
            elif b[x] <= 0 or load[x] <= 0:
                continue
            else:
                share = b[x] * lam[v] / load[x]
            tx, sx = self.rates[x].anchor
            self.rates[x].anchor = (tx, sx - share)
            ty, sy = self.rates[y].anchor
            self.rates[y].anchor = (ty, sy + share)

    def _end_plan(self, now: float) -> None:
        """Every source has routed its whole input: what the workers still
        have to do is their backlogs, so plan for every backlog to end at the
        same time. The sources said what their outboxes held per VW (routed,
        never sent: what a moved VW takes along); the rest of a worker's
        backlog (sent, or queued at the worker) stays where it is. The
        min-max allocation of the movable messages over the rates, with what
        stays as each worker's fixed part (``plan_table``: the same search
        and hysteresis as the load plans), is one of finish times. In a
        saturated run the load plans have no drain term (``_drain``: the
        backlogs are then the sources' memory bounds filling, in messages, so
        a slow worker's is seconds of its work): without this plan the
        slowest workers drain alone after the others have finished."""
        if not self.started or self.finished or self.drain_s <= 0:
            return
        self._update_rates(now)
        rate = self._rate_vector()
        if rate is None:
            return
        movable = np.sum(list(self._queued.values()), axis=0)  # messages per VW
        stay = np.maximum(self.backlog() - np.bincount(self.owner, weights=movable,
                                                       minlength=self.n_workers), 0.0)
        alive = sorted(self.alive)
        owner, moved = plan_table(self.owner, movable, rate, alive, min_gain=self.min_gain,
                                  extra=stay, held=self.held)
        if not moved:
            return
        self.stats.moves += moved
        self.stats.end_plans += 1
        gain = 1.0 - (bottleneck(owner, movable, rate, alive, stay)
                      / bottleneck(self.owner, movable, rate, alive, stay))
        self._move_backlog(owner, movable, taken=movable)
        self._publish(owner, now=now, detail=(round(gain, 4), self.min_gain))

    def _gain_needed(self, lam: np.ndarray, rate: np.ndarray, extra: np.ndarray) -> float:
        """Hysteresis: ``min_gain``, or more while the estimates are noisier.

        The current bottleneck worker's predicted utilization has a relative
        standard error from its load estimate (counting noise: ``1 /
        sqrt(messages behind it)``, the estimate spanning ``min(seen, 2
        load_tau_s)`` seconds) and from its rate estimate (the spread of its
        samples); a plan must gain ``NOISE_Z`` of those, so early, short
        estimates or a noisy machine do not move VWs back and forth."""
        load = np.bincount(self.owner, weights=lam, minlength=self.n_workers)
        alive = sorted(self.alive)
        b = alive[int(np.argmax((load[alive] + extra[alive]) / rate[alive]))]
        span = min(self._load_seen_s, 2.0 * self.load_tau_s)
        load_noise = 1.0 / math.sqrt(max(load[b] * span, 1.0))
        noise = math.hypot(load_noise, self.rates[b].noise)
        return max(self.min_gain, NOISE_Z * noise)

    def tick(self, now: float) -> VwTable | None:
        """Every ``epoch_s``: re-estimate and re-plan; a new table if one was
        made. Until the estimates can support a plan (the first one needs every
        live worker's rate and the routed loads), every call tries again."""
        if not self.started or self.finished or now < self._next_plan:
            return None
        self._update_rates(now)
        self._update_loads(now)
        rate = self._rate_vector()
        unmeasured = any(self.rates[w].value is None for w in self.alive)
        if (rate is None or self.vw_rate is None or self.vw_rate.sum() <= 0
                or (unmeasured and not self.stats.plans)):
            return None
        self._next_plan = now + self.epoch_s
        lam = self.vw_rate.copy()
        lam[lam <= 0] = lam[lam > 0].min() if (lam > 0).any() else 1.0
        extra = self._drain(rate)
        needed = self._gain_needed(lam, rate, extra)
        alive = sorted(self.alive)
        owner, moved = plan_table(self.owner, lam, rate, alive, min_gain=needed, extra=extra,
                                  held=self.held)
        if not moved:
            return None
        self.stats.moves += moved
        gain = 1.0 - (bottleneck(owner, lam, rate, alive, extra)
                      / bottleneck(self.owner, lam, rate, alive, extra))
        self._move_backlog(owner, lam)
        return self._publish(owner, now=now, detail=(round(gain, 4), round(needed, 4)))

    def _publish(self, owner: np.ndarray, *, membership: bool = False,
                 now: float | None = None, detail: tuple[float, ...] = ()
                 ) -> VwTable | None:
        moved = int((owner != self.owner).sum())
        if not moved:
            return None
        self.owner = owner.astype(np.int32)
        self.held = self.held | (self.owner[:, None] == np.arange(self.n_workers))
        self.version += 1
        self._share = self._rate_share()
        if self.started:
            self._owner_log.append((float(now if now is not None else self._last_tick),
                                    self.owner.copy()))
        if membership:
            self.stats.membership_moves += moved
        else:
            self.stats.plans += 1
        self.stats.history.append((float(now if now is not None else self._last_tick),
                                   self.version, moved, *detail))
        return self.table()

    def summary(self) -> dict[str, Any]:
        rate = self._rate_vector()
        return {
            "t0": self.t0,
            "version": self.version, "plans": self.stats.plans, "moves": self.stats.moves,
            "membership_moves": self.stats.membership_moves,
            "rate_resets": self.stats.rate_resets,
            "speedups": self.stats.speedups,
            "load_resets": self.stats.load_resets,
            "end_plans": self.stats.end_plans,
            "rates": None if rate is None else [float(x) for x in rate],
            "rate_samples": [[[round(a, 1), round(b, 3)] for a, b in self.rates[w].recent]
                             for w in range(self.n_workers)],
            "vw_per_worker": np.bincount(self.owner, minlength=self.n_workers).tolist(),
            "history": [list(h) for h in self.stats.history],
        }


# ============================================================================ the grouping


def _validate_positive(name: str, value: float, hi: float) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= hi):
        raise ValueError(f"{name} must be in (0, {hi:g}] (got {value!r})")
    return float(value)


@register
class AdaptiveConsistentGrouping(VirtualWorkerGrouping):
    """ACG grouping (source side): PoRC over VWs + the controller's table.

    Tunables:
        eps: PoRC slack over VWs, in ``[0, 10]`` (default 2: a VW holds up to
            3x the mean load; light keys stay on one VW, so replication stays
            low, and the controller balances the uneven VW loads).
        virtual_per_worker: VWs per worker ``R``, in ``[1, 1000]`` (default 16):
            capacity shares in steps of ``1 / (n R)``.
        epoch_s: the controller re-plans every ``epoch_s`` seconds (default 0.5;
            the sources report their routed loads and the workers their rates
            as often: a hot key that lands on a slow worker is seen sooner).
        tau_s: time constant of the workers' rate estimates (default 2 s).
        load_tau_s: time constant of the per-VW load estimates (default 4 s:
            short enough to follow hot keys that move every few seconds, as
            in evolving Zipf streams, long enough that one epoch's noisy
            counts do not move VWs back and forth; the measurements behind
            the choice, against 20 s, are in docs/benchmarks.md, "Stress
            grid").
        jump: a rate sample this far (relative) from the estimate, twice in a
            row, resets the estimate: a capacity change (default 0.25).
        min_gain: hysteresis, the smallest relative improvement of the
            bottleneck that changes the table (default 0.02).
        drain_s: a worker's backlog counts in the plans as extra load that
            drains it within ``drain_s`` seconds (default 1; 0: backlogs are
            not counted, as before).
        admit: the sources' share bound: a worker takes at most ``1 +
            admit`` times its share of the measured rates of a source's
            recent messages (default 0.2; 0 turns admission off).
        admit_window: the recent messages of the share bound (default 1,500,
            exponentially decayed).
        admit_backlog_s: the sources' backlog bound, seconds of a worker's
            work held beyond the least-held worker (default 0.2; 0: none).

    ``epoch_s``, ``tau_s``, ``jump``, ``min_gain`` and ``drain_s`` configure
    the controller (``coordinator``), not routing.
    """

    name = "acg"
    uses_feedback = True
    coordinated = True

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        eps: float = 2.0,
        virtual_per_worker: int = 16,
        epoch_s: float = 0.5,
        tau_s: float = 2.0,
        load_tau_s: float = 4.0,
        jump: float = 0.25,
        min_gain: float = 0.02,
        drain_s: float = DRAIN_S,
        admit: float = ADMIT,
        admit_window: int = ADMIT_WINDOW,
        admit_backlog_s: float = ADMIT_BACKLOG_S,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        self.eps = validate_eps(eps)
        r = validate_virtual_per_worker(virtual_per_worker, MAX_VIRTUAL_PER_WORKER)
        self.admit = validate_eps(admit, "admit")
        if not (isinstance(admit_window, (int, np.integer)) and not isinstance(admit_window, bool)
                and 1 <= admit_window <= 10**9):
            raise ValueError(f"admit_window must be an int in [1, 1e9] (got {admit_window!r})")
        self.admit_window = int(admit_window)
        self.admit_backlog_s = (_validate_positive("admit_backlog_s", admit_backlog_s, 3600.0)
                                if admit_backlog_s else 0.0)
        self.controller_params = {
            "epoch_s": _validate_positive("epoch_s", epoch_s, 3600.0),
            "tau_s": _validate_positive("tau_s", tau_s, 3600.0),
            "load_tau_s": _validate_positive("load_tau_s", load_tau_s, 3600.0),
            "jump": _validate_positive("jump", jump, 100.0),
            "min_gain": _validate_positive("min_gain", min_gain, 1.0) if min_gain else 0.0,
            "drain_s": _validate_positive("drain_s", drain_s, 3600.0) if drain_s else 0.0,
        }
        self._init_virtual_workers(self.eps, r)
        self.version = 0
        self.adopted: list[tuple[float, int]] = []  # (clock, version) of every table taken
        # admission (``porc_admit_route``): per worker, the most it may take of
        # the recent messages (inf: no bound, until a table brings the shares)
        self._bound = np.full(self.n_workers, np.inf)
        self._vw_recent = np.zeros(self.n_virtual)
        self._w_recent = np.zeros(self.n_workers)
        # [unit, total, decay per message, spilled] (``porc_admit_route``)
        self._recent_state = np.array([1.0, 0.0, 1.0 - 1.0 / self.admit_window, 0.0])
        self._memo = ProbeMemo(MEMO_SIZE)
        self._spill = np.zeros(self.n_virtual, dtype=np.int64)
        # per worker: seconds of work this source holds there, and per message
        # (``on_held``; 0: not known, and no backlog bound)
        self._held_s = np.zeros(self.n_workers)
        self._msg_s = np.zeros(self.n_workers)
        self._behind = False  # the source is behind its input (``on_held``)
        self._bounded = False  # whether a table brought shares (``_set_bounds``)
        self._live_mask = np.ones(self.n_workers, dtype=bool)
        self._no_bound = np.full(self.n_workers, np.inf)

    @classmethod
    def coordinator(cls, n_workers: int, params: dict[str, Any],
                    alive: Iterable[int] | None = None, t0: float | None = None,
                    sources: int | None = None) -> AcgController:
        """The controller for a run of this scheme with ``params`` (validated
        here as the grouping validates them)."""
        g = cls(n_workers, **params)
        return AcgController(n_workers, g.n_virtual, alive=alive, t0=t0, sources=sources,
                             **g.controller_params)

    # -- routing ---------------------------------------------------------------

    def owner_of(self, vws: np.ndarray) -> np.ndarray:
        return self.vw_owner[vws]

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        return self.vw_owner[self.route_virtual(key_hashes)]

    def route_virtual(self, key_hashes: np.ndarray) -> np.ndarray:
        """PoRC over the VWs with the workers' admission bounds
        (``porc_admit_route``); without bounds (no shares yet, or ``admit``
        0) as CG's PoRC."""
        if self.admit <= 0 or (not self._bounded and not self._msg_s.any()):
            return super().route_virtual(key_hashes)
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int64)
        porc = self._porc
        porc.m = porc_admit_route(h, porc.loads, porc.m, porc.eps, self._memo.table,
                                  self.vw_owner, self._no_bound if self._behind else self._bound,
                                  self._held_s, self._msg_s,
                                  self.admit_backlog_s if self.admit_backlog_s > 0 else np.inf,
                                  self._vw_recent,
                                  self._w_recent, self._recent_state, self._spill, out)
        return out

    def on_held(self, held: np.ndarray, rate: np.ndarray, behind: bool = False,
                rate_bound: np.ndarray | None = None) -> None:
        """This source's unacknowledged messages per worker (queued or in
        flight) and how fast each worker drains them (msgs/s, 0: not measured
        yet: taken at the mean of the measured): a worker holding more than
        ``admit_backlog_s`` seconds of work beyond the least-held live worker
        takes no more messages until it drains (``porc_admit_route``)."""
        if self.admit_backlog_s <= 0 or self.admit <= 0:
            return
        self._behind = behind
        if behind:
            # a source behind its input fills every worker's memory bound (in
            # messages: seconds of a slow worker's work): held seconds then
            # tell the bounds apart, not a worker that fell behind; and every
            # worker is busy: the plan alone balances (no bound at all)
            self._held_s[:] = 0.0
            self._msg_s[:] = 0.0
            return
        # (once per routing step: few numpy calls)
        live = self._live_mask
        r = np.array(rate, dtype=np.float64)
        unknown = r <= 0
        if unknown.any():
            known = live & ~unknown
            if not known.any():
                self._held_s[:] = 0.0
                self._msg_s[:] = 0.0
                return
            r[unknown] = r[known].mean()
        if rate_bound is not None:
            # a worker is slower than its oldest call in flight's age says:
            # one not measured yet whose first call is still in service while
            # others' came back, one that slowed before its acks said so
            np.minimum(r, rate_bound, out=r)
        np.divide(1.0, r, out=self._msg_s)
        np.divide(held, r, out=self._held_s)
        if len(self._alive) < self.n_workers:
            # departed workers never count as the least held
            self._msg_s[~live] = 0.0
            self._held_s[~live] = np.inf

    def take_spill(self) -> np.ndarray | None:
        if not self._spill.any():
            return None
        out = self._spill.copy()
        self._spill[:] = 0
        return out

    # -- feedback --------------------------------------------------------------

    def on_table(self, table: VwTable) -> bool:
        if table.version <= self.version:
            return False
        self.adopt(table)
        return True

    def adopt(self, table: VwTable) -> None:
        """Take a newer table; VWs it gives to workers this source knows
        departed are handed out by ``reassign_departed`` (the controller does
        the same once it learns of the departure)."""
        owner = np.asarray(table.owner, dtype=np.int32)
        if len(owner) != self.n_virtual:
            raise ValueError(f"table of {len(owner)} VWs for {self.n_virtual}")
        owner = reassign_departed(owner, self._alive)
        self.migrations += int((owner != self.vw_owner).sum())
        self.vw_owner = owner.copy()
        self.version = int(table.version)
        self._set_bounds(table.share)
        self.adopted.append((self.clock(), self.version))

    # -- membership ------------------------------------------------------------

    def on_workers_changed(self, alive: Sequence[int]) -> None:
        target = self._checked_alive(alive)
        joined = target - self._alive
        self._alive = target
        owner = reassign_departed(self.vw_owner, target)
        owner = rebalance_joined(owner, target, joined)
        self.migrations += int((owner != self.vw_owner).sum())
        self.vw_owner = owner
        self._live_mask = np.zeros(self.n_workers, dtype=bool)
        self._live_mask[sorted(target)] = True
        self._set_bounds(None)  # until the controller's next table: no bounds

    def _set_bounds(self, share: np.ndarray | None) -> None:
        """The admission bounds from a table's rate shares (``1 + admit``
        times each worker's share; none without shares), and the recent
        counts per worker recomputed for the table's owners."""
        self._bounded = not (share is None or self.admit <= 0 or len(share) != self.n_workers)
        if not self._bounded:
            self._bound = np.full(self.n_workers, np.inf)
        else:
            self._bound = (1.0 + self.admit) * np.asarray(share, dtype=np.float64)
            self._bound[~self._live_mask] = 0.0  # departed workers take nothing
        self._w_recent = np.bincount(self.vw_owner, weights=self._vw_recent,
                                     minlength=self.n_workers).astype(np.float64)

    # -- reporting -------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        s = super().stats()  # with vw_per_worker
        s["table_version"] = self.version
        s["admission_spilled"] = int(self._recent_state[3])
        s["tables_adopted"] = [[float(t), int(v)] for t, v in self.adopted]
        return s


def table_agreement(history: Sequence[Sequence[float]],
                    adopted: Sequence[Sequence[Sequence[float]]],
                    duration_s: float) -> dict[str, Any]:
    """How well the sources agreed on the controller's tables.

    ``history``: the controller's ``(time, version, moved)`` per published
    table; ``adopted``: per source, its ``(time, version)`` adoptions (same
    clock). Lag = adoption - publication; ``disagree_fraction`` = time during
    which the sources held different versions, over ``duration_s`` (while
    they disagree, a moved VW's keys may go to its old and new worker).
    """
    published = {int(v): float(t) for t, v, *_ in history}
    lags = []
    spread = 0.0
    for v, t_pub in published.items():
        times = [float(t) for src in adopted for t, vv in src if int(vv) == v]
        lags += [max(0.0, t - t_pub) for t in times]
        if len(times) == len(adopted) and times:  # (a source may skip to a newer one)
            spread += max(times) - min(times)
    return {
        "tables": len(published),
        "lag_ms": {"mean": float(np.mean(lags) * 1e3) if lags else 0.0,
                   "max": float(np.max(lags) * 1e3) if lags else 0.0},
        "disagree_fraction": spread / duration_s if duration_s > 0 else 0.0,
    }


def coordinator_report(summary: dict[str, Any], adopted: Sequence[Sequence[Sequence[float]]],
                       duration_s: float) -> dict[str, Any]:
    """report.json's ``coordinator`` block (both engines): the controller's
    summary plus the sources' agreement on its tables."""
    return {**summary, "agreement": table_agreement(summary["history"], adopted, duration_s)}
