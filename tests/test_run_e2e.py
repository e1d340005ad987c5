"""End to end on the real engine: Spark (RayDP) -> sources -> workers -> aggregator.

For every registered scheme, a word count on the bundled real stream, and an
aggregate or a user's operator, must equal Spark's own answer row for row,
and the report must have every docs/design.md key with input == processed. Runs are
small (tens of thousands of messages) so the whole file takes minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from actors import jvm_archive
from actors.spark_input import JNI_COPY_ROOT, SCRATCH_PREFIX
from runtime.grouping import SCHEMES
from runtime.operators import table_diff
from runtime.reporting.phases import PHASES
from runtime.reporting.report import REQUIRED_KEYS
from runtime.topology import load_topology

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
FILES = str(ROOT / "data" / "gitgit-files.parquet")


def _topology(scheme: str, input_spec: dict, **over):
    data = {
        "name": f"e2e-{scheme}",
        "input": input_spec,
        "sources": 2,
        "workers": {"count": 4, "service_us": 0},
        "grouping": {"scheme": scheme},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.5},
        "run": {"batch": 1000, "seed": 1},
    }
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return load_topology(data, check_input=True)


_INPUTS: dict[str, tuple] = {}  # input spec -> (cached DataFrame, Spark's answer)


def _topk_reference(df, k: int = 3):
    """Spark's answer for examples/operators/topk.py:TopK(column="ts", k):
    per key its k largest ts, largest first (rank = position)."""
    import pyarrow as pa
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("key").orderBy(F.desc("ts"))
    top = (df.where(F.col("ts").isNotNull()).withColumn("rank", F.row_number().over(w))
           .where(F.col("rank") <= k).select("key", F.col("rank").cast("long"),
                                             F.col("ts").alias("value")))
    return pa.Table.from_batches(top._collect_as_arrow())


def _input(spark, topo):
    """The input DataFrame and Spark's reference answer, once per distinct input."""
    from actors.spark_input import build_dataframe, reference_result

    key = json.dumps([topo.input.model_dump(), topo.app.model_dump()], sort_keys=True)
    if key not in _INPUTS:
        df = build_dataframe(spark, topo).cache()
        ref = (_topk_reference(df) if topo.app.kind == "operator"
               else reference_result(df, topo.app.model_dump()))
        _INPUTS[key] = (df, ref)
    return _INPUTS[key]


def _run_and_check(spark, topo, out: Path) -> dict:
    from actors.pipeline import run_pipeline

    df, ref = _input(spark, topo)
    report = run_pipeline(topo, out, spark, progress=False, log=lambda m: None, df=df)
    on_disk = json.loads((out / "report.json").read_text())
    missing = [k for k in REQUIRED_KEYS if k not in on_disk]
    assert not missing, missing
    assert on_disk["engine"] == "ray" and on_disk["scheme"] == topo.grouping.scheme
    assert on_disk["messages"]["input"] == on_disk["messages"]["processed"] > 0
    assert sum(w["processed"] for w in on_disk["workers"]) == on_disk["messages"]["processed"]
    assert all(s["routed"] > 0 for s in on_disk["sources"]), "a source had nothing to send"
    lat = on_disk["latency_ms"]  # measured (> 0), percentiles in order, none above max
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"], lat
    assert 0 < lat["mean"] <= lat["max"], lat
    assert (out / "timeseries.csv").exists() and (out / "report.png").exists()

    got = pq.read_table(out / "result.parquet")
    assert got.num_rows == ref.num_rows == on_disk["result"]["rows"]
    assert got.schema.names == ref.schema.names
    if topo.app.kind == "operator":  # TopK: the same rows, ordered by key then rank
        got = got.sort_by([("key", "ascending"), ("rank", "ascending")])
        ref = ref.sort_by([("key", "ascending"), ("rank", "ascending")])
    diff = table_diff(got, ref.cast(got.schema))  # floats within 1e-9 relative
    assert diff is None, f"result differs from Spark's answer: {diff}"
    assert on_disk["replication"] >= 1.0 - 1e-9
    _check_phases(on_disk, in_session=True)
    return report


