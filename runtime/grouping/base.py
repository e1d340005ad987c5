"""The grouping interface and the scheme registry.

A grouping has one required method, ``route(key_hashes) -> workers`` on a
whole micro-batch (same result as routing one message at a time), plus no-op
feedback hooks that load-aware schemes override (Storm's ``chooseTasks`` +
``refreshLoad``; Ray Serve's ``choose_replicas`` + ``on_new_queue_len_info``).

Groupings are pure: no Ray, no wall clock of their own, no global randomness.
Time comes from an injected ``clock`` (seconds, monotonic), randomness from
``seed``.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from runtime.hashing import choice

if TYPE_CHECKING:
    from runtime.grouping.signals import WorkerSignals

Clock = Callable[[], float]

SCHEMES: dict[str, type[Grouping]] = {}


def register(cls: type[Grouping]) -> type[Grouping]:
    """Class decorator: add a scheme to ``SCHEMES`` under ``cls.name``."""
    if not cls.name or cls.name in SCHEMES:
        raise ValueError(f"bad or duplicate scheme name {cls.name!r}")
    SCHEMES[cls.name] = cls
    return cls


def _zero_clock() -> float:
    return 0.0


class Grouping(ABC):
    """Routes micro-batches of 64-bit key hashes to worker ids ``0..n-1``.

    Subclasses set ``name`` (the literature term), document their guarantee,
    and implement ``route``. Constructor parameters after ``n_workers``,
    ``seed`` and ``clock`` are the scheme's tunables (keyword-only, with
    defaults); ``make_grouping`` validates them by name.
    """

    name: ClassVar[str] = ""
    #: True if the scheme learns from acks (signals, ack timings or tables).
    uses_feedback: ClassVar[bool] = False
    #: True for reference schemes that are told the configured capacities
    #: (``on_capacity``); real schemes never read them
    knows_capacities: ClassVar[bool] = False
    #: False for schemes that keep each key on one worker (KG, CH: a
    #: non-mergeable operator may run under them)
    splits_keys: ClassVar[bool] = True
    #: True if workers report to a run-wide coordinator (``coordinator``: service
    #: rates and per-VW arrivals) whose VW tables reach the sources on acks
    #: (``on_table``); such a scheme routes through ``route_virtual`` + ``owner_of``
    coordinated: ClassVar[bool] = False

    @classmethod
    def worker_signals(cls, params: dict[str, Any]) -> WorkerSignals | None:
        """The load signals every worker must piggyback on its acks for a run of
        this scheme with ``params`` (CG: ``WorkerSignals(slot_s, busy_above,
        idle_below)``, one ``LoadSignaler`` per source on each worker), or None
        for schemes that need none (workers then skip the bookkeeping)."""
        return None

    @classmethod
    def coordinator(cls, n_workers: int, params: dict[str, Any],
                    alive: Any = None, t0: float | None = None,
                    sources: int | None = None) -> Any:
        """The run-wide controller this scheme needs (ACG's ``AcgController``:
        fed by workers' reports, it publishes the sources' table), or None.
        ``t0``: when the run starts (else its ``start(t0)`` is called then);
        ``sources``: how many sources report to it."""
        return None

    def vw_per_worker(self) -> np.ndarray | None:
        """Virtual workers owned per worker (VW-based schemes), or None."""
        return None

    def route_virtual(self, key_hashes: np.ndarray) -> np.ndarray:
        """VW-based schemes: route a micro-batch to virtual workers (``int64``)."""
        raise NotImplementedError(f"scheme {self.name!r} has no virtual workers")

    def owner_of(self, vws: np.ndarray) -> np.ndarray:
        """VW-based schemes: the worker (``int32``) that owns each VW now."""
        raise NotImplementedError(f"scheme {self.name!r} has no virtual workers")

    def on_held(self, held: np.ndarray, rate: np.ndarray, behind: bool = False,
                rate_bound: np.ndarray | None = None) -> None:
        """Coordinated schemes: before a routing step, the source's
        unacknowledged messages per worker, each worker's drain rate as the
        source measured it (``backpressure.DrainRates``; 0: unmeasured), and
        whether the source is behind its input (its next batch, after this
        step, already due: unpaced, or paced and late), and an upper bound
        on each worker's rate from its oldest call in flight
        (``Outboxes.drain_bounds``). Others ignore it."""
        return None

    def take_spill(self) -> np.ndarray | None:
        """Coordinated schemes that route past a key's first choice (acg's
        admission): per VW, first choices minus arrivals since the last call
        (``RoutedReport.spill``); None when there were none."""
        return None

    def on_table(self, table: Any) -> bool:
        """A coordinator's VW table arrived (``coordinated`` schemes); True if it
        was newer and taken: messages routed before and not yet sent should go
        where ``owner_of`` now says."""
        return False

    def __init__(self, n_workers: int, seed: int = 0, clock: Clock | None = None) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1 (got {n_workers})")
        self.n_workers = int(n_workers)
        self.seed = int(seed)
        self.clock: Clock = clock or _zero_clock
        self.migrations = 0  # virtual workers / keys moved between workers
        self.signals = {"increase": 0, "decrease": 0}
        #: ``bool[n_workers]``, True = departed, or None while every worker is live
        #: (schemes without their own membership handling: see ``_live``)
        self._dead: np.ndarray | None = None

    @abstractmethod
    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        """Route a micro-batch: ``uint64[n]`` key hashes -> ``int32[n]`` workers."""

    def on_ack(self, worker: int, signal: int = 0, acked: int = 0) -> None:
        """An acknowledgement from ``worker`` for ``acked`` messages.

        ``signal`` is the worker's piggybacked load signal: +1 increase (I am
        idle, send me more), -1 decrease (I am busy), 0 none. Default: count it.
        """
        if signal > 0:
            self.signals["increase"] += 1
        elif signal < 0:
            self.signals["decrease"] += 1

    def on_capacity(self, worker: int, capacity: float) -> None:  # noqa: B027 - a no-op hook
        """``worker``'s configured capacity is now ``capacity`` (told at the start
        and at every change, only to schemes with ``knows_capacities``)."""

    def on_workers_changed(self, alive: Sequence[int]) -> None:
        """The set of live workers changed (failure, elasticity).

        Default, for schemes without their own membership handling: a liveness
        mask over ``0..n_workers-1``. ``route`` still computes the scheme's
        choice and ``_live`` sends a message whose choice departed to its
        rendezvous-hash winner among the live workers (``reroute_dead``): only
        departed workers' messages move, and a key's stand-in is the same on
        every source. A worker id ``>= n_workers`` is an error here (the
        scheme's arithmetic is fixed at ``n_workers``; build it with room and
        mark the spare ids departed instead). Schemes that re-map natively
        (CH and FISH: ``RingMembership``; CG, ACG) override this and
        ``live_workers``.
        """
        target = self._checked_alive(alive)
        dead = np.ones(self.n_workers, dtype=bool)
        dead[sorted(target)] = False
        self._dead = dead if dead.any() else None

    def _checked_alive(self, alive: Sequence[int]) -> set[int]:
        """``alive`` as a set, for schemes whose worker ids are fixed at
        ``[0, n_workers)``: ``ValueError`` if empty or naming the first id out
        of range."""
        target = {int(w) for w in alive}
        if not target:
            raise ValueError("alive must contain at least one worker")
        bad = [w for w in sorted(target) if not 0 <= w < self.n_workers]
        if bad:
            raise ValueError(
                f"worker ids must be in [0, {self.n_workers}) for scheme {self.name!r} "
                f"(got {bad[0]})"
            )
        return target

    def live_workers(self) -> list[int]:
        """The workers currently routed to, ascending.

        Default: those the liveness mask of ``on_workers_changed`` keeps. A
        scheme that overrides ``on_workers_changed`` with its own membership
        (CH's and FISH's ring, CG's and ACG's VW table) overrides this too.
        """
        if self._dead is None:
            return list(range(self.n_workers))
        return np.flatnonzero(~self._dead).tolist()

    def remove_worker(self, worker: int) -> None:
        """``worker`` departed (failure or scale-in): route nothing more to it."""
        live = [w for w in self.live_workers() if w != int(worker)]
        self.on_workers_changed(live)

    def add_worker(self, worker: int) -> None:
        """``worker`` joined (or came back)."""
        live = self.live_workers()
        if int(worker) not in live:
            self.on_workers_changed([*live, int(worker)])

    def _live(self, key_hashes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` with every message routed to a departed worker re-routed (see
        ``on_workers_changed``); ``out`` itself when every worker is live."""
        if self._dead is None:
            return out
        return reroute_dead(key_hashes, out, self._dead)

    def stats(self) -> dict[str, Any]:
        """Counters for reports: migrations and signals received."""
        return {"migrations": self.migrations, "signals": dict(self.signals)}


