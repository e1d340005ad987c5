"""Shared fixtures and fakes.

``ray_spark``: ONE real Ray cluster + RayDP Spark session for the whole test
session (``raydp.init_spark`` costs ~10 s, so every e2e test shares it).
Started lazily by the first test that asks for it; torn down at the end.

``FakeTime`` (``from conftest import FakeTime``, or the ``fake_time``
fixture): the one fake clock of the fast tests, for code that takes
``clock`` / ``sleep`` (or ``wait``) callables.
"""

from __future__ import annotations

import datetime
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

#: when this test session began (``pytest_sessionfinish``)
SESSION_T0 = time.time()

#: logical CPUs for the test cluster: the Spark executor takes 1, the rest
#: (fractional) source/worker/aggregator actors; the machine has 2 cores
RAY_TEST_CPUS = int(os.environ.get("RAY_TEST_CPUS", "4"))


@pytest.fixture(scope="session")
def ray_spark():
    """``(SparkSession)`` on a fresh local Ray cluster; both stopped at the end."""
    import ray

    from actors.engine import dashboard_beside_raylet, ray_system_config, shutdown_ray
    from actors.spark_input import start_spark, stop_spark

    if ray.is_initialized():  # a previous fixture/test left one: start clean
        ray.shutdown()
    with dashboard_beside_raylet():
        ray.init(
            num_cpus=RAY_TEST_CPUS,
            include_dashboard=False,
            logging_level="WARNING",
            log_to_driver=False,
            configure_logging=True,
            _system_config=ray_system_config(),  # metrics every second, calls inline up to 1 MiB
        )
    try:
        spark = start_spark()
        yield spark
    finally:
        stop_spark()
        shutdown_ray()


#: modules that start a multi-node Ray cluster of their own and kill a node of
#: it run first, before the session's ``ray_spark`` cluster and its Spark JVMs
#: exist. The raylet-kill test failed 3 times (stop 17's CI and twice on
#: 2026-11-24), each time with that second cluster alive beside it on the 2-core
#: box; where the message was kept, the stream had ended exact, then Spark lost
#: its executor and ``--verify``'s job never ended. Run first, it passed 6 times
#: in 6. The cause is not known (docs/cluster.md).
OWN_CLUSTER_FIRST = frozenset({"test_cluster_e2e.py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in OWN_CLUSTER_FIRST)  # stable: order kept


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing run removes the Ray session directories (logs, ~40 MB each)
    that its own clusters left: the e2e tests start ~40, and a machine that
    runs the suite again and again (CI's) would fill its disk. A failing run
    keeps them to be read; a cluster still alive (its starter's PID, in the
    directory's name, is running) is never touched, nor one that a link in
    Ray's temp dir points into (``session_latest``,
    ``prom_metrics_service_discovery.json``): Ray does not replace a
    dangling link, and RayDP's Java agent logs under ``session_latest`` -
    every later Spark start on the machine would fail ("Error create log
    dir")."""
    if exitstatus != 0:
        return
    import psutil
    import ray

    root = Path(os.environ.get("RAY_TMPDIR", "/tmp/ray"))
    linked = {p.resolve() for p in root.glob("*") if p.is_symlink()}
    for d in root.glob("session_2*_*"):
        if any(t == d or d in t.parents for t in linked):
            continue
        try:  # session_<YYYY-mm-dd_HH-MM-SS_ffffff>_<pid>
            stamp, pid = d.name.removeprefix("session_").rsplit("_", 1)
            started = datetime.datetime.strptime(stamp, "%Y-%m-%d_%H-%M-%S_%f").timestamp()
        except ValueError:
            continue
        alive = ray.is_initialized() if int(pid) == os.getpid() else psutil.pid_exists(int(pid))
        if started >= SESSION_T0 and not alive:
            shutil.rmtree(d, ignore_errors=True)


class FakeTime:
    """A fake clock: time passes only when someone sleeps.

    ``clock()`` reads ``t`` (seconds); ``sleep(s)`` advances it by ``s``, plus
    ``overshoot_s`` (a late wake-up, as on a busy machine); a sleep overlapping
    one of ``stop_windows`` (``[start, end)`` while the process is SIGSTOPped)
    wakes up only after that window ends. ``wait(s)`` is ``sleep(s)`` returning
    False: a ``threading.Event.wait`` on an event that is never set (the
    throttler's halt). Every requested sleep is recorded in ``sleeps``. Tests
    may set ``t`` directly. ``sleep`` is thread-safe.
    """

    def __init__(self, t: float = 1000.0, overshoot_s: float = 0.0) -> None:
        self.t = t
        self.overshoot_s = overshoot_s
        self.stop_windows: list[tuple[float, float]] = []
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        with self._lock:
            self.sleeps.append(s)
            end = self.t + s + self.overshoot_s
            for a, b in self.stop_windows:  # a SIGSTOP during the sleep delays the wake-up
                if a < end and b > self.t:
                    end = max(end, b + 1e-6)
            self.t = end

    def wait(self, s: float) -> bool:
        self.sleep(s)
        return False


@pytest.fixture
def fake_time() -> FakeTime:
    """A ``FakeTime`` at t = 1000 s, no overshoot, no stops."""
    return FakeTime()


class DirectTransport:
    """A source's transport to in-process ``WorkerCore``s: each call is
    processed at once by its worker (one per send), its ack kept for ``wait``."""

    def __init__(self, workers: list) -> None:
        self.workers, self.acks, self.n = workers, {}, 0

    def send(self, worker: int, parts: list) -> int:
        self.n += 1
        item = self.workers[worker].enqueue(0, parts)
        assert self.workers[worker].step(timeout=0)
        self.acks[self.n] = item.ack
        return self.n

    def wait(self, tokens, timeout):
        return [(t, self.acks.pop(t)) for t in tokens]


def start_then_kill_mid_file(cmd: list[str], cwd, counted, first_rows: int, drop_next,
                             timeout_s: float = 300) -> None:
    """Run ``cmd`` (a ``runtime.run`` of a live stream); once ``counted()``
    reaches ``first_rows``, ``drop_next()`` lands the next file, and the run
    is SIGKILLed as soon as it has counted part of it. Triggered by counts."""
    import os
    import subprocess
    import time

    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    first = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + timeout_s
        while counted() < first_rows:
            assert first.poll() is None, first.stderr.read()  # type: ignore[union-attr]
            assert time.time() < deadline, "the first file was never counted"
            time.sleep(0.05)
        drop_next()
        while counted() == first_rows and time.time() < deadline:
            time.sleep(0.02)  # the next file is being counted: kill mid-file
        first.kill()
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
