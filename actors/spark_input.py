"""Spark -> RayDP -> Ray: the input side of a run.

1. ``start_spark()``: a one-executor RayDP Spark session inside the running
   Ray cluster, with the Java 17 ``--add-opens`` options and the raydp 1.6.5
   ``set_load_code_from_local`` fix (docs/spark.md).
2. ``build_dataframe(spark, topo)``: the topology's input as a Spark
   DataFrame with a ``key`` string column (and ``label`` int64 for
   naive-bayes). Files are read by Spark; generated streams are produced *by
   Spark* (``spark.range`` + ``mapInArrow`` calling
   ``runtime.inputs.generators.generate``), equal message for message to the numpy
   stream the simulator sees.
3. ``to_ray_shards(df, n_sources)``: ``ray.data.from_spark`` and one Ray
   Dataset shard per source actor; each actor iterates its own shard with
   ``iter_batches`` - the rows never pass through the driver.
4. ``reference_result(df, app)``: Spark's own answer, to check a
   run's ``result.parquet`` for exactness.

Key conventions (same as ``runtime.operators`` and ``runtime.hashing``):

- Keys are strings. A non-string key column (e.g. integer ids in Parquet or
  JSON) is cast with Spark's ``CAST(key AS STRING)``: ``5`` -> ``"5"``,
  ``5.0`` -> ``"5.0"``. CSV is read with ``header=True`` and no schema
  inference, so a key is exactly its text (``"007"`` stays ``"007"``).
- Null keys are kept as nulls: all of them form one group (one hash,
  ``NULL_HASH``; one result row with a null key), like Spark's ``groupBy``.
- A JSON file with malformed lines is refused (exit 2), not read as rows of
  nulls. The simulator follows the same conventions
  (``runtime.inputs.input_check``).
- naive-bayes labels from a file are cast to int64; rows whose label is null
  (or not an integer) are dropped - an example without a class teaches
  nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import ray

from actors import jvm_archive
from runtime.hashing import hash_arrow
from runtime.inputs.input_check import SHARD_BLOCK_ROWS, shard_block_rows
from runtime.reporting.metrics import DistinctKeys
from runtime.topology import FILE_FORMATS, Topology, TopologyError

log = logging.getLogger(__name__)

#: JVM packages RayDP's Arrow/serialization code reflects into on Java 17
_OPENS_PKGS = (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
    "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "java.util.regex",
    "java.math", "java.text", "java.time", "java.security", "jdk.internal.misc", "sun.nio.ch",
    "sun.nio.cs", "sun.security.action", "sun.util.calendar",
)
JAVA17_OPTIONS = " ".join(f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in _OPENS_PKGS) + (
    " -Djdk.reflect.useDirectMethodHandle=false"
)
#: the JVMs that plan and schedule (Spark's driver, RayDP's master) but do not
#: compute: only the quick JIT tier and one GC thread. Their start-up and first
#: jobs are mostly JIT work competing for the same cores as everything else:
#: measured on 2 cores, `make demo`'s first message came 1-3 s sooner
#: (docs/benchmarks.md, "The planning JVMs' JIT"). The executors keep the
#: full JIT: they convert the data.
PLANNER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: ... and the executors too when the input is known to be at most this many
#: rows (``quick_executor``): then the executor's life is mostly its start-up
#: and first job, and the quick tier brought the first block 1.8 s sooner on
#: 2 cores (20,000 and 300,000 rows). It converts data ~1.5x slower: +0.35 s
#: per million rows (docs/benchmarks.md, "The executor's JIT for a small input")
QUICK_EXECUTOR_ROWS = 1_000_000

#: the settings spark-submit reads to start the driver JVM (``launch_driver``)
DRIVER_JVM_CONFS = ("spark.driver.extraJavaOptions", "spark.driver.extraClassPath",
                    "spark.driver.extraLibraryPath", "spark.driver.memory")

_lock = threading.Lock()
_session: Any = None
_session_cpus = 0.0
#: when this process first started a Spark driver JVM (``remove_jni_copies``)
_jvm_since: float | None = None

#: Ray's Java runtime in driver mode (Spark's driver JVM, under RayDP) copies
#: its JNI library to ``/tmp/ray/<epoch ms>/`` when it starts - a path fixed in
#: Ray's Java code, whatever Ray's temp dir - and never removes it: 40 MB a run
JNI_COPY_ROOT = Path("/tmp/ray")
JNI_LIB = "libcore_worker_library_java.so"


def remove_jni_copies(since: float, settle_s: float = 2.0) -> int:
    """Remove the JNI copies (``JNI_COPY_ROOT``) made since ``since`` (epoch
    seconds), each at least ``settle_s`` old: one another run's JVM is
    writing right now stays. A copy that a live JVM has loaded can go
    (Linux keeps an open file until it is closed). Returns how many went."""
    removed = 0
    now = time.time()
    with contextlib.suppress(OSError):
        for d in JNI_COPY_ROOT.iterdir():
            if not d.name.isdigit() or int(d.name) < since * 1000:
                continue
            try:
                if now - (d / JNI_LIB).stat().st_mtime < settle_s:
                    continue
            except OSError:
                continue
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    return removed


#: the prefix of this process's Spark scratch directory (``scratch_dir``)
SCRATCH_PREFIX = "hetero-spark-"
_scratch: Path | None = None
_scratch_lock = threading.Lock()


def scratch_dir() -> Path:
    """This process's Spark scratch directory, ``<tmp>/hetero-spark-<pid>-*``,
    made on first use and removed when the process exits.

    Spark's JVMs write their temporary files into ``java.io.tmpdir`` (``/tmp``
    unless told; Spark's local directory too while ``spark.local.dir`` is
    unset): the extracted native libraries (``liblz4-java-*.so``, snappy),
    ``spark-*`` and ``blockmgr-*``.
    RayDP's executors end by ``ray.kill``, so their shutdown hooks never
    delete them: before this, every session left them in ``/tmp``. A
    directory left by a process that was killed (its pid gone) is removed
    the next time one is made."""
    global _scratch
    with _scratch_lock:
        if _scratch is None:
            root = Path(tempfile.gettempdir())
            for old in root.glob(f"{SCRATCH_PREFIX}*"):
                pid = old.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
                if pid.isdigit() and not psutil.pid_exists(int(pid)):
                    shutil.rmtree(old, ignore_errors=True)
            _scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
            atexit.register(shutil.rmtree, _scratch, ignore_errors=True)
        return _scratch


def _all_nodes_local() -> bool:
    """Whether every live Ray node runs on this machine (an executor's
    ``java.io.tmpdir`` must exist where it runs: only then is it ours)."""
    try:
        here = ray.util.get_node_ip_address()
        return all(n["NodeManagerAddress"] == here for n in ray.nodes() if n["Alive"])
    except Exception:  # noqa: BLE001 - unknown: leave the executors' default
        return False


# --------------------------------------------------------------------------- session


def _install_load_code_fix() -> None:
    """Work around raydp 1.6.5 leaving ``load_code_from_local`` on in pooled workers.

    ``raydp.spark.dataset._fetch_arrow_table_from_executor`` turns it on for
    its cross-language call and never turns it off; the pooled Python worker
    then fails to create module-level actor classes from inside tasks (and
    breaks ``ray.data.read_parquet``). We replace the remote function with one
    that calls the original and resets the flag in ``finally`` (docs/spark.md).
    Idempotent.
    """
    from raydp.spark import dataset as raydp_dataset

    current = raydp_dataset._fetch_arrow_table_from_executor
    if getattr(current, "_hetero_fixed", False):
        return
    original = current._function

    @ray.remote(max_retries=-1)
    def _fetch_and_reset(*args: Any, **kwargs: Any) -> pa.Table:
        try:
            return original(*args, **kwargs)
        finally:
            ray._private.worker.global_worker.set_load_code_from_local(False)

    _fetch_and_reset._hetero_fixed = True  # type: ignore[attr-defined]
    raydp_dataset._fetch_arrow_table_from_executor = _fetch_and_reset


def preload(driver: dict[str, Any] | None = None,
            log_file: str | os.PathLike[str] | None = None) -> None:
    """Import what ``start_spark`` needs (pyspark's SQL side, RayDP, Ray
    Data) and, given ``driver`` (``start_spark``'s sizing arguments), start
    Spark's driver JVM (``launch_driver``): run in a thread while Ray starts.
    A failure is left for ``start_spark`` to raise, in order."""
    try:
        import pyspark.sql  # noqa: F401
        import ray.data  # noqa: F401
        import raydp  # noqa: F401
        from raydp.spark import dataset  # noqa: F401

        if driver is not None:
            launch_driver(log_file=log_file, **driver)
    except Exception:  # noqa: BLE001, S110 - start_spark does it again and says why
        pass


def launch_driver(executor_memory: str = "1GB", num_executors: int = 1,
                  executor_cores: int = 1, extra_configs: dict[str, str] | None = None,
                  log_file: str | os.PathLike[str] | None = None) -> None:
    """Start Spark's driver JVM (pyspark's py4j gateway) now, before Ray is up.

    The driver JVM does not need Ray until its ``SparkContext`` is created:
    started while Ray starts, its start-up (spark-submit's launcher JVM, then
    the driver's) overlaps Ray's instead of following RayDP's master, and
    ``start_spark``'s session uses it (pyspark starts a gateway only when there
    is none). It is given exactly the JVM settings RayDP's
    ``SparkCluster._prepare_spark_configs`` computes for the driver
    (classpath, Java agent, log4j, our Java options) from the arguments
    ``start_spark`` will get. Its output goes to ``log_file`` for good. A
    no-op when this process has a gateway already."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from raydp.spark.ray_cluster import SparkCluster

    global _jvm_since
    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        _jvm_since = _jvm_since or time.time()
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        cluster = SparkCluster.__new__(SparkCluster)  # its config step alone: no master yet
        cluster._num_executors, cluster._executor_cores = num_executors, executor_cores
        cluster._executor_memory = executor_memory
        cluster._configs = _session_configs(extra_configs)
        cluster._prepare_spark_configs()
        conf = SparkConf(loadDefaults=False).setAll(
            [(k, v) for k, v in cluster._configs.items() if k.startswith(DRIVER_JVM_CONFS)])
        kwargs: dict[str, Any] = {}
        with contextlib.ExitStack() as stack:
            if log_file is not None:
                out = stack.enter_context(open(log_file, "ab"))
                kwargs = {"stdout": out, "stderr": out}
            gateway = launch_gateway(conf, popen_kwargs=kwargs)
        SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm


