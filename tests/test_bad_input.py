"""Bad input, table-driven, through every entry point (issue 5, "Bad input").

Every case runs through ``runtime.run --check``, ``runtime.run``,
``runtime.simulate``, ``runtime.compare --engine sim`` and ``runtime.compare
--engine ray``: exit code 2, exactly one line on stderr (``error: <field>:
<problem> (got <value>)``), the same line from every tool, and no output
directory left behind. These run in-process (``main(argv)`` under
``run_main``) with the engine start replaced by a failure, so a case that
slipped past validation cannot start Ray; a few real subprocesses check the
process-level contract (exit status, stderr, no traceback).

Data that is odd but legitimate (null keys, integer or float keys, CSV text
such as ``007``) is not an error: see ``test_odd_keys_*`` here and the e2e
tests at the end, which check that the real engine (Spark + Ray) gives the
same result and the same routing as the simulator.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import compare as compare_mod
from runtime import run as run_mod
from runtime import simulate as simulate_mod
from runtime.cli import run_main
from runtime.topology import Topology, TopologyError, load_topology

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- harness


def _no_engine(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("bad input reached the engine (Ray/Spark would start)")


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input must fail before Ray/Spark start: starting them (the entry
    points' ``actors.engine.RayEngine``) is a test failure."""
    monkeypatch.setattr("actors.engine.RayEngine", _no_engine)


TOOLS: dict[str, Callable[[str, Path], list[str]]] = {
    "run --check": lambda t, out: ["run", t, "--check"],
    "run": lambda t, out: ["run", t, "--out", str(out), "--no-progress"],
    "simulate": lambda t, out: ["simulate", t, "--out", str(out), "--no-progress", "--no-plot"],
    "compare sim": lambda t, out: ["compare", t, "--engine", "sim", "--schemes", "kg,sg",
                                   "--out", str(out), "--no-progress"],
    "compare ray": lambda t, out: ["compare", t, "--engine", "ray", "--schemes", "kg,pkg",
                                   "--out", str(out), "--no-progress"],
}
MAINS = {"run": run_mod.main, "simulate": simulate_mod.main, "compare": compare_mod.main}


def call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run a tool's main in-process the way ``python -m`` does: (exit code, stdout, stderr)."""
    main = MAINS[argv[0]]
    with pytest.raises(SystemExit) as e:
        run_main(lambda: main(argv[1:]))
    cap = capsys.readouterr()
    return int(e.value.code or 0), cap.out, cap.err


def assert_bad(tool: str, topo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
               expected: str, *extra: str) -> str:
    out = tmp_path / f"out-{tool.replace(' ', '-')}"
    argv = TOOLS[tool](str(topo), out) + list(extra)
    code, stdout, stderr = call(argv, capsys)
    lines = stderr.strip().splitlines()
    assert code == 2, (tool, code, stdout, stderr)
    assert len(lines) == 1, (tool, stderr)
    assert lines[0].startswith("error: "), lines
    assert expected in lines[0], (tool, lines[0], expected)
    # nothing half-written: no output directory, no staging directory
    assert not out.exists(), f"{tool} left {out}"
    assert not list(tmp_path.glob(f".{out.name}*")), f"{tool} left a staging directory"
    return lines[0]


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# --------------------------------------------------------------------------- topology cases

