"""Apps over records, bad input: every problem ends with one line naming the
field, the right exit code (2 before a run, 1 when the user's operator fails
during one) and nothing written - through the real command lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
WORDS = ROOT / "data" / "gitgit-words-1m.parquet"

BAD_OPERATORS = {
    "nomerge.py": '''
class Op:
    def create(self): return 0
    def add(self, s, b): return s
    def finish(self, s): return None
''',
    "notable.py": '''
class Op:
    def create(self): return 0
    def add(self, s, b): return s + b.num_rows
    def merge(self, a, b): return a + b
    def finish(self, s): return {"rows": s}
''',
    "raises.py": '''
class Op:
    def create(self): return 0
    def add(self, s, b):
        if s + b.num_rows > 5000:
            raise KeyError("no such thing")
        return s + b.num_rows
    def merge(self, a, b): return a + b
    def finish(self, s): return None
''',
    "broken.py": "import does_not_exist_anywhere\nclass Op: pass\n",
    "nonmergeable.py": '''
import pyarrow as pa
class Op:
    mergeable = False
    def create(self): return 0
    def add(self, s, b): return s + b.num_rows
    def merge(self, a, b): return a + b
    def finish(self, s): return pa.table({"n": [s]})
''',
}


def _cli(tool: str, topo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"runtime.{tool}", str(topo), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture
def topo(tmp_path: Path):
    """A topology file in ``tmp_path`` over the bundled words, with ``app``."""
    for name, text in BAD_OPERATORS.items():
        (tmp_path / name).write_text(text)

    strings = tmp_path / "strings.parquet"
    pq.write_table(pa.table({"key": ["a", "b", "a"], "name": ["x", "y", "z"]}), strings)

    def make(app: str, extra: str = "") -> Path:
        data = WORDS
        if extra == "STRINGS":  # an input with a string column besides the key
            data, extra = strings, ""
        path = tmp_path / "t.yaml"
        path.write_text(f"input: {{format: parquet, path: {data}, limit: 20000}}\n"
                        f"workers: {{count: 2, service_us: 0}}\n"
                        f"app: {app}\n{extra}")
        return path
    return make


def _one_line(p: subprocess.CompletedProcess[str], code: int, expected: str) -> None:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    assert len(lines) >= 1 and lines[-1].startswith("error: "), p.stderr[-2000:]
    assert expected in lines[-1], (lines[-1], expected)
    assert "Traceback" not in p.stderr


CHECK_CASES = [
    ("missing-value-column", "{kind: aggregate, value: amount, aggs: [sum]}", "",
     "app.value: no column 'amount' in"),
    ("value-is-the-key", "{kind: aggregate, value: key, aggs: [max]}", "",
     "app.value: 'key' is the routing key"),
    ("non-numeric-sum", "{kind: aggregate, value: name, aggs: [sum, max]}", "STRINGS",
     "app.value: column 'name' is string; sum/mean need numbers"),
    ("unknown-agg", "{kind: aggregate, value: ts, aggs: [sum, avg]}", "",
     "app.aggs: unknown aggregate 'avg'"),
    ("not-importable", "{kind: operator, operator: broken.py:Op}", "",
     "app.operator: broken.py:Op: cannot import"),
    ("no-such-module", "{kind: operator, operator: 'nopkg.ops:Op'}", "",
     "app.operator: nopkg.ops:Op: cannot import module 'nopkg.ops'"),
    ("lacks-merge", "{kind: operator, operator: nomerge.py:Op}", "",
     "app.operator: nomerge.py:Op: "),
    ("not-mergeable-under-pkg", "{kind: operator, operator: nonmergeable.py:Op}",
     "grouping: {scheme: pkg}\n", "not mergeable"),
    ("not-mergeable-with-faults", "{kind: operator, operator: nonmergeable.py:Op}",
     "grouping: {scheme: kg}\nfaults: [{at_s: 1, kill: worker-1}]\n", "move keys"),
    ("bad-params", "{kind: operator, operator: ../../examples/operators/topk.py:TopK, "
     "params: {k: 0}}", "", "ValueError in __init__: k must be an integer >= 1"),
]


@pytest.mark.parametrize(("name", "app", "extra", "expected"), CHECK_CASES,
                         ids=[c[0] for c in CHECK_CASES])
@pytest.mark.parametrize("tool", ["run --check", "simulate"])
def test_bad_app_exits_2_with_one_line(topo, tmp_path, tool, name, app, extra, expected) -> None:
    if "topk.py" in app:  # a path relative to the topology file: point at the repo's example
        app = app.replace("../../examples", str(ROOT / "examples"))
    out = tmp_path / "out"
    cmd, *flags = tool.split()
    p = _cli(cmd, topo(app, extra), *flags, "--out", str(out))
    _one_line(p, 2, expected)
    assert not out.exists()


@pytest.mark.parametrize(("operator", "expected"), [
    ("raises.py:Op", "app.operator: raises.py:Op: KeyError in add: 'no such thing' (at "),
    ("notable.py:Op", "app.operator: notable.py:Op: finish returned dict"),
])
def test_operator_failing_during_a_simulated_run_exits_1_and_writes_nothing(
        topo, tmp_path, operator, expected) -> None:
    out = tmp_path / "out"
    p = _cli("simulate", topo(f"{{kind: operator, operator: {operator}}}"), "--out", str(out),
             "--no-progress")
    _one_line(p, 1, expected)
    assert not out.exists()


def test_non_mergeable_operator_runs_under_kg_with_snapshots(topo, tmp_path) -> None:
    """A worker's successive flushes of a non-mergeable operator are snapshots
    of its whole state: counted once, not once per flush."""
    out = tmp_path / "out"
    p = _cli("simulate", topo("{kind: operator, operator: nonmergeable.py:Op}",
                              "grouping: {scheme: kg}\n"), "--out", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert pq.read_table(out / "result.parquet").to_pylist() == [{"n": 20000}]
