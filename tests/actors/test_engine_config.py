"""The settings a run brings: Ray calls inline up to ``INLINE_ARGS_BYTES``; Spark's
scratch directory."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading

import pytest

from actors import engine


def test_a_cluster_we_start_sends_calls_inline_up_to_one_mib(monkeypatch) -> None:
    monkeypatch.delenv(engine.INLINE_ARGS_ENV, raising=False)
    config = engine.ray_system_config()
    assert config["max_direct_call_object_size"] == engine.INLINE_ARGS_BYTES == 1 << 20
    # an existing cluster's workers get it from the job's environment
    assert engine.inline_args_env() == {"RAY_max_direct_call_object_size": "1048576"}


@pytest.mark.parametrize("value", ["102400", "4194304"])
def test_a_users_setting_wins(monkeypatch, value: str) -> None:
    monkeypatch.setenv(engine.INLINE_ARGS_ENV, value)
    assert "max_direct_call_object_size" not in engine.ray_system_config()  # Ray reads the env
    assert engine.inline_args_env() == {"RAY_max_direct_call_object_size": value}


def test_a_cluster_we_start_gives_the_job_no_runtime_env(monkeypatch) -> None:
    """Its processes inherit PYTHONPATH and the system config; a runtime env
    would send every actor through Ray's runtime-env agent (issue 26)."""
    monkeypatch.delenv(engine.INLINE_ARGS_ENV, raising=False)
    assert engine.job_runtime_env(True, "/repo") is None
    shipped = {"py_modules": ["/tmp/op.py"]}  # a user's operator still ships
    assert engine.job_runtime_env(True, "/repo", shipped) == shipped
    # a cluster we attach to did not inherit our environment: the job brings it
    assert engine.job_runtime_env(False, "/repo", shipped) == {
        "env_vars": {"PYTHONPATH": "/repo", "RAY_max_direct_call_object_size": "1048576"},
        **shipped}


class _Node:
    """What ``Node.__init__`` does for a head node, in order: the head processes
    (ending with the dashboard, whose start returns once it answers), then the
    raylet and the rest. Started from a thread of its own, the dashboard
    answers only once the raylet has started (no timing involved)."""

    def __init__(self, events: list[str], dashboard_fails: bool = False) -> None:
        self.events, self.dashboard_fails = events, dashboard_fails
        self.raylet = threading.Event()
        self.all_processes: dict[str, list] = {}  # no dashboard process to watch
        self.start_api_server(include_dashboard=True, raise_on_failure=True)
        self.start_ray_processes()
        events.append("node up")

    def start_api_server(self, *, include_dashboard, raise_on_failure) -> None:
        if threading.current_thread() is not threading.main_thread():
            assert self.raylet.wait(30)
        if self.dashboard_fails:
            raise RuntimeError("the dashboard did not start")
        self.events.append("dashboard up")

    def start_ray_processes(self) -> None:
        self.events.append("raylet started")
        self.raylet.set()


def test_the_dashboard_starts_beside_the_raylet_and_is_up_before_the_node(monkeypatch) -> None:
    from ray._private import node as node_mod

    monkeypatch.setattr(node_mod, "Node", _Node)
    events: list[str] = []
    with engine.dashboard_beside_raylet():
        _Node(events)
    # the raylet did not wait for the dashboard; the node waited for both
    assert events == ["raylet started", "dashboard up", "node up"]
    with engine.dashboard_beside_raylet():
        with pytest.raises(RuntimeError, match="the dashboard did not start"):
            _Node([], dashboard_fails=True)  # raised where Ray raised it
    events = []
    _Node(events)  # outside the block Ray's own order is back
    assert events == ["dashboard up", "raylet started", "node up"]


def test_a_ray_without_the_methods_is_left_alone(monkeypatch) -> None:
    from ray._private import node as node_mod

    class Other:
        pass

    monkeypatch.setattr(node_mod, "Node", Other)
    with engine.dashboard_beside_raylet():
        assert not hasattr(Other, "start_api_server")  # nothing added
        assert not hasattr(Other, "start_ray_processes")
    assert not hasattr(Other, "start_api_server")


