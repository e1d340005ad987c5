"""Side by side with Apache Flink: the same jobs, the same data, the same cluster.

    python scripts/vs_flink.py [--quick] [--out DIR] [--workers 4] [--slow 2]
    python scripts/vs_flink.py --install-only     # build Flink's venv, nothing else

1. **count** - no emulated work, homogeneous: the same keyed count over the
   same CSV rows. End to end as a user waits for it (ours: ``python -m
   runtime.run``, Ray and Spark start included; Flink: its Python client
   submitting to the running cluster, whose start-up is shown apart), and each
   engine's own processing time. Ours also as a warm session's second run
   (``acg (warm)``: Ray, Spark and the actors up, as Flink's cluster is).
2. **keyed** - keyed work on a heterogeneous cluster: every record costs
   ``service_us`` of emulated work on both sides (the project's
   ``ServiceEmulator``: ours in the workers, Flink's in a Python
   ``KeyedProcessFunction``); one TaskManager per worker, the slow ones
   throttled by the project's own duty-cycle throttler applied to the
   TaskManager's JVM, in which PyFlink runs the Python functions (thread
   mode, its fastest). Flink's ``keyBy``
   against ours kg, cg, acg and wrr (told the capacities: the ceiling).
3. **stateless** - the same work behind Flink's ``rebalance``, FLIP-339's
   adaptive partitioner off and on, against ours acg and wrr (our keyed count
   splits keys under both, so they are job 2's runs).

Flink lives in its own virtual environment (PyFlink pins pyarrow, pandas and
protobuf versions that clash with ours), built on first use under
``~/.cache/hetero-stream/`` (``$HETERO_FLINK_VENV`` overrides), and runs as a
standalone cluster on loopback (one JobManager, one TaskManager of one slot
per worker) started from the pip-installed distribution's ``bin/`` scripts:
one for the count job and then the keyed job (the count job runs no Python
function in a TaskManager), a fresh one for each stateless job.
Every result is checked against the exact answer (exit 1 if either engine is
wrong); every process started here is stopped at the end, also on Ctrl-C.
``--quick`` runs a short version of all three jobs (a few minutes);
``--install-only`` builds Flink's venv and exits (CI does it in its set-up,
beside installing Prometheus, so that the tests' time is the tests').
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import yaml  # noqa: E402

from actors.throttle import DutyCycleThrottler  # noqa: E402

FLINK_VERSION = "2.3.0"
FLINK_JOBS = ROOT / "scripts" / "flink_jobs.py"
PIP_TIMEOUT_S = 1200


class HarnessError(RuntimeError):
    """A one-line failure of the harness (Flink's set-up, a cluster, a job, a wrong answer)."""


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# ----------------------------------------------------------------------------- Flink's venv
def flink_venv_dir() -> Path:
    if os.environ.get("HETERO_FLINK_VENV"):
        return Path(os.environ["HETERO_FLINK_VENV"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hetero-stream" / f"flink-{FLINK_VERSION}-venv"


def ensure_flink(log: Callable[[str], None] = say) -> Path:
    """Flink's own venv (``apache-flink==FLINK_VERSION``), built once; its python.

    Built in a side directory and renamed when complete, under a lock, so an
    interrupted or concurrent build never leaves a half-built venv in use. pip
    gets a network timeout and the whole install ``PIP_TIMEOUT_S``: an
    unreachable registry fails with one line, it does not hang."""
    venv = flink_venv_dir()
    py = venv / "bin" / "python"
    ok = venv / ".installed"
    if ok.exists() and py.exists():
        return py
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ok.exists() and py.exists():
            return py
        tmp = venv.with_name(venv.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        pip_log = venv.parent / f"{venv.name}.pip.log"
        log(f"flink: building its venv in {venv} (pip install apache-flink=={FLINK_VERSION}, "
            f"once; pip's output: {pip_log})")
        t0 = time.time()
        try:
            subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True,
                           capture_output=True, timeout=300)
            with open(pip_log, "w") as f:
                r = subprocess.run(
                    [str(tmp / "bin" / "python"), "-m", "pip", "install", "--timeout", "30",
                     "--retries", "2", "--disable-pip-version-check",
                     f"apache-flink=={FLINK_VERSION}"],
                    stdout=f, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise HarnessError(f"flink: installing apache-flink=={FLINK_VERSION} took over "
                               f"{e.timeout:.0f} s (package registry unreachable?); "
                               f"see {pip_log}") from None
        except subprocess.CalledProcessError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise HarnessError(f"flink: python -m venv failed: "
                               f"{e.stderr.decode(errors='replace').strip()[-300:]}") from None
        if r.returncode != 0:
            lines = [ln for ln in pip_log.read_text(errors="replace").splitlines() if ln.strip()]
            shutil.rmtree(tmp, ignore_errors=True)
            raise HarnessError(f"flink: pip install apache-flink=={FLINK_VERSION} failed "
                               f"(package registry unreachable?): "
                               f"{lines[-1] if lines else '?'} (see {pip_log})")
        shutil.rmtree(venv, ignore_errors=True)
        tmp.rename(venv)
        ok.write_text(f"apache-flink=={FLINK_VERSION}\n")
        log(f"flink: venv ready in {time.time() - t0:.0f} s")
    return py


def flink_home(py: Path) -> Path:
    found = sorted(py.parent.parent.glob("lib/python3*/site-packages/pyflink"))
    if not found or not (found[0] / "bin" / "taskmanager.sh").exists():
        raise HarnessError(f"flink: no pyflink distribution (bin/taskmanager.sh) in {py.parent.parent}")
    return found[0]


# ----------------------------------------------------------------------------- the cluster
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pid_key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return None


@dataclass
class FlinkCluster:
    """A standalone Flink cluster on loopback: one JobManager, ``n`` TaskManagers
    (one slot each), every one a process group of its own, started in the
    foreground from the distribution's ``bin/`` scripts. ``stop()`` ends them
    all (SIGCONT first: a throttled process must not stay stopped)."""

    py: Path
    n: int
    workdir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    tms: list[subprocess.Popen] = field(default_factory=list)
    seen: set[tuple[int, float]] = field(default_factory=set)
    rest_port: int = 0
    startup_s: float = 0.0

    def _conf(self) -> Path:
        home = flink_home(self.py)
        default = yaml.safe_load((home / "conf" / "config.yaml").read_text())
        java_opts = default["env"]["java"]["opts"]["all"]
        self.rest_port = _free_port()
        conf = {
            "env.java.opts.all": java_opts,
            "jobmanager.bind-host": "127.0.0.1",
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.rpc.port": _free_port(),
            "jobmanager.memory.process.size": "1024m",
            "jobmanager.execution.failover-strategy": "region",
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": self.rest_port,
            "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.host": "127.0.0.1",
            "taskmanager.numberOfTaskSlots": 1,
            "taskmanager.memory.process.size": "1280m",
            "parallelism.default": self.n,
            "python.executable": str(self.py),
            "python.client.executable": str(self.py),
            "blob.server.port": "0",
            "restart-strategy.type": "none",
            # blob stores and spill files: under the work dir, removed by stop().
            # Flink's default (/tmp/tm_<resource-id>) outlives a killed
            # TaskManager and grew by every job's blobs, run after run
            "io.tmp.dirs": str(self.workdir / "tmp"),
        }
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        d = self.workdir / "conf"
        d.mkdir(parents=True, exist_ok=True)
        for f in ("log4j-console.properties", "log4j.properties", "logback-console.xml"):
            shutil.copy(home / "conf" / f, d / f)
        (d / "config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
        return d

    def rest(self, path: str, timeout: float = 5.0) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}",
                                    timeout=timeout) as r:
            return json.loads(r.read())

    def env(self) -> dict[str, str]:
        (self.workdir / "log").mkdir(parents=True, exist_ok=True)
        return dict(os.environ, FLINK_CONF_DIR=str(self.workdir / "conf"),
                    FLINK_LOG_DIR=str(self.workdir / "log"),
                    # its scripts' pid files (default /tmp/flink-<user>-<service>.pid,
                    # left behind: the processes are stopped by signal, not the scripts)
                    FLINK_PID_DIR=str(self.workdir / "pid"),
                    # the Python functions import the project's ServiceEmulator /
                    # StoppedClock; in thread mode they run in the TaskManager's JVM
                    # (embedded CPython, pemja), which finds Flink's venv only here
                    PYTHONPATH=os.pathsep.join([str(ROOT), str(flink_home(self.py).parent)]))

    def running(self) -> bool:
        """Whether a job is running on this cluster (REST)."""
        with contextlib.suppress(OSError, ValueError):
            return any(j["state"] == "RUNNING" for j in self.rest("/jobs/overview")["jobs"])
        return False

    def _spawn(self, script: str, name: str, *args: str) -> subprocess.Popen:
        home = flink_home(self.py)
        env = self.env()
        out = open(self.workdir / "log" / f"{name}.out", "w")
        p = subprocess.Popen(["bash", str(home / "bin" / script), "start-foreground", *args],
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True, cwd=self.workdir)
        out.close()
        self.procs.append(p)
        return p

    def _wait(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        end = time.time() + timeout
        while time.time() < end:
            for p in self.procs:
                if p.poll() is not None:
                    raise HarnessError(f"flink: a {what} process exited with code {p.returncode} "
                                       f"while starting; see {self.workdir / 'log'}")
            with contextlib.suppress(OSError, ValueError):
                if ok():
                    return
            time.sleep(0.25)
        raise HarnessError(f"flink: {what} not up after {timeout:.0f} s; see {self.workdir / 'log'}")

    def start(self) -> FlinkCluster:
        """Start; ports are picked free but may be taken before Flink binds them
        (a shared box): a bind failure is retried with fresh ports, twice."""
        for attempt in range(3):
            try:
                return self._start()
            except HarnessError:
                logs = self.workdir / "log"
                bound = any("BindException" in f.read_text(errors="replace")
                            for f in logs.glob("*.out")) if logs.exists() else False
                if not bound or attempt == 2:
                    raise
                say("flink: a port was taken before Flink bound it; starting again")
                self.stop()
                self.procs, self.tms = [], []
                for f in logs.glob("*"):
                    f.unlink()
        raise AssertionError("unreachable")

    def _start(self) -> FlinkCluster:
        t0 = time.time()
        self._conf()
        self._spawn("jobmanager.sh", "jobmanager")
        self._wait("JobManager", lambda: "flink-version" in self.rest("/overview"), 120)
        for i in range(self.n):
            self.tms.append(self._spawn("taskmanager.sh", f"taskmanager-{i}",
                                        f"-Dtaskmanager.resource-id=tm-{i}"))
        self._wait("TaskManager", lambda: len(self.rest("/taskmanagers")["taskmanagers"])
                   == self.n, 180)
        self.startup_s = time.time() - t0
        self.tree()
        return self

    def tm_tree(self, i: int) -> list[int]:
        """TaskManager ``i``'s PIDs: its JVM and every process under it (Python
        workers in process mode)."""
        try:
            root = psutil.Process(self.tms[i].pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        for p in procs:
            k = _pid_key(p)
            if k:
                self.seen.add(k)
        return [p.pid for p in procs]

    def tree(self) -> list[int]:
        pids: list[int] = []
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(p.pid)
                for q in (root, *root.children(recursive=True)):
                    k = _pid_key(q)
                    if k:
                        self.seen.add(k)
                        pids.append(q.pid)
        return pids

    def alive(self) -> list[int]:
        """Every process this cluster ever had that still runs (PID and start time match)."""
        out = []
        for pid, created in self.seen:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
        return out

    def stop(self) -> None:
        self.tree()
        groups = {p.pid for p in self.procs}
        for sig in (signal.SIGCONT, signal.SIGTERM):
            for g in groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(g, sig)
            for pid in self.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        end = time.time() + 15
        while self.alive() and time.time() < end:
            time.sleep(0.2)
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, signal.SIGKILL)
        for pid in self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        shutil.rmtree(self.workdir / "tmp", ignore_errors=True)

    def __enter__(self) -> FlinkCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def throttled(cluster: FlinkCluster, capacities: list[float]) -> Iterator[DutyCycleThrottler]:
    """The project's duty-cycle throttler on every TaskManager below full speed:
    its JVM, in which the Python functions run (thread mode), and any process
    under it (polled). A TaskManager is throttled once the job runs, as our
    workers are throttled once their actors are up: its start-up at full speed."""
    thr = DutyCycleThrottler()
    slow = [(i, c) for i, c in enumerate(capacities) if c < 1.0]
    known: set[int] = set()
    halt = threading.Event()

    def poll() -> None:
        while True:
            for i, c in slow if known or cluster.running() else ():
                for pid in cluster.tm_tree(i):
                    if pid not in known:
                        known.add(pid)
                        with contextlib.suppress(psutil.Error, ValueError):
                            thr.set_capacity(pid, c)
            if halt.wait(0.2):
                return

    poll_thread = threading.Thread(target=poll, name="tm-tree", daemon=True)
    poll_thread.start()
    thr.start()
    try:
        yield thr
    finally:
        halt.set()
        poll_thread.join(timeout=5)
        thr.stop()


# ----------------------------------------------------------------------------- data and answers
def make_data(path: Path, rows: int, keys: int, skew: float, seed: int) -> dict[str, int]:
    """``rows`` Zipf(``skew``) keys over ``keys`` distinct ones, one per line under
    a ``key`` header; returns the exact count per key."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, keys + 1, dtype=np.float64) ** skew
    ids = rng.permutation(keys)[rng.choice(keys, size=rows, p=p / p.sum())]
    names = np.char.add("k", ids.astype(str))
    with open(path, "w") as f:  # plain lines: Flink reads them as text, Spark as CSV
        f.write("key\n")
        f.write("\n".join(names.tolist()))
        f.write("\n")
    u, c = np.unique(names, return_counts=True)
    return dict(zip(u.tolist(), c.tolist(), strict=True))


def check(engine: str, got: dict[str, int], exact: dict[str, int]) -> None:
    if got == exact:
        return
    missing = len(exact.keys() - got.keys())
    extra = len(got.keys() - exact.keys())
    wrong = sum(1 for k in exact.keys() & got.keys() if got[k] != exact[k])
    raise HarnessError(f"{engine}: WRONG result: {missing} keys missing, {extra} extra, "
                       f"{wrong} with a wrong count ({sum(got.values()):,} records counted, "
                       f"{sum(exact.values()):,} exact)")


def read_ours(run_dir: Path) -> dict[str, int]:
    t = pq.read_table(run_dir / "result.parquet").to_pydict()
    return dict(zip(t["key"], (int(v) for v in t["count"]), strict=True))


def read_csv_counts(path: Path) -> dict[str, int]:
    with open(path, newline="") as f:
        r = csv.reader(f)
        next(r)
        return {k: int(v) for k, v in r}


# ----------------------------------------------------------------------------- our runtime
def topology(name: str, data: Path, capacities: list[float], service_us: float,
             scheme: str) -> dict[str, Any]:
    return {
        "name": name,
        "input": {"format": "csv", "path": str(data), "key": "key"},
        "sources": 2,
        "workers": {"count": len(capacities), "capacity": capacities,
                    "service_us": service_us, "throttle": "duty-cycle"},
        "grouping": {"scheme": scheme},
        "app": {"kind": "wordcount", "aggregate_every_s": 1.0},
        "run": {"batch": 1000, "seed": 0},
    }


def run_ours(argv: list[str], log_file: Path, timeout: float) -> float:
    """One of our entry points as a user runs it; its wall time. Ray's own
    start-up timing out (a loaded shared box) is retried once, said so."""
    try:
        return _run_ours(argv, log_file, timeout)
    except HarnessError as e:
        if "timed out during startup" not in str(e):
            raise
        say(f"ours: Ray's start-up timed out (load {loadavg()}); once more")
        shutil.rmtree(Path(argv[argv.index("--out") + 1]), ignore_errors=True)
        return _run_ours(argv, log_file, timeout)


def _run_ours(argv: list[str], log_file: Path, timeout: float) -> float:
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
               # Ray starts its actors at nice 15; Flink's processes run at this
               # script's: the same priority for both engines
               RAY_worker_niceness=os.environ.get("RAY_worker_niceness", "0"))
    t0 = time.time()
    with open(log_file, "w") as f:
        p = subprocess.Popen([sys.executable, *argv], stdout=f, stderr=subprocess.STDOUT,
                             cwd=ROOT, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            raise
    if rc != 0:
        lines = [ln for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
        raise HarnessError(f"ours: python {' '.join(argv[:2])} exited {rc}: "
                           f"{lines[-1] if lines else '?'} (see {log_file})")
    return time.time() - t0


# ----------------------------------------------------------------------------- Flink jobs
def run_flink(cluster: FlinkCluster, job: str, data: Path, out: Path, *, service_us: float = 0.0,
              adaptive: bool = False, bundle: int = 500, timeout: float = 1800) -> dict[str, Any]:
    """``scripts/flink_jobs.py JOB`` in Flink's venv against ``cluster``: the
    client's wall time, the job's and its longest vertex's durations (REST)."""
    result = out.with_suffix(".csv")
    # Flink's own CLI, as a user submits a Python job to a session cluster
    argv = ["bash", str(flink_home(cluster.py) / "bin" / "flink"), "run", "-t", "remote",
            "-pyclientexec", str(cluster.py), "-pyexec", str(cluster.py),
            "-py", str(FLINK_JOBS), job, "--rest", str(cluster.rest_port),
            "--data", str(data), "--parallelism", str(cluster.n), "--out", str(result),
            "--service-us", str(service_us), "--bundle", str(bundle)]
    if adaptive:
        argv.append("--adaptive")
    spans = out.with_suffix(".spans")
    shutil.rmtree(spans, ignore_errors=True)
    spans.mkdir(parents=True)
    argv += ["--span-dir", str(spans)]
    before = {j["jid"] for j in cluster.rest("/jobs/overview")["jobs"]}
    log_file = out.with_suffix(".log")
    t0 = time.time()
    with open(log_file, "w") as f:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=f, text=True,
                             env=cluster.env(), start_new_session=True)
        try:
            stdout, _ = p.communicate(timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise
    wall = time.time() - t0
    if p.returncode != 0:
        lines = [ln for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
        err = next((ln for ln in reversed(lines) if "Error" in ln or "Exception" in ln),
                   lines[-1] if lines else "?")
        raise HarnessError(f"flink: job {job} failed (exit {p.returncode}): {err.strip()[:300]} "
                           f"(see {log_file})")
    jobs = [j for j in cluster.rest("/jobs/overview")["jobs"] if j["jid"] not in before]
    if len(jobs) != 1 or jobs[0]["state"] != "FINISHED":
        raise HarnessError(f"flink: job {job}: expected one FINISHED job, REST lists "
                           f"{[(j['name'], j['state']) for j in jobs]}")
    detail = cluster.rest(f"/jobs/{jobs[0]['jid']}")
    (out.with_suffix(".job.json")).write_text(json.dumps(detail, indent=1))
    vertices = {v["name"]: v["duration"] / 1e3 for v in detail["vertices"]}
    marks = [json.loads(f.read_text()) for f in spans.glob("*.json")]
    served = sum(m["n"] for m in marks)
    span = (max(m["last"] for m in marks) - min(m["first"] for m in marks)) if marks else None
    counted = sum(read_csv_counts(result).values())
    # the serving processes write their spans every 0.2 s and at close, which a
    # torn-down Python function may not reach: up to 0.2 s of records unreported
    if service_us > 0 and not counted * 0.9 <= served <= counted:
        raise HarnessError(f"flink: job {job}: the serving functions report {served:,} records "
                           f"served, the result counts {counted:,}")
    # each serving process's own rate while it served: a slow TaskManager's
    # should be its capacity's share of a fast one's (the throttle composes)
    rates = sorted(m["n"] / (m["last"] - m["first"]) for m in marks
                   if m["n"] > 1 and m["last"] > m["first"])
    return {"wall_s": wall, "job_s": detail["duration"] / 1e3, "span_s": span, "rates": rates,
            "vertex_s": max(vertices.values()), "vertices": vertices,
            "result": read_csv_counts(result)}


def _rates(rates: list[float]) -> str:
    return " ".join(f"{x:,.0f}" for x in rates) or "?"


# ----------------------------------------------------------------------------- the table
@dataclass
class Row:
    job: str
    engine: str
    scheme: str
    records: int
    wall_s: float | None  # end to end, as a user waits (job 1)
    engine_s: float  # the engine's own processing time
    capacity: float | None  # the cluster's msgs/s at full speed (jobs 2-3)
    load: str
    exact: bool = True
    note: str = ""

    @property
    def rate(self) -> float:
        return self.records / self.engine_s

    @property
    def efficiency(self) -> float | None:
        return self.rate / self.capacity if self.capacity else None


def table(rows: list[Row]) -> str:
    lines = ["| job | engine | scheme | records | end to end s | engine s | msgs/s | "
             "capacity efficiency | exact | load avg (1/5/15 min) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eff = f"{r.efficiency:.3f}" if r.efficiency is not None else "-"
        wall = f"{r.wall_s:.1f}" if r.wall_s is not None else "-"
        lines.append(f"| {r.job} | {r.engine} | {r.scheme} | {r.records:,} | {wall} | "
                     f"{r.engine_s:.1f} | {r.rate:,.0f} | {eff} | "
                     f"{'yes' if r.exact else 'NO'} | {r.load} | {r.note} |")
    return "\n".join(lines)


def goals(rows: list[Row]) -> list[str]:
    def get(job: str, engine: str, scheme: str) -> Row | None:
        return next((r for r in rows if (r.job, r.engine, r.scheme) == (job, engine, scheme)),
                    None)

    out = []
    acg, wrr = get("keyed", "ours", "acg"), get("keyed", "ours", "wrr")
    keyby = get("keyed", "flink", "keyBy")
    if acg and keyby:
        out.append(f"keyed: ours acg / Flink keyBy = {acg.rate / keyby.rate:.2f}x (goal >= 2)")
    if acg and wrr and acg.efficiency is not None and wrr.efficiency is not None:
        out.append(f"keyed: acg efficiency {acg.efficiency:.3f} vs wrr {wrr.efficiency:.3f} "
                   f"(goal: within 0.05)")
    adaptive = get("stateless", "flink", "rebalance+adaptive")
    sacg = get("stateless", "ours", "acg")
    if sacg and adaptive:
        out.append(f"stateless: ours acg / Flink adaptive rebalance = "
                   f"{sacg.rate / adaptive.rate:.2f}x (goal >= 1)")
    o, f = get("count", "ours", "acg"), get("count", "flink", "GROUP BY")
    if o and f and o.wall_s and f.wall_s:
        out.append(f"count: end to end ours {o.wall_s:.1f} s (Ray and Spark start-up included) "
                   f"vs Flink {f.wall_s:.1f} s (its cluster already up); goal: no slower")
    w = get("count", "ours", "acg (warm)")
    if w and f and w.wall_s and f.wall_s:
        out.append(f"count, both up: ours {w.wall_s:.1f} s (a warm session's run) vs Flink "
                   f"{f.wall_s:.1f} s = {w.wall_s / f.wall_s:.2f}x")
    return out


# ----------------------------------------------------------------------------- main
@dataclass
class Sizes:
    count_rows: int
    work_rows: int
    keys: int
    service_us: float


FULL = Sizes(count_rows=4_000_000, work_rows=300_000, keys=50_000, service_us=200)
QUICK = Sizes(count_rows=400_000, work_rows=60_000, keys=10_000, service_us=200)


def run(args: argparse.Namespace) -> list[Row]:
    sizes = args.sizes
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    capacities = [1.0] * (args.workers - args.slow) + [args.slow_capacity] * args.slow
    full_rate = sum(capacities) * 1e6 / sizes.service_us
    rows: list[Row] = []
    py = ensure_flink()

    say(f"data: {sizes.count_rows:,} and {sizes.work_rows:,} Zipf({args.skew}) keys in {out}")
    count_csv, work_csv = out / "count.csv", out / "work.csv"
    count_exact = make_data(count_csv, sizes.count_rows, sizes.keys, args.skew, 1)
    work_exact = make_data(work_csv, sizes.work_rows, sizes.keys, args.skew, 2)
    homo = [1.0] * args.workers
    jobs = set(args.jobs)

    # ---- ours first (the Flink cluster is not up yet: nothing else runs beside it)
    if "count" in jobs:
        load = loadavg()
        say(f"[1/3 count] ours: python -m runtime.run, {sizes.count_rows:,} rows, "
            f"{args.workers} workers (load {load})")
        topo = out / "ours-count.yaml"
        topo.write_text(yaml.safe_dump(topology("vs-flink-count", count_csv, homo, 0, "acg")))
        d = out / "ours-count"
        wall = run_ours(["-m", "runtime.run", str(topo), "--out", str(d)],
                        out / "ours-count.log", args.timeout)
        rep = json.loads((d / "report.json").read_text())
        ph = rep["phases"]
        check("ours (count)", read_ours(d), count_exact)
        rows.append(Row("count", "ours", "acg", sizes.count_rows, wall,
                        ph["input"] + ph["stream"], None, f"{load} -> {loadavg()}",
                        note=f"start-up {ph['startup']:.1f} s, input {ph['input']:.1f} s, "
                             f"stream {ph['stream']:.1f} s "
                             f"({rep['throughput_msgs_per_s']:,.0f} msgs/s)"))
        load = loadavg()
        say(f"[1/3 count] ours, warm: the same run as a session's second (Ray, Spark and "
            f"the actors up, as Flink's cluster is; load {load})")
        d = out / "ours-count-warm"
        run_ours([str(Path(__file__).resolve()), "--warm-run", str(topo), "--out", str(d)],
                 out / "ours-count-warm.log", args.timeout)
        rep = json.loads((d / "report.json").read_text())
        ph = rep["phases"]
        check("ours (count, warm)", read_ours(d), count_exact)
        rows.append(Row("count", "ours", "acg (warm)", sizes.count_rows,
                        json.loads((d / "warm.json").read_text())["wall_s"],
                        ph["input"] + ph["stream"], None, f"{load} -> {loadavg()}",
                        note=f"a session's second run (its first: {WARM_UP_ROWS:,} rows); "
                             f"input {ph['input']:.1f} s, stream {ph['stream']:.1f} s"))
    schemes = [s for s in ("kg", "cg", "acg", "wrr")
               if "keyed" in jobs or ("stateless" in jobs and s in ("acg", "wrr"))]
    if schemes:
        load = loadavg()
        say(f"[2/3 keyed] ours: python -m runtime.compare --schemes {','.join(schemes)}, "
            f"{sizes.work_rows:,} records at {sizes.service_us:g} us, capacities {capacities} "
            f"(load {load})")
        topo = out / "ours-work.yaml"
        topo.write_text(yaml.safe_dump(topology("vs-flink-work", work_csv, capacities,
                                                sizes.service_us, schemes[0])))
        d = out / "ours-work"
        run_ours(["-m", "runtime.compare", str(topo), "--schemes", ",".join(schemes), "--out", str(d),
                  "--no-progress"], out / "ours-work.log", args.timeout)
        load = f"{load} -> {loadavg()}"
        with open(d / "compare.csv", newline="") as f:
            by = {r["scheme"]: r for r in csv.DictReader(f)}
        for s in schemes:
            check(f"ours ({s})", read_ours(d / s), work_exact)
            r = by[s]
            dur = float(r["duration_s"])
            for job in ("keyed", "stateless"):
                if job in jobs and (job == "keyed" or s in ("acg", "wrr")):
                    rows.append(Row(job, "ours", s, sizes.work_rows, None, dur, full_rate, load,
                                    note="wrr is told the capacities: the ceiling"
                                    if s == "wrr" else
                                    ("the keyed job's run (keys split: stateless work)"
                                     if job == "stateless" else "")))

    # ---- Flink: its Python functions run in thread mode (in the TaskManager's
    # JVM: PyFlink's fastest), and on Java 17 a TaskManager cannot load the
    # embedded interpreter for a second job (NoSuchFieldException:
    # loadedLibraryNames). The count job is SQL alone (no Python function in
    # a TaskManager), so it shares its cluster with the keyed job, which runs
    # second; every other job gets a fresh cluster
    clusters: list[FlinkCluster] = []

    def cluster_for(name: str) -> FlinkCluster:
        c = FlinkCluster(py, args.workers, out / "flink" / name)
        clusters.append(c)
        say(f"flink: starting a standalone cluster (1 JobManager + {args.workers} "
            f"TaskManagers) on loopback for {name}")
        return c

    first = [j for j in ("count", "keyed") if j in jobs]
    if first:
        with cluster_for("-".join(first)) as cluster:
            if "count" in jobs:
                load = loadavg()
                say(f"[1/3 count] flink: Table API GROUP BY, batch mode, "
                    f"{sizes.count_rows:,} rows (cluster up in {cluster.startup_s:.1f} s; "
                    f"load {load})")
                r = run_flink(cluster, "count", count_csv, out / "flink-count")
                check("flink (count)", r["result"], count_exact)
                rows.append(Row("count", "flink", "GROUP BY", sizes.count_rows, r["wall_s"],
                                r["job_s"], None, f"{load} -> {loadavg()}",
                                note=f"client + job; the cluster was up (its start-up "
                                     f"{cluster.startup_s:.1f} s)"))
            if "keyed" in jobs:
                load = loadavg()
                say(f"[2/3 keyed] flink: keyBy, batch mode, {sizes.work_rows:,} records, "
                    f"TaskManagers throttled to {capacities} (load {load})")
                with throttled(cluster, capacities):
                    r = run_flink(cluster, "keyed", work_csv, out / "flink-keyed",
                                  service_us=sizes.service_us)
                check("flink (keyBy)", r["result"], work_exact)
                rows.append(Row("keyed", "flink", "keyBy", sizes.work_rows, None, r["span_s"],
                                full_rate, f"{load} -> {loadavg()}",
                                note=f"job {r['job_s']:.1f} s, client {r['wall_s']:.1f} s; "
                                     f"per subtask msgs/s {_rates(r['rates'])}"))
    if "stateless" in jobs:
        for adaptive in {"both": (False, True), "plain": (False,),
                         "adaptive": (True,)}[args.rebalance]:
            name = "rebalance+adaptive" if adaptive else "rebalance"
            with cluster_for(name.replace("+", "-")) as cluster:
                load = loadavg()
                say(f"[3/3 stateless] flink: {name}, streaming mode, {sizes.work_rows:,} "
                    f"records (load {load})")
                with throttled(cluster, capacities):
                    r = run_flink(cluster, "rebalance", work_csv, out / f"flink-{name}",
                                  service_us=sizes.service_us, adaptive=adaptive)
                check(f"flink ({name})", r["result"], work_exact)
                rows.append(Row("stateless", "flink", name, sizes.work_rows, None, r["span_s"],
                                full_rate, f"{load} -> {loadavg()}",
                                note=f"job {r['job_s']:.1f} s, client {r['wall_s']:.1f} s; "
                                     f"per subtask msgs/s {_rates(r['rates'])}"))
    left = [pid for c in clusters for pid in c.alive()]
    if left:
        raise HarnessError(f"flink: {len(left)} processes still running after stop: {left}")
    return rows


#: the warm session's first run: this many of the input's rows (not timed)
WARM_UP_ROWS = 10_000


def warm_run(topo: Path, out: Path) -> None:
    """``topo`` as the second run of one Ray + Spark session (README, "Warm
    sessions"): a first run of ``WARM_UP_ROWS`` rows starts Ray, Spark and
    the actors, then the whole run is timed, from ``RayEngine.run``'s call
    to its return (its outputs written); ``out/warm.json`` has the time."""
    from actors.engine import RayEngine
    from runtime.api import load

    with RayEngine("vs-flink-warm") as engine:
        engine.run(load(str(topo), [f"input.limit={WARM_UP_ROWS}"]),
                   out.with_name(out.name + "-first"), plot=False)
        t0 = time.time()
        engine.run(load(str(topo)), out, plot=False)
        wall = time.time() - t0
    (out / "warm.json").write_text(json.dumps({"wall_s": wall}))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short version of all three jobs")
    p.add_argument("--out", type=Path, default=None, help="default: runs/vs-flink-<UTC stamp>")
    p.add_argument("--workers", type=int, default=4, help="workers = TaskManagers (default 4)")
    p.add_argument("--slow", type=int, default=2, help="how many of them are slow (default 2)")
    p.add_argument("--slow-capacity", type=float, default=0.3)
    p.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of the keys")
    p.add_argument("--jobs", default="count,keyed,stateless")
    p.add_argument("--rebalance", choices=("both", "plain", "adaptive"), default="both",
                   help="the stateless job's Flink runs: rebalance with the adaptive "
                        "partitioner off, on, or both (default; a fresh cluster each)")
    p.add_argument("--rows", type=int, default=None, help="records of jobs 2-3 (override)")
    p.add_argument("--count-rows", type=int, default=None, help="rows of job 1 (override)")
    p.add_argument("--timeout", type=float, default=1800, help="per run, seconds")
    p.add_argument("--install-only", action="store_true",
                   help="build Flink's venv (once; pip needs the package registry) and exit")
    p.add_argument("--warm-run", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warm_run is not None:  # the count job's warm row, in a process of its own
        if args.out is None:
            p.error("--warm-run needs --out")
        warm_run(args.warm_run, args.out.resolve())
        return 0
    if args.install_only:
        try:
            say(f"flink: {ensure_flink()}")
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    sizes = QUICK if args.quick else FULL
    args.sizes = Sizes(args.count_rows or sizes.count_rows, args.rows or sizes.work_rows,
                       sizes.keys, sizes.service_us)
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    bad = set(args.jobs) - {"count", "keyed", "stateless"}
    if bad or not args.jobs:
        p.error(f"--jobs: unknown {sorted(bad)} (known: count, keyed, stateless)")
    if not 0 <= args.slow <= args.workers or not 0 < args.slow_capacity <= 1:
        p.error("--slow must be in [0, --workers] and --slow-capacity in (0, 1]")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    args.out = (args.out or ROOT / "runs" / f"vs-flink-{stamp}").resolve()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ctrl-C and SIGTERM unwind through every finally (the cluster, the throttler)
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.time()
    try:
        rows = run(args)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: every process started here was stopped", file=sys.stderr)
        return 130
    text = table(rows)
    notes = goals(rows)
    print(text)
    for n in notes:
        print(f"- {n}")
    (args.out / "vs_flink.md").write_text(text + "\n\n" + "\n".join(f"- {n}" for n in notes)
                                          + "\n")
    say(f"done in {time.time() - t0:.0f} s; table in {args.out / 'vs_flink.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