def _check_phases(report: dict, *, in_session: bool) -> None:
    """``phases``: every key, none negative, in order (runtime.reporting.phases)."""
    ph = report["phases"]
    assert all(ph[k] >= 0 for k in PHASES), ph
    assert ph["first_message"] == pytest.approx(ph["startup"] + ph["input"], abs=2e-3), ph
    assert ph["stream"] == pytest.approx(report["duration_s"], abs=2e-3), ph
    assert ph["total"] == pytest.approx(
        ph["startup"] + ph["input"] + ph["stream"] + ph["finish"], abs=5e-3), ph
    # (run_pipeline alone has no parts yet: its callers add them)
    assert ph["finish_parts"].get("outputs", 0.0) <= ph["finish"] + 1e-3, ph
    if in_session:  # a run in a session already up: no start-up of its own
        assert ph["startup"] == 0.0, ph


TOPK = str(ROOT / "examples" / "operators" / "topk.py") + ":TopK"
ALL_AGGS = ["count", "sum", "min", "max", "mean"]

# Every scheme runs the word count (windowed: tests/test_windows_e2e.py), and
# one of the two other families
# (an aggregate of records with nulls, or a user's operator): each family
# still meets schemes that keep a key on one worker (kg, ch, fish, wrr...) and
# schemes that split it (sg, pkg, cg, acg...). What depends on the scheme
# (routing, splitting a key, merging its parts) is checked for every scheme
# and both apps by the same operators in the simulator
# (tests/sim/test_simulate.py::test_every_scheme_splits_and_merges_every_app_exactly).
AGGREGATE_SCHEMES = ["acg", "ch", "dalton", "fish", "kg", "porc", "sg", "wchoices"]
OPERATOR_SCHEMES = sorted(set(SCHEMES) - set(AGGREGATE_SCHEMES))


def test_the_two_families_cover_every_scheme() -> None:
    assert set(AGGREGATE_SCHEMES) | set(OPERATOR_SCHEMES) == set(SCHEMES)
    assert set(AGGREGATE_SCHEMES) <= set(SCHEMES)


@pytest.mark.parametrize("scheme", AGGREGATE_SCHEMES)
def test_aggregate_of_a_generated_stream_with_nulls_equals_spark(ray_spark, tmp_path,
                                                                 scheme) -> None:
    """Per-key count/sum/min/max/mean of a float column with nulls (~5%),
    records carried from Spark to the workers, keys split by most schemes:
    equal to Spark's groupBy(key).agg(...) (count = the word count)."""
    topo = _topology(scheme, {"format": "zipf", "messages": 30_000, "keys": 3_000,
                              "skew": 1.1, "seed": 5},
                     app={"kind": "aggregate", "value": "amount", "aggs": ALL_AGGS})
    report = _run_and_check(ray_spark, topo, tmp_path / "run")
    if scheme == "kg":
        assert report["replication"] == pytest.approx(1.0)


@pytest.mark.parametrize("scheme", OPERATOR_SCHEMES)
def test_user_operator_on_the_real_stream_equals_spark(ray_spark, tmp_path, scheme) -> None:
    """A user's operator loaded by file path (examples/operators/topk.py: per
    word its 3 latest commit times) equals Spark's window-function answer."""
    topo = _topology(scheme, {"format": "parquet", "path": FILES, "limit": 30_000},
                     app={"kind": "operator", "operator": TOPK, "columns": ["ts"],
                          "params": {"column": "ts", "k": 3}})
    _run_and_check(ray_spark, topo, tmp_path / "run")


