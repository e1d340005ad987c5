"""A producer for live streams: drops Parquet files of real words into a directory.

    python scripts/drop_files.py DIR [--rows-per-s 20000] [--every-s 0.5] [--seconds 60]
                                     [--source data/gitgit-words-1m.parquet] [--event-time]

Every ``--every-s`` seconds a file of ``rows-per-s x every-s`` rows (column
``key``, cycling through ``--source``) lands in DIR: written as ``_name`` (a
name Spark skips) and renamed into place, so a stream never reads half a file.
File names carry the start time, so a second producer never overwrites a
file a stream has already read. Pair it with ``topologies/stream.yaml``
(README, "Streams that keep coming"). ``--event-time`` adds a column ``ts``:
each row's event time (UTC timestamp), spread evenly over the interval its
file covers - the input of ``topologies/trending.yaml`` (README, "Windows").
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
WORDS = ROOT / "data" / "gitgit-words-1m.parquet"


class FileDropper(threading.Thread):
    """Drops a file of ``rows_per_s * every_s`` rows every ``every_s`` for ``seconds``
    (``start_when``: wait until it returns True)."""

    def __init__(self, table: Any, directory: Path, rows_per_s: float, seconds: float,
                 every_s: float = 0.5, start_when: Callable[[], bool] | None = None,
                 event_time: bool = False) -> None:
        super().__init__(daemon=True)
        self.table, self.dir = table, Path(directory)
        self.rows = max(1, int(rows_per_s * every_s))
        if self.rows >= table.num_rows:
            raise ValueError(f"--rows-per-s x --every-s: at most {table.num_rows - 1:,} rows "
                             f"a file (got {self.rows:,})")
        self.seconds, self.every_s = seconds, every_s
        self.start_when = start_when
        self.event_time = event_time
        self.prefix = time.strftime("%Y%m%dT%H%M%S")
        self.written = 0
        self.files = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while self.start_when is not None and not self.stop.is_set() and not self.start_when():
            time.sleep(0.05)
        start = time.time()
        k = 0
        while not self.stop.is_set() and time.time() - start < self.seconds:
            off = (k * self.rows) % (self.table.num_rows - self.rows)
            name = f"{self.prefix}-{k:06d}.parquet"
            tmp = self.dir / f"_{name}"
            part = self.table.slice(off, self.rows)
            if self.event_time:  # this file's interval, a row every every_s / rows
                t0 = int((start + k * self.every_s) * 1e6)
                step = self.every_s * 1e6 / self.rows
                ts = pa.array([t0 + int(i * step) for i in range(self.rows)], pa.int64())
                part = part.append_column("ts", ts.view(pa.timestamp("us")).cast(
                    pa.timestamp("us", tz="UTC")))
            pq.write_table(part, tmp)
            os.replace(tmp, self.dir / name)
            self.written += self.rows
            self.files += 1
            k += 1
            self.stop.wait(max(0.0, start + k * self.every_s - time.time()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--rows-per-s", type=float, default=20_000)
    p.add_argument("--every-s", type=float, default=0.5)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--source", type=Path, default=WORDS)
    p.add_argument("--event-time", action="store_true",
                   help="add a column ts: each row's event time (UTC), for app.window")
    args = p.parse_args()
    for name in ("rows_per_s", "every_s", "seconds"):
        if not getattr(args, name) > 0:
            print(f"error: --{name.replace('_', '-')}: must be > 0 (got {getattr(args, name)})",
                  file=sys.stderr)
            return 2
    if not args.dir.is_dir():
        print(f"error: {args.dir}: not a directory", file=sys.stderr)
        return 2
    try:
        table = pq.read_table(args.source, columns=["key"])
        dropper = FileDropper(table, args.dir, args.rows_per_s, args.seconds, args.every_s,
                              event_time=args.event_time)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"dropping {dropper.rows:,} rows every {args.every_s} s into {args.dir} for "
          f"{args.seconds:g} s", file=sys.stderr)
    dropper.start()
    try:
        dropper.join()
    except KeyboardInterrupt:
        dropper.stop.set()
        dropper.join()
    print(f"dropped {dropper.files} files, {dropper.written:,} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
