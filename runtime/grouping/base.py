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
from typing import Any, ClassVar

import numpy as np

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
    #: True if the scheme learns from acks (signals or ack timings).
    uses_feedback: ClassVar[bool] = False

    def __init__(self, n_workers: int, seed: int = 0, clock: Clock | None = None) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1 (got {n_workers})")
        self.n_workers = int(n_workers)
        self.seed = int(seed)
        self.clock: Clock = clock or _zero_clock
        self.migrations = 0  # virtual workers / keys moved between workers
        self.signals = {"increase": 0, "decrease": 0}

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

    def on_workers_changed(self, alive: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """The set of live workers changed (failure, elasticity). Default: nothing."""

    def stats(self) -> dict[str, Any]:
        """Counters for reports: migrations and signals received."""
        return {"migrations": self.migrations, "signals": dict(self.signals)}


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
