"""``python -m runtime.run TOPOLOGY.yaml [--out DIR] [--set k.p=v ...] [--address ADDR] [--check]``

Runs a topology on the real engine: Ray actors fed by Spark (RayDP). See
``actors.engine.RayEngine`` for the session, ``actors.pipeline`` for the run
itself and docs/design.md for the contracts: exit 0 with a summary table on stdout
and the outputs in DIR; bad input -> exit 2 and one line on stderr; Ctrl-C ->
130. Every throttled worker is resumed and Spark and Ray are shut down on every
exit path. Nothing of Ray is imported before the input passed its checks
(``--check`` never loads it).

Once the answer is final, ``result.parquet`` and ``report.json`` are written
and the summary printed first; ``report.png`` is drawn while Spark and Ray
shut down, then ``report.json`` gets its final ``phases``
(``runtime.reporting.phases``: where the run's time went). Spark's, the JVM's
and Ray's own messages go to ``DIR/engine.log``, named when the run fails.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from runtime.cli import (
    EXIT_BAD_INPUT,
    EXIT_MISMATCH,
    base_parser,
    check_address,
    claim_out_dir,
    fail,
    load_or_exit,
    run_main,
)
from runtime.reporting import phases
from runtime.reporting.report import default_out_dir, summary_table
from runtime.topology import Topology, TopologyError


def check_input_columns(topo: Topology) -> None:
    """Fail (exit 2, one line) before Ray and Spark start if the input file is
    missing, unreadable or empty, or lacks the key (or label) column
    (``runtime.inputs.input_check.preflight``)."""
    from runtime.inputs.input_check import preflight

    try:
        preflight(topo)
    except TopologyError as e:
        fail(str(e))


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
                   help="compare result.parquet with Spark's own answer on the same (cached) "
                        "input, computed before the stream (a live stream's: after it); "
                        "report.json gets a 'verify' block and a mismatch exits 3")
    p.add_argument("--prometheus", nargs="?", const="9090", default=None, metavar="PORT",
                   help="start a Prometheus server on 127.0.0.1:PORT (default 9090) scraping "
                        "the run's metrics every second, for the Ray dashboard and queries; "
                        "its data stays in OUT/prometheus/ (needs the prometheus binary)")
    args = p.parse_args(argv)
    phases.begin()  # the command's start: this process's creation
    topo = load_or_exit(args.topology, args.overrides, check_input=True)
    check_input_columns(topo)
    executors = _positive_int("--spark-executors", args.spark_executors)
    cores = _positive_int("--spark-executor-cores", args.spark_executor_cores)
    spark_conf = _spark_conf(args.spark_conf)
    if args.verify and topo.app.kind == "operator":
        fail("--verify: Spark has no answer for a user's operator (app.kind: operator); "
             "verify runs of the built-in apps")
    if args.check:
        what = topo.input.path or f"{topo.input.format} ({topo.input.messages:,} messages)"
        print(f"ok: {topo.name}: {topo.sources} source(s) -> {topo.workers.count} workers, "
              f"scheme {topo.grouping.scheme}, app {topo.app.kind}, input {what}")
        return 0
    check_address(args.address)
    if args.prometheus is not None:
        port = _positive_int("--prometheus", args.prometheus)
        if port > 65535:
            fail(f"--prometheus: a TCP port, 1..65535 (got {args.prometheus!r})")
        args.prometheus = port
        import shutil

        if shutil.which("prometheus") is None:  # (actors.prometheus starts it, in _run)
            fail("--prometheus: no prometheus binary on PATH (Debian: apt-get install "
                 "prometheus)")
        # the dashboard's metrics page asks this server (read when Ray starts)
        os.environ.setdefault("RAY_PROMETHEUS_HOST", f"http://127.0.0.1:{port}")
    out = args.out or default_out_dir(topo.name)
    existed = Path(out).exists()  # (claim_out_dir creates it)
    resume = False
    if args.resume:
        resume = _take_over(topo, args.out)
    elif topo.input.stream and (Path(out) / ".checkpoint").exists():
        fail(f"--out: {out} holds a live stream's checkpoint: add --resume to continue that "
             f"stream, or choose another --out")
    else:
        claim_out_dir(out)

    return _run(topo, Path(out), args, (executors, cores, args.spark_executor_memory, spark_conf),
                resume=resume, existed=existed)


def _run(topo: Topology, out: Path, args: Any, sizing_args: tuple[Any, ...], *,
         resume: bool, existed: bool) -> int:
    """The run: Ray and Spark up, the stream, then the result first
    (``result.parquet``, ``report.json``, the summary), the plot while Spark
    and Ray shut down, and ``report.json``'s final ``phases``. Spark's and
    Ray's own messages go to ``OUT/engine.log``, named when the run fails."""
    from actors.engine import RayEngine, SparkSizing
    from runtime.reporting.report import write_plot

    sizing = SparkSizing(*sizing_args)
    out.mkdir(parents=True, exist_ok=True)
    log_file = out / ENGINE_LOG
    plotter: threading.Thread | None = None
    plot_error: list[BaseException] = []
    try:
        with contextlib.ExitStack() as stack:
            if args.prometheus is not None:
                from actors.prometheus import PrometheusServer

                prom = stack.enter_context(PrometheusServer(out, args.prometheus))
                print(f"[{topo.name}] prometheus: {prom.url} (query ray_hs_worker_rate; "
                      f"its data: {prom.dir})", file=sys.stderr, flush=True)
            engine = stack.enter_context(RayEngine(topo.name, args.address, topo=topo,
                                                   spark=sizing, log_file=log_file,
                                                   reuse_actors=False))  # one run
            report = engine.run(topo, out, progress=not args.no_progress, resume=resume,
                                verify=args.verify, plot=False)
            clock = engine.clock
            assert clock is not None
            print(summary_table(report))
            print(f"\noutputs: {out}")
            verdict = report.get("verify")
            if verdict is not None:
                print(f"verify: {verdict['message']}")
            sys.stdout.flush()

            def plot() -> None:
                t = time.time()
                try:
                    write_plot(out, report)
                except BaseException as e:  # noqa: BLE001 - reported below
                    plot_error.append(e)
                clock.part("plot", time.time() - t)

            # the result is safe: the plot is drawn while Spark and Ray shut down
            plotter = threading.Thread(target=plot, name="report-plot", daemon=True)
            plotter.start()
            t_down = time.time()
    except BaseException as e:
        if plotter is not None:
            plotter.join()
        _failed(e, out, log_file, existed)
        from runtime.operators import OperatorError, find_operator_error

        op_error = find_operator_error(e) if isinstance(e, Exception) else None
        printed = out / "operators.log"
        if op_error is not None and printed.exists() and printed.stat().st_size:
            raise OperatorError(f"{op_error} (what it printed: {printed})") from None
        raise
    clock.part("shutdown", time.time() - t_down)
    plotter.join()
    if plot_error:
        print(f"warning: report.png: {plot_error[0]}", file=sys.stderr)
    ph = clock.block(final=True)
    phases.rewrite(out, ph)
    print(f"finish {ph['finish']:.1f} s (plot {ph['finish_parts'].get('plot', 0):.1f} s while "
          f"Spark and Ray shut down in {ph['finish_parts'].get('shutdown', 0):.1f} s); "
          f"wall time {ph['total']:.1f} s")
    if verdict is not None and not verdict["equal"]:
        return EXIT_MISMATCH
    return 0


