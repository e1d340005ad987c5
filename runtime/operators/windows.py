"""Event-time windows for any operator: ``app.window`` (README, "Windows").

``Windowed(inner, window)`` is itself an operator (``runtime.operators.contract``):
its state maps each window's start to one state of ``inner``, so ``inner``'s
own ``add``/``merge``/``finish`` work per window and an operator needs no
window code. Windows are ``[k*slide, k*slide + size)`` on the event-time
column, aligned to 0 (Spark aligns ``window()`` to the epoch the same way); a
record falls in every window that holds its time, and a record without one
(a null) in none - as in Spark's ``groupBy(window(ts, size, slide), key)``,
which a finite input's ``result.parquet`` equals under every scheme.

Event time is counted in *ticks*: an integer column's own units, or
microseconds for a timestamp column (sizes then in seconds, or with a unit:
``500ms``, ``1m``). ``result.parquet`` starts with ``window_start`` and
``window_end`` (int64, or ``timestamp[us, UTC]``), then ``inner``'s columns,
windows in order.

Sliding windows whose ``size`` is a whole number of ``slide`` s are kept as
*panes* (Li et al., "No pane, no gain", 2005) when ``inner`` is mergeable: the
state maps each ``[k*slide, (k+1)*slide)`` slice to one state of ``inner``, a
record updates its one pane (as for tumbling windows: the work per record
does not grow with ``size / slide``), and a window is the merge of copies of
its ``size / slide`` panes when its rows are taken (``table``). Other
windows keep one state per window, and a record is added to each of its
windows.

A live stream emits windows as its watermark passes them (``emit``): their
states leave the total (a pane once its last window is out) and ``closed``
remembers the bound, so a replayed record of an emitted window cannot reopen
it. ``describe`` gives the report's ``window`` block (windows held now and
at most, records without a time).
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.operators.contract import BoundOperator, OperatorError, OperatorSpec
from runtime.operators.state import SlottedState

#: the result's window columns, first
WINDOW_COLUMNS = ("window_start", "window_end")
#: a timestamp column's windows are reported in this type (Spark's, in UTC)
TIMESTAMP = pa.timestamp("us", tz="UTC")
_US = 1_000_000


@dataclass(frozen=True)
class WindowLengths:
    """``app.window`` as numbers: ``size``/``slide``/``lateness`` as given (a
    timestamp column's in seconds); ``units``: one was given with a unit."""

    column: str
    size: float
    slide: float
    lateness: float = 0.0
    units: bool = False

    @classmethod
    def of(cls, spec: Any) -> WindowLengths:
        """From an ``app.window`` mapping or ``WindowSpec``."""
        from runtime.topology import WindowSpec

        w = spec if isinstance(spec, WindowSpec) else WindowSpec.model_validate(spec)
        return cls(w.column, w.seconds("size"), w.seconds("slide"), w.seconds("lateness"),
                   w.has_units())

    def ticks(self, unit: str) -> tuple[int, int, int]:
        """``(size, slide, lateness)`` in ticks of ``unit`` (``"int"``: the
        column's own, ``"us"``: a timestamp's microseconds)."""
        if unit == "us":
            return (round(self.size * _US), round(self.slide * _US), round(self.lateness * _US))
        for name in ("size", "slide", "lateness"):
            v = getattr(self, name)
            if self.units or v != math.floor(v):
                raise OperatorError(
                    f"app.window.{name}: column {self.column!r} holds whole numbers, so "
                    f"lengths are whole numbers in its units (got {v:g}"
                    f"{' with a unit' if self.units else ''})")
        return int(self.size), int(self.slide), int(self.lateness)


def time_unit(field: pa.DataType, column: str) -> str:
    """``"int"`` or ``"us"`` for an event-time column's Arrow type; an
    ``OperatorError`` naming the column for any other type."""
    if pa.types.is_integer(field):
        return "int"
    if pa.types.is_timestamp(field) or pa.types.is_date(field):
        return "us"
    raise OperatorError(f"app.window.column: {column!r} is {field}; event time is a whole "
                        f"number or a timestamp column")


def event_ticks(column: pa.Array | pa.ChunkedArray,
                unit: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(ticks, valid)``: the column as int64 ticks (0 where null) and its
    non-null mask (``None``: no nulls)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if unit == "us":
        if not pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us"))  # a date
        elif column.type.unit != "us":
            column = column.cast(pa.timestamp("us", tz=column.type.tz))
        column = column.view(pa.int64())
    elif column.type != pa.int64():
        column = column.cast(pa.int64())
    if column.null_count == 0:
        return column.to_numpy(zero_copy_only=False), None
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return pc.fill_null(column, 0).to_numpy(zero_copy_only=False), valid


def window_starts(ticks: np.ndarray, size: int, slide: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, rows)``: one entry per (record, window holding it)."""
    last = (ticks // slide) * slide
    if slide == size:
        return last, np.arange(len(ticks))
    starts, rows = [], []
    all_rows = np.arange(len(ticks))
    for k in range(-(-size // slide)):
        s = last - k * slide
        inside = ticks < s + size
        starts.append(s[inside])
        rows.append(all_rows[inside])
    return np.concatenate(starts), np.concatenate(rows)


class WindowState(SlottedState):
    """``windows``: window (or pane) start (ticks) -> the inner operator's state;
    ``unit``: the event-time column's (``None`` until a record came);
    ``no_time``: records without an event time; ``closed``: windows ending at
    or before it were emitted (``None``: none); ``peak``: most windows held."""

    __slots__ = ("windows", "unit", "no_time", "closed", "peak")

    def __init__(self) -> None:
        self.windows: dict[int, Any] = {}
        self.unit: str | None = None
        self.no_time = 0
        self.closed: int | None = None
        self.peak = 0

    def __repr__(self) -> str:
        return f"WindowState(windows={len(self.windows)}, no_time={self.no_time})"


class Windowed:
    """``inner`` (a ``BoundOperator``) per event-time window (module docstring)."""

    def __init__(self, inner: BoundOperator, window: WindowLengths) -> None:
        self.inner = inner
        self.window = window
        self.mergeable = inner.spec.mergeable
        self.wants_key_hash = inner.spec.wants_key_hash
        cols = inner.spec.columns
        self.columns = cols if window.column in cols else (*cols, window.column)
        self._drop_time = window.column not in cols
        self._ticks: dict[str, tuple[int, int, int]] = {}

    def spec(self) -> OperatorSpec:
        s = self.inner.spec
        return OperatorSpec(name=s.name, field=s.field, columns=self.columns,
                            mergeable=s.mergeable, wants_key_hash=s.wants_key_hash,
                            has_compact=True)

    def lengths(self, unit: str) -> tuple[int, int, int]:
        """``(size, slide, lateness)`` in ticks of ``unit``."""
        got = self._ticks.get(unit)
        if got is None:
            got = self._ticks[unit] = self.window.ticks(unit)
        return got

    def panes(self, unit: str) -> int:
        """How many panes make a window (module docstring); 0: the state is
        kept per window."""
        size, slide, _ = self.lengths(unit)
        return size // slide if self.mergeable and slide < size and size % slide == 0 else 0

    def _window_starts(self, state: WindowState) -> list[int]:
        """The windows ``state`` holds a part of and has not emitted, in order."""
        if not state.windows:
            return []
        unit = state.unit or "int"
        n = self.panes(unit)
        if not n:
            return sorted(state.windows)
        size, slide, _ = self.lengths(unit)
        starts = {p - j * slide for p in state.windows for j in range(n)}
        if state.closed is not None:
            starts = {w for w in starts if w + size > state.closed}
        return sorted(starts)

    def _window(self, state: WindowState, start: int) -> Any:
        """Window ``start``'s inner state: its own, or the merge of copies of
        its panes (``state`` keeps them)."""
        n = self.panes(state.unit or "int")
        if not n:
            return state.windows[start]
        slide = self.lengths(state.unit or "int")[1]
        acc = self.inner.create()
        for p in range(start, start + n * slide, slide):
            pane = state.windows.get(p)
            if pane is not None:
                acc = self.inner.merge(acc, pickle.loads(pickle.dumps(pane, protocol=5)))
        return acc

    # ------------------------------------------------------------ the operator
    def create(self) -> WindowState:
        return WindowState()

    def add(self, state: WindowState, batch: pa.RecordBatch) -> WindowState:
        col = batch.column(self.window.column)
        unit = state.unit or time_unit(col.type, self.window.column)
        state.unit = unit
        size, slide, _ = self.lengths(unit)
        ticks, valid = event_ticks(col, unit)
        if self._drop_time:
            batch = batch.drop_columns([self.window.column])
        if valid is not None:
            state.no_time += int(len(valid) - valid.sum())
            keep = np.flatnonzero(valid)
            batch, ticks = batch.take(pa.array(keep)), ticks[keep]
        if not len(ticks):
            return state
        step = size if not self.panes(unit) else slide  # a pane is a window of one slide
        starts, rows = window_starts(ticks, step, slide)
        lo, hi = int(starts.min()), int(starts.max())
        if lo == hi and len(rows) == len(ticks):  # the common case: one window
            self._add_to(state, lo, batch)
            return state
        order = np.argsort(starts, kind="stable")
        starts = starts[order]
        taken = batch.take(pa.array(rows[order]))
        cuts = np.flatnonzero(np.diff(starts)) + 1
        bounds = [0, *cuts.tolist(), len(starts)]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            self._add_to(state, int(starts[a]), taken.slice(a, b - a))
        return state

    def _add_to(self, state: WindowState, start: int, batch: pa.RecordBatch) -> None:
        inner = state.windows.get(start)
        state.windows[start] = self.inner.add(
            self.inner.create() if inner is None else inner, batch)

    def compact(self, state: WindowState) -> WindowState:
        for start, inner in state.windows.items():
            state.windows[start] = self.inner.compact(inner)
        return state

    def merge(self, a: WindowState, b: WindowState) -> WindowState:
        a.unit = a.unit or b.unit
        a.no_time += b.no_time
        if b.closed is not None and (a.closed is None or b.closed > a.closed):
            a.closed = b.closed
        for start, inner in b.windows.items():
            mine = a.windows.get(start)
            a.windows[start] = inner if mine is None else self.inner.merge(mine, inner)
        if a.closed is not None:
            self._drop_closed(a)
        a.peak = max(a.peak, b.peak, len(self._window_starts(a)))
        return a

    def finish(self, state: WindowState) -> pa.Table:
        return self.table(state, self._window_starts(state))

    # ------------------------------------------------------------ windows
    def table(self, state: WindowState, starts: list[int]) -> pa.Table:
        """The result rows of the windows starting at ``starts`` (in order)."""
        unit = state.unit or "int"
        size = self.lengths(unit)[0] if starts else 0
        parts = []
        for start in starts:
            t = self.inner.finish(self._window(state, start))
            parts.append(self._with_window(t, start, start + size, unit))
        if not parts:
            return self._with_window(self.inner.finish(self.inner.create()), 0, 0, unit)
        return pa.concat_tables(parts)

    @staticmethod
    def _with_window(t: pa.Table, start: int, end: int, unit: str) -> pa.Table:
        n = t.num_rows
        for i, (name, v) in enumerate(((WINDOW_COLUMNS[0], start), (WINDOW_COLUMNS[1], end))):
            col = pa.array(np.full(n, v, dtype=np.int64), pa.int64())
            if unit == "us":
                col = col.view(pa.timestamp("us")).cast(TIMESTAMP)
            t = t.add_column(i, name, col)
        return t

    def emit(self, state: WindowState, watermark: int) -> pa.Table:
        """Take every window that ends at or before ``watermark`` (ticks) out of
        ``state`` (which then refuses them); their result rows, in order."""
        size = self.lengths(state.unit or "int")[0]
        out = self.table(state, [w for w in self._window_starts(state) if w + size <= watermark])
        self.close(state, watermark)
        return out

    def _drop_closed(self, state: WindowState) -> None:
        # a pane's last window starts where the pane does: both go at start + size
        size = self.lengths(state.unit or "int")[0]
        closed = state.closed
        assert closed is not None
        for s in [s for s in state.windows if s + size <= closed]:
            del state.windows[s]

    def close(self, state: WindowState, watermark: int) -> None:
        """Windows ending at or before ``watermark`` were emitted (a resumed
        stream learns it from ``OUT/windows/``): drop and refuse them."""
        if state.closed is None or watermark > state.closed:
            state.closed = watermark
        self._drop_closed(state)

    def describe(self, state: WindowState) -> dict[str, Any]:
        held = len(self._window_starts(state))
        return {"open": held, "peak_open": max(state.peak, held),
                "no_event_time": state.no_time, "closed_before": state.closed}


def windowed(inner: BoundOperator, window: Any) -> BoundOperator:
    """``inner`` per ``app.window`` (a mapping or ``WindowSpec``), bound."""
    op = Windowed(inner, WindowLengths.of(window))
    return BoundOperator(op, op.spec())


def windowed_of(op: BoundOperator) -> Windowed | None:
    """The ``Windowed`` inside ``op``, if it is one."""
    inner = op.op
    return inner if isinstance(inner, Windowed) else None


__all__ = ["TIMESTAMP", "WINDOW_COLUMNS", "WindowLengths", "WindowState", "Windowed",
           "event_ticks", "time_unit", "window_starts", "windowed", "windowed_of"]
