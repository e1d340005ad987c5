"""Class-data sharing archives for Spark's driver and executor JVMs.

A cold run spends most of its first 20 s in JVMs starting on 2 cores: Spark's
driver loads, verifies and links ~20,000 classes from jars, and the executor
does the same before its first block. An AppCDS archive (the JVM's own
class-data sharing, Java 13+) holds those classes already parsed and
verified: a JVM given ``-XX:SharedArchiveFile`` maps it instead. Measured on
this 2-core machine, a 20,000-row run's first message came 2.4-3.4 s sooner
with both archives (docs/benchmarks.md, "JVM class archives").

    python -m actors.jvm_archive      # make setup runs it (~60 s)

builds them: one small in-process run of a generated input and of a Parquet
and a CSV file, with every JVM told ``-XX:ArchiveClassesAtExit``. The
driver's archive is written when its JVM exits (Python closes its stdin);
the executor, whose JVM Ray would kill, is made to exit normally by one Spark
task calling ``System.exit``. Files are written under temporary names and
renamed when whole; the archives live per Python environment in
``~/.cache/hetero-stream/jvm-<hash of sys.prefix>/``.

``java_options(role)`` is what ``spark_input`` adds to that JVM's options:
nothing when there is no archive (or ``HS_JVM_ARCHIVES=off``), so a run never
depends on one. The JVM checks the archive itself (its version, every jar's
size and time): a stale one is ignored with a warning in the run's
``engine.log``, and the run is as fast as without. RayDP's Java agent is on
every JVM's command line, hence ``AllowArchivingWithJavaAgent``; the agent
only redirects the JVM's output and sets properties (it transforms no class),
so archived classes are what it would have loaded. RayDP's master has no
archive: Ray kills its JVM, so it never exits normally.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: the JVMs that get an archive, by the Spark setting of their Java options
ROLES = {"driver": "spark.driver.extraJavaOptions",
         "executor": "spark.executor.extraJavaOptions"}
#: RayDP's Java agent is on every command line: archiving (and then using an
#: archive) with an agent is a diagnostic option
_AGENT = "-XX:+UnlockDiagnosticVMOptions -XX:+AllowArchivingWithJavaAgent"
#: while building: each role's JVM writes its archive here when it exits
_dump_dir: Path | None = None


def archive_dir() -> Path:
    """This Python environment's archives (``HS_JVM_ARCHIVES``: another directory)."""
    given = os.environ.get("HS_JVM_ARCHIVES", "")
    if given and given != "off":
        return Path(given)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    env = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
    return base / "hetero-stream" / f"jvm-{env}"


def java_options(role: str) -> str:
    """The archive options of Spark's ``role`` JVM (``ROLES``): use its
    archive if there is one, write it at exit while building, else ''."""
    if _dump_dir is not None:
        return f"{_AGENT} -XX:ArchiveClassesAtExit={_dump_dir / f'{role}.jsa'}"
    if os.environ.get("HS_JVM_ARCHIVES") == "off":
        return ""
    path = archive_dir() / f"{role}.jsa"
    return f"{_AGENT} -XX:SharedArchiveFile={path}" if path.is_file() else ""


