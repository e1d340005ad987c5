"""The messages between the dataflow cores, typed: what a worker answers a
source's call with (``Ack``), and what the aggregator answers a worker's flush
with (``CommitAnswer``, its ``Verdict``). Both engines carry these as they are
(Ray pickles them; the simulator passes them by reference)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Ack:
    """A worker's answer to one call: its sub-batches were processed (or, for
    a fenced-off source incarnation, ``rejected`` unprocessed)."""

    worker: int
    acked: int  # messages processed (0 when rejected)
    signal: int  # CG's piggybacked load signal: +1 increase, -1 decrease, 0 none
    lat_sum_s: float  # the call's messages' latencies, summed
    lat_max_s: float
    done_ts: float  # when it was processed (the worker's clock)
    flush_seq: int  # the flush that holds these messages
    committed_seq: int  # the newest flush the aggregator committed
    rejected: bool = False
    table: Any = None  # a coordinated scheme's newest VW table, once per source


class Verdict(enum.Enum):
    """What the aggregator did with a flush."""

    COMMIT = "commit"  # merged (and any early flushes it unblocked)
    DUPLICATE = "duplicate"  # committed before: ignored
    FENCED = "fenced"  # its worker was declared dead: refused
    PENDING = "pending"  # arrived before an earlier one: committed when that comes


@dataclass(frozen=True, slots=True)
class CommitAnswer:
    """The aggregator's answer to a flush."""

    verdict: Verdict
    committed_seq: int  # the worker's newest committed flush
    table: Any = None  # the coordinator's current VW table (None without one)
