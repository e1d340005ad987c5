"""The real engine: one Ray + RayDP Spark session and the runs inside it.

``RayEngine`` is ``runtime.engine.Engine`` on Ray::

    with RayEngine(topo.name, address, topo=topo, spark=SparkSizing()) as engine:
        report = engine.run(topo, out_dir)

Entering starts Ray (local, or attached to the cluster at ``address``) and a
RayDP Spark session (``engine_session``); leaving stops both, on every exit
path (SIGTERM included). A session already running in this process (a
notebook, a test session) is used instead and left running. ``run`` runs
``actors.pipeline.run_with_restarts`` (``run_pipeline``, restarted when it
loses an actor it cannot replace in place); ``verify_result`` compares a
run's result with Spark's own answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import ray

from actors import cluster, spark_input, telemetry
from actors.pipeline import run_with_restarts
from runtime.cli import fail
from runtime.reporting import phases
from runtime.sim import warm as warm_mod
from runtime.topology import Topology

ROOT = Path(__file__).resolve().parent.parent


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


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _announce(ctx: Any, log_file: str | os.PathLike[str] | None = None) -> None:
    """Where to watch: the Ray dashboard, the cluster address, the live view,
    and where Spark's and Ray's own messages go."""
    gcs = (getattr(ctx, "address_info", None) or {}).get("gcs_address", "?")
    url = getattr(ctx, "dashboard_url", None)
    dash = f"dashboard http://{url}, " if url else ""
    logs = f"; Spark's and Ray's messages: {log_file}" if log_file is not None else ""
    print(f"ray: {dash}cluster {gcs} (ray list actors --address {gcs}); "
          f"live view: python -m runtime.top{logs}", file=sys.stderr)


#: an actor call's arguments up to this many bytes travel inside the call;
#: larger ones Ray first puts in the object store. At Ray's default (100 KiB)
#: a source's calls of ~4,000 messages (~100 KB) went through the object
#: store: 0.83-0.87x the msgs/s (docs/benchmarks.md, "Calls inline").
INLINE_ARGS_BYTES = 1 << 20
INLINE_ARGS_ENV = "RAY_max_direct_call_object_size"


def ray_system_config() -> dict[str, Any]:
    """``ray.init(_system_config=...)`` for a cluster we start: metrics pushed
    every second (``telemetry.ray_system_config``), calls inline up to
    ``INLINE_ARGS_BYTES`` (unless ``RAY_max_direct_call_object_size`` is set)."""
    config = telemetry.ray_system_config()
    if INLINE_ARGS_ENV not in os.environ:
        config["max_direct_call_object_size"] = INLINE_ARGS_BYTES
    return config


def inline_args_env() -> dict[str, str]:
    """The same for the job's workers on a cluster we did not start (Ray reads
    ``RAY_<setting>`` when a worker process starts)."""
    return {INLINE_ARGS_ENV: os.environ.get(INLINE_ARGS_ENV, str(INLINE_ARGS_BYTES))}


def job_runtime_env(starts: bool, pythonpath: str,
                    operator_env: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The job's Ray runtime environment. On a cluster this process starts
    (``starts``) only what a user's operator ships (``operator_env``), else
    none: Ray's processes inherit this process's environment (``PYTHONPATH``)
    and the system config (``ray_system_config``). A runtime environment
    would cost every actor's process a round-trip to Ray's runtime-env agent,
    one after another, and keep Ray's prestarted workers from serving the
    job: 6 empty actors started in 2.8 s with one, 1.4-1.7 s without
    (docs/benchmarks.md, "Where a run's time goes"). On a cluster we attach
    to, the job brings ``PYTHONPATH`` and the inline-call setting along."""
    env: dict[str, Any] = ({} if starts else
                           {"env_vars": {"PYTHONPATH": pythonpath, **inline_args_env()}})
    env.update(operator_env or {})
    return env or None


#: where ``ray.init`` logs its token-authentication notice (a WARNING on the
#: console when ``RAY_AUTH_MODE`` is unset: "Token authentication is enabled
#: for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out ...")
RAY_AUTH_LOGGER = "ray._private.authentication"