#: salt of the rendezvous hash used for departed workers' messages
_HRW_SALT = 0x5EED_DEAD


def reroute_dead(key_hashes: np.ndarray, dest: np.ndarray, dead: np.ndarray) -> np.ndarray:
    """Re-route the messages of ``dest`` that go to a ``dead`` worker.

    Each such message goes to the live worker ``w`` with the highest
    ``H_{salt + w}(key)`` (rendezvous hashing, Thaler & Ravishankar 1998), so
    (1) a key's stand-in depends only on the key and the live set - identical on
    every source and in every batch - and (2) a further departure moves only the
    departed worker's keys, while keys spread evenly over the live workers.
    Messages to live workers are untouched. Returns a new array.
    """
    dest = np.asarray(dest)
    out = dest.copy()
    hit = np.flatnonzero(dead[dest])
    if hit.size == 0:
        return out
    live = np.flatnonzero(~dead)
    if live.size == 0:
        raise ValueError("every worker is dead")
    h = np.asarray(key_hashes, dtype=np.uint64)[hit]
    scores = np.stack([choice(h, _HRW_SALT + int(w)) for w in live], axis=1)
    out[hit] = live[np.argmax(scores, axis=1)].astype(out.dtype)
    return out


def scheme_params(name: str) -> dict[str, Any]:
    """The tunable parameters of a scheme with their defaults."""
    cls = SCHEMES[name]
    sig = inspect.signature(cls.__init__)
    skip = {"self", "n_workers", "seed", "clock"}
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.name not in skip and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }


def make_grouping(
    name: str, n_workers: int, seed: int = 0, clock: Clock | None = None, **params: Any
) -> Grouping:
    """Build a registered scheme; unknown names or parameters raise ``ValueError``."""
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r} (known: {', '.join(sorted(SCHEMES))})")
    known = scheme_params(name)
    for p in params:
        if p not in known:
            raise ValueError(
                f"unknown parameter {p!r} for scheme {name!r} "
                f"(known: {', '.join(sorted(known)) or 'none'})"
            )
    return SCHEMES[name](n_workers, seed=seed, clock=clock, **params)