#: (case, YAML text, the exact error line without "error: " - or its beginning
#: for the cases in PREFIX_CASES; malformed YAML: after the file's path)
TOPOLOGY_CASES = [
    ("malformed-yaml", "workers: [1, 2\n", "malformed YAML at line 2, column 1"),
    ("tab-indent", "workers:\n\tcount: 2\n", "malformed YAML at line 2, column 1"),
    ("field-given-twice", "workers:\n  count: 2\n  count: 3\n",
     "malformed YAML at line 3, column 3: field 'count' given twice"),
    ("not-a-mapping", "- workers\n- grouping\n",
     "topology: expected a mapping of fields (got list)"),
    ("unknown-section", "wrkers: {count: 2}\n", "wrkers: unknown field, did you mean 'workers'?"),
    ("misspelled-field", "workers: {cuont: 2}\n",
     "workers.cuont: unknown field, did you mean 'count'?"),
    ("misspelled-nested", "workers:\n  changes: [{at_s: 1, worker: 0, capacty: 0.5}]\n",
     "workers.changes.0.capacty: unknown field, did you mean 'capacity'?"),
    ("misspelled-param", "grouping: {scheme: cg, virtual_per_workr: 4}\n",
     "grouping.virtual_per_workr: unknown parameter for scheme "),
    ("wrong-type-count", "workers: {count: eight}\n",
     "workers.count: expected a whole number (got 'eight')"),
    ("wrong-type-float-count", "workers: {count: 2.5}\n",
     "workers.count: expected a whole number (got 2.5)"),
    ("wrong-type-section", "workers: 8\n", "workers: expected a mapping of fields (got 8)"),
    ("wrong-type-list", "faults: {at_s: 1, kill: worker-0}\n",
     "faults: expected a list (got {'at_s': 1, 'kill': 'worker-0'})"),
    ("wrong-type-capacity", "workers: {count: 2, capacity: [1, fast]}\n",
     "workers.capacity.1: expected a number (got 'fast')"),
    ("wrong-type-capacity-text", "workers: {capacity: fast}\n",
     "workers.capacity: expected a number or a list of numbers (got 'fast')"),
    ("capacity-zero", "workers: {capacity: 0}\n",
     "workers.capacity: every capacity must be > 0 and finite (got 0)"),
    ("capacity-negative", "workers: {count: 2, capacity: [1, -0.5]}\n",
     "workers.capacity.1: every capacity must be > 0 and finite (got -0.5)"),
    ("capacity-nan", "workers: {capacity: .nan}\n",
     "workers.capacity: every capacity must be > 0 and finite (got nan)"),
    ("capacity-empty", "workers: {capacity: []}\n", "workers.capacity: must not be empty (got [])"),
    ("more-capacities-than-workers", "workers: {count: 2, capacity: [1, 1, 0.5]}\n",
     "workers.capacity: 3 values for workers.count=2 (give one value or exactly 2)"),
    ("capacity-above-1", "workers: {capacity: 2}\n",
     "workers.capacity: 2.0 > 1 needs workers.throttle=service"),
    ("change-capacity-zero", "workers: {changes: [{at_s: 1, worker: 0, capacity: 0}]}\n",
     "workers.changes.0.capacity: must be > 0.0 (got 0)"),
    ("unknown-scheme", "grouping: {scheme: pck}\n",
     "grouping.scheme: unknown scheme 'pck', did you mean 'pkg'? (known: acg, cg, ch, chbl, "
     "dalton, dchoices, fish, gedik, kg, pkg, porc, potc, sg, wchoices, wrr)"),
    ("scheme-wrong-case", "grouping: {scheme: KG}\n",
     "grouping.scheme: unknown scheme 'KG', did you mean 'kg'?"),
    ("bad-param-value", "grouping: {scheme: cg, eps: -1}\n",
     "grouping.eps: must be in [0, 10.0] (got -1)"),
    ("bad-param-type", "grouping: {scheme: fish, epoch: soon}\n",
     "grouping.epoch: must be an int in [1, 1000000000] (got 'soon')"),
    ("unknown-format", "input: {format: parket, path: x.parquet}\n",
     "input.format: must be one of parquet, csv, json, zipf, evolving-zipf (got 'parket'), "
     "did you mean 'parquet'?"),
    ("missing-path", "input: {format: csv}\n", "input.path: required for format 'csv'"),
    ("negative-skew", "input: {skew: -1}\n", "input.skew: must be >= 0.0 (got -1)"),
    ("infinite-rate", "run: {rate: .inf}\n", "run.rate: must be a finite number (got inf)"),
    ("batch-zero", "run: {batch: 0}\n", "run.batch: must be >= 1 (got 0)"),
    ("too-many-workers", "workers: {count: 1000000}\n",
     "workers.count: must be <= 10000 (got 1000000)"),
    ("bad-name", "name: runs/x\n",
     "name: must be a non-empty name without '/' or control characters (got 'runs/x')"),
    ("unknown-app", "app: {kind: wordcont}\n",
     "app.kind: must be one of wordcount, naive-bayes, heavy-hitters, aggregate, operator "
     "(got 'wordcont'), did you mean 'wordcount'?"),
    ("unknown-throttle", "workers: {throttle: cpu}\n",
     "workers.throttle: must be one of duty-cycle, cpulimit, service (got 'cpu'), "
     "did you mean 'cpulimit'?"),
    ("fault-unknown-worker", "faults: [{at_s: 1, kill: worker-9}]\n",
     "faults.0.kill: 'worker-9' does not exist (workers: 4)"),
    ("missing-field", "faults: [{at_s: 1}]\n", "faults.0.kill: required field is missing"),
    ("fault-two-triggers", "faults: [{at_s: 1, after_messages: 500, kill: worker-1}]\n",
     "faults.0: give exactly one of at_s or after_messages (got at_s=1.0, after_messages=500)"),
    ("capacity-change-by-count",
     "workers: {changes: [{after_messages: 100, worker: 0, capacity: 0.5}]}\n",
     "workers.changes.0: a capacity change comes at a time (at_s), not after a count of "
     "messages (after_messages is for faults, add and remove) "
     "(got {'after_messages': 100, 'worker': 0, 'capacity': 0.5})"),
    ("change-no-trigger", "workers: {changes: [{add: 1}]}\n",
     "workers.changes.0: give exactly one of at_s or after_messages "
     "(got at_s=None, after_messages=None)"),
    ("non-text-field-name", "1: 2\n", "1: field names must be text (got 1)"),
    ("missing-input-file", "input: {format: parquet, path: nowhere.parquet}\n",
     "input.path: file not found (got 'nowhere.parquet')"),
]