@contextlib.contextmanager
def output_to(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2) appended to
    ``path`` inside the block (``None``: left alone). A child started inside
    (Spark's driver JVM) keeps writing there for good: its start-up chatter
    (log4j's status lines, Spark's ``WARN Utils`` and ``NativeCodeLoader``,
    Ray's ``gcs_client.cc`` lines from its Java worker) stays off the console."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = (os.dup(1), os.dup(2))
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


def route_ray_data_logs(path: str | os.PathLike[str] | None) -> None:
    """Ray Data's console messages in the driver (its progress-bar warning,
    "Dataset ... execution finished") go to ``path`` instead; its errors
    still reach the console. ``None``: left alone."""
    if path is None:
        return
    import ray.data  # noqa: F401 - configures its loggers: re-routed below

    logger = logging.getLogger("ray.data")
    for h in list(logger.handlers):
        if not isinstance(h, logging.FileHandler) and type(h).__name__ != "SessionFileHandler":
            h.setLevel(logging.ERROR)
    if not any(getattr(h, "_hetero_engine_log", False) for h in logger.handlers):
        fh = logging.FileHandler(path)
        fh.setLevel(logging.INFO)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        fh._hetero_engine_log = True  # type: ignore[attr-defined]
        logger.addHandler(fh)


def start_spark(app_name: str = "hetero-stream", executor_memory: str = "1GB",
                num_executors: int = 1, executor_cores: int = 1,
                extra_configs: dict[str, str] | None = None,
                log_file: str | os.PathLike[str] | None = None) -> Any:
    """Start (once per process) a RayDP Spark session (default: 1 executor, 1 core).

    Ray must be initialized by the caller (``ray.init``). Returns the existing
    session when already started. Spark logs at WARN/ERROR only and without
    console progress bars. RayDP starts each executor as a Ray actor holding
    ``executor_cores`` CPUs, on whichever nodes have them (docs/cluster.md).
    ``extra_configs``: more Spark settings (e.g. RayDP's
    ``spark.ray.raydp_spark_executor.actor.resource.<name>`` to pin executors);
    Java options given there keep the Java 17 ones appended. ``log_file``:
    where Spark's driver JVM writes (its stdout and stderr, for good) and
    Ray Data's console messages go (``None``: this process's console).
    """
    global _session, _session_cpus, _jvm_since
    if not ray.is_initialized():
        raise RuntimeError(
            "start_spark: Ray is not initialized - call ray.init(...) first "
            "(RayDP runs Spark's executors as Ray actors in that cluster)"
        )
    with _lock:
        if _session is not None:
            return _session
        import raydp

        _jvm_since = _jvm_since or time.time()
        _install_load_code_fix()
        # pyspark takes the executors' Python from the driver's PYSPARK_PYTHON
        # (default "python3" on PATH, which lacks our packages); RayDP's
        # driver is not started by spark-submit, so spark.pyspark.python alone
        # is not enough
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        configs = _session_configs(extra_configs, executors_local=_all_nodes_local())
        with output_to(log_file):
            spark = raydp.init_spark(
                app_name=app_name,
                num_executors=num_executors,
                executor_cores=executor_cores,
                executor_memory=executor_memory,
                configs=configs,
            )
            spark.sparkContext.setLogLevel("ERROR")
        route_ray_data_logs(log_file)
        _session = spark
        _session_cpus = float(num_executors * executor_cores)
        return spark


def _session_configs(extra_configs: dict[str, str] | None, *,
                     executors_local: bool = False) -> dict[str, str]:
    """The Spark settings ``start_spark`` hands RayDP (``extra_configs`` on top).
    The driver's and RayDP master's temporary files go to ``scratch_dir()``, and
    the executors' too when they run on this machine (``executors_local``):
    their ``java.io.tmpdir``, which is also Spark's local directory when
    ``spark.local.dir`` is unset (setting that one makes Spark warn that a
    cluster manager may override it). The driver's and (``executors_local``)
    the executors' class archives too (``actors.jvm_archive``), when built."""
    tmp = scratch_dir()
    # a JVM's fatal-error log too: a Ray Java worker can crash in Ray's native
    # library as it exits (SIGSEGV in boost's scheduler destructor, after a
    # run's answer), and would write hs_err_pid<N>.log into the user's directory
    here = f"-Djava.io.tmpdir={tmp} -XX:ErrorFile={tmp}/hs_err_pid%p.log"
    configs = {
        "spark.executor.extraJavaOptions":
            f"{JAVA17_OPTIONS} {here} {jvm_archive.java_options('executor')}".rstrip()
            if executors_local else JAVA17_OPTIONS,
        "spark.driver.extraJavaOptions":
            f"{JAVA17_OPTIONS} {PLANNER_JVM_OPTIONS} {here} "
            f"{jvm_archive.java_options('driver')}".rstrip(),
        "spark.ray.raydp_app_master.extraJavaOptions":
            f"{JAVA17_OPTIONS} {PLANNER_JVM_OPTIONS} {here}",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        # mapInArrow/generators must run with this interpreter (our venv)
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": "4",
    }
    for k, v in (extra_configs or {}).items():
        # Java options: ours kept (Java 17's, the scratch dir, the planners' JIT)
        # and yours after them, so that yours win where both set one
        configs[k] = f"{configs.get(k, JAVA17_OPTIONS)} {v}" if k.endswith(
            "extraJavaOptions") else v
    return configs


def quick_executor(topo: Topology) -> bool:
    """Whether ``topo``'s input is known to be at most ``QUICK_EXECUTOR_ROWS``
    rows before Spark reads it: a generated stream, an ``input.limit``, or a
    local Parquet file's footer. A live stream, a directory, CSV or JSON
    without a limit: not known, so the executor keeps the full JIT."""
    i = topo.input
    if i.stream:
        return False
    if i.generated:
        rows: int | None = generated_messages(topo)
    elif i.limit is not None:
        rows = i.limit
    else:
        rows = None
        path = topo.input_path()
        if i.format == "parquet" and path is not None and path.is_file():
            import pyarrow.parquet as pq

            with contextlib.suppress(Exception):  # Spark reads it and says what is wrong
                rows = pq.read_metadata(path).num_rows
    return rows is not None and rows <= QUICK_EXECUTOR_ROWS


def session_cpus() -> float:
    """CPUs the current Spark session's executors hold (0 without a session)."""
    return _session_cpus if _session is not None else 0.0


def stop_spark() -> None:
    """Stop the session started by ``start_spark`` (no-op if none)."""
    global _session
    with _lock:
        if _session is None:
            return
        import raydp

        try:
            raydp.stop_spark()
        finally:
            _session = None
            if _jvm_since is not None:
                remove_jni_copies(_jvm_since)


# --------------------------------------------------------------------------- dataframe


def _generator_spec(topo: Topology) -> dict[str, Any]:
    i = topo.input
    return {"format": i.format, "keys": i.keys, "skew": i.skew, "seed": i.seed,
            "shift_every": i.shift_every, "classes": i.classes}


#: Spark types of the generated streams' columns (``runtime.inputs.generators``)
_GENERATED_TYPES = {"ts": "long", "label": "long", "value": "long", "amount": "double"}


def generated_messages(topo: Topology) -> int:
    """How many messages a generated stream has (``input.limit`` caps them)."""
    i = topo.input
    return i.messages if i.limit is None else min(i.messages, i.limit)


def _generated_dataframe(spark: Any, topo: Topology, columns: list[str], lo: int = 0,
                         hi: int | None = None) -> Any:
    """The generated stream's messages ``lo`` to ``hi`` (default: all), produced
    by Spark's executor: message ``i`` is ``runtime.inputs.generators.generate(i,
    1, spec)`` whatever the partitioning; ``key`` plus ``columns``
    (``runtime.inputs.generators.GENERATED_COLUMNS``)."""
    hi = generated_messages(topo) if hi is None else hi
    spec = _generator_spec(topo)
    cols = tuple(columns)
    schema = ", ".join(["key string", *(f"{c} {_GENERATED_TYPES[c]}" for c in cols)])
    partitions = max(1, math.ceil((hi - lo) / 250_000))

    def gen_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np

        from runtime.inputs.generators import generate

        for rb in batches:
            ids = rb.column(0).to_numpy()
            if not len(ids):
                continue
            # spark.range partitions are ascending contiguous runs; split anyway
            # so any id set maps to exactly generate()'s messages
            breaks = np.flatnonzero(np.diff(ids) != 1) + 1
            for run in np.split(ids, breaks):
                got = generate(int(run[0]), len(run), spec, columns=cols, arrow_keys=True)
                # NaN in a float payload is a null (from_pandas)
                arrays = [got["key"], *(pa.array(got[c], from_pandas=True) for c in cols)]
                yield pa.RecordBatch.from_arrays(arrays, names=["key", *cols])

    return spark.range(lo, hi, 1, numPartitions=partitions).mapInArrow(gen_partition, schema)


def _read_file(spark: Any, topo: Topology,
               known: tuple[Any, bool] | None = None) -> Any:
    """``topo``'s input file as Spark reads it; ``known``: its schema
    (``known_schema``), so that Spark does not infer it."""
    fmt = topo.input.format
    path, uri = topo.input_path(), topo.input_uri()
    if uri is None or (path is not None and not path.exists()):
        raise TopologyError(f"input.path: file not found (got {topo.input.path!r})")
    _split_text_file(spark, fmt == "parquet" or path is None or not path.is_file())
    reader = spark.read if known is None else spark.read.schema(known[0])
    if fmt == "parquet":
        return reader.parquet(uri)
    if fmt == "csv":
        return reader.option("header", "true").option("inferSchema", "false").csv(uri)
    if fmt == "json":
        return reader.json(uri)
    raise TopologyError(f"input.format: not a file format (got {fmt!r})")


#: one local CSV or JSON file is read in about this many partitions of at
#: least ``TEXT_SPLIT_MIN_BYTES`` (Spark's ``spark.sql.files.minPartitionNum``
#: and ``openCostInBytes``), not in one or two: Spark parses and converts a
#: partition whole before its first row reaches the sources (the 27 MB CSV of
#: the 4M-row count: first message 3.4 s sooner; docs/benchmarks.md, "A text
#: file in 16 partitions"). Parquet (split by row groups, converted ~3x faster)
#: and directories (whose files Spark would interleave) keep Spark's defaults.
TEXT_SPLITS = 16
TEXT_SPLIT_MIN_BYTES = 1 << 20
_TEXT_SPLIT_CONF = {"spark.sql.files.minPartitionNum": str(TEXT_SPLITS),
                    "spark.sql.files.openCostInBytes": str(TEXT_SPLIT_MIN_BYTES)}


def _split_text_file(spark: Any, default: bool) -> None:
    """The session's file-split settings for the next read: ours for one text
    file, Spark's own otherwise (``default``); one given to the session
    (``--spark-conf``) is left as given. They are read when the read's job
    is planned, and a session (``runtime.compare``'s) reads one input at a time."""
    given = spark.sparkContext.getConf()
    for key, value in _TEXT_SPLIT_CONF.items():
        if given.contains(key):
            continue
        if default:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


#: a CSV header name read as Spark reads it (no quotes, escapes or blanks)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: longest header (or first data) line ``known_schema`` reads
_LINE_BYTES = 1 << 16


def known_schema(fmt: str, path: Any) -> tuple[Any, bool] | None:
    """The schema Spark would infer for one local input file, as Spark's
    ``StructType``, and whether the file has rows, read without Spark: a
    Parquet file's footer, a CSV file's header line (every column a string,
    as Spark reads CSV without type inference) and its next non-blank line.
    Given the schema, Spark's reader runs no inference job, and ``isEmpty``
    (another job) is not needed: each is 1-4 s of the run's start on 2
    cores. None (Spark infers) for a directory, JSON, a Parquet column
    pyarrow and Spark would type apart (nanosecond timestamps) or with no
    Spark type, and a CSV header that is not plain unique names."""
    if path is None or not path.is_file():
        return None
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            from pyspark.sql.pandas.types import from_arrow_schema

            meta = pq.read_metadata(path)
            schema = meta.schema.to_arrow_schema()
            if any(pa.types.is_timestamp(f.type) and f.type.unit == "ns" for f in schema):
                return None
            return from_arrow_schema(schema), meta.num_rows > 0
        if fmt == "csv":
            from pyspark.sql.types import StringType, StructField, StructType

            with open(path, "rb") as f:
                names = f.readline(_LINE_BYTES).decode("utf-8").rstrip("\r\n").split(",")
                if (not all(_PLAIN_NAME.match(n) for n in names)
                        or len({n.lower() for n in names}) < len(names)):
                    return None
                rows = any(line.strip() for line in iter(lambda: f.readline(_LINE_BYTES), b""))
            return StructType([StructField(n, StringType()) for n in names]), rows
    except Exception:  # noqa: BLE001 - Spark infers it and says what is wrong
        return None
    return None


def build_dataframe(spark: Any, topo: Topology) -> Any:
    """The topology's input as a DataFrame: ``key`` string, plus the columns
    the app needs (``label`` int64 for naive-bayes; an aggregate's value
    column, an operator's ``app.columns``, with their own types).

    A live stream's directory (``input.stream``) is read here as it is now:
    every file in it (what the stream's result must equal).

    Raises ``TopologyError`` (one line) for a missing key/label column or an
    empty input.
    """
    if topo.input.generated:
        return _generated_dataframe(spark, topo, topo.app.columns_needed())
    if topo.input.format not in FILE_FORMATS:
        raise TopologyError(f"input.format: unknown format (got {topo.input.format!r})")

    from runtime.inputs.input_check import no_rows, unreadable

    try:
        known = known_schema(topo.input.format, topo.input_path())
        raw = _read_file(spark, topo, known)
        columns = raw.columns
    except TopologyError:
        raise
    except Exception as e:  # noqa: BLE001 - Spark's AnalysisException / Py4JJavaError
        raise unreadable(topo.input.format, topo.input.path, e) from None
    if not columns and raw.isEmpty():
        raise no_rows(topo.input.path)
    df = _select_input(raw, topo)
    if topo.input.limit is not None:
        df = df.limit(topo.input.limit)
    with_labels = topo.app.kind == "naive-bayes"
    if known is not None and known[1] and not with_labels:
        return df  # it has rows, as the file says: no Spark job to find out
    if df.isEmpty():
        raise no_rows(topo.input.path, "rows with a label" if with_labels else "rows")
    return df


def _select_input(raw: Any, topo: Topology) -> Any:
    """``raw``'s columns as the workers get them (``build_dataframe``); a
    streaming DataFrame too. One-line ``TopologyError`` for a missing column."""
    from pyspark.sql import functions as F

    from runtime.inputs.input_check import no_column

    columns = raw.columns
    if "_corrupt_record" in columns and topo.input.key != "_corrupt_record":
        # Spark's PERMISSIVE reader would turn every malformed line into a row
        # with null fields: counted as null keys, silently; refuse instead
        raise TopologyError(f"input.path: malformed {topo.input.format} records in "
                            f"{topo.input.path!r} (lines that are not one JSON object each)")
    key_col = topo.input.key
    if key_col not in columns:
        raise no_column("input.key", key_col, topo.input.path, columns)
    cols = [F.col(f"`{key_col}`").cast("string").alias("key")]
    with_labels = topo.app.kind == "naive-bayes"
    if with_labels:
        label_col = topo.input.label
        if label_col not in columns:
            raise no_column("input.label", label_col, topo.input.path, columns)
        cols.append(F.col(f"`{label_col}`").cast("long").alias("label"))
    window = topo.app.window.column if topo.app.window is not None else None
    for field, col in topo.app_input_columns():
        if col not in columns:
            raise no_column(field, col, topo.input.path, columns)
        c = F.col(f"`{col}`")
        if col == window and topo.input.format == "csv":
            c = c.cast("long").alias(col)  # CSV is text: event time is a whole number there
        cols.append(c)
    df = raw.select(*cols)
    if with_labels:
        df = df.where(F.col("label").isNotNull())
    return df


def stream_dataframe(spark: Any, topo: Topology) -> tuple[Any, list[str]]:
    """A live stream (``input.stream``): Spark Structured Streaming over the
    directory ``input.path``, as ``build_dataframe``'s columns. The schema is
    the one of the files already there (a streaming file source needs one up
    front: call this once the directory holds a file); each micro-batch takes at
    most ``input.max_files_per_trigger`` new files. Files whose names start with
    ``.`` or ``_`` are ignored: write a file under such a name and rename it
    into place, so Spark never reads half of it. Also returns the files'
    columns (the schema's)."""
    from runtime.inputs.input_check import unreadable

    fmt = topo.input.format
    try:
        schema = _read_file(spark, topo).schema
    except TopologyError:
        raise
    except Exception as e:  # noqa: BLE001 - Spark's AnalysisException / Py4JJavaError
        raise unreadable(fmt, topo.input.path, e) from None
    reader = (spark.readStream.format(fmt).schema(schema)
              .option("maxFilesPerTrigger", topo.input.max_files_per_trigger))
    if fmt == "csv":
        # each file's header is checked against the stream's columns: Spark
        # would otherwise read a file whose columns come in another order by
        # position, and the wrong column would silently become the key
        reader = reader.option("header", "true").option("enforceSchema", "false")
    return _select_input(reader.load(topo.input_uri()), topo), list(schema.names)


_CSV_FILE = re.compile(r"CSV header does not conform to the schema\..*?CSV file:\s*(?P<file>\S+)",
                       re.DOTALL)


def stream_file_error(error: BaseException, columns: list[str]) -> str | None:
    """One line for a streamed CSV file Spark refused because its header
    differs from the stream's ``columns`` (``stream_dataframe``): the file
    and both column lists."""
    m = _CSV_FILE.search(str(error))
    if m is None:
        return None
    import csv

    path = m["file"].removeprefix("file://")
    try:
        with open(path, newline="") as f:
            header = ", ".join(next(csv.reader(f), []))
    except OSError:
        header = "?"
    return (f"{path} has columns [{header}], the stream has [{', '.join(columns)}]: "
            f"write it with the stream's columns in that order (nothing from it was counted)")


# --------------------------------------------------------------------------- Ray shards


@ray.remote
def _slice_block(block: pa.Table, cuts: list[int]) -> Any:
    """Zero-copy slices ``block[cuts[i]:cuts[i+1]]`` (one return per slice)."""
    parts = tuple(block.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True))
    return parts[0] if len(parts) == 1 else parts


#: Python workers started (and raydp imported in them) while Spark's job runs,
#: for the tasks that then fetch its partitions: cold, those tasks wait ~2 s
#: for processes to start (measured on 4M generated rows: fetch 3.1 -> 1.1 s)
FETCH_WARM_WORKERS = 2


@ray.remote(num_cpus=0)
def _warm_fetch_worker() -> None:
    import raydp.spark.dataset  # noqa: F401 - what the fetch tasks import


def _block_refs_in_order(ds: Any, block_rows: int) -> list[Any]:
    """The dataset's blocks, in order, each cut into pieces of <= ``block_rows``."""
    refs: list[Any] = []
    for bundle in ds.iter_internal_ref_bundles():
        for ref, meta in zip(bundle.block_refs, bundle.metadata, strict=True):
            rows = meta.num_rows
            if rows is None or rows <= block_rows:
                refs.append(ref)
                continue
            pieces = math.ceil(rows / block_rows)
            cuts = [rows * i // pieces for i in range(pieces + 1)]
            out: Any = _slice_block.options(num_returns=pieces, num_cpus=0).remote(ref, cuts)
            refs.extend([out] if pieces == 1 else out)
    return refs


def _from_spark(df: Any) -> Any:
    """``ray.data.from_spark(df)``: Spark's job, its partitions as Arrow blocks
    in Ray's object store (the fetch tasks run on warm workers), quietly."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # shards copy this context: quiet sources
    with warnings.catch_warnings():
        # raydp 1.6.5 itself uses DataFrame.sql_ctx and the deprecated
        # ``parallelism`` argument: not actionable here
        warnings.simplefilter("ignore", UserWarning)
        read_api_log = logging.getLogger("ray.data.read_api")
        level = read_api_log.level
        read_api_log.setLevel(logging.ERROR)
        try:
            for _ in range(FETCH_WARM_WORKERS):
                _warm_fetch_worker.remote()
            ds = ray.data.from_spark(df)
        finally:
            read_api_log.setLevel(level)
    return ds


def to_ray_shards(df: Any, n_sources: int, block_rows: int = SHARD_BLOCK_ROWS) -> list[Any]:
    """One Ray Dataset per source actor, covering every row exactly once.

    ``ray.data.from_spark`` moves Spark's partitions into the object store
    (Arrow blocks); they are cut, in order, into blocks of at most
    ``block_rows`` rows (zero-copy slices, in Ray tasks - nothing comes to the
    driver), and blocks are dealt round-robin to the sources (block ``j`` to
    source ``j % n_sources``). Why round-robin rather than contiguous halves:
    the sources advance through the stream together, so a time-evolving
    stream (evolving-zipf) keeps one hot set at a time instead of one per
    source. Within a shard the stream order is kept.

    Each shard is a ``MaterializedDataset``: pass it to a source actor and
    iterate there, e.g. ``shard.iter_batches(batch_size=1000,
    batch_format="pyarrow")``. A shard is empty when there are fewer blocks
    than sources (inputs under ``block_rows`` rows).
    """
    if n_sources < 1:
        raise ValueError(f"sources: must be >= 1 (got {n_sources})")
    if block_rows < 1:
        raise ValueError(f"block_rows: must be >= 1 (got {block_rows})")
    ds = _from_spark(df)
    refs = _block_refs_in_order(ds, block_rows)
    if len(refs) < n_sources:  # tiny input: some sources get an empty shard
        empty = ray.put(pa.schema(ds.schema().base_schema).empty_table())
        refs += [empty] * (n_sources - len(refs))
    return [ray.data.from_arrow_refs(refs[s::n_sources]) for s in range(n_sources)]


def arrow_batches(df: Any) -> Iterator[pa.RecordBatch]:
    """``df``'s rows as Arrow record batches, in order, as Spark produces them.

    One Spark job per partition, the next one already running
    (``PythonRDD.toLocalIteratorAndServe``, the path of
    ``DataFrame.toLocalIterator``), over Spark's own Arrow conversion
    (``Dataset.toArrowBatchRdd``): the executor converts a partition to
    Arrow and it reaches this process through Spark's socket, one partition
    at a time. Nothing waits for the whole input, and no Ray task is
    involved (``ray.data.from_spark`` needs a job over every partition and a
    Ray task per block before the first row can move: docs/benchmarks.md,
    "The input hand-over"). A failed Spark job raises here.
    """
    from pyspark.rdd import _local_iterator_from_socket
    from pyspark.serializers import NoOpSerializer
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(df.schema)
    jvm = df.sparkSession.sparkContext._jvm
    served = jvm.PythonRDD.toLocalIteratorAndServe(df._jdf.toArrowBatchRdd(), True)
    for payload in _local_iterator_from_socket(served, NoOpSerializer()):
        yield pa.ipc.read_record_batch(pa.py_buffer(payload), schema)


def _compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A copy of a sliced batch holding only its rows (pickling a slice, as
    ``ray.put`` does, would carry the whole parent's buffers)."""
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns],
                                      schema=batch.schema)


