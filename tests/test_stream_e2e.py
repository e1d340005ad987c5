"""Live streams end to end: Spark Structured Streaming (RayDP) -> sources ->
workers -> aggregator, with files landing in the directory during the run.

Nothing here waits on the clock to decide what happens: the next file is
dropped when the run's ``result.parquet`` shows every row dropped so far, a
worker is killed and the run is stopped (SIGTERM) on the same kind of event.
Every run must end equal to Spark's batch ``groupBy`` over every file that
arrived.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from conftest import start_then_kill_mid_file

from runtime.operators import table_diff
from runtime.topology import load_topology

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
WORDS = ROOT / "data" / "gitgit-words-1m.parquet"


def _drop(table, directory: Path, name: str) -> None:
    """Write a file under a name Spark ignores, then rename it into place."""
    tmp = directory / f"_{name}"
    if name.endswith(".csv"):
        pacsv.write_csv(table, tmp)
    else:
        pq.write_table(table, tmp)
    os.replace(tmp, directory / name)


def _counted(out: Path) -> int:
    try:
        return int(pc.sum(pq.read_table(out / "result.parquet").column("count")).as_py() or 0)
    except (FileNotFoundError, OSError):
        return 0


def _three_files(indir: Path, start: int, ext: str):
    """Three files of 3,000 words (from row ``start``) in ``indir``, already there."""
    words = pq.read_table(WORDS).slice(start, 9_000).select(["key"])
    indir.mkdir()
    for k in range(3):
        _drop(words.slice(3_000 * k, 3_000), indir, f"part-{k}.{ext}")
    return words


def _check_exact(spark, topo, out: Path) -> dict:
    from actors.spark_input import build_dataframe, reference_result

    ref = reference_result(build_dataframe(spark, topo), topo.app.model_dump())
    got = pq.read_table(out / "result.parquet")
    assert table_diff(got, ref.cast(got.schema)) is None
    report = json.loads((out / "report.json").read_text())
    assert report["messages"]["input"] == report["messages"]["processed"]
    before = report["stream"]["messages_before"]  # in the checkpoint it resumed from
    assert before + report["messages"]["input"] == int(pc.sum(ref.column("count")).as_py())
    return report


def test_files_dropped_into_a_live_stream_are_counted_once(ray_spark, tmp_path) -> None:
    """Six files, each dropped once the last one is in the live result; a
    worker killed after the third (replayed in the run), the aggregator after
    the fourth and a source after the fifth (each time the stream restarts from
    its checkpoint); SIGTERM once everything is in: exact."""
    import ray

    from actors.pipeline import run_with_restarts

    words = pq.read_table(WORDS).slice(0, 70_000)
    sizes = [20_000, 10_000, 10_000, 10_000, 10_000, 10_000]
    indir, out = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    _drop(words.slice(0, sizes[0]), indir, "part-0.parquet")
    topo = load_topology({
        "name": "stream-e2e",
        "input": {"format": "parquet", "path": str(indir), "stream": True},
        "sources": 2, "workers": {"count": 3, "service_us": 0},
        "grouping": {"scheme": "acg"},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.25},
        # a safety net only: the run is stopped by the signal below
        "run": {"batch": 1000, "until_idle_s": 120},
    }, check_input=True)
    namespace: list[str] = []
    failure: list[BaseException] = []

    def feed() -> None:
        try:
            dropped = sizes[0]
            for k, n in enumerate(sizes[1:], start=1):
                while _counted(out) < dropped:
                    time.sleep(0.05)
                _drop(words.slice(dropped, n), indir, f"part-{k}.parquet")
                dropped += n
                if k == 2:  # mid-stream: its unflushed messages are replayed elsewhere
                    ray.kill(ray.get_actor("worker-1", namespace=namespace[-1]))
                if k == 3:  # the result's holder: the stream restarts from its checkpoint
                    ray.kill(ray.get_actor("aggregator", namespace=namespace[-1]))
                if k == 4:  # its inbox is lost: the stream restarts from its checkpoint
                    while len(namespace) < 2:
                        time.sleep(0.05)
                    ray.kill(ray.get_actor("source-0", namespace=namespace[-1]))
            while len(namespace) < 3 or _counted(out) < dropped:
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failure.append(e)
        os.kill(os.getpid(), signal.SIGTERM)  # a graceful stop, as from a terminal

    def log(msg: str) -> None:
        if "Ray namespace" in msg:
            namespace.append(msg.rsplit(" ", 1)[-1])
            if len(namespace) == 1:
                threading.Thread(target=feed, daemon=True).start()

    # new actors, named in the namespace the log names (reused ones keep their first run's)
    report = run_with_restarts(topo, out, ray_spark, progress=False, log=log,
                               reuse_actors=False)
    assert not failure, failure
    stream = report["stream"]
    assert stream["restarts"] == ["the aggregator died", "source-0 died"]
    assert stream["stopped_by"] == "signal"
    assert stream["messages_before"] + stream["rows"] == sum(sizes)
    assert stream["results_written"] >= 1
    _check_exact(ray_spark, topo, out)


def test_a_stream_stops_once_idle_and_takes_files_a_few_at_a_time(ray_spark, tmp_path) -> None:
    """CSV files already there, one per micro-batch; ``until_idle_s`` ends it."""
    from actors.pipeline import run_pipeline

    indir, out = tmp_path / "in", tmp_path / "out"
    _three_files(indir, 100_000, "csv")
    topo = load_topology({
        "name": "stream-idle-e2e",
        "input": {"format": "csv", "path": str(indir), "stream": True,
                  "max_files_per_trigger": 1},
        "sources": 2, "workers": {"count": 2, "service_us": 0},
        "grouping": {"scheme": "kg"},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.25},
        "run": {"batch": 500, "until_idle_s": 2},
    }, check_input=True)
    report = run_pipeline(topo, out, ray_spark, progress=False, log=lambda m: None)
    assert report["stream"]["stopped_by"] == "idle"
    assert report["stream"]["micro_batches"] == 3
    _check_exact(ray_spark, topo, out)


def test_a_live_top_k_reports_replication_over_the_streams_keys(ray_spark, tmp_path) -> None:
    """A live stream whose result holds only the top k: replication is counted
    over the keys handed over (before, over the result's k rows: 1,755 for
    topologies/trending.yaml); kg keeps each key on one worker, so exactly 1.
    The top k equals Spark's: exactly, as the sketches have a counter for
    every one of the stream's 1,568 keys (with fewer, the aggregator's merge
    evicts and the counts it reports depend on when the workers flushed)."""
    from actors.pipeline import run_pipeline
    from actors.spark_input import build_dataframe, reference_result

    indir, out = tmp_path / "in", tmp_path / "out"
    words = _three_files(indir, 200_000, "parquet")
    topo = load_topology({
        "name": "stream-topk-e2e",
        "input": {"format": "parquet", "path": str(indir), "stream": True},
        "sources": 2, "workers": {"count": 3, "service_us": 0},
        "grouping": {"scheme": "kg"},
        "app": {"kind": "heavy-hitters", "top_k": 5, "counters": 10_000,
                "aggregate_every_s": 0.25},
        "run": {"batch": 500, "until_idle_s": 2},
    }, check_input=True)
    report = run_pipeline(topo, out, ray_spark, progress=False, log=lambda m: None)
    assert report["messages"]["input"] == 9_000
    keys = sum(w["keys"] for w in report["workers"])
    assert keys == len(set(words.column("key").to_pylist())) > 5
    assert report["replication"] == pytest.approx(1.0)
    ref = reference_result(build_dataframe(ray_spark, topo), topo.app.model_dump())
    got = pq.read_table(out / "result.parquet")
    assert got.num_rows == 5 and table_diff(got, ref.cast(got.schema)) is None


def test_a_streamed_csv_file_with_its_columns_in_another_order_stops_the_stream(
        ray_spark, tmp_path) -> None:
    """A CSV file whose header differs from the stream's columns (here: the same
    columns, swapped) is never read by position - that made its other column
    the key, silently. The stream stops with one line naming the file and both
    column lists."""
    import threading

    import pyarrow as pa

    from actors.pipeline import run_pipeline
    from runtime.topology import TopologyError

    words = pq.read_table(WORDS).slice(0, 2_000).select(["key"])
    first = words.append_column("note", pa.array(["n"] * words.num_rows))
    indir, out = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    _drop(first, indir, "part-0.csv")
    topo = load_topology({
        "name": "stream-csv-columns",
        "input": {"format": "csv", "path": str(indir), "stream": True},
        "sources": 1, "workers": {"count": 2, "service_us": 0},
        "grouping": {"scheme": "kg"},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.25},
        "run": {"batch": 500, "until_idle_s": 60},
    }, check_input=True)

    def swap_later() -> None:
        while _counted(out) < first.num_rows:
            time.sleep(0.05)
        _drop(first.select(["note", "key"]), indir, "part-1.csv")

    threading.Thread(target=swap_later, daemon=True).start()
    with pytest.raises(TopologyError) as e:
        run_pipeline(topo, out, ray_spark, progress=False, log=lambda m: None)
    line = str(e.value)
    assert "\n" not in line and "part-1.csv" in line, line
    assert "[note, key]" in line and "[key, note]" in line, line
    assert _counted(out) == first.num_rows  # the first file, once; nothing of the second


def _dead_run_processes(out: Path) -> list[tuple[int, float]]:
    from runtime.dataflow.checkpoint import PROCESSES_FILE, checkpoint_dir

    data = json.loads((checkpoint_dir(out) / PROCESSES_FILE).read_text())
    return [(int(c[0]), float(c[1])) for c in data["children"]]


def test_a_stream_resumes_exactly_after_its_driver_is_killed(tmp_path) -> None:
    """SIGKILL the driver while a file is half processed; a file lands while it
    is down; ``--resume`` stops the dead run's leftovers and ends equal to
    Spark's groupBy over every file (``--verify``), exit 0."""
    import subprocess
    import sys

    import yaml

    from runtime.dataflow.checkpoint import _alive

    words = pq.read_table(WORDS).slice(200_000, 70_000).select(["key"])
    indir, out = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    _drop(words.slice(0, 20_000), indir, "part-0.parquet")
    topo = tmp_path / "stream.yaml"
    topo.write_text(yaml.safe_dump({
        "name": "stream-resume-e2e",
        "input": {"format": "parquet", "path": str(indir), "stream": True},
        "sources": 2,
        # 3 workers at 200 us a message: a 40,000-row file takes ~2.7 s
        "workers": {"count": 3, "service_us": 200, "throttle": "service"},
        "grouping": {"scheme": "acg"},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.25},
        "run": {"batch": 1000, "until_idle_s": 300},  # killed long before
    }))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "runtime.run", str(topo), "--out", str(out), "--no-progress"]
    start_then_kill_mid_file(cmd, ROOT, lambda: _counted(out), 20_000,
                             lambda: _drop(words.slice(20_000, 40_000), indir, "part-1.parquet"))
    dead = _dead_run_processes(out)
    _drop(words.slice(60_000, 10_000), indir, "part-2.parquet")  # while nobody runs

    second = subprocess.run([*cmd, "--resume", "--verify", "--set", "run.until_idle_s=2"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "equals Spark's groupBy(key).count()" in second.stdout
    assert not [p for p in dead if _alive(*p) is not None], "the dead run left processes"
    report = json.loads((out / "report.json").read_text())
    assert report["verify"]["equal"] is True
    assert report["stream"]["messages_before"] >= 20_000
    assert report["stream"]["stopped_by"] == "idle"
    got = pq.read_table(out / "result.parquet")
    assert int(pc.sum(got.column("count")).as_py()) == 70_000