def test_rays_token_auth_notice_goes_to_the_engine_log(tmp_path) -> None:
    """``ray.init`` with ``RAY_AUTH_MODE`` unset logs "Token authentication is
    enabled ..." at WARNING through Ray's console handler: inside
    ``ray_notices_to(log)`` it is written to the log instead (issue 26)."""
    import io
    import logging

    seen = io.StringIO()
    console = logging.StreamHandler(seen)  # stands for Ray's handler on the "ray" logger
    ray_logger = logging.getLogger("ray")
    ray_logger.addHandler(console)
    notice = logging.getLogger(f"{engine.RAY_AUTH_LOGGER}.authentication_token_setup")
    log = tmp_path / "engine.log"
    try:
        with engine.ray_notices_to(log):
            notice.warning("Token authentication is enabled for this Ray cluster.")
        assert seen.getvalue() == ""
        assert "WARNING" in log.read_text() and "Token authentication" in log.read_text()
        notice.warning("after the block")  # left as it was
        assert "after the block" in seen.getvalue()
        with engine.ray_notices_to(tmp_path / "quiet.log"):
            pass
        assert not (tmp_path / "quiet.log").exists()  # nothing said: no file
    finally:
        ray_logger.removeHandler(console)


def test_the_spark_scratch_dir_is_the_sessions_and_a_dead_ones_is_removed(
        tmp_path, monkeypatch) -> None:
    """Spark's JVMs write their temporary files into this process's scratch
    directory (removed at exit); one left by a killed process (its pid gone)
    is removed when the next is made. Fresh module state: no session needed."""
    from actors import spark_input

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spark_input, "_scratch", None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{spark_input.SCRATCH_PREFIX}{dead.pid}-x"
    (stale / "spark-1").mkdir(parents=True)
    alive = tmp_path / f"{spark_input.SCRATCH_PREFIX}{os.getppid()}-y"  # a live process's
    alive.mkdir()
    d = spark_input.scratch_dir()
    assert d.parent == tmp_path and d.name.startswith(f"hetero-spark-{os.getpid()}-")
    assert not stale.exists() and alive.exists()
    assert spark_input.scratch_dir() == d  # once per process
    conf = spark_input._session_configs(None, executors_local=False)
    assert "spark.local.dir" not in conf  # (it is java.io.tmpdir; set, Spark warns)
    assert f"-Djava.io.tmpdir={d}" in conf["spark.driver.extraJavaOptions"]
    assert f"-Djava.io.tmpdir={d}" in conf["spark.ray.raydp_app_master.extraJavaOptions"]
    # an executor on another machine keeps its own default (the directory is not there)
    assert "java.io.tmpdir" not in conf["spark.executor.extraJavaOptions"]
    local = spark_input._session_configs(None, executors_local=True)
    assert f"-Djava.io.tmpdir={d}" in local["spark.executor.extraJavaOptions"]
    # a JVM's fatal-error log goes there too, not into the user's directory
    assert f"-XX:ErrorFile={d}/hs_err_pid%p.log" in local["spark.executor.extraJavaOptions"]
    assert f"-XX:ErrorFile={d}/hs_err_pid%p.log" in conf["spark.driver.extraJavaOptions"]


def test_java_options_given_keep_ours_and_come_last(monkeypatch, tmp_path) -> None:
    """A user's (or the quick tier's) Java options come after ours, so they win
    where both set one; Java 17's, the scratch directory and the planners'
    JIT stay."""
    from actors import spark_input

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spark_input, "_scratch", None)
    mine = "-XX:TieredStopAtLevel=4"
    conf = spark_input._session_configs(
        {"spark.executor.extraJavaOptions": spark_input.PLANNER_JVM_OPTIONS,
         "spark.driver.extraJavaOptions": mine, "spark.other.extraJavaOptions": mine},
        executors_local=True)
    tmpdir = f"-Djava.io.tmpdir={spark_input.scratch_dir()}"
    executor = conf["spark.executor.extraJavaOptions"]
    assert executor.endswith(" " + spark_input.PLANNER_JVM_OPTIONS)
    assert spark_input.JAVA17_OPTIONS in executor and tmpdir in executor
    driver = conf["spark.driver.extraJavaOptions"]
    assert driver.endswith(" " + mine) and tmpdir in driver
    assert spark_input.PLANNER_JVM_OPTIONS in driver and spark_input.JAVA17_OPTIONS in driver
    assert conf["spark.other.extraJavaOptions"] == f"{spark_input.JAVA17_OPTIONS} {mine}"