@pytest.mark.parametrize("scheme", ["pkg", "acg"])
def test_aggregate_of_integers_with_nulls_and_null_keys_equals_spark(ray_spark, tmp_path,
                                                                    scheme) -> None:
    """An int64 column with nulls, a key whose values are all null, null keys:
    exact integer sums, nulls where Spark has them."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(3)
    n = 20_000
    keys = np.array([f"u{i}" for i in rng.zipf(1.3, n) % 700], dtype=object)
    keys[rng.random(n) < 0.02] = None
    vals = rng.integers(-(2**40), 2**40, n)
    null = rng.random(n) < 0.1
    null[keys == "u1"] = True  # u1: every value null
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"user": pa.array(keys, pa.string()),
                             "n": pa.array(vals, pa.int64(), mask=null)}), path)
    topo = _topology(scheme, {"format": "parquet", "path": str(path), "key": "user",
                              "limit": n},  # (small blocks: both sources get some)
                     app={"kind": "aggregate", "value": "n", "aggs": ALL_AGGS})
    _run_and_check(ray_spark, topo, tmp_path / "run")
    got = pq.read_table(tmp_path / "run" / "result.parquet").to_pylist()
    u1 = next(r for r in got if r["key"] == "u1")
    assert u1["count"] > 0 and u1["sum"] is None and u1["mean"] is None
    assert got[-1]["key"] is None  # null keys: one group, last


# The word count under every scheme runs windowed (sliding windows: the same
# routing, splitting and merging, per window) in tests/test_windows_e2e.py;
# here, plain, under a scheme of each kind: a key kept on one worker, split
# over two, over all of them, by capacity, by a coordinated table.
PLAIN_WORDCOUNT_SCHEMES = ["kg", "pkg", "sg", "wrr", "acg"]


@pytest.mark.parametrize("scheme", PLAIN_WORDCOUNT_SCHEMES)
def test_wordcount_real_stream_equals_spark(ray_spark, tmp_path, scheme) -> None:
    topo = _topology(scheme, {"format": "parquet", "path": FILES, "limit": 30_000})
    _run_and_check(ray_spark, topo, tmp_path / "run")


def test_throttled_cg_run_is_exact_and_moves_virtual_workers(ray_spark, tmp_path) -> None:
    """A heterogeneous, throttled CG run: exact answer, signals flow, VWs move away
    from the slow worker (it is stopped 70% of every 100 ms)."""
    topo = _topology(
        "cg", {"format": "zipf", "messages": 60_000, "keys": 5_000, "skew": 0.8, "seed": 2},
        workers={"count": 4, "service_us": 400, "capacity": [1, 1, 1, 0.3],
                 "throttle": "duty-cycle"},
        grouping={"scheme": "cg", "slot_s": 0.25},
        run={"batch": 500, "seed": 1, "slot_s": 0.25},
    )
    report = _run_and_check(ray_spark, topo, tmp_path / "run")
    assert report["signals"]["increase"] + report["signals"]["decrease"] > 0
    vw = report["vw_ownership"]["final"]
    assert sum(vw) == pytest.approx(40)
    assert vw[3] < 10, vw  # the slow worker gave virtual workers away
    assert report["workers"][3]["stopped_s"] > 0  # the duty cycle really stopped it
    assert "capacity_efficiency" in report


def test_throttled_acg_run_is_exact_measures_rates_and_moves_vws(ray_spark, tmp_path) -> None:
    """ACG under a real duty cycle: exact answer; the controller measured the
    slow worker (stopped 70% of every 100 ms) well below the others and moved
    virtual workers off it; every source holds the controller's final table."""
    topo = _topology(
        "acg", {"format": "zipf", "messages": 60_000, "keys": 5_000, "skew": 0.8, "seed": 2},
        workers={"count": 4, "service_us": 400, "capacity": [1, 1, 1, 0.3],
                 "throttle": "duty-cycle"},
        run={"batch": 500, "seed": 1},
    )
    report = _run_and_check(ray_spark, topo, tmp_path / "run")
    c = report["coordinator"]
    assert c["plans"] >= 1 and c["rates"][3] < 0.6 * min(c["rates"][:3]), c["rates"]
    assert sum(c["vw_per_worker"]) == 64 and c["vw_per_worker"][3] < 16
    assert c["agreement"]["tables"] == c["version"]
    for s in report["sources"]:
        assert s["grouping"]["vw_per_worker"] == c["vw_per_worker"]


def test_wrr_gives_each_worker_its_capacity_share(ray_spark, tmp_path) -> None:
    """The reference scheme is told the configured capacities: worker shares
    follow them to within a message per source and batch (routing, not timing)."""
    caps = [1.0, 1.0, 0.5, 0.25]
    topo = _topology("wrr", {"format": "zipf", "messages": 30_000, "keys": 3_000},
                     workers={"count": 4, "service_us": 0, "capacity": caps,
                              "throttle": "service"})
    report = _run_and_check(ray_spark, topo, tmp_path / "run")
    got = [w["processed"] for w in report["workers"]]
    want = [30_000 * c / sum(caps) for c in caps]
    assert max(abs(g - x) for g, x in zip(got, want, strict=True)) <= 2 * 30, got


