"""A live stream's event time (``app.window``): its watermark, late records,
and the windows it emits (README, "Windows").

The stream's *watermark* is the newest event time handed over so far. A
micro-batch is judged against the watermark of the micro-batches before it:
a record more than ``lateness`` behind it is *late*. Late records leave the
stream before the sources (``OUT/late/<batch>.parquet``, gathered into
``OUT/late.parquet`` with each result snapshot); they are counted per source, never merged into a
window. So no record that still counts is older than ``watermark -
lateness``: at a checkpoint's cut after micro-batch ``B`` (every record of
``B`` and before committed), every window ending at or before
``watermark(B) - lateness`` is final. The aggregator hands those over
(``AggregatorCore.emit_windows``) and they are written to
``OUT/windows/<B>.parquet``, once.

Exactly once across kills and ``--resume``: the decisions depend only on the
micro-batches in order (Spark replays the same ones), the watermark is saved
in the checkpoint, an emission file is written atomically before the
checkpoint that no longer holds its windows, and a resumed stream refuses
every window up to the newest emitted bound (``emitted_bound``): replayed
records of an emitted window cannot emit it again. Pure (pyarrow, numpy):
the Ray driver (``actors.stream_input``) calls it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from runtime.operators.windows import WindowLengths, event_ticks, time_unit
from runtime.reporting.report import write_parquet_atomic

WINDOWS_DIR = "windows"
LATE_DIR = "late"
LATE_FILE = "late.parquet"
#: the bound an emission file covers (its windows end at or before it), in its metadata
BOUND_KEY = b"hs.watermark"


class EventClock:
    """The watermark of a live stream's micro-batches, and who is late."""

    def __init__(self, window: WindowLengths, state: dict[str, Any] | None = None) -> None:
        self.window = window
        state = state or {}
        self.unit: str | None = state.get("unit")
        self.watermark: int | None = state.get("watermark")  # after the last batch taken
        self.late_rows = int(state.get("late_rows", 0))
        self.late_per_source: list[int] = list(state.get("late_per_source", []))
        self.emitted = int(state.get("emitted", 0))  # emission files
        self._after: dict[int, int | None] = {}  # batch id -> watermark after it
        #: batch id -> the late counts after it (a checkpoint's cut may be
        #: behind the batches taken: a resumed stream takes the rest again)
        self._late_after: dict[int, tuple[int, list[int]]] = {}
        self._handed: dict[int, float] = {}  # batch id -> when it was handed over
        #: per emitted window: seconds from the hand-over of the micro-batch
        #: that made it final to its emission
        self.emit_delays_s: list[float] = []

    def state_at(self, batch_id: int) -> dict[str, Any]:
        """What a checkpoint after ``batch_id`` keeps (``EventClock(window, state)``):
        the watermark and the late counts as they were after that batch, not
        after the ones taken since (a resumed stream takes those again)."""
        late_rows, per_source = self._late_after.get(
            batch_id, (self.late_rows, self.late_per_source))
        return {"unit": self.unit, "watermark": self._after.get(batch_id, self.watermark),
                "late_rows": late_rows, "late_per_source": list(per_source),
                "emitted": self.emitted}

    def bound_at(self, batch_id: int) -> int | None:
        """Windows ending at or before this are final once ``batch_id`` is
        committed (``None``: no event time yet)."""
        wm = self._after.get(batch_id, self.watermark)
        if wm is None or self.unit is None:
            return None
        return wm - self.window.ticks(self.unit)[2]

    def take(self, batch_id: int, pieces: list[pa.Table],
             handed: float = 0.0) -> tuple[list[pa.Table], pa.Table | None]:
        """Micro-batch ``batch_id`` as the sources' ``pieces`` (in source
        order), handed over at ``handed``: the pieces without their late
        records, and those (``None``: none). Then the watermark moves to the
        batch's newest event time."""
        self._handed[batch_id] = handed
        if self.unit is None and pieces:
            self.unit = time_unit(pieces[0].schema.field(self.window.column).type,
                                  self.window.column)
        lateness = self.window.ticks(self.unit)[2] if self.unit else 0
        kept, late, newest = [], [], self.watermark
        while len(self.late_per_source) < len(pieces):
            self.late_per_source.append(0)
        for s, piece in enumerate(pieces):
            assert self.unit is not None
            ticks, valid = event_ticks(piece.column(self.window.column), self.unit)
            if valid is None:
                valid = np.ones(len(ticks), dtype=bool)
            if self.watermark is not None:
                is_late = valid & (ticks < self.watermark - lateness)
                n_late = int(is_late.sum())
                if n_late:
                    late.append(piece.filter(pa.array(is_late)))
                    piece = piece.filter(pa.array(~is_late))
                    self.late_per_source[s] += n_late
                    self.late_rows += n_late
            if valid.any():
                top = int(ticks[valid].max())
                newest = top if newest is None else max(newest, top)
            kept.append(piece)
        self.watermark = newest
        self._after[batch_id] = newest
        self._late_after[batch_id] = (self.late_rows, list(self.late_per_source))
        return kept, (pa.concat_tables(late) if late else None)

    def emitted_windows(self, ends: list[int], now: float) -> None:
        """Windows ending at ``ends`` (ticks) were emitted at ``now``: how long
        after the micro-batch that made each final was handed over."""
        lateness = self.window.ticks(self.unit)[2] if self.unit else 0
        for end in ends:
            made = [b for b, wm in self._after.items() if wm is not None and wm - lateness >= end]
            if made:
                self.emit_delays_s.append(max(0.0, now - self._handed.get(min(made), now)))

    def forget_upto(self, batch_id: int) -> None:
        """A checkpoint holds ``batch_id``: its watermark is no longer asked for."""
        for b in [b for b in self._after if b < batch_id]:
            del self._after[b]
            self._handed.pop(b, None)
            self._late_after.pop(b, None)

    def stats(self) -> dict[str, Any]:
        delays = sorted(self.emit_delays_s)
        return {"watermark": self.watermark, "unit": self.unit, "late_rows": self.late_rows,
                "late_per_source": list(self.late_per_source), "emissions": self.emitted,
                "windows_emitted": len(delays),
                "emit_delay_s": ({"p50": float(np.percentile(delays, 50)),
                                  "p99": float(np.percentile(delays, 99)), "max": delays[-1]}
                                 if delays else None)}


