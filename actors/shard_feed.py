"""Input that reaches the sources while Spark still produces it.

A thread of the driver (``actors.spark_input.FeedLoad``) reads Spark's Arrow
batches partition by partition and cuts them into blocks; each block goes
into a ``ShardFeed`` as soon as it is in Ray's object store, dealt to the
sources in stream order (block ``j`` of the stream to source
``j % n_sources``). The sources start on the first block.

A source gets a ``FedShard`` (its feed and its index) instead of a Ray
Dataset and reads its blocks in order, waiting for the next chunk when it has
routed everything so far (it keeps taking acks and sending meanwhile). The
feed keeps every block until the run ends, so a restarted source reads the
same blocks from the start, with the same batch boundaries, and resumes from
its committed position as with a whole input.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import ray

#: how long a source waits (taking acks) before asking its feed again
POLL_S = 0.02


@ray.remote(num_cpus=0)
class ShardFeed:
    """Every source's blocks in stream order, appended chunk by chunk."""

    def __init__(self, n_sources: int) -> None:
        self.blocks: list[list[Any]] = [[] for _ in range(n_sources)]
        self.rows = 0
        self.chunks = 0
        self.done = False
        self.error: str | None = None

    def add(self, per_source: list[list[Any]], rows: int) -> int:
        """One chunk: ``per_source[s]`` are source ``s``'s new blocks (refs);
        returns the chunks so far."""
        for mine, new in zip(self.blocks, per_source, strict=True):
            mine.extend(new)
        self.rows += rows
        self.chunks += 1
        return self.chunks

    def finish(self) -> None:
        self.done = True

    def fail(self, error: str) -> None:
        """The load failed: every source reading the feed raises ``error``."""
        self.error = error
        self.done = True

    def blocks_from(self, source: int, start: int) -> tuple[list[Any], bool, str | None]:
        """Source ``source``'s blocks from index ``start`` on, whether no more
        will come, and the load's error if it failed."""
        return self.blocks[source][start:], self.done, self.error


class FeedFailed(RuntimeError):
    """The chunked load stopped with an error (its message)."""


@dataclass(frozen=True)
class FedShard:
    """What a source reads when its input arrives chunk by chunk."""

    feed: Any  # a ShardFeed handle
    source: int

    def tables(self, idle: Callable[[float], None]) -> Iterator[pa.Table]:
        """The source's blocks in order as they arrive; ``idle(timeout)`` runs
        while none is there yet (the source keeps taking acks and sending)."""
        taken = 0
        ready: deque[Any] = deque()
        asked = self.feed.blocks_from.remote(self.source, 0)
        while True:
            if ready:
                yield ray.get(ready.popleft())
                continue
            if not ray.wait([asked], timeout=0)[0]:
                idle(POLL_S)
                continue
            refs, done, error = ray.get(asked)
            if error is not None:
                raise FeedFailed(error)
            if done and not refs:
                return
            ready.extend(refs)
            taken += len(refs)
            asked = self.feed.blocks_from.remote(self.source, taken)  # asked ahead
            if not refs:
                idle(POLL_S)