def test_the_jvms_map_their_class_archive_only_when_one_was_built(monkeypatch,
                                                                  tmp_path) -> None:
    """actors.jvm_archive: the driver's and a local executor's JVM get
    ``-XX:SharedArchiveFile`` of their own archive when ``python -m
    actors.jvm_archive`` built it, nothing otherwise (or with
    ``HS_JVM_ARCHIVES=off``); an executor on another machine never (the file
    is not there); a user's Java options still come last."""
    from actors import jvm_archive, spark_input

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spark_input, "_scratch", None)
    archives = tmp_path / "jvm"
    monkeypatch.setenv("HS_JVM_ARCHIVES", str(archives))
    assert jvm_archive.archive_dir() == archives
    assert jvm_archive.java_options("driver") == ""  # none built
    archives.mkdir()
    (archives / "driver.jsa").write_bytes(b"x")
    (archives / "executor.jsa").write_bytes(b"x")
    mine = "-Xmx2g"
    conf = spark_input._session_configs({"spark.driver.extraJavaOptions": mine},
                                        executors_local=True)
    driver, executor = (conf[f"spark.{r}.extraJavaOptions"] for r in ("driver", "executor"))
    assert f"-XX:SharedArchiveFile={archives / 'driver.jsa'}" in driver
    assert "-XX:+AllowArchivingWithJavaAgent" in driver and driver.endswith(" " + mine)
    assert f"-XX:SharedArchiveFile={archives / 'executor.jsa'}" in executor
    assert "SharedArchiveFile" not in conf["spark.ray.raydp_app_master.extraJavaOptions"]
    remote = spark_input._session_configs(None, executors_local=False)
    assert "SharedArchiveFile" not in remote["spark.executor.extraJavaOptions"]
    monkeypatch.setenv("HS_JVM_ARCHIVES", "off")
    assert "SharedArchiveFile" not in spark_input._session_configs(
        None, executors_local=True)["spark.driver.extraJavaOptions"]
    # while building: each JVM writes its archive at exit, none is read
    monkeypatch.setattr(jvm_archive, "_dump_dir", tmp_path / "dump")
    assert jvm_archive.java_options("executor").endswith(
        f"-XX:ArchiveClassesAtExit={tmp_path / 'dump' / 'executor.jsa'}")


def test_the_executor_takes_the_quick_jit_tier_only_for_an_input_known_small(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from actors.spark_input import QUICK_EXECUTOR_ROWS, quick_executor
    from runtime.topology import load_topology

    def topo(inp: dict) -> object:
        return load_topology({"name": "q", "input": inp, "sources": 1,
                              "workers": {"count": 1}, "grouping": {"scheme": "kg"}})

    assert quick_executor(topo({"format": "zipf", "messages": QUICK_EXECUTOR_ROWS}))
    assert not quick_executor(topo({"format": "zipf", "messages": QUICK_EXECUTOR_ROWS + 1}))
    assert quick_executor(topo({"format": "zipf", "messages": 10**8, "limit": 1000}))
    small, big = tmp_path / "small.parquet", tmp_path / "big.parquet"
    pq.write_table(pa.table({"key": ["a"] * 10}), small)
    pq.write_table(pa.table({"key": ["a"] * (QUICK_EXECUTOR_ROWS + 1)}), big)
    assert quick_executor(topo({"format": "parquet", "path": str(small)}))
    assert not quick_executor(topo({"format": "parquet", "path": str(big)}))
    assert quick_executor(topo({"format": "parquet", "path": str(big), "limit": 5}))
    # not known before Spark reads it: a CSV file, a directory, a live stream
    (tmp_path / "k.csv").write_text("key\na\n")
    assert not quick_executor(topo({"format": "csv", "path": str(tmp_path / "k.csv")}))
    d = tmp_path / "dir"
    d.mkdir()
    pq.write_table(pa.table({"key": ["a"]}), d / "part-0.parquet")
    assert not quick_executor(topo({"format": "parquet", "path": str(d)}))
    assert not quick_executor(topo({"format": "parquet", "path": str(d), "stream": True}))
