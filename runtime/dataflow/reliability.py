"""Exactly-once bookkeeping for failures: pure classes, no Ray (docs/reliability.md).

Identity. A source numbers the micro-batches of its shard ``0, 1, 2...``
(``run.batch`` rows each; the shard is replayable and its batch boundaries are
deterministic, like offsets in a log). A message is ``(source, batch, index
in the batch)``; a sub-batch sent to a worker carries a ``Tag``: the source's
incarnation (``epoch``), the batch number, the message indices (``idx``) and the
source's *watermark* (every batch below it is fully committed).

Who holds what:

- **Source** - ``ReplayLog``: every sub-batch it routed, from routing until the
  flush that holds it is committed at the aggregator (acks carry the worker's
  ``flush_seq`` for that sub-batch and its latest ``committed_seq``). On a worker
  death, ``take(worker, committed_seq)`` returns exactly the sub-batches not
  covered by the dead worker's last committed flush; the source re-routes them
  to live workers. The watermark is the oldest batch with a retained sub-batch.
- **Worker** - ``ClaimLog``: which ``(source, batch, idx)`` it processed, in
  which flush (kept until the source's watermark passes the batch); a source
  incarnation fence: after ``fence(source, epoch)`` sub-batches of older
  incarnations are rejected, not processed. A flush (``Flush``) carries its
  sequence number, the app's partial, the claims it covers and the watermarks.
- **Aggregator** - ``CommitLedger``: commits a worker's flush atomically (the
  partial is merged and its claims recorded, or neither), in sequence, ignores
  duplicates, and after ``fence_worker(w)`` (the worker was declared dead)
  rejects every later flush of ``w``: the committed sequence returned by the
  fence is final, which is what makes the sources' replay exact.

A restarted source (``resume_plan``) fences every live worker, collects the
claims of its batches at or after the highest watermark anyone saw (live
workers' claims, the aggregator's committed claims of dead workers), and from
there re-reads its shard: claimed messages are not sent again (the ones still
uncommitted go back into its ``ReplayLog``), the rest are routed as new.

Guarantee: with one failure at a time (recovery of one finished before the
next), the aggregated result counts every input message exactly once.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.dataflow.messages import CommittedClaims, WorkerFence
from runtime.grouping.coordination import RateReport

IDX_DTYPE = np.int32


@dataclass
class Tag:
    """The identity of a part's messages (see the module docstring): the
    source incarnation (``epoch``), its watermark and, per *segment* (one
    routed sub-batch; a call coalesces several), the batch number and how
    many messages it has; ``idx`` holds every segment's message indices
    (positions in their batch), one segment after the other. Three arrays
    whatever the number of segments: a coalesced call pickles in tens of
    microseconds, not one object per sub-batch."""

    source: int
    epoch: int
    batches: np.ndarray  # int64[k]: each segment's batch number
    counts: np.ndarray  # int64[k]: each segment's messages (sum = len(idx))
    idx: np.ndarray  # IDX_DTYPE[n]: message indices in their batch
    watermark: int

    @classmethod
    def of(cls, source: int, epoch: int, batch: int, idx: np.ndarray, watermark: int) -> Tag:
        """One segment: messages ``idx`` of batch ``batch``."""
        idx = np.asarray(idx, dtype=IDX_DTYPE)
        return cls(int(source), int(epoch), np.array([batch], dtype=np.int64),
                   np.array([len(idx)], dtype=np.int64), idx, int(watermark))

    def segments(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(batch, idx)`` per segment."""
        lo = 0
        for b, c in zip(self.batches.tolist(), self.counts.tolist(), strict=True):
            yield b, self.idx[lo:lo + c]
            lo += c

    def select(self, keep: np.ndarray) -> Tag:
        """The messages at positions ``keep`` (sorted) of ``idx``; empty segments dropped."""
        seg = np.repeat(np.arange(len(self.counts)), self.counts)[keep]
        counts = np.bincount(seg, minlength=len(self.counts))
        live = counts > 0
        return Tag(self.source, self.epoch, self.batches[live], counts[live].astype(np.int64),
                   self.idx[keep], self.watermark)


