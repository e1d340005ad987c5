"""Event-time windows end to end on the real engine (Spark/RayDP -> Ray):

- a finite input (real commit times, out of order, with null times and null
  keys) equals Spark's ``groupBy(window(ts, size, slide), key)``: the word
  count under every scheme, the other apps under a key-splitting and a
  key-keeping one;
- a live stream, its driver killed mid-file and resumed, with late records:
  ``result.parquet`` equals Spark's windowed ``groupBy`` over every record
  that was not late, every window in ``OUT/windows/`` is emitted once and
  complete, and ``OUT/late.parquet`` holds exactly the late records.

Faults are triggered by what the run has counted, never by the clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import start_then_kill_mid_file

from runtime.grouping import SCHEMES
from runtime.operators import table_diff
from runtime.topology import load_topology

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
WORDS = ROOT / "data" / "gitgit-words-1m.parquet"
DAY = 86_400


def _with_nulls(table: pa.Table) -> pa.Table:
    """Every 97th time and every 89th key null."""
    n = table.num_rows
    ts = [None if i % 97 == 0 else t for i, t in enumerate(table.column("ts").to_pylist())]
    keys = [None if i % 89 == 0 else k for i, k in enumerate(table.column("key").to_pylist())]
    return pa.table({"ts": pa.array(ts, pa.int64()), "key": pa.array(keys, pa.string())},
                    ).slice(0, n)


@pytest.fixture(scope="module")
def commits(tmp_path_factory) -> Path:
    """30,000 real words with their commit times (out of order), with nulls."""
    path = tmp_path_factory.mktemp("win") / "words.parquet"
    pq.write_table(_with_nulls(pq.read_table(WORDS).slice(300_000, 30_000)), path)
    return path


def _windowed_run(spark, out: Path, commits: Path, scheme: str, app: dict) -> None:
    """Sliding windows (30 days, every 10) over ``commits``: the result equals
    Spark's ``groupBy(window(ts, 30 days, 10 days), key)`` with the same aggregates."""
    from actors.pipeline import run_pipeline
    from actors.spark_input import build_dataframe, reference_result

    topo = load_topology({
        "name": f"win-{scheme}",
        "input": {"format": "parquet", "path": str(commits)},
        "sources": 2,
        "workers": {"count": 3, "service_us": 0},
        "grouping": {"scheme": scheme},
        "app": {**app, "aggregate_every_s": 0.25,
                "window": {"column": "ts", "size": 30 * DAY, "slide": 10 * DAY}},
        "run": {"batch": 500, "seed": 1},
    }, check_input=True)
    df = build_dataframe(spark, topo)
    ref = reference_result(df, topo.app.model_dump())
    run_pipeline(topo, out, spark, progress=False, log=lambda m: None, df=df)
    got = pq.read_table(out / "result.parquet")
    assert got.column_names[:3] == ["window_start", "window_end", "key"]
    assert got.num_rows == ref.num_rows > 40
    assert table_diff(got, ref.cast(got.schema)) is None
    report = json.loads((out / "report.json").read_text())
    assert report["messages"]["input"] == report["messages"]["processed"] == 30_000
    windows = report["aggregator"]["windows"]
    assert windows["no_event_time"] == len(range(0, 30_000, 97))  # in no window, as in Spark
    assert windows["peak_open"] >= windows["open"] == len(set(
        got.column("window_start").to_pylist()))


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_windowed_word_count_equals_sparks_windowed_groupby_under_every_scheme(
        ray_spark, tmp_path, commits, scheme) -> None:
    _windowed_run(ray_spark, tmp_path / "run", commits, scheme, {"kind": "wordcount"})


@pytest.mark.parametrize("scheme,app", [
    ("wrr", {"kind": "heavy-hitters", "top_k": 5}),
    ("cg", {"kind": "aggregate", "value": "ts", "aggs": ["count", "min", "max"]}),
])
def test_other_windowed_apps_equal_sparks_windowed_groupby(ray_spark, tmp_path, commits,
                                                           scheme, app) -> None:
    _windowed_run(ray_spark, tmp_path / "run", commits, scheme, app)


