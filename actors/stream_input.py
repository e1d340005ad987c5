"""A live stream's input: Spark Structured Streaming -> the sources.

``LiveInput`` runs one streaming query over ``input.path`` (a directory;
``actors.spark_input.stream_dataframe``) with ``foreachBatch``: Spark calls it
in the driver for every micro-batch, which is collected as Arrow and dealt in
order to the sources, in contiguous near-equal pieces (``SourceActor.feed``).
The call returns once every source has taken its piece; a source whose inbox
holds ``run.max_pending_rows`` rows makes it wait, and Spark starts no new
micro-batch meanwhile: when the input outpaces the cluster, files wait on disk,
not in memory. The time the pieces are handed over is where the messages'
latency starts.

``stop()`` lets a micro-batch being handed over finish, stops the query and
lets no later one in; the sources are then told the stream ended
(``SourceActor.end_stream``) and drain.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray

from runtime.input_check import has_data_files
from runtime.topology import Topology, TopologyError

#: how often Spark looks for new files (a micro-batch that takes longer is
#: followed by the next one at once)
TRIGGER_S = 0.25
#: how often the driver looks for the first file of a stream that starts empty
FIRST_FILE_POLL_S = 0.25


def split_even(table: pa.Table, parts: int) -> list[pa.Table]:
    """``table`` in ``parts`` contiguous pieces whose sizes differ by one at most."""
    n = table.num_rows
    cuts = [n * i // parts for i in range(parts + 1)]
    return [table.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def wait_for_first_file(directory: Path, should_stop: Any, idle_s: float | None,
                        say: Any) -> bool:
    """Block until ``directory`` holds a data file; ``False`` if ``should_stop()``
    came first or ``idle_s`` passed without one."""
    if has_data_files(directory):
        return True
    say(f"waiting for the first file in {directory} (write it as .name or _name and "
        f"rename it into place)")
    start = time.time()
    while not has_data_files(directory):
        if should_stop() or (idle_s is not None and time.time() - start >= idle_s):
            return False
        time.sleep(FIRST_FILE_POLL_S)
    return True


class LiveInput:
    """One run's streaming query feeding ``sources`` (see the module docstring)."""

    def __init__(self, spark: Any, topo: Topology, sources: list[Any]) -> None:
        from actors.spark_input import stream_dataframe

        self.df = stream_dataframe(spark, topo)
        self.sources = sources
        self.rows = 0  # messages handed over
        self.micro_batches = 0  # non-empty ones
        self.handover_s = 0.0  # collecting and handing over (waits for full inboxes included)
        self.last_data_ts: float | None = None
        self.error: BaseException | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._checkpoint = tempfile.mkdtemp(prefix="hetero-stream-")
        self.query: Any = None

    def start(self) -> None:
        self.query = (self.df.writeStream.foreachBatch(self._on_batch)
                      .option("checkpointLocation", self._checkpoint)
                      .trigger(processingTime=f"{int(TRIGGER_S * 1000)} milliseconds")
                      .start())

    def _on_batch(self, df: Any, batch_id: int) -> None:
        """Spark's ``foreachBatch`` (a thread of the driver)."""
        with self._lock:
            if self._stopping:
                return
            t = time.time()
            try:
                got = df._collect_as_arrow()
                if not got:
                    return
                table = pa.Table.from_batches(got)
                if table.num_rows == 0:
                    return
                handed = time.time()
                pieces = split_even(table, len(self.sources))
                ray.get([s.feed.remote(p, handed)
                         for s, p in zip(self.sources, pieces, strict=True) if p.num_rows])
            except BaseException as e:  # noqa: BLE001 - reported by the driver's loop
                self.error = e
                raise
            self.rows += table.num_rows
            self.micro_batches += 1
            self.last_data_ts = handed
            self.handover_s += time.time() - t

    def check(self) -> None:
        """Raise if the query failed (a file Spark cannot read, a lost source)."""
        if self.error is not None:
            raise TopologyError(f"input.path: live stream failed: {_first_line(self.error)}")
        if self.query is not None and not self.query.isActive and not self._stopping:
            exc = self.query.exception()
            raise TopologyError(f"input.path: live stream stopped: "
                                f"{_first_line(exc) if exc else 'unknown cause'}")

    def stop(self) -> None:
        """No micro-batch after the one being handed over; the query stopped."""
        self._stopping = True
        with self._lock:
            pass
        if self.query is not None:
            try:
                self.query.stop()
            finally:
                shutil.rmtree(self._checkpoint, ignore_errors=True)

    def stats(self) -> dict[str, Any]:
        return {"rows": self.rows, "micro_batches": self.micro_batches,
                "handover_s": self.handover_s}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else e.__class__.__name__
