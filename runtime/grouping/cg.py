"""CG - consistent grouping. Nasir et al., "Consistent Grouping for Skewed
Streams on Heterogeneous Clusters" (CG paper), sections 4-5.

Each source routes keys with PoRC (``porc_route``) onto ``B = n * R`` equal
virtual workers (VWs), then VW -> worker through a table that starts with
``R`` VWs per worker (VW ``v`` on worker ``v mod n``). Workers piggyback
binary load signals on their acks (worker side: ``runtime.grouping.signals.LoadSignaler``);
the source pairs them to move VWs from busy to idle workers:

- two FCFS queues, ``idle`` and ``busy``, deduplicated; a worker is in at most
  one of them (its latest signal wins) [ours];
- *increase* from ``u``: pop busy workers in arrival order until one can give
  a VW, move one VW from it to ``u``; if none can, enqueue ``u`` in ``idle``;
- *decrease* from ``o``: symmetric (pop the oldest idle worker ``u``, move one
  VW ``o -> u``; else enqueue ``o`` in ``busy``);
- a worker never gives away its last VW [ours]: a busy worker holding one VW
  is not queued, and is skipped if it got there before losing VWs;
- the moved VW is the one ``o`` acquired most recently (LIFO per worker)
  [ours], so a later reverse move undoes the earlier one instead of
  scattering VWs.

Guarantee: the VW count ``B`` is constant and every live worker keeps >= 1
VW; every VW's load is ``<= ceil((1 + eps) * m / B)`` (PoRC), so a worker's
load is its VW count times that share, and workers set their own share by
signalling. No message migration: a move only redirects future messages.

The worker-side settings ``busy_above``, ``idle_below`` and ``slot_s`` are
accepted here (the topology puts them under ``grouping``) and do not affect
routing: ``ConsistentGrouping.worker_signals(params)`` hands them to the
engines, which configure each worker's ``LoadSignaler`` with them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.grouping.base import Clock, register, scheme_params
from runtime.grouping.porc import (
    VirtualWorkerGrouping,
    validate_eps,
    validate_virtual_per_worker,
)
from runtime.grouping.signals import DEFAULT_SIGNALS, WorkerSignals

MAX_VIRTUAL_PER_WORKER = 10_000


class _FCFS:
    """A deduplicated first-come-first-served queue of worker ids."""

    def __init__(self) -> None:
        self._q: deque[int] = deque()
        self._in: set[int] = set()

    def push(self, w: int) -> None:
        if w not in self._in:
            self._in.add(w)
            self._q.append(w)

    def pop(self) -> int:
        w = self._q.popleft()
        self._in.discard(w)
        return w

    def discard(self, w: int) -> None:
        if w in self._in:
            self._in.discard(w)
            self._q.remove(w)

    def __contains__(self, w: object) -> bool:
        return w in self._in

    def __len__(self) -> int:
        return len(self._q)

    def as_list(self) -> list[int]:
        return list(self._q)


@register
class ConsistentGrouping(VirtualWorkerGrouping):
    """CG grouping: PoRC over ``n * virtual_per_worker`` VWs + a signal-driven VW table.

    Tunables:
        eps: PoRC slack over VWs, in ``[0, 10]`` (default 0.01).
        epsilon: alias of ``eps`` (older topologies spell it so);
            ``None`` = use ``eps``. Giving both with different values is an error.
        virtual_per_worker: ``R``, initial VWs per worker, in ``[1, 10_000]``
            (default 10). More = finer capacity steps, slower convergence.
        busy_above, idle_below, slot_s: the workers' load signals
            (``WorkerSignals``, whose defaults these are;
            ``0 <= idle_below <= busy_above``), for the engines
            (``worker_signals``), unused by routing.
    """

    name = "cg"
    uses_feedback = True

    def __init__(
        self,
        n_workers: int,
        seed: int = 0,
        clock: Clock | None = None,
        eps: float = 0.01,
        virtual_per_worker: int = 10,
        busy_above: float = DEFAULT_SIGNALS.busy_above,
        idle_below: float = DEFAULT_SIGNALS.idle_below,
        slot_s: float = DEFAULT_SIGNALS.slot_s,
        epsilon: float | None = None,
    ) -> None:
        super().__init__(n_workers, seed, clock)
        self.eps = validate_eps(eps)
        if epsilon is not None:
            e = validate_eps(epsilon, "epsilon")
            if eps != 0.01 and e != self.eps:
                raise ValueError(f"epsilon={epsilon} conflicts with eps={eps}: give one")
            self.eps = e
        r = validate_virtual_per_worker(virtual_per_worker, MAX_VIRTUAL_PER_WORKER)
        signals = WorkerSignals(slot_s=slot_s, busy_above=busy_above, idle_below=idle_below)
        self.busy_above = signals.busy_above
        self.idle_below = signals.idle_below
        self.slot_s = signals.slot_s
        self._init_virtual_workers(self.eps, r)
        # per worker, its VWs in acquisition order (the last one moves first)
        self._owned: list[list[int]] = [
            list(range(w, self.n_virtual, self.n_workers)) for w in range(self.n_workers)
        ]
        self.idle = _FCFS()
        self.busy = _FCFS()

    @classmethod
    def worker_signals(cls, params: dict[str, Any]) -> WorkerSignals:
        """The workers' load signals for a run with ``params`` (defaults filled in)."""
        p = {**scheme_params(cls.name), **params}
        return WorkerSignals(
            slot_s=p["slot_s"], busy_above=p["busy_above"], idle_below=p["idle_below"]
        )

    # -- routing ---------------------------------------------------------------

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        return self._porc.route(key_hashes, self.vw_owner)

    # -- feedback --------------------------------------------------------------

    def on_ack(self, worker: int, signal: int = 0, acked: int = 0) -> None:
        super().on_ack(worker, signal, acked)
        w = int(worker)
        if w not in self._alive or signal == 0:
            return
        if signal > 0:
            self._increase(w)
        else:
            self._decrease(w)

    def _can_give(self, w: int) -> bool:
        return w in self._alive and len(self._owned[w]) > 1

    def _increase(self, u: int) -> None:
        self.busy.discard(u)
        while len(self.busy):
            o = self.busy.pop()
            if self._can_give(o):
                self._move(o, u)
                return
        self.idle.push(u)

    def _decrease(self, o: int) -> None:
        self.idle.discard(o)
        if not self._can_give(o):
            return  # a worker with one VW has nothing to give: never queued
        while len(self.idle):
            u = self.idle.pop()
            if u in self._alive:
                self._move(o, u)
                return
        self.busy.push(o)

    def _move(self, src: int, dst: int) -> None:
        vw = self._owned[src].pop()
        self._owned[dst].append(vw)
        self.vw_owner[vw] = dst
        self.migrations += 1

    # -- membership ------------------------------------------------------------

    def on_workers_changed(self, alive: Sequence[int]) -> None:
        """Give departed workers' VWs to the live ones; rebalance newcomers.

        A departed worker's VWs go one by one to the live worker holding the
        fewest (ties: lowest id). A (re)joining worker takes VWs one by one from
        the live worker holding the most until it holds ``B // |alive|``. Worker
        ids must be in ``[0, n_workers)`` (``B`` is fixed at construction).
        """
        target = self._checked_alive(alive)
        gone = sorted(self._alive - target)
        new = sorted(target - self._alive)
        self._alive = target
        for w in gone:
            self.idle.discard(w)
            self.busy.discard(w)
            while self._owned[w]:
                dst = min(target, key=lambda x: (len(self._owned[x]), x))
                self._move(w, dst)
        share = self.n_virtual // len(target)
        for w in new:
            while len(self._owned[w]) < share:
                src = max(target, key=lambda x: (len(self._owned[x]), -x))
                if len(self._owned[src]) <= len(self._owned[w]) + 1:
                    break
                self._move(src, w)

    # -- reporting -------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        s = super().stats()  # with vw_per_worker
        s["idle_queue"] = self.idle.as_list()
        s["busy_queue"] = self.busy.as_list()
        return s
