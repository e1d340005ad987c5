"""D-Choices and W-Choices. Nasir, De Francisci Morales, Kourtellis, Serafini,
"When two choices are not enough: balancing at scale in distributed stream
processing", ICDE 2016.

Each source keeps a weighted SpaceSaving summary (capacity ``capacity``,
default 100; a full summary evicts the lowest-slot minimum counter,
``runtime.kernels.sketches``) of the keys it routed and its message count ``m``. A message's key
is *head* if its *guaranteed* summary count ``g_k = c_k - e_k`` (counter minus
the error it inherited on insertion) satisfies ``g_k / m > theta`` (default
``theta = 1/(5n)``), evaluated per message *after* counting that message;
otherwise it is *tail*. Loads are this source's local per-worker counts.

Why ``g_k`` and not ``c_k`` [ours]: docs/algorithms.md defines head as
``f_k = count_k / m > theta`` with ``f_k`` the key's frequency; the summary
only bounds it, ``g_k <= true count <= c_k``. Once the summary is full every
newly inserted key starts at ``c_k = c_min + 1``, and ``c_min / m`` can reach
``1 / capacity``, which is above ``theta = 1/(5n)`` for ``n > capacity / 5``
(20 workers at the default): with ``c_k`` every new key - i.e. almost every
tail key - looked like head, W-Choices degenerated to shuffle grouping and
D-Choices spread the tail over ``d`` workers (the same symptom as the
reference bug docs/algorithms.md says not to reproduce). With ``g_k`` no key whose
true frequency is ``<= theta`` is ever head; the price is that a key with
``theta < f_k < c_min / m`` that keeps being evicted is treated as tail (PKG).

- tail key: PKG (two hashed candidates, lower local count, ties to the first).
- W-Choices head key: the least loaded of *all* ``n`` workers (ties: lowest id).
- D-Choices head key: the least loaded of ``d`` hashed choices
  ``H_1..H_d mod n`` (``H_1, H_2`` forced distinct as in PKG; later choices
  may repeat, as in the reference code); ``d >= n`` means all ``n`` workers.

``d`` (``dchoices_d``): the smallest ``d >= max(2, round(p_1 n))`` with
``p_H + p_T b_H^2 <= b_H + eps`` and
``p_1 + (p_H - p_1) b_1^d + p_T b_1^2 <= b_1 + eps``, with ``q = (n-1)/n``,
``b_H = 1 - q^(h d)``, ``b_1 = 1 - q^d``; ``d = n`` if none.

Summary refresh [ours]: ``d`` is recomputed from the summary after every
``refresh_every`` messages of this source (after message number
``j * refresh_every``, ``j >= 1``), and before the first refresh ``d = 2``.
At a refresh, the head set is every tracked key with ``g_k / m > theta`` (the
per-message rule, so a subset of the true head), ``h`` its size, ``p_1`` the
largest ``c_k / m`` and ``p_H`` the head's total ``c_k / m`` (upper bounds on
the head keys' frequencies: the conservative side for ``d``). A refresh with an empty head sets ``d = 2``. The message count is
incremented on every message (the reference bug that left it at 0 is not
reproduced: then every tracked key looked hot).

Guarantees: a tail key is on at most 2 workers (PKG); a head key on at most
``d`` (D-Choices) or ``n`` (W-Choices) workers. With ``d`` from the
inequalities the expected imbalance is bounded by ``eps`` in the paper's
model; W-Choices trades memory (head keys on all workers) for the best balance.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.grouping.base import Clock, Grouping, register
from runtime.grouping.fastmod import magic_of, mod_n
from runtime.grouping.pkg import pkg_pair
from runtime.hashing import choice_scalar
from runtime.kernels.jit import kernel
from runtime.kernels.sketches import SpaceSaving, ss_update

MODE_D = 0
MODE_W = 1


@kernel()
def dchoices_d(p1: float, p_head: float, h: int, n: int, eps: float) -> int:  # pragma: no cover
    """The number of choices for head keys (docs/algorithms.md, D-Choices)."""
    q = (n - 1) / n
    p_tail = 1.0 - p_head
    start = max(2, round(p1 * n))
    for d in range(start, n + 1):
        b_h = 1.0 - q ** (h * d)
        b_1 = 1.0 - q**d
        if p_head + p_tail * b_h**2 <= b_h + eps and (
            p1 + (p_head - p1) * b_1**d + p_tail * b_1**2 <= b_1 + eps
        ):
            return d
    return n


@kernel(inline=True)
def _refresh_d(
    counts: np.ndarray, errors: np.ndarray, size: int, m: int, theta: float, n: int, eps: float
) -> int:  # pragma: no cover
    h = 0
    top = 0
    mass = 0
    for s in range(size):
        c = counts[s]
        if c - errors[s] > theta * m:  # head on the guaranteed count (docstring)
            h += 1
            mass += c
            if c > top:
                top = c
    if h == 0:
        return 2
    return dchoices_d(top / m, mass / m, h, n, eps)


@kernel()
def _choices_route(
    key_hashes: np.ndarray,
    out: np.ndarray,
    loads: np.ndarray,
    ss_keys: np.ndarray,
    ss_counts: np.ndarray,
    ss_errors: np.ndarray,
    ss_tree_slot: np.ndarray,
    ss_tree_count: np.ndarray,
    ss_table: np.ndarray,
    ss_meta: np.ndarray,
    state: np.ndarray,
    theta: float,
    eps: float,
    refresh_every: int,
    mode: int,
) -> None:  # pragma: no cover - compiled
    """The greedy loop of D-/W-Choices. ``state = [m, d, left]``; writes ``out``."""
    n = loads.shape[0]
    nn = np.uint64(n)
    magic = magic_of(nn)
    for i in range(key_hashes.shape[0]):
        h = key_hashes[i]
        s = ss_update(
            ss_keys, ss_counts, ss_errors, ss_tree_slot, ss_tree_count, ss_table, ss_meta, h, 1
        )
        state[0] += 1
        m = state[0]
        a, b = pkg_pair(h, nn, magic)
        w = b if loads[b] < loads[a] else a
        # head on the guaranteed count c - e, never on the over-estimate c
        # (module docstring: with c every new key looks hot once n > cap / 5)
        if ss_counts[s] - ss_errors[s] > theta * m:  # head key
            if mode == MODE_W or state[1] >= n:
                w = np.int64(0)
                for j in range(1, n):
                    if loads[j] < loads[w]:
                        w = np.int64(j)
            else:
                for j in range(3, state[1] + 1):
                    c = np.int64(mod_n(choice_scalar(h, j), nn, magic))
                    if loads[c] < loads[w]:
                        w = c
        loads[w] += 1
        out[i] = w
        left = state[2] - 1
        if left == 0:  # m % refresh_every == 0, without a division per message
            state[1] = _refresh_d(ss_counts, ss_errors, ss_meta[0], m, theta, n, eps)
            left = refresh_every
        state[2] = left


class _HeadTailChoices(Grouping):
    """Shared state of D-/W-Choices: SpaceSaving summary, counts, local loads."""

    mode = MODE_D

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        capacity: int = 100,
        theta: float | None = None,
        refresh_every: int = 1000,
        eps: float = 1e-3,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        if not 1 <= capacity <= 1_000_000:
            raise ValueError(f"capacity must be in [1, 1000000] (got {capacity})")
        if theta is None:
            theta = 1.0 / (5 * self.n_workers)
        if not 0.0 < theta <= 1.0:
            raise ValueError(f"theta must be in (0, 1] (got {theta})")
        if not 1 <= refresh_every <= 1_000_000_000:
            raise ValueError(f"refresh_every must be in [1, 1e9] (got {refresh_every})")
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must be in [0, 1) (got {eps})")
        self.capacity = int(capacity)
        self.theta = float(theta)
        self.refresh_every = int(refresh_every)
        self.eps = float(eps)
        self.summary = SpaceSaving(self.capacity)
        self.loads = np.zeros(self.n_workers, dtype=np.int64)
        # [messages m, d, messages left until the next refresh of d]
        self._state = np.array([0, 2, self.refresh_every], dtype=np.int64)

    @property
    def messages(self) -> int:
        """``m``: messages routed by this source."""
        return int(self._state[0])

    @property
    def d(self) -> int:
        """The current number of choices for head keys (D-Choices)."""
        return int(self._state[1])

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int32)
        _choices_route(
            h, out, self.loads, *self.summary.arrays, self._state,
            self.theta, self.eps, self.refresh_every, self.mode,
        )  # fmt: skip
        return self._live(h, out)

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["d"] = self.d
        s["messages"] = self.messages
        return s


@register
class DChoices(_HeadTailChoices):
    """D-Choices: head keys get ``d`` hashed choices, tail keys PKG's two.

    Tunables:
        capacity: SpaceSaving counters, in ``[1, 1e6]`` (default 100).
        theta: head threshold on ``(c_k - e_k) / m``, in ``(0, 1]`` (default ``1/(5n)``).
        refresh_every: messages between recomputations of ``d``, in
            ``[1, 1e9]`` (default 1000, one micro-batch).
        eps: imbalance tolerance in the ``d`` inequalities, in ``[0, 1)``
            (default 1e-3).
    """

    name = "dchoices"
    mode = MODE_D


@register
class WChoices(_HeadTailChoices):
    """W-Choices: head keys go to the least loaded of all workers, tail keys PKG.

    Tunables:
        capacity: SpaceSaving counters, in ``[1, 1e6]`` (default 100).
        theta: head threshold on ``(c_k - e_k) / m``, in ``(0, 1]`` (default ``1/(5n)``).
    """

    name = "wchoices"
    mode = MODE_W

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        capacity: int = 100,
        theta: float | None = None,
    ) -> None:
        super().__init__(n_workers, seed, clock, capacity=capacity, theta=theta)