def _training_topologies(tmp: Path) -> list[Any]:
    """Small runs that load what real runs load: a generated stream, a
    Parquet file and a CSV file (Spark's readers), word count and records."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from runtime.topology import load_topology

    rows = pa.table({"ts": list(range(20_000)),
                     "key": [f"k{i % 997}" for i in range(20_000)]})
    pq.write_table(rows, tmp / "train.parquet")
    pacsv.write_csv(rows, tmp / "train.csv")
    common = {"sources": 2, "workers": {"count": 2, "service_us": 0},
              "app": {"kind": "wordcount"}}
    return [load_topology({"name": name, "input": inp, **common}) for name, inp in (
        ("jvm-archive-generated", {"format": "zipf", "messages": 20_000, "keys": 500}),
        ("jvm-archive-parquet", {"format": "parquet", "path": str(tmp / "train.parquet"),
                                 "key": "key"}),
        ("jvm-archive-csv", {"format": "csv", "path": str(tmp / "train.csv"), "key": "key"}))]


def _executor_pids(dump: Path) -> list[int]:
    """The executor JVMs writing their archive into ``dump`` at exit."""
    import psutil

    flag = f"-XX:ArchiveClassesAtExit={dump / 'executor.jsa'}"
    pids = []
    for p in psutil.process_iter(["cmdline"]):
        if flag in (p.info["cmdline"] or []):
            pids.append(p.pid)
    return pids


def _wait_gone(pids: list[int], timeout_s: float) -> bool:
    import psutil

    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                 timeout=timeout_s)
    return not alive


def build(log: Any = print) -> dict[str, int]:
    """Build both archives; returns each written one's size in bytes."""
    global _dump_dir
    from pyspark import SparkContext

    from actors.engine import RayEngine, SparkSizing

    target = archive_dir()
    target.mkdir(parents=True, exist_ok=True)
    written: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="jvm-archive-", dir=target) as tmp_s:
        tmp = Path(tmp_s)
        _dump_dir = tmp
        try:
            topos = _training_topologies(tmp)
            # one task failure ends the exit job (no retry on a new executor)
            sizing = SparkSizing(conf=(("spark.task.maxFailures", "1"),))
            log_file = target / "build.log"  # kept: the first line names it
            log_file.unlink(missing_ok=True)
            with RayEngine("jvm-archive", spark=sizing, reuse_actors=False,
                           log_file=log_file) as engine:
                for topo in topos:
                    engine.run(topo, tmp / topo.name, plot=False, log=lambda m: None)
                executors = _executor_pids(tmp)
                try:  # the executor's JVM exits normally: it writes its archive
                    engine.spark.range(1, numPartitions=1).selectExpr(
                        "reflect('java.lang.System', 'exit', 0)").collect()
                except Exception:  # noqa: BLE001, S110 - its task fails, as it must
                    pass
                if _wait_gone(executors, 120) and (tmp / "executor.jsa").is_file():
                    written["executor"] = _keep(tmp / "executor.jsa", target)
            gateway = SparkContext._gateway
            if gateway is not None:  # its JVM exits on EOF, and writes its archive
                proc = gateway.proc
                gateway.shutdown()
                proc.stdin.close()
                proc.wait(timeout=180)
                SparkContext._gateway = SparkContext._jvm = None
                if (tmp / "driver.jsa").is_file():
                    written["driver"] = _keep(tmp / "driver.jsa", target)
        finally:
            _dump_dir = None
    for role in ROLES:
        if role not in written:
            log(f"warning: no {role} archive was written; its JVM starts as before")
    return written


def _keep(path: Path, target: Path) -> int:
    """``path`` moved into ``target`` whole (a rename); its size."""
    size = path.stat().st_size
    path.replace(target / path.name)
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m actors.jvm_archive",
        description="Build the class-data sharing archives of Spark's driver and "
                    "executor JVMs (make setup runs it; a run uses them if present).")
    parser.parse_args(argv)
    print(f"JVM class archives: building in {archive_dir()} (a small Spark run, ~60 s)",
          flush=True)
    t0 = time.time()
    # (this module runs as __main__: the state spark_input reads is the imported one's)
    from actors import jvm_archive

    try:
        written = jvm_archive.build()
    except Exception as e:  # noqa: BLE001 - an optimization: set-up goes on without it
        print(f"warning: JVM class archives not built ({type(e).__name__}: {e}); "
              f"runs start as before", file=sys.stderr)
        return 0
    sizes = ", ".join(f"{r} {b / 1e6:.0f} MB" for r, b in sorted(written.items()))
    print(f"JVM class archives: {sizes or 'none'} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
