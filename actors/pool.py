"""Warm actors kept between the runs of one Ray session.

Every run needs an aggregator, its workers and its sources: 7 Ray worker
processes for 4 workers and 2 sources, each starting Ray's worker (~0.35 CPU
seconds) and importing our modules (~0.6 s). A session that runs many
topologies (``runtime.compare``, a notebook holding a ``RayEngine``, the test
suite) paid that on every run: ~3 of a small run's ~6 s on 2 cores.

So a run that ended cleanly gives its actors back (``recycle``: its threads
stopped, its state dropped), and the next run of the session takes them
(``rebind``: built again from the new run's arguments, its peak RSS reset)
instead of starting new processes. A process is reused only where that
cannot change what a run computes or reports:

- only actors asked for with the default options (no placement: nothing
  pinned, no resources held while idle);
- never after a failure, an injected fault or a restart (the run's actors
  are killed, as always);
- a user's operator's processes only for a run of the same operator file,
  unchanged (``runtime.operators.file_fingerprint``: its path and a digest of
  its bytes; the module it loaded lives in the process, and the modules
  that file imports are the first run's, as in any Python session); an
  operator named by module path, never (its code cannot be told without
  importing it);
- the role and index must match (``worker-3`` stays ``worker-3``), and the
  actor options (its concurrency);
- actors the next run does not take are killed when it starts, so at most
  one run's actors wait, and none outlives the Ray session.

A reused actor keeps the Ray name it was created with (``worker-3`` in the
namespace of the run that created it); the live metrics carry the new run's
name (``run_id``), as before.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import ray

#: how long a run waits for an idle actor's recycling before starting a new one
RECYCLE_TIMEOUT_S = 30.0

#: the options of an actor that may be reused (``runtime.placement.actor_options(None)``)
REUSABLE_OPTIONS: dict[str, Any] = {"num_cpus": 0}


def _session() -> tuple[str, str]:
    """This Ray session: the driver's node (a new id for every cluster) and job."""
    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), ctx.get_job_id()


class ActorPool:
    """The idle actors of this driver's Ray session, by ``(role, index, options)``."""

    def __init__(self) -> None:
        self._session: tuple[str, str] | None = None
        #: key -> (actor, the ref of its ``recycle``: ``True`` once it is ready)
        self._idle: dict[Hashable, tuple[Any, Any]] = {}

    @staticmethod
    def key(role: str, index: int, options: dict[str, Any],
            code: Hashable = None) -> Hashable | None:
        """The pool's key for an actor, or ``None`` if it is never reused.
        ``code``: the user's code its process holds (``None``: ours only)."""
        rest = {k: v for k, v in options.items() if k not in ("name", "namespace",
                                                             "max_concurrency")}
        if rest != REUSABLE_OPTIONS:
            return None
        return role, index, options.get("max_concurrency"), code

    def _check_session(self) -> None:
        session = _session()
        if session != self._session:  # a new Ray: the old handles mean nothing
            self._session, self._idle = session, {}

    def take(self, key: Hashable | None) -> Any:
        """The idle actor for ``key`` (now the caller's), or ``None`` (none, or
        its recycling failed: then it is killed)."""
        if key is None or not ray.is_initialized():
            return None
        self._check_session()
        entry = self._idle.pop(key, None)
        if entry is None:
            return None
        actor, recycled = entry
        try:
            ok = ray.get(recycled, timeout=RECYCLE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - gone, or stuck
            ok = False
        if not ok:
            kill_quietly(actor)
            return None
        return actor

    def give(self, key: Hashable | None, actor: Any) -> bool:
        """Keep ``actor`` for the next run; it recycles meanwhile (``take``
        waits for that). ``False``: not kept (the caller kills it)."""
        if key is None or not ray.is_initialized():
            return False
        self._check_session()
        old = self._idle.pop(key, None)
        if old is not None:
            kill_quietly(old[0])
        self._idle[key] = (actor, actor.recycle.remote())
        return True

    def idle(self) -> dict[Hashable, tuple[Any, Any]]:
        """The idle actors: key -> (actor, the ref of its ``recycle``)."""
        return dict(self._idle)

    def clear(self) -> None:
        """Kill every idle actor (a run starting takes what it needs first)."""
        idle, self._idle = self._idle, {}
        if ray.is_initialized() and self._session == _session():
            for actor, _ in idle.values():
                kill_quietly(actor)


def kill_quietly(actor: Any) -> None:
    """``ray.kill(actor)``, if it still lives."""
    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001 - already gone
        pass


#: this driver's pool (one per process, like the Ray session)
POOL = ActorPool()
