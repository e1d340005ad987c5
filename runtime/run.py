"""``python -m runtime.run TOPOLOGY.yaml [--out DIR] [--set k.p=v ...] [--address ADDR] [--check]``

Runs a topology on the real engine: Ray actors fed by Spark (RayDP). See
``actors.pipeline`` for the run itself and DESIGN.md for the contracts: exit 0
with a summary table on stdout and the outputs in DIR; bad input -> exit 2 and
one line on stderr; Ctrl-C -> 130. Every throttled worker is resumed and Spark
and Ray are shut down on every exit path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runtime.cli import base_parser, check_address, fail, load_or_exit, run_main
from runtime.report import default_out_dir, summary_table
from runtime.topology import Topology, TopologyError

ROOT = Path(__file__).resolve().parent.parent


def check_input_columns(topo: Topology) -> None:
    """Fail (exit 2, one line) before Ray and Spark start if the input file is
    missing, unreadable or empty, or lacks the key (or label) column
    (``runtime.input_check.preflight``)."""
    from runtime.input_check import preflight

    try:
        preflight(topo)
    except TopologyError as e:
        fail(str(e))


@dataclasses.dataclass(frozen=True)
class SparkSizing:
    """RayDP's Spark executors: how many, cores (Ray CPUs held) and JVM heap each."""

    executors: int = 1
    cores: int = 1
    memory: str = "1GB"
    #: more Spark settings (``--spark-conf KEY=VALUE``)
    conf: tuple[tuple[str, str], ...] = ()

    @property
    def cpus(self) -> float:
        return float(self.executors * self.cores)