@pytest.mark.parametrize("kind", ["naive-bayes", "heavy-hitters"])
def test_other_apps_equal_spark(ray_spark, tmp_path, kind) -> None:
    topo = _topology("pkg", {"format": "zipf", "messages": 20_000, "keys": 500, "skew": 1.2},
                     app={"kind": kind, "counters": 1000, "top_k": 20})
    report = _run_and_check(ray_spark, topo, tmp_path / "run")
    # replication over the input's distinct keys (the top k's result holds only 20),
    # counted as Spark hands the input over: what Spark's own distinct count says
    distinct = _input(ray_spark, topo)[0].select("key").distinct().count()
    held = sum(w["keys"] for w in report["workers"])
    assert report["replication"] == pytest.approx(held / distinct)
    assert 1.0 <= report["replication"] <= 2.0  # pkg: each key on at most two workers


def test_operator_raising_mid_run_fails_with_one_line_and_writes_nothing(ray_spark,
                                                                         tmp_path) -> None:
    """An exception in the user's ``add`` on a worker ends the run with the
    operator's one-line error (what ``runtime.run`` prints, exit 1) and no output."""
    from actors.pipeline import run_pipeline
    from runtime.operators import find_operator_error

    op = tmp_path / "boom.py"
    op.write_text("class Op:\n"
                  "    def create(self): return 0\n"
                  # counts what this worker saw, not its state: the state
                  # restarts at each periodic aggregation, so only a count
                  # makes the failure certain (4 workers, 20,000 rows)
                  "    seen = 0\n"
                  "    def add(self, s, b):\n"
                  "        self.seen += b.num_rows\n"
                  "        if self.seen > 3000:\n"
                  "            raise ValueError('bad record')\n"
                  "        return s + b.num_rows\n"
                  "    def merge(self, a, b): return a + b\n"
                  # a valid finish: the aggregator's periodic answer must not
                  # fail first on a slow machine (only add raises)
                  "    def finish(self, s):\n"
                  "        import pyarrow as pa\n"
                  "        return pa.table({'rows': [s]})\n")
    topo = _topology("acg", {"format": "zipf", "messages": 20_000, "keys": 500},
                     app={"kind": "operator", "operator": f"{op}:Op"})
    out = tmp_path / "run"
    with pytest.raises(Exception) as e:
        run_pipeline(topo, out, ray_spark, progress=False, log=lambda m: None)
    err = find_operator_error(e.value)
    assert err is not None and str(err).startswith(f"app.operator: {op}:Op: ValueError in add: "
                                                   "bad record (at ")
    assert "\n" not in str(err)
    assert not out.exists()


def test_what_an_operator_prints_lands_in_operators_log(ray_spark, tmp_path) -> None:
    """``print`` in the user's operator on a worker (Ray keeps actors' output
    off the console): ``OUT/operators.log``, each line naming its actor."""
    from actors.pipeline import run_pipeline
    from runtime.operators import find_operator_error

    op = tmp_path / "chatty.py"
    op.write_text("class Op:\n"
                  "    def create(self): return 0\n"
                  "    seen = 0\n"
                  "    def add(self, s, b):\n"
                  "        print('adding', b.num_rows, 'rows')\n"
                  "        self.seen += b.num_rows\n"
                  "        if self.seen > 3000:\n"
                  "            raise ValueError('bad record')\n"
                  "        return s + b.num_rows\n"
                  "    def merge(self, a, b): return a + b\n"
                  "    def finish(self, s): return None\n")
    topo = _topology("kg", {"format": "zipf", "messages": 20_000, "keys": 500},
                     app={"kind": "operator", "operator": f"{op}:Op"})
    out = tmp_path / "run"
    out.mkdir()  # as runtime.run makes it
    with pytest.raises(Exception) as e:
        run_pipeline(topo, out, ray_spark, progress=False, log=lambda m: None)
    assert find_operator_error(e.value) is not None
    lines = (out / "operators.log").read_text().splitlines()
    assert lines and all(ln.startswith("[worker-") and " adding " in ln for ln in lines), lines
    assert not (out / "result.parquet").exists()


