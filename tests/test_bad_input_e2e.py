"""Bad and odd input on the real engine (Spark via RayDP + Ray), issue 5.

Data problems that only Spark can see (it infers a JSON schema from the whole
file) end in the same one-line ``TopologyError`` as the simulator's; odd but
legitimate keys (null, integer, float, boolean, CSV text) give the same
result in Spark's own ``groupBy``, in a real run and in the simulator, and a
key goes to the same worker in both engines (``kg``: per-worker counts equal).
One real ``runtime.run`` process checks the process-level contract for a
problem found by Spark: exit 2, the error as the last stderr line, no
traceback, no output directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_bad_input import ODD, make_odd_inputs, odd_topology

from runtime.sim import simulate
from runtime.topology import TopologyError, load_topology

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent

#: (case, file name, content, app kind, expected start of the error line, the
#: simulator's field: it cannot read a JSON field of mixed types at all)
SPARK_ONLY = [
    ("json-mixed-types-no-key", "in.json", '{"word": 5}\n{"word": "a"}\n', "wordcount",
     "input.key: no column 'key' in in.json (available: word)", "input.path"),
    ("json-malformed-line", "in.json", '{"key": "a"}\nnot json\n{"key": "b"}\n', "wordcount",
     "input.path: malformed json records in 'in.json'", "input.path"),
    ("json-objects-without-fields", "in.json", "{}\n{}\n", "wordcount",
     "input.key: no column 'key' in in.json (available: none)", "input.key"),
    ("csv-no-integer-label", "in.csv", "key,label\na,x\nb,\n", "naive-bayes",
     "input.path: no rows with a label in 'in.csv' (empty dataset)", "input.path"),
]


def _topology(tmp_path: Path, name: str, content: str, kind: str) -> Path:
    (tmp_path / name).write_text(content)
    fmt = name.rsplit(".", 1)[1]
    t = tmp_path / "t.yaml"
    t.write_text(f"input: {{format: {fmt}, path: {name}}}\nworkers: {{count: 2}}\n"
                 f"grouping: {{scheme: kg}}\napp: {{kind: {kind}}}\n")
    return t


@pytest.mark.parametrize("case, name, content, kind, expected, sim_field", SPARK_ONLY,
                         ids=[c[0] for c in SPARK_ONLY])
def test_problems_found_by_spark(ray_spark, tmp_path: Path, case: str, name: str, content: str,
                                 kind: str, expected: str, sim_field: str) -> None:
    from actors.spark_input import build_dataframe
    from runtime.sim.inputs import load_input

    topo = load_topology(_topology(tmp_path, name, content, kind), check_input=True)
    with pytest.raises(TopologyError) as e:
        build_dataframe(ray_spark, topo)
    assert str(e.value).startswith(expected), str(e.value)
    # the simulator refuses the same input, with one line
    with pytest.raises(TopologyError) as s:
        load_input(topo)
    assert str(s.value).split(":")[0] == sim_field, str(s.value)


def test_json_field_of_mixed_types_is_text_in_spark(ray_spark, tmp_path: Path) -> None:
    """What Spark accepts and the simulator cannot read: documented, not an error."""
    from actors.spark_input import build_dataframe

    topo = load_topology(_topology(tmp_path, "in.json", '{"key": 5}\n{"key": "a"}\n',
                                   "wordcount"), check_input=True)
    rows = sorted(r["key"] for r in build_dataframe(ray_spark, topo).collect())
    assert rows == ["5", "a"]


@pytest.mark.parametrize("name", list(ODD))
def test_odd_keys_same_in_spark_ray_and_simulator(ray_spark, tmp_path: Path, name: str) -> None:
    from actors.pipeline import run_pipeline
    from actors.spark_input import build_dataframe, reference_result

    make_odd_inputs(tmp_path)
    topo = load_topology(odd_topology(tmp_path, name), check_input=True)
    df = build_dataframe(ray_spark, topo).cache()
    ref = reference_result(df, "wordcount")
    report = run_pipeline(topo, tmp_path / "ray", ray_spark, progress=False,
                          log=lambda m: None, df=df)
    df.unpersist()
    got = pq.read_table(tmp_path / "ray" / "result.parquet")
    sim = simulate(topo)
    assert got.equals(ref.cast(got.schema)), "run differs from Spark's groupBy"
    assert sim.result.equals(got.cast(sim.result.schema)), "simulator differs from the run"
    assert {r["key"]: r["count"] for r in got.to_pylist()} == ODD[name][1]
    # the same key goes to the same worker in both engines (kg: hash(key) mod n)
    assert ([w["processed"] for w in report["workers"]]
            == [w["processed"] for w in sim.report["workers"]])


def test_run_process_on_a_problem_found_by_spark(tmp_path: Path) -> None:
    """A real ``runtime.run``: Ray and Spark start, Spark finds the problem,
    exit 2, the error is stderr's last line, no traceback, nothing written."""
    t = _topology(tmp_path, "in.json", '{"key": "a"}\nnot json\n', "wordcount")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run([sys.executable, "-m", "runtime.run", str(t), "--out",
                        str(tmp_path / "out"), "--no-progress"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 2, (p.stdout, p.stderr[-3000:])
    lines = p.stderr.strip().splitlines()
    assert lines[-1] == "error: input.path: malformed json records in 'in.json' " \
                        "(lines that are not one JSON object each)", p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def test_key_and_label_casts_match_spark(ray_spark, tmp_path: Path) -> None:
    """The simulator's copies of Spark's CAST(key AS STRING) and CAST(label AS
    BIGINT) (runtime.inputs.input_check) against Spark itself, on the odd values."""
    import datetime

    import pyarrow as pa

    from actors.spark_input import build_dataframe, reference_result

    files = {
        "dates.parquet": pa.table({"key": [datetime.date(2024, 1, 31), None,
                                           datetime.date(1999, 12, 1)]}),
        "f32.parquet": pa.table({"key": pa.array([0.1, 1e7, 2.5, -0.0, 1e-4], pa.float32())}),
        "f64.parquet": pa.table({"key": [float("nan"), float("inf"), -0.0, 123456789.125,
                                         0.001, 1e-3 / 3, -1e21]}),
        "big.parquet": pa.table({"key": pa.array([2**63 - 1, -(2**63), 0], pa.int64())}),
    }
    for name, table in files.items():
        pq.write_table(table, tmp_path / name)
    (tmp_path / "nb.csv").write_text("key,label\na,1\nb, 2 \nc,2.7\nd,x\ne,\nf,-3\ng,+4\n")
    cases = [(n, "wordcount") for n in files] + [("nb.csv", "naive-bayes")]
    for name, kind in cases:
        fmt = name.rsplit(".", 1)[1]
        t = tmp_path / f"{name}.yaml"
        t.write_text(f"input: {{format: {fmt}, path: {name}}}\nworkers: {{count: 2}}\n"
                     f"grouping: {{scheme: kg}}\napp: {{kind: {kind}}}\n")
        topo = load_topology(t, check_input=True)
        ref = reference_result(build_dataframe(ray_spark, topo), kind)
        sim = simulate(topo).result
        assert sim.equals(ref.cast(sim.schema)), (name, sim.to_pylist(), ref.to_pylist())