def _positive_int(field: str, text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        fail(f"{field}: must be a whole number >= 1 (got {text!r})")
    return v


def _spark_conf(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip().startswith("spark."):
            fail(f"--spark-conf: expected spark.KEY=VALUE (got {item!r})")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _announce(ctx: Any) -> None:
    """Where to watch: the Ray dashboard, the cluster address, the live view."""
    gcs = (getattr(ctx, "address_info", None) or {}).get("gcs_address", "?")
    url = getattr(ctx, "dashboard_url", None)
    dash = f"dashboard http://{url}, " if url else ""
    print(f"ray: {dash}cluster {gcs} (ray list actors --address {gcs}); "
          f"live view: python -m runtime.top", file=sys.stderr)


@contextlib.contextmanager
def engine_session(app_name: str, address: str | None = None, *,
                   topo: Topology | None = None, spark: SparkSizing | None = None,
                   ) -> Iterator[Any]:
    """Ray (local, or the cluster at ``address``) and a RayDP Spark session;
    both are shut down on every exit path (SIGTERM included).

    ``topo``: checked against the cluster right after ``ray.init``, before
    Spark starts (a ``placement`` no node can serve -> ``TopologyError``).
    ``spark``: the executors RayDP starts (default one executor, 1 core, 1 GB).
    On an existing cluster nothing here is node-local: actors are named in the
    run's namespace, other nodes' workers are throttled by a ``ThrottleActor``
    on their node, and the outputs are written by this driver.
    """
    import ray

    from actors import cluster, spark_input, telemetry

    sizing = spark or SparkSizing()

    signal.signal(signal.SIGTERM, _sigterm)
    # a failed run says why in one line; Ray would also print the traceback of
    # every other call that failed with it and whose result nobody fetched
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    pythonpath = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    os.environ["PYTHONPATH"] = pythonpath  # workers started by this driver import our code
    runtime_env: dict[str, Any] = {"env_vars": {"PYTHONPATH": pythonpath}}
    if topo is not None and topo.app.kind == "operator" and topo.app.operator:
        from runtime.operators import runtime_env_for

        # the user's operator reaches every node with the job (Ray's runtime environment)
        runtime_env.update(runtime_env_for(topo.app.operator, topo.base_dir))
    # a cluster we start pushes live metrics every second (runtime.top); an
    # existing cluster keeps its own settings
    starts = address is None and not os.environ.get("RAY_ADDRESS")
    system_config = telemetry.ray_system_config() if starts else {}
    try:
        try:
            ctx = ray.init(address=address, runtime_env=runtime_env,
                           logging_level=logging.WARNING, log_to_driver=False,
                           _system_config=system_config or None)
        except ConnectionError as e:
            fail(f"--address: cannot attach to the Ray cluster at {address!r} ({e})")
        if topo is not None:  # before anything else is printed: one line, exit 2
            cluster.check_placement(topo, spark_cpus=sizing.cpus)
        _announce(ctx)
        yield spark_input.start_spark(app_name=app_name, executor_memory=sizing.memory,
                                      num_executors=sizing.executors,
                                      executor_cores=sizing.cores,
                                      extra_configs=dict(sizing.conf))
    finally:
        try:
            spark_input.stop_spark()
        finally:
            if ray.is_initialized():
                ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = base_parser("runtime.run", "Run a topology on Ray, fed by Spark (RayDP).")
    p.add_argument("--address", default=None,
                   help="Ray cluster to attach to: HOST:PORT of its head (GCS), or auto "
                        "(RAY_ADDRESS, else the cluster started on this machine); default: "
                        "start a local cluster")
    p.add_argument("--spark-executors", default="1", metavar="N",
                   help="RayDP Spark executors (default 1)")
    p.add_argument("--spark-executor-cores", default="1", metavar="N",
                   help="cores (Ray CPUs) per Spark executor (default 1)")
    p.add_argument("--spark-executor-memory", default="1GB", metavar="SIZE",
                   help="JVM heap per Spark executor (default 1GB)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting, e.g. spark.ray.raydp_spark_executor.actor.resource."
                        "spark=1 to put executors on nodes with resource 'spark' (repeatable)")
    p.add_argument("--check", action="store_true",
                   help="validate the topology and its input, then exit")
    p.add_argument("--resume", action="store_true",
                   help="continue the live stream whose outputs are in --out DIR from its "
                        "checkpoint (after its driver died, or once it stopped)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--verify", action="store_true",
                   help="after the run, compare result.parquet with Spark's own answer on "
                        "the same (cached) input; report.json gets a 'verify' block and a "
                        "mismatch exits 1")
    args = p.parse_args(argv)
    topo = load_or_exit(args.topology, args.overrides, check_input=True)
    check_input_columns(topo)
    sizing = SparkSizing(_positive_int("--spark-executors", args.spark_executors),
                         _positive_int("--spark-executor-cores", args.spark_executor_cores),
                         args.spark_executor_memory, _spark_conf(args.spark_conf))
    if args.verify and topo.app.kind == "operator":
        fail("--verify: Spark has no answer for a user's operator (app.kind: operator); "
             "verify runs of the built-in apps")
    if args.check:
        what = topo.input.path or f"{topo.input.format} ({topo.input.messages:,} messages)"
        print(f"ok: {topo.name}: {topo.sources} source(s) -> {topo.workers.count} workers, "
              f"scheme {topo.grouping.scheme}, app {topo.app.kind}, input {what}")
        return 0
    check_address(args.address)
    out = args.out or default_out_dir(topo.name)
    if args.resume:
        _take_over(topo, args.out)
    elif topo.input.stream and (Path(out) / ".checkpoint").exists():
        fail(f"--out: {out} holds a live stream's checkpoint: add --resume to continue that "
             f"stream, or choose another --out")

    with engine_session(topo.name, args.address, topo=topo, spark=sizing) as spark:
        from actors.pipeline import run_live, run_pipeline
        from actors.spark_input import build_dataframe

        live = topo.input.stream
        df = build_dataframe(spark, topo).cache() if args.verify and not live else None
        if live:  # restarts from its checkpoint if the aggregator dies
            report = run_live(topo, out, spark, progress=not args.no_progress,
                              resume=args.resume)
        else:
            report = run_pipeline(topo, out, spark, progress=not args.no_progress, df=df)
        if args.verify and live:  # every file that arrived, read once the stream ended
            df = build_dataframe(spark, topo)
        verdict = verify_result(topo, df, Path(out)) if args.verify else None
    print(summary_table(report))
    print(f"\noutputs: {out}")
    if verdict is not None:
        print(f"verify: {verdict['message']}")
        return 0 if verdict["equal"] else 1
    return 0


def _take_over(topo: Topology, out: str | None) -> None:
    """``--resume``: check there is a stream to continue and that its driver is
    gone; stop what is left of that run's Ray and Spark processes."""
    from runtime import checkpoint

    if not topo.input.stream:
        fail("--resume: only for a live stream (input.stream: true)")
    if out is None:
        fail("--resume: needs --out DIR, the output directory of the stream to continue")
    try:
        found = checkpoint.load(out)
    except ValueError as e:
        fail(f"--resume: {e}")
    if found is None:
        fail(f"--resume: no checkpoint in {out} (a live stream's --out, with "
             f"run.checkpoint: true)")
    driver = checkpoint.recorded_driver(out)
    if driver is not None and driver != os.getpid():
        fail(f"--resume: the run that writes {out} is still running (pid {driver}); "
             f"stop it first")
    left = checkpoint.stop_leftovers(out)
    if left:
        print(f"resume: stopped {left} process(es) left by the dead run", file=sys.stderr)


def verify_result(topo: Topology, df: Any, out: Path) -> dict[str, Any]:
    """Compare ``out/result.parquet`` with Spark's answer on ``df``; add the
    verdict to ``report.json`` as ``verify``."""
    import json

    import pyarrow.parquet as pq

    from actors.spark_input import reference_result
    from runtime.operators import table_diff

    print(f"[{topo.name}] verify: computing Spark's answer on the same input",
          file=sys.stderr, flush=True)
    ref = reference_result(df, topo.app.model_dump())
    got = pq.read_table(out / "result.parquet")
    equal = table_diff(got, ref) is None  # floats within 1e-9 relative (DESIGN.md)
    what = {"wordcount": "groupBy(key).count()", "naive-bayes": "groupBy(key, label).count()",
            "heavy-hitters": f"exact top {topo.app.top_k}",
            "aggregate": f"groupBy(key).agg({', '.join(topo.app.aggs or ())} of "
                         f"{topo.app.value})"}[topo.app.kind]
    verdict: dict[str, Any] = {
        "against": f"spark {what}", "equal": bool(equal), "rows": got.num_rows,
        "reference_rows": ref.num_rows,
        "message": (f"result.parquet equals Spark's {what} ({ref.num_rows:,} rows)" if equal
                    else f"MISMATCH: result.parquet ({got.num_rows:,} rows) differs from "
                         f"Spark's {what} ({ref.num_rows:,} rows)"),
    }
    path = out / "report.json"
    report = json.loads(path.read_text())
    report["verify"] = verdict
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)
    return verdict


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]))