#: what Spark's JVM, log4j and Ray print on their own (issue 26): never on our console
NOT_OURS = ("WARN", "ERROR", "gcs_client", "log4j", "NativeCodeLoader", "Progress bars",
            "setLogLevel", "Dataset ", "OpenJDK", "[cds")


def _spark_temp_files() -> set[str]:
    root = Path(tempfile.gettempdir())
    return {p.name for pattern in ("liblz4-java-*", "snappy-*", "spark-*", "blockmgr-*",
                                   f"{SCRATCH_PREFIX}*") for p in root.glob(pattern)}


def test_run_process_is_quiet_and_reports_its_phases(tmp_path) -> None:
    """A real ``runtime.run`` (its own Ray and Spark): the console has only our
    lines - Spark's, log4j's and Ray's start-up chatter is in OUT/engine.log -
    and report.json's ``phases`` cover the whole command, final once it ends."""
    topo = tmp_path / "t.yaml"
    topo.write_text("name: quiet\ninput: {format: zipf, messages: 20000, keys: 500}\n"
                    "sources: 2\nworkers: {count: 2, service_us: 0}\n"
                    "grouping: {scheme: kg}\nrun: {batch: 1000}\n")
    out = tmp_path / "out"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    tmp_before = _spark_temp_files()
    # which classes Spark's JVMs took from their class archives (actors.jvm_archive)
    loads = {role: tmp_path / f"{role}-classes.log" for role in jvm_archive.ROLES}
    archives = [a for role in jvm_archive.ROLES for a in (
        "--spark-conf", f"spark.{role}.extraJavaOptions=-Xlog:class+load=info:file={loads[role]}")]
    p = subprocess.run([sys.executable, "-m", "runtime.run", str(topo), "--out", str(out),
                        "--no-progress", *archives], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    # Spark's JVMs wrote their temporary files (native libraries, spark-*, blockmgr-*)
    # into the run's scratch directory, which went with the process
    assert _spark_temp_files() - tmp_before == set()
    # the copy of Ray's JNI library that Spark's driver JVM made is gone (40 MB a run)
    left = [d.name for d in JNI_COPY_ROOT.glob("[0-9]*") if int(d.name) >= t0 * 1000]
    assert not left, left
    console = p.stdout.splitlines() + p.stderr.splitlines()
    noise = [ln for ln in console if any(w in ln for w in NOT_OURS)]
    assert not noise, "\n".join(noise)
    assert p.stderr.splitlines()[0].startswith("ray: ") and str(out / "engine.log") in p.stderr
    assert (out / "engine.log").exists()
    if jvm_archive.java_options("driver"):  # built (make setup): both JVMs use them
        for role, log in loads.items():  # (measured: 72-73%; an archive of the wrong
            text = log.read_text()  # JVM is mapped too, but supplies only 45%)
            archived = text.count("source: shared objects file (top)")
            assert archived > 0.6 * text.count("\n"), (role, archived, text.count("\n"))
    assert sorted(f.name for f in out.iterdir()) == [
        "engine.log", "report.json", "report.png", "result.parquet", "timeseries.csv"]
    report = json.loads((out / "report.json").read_text())
    _check_phases(report, in_session=False)
    ph = report["phases"]
    assert ph["final"] is True and ph["startup"] > 0, ph
    parts = ph["finish_parts"]  # the plot is drawn while Spark and Ray shut down
    assert {"outputs", "plot", "shutdown"} <= set(parts), ph
    assert parts["outputs"] + max(parts["plot"], parts["shutdown"]) <= ph["finish"] + 1e-2, ph
    steps = ph["input_parts"]  # where the input phase went, step by step
    assert set(steps) == {"plan", "first_block", "workers", "sources"}, ph
    assert sum(steps.values()) <= ph["input"] + 1e-2, ph
    # the summary shows them: the one printed before the plot, then the last line
    assert "first message at" in p.stdout and "phase: stream" in p.stdout
    assert p.stdout.splitlines()[-1].startswith("finish "), p.stdout[-500:]
    assert report["messages"]["input"] == report["messages"]["processed"] == 20000