# ------------------------------------------------------------------ files

def write_late(out_dir: str | os.PathLike[str], batch_id: int, late: pa.Table) -> None:
    """Keep micro-batch ``batch_id``'s late records in ``OUT/late/`` (the same
    file again on a replay). ``gather_late`` puts them in ``OUT/late.parquet``."""
    path = Path(out_dir) / LATE_DIR / f"{int(batch_id):012d}.parquet"
    if not path.exists():
        write_parquet_atomic(late, path)


class FileParts:
    """The Parquet files of one of a live stream's output directories
    (``OUT/windows/``, ``OUT/late/``), each read once: they are written once
    and never rewritten, so each result snapshot reads only the new ones."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._parts: dict[str, pa.Table] = {}

    def update(self) -> bool:
        """Read the files that are new; whether there were any."""
        new = [f for f in parquet_files(self.directory) if f.name not in self._parts]
        for f in new:
            self._parts[f.name] = pq.read_table(f).replace_schema_metadata(None)
        return bool(new)

    def tables(self) -> list[pa.Table]:
        """Every file's table, in file-name (micro-batch) order."""
        return [self._parts[name] for name in sorted(self._parts)]


def gather_late(out_dir: str | os.PathLike[str], late: FileParts | None = None) -> bool:
    """Rewrite ``OUT/late.parquet`` (every late record, in batch order) when
    ``OUT/late/`` holds files ``late`` has not read yet; whether it did.
    ``late``: the stream's reader of ``OUT/late/``, kept between calls.
    Called with each result snapshot and at the end of a stream (not per
    micro-batch: a stream with late records in every batch would rewrite
    all of them each time)."""
    late = late or FileParts(Path(out_dir) / LATE_DIR)
    if not late.update():
        return False
    write_parquet_atomic(pa.concat_tables(late.tables(), promote_options="permissive"),
                         Path(out_dir) / LATE_FILE)
    return True


def write_emission(out_dir: str | os.PathLike[str], batch_id: int, table: pa.Table,
                   bound: int) -> Path | None:
    """``OUT/windows/<batch_id>.parquet``: the windows final at ``bound``
    (nothing is written for none; a file there already is kept)."""
    path = Path(out_dir) / WINDOWS_DIR / f"{int(batch_id):012d}.parquet"
    if table.num_rows == 0 or path.exists():
        return None
    meta = dict(table.schema.metadata or {})
    meta[BOUND_KEY] = str(int(bound)).encode()
    write_parquet_atomic(table.replace_schema_metadata(meta), path)
    return path


def window_ends(table: pa.Table) -> list[int]:
    """The distinct ``window_end``s of a windowed result, in ticks."""
    col = table.column("window_end")
    unit = "us" if pa.types.is_timestamp(col.type) else "int"
    ticks, _ = event_ticks(col, unit)
    return sorted({int(t) for t in ticks})


def parquet_files(directory: str | os.PathLike[str]) -> list[Path]:
    """``directory``'s Parquet files, by name (none if it does not exist)."""
    d = Path(directory)
    return sorted(d.glob("*.parquet")) if d.exists() else []


def emission_files(out_dir: str | os.PathLike[str]) -> list[Path]:
    return parquet_files(Path(out_dir) / WINDOWS_DIR)


def emitted_bound(out_dir: str | os.PathLike[str]) -> int | None:
    """The newest bound an emission file covers (``None``: none written): the
    last file's, as the watermark never goes back (one schema read, however
    many files the stream has written)."""
    for f in reversed(emission_files(out_dir)):
        meta = pq.read_schema(f).metadata or {}
        if BOUND_KEY in meta:
            return int(meta[BOUND_KEY])
    return None


def with_emitted(out_dir: str | os.PathLike[str], open_windows: pa.Table,
                 kind: str, emitted: FileParts | None = None) -> pa.Table:
    """A live stream's whole answer: every emitted window, then the open ones
    (``open_windows``, the aggregator's result), in result order. ``emitted``:
    the stream's reader of ``OUT/windows/``, kept between calls."""
    from runtime.operators.tables import sort_result

    emitted = emitted or FileParts(Path(out_dir) / WINDOWS_DIR)
    emitted.update()
    parts = emitted.tables()
    if not parts:
        return open_windows
    t = pa.concat_tables([*parts, open_windows.replace_schema_metadata(None)],
                         promote_options="permissive")
    return sort_result(t, kind)


__all__ = ["BOUND_KEY", "LATE_DIR", "LATE_FILE", "WINDOWS_DIR", "EventClock", "FileParts",
           "emission_files", "emitted_bound", "gather_late", "parquet_files", "window_ends",
           "with_emitted", "write_emission", "write_late"]