class Blocks:
    """Record batches in, blocks of exactly ``block_rows`` rows out (the last
    one shorter), in stream order: block ``j`` of the stream, as the
    simulator cuts it (``runtime.sim.cores``)."""

    def __init__(self, block_rows: int) -> None:
        self.block_rows = block_rows
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0

    def add(self, batch: pa.RecordBatch) -> Iterator[pa.Table]:
        while batch.num_rows:
            take = min(batch.num_rows, self.block_rows - self._rows)
            if take < batch.num_rows:
                head, batch = _compact(batch.slice(0, take)), _compact(batch.slice(take))
            else:
                head, batch = batch, batch.slice(0, 0)
            self._pending.append(head)
            self._rows += take
            if self._rows == self.block_rows:
                yield self._take()

    def rest(self) -> Iterator[pa.Table]:
        if self._rows:
            yield self._take()

    def _take(self) -> pa.Table:
        table = pa.Table.from_batches(self._pending)
        self._pending, self._rows = [], 0
        return table


class FeedLoad:
    """The input, handed to the sources while Spark still produces it.

    A thread of the driver reads Spark's Arrow batches partition by
    partition (``arrow_batches``), cuts them into blocks of ``block_rows``
    rows and puts each block in Ray's object store and in a ``ShardFeed``
    (``actors.shard_feed``), dealt round-robin in stream order (block ``j``
    to source ``j % n_sources``). The sources start on the first block.

    ``frames``: the DataFrames that make up the stream, in order: a file's
    one DataFrame, or a generated stream's chunks (``input.chunk_messages``,
    one Spark job each; the whole stream when unset). ``messages``: the
    stream's length when known beforehand (a generated stream), else None
    until the load is over (``rows``).

    ``start()`` returns once the first block is in (its error raised);
    ``join()`` waits for the rest (and raises a later error, which the
    sources raise too); ``stop()`` loads nothing further. ``distinct``:
    with ``count_distinct``, the input's distinct keys (nulls one key, as
    Spark's ``distinct().count()``), counted from the batches Spark handed over.
    """

    def __init__(self, frames: Iterator[Any], n_sources: int, *, messages: int | None,
                 chunks: int = 1, chunk: int | None = None,
                 block_rows: int = SHARD_BLOCK_ROWS, count_distinct: bool = False) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from actors.shard_feed import FedShard, ShardFeed

        self.frames, self.n_sources, self.messages = frames, n_sources, messages
        self.chunks, self.chunk, self.block_rows = chunks, chunk, block_rows
        # on the driver's node: the feed lives and dies with the driver that
        # fills it, never with another machine (num_cpus=0 lets Ray put it anywhere)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                              soft=False)
        self.feed = ShardFeed.options(  # type: ignore[attr-defined]
            scheduling_strategy=here).remote(n_sources)
        self.shards = [FedShard(self.feed, s) for s in range(n_sources)]
        self.loaded = 0  # chunks in the feed
        self.rows = 0  # rows in the feed
        self.per_source = [0] * n_sources  # rows dealt to each source
        self.first_s: float | None = None  # the first block in, from start()
        self.all_s: float | None = None  # the last one in
        #: the input's distinct keys, counted from their hashes as the workers count theirs
        self._keys: DistinctKeys | None = DistinctKeys() if count_distinct else None
        self.distinct: int | None = None
        self.error: BaseException | None = None
        # the driver owns every block (ray.put) and keeps a reference to each
        # until the run ends: the feed and the sources only borrow them, and a
        # borrower lost with its node must not let Ray free a block a
        # restarted source still has to read (ReferenceCountingAssertionError)
        self._held: list[Any] = []
        self._stopping = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._load, name="feed-load", daemon=True)

    @property
    def done(self) -> bool:
        return self.all_s is not None

    def start(self) -> None:
        self._t0 = time.time()
        self._thread.start()
        self._first.wait()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stopping.set()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _deal(self, blocks: Iterator[pa.Table]) -> None:
        per_source: list[list[Any]] = [[] for _ in range(self.n_sources)]
        rows = 0
        for block in blocks:
            s = (self.rows + rows) // self.block_rows % self.n_sources
            ref = ray.put(block)
            self._held.append(ref)
            per_source[s].append(ref)
            self.per_source[s] += block.num_rows
            rows += block.num_rows
        if rows:
            ray.get(self.feed.add.remote(per_source, rows))
            self.rows += rows
            if self.first_s is None:
                self.first_s = time.time() - self._t0
                self._first.set()

    def _load(self) -> None:
        blocks = Blocks(self.block_rows)
        try:
            for df in self.frames:
                for batch in arrow_batches(df):
                    if self._stopping.is_set():
                        return
                    if self._keys is not None:
                        self._keys.add(hash_arrow(batch.column("key")))
                    self._deal(blocks.add(batch))
                self.loaded += 1
            self._deal(blocks.rest())
            if self._keys is not None:
                self.distinct = len(self._keys)
            ray.get(self.feed.finish.remote())
            self.all_s = time.time() - self._t0
        except BaseException as e:  # noqa: BLE001 - handed to join() and to the sources
            self.error = e
            try:
                self.feed.fail.remote(f"input: loading part {self.loaded + 1} of "
                                      f"{self.chunks} failed: {e}")
            except Exception:  # noqa: BLE001 - the feed is gone with the run
                pass
        finally:
            self._first.set()