@contextlib.contextmanager
def ray_notices_to(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Inside the block, Ray's authentication notices (``RAY_AUTH_LOGGER``)
    go to ``path`` instead of the console, like the rest of Ray's start-up
    chatter (``None``: left alone). Ray's other loggers are untouched."""
    if path is None:
        yield
        return
    logger = logging.getLogger(RAY_AUTH_LOGGER)
    handler = logging.FileHandler(path, delay=True)  # no file unless Ray says something
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # not to the "ray" logger's console handler
    try:
        yield
    finally:
        logger.propagate = propagate
        logger.removeHandler(handler)
        handler.close()


@contextlib.contextmanager
def dashboard_beside_raylet() -> Iterator[None]:
    """Inside the block, a ``ray.init`` that starts a cluster starts its
    dashboard (Ray's "API server") beside the raylet instead of before it.

    Ray starts the GCS, then the dashboard, and waits until the dashboard has
    published its address (1.7-1.9 s here, ~3 s with its web UI), and only then
    starts the raylet, which then waits ~1.3 s for its own agents before the
    node registers. The dashboard needs only the GCS, so here it starts in a
    thread and the raylet does not wait for it; ``ray.init`` still returns only
    once both are up, with the dashboard's URL (its errors are raised where Ray
    raised them). A bare ``ray.init`` on this 2-core machine: 3.9-5.3 s against
    5.0-6.5 s (docs/benchmarks.md, "Ray's dashboard beside its raylet").

    The thread stays until the dashboard's process ends: Ray starts it with
    ``PR_SET_PDEATHSIG``, which fires when the *thread* that started it
    exits, so the dashboard still dies with this process and only with it.

    Ray's private ``Node.start_api_server`` / ``start_ray_processes``
    (ray 2.60, pinned): if either is missing, nothing is changed. Attaching to
    a cluster (``address``) starts neither, so it is unaffected."""
    from ray._private import node as node_mod
    from ray._private import ray_constants

    Node = node_mod.Node
    api, processes = (getattr(Node, n, None) for n in ("start_api_server", "start_ray_processes"))
    if api is None or processes is None:
        yield
        return
    def start_api_server(self: Any, **kw: Any) -> None:
        up, errors = threading.Event(), list[BaseException]()
        self._hs_dashboard_start = (up, errors)  # start_ray_processes waits on it

        def target() -> None:
            try:
                api(self, **kw)
            except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                errors.append(e)
            finally:
                up.set()
            for info in self.all_processes.get(ray_constants.PROCESS_TYPE_DASHBOARD, []):
                while info.process.poll() is None:  # poll, not wait: Ray's shut-down polls it
                    time.sleep(0.5)

        threading.Thread(target=target, name="ray-dashboard", daemon=True).start()

    def start_ray_processes(self: Any) -> None:
        try:
            processes(self)
        finally:
            up, errors = self.__dict__.pop("_hs_dashboard_start", (None, []))
            if up is not None:
                up.wait()
        if errors:
            raise errors[0]

    setattr(Node, "start_api_server", start_api_server)  # noqa: B010 - a method, patched
    setattr(Node, "start_ray_processes", start_ray_processes)  # noqa: B010
    try:
        yield
    finally:
        setattr(Node, "start_api_server", api)  # noqa: B010
        setattr(Node, "start_ray_processes", processes)  # noqa: B010


@contextlib.contextmanager
def engine_session(app_name: str, address: str | None = None, *,
                   topo: Topology | None = None, spark: SparkSizing | None = None,
                   log_file: str | os.PathLike[str] | None = None) -> Iterator[Any]:
    """Ray (local, or the cluster at ``address``) and a RayDP Spark session;
    both are shut down on every exit path (SIGTERM included).

    ``topo``: checked against the cluster right after ``ray.init``, before
    Spark starts (a ``placement`` no node can serve -> ``TopologyError``).
    ``spark``: the executors RayDP starts (default one executor, 1 core, 1 GB).
    On an existing cluster nothing here is node-local: actors are named in the
    run's namespace, other nodes' workers are throttled by a ``ThrottleActor``
    on their node, and the outputs are written by this driver.
    ``log_file``: where Spark's JVM, Ray's start-up and Ray Data write their
    own messages (``spark_input.start_spark``); ``None``: the console.
    """
    sizing = spark or SparkSizing()

    signal.signal(signal.SIGTERM, _sigterm)
    # a failed run says why in one line; Ray would also print the traceback of
    # every other call that failed with it and whose result nobody fetched
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    pythonpath = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    os.environ["PYTHONPATH"] = pythonpath  # workers started by this driver import our code
    starts = address is None and not os.environ.get("RAY_ADDRESS")  # a cluster of our own
    operator_env: dict[str, Any] = {}
    if topo is not None and topo.app.kind == "operator" and topo.app.operator:
        from runtime.operators import runtime_env_for

        # the user's operator reaches every node with the job (Ray's runtime environment)
        operator_env = runtime_env_for(topo.app.operator, topo.base_dir)
    runtime_env = job_runtime_env(starts, pythonpath, operator_env)
    # a cluster we start pushes live metrics every second (runtime.top); an
    # existing cluster keeps its own settings
    system_config = ray_system_config() if starts else {}
    # Spark's Python side (pyspark, RayDP, Ray Data: ~1-2 s of imports) loads
    # while Ray starts: RayDP itself needs Ray up, its modules do not
    # and Spark's driver JVM starts too: it needs Ray only for its SparkContext
    extra = dict(sizing.conf)
    # a small input: the executor's life is its start-up, at the quick JIT tier
    if (topo is not None and "spark.executor.extraJavaOptions" not in extra
            and spark_input.quick_executor(topo)):
        extra["spark.executor.extraJavaOptions"] = spark_input.PLANNER_JVM_OPTIONS
    driver: dict[str, Any] = {"executor_memory": sizing.memory,
                              "num_executors": sizing.executors,
                              "executor_cores": sizing.cores, "extra_configs": extra}
    preload = threading.Thread(target=spark_input.preload, args=(driver, log_file),
                               name="spark-preload", daemon=True)
    preload.start()
    # the first run of this version of the sources compiles the kernels here,
    # beside Ray's and Spark's start-up, not in every actor once the run's clock runs
    warming = warm_mod.start_if_cold()
    try:
        t_ray = time.time()
        try:
            with ray_notices_to(log_file), dashboard_beside_raylet():
                ctx = ray.init(address=address, runtime_env=runtime_env,
                               logging_level=logging.WARNING, log_to_driver=False,
                               _system_config=system_config or None)
        except ConnectionError as e:
            fail(f"--address: cannot attach to the Ray cluster at {address!r} ({e})")
        # ray.init puts its own SIGTERM handler in place (exit code 15, a stack
        # dump on the console, "the run failed"): ours again, so that SIGTERM
        # stops the run as Ctrl-C does
        signal.signal(signal.SIGTERM, _sigterm)
        phases.startup_step("ray", t_ray)
        cluster.check_spark_fits(sizing.cpus)
        if topo is not None:  # before anything else is printed: one line, exit 2
            cluster.check_placement(topo, spark_cpus=sizing.cpus)
        _announce(ctx, log_file)
        preload.join()
        t_spark = time.time()
        session = spark_input.start_spark(app_name=app_name, log_file=log_file, **driver)
        phases.startup_step("spark", t_spark)
        if warming is not None:
            warming.wait()
        yield session
    finally:
        if warming is not None and warming.poll() is None:
            warming.kill()
        try:
            spark_input.stop_spark()
        finally:
            if ray.is_initialized():
                shutdown_ray()


def shutdown_ray() -> None:
    """``ray.shutdown()`` with no garbage collection beside it. An ``ObjectRef``
    or actor handle freed by another thread (the plot drawn meanwhile, any
    thread whose allocation triggers the cyclic collector) between Ray's
    shutting down its core worker and forgetting it makes Ray end the
    whole process with exit code 1 ("core worker already shutdown"). So the
    cycles are collected first, and the collector is off until Ray is gone."""
    gc.collect()
    gc.disable()
    try:
        _stop_monitor()
        ray.shutdown()
    finally:
        gc.enable()


def _stop_monitor() -> None:
    """Kill the autoscaler monitor of a cluster this process started, before
    ``ray.shutdown()`` stops the rest. Ray stops its processes one by one,
    each given a second to exit on SIGTERM; the monitor never takes it, so
    every run's finish waited that second for nothing (it holds no state:
    killing it loses nothing). A cluster attached to is not ours: untouched."""
    from ray._private import ray_constants
    from ray._private import worker as ray_worker

    node = getattr(ray_worker, "_global_node", None)
    for info in (getattr(node, "all_processes", None) or {}).get(
            ray_constants.PROCESS_TYPE_MONITOR, []):
        with contextlib.suppress(OSError):
            info.process.kill()
            info.process.wait(timeout=1)


class RayEngine:
    """``runtime.engine.Engine`` on Ray, fed by Spark; a context manager that
    owns the session (``engine_session``'s arguments) - or, when a Ray + Spark
    session is already running in this process, uses it and leaves it running.
    ``reuse_actors``: a run takes the actor processes an earlier clean run of
    the session left (``actors.pool``); ``False`` for a process that runs once.
    ``spark`` is the Spark session while inside the ``with``."""

    def __init__(self, app_name: str, address: str | None = None, *,
                 topo: Topology | None = None, spark: SparkSizing | None = None,
                 log_file: str | os.PathLike[str] | None = None,
                 reuse_actors: bool = True) -> None:
        self.app_name, self.address, self.topo, self.sizing = app_name, address, topo, spark
        self.reuse_actors = reuse_actors
        self.log_file = log_file
        self.spark: Any = None
        #: the last run's ``phases`` clock (``runtime.reporting.phases``)
        self.clock: phases.RunClock | None = None
        self._session = contextlib.ExitStack()

    def __enter__(self) -> RayEngine:
        if ray.is_initialized() and spark_input.session_cpus() > 0:
            self.spark = spark_input.start_spark()  # (returns the running one)
        else:
            self.spark = self._session.enter_context(engine_session(
                self.app_name, self.address, topo=self.topo, spark=self.sizing,
                log_file=self.log_file))
            phases.engine_ready()  # the first run's start-up ends here
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.spark = None
        self._session.__exit__(kind, exc, tb)

    @contextlib.contextmanager
    def shared_input(self, topo: Topology) -> Iterator[Any]:
        """``topo``'s input as a cached DataFrame (read by Spark once),
        unpersisted when the block ends."""
        df = spark_input.build_dataframe(self.spark, topo).cache()
        yield df
        df.unpersist()

    def run(self, topo: Topology, out_dir: str | os.PathLike[str], *, progress: bool = False,
            log: Callable[[str], None] | None = None, data: Any = None, resume: bool = False,
            verify: bool = False, plot: bool = True,
            clock: phases.RunClock | None = None) -> dict[str, Any]:
        """Run ``topo``, write its outputs to ``out_dir``, return the report.

        Runs with ``run_with_restarts``: a live stream (``input.stream``)
        restarts from its checkpoint if the aggregator or a source dies, a
        finite input from its start if the aggregator dies; ``resume``
        continues the stream whose checkpoint is in ``out_dir``. A finite input
        is read from ``data`` (a ``shared_input`` DataFrame) if given. ``verify``: compare ``result.parquet`` with
        Spark's own answer on the same input (``spark_reference``, taken
        before the stream - after it for a live stream - and
        ``verify_result``); the report gets the verdict as ``verify``.
        ``plot``: write ``report.png`` (``False``: the caller plots later).
        The report's ``phases`` run until the outputs are written
        (``finish_parts.outputs``); ``self.clock`` keeps the run's clock for
        a caller that adds what follows (``runtime.run``: plot, shut-down).
        """
        live, out = topo.input.stream, Path(out_dir)
        self.clock = clock = clock if clock is not None else phases.RunClock.take()
        if verify and not live and data is None:  # Spark's answer on the very rows the run read
            with self.shared_input(topo) as df:
                return self.run(topo, out, progress=progress, log=log, data=df, verify=True,
                                plot=plot, clock=clock)
        # Spark's answer is taken before the stream: a failure during the run (a
        # node, Spark's executor with it) cannot take it away (docs/cluster.md)
        ref = spark_reference(topo, data) if verify and not live else None
        report = run_with_restarts(topo, out, self.spark, progress=progress, log=log,
                                   resume=resume, df=None if live else data, plot=plot,
                                   clock=clock, reuse_actors=self.reuse_actors)
        if verify:
            if ref is None:  # a live stream: every file that arrived, read once it ended
                ref = spark_reference(topo, _on_time(self.spark, topo, out))
            report["verify"] = verify_result(topo, ref, out)
        clock.part("outputs", clock.since_end())  # the result is safe from here on
        report["phases"] = clock.block()
        phases.rewrite(out, report["phases"])
        return report


def _on_time(spark: Any, topo: Topology, out: Path) -> Any:
    """Every record of a live stream that counts: all that arrived, less a
    windowed stream's late ones (``OUT/late.parquet``, counted in no window)."""
    import pyarrow.parquet as pq

    from runtime.dataflow.event_time import LATE_FILE

    df = spark_input.build_dataframe(spark, topo)
    late = out / LATE_FILE
    if topo.app.window is None or not late.exists():
        return df
    rows = pq.read_table(late).select(df.columns).to_pylist()
    return df.exceptAll(spark.createDataFrame(rows, schema=df.schema))


def spark_reference(topo: Topology, df: Any) -> Any:
    """Spark's own answer for ``topo``'s app on ``df`` (a pyarrow Table in the
    operators' schema): what ``result.parquet`` must equal."""
    print(f"[{topo.name}] verify: computing Spark's answer on the same input",
          file=sys.stderr, flush=True)
    return spark_input.reference_result(df, topo.app.model_dump())


def verify_result(topo: Topology, ref: Any, out: Path) -> dict[str, Any]:
    """Compare ``out/result.parquet`` with ``ref`` (``spark_reference``); add
    the verdict to ``report.json`` as ``verify``."""
    import pyarrow.parquet as pq

    from runtime.operators import table_diff

    got = pq.read_table(out / "result.parquet")
    equal = table_diff(got, ref) is None  # floats within 1e-9 relative (docs/design.md)
    what = {"wordcount": "groupBy(key).count()", "naive-bayes": "groupBy(key, label).count()",
            "heavy-hitters": f"exact top {topo.app.top_k}",
            "aggregate": f"groupBy(key).agg({', '.join(topo.app.aggs or ())} of "
                         f"{topo.app.value})"}[topo.app.kind]
    if topo.app.window is not None:
        w = topo.app.window
        what = f"{what} per window({w.column}, {w.size}, {w.slide or w.size})"
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


__all__ = ["RayEngine", "SparkSizing", "engine_session", "spark_reference", "verify_result"]
