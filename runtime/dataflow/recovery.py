"""A source's side of recovery: membership, worker deaths, a restart's resume.

Plain classes, no Ray (``runtime.dataflow.source.SourceCore`` composes them; the
exactly-once bookkeeping itself is ``runtime.dataflow.reliability``):

- ``Membership``: the workers the source routes to, kept in step with its
  grouping; failure and join notices from other threads.
- ``take_lost``: what a dead worker leaves to replay, from the ``ReplayLog``
  and the worker's final committed flush.
- ``FailureLog``: one record per worker death and the replayed sub-batches
  each still waits for; a death is recovered once they are all settled.
- ``Resume``: a restarted source's progress through its ``ResumePlan``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.dataflow.messages import CommittedClaims, WorkerFence
from runtime.dataflow.reliability import Entry, ReplayLog, ResumePlan, resume_plan, take


class Membership:
    """The live workers: routed to by the grouping, which is told every change.

    A worker that died or was retired (``gone``) never comes back under its id.
    ``notify_failed`` and ``notify_added`` may be called from any thread; the
    streaming thread collects them with ``take_notices``."""

    def __init__(self, n_workers: int, grouping: Any, dead_workers: Iterable[int] = ()) -> None:
        self.grouping = grouping
        self.live = set(range(n_workers)) - {int(w) for w in dead_workers}
        for w in sorted(set(range(n_workers)) - self.live):
            self.grouping.remove_worker(w)
        self.gone: set[int] = set()
        self.joins: list[dict[str, Any]] = []
        self._failed: set[int] = set()
        self._added: set[int] = set()
        self._lock = threading.Lock()

    def notify_failed(self, worker: int) -> None:
        with self._lock:
            self._failed.add(int(worker))

    def notify_added(self, worker: int) -> None:
        with self._lock:
            self._added.add(int(worker))

    def take_notices(self) -> tuple[list[int], list[int]]:
        """``(failed, added)`` since the last call, each sorted."""
        if not self._failed and not self._added:
            return [], []
        with self._lock:
            failed, self._failed = sorted(self._failed), set()
            added, self._added = sorted(self._added), set()
        return failed, added

    def add(self, worker: int, now: float) -> None:
        """``worker`` joined (ignored if live already, or gone)."""
        if worker not in self.live and worker not in self.gone:
            self.live.add(worker)
            self.grouping.add_worker(worker)
            self.joins.append({"worker": worker, "added_ts": now})

    def remove(self, worker: int) -> None:
        """``worker`` died: never routed to again."""
        self.live.discard(worker)
        self.gone.add(worker)
        self.grouping.remove_worker(worker)


def _messages(entries: Iterable[Entry]) -> int:
    return sum(len(e.idx) for e in entries)


@dataclass
class Loss:
    """What a dead worker leaves its source."""

    lost: list[Entry]  # to re-route, oldest batch first
    settled: list[Entry]  # held entries its committed flushes cover: done
    #: messages committed although this source never saw their ack
    committed_unacked: int
    #: messages acked that no committed flush holds: their new workers ack them again
    acked_again: int


def take_lost(log: ReplayLog, worker: int, committed_seq: int,
              committed: Sequence[tuple[int, np.ndarray]]) -> Loss:
    """Remove dead ``worker``'s entries from ``log`` (``committed_seq``: its
    final committed flush; ``committed``: the ``(batch, idx)`` of this source
    its committed flushes hold) and sort them into lost and settled."""
    held = log.entries(worker)
    unacked = _messages(e for e in held if e.flush_seq is None)
    lost = log.take(worker, committed_seq, committed)
    kept = set(lost)  # a partly committed entry is lost as a new, smaller one
    return Loss(lost=lost, settled=[e for e in held if e not in kept],
                committed_unacked=unacked - _messages(e for e in lost if e.flush_seq is None),
                acked_again=_messages(e for e in lost if e.flush_seq is not None))


class FailureLog:
    """Every worker death a source handled (``records``) and, per death still
    recovering, the replayed sub-batches it waits for.

    The waits hold the entries themselves (``Entry`` compares by identity), so
    an identity is never reused while it is waited for - as an ``id()`` would
    be once its entry was freed."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._waiting: dict[int, set[Entry]] = {}  # record index -> replays not settled

    def lost(self, record: dict[str, Any], loss: Loss, replays: Sequence[list[Entry]],
             now: float) -> None:
        """A worker died: ``record`` describes it, ``replays[i]`` are the entries
        ``loss.lost[i]`` was re-routed as. A replay of an earlier death lost
        again makes that death wait for its new replays."""
        for e, new in zip(loss.lost, replays, strict=True):
            self._replace(e, new)
        waiting = {x for new in replays for x in new}
        self.records.append({**record, "recovered_ts": None if waiting else now})
        if waiting:
            self._waiting[len(self.records) - 1] = waiting
        self.settle(loss.settled, now)

    def split(self, entry: Entry, parts: Iterable[Entry]) -> None:
        """A replayed ``entry`` was re-split into ``parts`` (a new VW table)."""
        self._replace(entry, parts)

    def _replace(self, entry: Entry, new: Iterable[Entry]) -> None:
        for waiting in self._waiting.values():
            if entry in waiting:
                waiting.discard(entry)
                waiting.update(new)

    def settle(self, entries: Iterable[Entry], now: float) -> None:
        """Replayed ``entries`` need nothing more; a death whose replays are all
        settled is recovered at ``now``."""
        done = set(entries)
        for i, waiting in list(self._waiting.items()):
            waiting -= done
            if not waiting:
                self.records[i]["recovered_ts"] = now
                del self._waiting[i]