def feed_load(spark: Any, topo: Topology, df: Any = None, *,
              count_distinct: bool = False) -> FeedLoad:
    """The topology's input as a ``FeedLoad`` (not started): a generated
    stream in chunks of ``input.chunk_messages`` (whole when unset), else
    ``df`` (default: ``build_dataframe``, whose one-line errors come from here)."""
    block_rows = shard_block_rows(topo)
    chunked = topo.input.generated and topo.input.chunk_messages is not None
    if not chunked and (df is not None or not topo.input.generated):
        frame = df if df is not None else build_dataframe(spark, topo)
        return FeedLoad(iter([frame]), topo.sources, messages=None, block_rows=block_rows,
                        count_distinct=count_distinct)
    messages = generated_messages(topo)
    chunk = min(topo.input.chunk_messages or messages, messages)
    columns = topo.app.columns_needed()
    frames = (_generated_dataframe(spark, topo, columns, lo, min(messages, lo + chunk))
              for lo in range(0, messages, chunk))
    return FeedLoad(frames, topo.sources, messages=messages, chunks=math.ceil(messages / chunk),
                    chunk=chunk, block_rows=block_rows, count_distinct=count_distinct)


# --------------------------------------------------------------------------- reference


def _collect_arrow(df: Any, schema: pa.Schema) -> pa.Table:
    """Collect a (small) DataFrame to the driver as Arrow."""
    batches = df._collect_as_arrow()
    if not batches:
        return schema.empty_table()
    return pa.Table.from_batches(batches).select(schema.names).cast(schema)


def reference_result(df: Any, app: Any, top_k: int = 100) -> pa.Table:
    """Spark's own answer for ``app`` (the topology's ``app`` section as a
    mapping, or a kind with ``top_k``), in the operators' schema and order
    (``runtime.operators.spark_reference``): what a run's result.parquet must
    equal. A user's operator has none."""
    from runtime.operators import spark_reference

    spec = {"kind": app, "top_k": top_k} if isinstance(app, str) else dict(app)
    return spark_reference(df, spec)


__all__ = [
    "JAVA17_OPTIONS",
    "FeedLoad",
    "arrow_batches",
    "build_dataframe",
    "feed_load",
    "reference_result",
    "session_cpus",
    "start_spark",
    "stop_spark",
    "stream_dataframe",
    "to_ray_shards",
]