@dataclass
class Flush:
    """One worker flush: committed atomically by the aggregator, or not at all."""

    worker: int
    seq: int  # 1, 2, 3... per worker
    partial: Any  # the app's delta since the previous flush
    claims: dict[int, list[tuple[int, np.ndarray]]]  # source -> [(batch, idx)]
    watermarks: dict[int, int]  # source -> latest watermark seen by the worker
    messages: int  # messages in this flush
    #: what the worker measured since its previous flush, for a coordinated
    #: scheme's controller (``runtime.grouping.acg``), or None
    report: RateReport | None = None


class WorkerLost(Exception):
    """A worker's actor died (or was declared dead): returned instead of an ack."""

    def __init__(self, worker: int, cause: str = "") -> None:
        super().__init__(f"worker-{worker} lost{': ' + cause if cause else ''}")
        self.worker = int(worker)


def union_idx(parts: Iterable[np.ndarray]) -> np.ndarray:
    """Sorted distinct indices of several index arrays."""
    arrs = [np.asarray(p, dtype=IDX_DTYPE) for p in parts]
    if not arrs:
        return np.empty(0, dtype=IDX_DTYPE)
    return np.unique(np.concatenate(arrs)).astype(IDX_DTYPE, copy=False)


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` one after the other (one array: itself, not a copy)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _isin(idx: np.ndarray, held: np.ndarray) -> np.ndarray:
    """``np.isin(idx, held)`` for message indices (small, non-negative: a
    position in a batch): a lookup in a mask over ``[0, max]`` instead of
    ``isin``'s sort, about 5x faster on a sub-batch; ``np.isin`` itself for
    anything else."""
    if not len(idx) or not len(held):
        return np.zeros(len(idx), dtype=bool)
    hi = max(int(idx.max()), int(held.max())) + 1
    if min(int(idx.min()), int(held.min())) < 0 or hi > 4 * (len(idx) + len(held)) + 4096:
        return np.isin(idx, held)
    mask = np.zeros(hi, dtype=bool)
    mask[held] = True
    return mask[idx]


# ============================================================================ source


@dataclass
class Part:
    """Messages on the wire (a worker call carries a list of them, in practice
    one): their identity (``tag``), their records - ``key`` plus the columns
    the app needs - and the 64-bit hash of every key, computed once at the
    source (routing, replay and the workers' distinct-key count use it;
    nothing hashes a key twice). A part coalesces the routed sub-batches of
    one source incarnation that wait for the same worker (``join``);
    ``emit_ts`` holds when each segment's batch was due at the source (its
    messages' latency starts there)."""

    tag: Tag | None
    records: Any  # pa.RecordBatch
    hashes: np.ndarray  # uint64, one per record
    emit_ts: np.ndarray  # float64, one per segment (one for an untagged part)

    def __len__(self) -> int:
        return len(self.hashes)

    def emit_per_message(self) -> np.ndarray:
        """Each message's emit time."""
        if self.tag is None or len(self.emit_ts) == 1:
            return np.full(len(self), float(self.emit_ts[0]))
        return np.repeat(self.emit_ts, self.tag.counts)

    def select(self, keep: np.ndarray) -> Part:
        """The messages at positions ``keep`` (sorted): a tagged part's segments
        that lose every message are dropped with their emit times."""
        if self.tag is None:
            return Part(None, take(self.records, keep), self.hashes[keep], self.emit_ts)
        seg = np.repeat(np.arange(len(self.tag.counts)), self.tag.counts)[keep]
        live = np.bincount(seg, minlength=len(self.tag.counts)) > 0
        return Part(self.tag.select(keep), take(self.records, keep), self.hashes[keep],
                    self.emit_ts[live])

    @classmethod
    def join(cls, source: int, epoch: int, watermark: int, entries: Sequence[Entry]) -> Part:
        """One part for a worker's queued sub-batches (``Entry``), in order.
        The records are copied, also for one entry (the common call): an entry
        may be a slice of a larger batch, and pickling a slice sends its
        parent's whole buffers. One entry's index and hash arrays are used as
        they are (numpy pickles only a view's own rows)."""
        import pyarrow as pa

        tag = Tag(int(source), int(epoch),
                  np.array([e.batch for e in entries], dtype=np.int64),
                  np.array([len(e.idx) for e in entries], dtype=np.int64),
                  _cat([e.idx for e in entries]), int(watermark))
        return cls(tag, pa.concat_batches([e.records for e in entries]),
                   _cat([e.hashes for e in entries]),
                   np.array([e.emit_ts for e in entries], dtype=np.float64))

    @classmethod
    def of(cls, keys: Any, emit_ts: float = 0.0, tag: Tag | None = None,
           **columns: Any) -> Part:
        """A part from plain arrays (tests, tools); the key hashes are computed here."""
        import pyarrow as pa

        from runtime.hashing import hash_arrow

        keys = keys if isinstance(keys, pa.Array) else pa.array(keys, type=pa.string())
        records = pa.record_batch({"key": keys, **{k: pa.array(v) for k, v in columns.items()}})
        return cls(tag, records, hash_arrow(keys), np.array([emit_ts], dtype=np.float64))


@dataclass(eq=False)
class Entry:
    """A retained sub-batch (identity by object)."""

    worker: int
    batch: int
    idx: np.ndarray
    records: Any  # pa.RecordBatch: 'key' + the app's columns
    hashes: np.ndarray  # uint64 key hashes
    emit_ts: float
    flush_seq: int | None = None  # set by the ack: the worker flush that holds it
    replay: bool = False  # re-routed after a worker death (or rebuilt by a resume)
    vws: np.ndarray | None = None  # each message's virtual worker (coordinated schemes)
    held_bytes: int = 0  # ``nbytes`` when a ReplayLog took it (computed once)

    def subset(self, sel: np.ndarray, worker: int | None = None) -> Entry:
        """The messages at positions ``sel`` as a new entry (for ``worker``)."""
        return Entry(self.worker if worker is None else int(worker), self.batch,
                     self.idx[sel], take(self.records, sel), self.hashes[sel],
                     self.emit_ts, self.flush_seq, self.replay,
                     None if self.vws is None else self.vws[sel])

    @property
    def nbytes(self) -> int:
        """What it holds in memory (records, hashes, indices, VWs). The records'
        buffers are summed (``get_total_buffer_size``: 0.15 us; ``nbytes``
        walks every column's slice, 2-4 us an entry): a ``take`` made them
        compact, so the two agree within a few bytes."""
        return int(self.records.get_total_buffer_size() + self.hashes.nbytes + self.idx.nbytes
                   + (0 if self.vws is None else self.vws.nbytes))


def take(records: Any, sel: Any) -> Any:
    """Rows ``sel`` (a numpy or Arrow integer array: a source slices one Arrow
    index array per worker) of a record batch or array, as a new (compact)
    one: never a zero-copy slice, which would pickle the parent's whole buffers. (Arrow's ``take`` kernel called directly:
    ``records.take`` goes through ``pyarrow.compute``'s wrapper, twice the
    cost on a sub-batch.)"""
    import pyarrow as pa

    if not isinstance(sel, pa.Array):
        sel = pa.array(np.asarray(sel, dtype=np.int64))
    return _take_kernel().call([records, sel])


@functools.cache
def _take_kernel() -> Any:
    """Arrow's ``take`` (default options: bounds checked, as ``RecordBatch.take``)."""
    import pyarrow.compute as pc

    return pc.get_function("take")


class ReplayLog:
    """A source's retained sub-batches, per worker, until committed.

    Memory: what was routed to a worker since its last committed flush plus
    what is queued or in flight (both bounded by backpressure and by
    ``app.aggregate_every_s``), in bytes (``nbytes``): per worker at most
    ``(max_inflight + outbox) x batch`` messages in flight and queued, plus
    what the worker processed in one ``aggregate_every_s`` and is not yet
    committed, times the bytes of a message's records, its 8-byte key hash and
    4-byte index.
    """

    def __init__(self) -> None:
        self._by_worker: dict[int, dict[int, Entry]] = collections.defaultdict(dict)
        self._per_batch: collections.Counter[int] = collections.Counter()
        self._batches: collections.deque[int] = collections.deque()  # ascending, lazily pruned
        self._messages = 0
        self._bytes = 0
        self._seen_committed: dict[int, int] = {}
        self._dirty: dict[int, bool] = {}  # an entry was acked into an already committed flush

    def add(self, entry: Entry) -> Entry:
        self._by_worker[entry.worker][id(entry)] = entry
        if self._per_batch[entry.batch] == 0 and (
                not self._batches or self._batches[-1] < entry.batch):
            self._batches.append(entry.batch)
        elif self._per_batch[entry.batch] == 0:  # an older batch again (replay): keep order
            self._batches = collections.deque(sorted({*self._batches, entry.batch}))
        self._per_batch[entry.batch] += 1
        self._messages += len(entry.idx)
        entry.held_bytes = entry.nbytes
        self._bytes += entry.held_bytes
        return entry

    def _drop(self, entry: Entry) -> None:
        del self._by_worker[entry.worker][id(entry)]
        self._per_batch[entry.batch] -= 1
        if self._per_batch[entry.batch] == 0:
            del self._per_batch[entry.batch]
        self._messages -= len(entry.idx)
        self._bytes -= entry.held_bytes

    def acked(self, entry: Entry, flush_seq: int, committed_seq: int) -> None:
        """``entry`` was processed into ``flush_seq``; ``committed_seq`` is the
        worker's latest committed flush: everything up to it is released."""
        entry.flush_seq = int(flush_seq)
        if entry.flush_seq <= committed_seq:
            self._dirty[entry.worker] = True
        self.committed(entry.worker, committed_seq)

    def committed(self, worker: int, committed_seq: int) -> None:
        """Release ``worker``'s sub-batches held by flushes ``<= committed_seq``."""
        mine = self._by_worker.get(worker)
        if not mine:
            return
        if committed_seq <= self._seen_committed.get(worker, -1) and not self._dirty.get(worker):
            return  # nothing new is committed, nothing newly acked into a committed flush
        self._seen_committed[worker] = committed_seq
        self._dirty[worker] = False
        done = [e for e in mine.values() if e.flush_seq is not None and e.flush_seq <= committed_seq]
        for e in done:
            self._drop(e)

    def take(self, worker: int, committed_seq: int,
             committed: Iterable[tuple[int, np.ndarray]] = ()) -> list[Entry]:
        """``worker`` is dead, ``committed_seq`` its final committed flush and
        ``committed`` the ``(batch, idx)`` of this source its committed flushes
        hold: remove all its entries; return what to replay - the messages no
        committed flush holds (not acked, acked into a later flush, or acked by a
        reply this source never saw) - oldest batch first."""
        done: dict[int, list[np.ndarray]] = collections.defaultdict(list)
        for b, idx in committed:
            done[int(b)].append(idx)
        done_idx = {b: union_idx(v) for b, v in done.items()}
        mine = list(self._by_worker.get(worker, {}).values())
        out = []
        for e in mine:
            if e.flush_seq is not None and e.flush_seq <= committed_seq:
                continue
            held = done_idx.get(e.batch)
            if held is not None:
                keep = ~np.isin(e.idx, held)
                if not keep.any():
                    continue
                if not keep.all():
                    e = e.subset(np.flatnonzero(keep))
            out.append(e)
        for e in mine:
            self._drop(e)
        self._by_worker.pop(worker, None)
        return sorted(out, key=lambda e: e.batch)

    def remove(self, entry: Entry) -> None:
        """Forget an entry that was never sent (it is re-routed as new ones)."""
        self._drop(entry)

    def watermark(self, next_batch: int) -> int:
        """Every batch below this is fully committed (``next_batch``: the first not routed)."""
        while self._batches and self._per_batch.get(self._batches[0], 0) == 0:
            self._batches.popleft()
        return self._batches[0] if self._batches else int(next_batch)

    def pending_workers(self) -> list[int]:
        return sorted(w for w, d in self._by_worker.items() if d)

    def entries(self, worker: int) -> list[Entry]:
        return list(self._by_worker.get(worker, {}).values())

    def __len__(self) -> int:
        return sum(len(d) for d in self._by_worker.values())

    @property
    def messages(self) -> int:
        return self._messages

    @property
    def nbytes(self) -> int:
        """Bytes held by the retained sub-batches."""
        return self._bytes


# ============================================================================ worker


@dataclass
class _Claim:
    batch: int
    idx: np.ndarray
    flush_seq: int


class ClaimLog:
    """A worker's processed sub-batches per source, the open flush, source fences.

    Not thread-safe: the worker calls it under its processing lock.
    """

    def __init__(self) -> None:
        self.open_seq = 1  # the flush that the next processed sub-batch goes into
        self.committed_seq = 0
        #: source -> batch -> what was processed of it here (kept until the
        #: source's watermark passes the batch); a heap of batch numbers per
        #: source finds what to prune without scanning every claim
        self._claims: dict[int, dict[int, list[_Claim]]] = collections.defaultdict(dict)
        self._batches: dict[int, list[int]] = collections.defaultdict(list)
        self._open: dict[int, list[tuple[int, np.ndarray]]] = collections.defaultdict(list)
        self._open_msgs = 0
        self.watermarks: dict[int, int] = {}
        self.fenced_epoch: dict[int, int] = {}
        self.rejected = 0  # sub-batches of fenced incarnations
        self.duplicates = 0  # messages dropped as already processed here

    def admits(self, tag: Tag) -> bool:
        """False if ``tag``'s source incarnation was fenced off."""
        return tag.epoch >= self.fenced_epoch.get(tag.source, 0)

    def filter_new(self, tag: Tag) -> np.ndarray | None:
        """Positions (into ``tag.idx``) not yet processed here, or None if all new."""
        by_batch = self._claims.get(tag.source)
        if not by_batch:
            return None
        dups = []
        lo = 0
        for b, idx in tag.segments():
            seen = by_batch.get(b)
            if seen:
                dup = _isin(idx, seen[0].idx if len(seen) == 1
                            else np.concatenate([c.idx for c in seen]))
                if dup.any():
                    dups.append(lo + np.flatnonzero(dup))
            lo += len(idx)
        if not dups:
            return None
        drop = np.concatenate(dups)
        self.duplicates += len(drop)
        keep = np.ones(len(tag.idx), dtype=bool)
        keep[drop] = False
        return np.flatnonzero(keep)

    def processed(self, tag: Tag) -> int:
        """Record ``tag`` as processed into the open flush; returns that flush's seq."""
        s = tag.source
        by_batch = self._claims[s]
        for b, idx in tag.segments():
            claims = by_batch.get(b)
            if claims is None:
                by_batch[b] = claims = []
                heapq.heappush(self._batches[s], b)
            claims.append(_Claim(b, idx, self.open_seq))
            self._open[s].append((b, idx))
        self._open_msgs += len(tag.idx)
        self.see_watermark(s, tag.watermark)
        return self.open_seq

    def see_watermark(self, source: int, watermark: int) -> None:
        if watermark > self.watermarks.get(source, -1):
            self.watermarks[source] = int(watermark)
            heap, by_batch = self._batches[source], self._claims[source]
            while heap and heap[0] < watermark:
                by_batch.pop(heapq.heappop(heap), None)

    def close(self, worker: int, partial: Any) -> Flush:
        """Close the open flush around the app's ``partial``."""
        f = Flush(worker=worker, seq=self.open_seq, partial=partial,
                  claims={s: list(v) for s, v in self._open.items() if v},
                  watermarks=dict(self.watermarks), messages=self._open_msgs)
        self._open = collections.defaultdict(list)
        self._open_msgs = 0
        self.open_seq += 1
        return f

    @property
    def open_messages(self) -> int:
        """Messages processed into the open (not yet flushed) flush."""
        return self._open_msgs

    def on_committed(self, seq: int) -> None:
        self.committed_seq = max(self.committed_seq, int(seq))

    def fence(self, source: int, epoch: int) -> WorkerFence:
        """Reject ``source``'s incarnations older than ``epoch`` from now on; return
        what this worker holds of it: claims ``[(batch, idx, flush_seq)]``, the
        latest watermark seen and the committed flush."""
        self.fenced_epoch[source] = max(self.fenced_epoch.get(source, 0), int(epoch))
        by_batch = self._claims.get(source, {})
        claims = [c for b in sorted(by_batch) for c in by_batch[b]]
        return WorkerFence([(c.batch, c.idx, c.flush_seq) for c in claims],
                           self.watermarks.get(source, 0), self.committed_seq)


# ============================================================================ aggregator


class CommitLedger:
    """The aggregator's record of committed flushes (see the module docstring)."""

    def __init__(self) -> None:
        self.committed_seq: dict[int, int] = {}
        self.committed_messages: dict[int, int] = collections.defaultdict(int)
        self.fenced: set[int] = set()
        self.duplicates = 0
        self.rejected = 0
        self.out_of_order = 0
        self.watermarks: dict[int, int] = {}
        #: source -> [(batch, idx, worker)] committed, at or after the source's watermark
        self._claims: dict[int, list[tuple[int, np.ndarray, int]]] = collections.defaultdict(list)

    def admit(self, flush: Flush) -> str:
        """``"commit"`` (merge it), ``"duplicate"``, ``"fenced"`` or ``"gap"``."""
        w = flush.worker
        if w in self.fenced:
            self.rejected += 1
            return "fenced"
        last = self.committed_seq.get(w, 0)
        if flush.seq <= last:
            self.duplicates += 1
            return "duplicate"
        if flush.seq != last + 1:
            self.out_of_order += 1
            return "gap"
        return "commit"

    def record(self, flush: Flush) -> None:
        """The flush's partial was merged: record it (same actor call, so atomic)."""
        self.committed_seq[flush.worker] = flush.seq
        self.committed_messages[flush.worker] += flush.messages
        for s, wm in flush.watermarks.items():
            if wm > self.watermarks.get(s, -1):
                self.watermarks[s] = wm
                self._claims[s] = [c for c in self._claims[s] if c[0] >= wm]
        for s, claims in flush.claims.items():
            wm = self.watermarks.get(s, 0)
            self._claims[s].extend((b, idx, flush.worker) for b, idx in claims if b >= wm)

    def fence_worker(self, worker: int) -> int:
        """Declare ``worker`` dead: no later flush of it commits. Returns its final
        committed flush sequence (0 if none)."""
        self.fenced.add(int(worker))
        return self.committed_seq.get(int(worker), 0)

    def claims_of(self, source: int) -> CommittedClaims:
        """Committed claims of ``source`` at or after its watermark, and the watermark."""
        return CommittedClaims([(b, idx) for b, idx, _ in self._claims.get(source, ())],
                               self.watermarks.get(source, 0))

    def worker_claims(self, worker: int, source: int) -> list[tuple[int, np.ndarray]]:
        """What ``worker``'s committed flushes hold of ``source`` (at or after its
        watermark): a source replays exactly the rest of what it sent there - an
        ack it never saw does not make a committed sub-batch look lost."""
        return [(b, idx) for b, idx, w in self._claims.get(source, ()) if w == worker]

    def stats(self) -> dict[str, Any]:
        return {"committed_seq": {str(k): v for k, v in sorted(self.committed_seq.items())},
                "committed_messages": {str(k): v for k, v in
                                       sorted(self.committed_messages.items())},
                "fenced_workers": sorted(self.fenced), "duplicate_flushes": self.duplicates,
                "rejected_flushes": self.rejected, "out_of_order_flushes": self.out_of_order,
                "claims_held": sum(len(c) for c in self._claims.values())}


# ============================================================================ resume


@dataclass
class ResumePlan:
    """Where a restarted source starts and what it must not send again."""

    start_batch: int
    #: batch -> message indices already processed somewhere (do not send)
    claimed: dict[int, np.ndarray] = field(default_factory=dict)
    #: batch -> [(worker, idx, flush_seq)] processed but not committed (retain)
    retain: dict[int, list[tuple[int, np.ndarray, int]]] = field(default_factory=dict)

    def split(self, batch: int, n: int) -> tuple[np.ndarray, list[tuple[int, np.ndarray, int]]]:
        """For batch ``batch`` of ``n`` messages: indices to send, entries to retain."""
        done = self.claimed.get(batch)
        todo = (np.arange(n, dtype=IDX_DTYPE) if done is None
                else np.setdiff1d(np.arange(n, dtype=IDX_DTYPE), done).astype(IDX_DTYPE))
        return todo, self.retain.get(batch, [])

    @property
    def last_claimed_batch(self) -> int:
        return max(self.claimed, default=self.start_batch - 1)


def resume_plan(worker_fences: dict[int, WorkerFence], committed: CommittedClaims) -> ResumePlan:
    """Plan a restarted source's resume from the live workers' ``ClaimLog.fence``
    answers (worker -> answer) and the aggregator's ``CommitLedger.claims_of``."""
    start = max([int(committed.watermark)] + [int(f.watermark) for f in worker_fences.values()])
    parts: dict[int, list[np.ndarray]] = collections.defaultdict(list)
    retain: dict[int, list[tuple[int, np.ndarray, int]]] = collections.defaultdict(list)
    for b, idx in committed.claims:
        if b >= start:
            parts[b].append(idx)
    for w, f in worker_fences.items():
        for b, idx, seq in f.claims:
            if b < start:
                continue
            parts[b].append(idx)
            if seq > f.committed_seq:
                retain[b].append((w, idx, seq))
    return ResumePlan(start, {b: union_idx(p) for b, p in parts.items()}, dict(retain))


# ============================================================================ faults


def peak_rss_mb(pid: int | None = None) -> float | None:
    """Peak resident set size (``VmHWM``) of a process on this node, in MB
    (``pid`` None: this process); None where /proc does not tell."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Start this process's peak RSS (``peak_rss_mb``) afresh from what it holds
    now, after the garbage is collected and freed memory given back to the
    system (glibc's ``malloc_trim``): how a reused actor process
    (``actors.pool``) reports only its new run's peak. ``False`` where Linux's
    ``/proc/self/clear_refs`` cannot reset it."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the peak starts from a larger heap
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        return False
    return True


@dataclass
class FaultEvent:
    """One injected fault and what recovering from it took (report.json ``failures``)."""

    actor: str
    at_s: float
    #: the fault's trigger when it was by progress (``at_s``: when it was due)
    after_messages: int | None = None
    kind: str = "kill"
    killed_s: float | None = None
    detected_s: float | None = None
    recovered_s: float | None = None
    pid: int | None = None
    replayed_batches: int = 0
    replayed_messages: int = 0
    skipped_messages: int = 0  # resume: already processed, not sent again
    committed_seq: int | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["recovery_s"] = (None if self.recovered_s is None or self.killed_s is None
                           else self.recovered_s - self.killed_s)
        return d


class FaultSchedule:
    """The topology's ``faults`` (or membership changes), each ``(at_s,
    after_messages, name)`` with exactly one of the two triggers;
    ``due(t_s, acked)`` pops the ones due: by time, in time order, then by
    progress, in count order (ties: by name)."""

    def __init__(self, faults: Iterable[tuple[float | None, int | None, str]]) -> None:
        faults = list(faults)
        self._timed = sorted((float(a), str(k)) for a, n, k in faults if a is not None)
        self._counted = sorted((int(n), str(k)) for a, n, k in faults if n is not None)

    def due(self, t_s: float, acked: int = 0) -> list[tuple[float, int | None, str]]:
        """What is due at ``t_s`` seconds with ``acked`` messages acked: each
        ``(at_s, after_messages, name)``; a count-triggered one's ``at_s`` is
        ``t_s``, when it was found due."""
        timed = list(itertools.takewhile(lambda f: f[0] <= t_s, self._timed))
        counted = list(itertools.takewhile(lambda f: f[0] <= acked, self._counted))
        del self._timed[:len(timed)], self._counted[:len(counted)]
        return [(a, None, k) for a, k in timed] + [(t_s, n, k) for n, k in counted]

    def __len__(self) -> int:
        return len(self._timed) + len(self._counted)