class Resume:
    """A restarted source's pass over its shard (``ResumePlan``): batches before
    ``start_batch`` are skipped; in a batch a dead incarnation may have sent,
    what live workers hold uncommitted is retained (a later worker death
    replays it) and only the rest is sent again. ``stats`` counts it."""

    def __init__(self, plan: ResumePlan) -> None:
        self.plan = plan
        self.stats: dict[str, Any] = {
            "start_batch": plan.start_batch, "skipped_batches": 0, "reread_batches": 0,
            "skipped_messages": 0, "resent_messages": 0, "retained": 0}
        #: workers that died during the pass -> their final committed flush
        self._lost: dict[int, int] = {}

    def worker_lost(self, worker: int, committed_seq: int) -> None:
        """``worker`` died (fenced, final committed flush ``committed_seq``)
        before the pass reached every batch it held uncommitted: those messages
        are sent again when their batch comes, not skipped."""
        self._lost[int(worker)] = int(committed_seq)

    def covers(self, batch: int) -> bool:
        """``batch`` may have been sent by the dead incarnation."""
        return batch <= self.plan.last_claimed_batch

    def skips(self, batch: int) -> bool:
        """``batch`` is wholly committed: not even re-read."""
        if batch < self.plan.start_batch:
            self.stats["skipped_batches"] += 1
            return True
        return False

    def split(self, batch: int, records: Any, hashes: np.ndarray, emit_ts: float,
              live: set[int]) -> tuple[np.ndarray, list[Entry]]:
        """Re-read batch ``batch`` (``records`` and their key ``hashes``): the
        message indices to send, and the entries to retain for live workers."""
        n = records.num_rows
        todo, retain = self.plan.split(batch, n)
        self.stats["reread_batches"] += 1
        kept = [Entry(w, batch, idx, take(records, idx), hashes[idx], emit_ts,
                      flush_seq=seq, replay=True)
                for w, idx, seq in retain if w in live]
        # held by a worker that died since the plan was made, and not committed
        # there: neither retained (its worker is gone) nor skipped (lost), but sent
        again = [idx for w, idx, seq in retain if w not in live and seq > self._lost[w]]
        if again:
            todo = np.union1d(todo, np.concatenate(again)).astype(todo.dtype)
        self.stats["retained"] += _messages(kept)
        self.stats["skipped_messages"] += n - len(todo)
        self.stats["resent_messages"] += len(todo)
        return todo, kept


def plan_resume(live: Iterable[int], fence_on: Callable[[int], WorkerFence | None],
                fence_dead: Callable[[int], Any],
                committed_claims: Callable[[], CommittedClaims]) -> ResumePlan:
    """A restarted source's ``ResumePlan``: fence its older incarnations on
    every worker in ``live`` (``fence_on(w)``: the worker's claims, or None if
    it is dead), then read what the aggregator committed.

    A worker found dead is fenced at the aggregator (``fence_dead``) *before*
    the committed claims are read: a flush it sent before dying may still be on
    its way, and committed after the plan took it for lost it would count
    twice what the plan re-sends (the fault explorer found it, seed 8463)."""
    fences: dict[int, WorkerFence] = {}
    for w in live:
        answer = fence_on(w)
        if answer is None:
            fence_dead(w)
        else:
            fences[w] = answer
    return resume_plan(fences, committed_claims())
