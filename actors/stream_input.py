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

from runtime.dataflow import checkpoint as ckpt_mod
from runtime.dataflow import event_time
from runtime.hashing import hash_arrow
from runtime.inputs.input_check import has_data_files
from runtime.reporting.metrics import DistinctKeys
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
    """One run's streaming query feeding ``sources`` (see the module docstring).

    ``checkpoint`` (exactly once across a ``--resume``, ``runtime.dataflow.checkpoint``):
    every micro-batch is logged (Arrow, ``wal/``) before it is handed over, so
    Spark may commit it at once and plan the next while this one is processed.
    At most every ``checkpoint_every_s``, a cut goes into every source's inbox
    after a micro-batch (``SourceActor.cut``); a thread waits until every
    source has committed what came before it (and routes nothing after it),
    saves the aggregator's state with that batch id, drops the log up to it and
    lets the sources go on. Spark keeps handing micro-batches over meanwhile
    (up to the inboxes' bound): the workers pause only while the sources drain
    their calls in flight and the state is saved.
    ``resume_from``: the checkpoint a resumed run starts from; ``replay_log``
    hands the logged micro-batches after it over again, before Spark starts.
    """

    def __init__(self, spark: Any, topo: Topology, sources: list[Any], out_dir: str | Path,
                 *, aggregator: Any = None, checkpoint: bool = True,
                 checkpoint_every_s: float = 1.0,
                 resume_from: ckpt_mod.Checkpoint | None = None,
                 count_keys: bool = False) -> None:
        from actors.spark_input import stream_dataframe

        self.df, self.file_columns = stream_dataframe(spark, topo)
        self.sources = sources
        self.out_dir = Path(out_dir)
        self.aggregator = aggregator
        self.app = topo.app.model_dump()
        self.checkpointing = checkpoint
        self.checkpoint_every_s = checkpoint_every_s
        #: a windowed stream (``app.window``): its watermark and late records;
        #: its windows are emitted at every cut, so cuts come at least every
        #: ``app.aggregate_every_s`` even without checkpoints
        self.events: event_time.EventClock | None = None
        if topo.app.window is not None:
            from runtime.operators.windows import WindowLengths

            self.events = event_time.EventClock(
                WindowLengths.of(topo.app.window),
                resume_from.event_time if resume_from else None)
            self.checkpoint_every_s = min(checkpoint_every_s, topo.app.aggregate_every_s)
            bound = event_time.emitted_bound(out_dir)
            if bound is not None and aggregator is not None:  # a resumed stream
                ray.get(aggregator.close_windows.remote(bound))
        self.cutting = checkpoint or self.events is not None
        self.kind = topo.app.kind
        self.ckpt_batch = resume_from.batch_id if resume_from else -1  # in the state
        self.done_batch = self.ckpt_batch  # handed over (and logged)
        self.messages_before = resume_from.messages if resume_from else 0
        self.rows = 0  # messages handed over by this run
        #: ``count_keys``: the distinct keys handed over by this run (replication's
        #: denominator when the result does not hold every key: heavy-hitters, operators)
        self.keys: DistinctKeys | None = DistinctKeys() if count_keys else None
        self.micro_batches = 0  # non-empty ones
        self.replayed_batches = 0  # from the log, after a resume
        self.skipped_batches = 0  # re-run by Spark after a resume, already handed over
        self.handover_s = 0.0  # collecting and handing over (waits for full inboxes included)
        self.log_bytes = 0
        self.checkpoints = 0
        self.checkpoint_s = 0.0  # waiting for commits + saving
        self.checkpoint_bytes = 0  # the last one's
        self.last_data_ts: float | None = None
        self.busy = False  # a micro-batch is being handed over
        self._looked = False  # Spark's query has finished a trigger (``idle_s``)
        self.error: BaseException | None = None
        self._next_checkpoint = time.time() + checkpoint_every_s
        self._stopping = False
        self._lock = threading.Lock()
        self.query: Any = None
        self._scratch: str | None = None
        #: what the stream wrote to OUT/late/ and OUT/windows/, each file read once
        self._late = event_time.FileParts(self.out_dir / event_time.LATE_DIR)
        self._emitted = event_time.FileParts(self.out_dir / event_time.WINDOWS_DIR)
        self._checkpointer: threading.Thread | None = None

    def replay_log(self) -> int:
        """A resumed run: hand over again what was logged after the checkpoint
        (before ``start``); how many micro-batches."""
        for batch_id, table in ckpt_mod.logged_batches(self.out_dir, after=self.ckpt_batch):
            self._feed(table, batch_id)
            self.done_batch = batch_id
            self.replayed_batches += 1
        return self.replayed_batches

    def start(self) -> None:
        # without checkpoints nothing is resumed: Spark's offsets go to a temporary place
        self._scratch = None if self.checkpointing else tempfile.mkdtemp(prefix="hs-stream-")
        location = self._scratch or ckpt_mod.checkpoint_dir(self.out_dir) / "spark"
        self.query = (self.df.writeStream.foreachBatch(self._on_batch)
                      .option("checkpointLocation", str(location))
                      .trigger(processingTime=f"{int(TRIGGER_S * 1000)} milliseconds")
                      .start())

    def _on_batch(self, df: Any, batch_id: int) -> None:
        """Spark's ``foreachBatch`` (a thread of the driver)."""
        with self._lock:
            if self._stopping:
                # not handed over: fail the batch so that Spark does not commit it
                # (a resume takes it again)
                raise _Stopping()
            if batch_id <= self.done_batch:
                self.skipped_batches += 1
                return
            self.busy = True
            try:
                t = time.time()
                got = df._collect_as_arrow()
                table = pa.Table.from_batches(got) if got else None
                if table is not None and table.num_rows:
                    if self.checkpointing:
                        self.log_bytes += ckpt_mod.log_batch(self.out_dir, batch_id, table)
                    self._feed(table, batch_id)
                self.handover_s += time.time() - t
                self.done_batch = batch_id
                if (self.cutting and time.time() >= self._next_checkpoint
                        and self._checkpointer is None):
                    # the cut goes in after this micro-batch, before the next one;
                    # the checkpoint is taken beside Spark's next micro-batches
                    ray.get([s.cut.remote() for s in self.sources])
                    self._checkpointer = threading.Thread(
                        target=self._checkpoint_at_cut,
                        args=(batch_id, self.messages_before + self.rows), daemon=True)
                    self._checkpointer.start()
            except BaseException as e:  # noqa: BLE001 - reported by the driver's loop
                self.error = e
                raise
            finally:
                self.busy = False

    def _feed(self, table: pa.Table, batch_id: int) -> None:
        handed = time.time()
        pieces = split_even(table, len(self.sources))
        if self.events is not None:  # late records leave here, before the sources
            pieces, late = self.events.take(batch_id, pieces, handed)
            if late is not None:
                event_time.write_late(self.out_dir, batch_id, late)
        ray.get([s.feed.remote(p, handed)
                 for s, p in zip(self.sources, pieces, strict=True) if p.num_rows])
        if self.keys is not None:  # (what the sources got: late records are in no worker)
            for p in pieces:
                self.keys.add(hash_arrow(p.column("key")))
        self.rows += table.num_rows
        self.micro_batches += 1
        self.last_data_ts = time.time()

    def _checkpoint_at_cut(self, batch_id: int, messages: int) -> None:
        """Once every source reached the cut after ``batch_id`` (what came before
        is committed, nothing after it is routed): save, then let them go on."""
        t = time.time()
        try:
            if not all(ray.get([s.reached_cut.remote() for s in self.sources])):
                raise RuntimeError("a source did not reach the checkpoint's cut")
            self.checkpoint(batch_id, messages, t)
        except BaseException as e:  # noqa: BLE001 - reported by the driver's loop
            self.error = e
        finally:
            try:
                ray.get([s.pass_cut.remote() for s in self.sources])
            except ray.exceptions.RayActorError:
                pass  # the run is failing already (a source or the aggregator died)
            self._checkpointer = None

    def checkpoint(self, batch_id: int | None = None, messages: int | None = None,
                   started: float | None = None) -> None:
        """Save the aggregator's state as holding every micro-batch up to
        ``batch_id`` (default: all handed over - the sources have ended or
        not started) and drop the log up to it. A windowed stream first
        emits the windows final there (``OUT/windows/``), checkpoint or not."""
        t = time.time() if started is None else started
        batch_id = self.done_batch if batch_id is None else batch_id
        messages = self.messages_before + self.rows if messages is None else messages
        events = None
        if self.events is not None:
            bound = self.events.bound_at(batch_id)
            if bound is not None:
                final = ray.get(self.aggregator.emit_windows.remote(bound))
                if event_time.write_emission(self.out_dir, batch_id, final, bound):
                    self.events.emitted += 1
                    self.events.emitted_windows(event_time.window_ends(final), time.time())
            events = self.events.state_at(batch_id)
            self.events.forget_upto(batch_id)
        if not self.checkpointing:
            self._next_checkpoint = time.time() + self.checkpoint_every_s
            return
        state = ray.get(self.aggregator.snapshot.remote())
        self.checkpoint_bytes = ckpt_mod.save(self.out_dir, ckpt_mod.Checkpoint(
            batch_id, messages, state, self.app, events))
        ckpt_mod.forget_batches(self.out_dir, upto=batch_id)
        self.ckpt_batch = batch_id
        self.checkpoints += 1
        self.checkpoint_s += time.time() - t
        self._next_checkpoint = time.time() + self.checkpoint_every_s

    def finish_checkpoints(self) -> None:
        """Wait for a checkpoint being taken (before the last one)."""
        worker = self._checkpointer
        if worker is not None:
            worker.join()

    def check(self) -> None:
        """Raise if the query failed (a file Spark cannot read, a lost source)."""
        from actors.spark_input import stream_file_error

        if self.error is not None:
            bad_file = stream_file_error(self.error, self.file_columns)
            raise TopologyError(f"input.path: {bad_file}" if bad_file else
                                f"input.path: live stream failed: {_first_line(self.error)}")
        if self.query is not None and not self.query.isActive and not self._stopping:
            exc = self.query.exception()
            bad_file = stream_file_error(exc, self.file_columns) if exc else None
            raise TopologyError(f"input.path: {bad_file}" if bad_file else
                                f"input.path: live stream stopped: "
                                f"{_first_line(exc) if exc else 'unknown cause'}")

    def idle_s(self, since: float) -> float:
        """Seconds without new data (``since``: the start): none is being handed
        over and Spark sees no new file - counted from Spark's first look at
        the input (its query's first trigger done). Until then the stream is
        not idle: a resumed query plans the files that came while nobody ran
        before it sees them, which took seconds on a busy machine."""
        now = time.time()
        if self.busy or not self._spark_has_looked() or self._spark_has_data():
            self.last_data_ts = now
        return now - (self.last_data_ts or since)

    def _spark_has_looked(self) -> bool:
        if not self._looked:
            try:
                self._looked = self.query is not None and self.query.lastProgress is not None
            except Exception:  # noqa: BLE001 - a stopped query has no progress (check() says why)
                return False
        return self._looked

    def _spark_has_data(self) -> bool:
        try:
            return bool(self.query is not None and self.query.status.get("isDataAvailable"))
        except Exception:  # noqa: BLE001 - a stopped query has no status
            return False

    def stop(self) -> None:
        """No micro-batch after the one being handed over; the query stopped."""
        self._stopping = True
        with self._lock:
            pass
        _quiet_stream_errors(self.df)  # a micro-batch refused now is not an error
        if self.query is not None:
            try:
                self.query.stop()
            finally:
                if self._scratch is not None:
                    shutil.rmtree(self._scratch, ignore_errors=True)

    def stats(self) -> dict[str, Any]:
        return {"rows": self.rows, "micro_batches": self.micro_batches,
                "handover_s": self.handover_s, "replayed_batches": self.replayed_batches,
                "skipped_batches": self.skipped_batches, "checkpoints": self.checkpoints,
                "checkpoint_s": self.checkpoint_s, "checkpoint_bytes": self.checkpoint_bytes,
                "log_bytes": self.log_bytes, "messages_before": self.messages_before,
                "last_batch_id": self.done_batch,
                **({"event_time": self.events.stats()} if self.events is not None else {})}

    def answer(self, open_windows: pa.Table) -> pa.Table:
        """The stream's answer so far from the aggregator's result: a windowed
        stream's emitted windows go in too (``event_time.with_emitted``), and
        its late records so far are gathered into ``OUT/late.parquet``."""
        if self.events is None:
            return open_windows
        event_time.gather_late(self.out_dir, self._late)
        return event_time.with_emitted(self.out_dir, open_windows, self.kind, self._emitted)


class _Stopping(RuntimeError):
    """A micro-batch Spark started after the stream was told to stop."""


def _quiet_stream_errors(df: Any) -> None:
    """Spark logs a failed micro-batch with its Java stack trace: off, once the
    stream is stopping (a real failure before that is in ``check``)."""
    try:
        jvm = df.sparkSession.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming", level)
    except Exception:  # noqa: BLE001 - only log noise is at stake
        pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else e.__class__.__name__
