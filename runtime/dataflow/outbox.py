"""A source's per-worker outboxes: what waits to be sent and what is in flight.

Plain class, no Ray (``runtime.dataflow.source.SourceCore`` composes it). Per worker, a
FIFO of routed sub-batches (``Entry``) and the calls sent but not yet
acknowledged. A worker gets at most ``max_inflight`` calls in flight; one call
takes every sub-batch its outbox holds, up to ``call_messages`` messages and
``CALL_S`` of the worker's measured work (``runtime.dataflow.backpressure``), always at
least one sub-batch - and until the worker answered a first call, exactly one
(``DrainRates.call_cap``). Unless forced, an outbox below its fill target (the
call cap, or half the memory bound, whichever is lower) lingers up to
``linger_s`` to fill its call: fewer, larger calls while the windows are open
- unless the source said its next messages come later than that (a paced
source's next batch, ``flush``'s ``next_data_at``): then waiting would fill
nothing, and the call goes at once.
A source *behind* its input (its next batch already due: unpaced, or paced
and late) lets it linger up to ``behind_linger_s`` instead: its messages
would wait for the source anyway, and larger calls are what lets it catch up
(each call costs about a millisecond of CPU on top of its messages).

The memory bound: a worker holding more than its bound of messages
unacknowledged (queued or in flight) must block its source (``over_bound``).
The bound is ``max_inflight + outbox_batches`` batches - counted in messages
of the largest batch seen, so a worker sent small sub-batches (few VWs) does
not block the source early - or as many full calls when those are larger (a
worker that drains fast: its calls carry many micro-batches, and what it holds
is still ``(max_inflight + outbox_batches) x CALL_S`` of its work at most).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.dataflow.backpressure import DrainRates
from runtime.dataflow.reliability import Entry


@dataclass
class Call:
    """One call in flight: its worker, sub-batches (in order), messages and send time."""

    worker: int
    entries: list[Entry]
    messages: int
    sent_at: float


class Outboxes:
    """Every worker's outbox and calls in flight for one source (see the module docstring)."""

    def __init__(self, n_workers: int, *, max_inflight: int, outbox_batches: int,
                 call_messages: int, linger_s: float, clock: Callable[[], float],
                 behind_linger_s: float | None = None) -> None:
        self.max_inflight = int(max_inflight)
        self.outbox_batches = int(outbox_batches)
        self.call_messages = int(call_messages)
        self.linger_s = float(linger_s)
        self.behind_linger_s = self.linger_s if behind_linger_s is None else float(behind_linger_s)
        self.clock = clock
        self.batch_rows = 1  # the largest batch routed so far: the bound's unit
        self.queues: list[collections.deque[Entry]] = [collections.deque()
                                                       for _ in range(n_workers)]
        self.queued_n = np.zeros(n_workers, dtype=np.int64)  # messages in each queue
        self.queued_at = np.zeros(n_workers)  # when each queue's linger began
        self.inflight: dict[Any, Call] = {}  # transport token -> call
        self.calls_per_worker = np.zeros(n_workers, dtype=np.int64)  # calls in flight
        self.inflight_n = np.zeros(n_workers, dtype=np.int64)  # their messages
        #: how fast each worker drains this source's messages: caps its calls
        #: in seconds of work, not only in messages
        self.drain_rates = DrainRates(n_workers)
        self.calls = 0  # calls sent
        #: ``bounds()`` as of (drain rates' version, batch_rows): read-only
        self._bounds: tuple[int, int, np.ndarray] | None = None

    def queue(self, entry: Entry) -> None:
        """Append a routed sub-batch to its worker's outbox."""
        w = entry.worker
        if not self.queues[w]:
            self.queued_at[w] = self.clock()
        self.queues[w].append(entry)
        self.queued_n[w] += len(entry.idx)

    def saw_batch(self, rows: int) -> None:
        """A batch of ``rows`` messages was routed (the memory bound grows with the largest)."""
        self.batch_rows = max(self.batch_rows, int(rows))

    def held_n(self) -> np.ndarray:
        """Per worker: messages unacknowledged, queued or in flight."""
        return self.queued_n + self.inflight_n

    def drain_bounds(self, now: float) -> np.ndarray:
        """Per worker, the most messages per second it can be draining this
        source's calls at, as far as the calls in flight tell (``inf``: none
        in flight). A worker no call of which was acknowledged yet: its
        oldest call's messages over that call's age (a slow worker's first
        call is still in service when a fast one's have come back). Any
        other: its oldest call's messages over the time since that call's
        service began (its sending, or the worker's previous ack of this
        source, whichever is later) - above the acks' rate until the call is
        overdue; a worker that slowed is bounded at its new pace as soon as
        its call outlives what it should take, before the acks' average
        (``DrainRates``, a time constant of ``RATE_TAU_S``) has moved."""
        out = np.full(len(self.queues), np.inf)
        oldest: set[int] = set()
        for call in self.inflight.values():
            w = call.worker
            if not self.drain_rates.measured[w]:
                if now > call.sent_at:
                    out[w] = min(out[w], call.messages / (now - call.sent_at))
            elif w not in oldest:
                oldest.add(w)
                start = max(call.sent_at, self.drain_rates.last_ack(w))
                if now > start:
                    out[w] = call.messages / (now - start)
        return out

    def bounds(self, caps: np.ndarray | None = None) -> np.ndarray:
        """Per worker, the memory bound in messages: ``max_inflight +
        outbox_batches`` batches, or as many full calls (``caps``, default
        ``DrainRates.call_caps``: at most ``CALL_S`` of the worker's measured
        work) when that is more - a worker that drains fast gets calls of many
        batches, while what it holds stays within a fraction of a second of
        its work."""
        if caps is not None:
            return self._bounds_of(caps)
        cached, version = self._bounds, self.drain_rates.version
        if cached is not None and cached[0] == version and cached[1] == self.batch_rows:
            return cached[2]
        bounds = self._bounds_of(self.drain_rates.call_caps(self.call_messages))
        bounds.flags.writeable = False
        self._bounds = (version, self.batch_rows, bounds)
        return bounds

    def _bounds_of(self, caps: np.ndarray) -> np.ndarray:
        slots = self.max_inflight + self.outbox_batches
        return np.maximum(slots * self.batch_rows, slots * caps)

    def over_bound(self) -> bool:
        """Some worker holds more than its memory bound: the source must block."""
        return bool((self.held_n() > self.bounds()).any())

    def queued_vws(self, n_virtual: int) -> np.ndarray:
        """Messages queued (routed, not sent) per virtual worker (coordinated
        schemes: each sub-batch keeps its messages' VWs)."""
        vws = [e.vws for q in self.queues for e in q if e.vws is not None]
        if not vws:
            return np.zeros(int(n_virtual), dtype=np.int64)
        return np.bincount(np.concatenate(vws), minlength=int(n_virtual)).astype(np.int64)

    def busy(self) -> bool:
        """Anything queued or in flight."""
        return bool(self.inflight) or any(self.queues)

    def flush(self, send: Callable[[int, list[Entry]], Any], force: bool = False,
              behind: bool = False, next_data_at: float | None = None) -> None:
        """Cut calls from the outboxes, oldest sub-batch first, while the windows
        allow; ``send(worker, entries)`` sends one and returns its token. Unless
        ``force``, an outbox below its fill target waits until it has lingered
        ``linger_s`` (``behind_linger_s`` when the source is ``behind``) - if
        more can come meanwhile: not when the source's next messages are
        routed at ``next_data_at`` (None: not known), after that."""
        linger_s = self.behind_linger_s if behind else self.linger_s
        now = self.clock()
        caps = fills = None  # computed once, if any outbox holds something
        for w, q in enumerate(self.queues):
            if not q:
                continue
            if caps is None or fills is None:
                caps = self.drain_rates.call_caps(self.call_messages)
                fills = self.bounds() // 2
            cap = int(caps[w])
            if (q and not force and self.queued_n[w] < min(cap, fills[w])
                    and now - self.queued_at[w] < linger_s
                    and (next_data_at is None or next_data_at < self.queued_at[w] + linger_s)):
                continue
            while q and self.calls_per_worker[w] < self.max_inflight:
                entries = [q.popleft()]
                n = len(entries[0].idx)
                while q and n + len(q[0].idx) <= cap:
                    entries.append(q.popleft())
                    n += len(entries[-1].idx)
                self.queued_n[w] -= n
                token = send(w, entries)
                self.inflight[token] = Call(w, entries, n, self.clock())
                self.calls_per_worker[w] += 1
                self.inflight_n[w] += n
                self.calls += 1

    def linger_deadlines(self) -> Iterator[float]:
        """When each lingering outbox with room in its window is due."""
        return (self.queued_at[w] + self.linger_s for w, q in enumerate(self.queues)
                if q and self.calls_per_worker[w] < self.max_inflight)

    def acked(self, token: Any, now: float) -> Call:
        """Call ``token`` was acknowledged at ``now``: its window slot is free."""
        call = self.inflight.pop(token)
        self.calls_per_worker[call.worker] -= 1
        self.inflight_n[call.worker] -= call.messages
        self.drain_rates.acked(call.worker, call.messages, call.sent_at, now)
        return call

    def forget(self, worker: int) -> None:
        """``worker`` is gone: drop its calls and its outbox (the replay log
        still holds their sub-batches)."""
        for token in [t for t, c in self.inflight.items() if c.worker == worker]:
            del self.inflight[token]
        self.drain_rates.forget(worker)
        self.calls_per_worker[worker] = 0
        self.inflight_n[worker] = 0
        self.queues[worker].clear()
        self.queued_n[worker] = 0

    def reroute(self, split: Callable[[int, Entry], list[Entry] | None]) -> list[Entry]:
        """Re-split every queued sub-batch: ``split(worker, entry)`` gives its
        parts, or None when it stays whole. Parts for the same worker keep their
        place; the others leave this outbox and are returned, in order, for the
        caller to ``queue``."""
        moved: list[Entry] = []
        for w, q in enumerate(self.queues):
            items = list(q)
            q.clear()
            for e in items:
                parts = split(w, e)
                if parts is None:
                    q.append(e)
                    continue
                for part in parts:
                    if part.worker == w:
                        q.append(part)
                    else:
                        moved.append(part)
                        self.queued_n[w] -= len(part.idx)
        return moved
