"""The Flink side of scripts/vs_flink.py: one job per call, run by Flink's own Python.

    <flink venv>/bin/python scripts/flink_jobs.py JOB --rest PORT --data FILE.csv
        --parallelism N --out RESULT.csv [--service-us US] [--adaptive]

Never imported by the project (its venv lacks PyFlink, and PyFlink's pins clash
with ours); scripts/vs_flink.py runs it in Flink's venv against the standalone
cluster it started on loopback. JOB is one of

- ``count``: ``SELECT key, COUNT(*) ... GROUP BY key`` (Table API, batch mode):
  no emulated work, all of it in Flink's own Java operators;
- ``keyed``: DataStream, batch mode: ``key_by(key)`` (Flink hashes keys into
  key groups) into a Python ``KeyedProcessFunction`` that serves every record
  with the project's own ``ServiceEmulator`` (the same sleep on a virtual
  clock as our workers, the same stopped time published by the duty-cycle
  throttler) and counts it;
- ``rebalance``: DataStream, streaming mode (pipelined exchanges: the adaptive
  partitioner balances on the backlog of live subpartitions, which a batch
  job's blocking exchange does not have): one source, ``rebalance()`` into a
  Python map that serves every record the same way, then a cheap keyed count.
  ``--adaptive`` sets ``taskmanager.network.adaptive-partitioner.enabled``
  (FLIP-339; read from the job's configuration).

The input is the CSV file both engines read (a ``key`` header, one key a line).
The result (``key,count``) goes to ``--out``; one JSON line on stdout says the
job id, the records served and the client's wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runtime.dataflow.service, actors.throttle (stdlib + numpy)

HEADER = "key"


def _config(args: argparse.Namespace, mode: str):
    from pyflink.common import Configuration

    conf = Configuration()
    conf.set_string("execution.target", "remote")
    conf.set_string("rest.address", "127.0.0.1")
    conf.set_string("rest.port", str(args.rest))
    conf.set_string("execution.runtime-mode", mode)
    conf.set_string("parallelism.default", str(args.parallelism))
    conf.set_string("python.executable", sys.executable)
    conf.set_string("python.client.executable", sys.executable)
    # PyFlink's fastest mode: the Python functions run in the TaskManager's
    # JVM (embedded CPython), each record a call, not a round trip to a Python
    # worker process (process mode: ~500 records/s per keyed subtask here)
    conf.set_string("python.execution-mode", args.execution_mode)
    # the Python operator hands records to its Python process in bundles: one
    # bundle ~0.1 s of work at full speed, as our sources cap a call (the
    # default, 100,000 records, would let a slow worker swallow ~20 s of work
    # before any backpressure reached the partitioner)
    conf.set_string("python.fn-execution.bundle.size", str(args.bundle))
    conf.set_string("python.fn-execution.bundle.time", "100")
    conf.set_string("taskmanager.network.adaptive-partitioner.enabled",
                    "true" if args.adaptive else "false")
    conf.set_string("pipeline.name", f"vs-flink-{args.job}")
    if args.job != "count":
        # one subtask per TaskManager: the adaptive batch scheduler would size
        # the keyed stage by data volume (a few MB: parallelism 1), which says
        # nothing of the work per record (the count job keeps Flink's choice)
        conf.set_string("execution.batch.adaptive.auto-parallelism.enabled", "false")
    return conf


def _emulator(service_us: float):
    from actors.throttle import StoppedClock
    from runtime.dataflow.service import ServiceEmulator

    # capacity 1: the throttler slows the process (as workers.throttle: duty-cycle)
    return ServiceEmulator(service_us, stopped_clock=StoppedClock())


def job_count(args: argparse.Namespace) -> tuple[str, list[tuple[str, int]]]:
    from pyflink.table import TableEnvironment

    t_env = TableEnvironment.create(_config(args, "BATCH"))
    path = Path(args.data).resolve().as_uri()
    sink = _sink_dir(args)
    t_env.execute_sql(f"""
        CREATE TABLE src (`key` STRING) WITH (
          'connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')""")
    # the result goes to files, as ours writes result.parquet: collecting it
    # into this Python client instead took ~2 min for 50,000 rows
    t_env.execute_sql(f"""
        CREATE TABLE sink (`key` STRING, n BIGINT) WITH (
          'connector' = 'filesystem', 'path' = '{sink.as_uri()}', 'format' = 'csv')""")
    # the header line is a row to Flink's CSV format (it has no skip-header option)
    res = t_env.execute_sql(
        f"INSERT INTO sink SELECT `key`, COUNT(*) AS n FROM src WHERE `key` <> '{HEADER}' "
        f"GROUP BY `key`")
    job_id = str(res.get_job_client().get_job_id())
    res.wait()
    return job_id, _read_sink(sink)


def _sink_dir(args: argparse.Namespace) -> Path:
    d = Path(args.out).resolve().with_suffix(".parts")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def _read_sink(d: Path) -> list[tuple[str, int]]:
    """Every ``key,count`` line of the files Flink committed under ``d``
    (hidden in-progress files are not results)."""
    rows = []
    for f in sorted(d.rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            for line in f.read_text().splitlines():
                if line:
                    key, n = line.rsplit(",", 1)
                    rows.append((key, int(n)))
    return rows


def _source(env, path: str):
    from pyflink.common import WatermarkStrategy
    from pyflink.datastream.connectors.file_system import FileSource, StreamFormat

    src = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), str(Path(path).resolve())).build()
    return env.from_source(src, WatermarkStrategy.no_watermarks(), "csv")


class Span:
    """When this process served its first and last record: the engine's own
    processing span (as ours' ``stream`` phase, first message to last
    processed), without the job's scheduling and the Python functions' start-up.
    Written to ``DIR/<pid>-<id>.json`` every 0.2 s while it serves and when the
    function closes (a Python function's ``close`` is not always reached before
    its worker is torn down: seen with the adaptive partitioner on)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir, self.first, self.last, self.n = out_dir, 0.0, 0.0, 0
        self.written = 0.0

    def mark(self, k: int = 1, t: float | None = None) -> None:
        t = time.time() if t is None else t
        if self.n == 0:
            self.first = t
        self.last, self.n = t, self.n + k
        if t - self.written >= 0.2:
            self.written = t
            self.write()

    def write(self) -> None:
        if self.out_dir and self.n:
            path = os.path.join(self.out_dir, f"{os.getpid()}-{id(self)}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"first": self.first, "last": self.last, "n": self.n}, f)
            os.replace(path + ".tmp", path)


class Server:
    """Serves records with the project's ``ServiceEmulator`` in chunks of ~10 ms
    of work, as our workers serve a call's messages together: one sleep per
    record would pay the sleep's overshoot and a loaded machine's late
    wake-ups on every record (the rest, under 10 ms, is served at close)."""

    def __init__(self, service_us: float, span_dir: str) -> None:
        self.emu = _emulator(service_us) if service_us > 0 else None
        self.chunk = max(1, round(10_000 / service_us)) if service_us > 0 else 1
        self.pending = 0
        self.seen = 0.0
        self.span = Span(span_dir)

    def record(self) -> None:
        self.pending += 1
        self.seen = time.time()
        if self.pending >= self.chunk:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            if self.emu is not None:
                self.emu.serve(self.pending)
            self.span.mark(self.pending)
            self.pending = 0

    def close(self) -> None:
        # the last records (under 10 ms of work) are served now, but the span
        # ends when they would have been served: close can come much later
        # (when the whole job ends), and that wait is not this function's
        if self.pending:
            done = self.seen + self.pending * (self.emu.cost_s if self.emu else 0.0)
            if self.emu is not None:
                self.emu.serve(self.pending)
            self.span.mark(self.pending, t=done)
            self.pending = 0
        self.span.write()



def _counter(service_us: float, span_dir: str):
    from pyflink.common import Types
    from pyflink.datastream import KeyedProcessFunction
    from pyflink.datastream.state import ValueStateDescriptor

    class Count(KeyedProcessFunction):
        """Serve (``service_us`` > 0) and count each key's records; emit the
        count when the input ends (the end-of-time event-time timer)."""

        def open(self, ctx):
            self.n = ctx.get_state(ValueStateDescriptor("n", Types.LONG()))
            self.server = Server(service_us, span_dir)

        def close(self):
            self.server.close()

        def process_element(self, value, ctx):
            key = value if isinstance(value, str) else value[0]
            if key == HEADER:
                return
            self.server.record()
            n = self.n.value()
            if n is None:
                n = 0
                ctx.timer_service().register_event_time_timer(2**62)
            self.n.update(n + 1)

        def on_timer(self, timestamp, ctx):
            yield ctx.get_current_key(), self.n.value()

    return Count()


def job_keyed(args: argparse.Namespace) -> tuple[str, list[tuple[str, int]]]:
    from pyflink.common import Encoder, Types
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors.file_system import FileSink

    env = StreamExecutionEnvironment.get_execution_environment(_config(args, "BATCH"))
    out = (_source(env, args.data)
           .key_by(lambda s: s, key_type=Types.STRING())
           .process(_counter(args.service_us, args.span_dir),
                    output_type=Types.TUPLE([Types.STRING(), Types.LONG()])))
    # to files (a batch job commits them at its end), not collected by this client
    sink = _sink_dir(args)
    (out.map(lambda r: f"{r[0]},{r[1]}", output_type=Types.STRING())
        .sink_to(FileSink.for_row_format(str(sink), Encoder.simple_string_encoder()).build()))
    env.execute("vs-flink-keyed")
    return "", _read_sink(sink)


def job_rebalance(args: argparse.Namespace) -> tuple[str, list[tuple[str, int]]]:
    from pyflink.common import Types
    from pyflink.datastream import MapFunction, StreamExecutionEnvironment

    service_us, span_dir = args.service_us, args.span_dir

    class Serve(MapFunction):
        def open(self, ctx):
            self.server = Server(service_us, span_dir)

        def close(self):
            self.server.close()

        def map(self, value):
            if value != HEADER:
                self.server.record()
            return value

    env = StreamExecutionEnvironment.get_execution_environment(_config(args, "STREAMING"))
    src = _source(env, args.data).set_parallelism(1)
    out = (src.rebalance()
           .map(Serve(), output_type=Types.STRING())
           .key_by(lambda s: s, key_type=Types.STRING())
           .process(_counter(0.0, ""), output_type=Types.TUPLE([Types.STRING(), Types.LONG()])))
    return _collect(out)


def _collect(ds) -> tuple[str, list[tuple[str, int]]]:
    """The result collected into this client: a streaming job's file sink
    commits only on checkpoints, which these jobs do not take."""
    rows: list[tuple[str, int]] = []
    with ds.execute_and_collect() as it:
        for r in it:
            rows.append((r[0], int(r[1])))
    return "", rows  # the harness finds the job by REST


JOBS = {"count": job_count, "keyed": job_keyed, "rebalance": job_rebalance}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("job", choices=sorted(JOBS))
    p.add_argument("--rest", type=int, required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--parallelism", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--service-us", type=float, default=0.0)
    p.add_argument("--bundle", type=int, default=500)
    p.add_argument("--adaptive", action="store_true")
    p.add_argument("--execution-mode", choices=("thread", "process"), default="thread",
                   help="where the Python functions run (default: thread, in the JVM)")
    p.add_argument("--span-dir", default="", help="where the serving functions write their spans")
    args = p.parse_args()
    t0 = time.time()
    job_id, rows = JOBS[args.job](args)
    wall = time.time() - t0
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "count"])
        w.writerows(rows)
    print(json.dumps({"job_id": job_id, "rows": len(rows), "client_wall_s": wall,
                      "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