#: Spark's, the JVM's and Ray's own messages, in the run's directory
ENGINE_LOG = "engine.log"


def _failed(error: BaseException, out: Path, log_file: Path, existed: bool) -> None:
    """A run that failed: bad input (exit 2) leaves no output directory it
    created (its one line says it all); any other failure names the engine's
    log, where Spark's and Ray's own messages are."""
    bad_input = isinstance(error, TopologyError) or (
        isinstance(error, SystemExit) and error.code == EXIT_BAD_INPUT)
    if bad_input or isinstance(error, KeyboardInterrupt):
        if not existed and sorted(p.name for p in out.iterdir()) == [ENGINE_LOG]:
            log_file.unlink(missing_ok=True)
            out.rmdir()
        return
    if isinstance(error, SystemExit) and error.code in (0, None):
        return
    from runtime.operators import find_operator_error

    if isinstance(error, Exception) and find_operator_error(error) is not None:
        return  # the user's operator failed: its one line says where
    if log_file.exists():
        print(f"error: the run failed; Spark's, the JVM's and Ray's own messages are in "
              f"{log_file}", file=sys.stderr)


def _take_over(topo: Topology, out: Path | None) -> bool:
    """``--resume``: check that the stream's driver is gone (``--out`` is
    claimed: no other run holds it) and stop what is left of that run's Ray and
    Spark processes. ``True``: continue from its checkpoint; ``False``: it died
    before its first checkpoint (nothing was committed), so the stream starts
    afresh."""
    from runtime.dataflow import checkpoint

    if not topo.input.stream:
        fail("--resume: only for a live stream (input.stream: true)")
    if out is None:
        fail("--resume: needs --out DIR, the output directory of the stream to continue")
    claim_out_dir(out)
    try:
        found = checkpoint.load(out)
    except ValueError as e:
        fail(f"--resume: {e}")
    driver = checkpoint.recorded_driver(out)
    if driver is not None and driver != os.getpid():
        fail(f"--resume: the run that writes {out} is still running (pid {driver}); "
             f"stop it first")
    left = checkpoint.stop_leftovers(out)
    if left:
        print(f"resume: stopped {left} process(es) left by the dead run", file=sys.stderr)
    if found is not None:
        return True
    try:
        checkpoint.discard_unstarted(out)
    except ValueError as e:
        fail(f"--resume: {e}")
    print(f"resume: no checkpoint in {out} yet (its run died before the first one; nothing "
          f"was committed): starting the stream afresh", file=sys.stderr)
    return False


def exit_now(code: int) -> NoReturn:
    """End the process once the run is written and Spark and Ray are shut
    down: the exit handlers run (Ray's, logging's), the interpreter's
    teardown of every loaded module - 1-3 s with Ray, Spark and Arrow loaded,
    measured on a busy 2-core machine - is skipped."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        run_main(lambda: main(sys.argv[1:]))
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            raise  # a message to print: Python's own exit
        exit_now(e.code or 0)
