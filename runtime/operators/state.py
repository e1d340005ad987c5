"""Partial-state plumbing shared by the built-in operators.

``SlottedState`` is the base of their states: ``__slots__`` (no per-instance
dict), pickled as a dict of the slots.

``CountState`` (``WordCount``, ``NaiveBayes``) and ``AggregateState``
(``Aggregate``) buffer the same way (``BufferedRows``): ``add`` appends the
batch's arrays, and a fold turns the unfolded rows and the partial tables into
one table. They fold at the same points: after ``add`` when the buffer is full
(``buffer_full``: bounded memory) and after ``merge`` when merged partials
pile up (``fold_due``). Neither changes the answer, only when work is done.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import pyarrow as pa

from runtime.operators.tables import COMPACT_ROWS

#: fold when a state holds more array pieces than this (many tiny partials)
MAX_PIECES = 2048


class SlottedState:
    """Base of a state class that declares its fields in ``__slots__``:
    pickles as ``{slot: value}``."""

    __slots__: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, d: dict[str, Any]) -> None:
        for k, v in d.items():
            setattr(self, k, v)


class BufferedRows(Protocol):
    """The fields a buffering state keeps (besides its per-operator columns)."""

    keys: list[pa.Array | pa.ChunkedArray]  # the unfolded rows' keys
    raw_rows: int  # unfolded rows
    tables: list[pa.Table]  # partial tables not yet merged
    table_rows: int  # rows in ``tables``
    big_rows: int  # rows of the largest table (the running total)


S = TypeVar("S", bound=BufferedRows)


def buffer_full(state: BufferedRows) -> bool:
    """After ``add``: fold the unfolded rows now (more than ``COMPACT_ROWS``
    and more than the running total)."""
    return state.raw_rows > COMPACT_ROWS and state.raw_rows > state.big_rows


def fold_due(state: BufferedRows) -> bool:
    """After ``merge``: fold now (rows beyond the running total above
    ``COMPACT_ROWS`` and the total itself, or more than ``MAX_PIECES`` pieces)."""
    pending = state.raw_rows + state.table_rows - state.big_rows
    return (pending > max(COMPACT_ROWS, state.big_rows)
            or len(state.keys) + len(state.tables) > MAX_PIECES)


def merge_rows(out: S, a: BufferedRows, b: BufferedRows) -> S:
    """``out`` holding ``a``'s then ``b``'s unfolded keys and partial tables
    (the caller merges its own columns); returns ``out``."""
    out.keys = a.keys + b.keys
    out.raw_rows = a.raw_rows + b.raw_rows
    out.tables = a.tables + b.tables
    out.table_rows = a.table_rows + b.table_rows
    out.big_rows = max(a.big_rows, b.big_rows)
    return out


def keep_folded(state: BufferedRows, t: pa.Table) -> None:
    """After a fold: ``state`` holds the single partial table ``t`` and no
    unfolded keys (the caller clears its own columns)."""
    state.keys, state.raw_rows = [], 0
    state.tables = [t] if t.num_rows else []
    state.table_rows = state.big_rows = t.num_rows


__all__ = ["MAX_PIECES", "BufferedRows", "SlottedState", "buffer_full", "fold_due",
           "keep_folded", "merge_rows"]