#: cases whose error line goes on after the expected text (a list of the
#: scheme's parameters or of the known schemes, the throttle mode's reason)
PREFIX_CASES = {"misspelled-param", "capacity-above-1", "scheme-wrong-case"}

#: compare sets grouping.scheme itself (--schemes): the file's scheme and its
#: parameters are not used, so these are not errors there
SCHEME_CASES = {"unknown-scheme", "scheme-wrong-case", "bad-param-value", "bad-param-type"}


#: every tool x case, except the scheme cases for compare (a bad --schemes is
#: test_compare_schemes_typo)
BAD_TOPOLOGY_PARAMS = [
    pytest.param(tool, *c, id=f"{c[0]}-{tool}") for c in TOPOLOGY_CASES for tool in TOOLS
    if not (tool.startswith("compare") and c[0] in SCHEME_CASES)]


@pytest.mark.parametrize("tool, case, text, expected", BAD_TOPOLOGY_PARAMS)
def test_bad_topology(tool: str, case: str, text: str, expected: str, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    topo = write(tmp_path, text)
    line = assert_bad(tool, topo, tmp_path, capsys, expected)
    if "malformed YAML" in expected:  # the file's path, then the parser's own words
        assert line.startswith(f"error: {topo}: {expected}"), line
    elif case in PREFIX_CASES:
        assert line.startswith(f"error: {expected}"), line
    else:
        assert line == f"error: {expected}", line


@pytest.mark.parametrize("tool", ["run --check", "simulate"])
def test_bad_override(tool: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = write(tmp_path, "name: x\n")
    assert_bad(tool, topo, tmp_path, capsys,
               "workers.count: expected a whole number (got 'many')",
               "--set", "workers.count=many")
    assert_bad(tool, topo, tmp_path, capsys,
               "grouping.scheme: unknown scheme 'pkgg', did you mean 'pkg'?",
               "--set", "grouping.scheme=pkgg")
    assert_bad(tool, topo, tmp_path, capsys, "--set: expected key.path=value (got 'workers')",
               "--set", "workers")


def test_compare_schemes_typo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = write(tmp_path, "name: x\n")
    for engine in ("sim", "ray"):
        assert_bad("compare " + engine, topo, tmp_path, capsys,
                   "--schemes: unknown scheme 'fsh', did you mean 'fish'? (known: ",
                   "--schemes", "kg,fsh")


@pytest.mark.parametrize("tool", ["run", "compare ray"])
@pytest.mark.parametrize("address, expected", [
    ("nohost", "error: --address: expected HOST:PORT of the Ray head, or auto (got 'nohost')"),
    ("h:99999", "error: --address: expected HOST:PORT of the Ray head, or auto (got 'h:99999')"),
    ("127.0.0.1:1", "error: --address: no Ray cluster answers at '127.0.0.1:1' "
                    "(Connection refused)"),
])
def test_bad_address(tool: str, address: str, expected: str, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:
    """Ray itself retries an unreachable head for minutes: refuse it at once."""
    topo = write(tmp_path, "input: {format: zipf, messages: 100}\n")
    assert assert_bad(tool, topo, tmp_path, capsys, expected, "--address", address) == expected


def test_topology_file_missing_or_unreadable(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    for tool in TOOLS:
        assert_bad(tool, tmp_path / "absent.yaml", tmp_path, capsys,
                   "absent.yaml: topology file not found")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_bad("run --check", binary, tmp_path, capsys,
               "bin.yaml: cannot read topology file (UnicodeDecodeError)")


@pytest.mark.parametrize("tool", ["run", "simulate", "compare sim"])
def test_out_that_cannot_be_a_directory(tool: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` on a file: refused before the run (it used to fail with a
    traceback after the whole run, when the outputs were written)."""
    topo = write(tmp_path, "name: x\ninput: {messages: 1000}\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    for out, why in [(blocker, "not a directory (got"), (blocker / "sub", "is not a directory")]:
        code, _, err = call(TOOLS[tool](str(topo), out), capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "argument --out: " in err and why in err, err
    assert blocker.read_text() == "keep me"


# --------------------------------------------------------------------------- data cases


def _parquet(table: pa.Table) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        pq.write_table(table, d / "in.parquet")
        return d / "in.parquet"
    return make


def _text(name: str, text: str | bytes) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        p = d / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text, encoding="utf-8")
        return p
    return make


#: (case, input file maker, format, extra topology YAML, expected line part)
DATA_CASES = [
    ("parquet-empty-dataset", _parquet(pa.table({"key": pa.array([], pa.string())})), "parquet",
     "", "input.path: no rows in '{path}' (empty dataset)"),
    ("parquet-zero-bytes", _text("in.parquet", b""), "parquet", "",
     "input.path: no rows in '{path}' (empty file)"),
    ("parquet-corrupt", _text("in.parquet", b"PAR1 this is not parquet at all"), "parquet", "",
     "input.path: cannot read '{path}' as parquet ("),
    ("parquet-no-key-column", _parquet(pa.table({"word": ["a", "b"]})), "parquet",
     "", "input.key: no column 'key' in {path} (available: word)"),
    ("parquet-no-label-column", _parquet(pa.table({"key": ["a", "b"]})), "parquet",
     "app: {kind: naive-bayes}\n", "input.label: no column 'label' in {path} (available: key)"),
    ("csv-header-only", _text("in.csv", "key,label\n"), "csv", "",
     "input.path: no rows in '{path}' (empty dataset)"),
    ("csv-zero-bytes", _text("in.csv", ""), "csv", "", "input.path: no rows in '{path}' (empty file)"),
    ("csv-no-key-column", _text("in.csv", "word,n\na,1\n"), "csv", "key: words\n",
     "input.key: no column 'words' in {path} (available: word, n)"),
    ("json-zero-bytes", _text("in.json", ""), "json", "",
     "input.path: no rows in '{path}' (empty file)"),
    ("json-no-key-column", _text("in.json", '{"word": "a"}\n{"word": "b"}\n'), "json", "",
     "input.key: no column 'key' in {path} (available: word)"),
    ("directory-missing", lambda d: d / "nope" / "in.parquet", "parquet", "",
     "input.path: file not found (got '{path}')"),
    ("directory-empty", lambda d: (d / "parts").mkdir() or d / "parts", "parquet", "",
     "input.path: no rows in '{path}' (no data files in the directory)"),
    ("json-directory-empty", lambda d: (d / "parts").mkdir() or d / "parts", "json", "",
     "input.path: no rows in '{path}' (no data files in the directory)"),
]


def _data_topology(tmp_path: Path, maker: Callable[[Path], Path], fmt: str,
                   extra: str) -> tuple[Path, str]:
    data = maker(tmp_path)
    rel = os.path.relpath(data, tmp_path)
    key = f", {extra.strip()}" if extra.startswith("key:") else ""
    text = (f"name: bad-data\ninput: {{format: {fmt}, path: {rel}{key}}}\n"
            f"workers: {{count: 2}}\ngrouping: {{scheme: kg}}\n")
    return write(tmp_path, text + ("" if key else extra)), rel


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("case, maker, fmt, extra, expected", DATA_CASES,
                         ids=[c[0] for c in DATA_CASES])
def test_bad_data(tool: str, case: str, maker: Callable[[Path], Path], fmt: str, extra: str,
                  expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo, rel = _data_topology(tmp_path, maker, fmt, extra)
    assert_bad(tool, topo, tmp_path, capsys, expected.format(path=rel))


#: root reads a file of mode 0 (CAP_DAC_OVERRIDE): as root (CI), each tool runs
#: in a process without that capability (util-linux's setpriv), so the file is
#: as unreadable to it as to any user
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def test_unreadable_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo, rel = _data_topology(tmp_path, _parquet(pa.table({"key": ["a"]})), "parquet", "")
    (tmp_path / rel).chmod(0)
    if os.geteuid() == 0 and (shutil.which("setpriv") is None or subprocess.run(
            [*NO_DAC, "true"], capture_output=True).returncode):
        pytest.skip("root, and setpriv cannot drop CAP_DAC_OVERRIDE here: the file stays "
                    "readable")
    for tool in TOOLS:
        if os.geteuid() != 0:
            assert_bad(tool, topo, tmp_path, capsys, "input.path: ")
            continue
        out = tmp_path / f"out-{tool.replace(' ', '-')}"
        argv = TOOLS[tool](str(topo), out)
        p = subprocess.run([*NO_DAC, sys.executable, "-m", f"runtime.{argv[0]}", *argv[1:]],
                           cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, (tool, p.returncode, p.stderr)
        assert lines[0].startswith("error: input.path: "), (tool, lines[0])
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}*")), tool


def test_simulator_refuses_what_it_cannot_read_like_spark(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A JSON field that is a number in one line and text in another: Spark
    reads it (as text), pyarrow cannot. ``run --check`` lets Spark decide; the
    simulator says so in one line."""
    topo, rel = _data_topology(tmp_path, _text("in.json", '{"key": 5}\n{"key": "a"}\n'),
                               "json", "")
    code, out, _ = call(TOOLS["run --check"](str(topo), tmp_path / "o"), capsys)
    assert code == 0 and out.startswith("ok: ")
    assert_bad("simulate", topo, tmp_path, capsys,
               f"input.path: cannot read '{rel}' as json (JSON parse error: ")


# --------------------------------------------------------------------------- odd keys


ODD = {  # file -> (format, expected wordcount result as {key: count})
    "nulls.parquet": ("parquet", {"a": 2, "b": 1, None: 2}),
    "ints.parquet": ("parquet", {"1": 2, "2": 2, "-5": 1}),
    "floats.parquet": ("parquet", {"1.0": 2, "2.5": 1, "1.0E7": 1, "1.0E-5": 1}),
    "bools.parquet": ("parquet", {"true": 2, "false": 1}),
    "text.csv": ("csv", {"007": 1, "7": 1, None: 2, "x": 1}),
    "ints.json": ("json", {"5": 2, "-1": 1, None: 2}),
}


def make_odd_inputs(d: Path) -> dict[str, Path]:
    pq.write_table(pa.table({"key": ["a", None, "b", None, "a"]}), d / "nulls.parquet")
    pq.write_table(pa.table({"key": pa.array([1, 2, 2, -5, 1], pa.int64())}), d / "ints.parquet")
    pq.write_table(pa.table({"key": [1.0, 2.5, 1e7, 1e-5, 1.0]}), d / "floats.parquet")
    pq.write_table(pa.table({"key": [True, False, True]}), d / "bools.parquet")
    # an empty field, quoted or not, is null (Spark's CSV defaults); a blank
    # line is no row
    (d / "text.csv").write_text('key,n\n007,1\n7,2\n"",3\n,4\nx,5\n\n')
    (d / "ints.json").write_text('{"key": 5}\n{"key": -1}\n{"key": null}\n{"other": 1}\n'
                                 '{"key": 5}\n')
    return {name: d / name for name in ODD}


def odd_topology(d: Path, name: str, scheme: str = "kg") -> Path:
    fmt = ODD[name][0]
    return write(d, f"name: odd-{name.replace('.', '-')}\ninput: {{format: {fmt}, path: {name}}}\n"
                    f"workers: {{count: 3, service_us: 0}}\ngrouping: {{scheme: {scheme}}}\n",
                 f"t-{name}.yaml")


def result_dict(out: Path) -> dict[Any, int]:
    return {r["key"]: r["count"] for r in pq.read_table(out / "result.parquet").to_pylist()}


@pytest.mark.parametrize("name", list(ODD))
def test_odd_keys_in_the_simulator(name: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Null, integer, float, boolean and CSV-text keys: a documented result,
    keys as strings the way Spark prints them, nothing dropped."""
    make_odd_inputs(tmp_path)
    topo = odd_topology(tmp_path, name)
    code, _, err = call(["run", str(topo), "--check"], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    code, _, err = call(TOOLS["simulate"](str(topo), out), capsys)
    assert code == 0, err
    assert result_dict(out) == ODD[name][1]
    assert pq.read_schema(out / "result.parquet").field("key").type == pa.string()
    report = json.loads((out / "report.json").read_text())
    assert report["messages"]["input"] == report["messages"]["processed"] == sum(
        ODD[name][1].values())


def test_naive_bayes_labels_like_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Labels are cast to int64 as Spark's CAST(label AS BIGINT); rows whose label
    is null or not a number are dropped; none left is an error."""
    (tmp_path / "nb.csv").write_text("key,label\na,1\nb,x\nc,\nd,2.7\na,1\n")
    topo = write(tmp_path, "input: {format: csv, path: nb.csv}\nworkers: {count: 2}\n"
                           "grouping: {scheme: kg}\napp: {kind: naive-bayes}\n")
    out = tmp_path / "out"
    code, _, err = call(TOOLS["simulate"](str(topo), out), capsys)
    assert code == 0, err
    rows = pq.read_table(out / "result.parquet").to_pylist()
    assert [(r["key"], r["label"], r["count"]) for r in rows] == [("a", 1, 2), ("d", 2, 1)]
    (tmp_path / "nb.csv").write_text("key,label\na,x\nb,\n")
    assert_bad("simulate", topo, tmp_path, capsys,
               "input.path: no rows with a label in 'nb.csv' (empty dataset)")


def test_integer_keys_route_as_their_string(tmp_path: Path) -> None:
    """An integer key routes like its decimal string in both engines (the real
    runtime hashes what Spark's CAST(key AS STRING) gives)."""
    from runtime.hashing import hash_keys
    from runtime.sim.inputs import load_input
    from runtime.topology import load_topology

    make_odd_inputs(tmp_path)
    inp = load_input(load_topology(odd_topology(tmp_path, "ints.parquet")))
    assert inp.keys.to_pylist() == ["1", "2", "-5"]
    assert inp.key_hashes.tolist() == hash_keys(["1", "2", "-5"]).tolist()


# --------------------------------------------------------------------------- atomic outputs


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """report.write_run stages every file and renames the directory at the end:
    a failure half-way (here: the plot) leaves no output and no staging."""
    import pandas as pd

    from runtime.reporting import plots, report
    from runtime.sim import simulate

    rep = simulate({"name": "t", "input": {"format": "zipf", "messages": 1000, "keys": 10}}).report

    def boom(*a: Any, **k: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(plots, "plot_run", boom)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError):
        report.write_run(out, rep, pd.DataFrame({"t_s": [0.0]}), pa.table({"key": ["a"]}))
    assert list(tmp_path.iterdir()) == []
    report.write_run(out, rep, pd.DataFrame({"t_s": [0.0]}), pa.table({"key": ["a"]}),
                     plot=False)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "result.parquet",
                                                     "timeseries.csv"]
    # an existing empty --out is replaced in one rename; a failure leaves it empty
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuntimeError):
        report.write_run(empty, rep, pd.DataFrame({"t_s": [0.0]}), pa.table({"key": ["a"]}))
    assert list(empty.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "empty", "run"]
    report.write_run(empty, rep, pd.DataFrame({"t_s": [0.0]}), pa.table({"key": ["a"]}),
                     plot=False)
    assert len(list(empty.iterdir())) == 3


# --------------------------------------------------------------------------- real processes


def _proc(module: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


TYPO = ("input: {format: csv, path: in.csv}\nworkers: {cnt: 2}\n",
        "error: workers.cnt: unknown field, did you mean 'count'?")
NO_KEY = ("input: {format: csv, path: in.csv}\nworkers: {count: 2}\n",
          "error: input.key: no column 'key' in in.csv (available: word)")


@pytest.mark.parametrize("module, extra, case", [
    ("runtime.run", ["--check"], TYPO),
    ("runtime.run", [], NO_KEY),
    ("runtime.simulate", ["--no-progress"], TYPO),
    ("runtime.compare", ["--engine", "ray"], NO_KEY),
], ids=["run-check", "run", "simulate", "compare"])
def test_process_level_contract(module: str, extra: list[str], case: tuple[str, str],
                                tmp_path: Path) -> None:
    """One real process per tool: exit 2, one stderr line, no traceback, no output."""
    (tmp_path / "in.csv").write_text("word\nx\n")
    topo = write(tmp_path, case[0])
    p = _proc(module, str(topo), "--out", str(tmp_path / "out"), *extra)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.splitlines() == [case[1]]
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- fuzzing

SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))
SHIPPED_DOCS = [yaml.safe_load(p.read_text()) for p in SHIPPED]
SHIPPED_TEXTS = [p.read_text() for p in SHIPPED]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a YAML document (mapping keys and list indexes)."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**7),
                     st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                     st.text(max_size=12), st.sampled_from(["kg", "cg", "parquet", "worker-1",
                                                            "1e3", "0x10", "~", "-1", ""]))
_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(st.text(max_size=8) | st.integers(0, 3), c, max_size=3),
                       max_leaves=6)


def _typo(name: str, i: int, how: int) -> str:
    if not name:
        return "x"
    i %= len(name)
    return [name[:i] + name[i + 1:], name[:i] + name[i] + name[i:],
            name[:i] + name[i + 1:i + 2] + name[i:i + 1] + name[i + 2:],
            name.upper(), name + "s"][how % 5]


@st.composite
def mutated_topologies(draw: st.DrawFn) -> dict:
    """A shipped topology with 1-3 random edits: delete a field, replace a value
    (any type), misspell a field name, or add an unknown field."""
    doc = json.loads(json.dumps(draw(st.sampled_from(SHIPPED_DOCS))))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        parent = _get(doc, path[:-1])
        last = path[-1]
        op = draw(st.sampled_from(["delete", "replace", "typo", "add"]))
        if op == "delete":
            del parent[last]
        elif op == "replace":
            parent[last] = draw(_values)
        elif op == "typo" and isinstance(parent, dict) and isinstance(last, str):
            parent[_typo(last, draw(st.integers(0, 50)), draw(st.integers(0, 4)))] = \
                parent.pop(last)
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(_values)
    return doc


def _one_line_or_valid(load: Callable[[], Topology]) -> None:
    try:
        topo = load()
    except TopologyError as e:
        msg = str(e)
        assert msg and "\n" not in msg and len(msg) < 500, msg
        assert "Traceback" not in msg and "pydantic" not in msg.lower(), msg
        return
    assert isinstance(topo, Topology)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_topologies())
def test_fuzz_mutated_shipped_topologies(doc: dict) -> None:
    """Every outcome is a valid Topology or a TopologyError with one line: no
    other exception, whatever the edit."""
    _one_line_or_valid(lambda: load_topology(doc))


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    """A shipped topology file with random text edits: cut, insert, duplicate or
    swap lines, insert YAML punctuation."""
    lines = draw(st.sampled_from(SHIPPED_TEXTS)).splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        op = draw(st.integers(0, 4))
        if op == 0 and lines:
            del lines[i]
        elif op == 1:
            lines.insert(i, draw(st.text(alphabet=" :-[]{}&*!|>'\"#,?%@`\tabk0.1\\", max_size=12)))
        elif op == 2 and lines:
            lines.insert(i, lines[i])
        elif op == 3 and lines:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif lines:
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.text(max_size=3)) + lines[i][pos:]
    return "\n".join(lines) + "\n"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_texts())
def test_fuzz_mutated_topology_files(tmp_path_factory: pytest.TempPathFactory,
                                     text: str) -> None:
    p = tmp_path_factory.mktemp("fz") / "t.yaml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    _one_line_or_valid(lambda: load_topology(p))


def test_fuzzed_files_exit_2_with_one_line(tmp_path: Path) -> None:
    """CLI level: a handful of fuzzed (invalid) files -> exit 2 and exactly the
    loader's line on stderr, from real processes."""
    import random

    rng = random.Random(5)
    found: list[tuple[Path, str]] = []
    junk = [" ", ":", "- ", "[", "{", "'", "&a", "*b", "!!int", "\t", "x", "0"]
    for n in range(500):
        lines = rng.choice(SHIPPED_TEXTS).splitlines()
        i = rng.randrange(len(lines))
        lines[i] = lines[i][:rng.randrange(len(lines[i]) + 1)] + rng.choice(junk)
        p = tmp_path / f"f{n}.yaml"
        p.write_text("\n".join(lines) + "\n")
        try:
            load_topology(p, check_input=True)
        except TopologyError as e:
            if all(str(e).split(":")[0] != f[1].split(":")[0] for f in found):
                found.append((p, str(e)))  # distinct kinds of error
        if len(found) == 4:
            break
    assert len(found) == 4
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    procs = [(subprocess.Popen([sys.executable, "-m", "runtime.run", str(p), "--check"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env),
              msg) for p, msg in found]
    for proc, msg in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (msg, out, err)
        assert err.splitlines() == [f"error: {msg}"], err


_override_keys = st.lists(st.sampled_from(["workers", "count", "capacity", "changes", "0",
                                           "grouping", "scheme", "eps", "input", "path",
                                           "run", "rate", "name", "placement", "worker-0", "x",
                                           ""]), min_size=0, max_size=4).map(".".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SHIPPED), st.lists(st.tuples(_override_keys, st.text(max_size=10)
                                                    | st.sampled_from(["[1, 2]", "{a: 1}",
                                                                       "-1", ".nan", "kg"])),
                                          min_size=1, max_size=3))
def test_fuzz_overrides(path: Path, sets: list[tuple[str, str]]) -> None:
    """``--set key.path=value`` with any key path and any text."""
    _one_line_or_valid(lambda: load_topology(path, [f"{k}={v}" for k, v in sets]))


def test_a_run_directory_has_the_modes_the_umask_gives(tmp_path: Path) -> None:
    """One rule for every output: a finite run's directory as any directory the
    user makes (it was mkdtemp's 0700), a live stream's files as any file."""
    import os
    import stat

    import pandas as pd

    from runtime.reporting import report
    from runtime.sim import simulate

    rep = simulate({"name": "t", "input": {"format": "zipf", "messages": 1000, "keys": 10}}).report
    old = os.umask(0o022)
    try:
        out = report.write_run(tmp_path / "run", rep, pd.DataFrame({"t_s": [0.0]}),
                               pa.table({"key": ["a"]}), plot=False)
        live = report.write_result(tmp_path / "live", pa.table({"key": ["a"]}))
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "report.json").stat().st_mode) == 0o644
    assert stat.S_IMODE(live.stat().st_mode) == 0o644