def _drop(table: pa.Table, directory: Path, name: str) -> None:
    tmp = directory / f"_{name}"
    pq.write_table(table, tmp)
    os.replace(tmp, directory / name)


def _counted(out: Path) -> int:
    try:
        return int(pc.sum(pq.read_table(out / "result.parquet").column("count")).as_py() or 0)
    except (FileNotFoundError, OSError):
        return 0


def _words(lo: int, n: int, ts: list[int]) -> pa.Table:
    keys = pq.read_table(WORDS).slice(lo, n).column("key")
    return pa.table({"key": keys, "ts": pa.array(ts, pa.int64())})


def test_a_windowed_live_stream_emits_each_window_once_across_a_kill_and_resume(
        tmp_path) -> None:
    """Tumbling windows of 20 over a stream whose time is its row number / 100
    (a little out of order, within the lateness of 10). The driver is killed
    while the second file is counted; a third file, with 60 records far
    behind the watermark, lands while nobody runs; ``--resume --verify``."""
    import yaml

    indir, out = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    jitter = [i // 100 - (i % 7) for i in range(70_000)]  # behind by up to 6 (< lateness)
    _drop(_words(400_000, 20_000, jitter[:20_000]), indir, "part-0.parquet")
    topo = tmp_path / "stream.yaml"
    topo.write_text(yaml.safe_dump({
        "name": "window-stream-e2e",
        "input": {"format": "parquet", "path": str(indir), "stream": True},
        "sources": 2,
        "workers": {"count": 3, "service_us": 200, "throttle": "service"},
        "grouping": {"scheme": "acg"},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.25,
                "window": {"column": "ts", "size": 20, "lateness": 10}},
        "run": {"batch": 1000, "until_idle_s": 300},  # killed long before
    }))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "runtime.run", str(topo), "--out", str(out), "--no-progress"]
    start_then_kill_mid_file(
        cmd, ROOT, lambda: _counted(out), 20_000,
        lambda: _drop(_words(420_000, 40_000, jitter[20_000:60_000]), indir, "part-1.parquet"))
    emitted_before = sorted((out / "windows").glob("*.parquet"))
    assert emitted_before, "the first file's windows (the watermark passed them) were emitted"
    late_ts = list(range(60))  # far behind a watermark near 599
    third = pa.concat_tables([_words(460_000, 10_000, jitter[60_000:]),
                              _words(470_000, 60, late_ts)])
    _drop(third, indir, "part-2.parquet")  # while nobody runs

    second = subprocess.run([*cmd, "--resume", "--verify", "--set", "run.until_idle_s=2"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verify"]["equal"] is True, report["verify"]
    late = pq.read_table(out / "late.parquet")
    assert sorted(late.column("ts").to_pylist()) == late_ts
    assert report["stream"]["event_time"]["late_rows"] == 60
    got = pq.read_table(out / "result.parquet")
    assert int(pc.sum(got.column("count")).as_py()) == 70_000  # every on-time record, once

    # every emitted window once, and whole: equal to the result's rows of that window
    files = sorted((out / "windows").glob("*.parquet"))
    assert set(emitted_before) <= set(files)
    emitted = pa.concat_tables([pq.read_table(f).replace_schema_metadata(None) for f in files])
    pairs = list(zip(emitted.column("window_start").to_pylist(),
                     emitted.column("key").to_pylist(), strict=True))
    assert len(pairs) == len(set(pairs)), "a window was emitted twice"
    starts = set(emitted.column("window_start").to_pylist())
    assert max(starts) >= 560  # emitted as the watermark (699 at the end) passed them
    mine = got.filter(pc.is_in(got.column("window_start"), pa.array(sorted(starts))))
    assert mine.sort_by([("window_start", "ascending"), ("key", "ascending")]).equals(
        emitted.sort_by([("window_start", "ascending"), ("key", "ascending")]))
