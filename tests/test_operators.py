"""runtime.operators: the contract, loading, the built-ins and the Spark reference.

Fast and pure except the ``e2e``-marked Spark reference tests at the end (on
the test session's shared Spark session). The conformance part runs every
built-in operator (and the TopK example, loaded by file path like a user's) through the same
mergeability property: random batches, workers, flush points and merge tree
give the single-worker answer.
"""

from __future__ import annotations

import math
import pickle
import random
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.hashing import hash_arrow
from runtime.operators import (
    AGGS,
    HEAVY_HITTERS_SCHEMA,
    NAIVE_BAYES_SCHEMA,
    WORDCOUNT_SCHEMA,
    Aggregate,
    BoundOperator,
    OperatorError,
    bind,
    builtin_operator,
    check_value_type,
    file_fingerprint,
    load_operator,
    make_operator,
    module_name_for,
    operator_for_app,
    require_mergeable,
    sort_result,
    spark_reference,
    spec_of,
    table_diff,
    tables_equal,
)

ROOT = Path(__file__).resolve().parents[1]
TOPK = str(ROOT / "examples" / "operators" / "topk.py") + ":TopK"
WORDS = ROOT / "data" / "gitgit-words-1m.parquet"

KEYS = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "é", "", "the", "zz"]),
                 st.text(max_size=3))
NAN = float("nan")


# --------------------------------------------------------------------------- drivers


def _with_hash(op: BoundOperator, t: pa.Table) -> pa.Table:
    """The batch columns the runtime ships: key, the columns, key_hash if wanted."""
    cols = ["key", *op.spec.columns]
    t = t.select(cols)
    if op.spec.wants_key_hash:
        t = t.append_column("key_hash", pa.array(hash_arrow(t.column("key")), pa.uint64()))
    return t


def run_single(op: BoundOperator, t: pa.Table) -> pa.Table:
    """One worker, everything in one batch, no flush."""
    batch = _with_hash(op, t).combine_chunks().to_batches()
    state = op.create()
    for b in batch:  # an empty table has no batch
        state = op.add(state, b)
    return op.finish(state)


def run_split(op: BoundOperator, t: pa.Table, cuts: list[int], owners: list[int],
              flush_after: list[bool], rnd: random.Random) -> pa.Table:
    """The runtime's use: batches (cut at ``cuts``) go to worker ``owners[i]``,
    which flushes ``compact(state)`` after batch i when ``flush_after[i]`` and
    starts again from ``create()``; every worker flushes at the end; the
    partials (pickled, as between actors) are merged pairwise in a random
    tree, then ``finish``."""
    t = _with_hash(op, t)
    n_workers = max(owners) + 1
    states = [op.create() for _ in range(n_workers)]
    partials = []
    bounds = [0, *sorted(min(c, t.num_rows) for c in cuts), t.num_rows]
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        w = owners[i % len(owners)]
        part = t.slice(lo, hi - lo)
        if i % 3 == 2:  # a pa.Table (ChunkedArray columns) now and then, empty ones too
            states[w] = op.add(states[w], part)
        for b in part.combine_chunks().to_batches() if i % 3 != 2 else ():
            states[w] = op.add(states[w], b)
        if flush_after[i % len(flush_after)]:
            partials.append(pickle.loads(pickle.dumps(op.compact(states[w]))))
            states[w] = op.create()
    partials += [pickle.loads(pickle.dumps(op.compact(s))) for s in states]
    partials.append(op.create())  # the aggregator's starting total
    while len(partials) > 1:  # random merge tree: associativity + commutativity
        a = partials.pop(rnd.randrange(len(partials)))
        b = partials.pop(rnd.randrange(len(partials)))
        partials.append(op.merge(a, b))
    return op.finish(partials[0])


# --------------------------------------------------------------------------- conformance

DYADIC = st.integers(-4000, 4000).map(lambda i: i / 4)  # sums exact in any order


def _rows(values: st.SearchStrategy, n: int = 200) -> st.SearchStrategy:
    return st.lists(st.tuples(KEYS, values), max_size=n)


def _table(rows: list, vtype: pa.DataType, name: str = "v") -> pa.Table:
    return pa.table({"key": pa.array([k for k, _ in rows], pa.string()),
                     name: pa.array([v for _, v in rows], vtype)})


#: name -> (make the bound operator, rows strategy, value type of the column)
CONFORMANCE = {
    "wordcount": (lambda: builtin_operator("wordcount"), _rows(st.none()), pa.int64()),
    "naive-bayes": (lambda: builtin_operator("naive-bayes", label="v"),
                    _rows(st.integers(0, 3)), pa.int64()),
    "heavy-hitters": (lambda: builtin_operator("heavy-hitters", counters=512, top_k=7),
                      _rows(st.none()), pa.int64()),
    "aggregate-int": (lambda: builtin_operator("aggregate", value="v", aggs=list(AGGS)),
                      _rows(st.one_of(st.none(), st.integers(-10**12, 10**12))), pa.int64()),
    "aggregate-float": (
        lambda: builtin_operator("aggregate", value="v", aggs=["mean", "max", "count", "min",
                                                               "sum"]),
        _rows(st.one_of(st.none(), DYADIC, st.sampled_from([NAN, math.inf, -math.inf]))),
        pa.float64()),
    "aggregate-float32": (lambda: builtin_operator("aggregate", value="v", aggs=["min", "max",
                                                                                 "sum"]),
                          _rows(st.one_of(st.none(), DYADIC, st.just(NAN))), pa.float32()),
    "aggregate-string": (lambda: builtin_operator("aggregate", value="v",
                                                  aggs=["max", "count", "min"]),
                         _rows(st.one_of(st.none(), st.text(max_size=2))), pa.string()),
    "topk-example": (lambda: make_operator(TOPK, ROOT, {"column": "v", "k": 3}),
                     _rows(st.one_of(st.none(), st.integers(-5, 5))), pa.int64()),
}


@pytest.mark.parametrize("name", list(CONFORMANCE))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_split_merge_equals_single_worker(name, data) -> None:
    make, rows_st, vtype = CONFORMANCE[name]
    op = make()
    rows = data.draw(rows_st, label="rows")
    cuts = data.draw(st.lists(st.integers(0, len(rows)), max_size=10), label="cuts")
    owners = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=8), label="owners")
    flush = data.draw(st.lists(st.booleans(), min_size=1, max_size=8), label="flush")
    rnd = data.draw(st.randoms(use_true_random=False), label="merge order")
    t = _table(rows, vtype)
    single = run_single(op, t)
    split = run_split(op, t, cuts, owners, flush, rnd)
    assert table_diff(split, single, rel=0.0) is None, table_diff(split, single, rel=0.0)
    assert "\n" not in repr(op.spec)


# --------------------------------------------------------------------------- vs the truth


def _truth(kind: str, t: pa.Table, top_k: int = 10) -> pa.Table:
    """The exact answer, computed directly with pyarrow (no operator code)."""
    if kind == "naive-bayes":
        g = t.group_by(["key", "label"], use_threads=False).aggregate([([], "count_all")])
        g = g.rename_columns(["key", "label", "count"]).select(NAIVE_BAYES_SCHEMA.names)
        return sort_result(g.cast(NAIVE_BAYES_SCHEMA), kind)
    vc = pc.value_counts(t.column("key").combine_chunks())
    counts = pa.table({"key": vc.field(0), "count": vc.field(1)}).cast(WORDCOUNT_SCHEMA)
    if kind == "wordcount":
        return sort_result(counts, kind)
    top = sort_result(counts, "heavy-hitters").slice(0, top_k)
    top = top.append_column("error", pa.array([0] * top.num_rows, pa.int64()))
    return sort_result(top.cast(HEAVY_HITTERS_SCHEMA), kind)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(KEYS, st.integers(0, 3)), max_size=300),
       top_k=st.integers(1, 10), rnd=st.randoms(use_true_random=False))
def test_built_ins_equal_the_exact_answer_however_split(rows, top_k, rnd) -> None:
    t = pa.table({"key": pa.array([k for k, _ in rows], pa.string()),
                  "label": pa.array([v for _, v in rows], pa.int64())})
    cuts, owners, flush = [rnd.randrange(len(rows) + 1) for _ in range(5)], [0, 1, 2], [True, False]
    wc = run_split(builtin_operator("wordcount"), t, cuts, owners, flush, rnd)
    assert wc.equals(_truth("wordcount", t))
    nb = run_split(builtin_operator("naive-bayes"), t, cuts, owners, flush, rnd)
    assert nb.equals(_truth("naive-bayes", t))
    hh = run_split(builtin_operator("heavy-hitters", counters=400, top_k=top_k), t, cuts, owners,
                   flush, rnd)
    assert hh.equals(_truth("heavy-hitters", t, top_k))  # counters >= distinct keys: exact


def test_built_ins_equal_the_exact_answer_on_real_words() -> None:
    t = pq.read_table(WORDS).slice(0, 200_000)
    rnd = random.Random(0)
    cuts = list(range(0, t.num_rows, 1000))
    owners, flush = [0, 1, 2, 3], [False] * 9 + [True]
    wc = run_split(builtin_operator("wordcount"), t, cuts, owners, flush, rnd)
    assert wc.equals(_truth("wordcount", t))
    hh = run_split(builtin_operator("heavy-hitters", counters=20_000, top_k=100), t, cuts, owners,
                   flush, rnd)
    assert hh.equals(_truth("heavy-hitters", t, 100))
    assert hh.column("error").to_pylist() == [0] * 100


def test_heavy_hitters_bounds_under_eviction_with_weighted_merges() -> None:
    """Few counters, a skewed stream over many keys: every reported count
    brackets the truth and the clear heavy hitters come first, in order."""
    rng = np.random.default_rng(3)
    keys = (rng.zipf(1.3, 60_000) % 3000).astype(str)
    truth = Counter(keys.tolist())
    t = pa.table({"key": pa.array(keys, pa.string())})
    op = builtin_operator("heavy-hitters", counters=50, top_k=10, )
    got = run_split(op, t, list(range(0, 60_000, 700)), [0, 1, 2, 3, 4],
                    [False, True, False], random.Random(1)).to_pylist()
    assert len(got) == 10
    for row in got:
        assert row["count"] - row["error"] <= truth[row["key"]] <= row["count"], row
    true_top = [k for k, _ in sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]
    assert [r["key"] for r in got[:3]] == true_top


def test_wordcount_bounds_its_buffer_and_takes_other_string_types() -> None:
    from runtime.operators.tables import COMPACT_ROWS

    op = builtin_operator("wordcount")
    s = op.create()
    big = pa.record_batch({"key": pa.array(["x"] * 1000)})
    for _ in range(COMPACT_ROWS // 1000 + 2):
        s = op.add(s, big)
    assert s.raw_rows < COMPACT_ROWS and s.table_rows == 1  # folded once past the bound
    s = op.add(s, pa.record_batch({"key": pa.array(["y", None], pa.large_string())}))
    got = op.finish(s).to_pydict()
    assert got == {"key": ["x", "y", None], "count": [(COMPACT_ROWS // 1000 + 2) * 1000, 1, 1]}


# --------------------------------------------------------------------------- aggregate semantics


def _agg(rows: list, vtype: pa.DataType, aggs=AGGS) -> dict:
    op = builtin_operator("aggregate", value="v", aggs=list(aggs))
    return run_single(op, _table(rows, vtype)).to_pydict()


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (isinstance(x, float) and isinstance(y, float)
                                      and math.isnan(x) and math.isnan(y)) or x == y
        for x, y in zip(a, b, strict=True))


def test_aggregate_ints_nulls_all_null_key_and_null_key() -> None:
    rows = [("a", 5), ("a", None), ("a", -2), ("b", None), ("b", None), (None, 7), ("c", 3)]
    got = _agg(rows, pa.int64())
    assert got == {"key": ["a", "b", "c", None], "count": [3, 2, 1, 1],
                   "sum": [3, None, 3, 7], "min": [-2, None, 3, 7], "max": [5, None, 3, 7],
                   "mean": [1.5, None, 3.0, 7.0]}
    op = builtin_operator("aggregate", value="v", aggs=["mean", "count"])
    t = run_single(op, _table(rows, pa.int32()))
    assert t.column_names == ["key", "mean", "count"]
    assert t.schema.field("mean").type == pa.float64()


def test_aggregate_integer_types_sum_to_int64_min_max_keep_the_type() -> None:
    for vtype in (pa.int8(), pa.int16(), pa.uint8(), pa.uint32()):
        t = run_single(builtin_operator("aggregate", value="v", aggs=["sum", "min", "max"]),
                       _table([("a", 100), ("a", 100), ("a", 27)], vtype))
        assert t.schema.field("sum").type == pa.int64(), vtype
        assert t.schema.field("min").type == vtype and t.schema.field("max").type == vtype
        assert t.to_pydict() == {"key": ["a"], "sum": [227], "min": [27], "max": [100]}


def test_aggregate_nan_follows_spark() -> None:
    """Spark: NaN is larger than every other value (max NaN if any, min NaN
    only if all non-null are NaN) and propagates through sum and avg."""
    rows = [("a", 1.0), ("a", NAN), ("a", -3.0), ("b", NAN), ("b", None), ("c", None),
            ("d", math.inf), ("d", 2.0), ("e", math.inf), ("e", -math.inf)]
    got = _agg(rows, pa.float64())
    assert got["key"] == ["a", "b", "c", "d", "e"]
    assert _same(got["count"], [3, 2, 1, 2, 2])
    assert _same(got["min"], [-3.0, NAN, None, 2.0, -math.inf])
    assert _same(got["max"], [NAN, NAN, None, math.inf, math.inf])
    assert _same(got["sum"], [NAN, NAN, None, math.inf, NAN])
    assert _same(got["mean"], [NAN, NAN, None, math.inf, NAN])


def test_aggregate_float32_keeps_min_max_type_and_sums_in_float64() -> None:
    rows = [("a", 0.1), ("a", 0.2), ("a", None), ("b", NAN)]
    t = run_single(builtin_operator("aggregate", value="v", aggs=list(AGGS)),
                   _table(rows, pa.float32()))
    assert [f.type for f in t.schema] == [pa.string(), pa.int64(), pa.float64(), pa.float32(),
                                         pa.float32(), pa.float64()]
    f01, f02 = float(np.float32(0.1)), float(np.float32(0.2))
    got = t.to_pydict()
    assert got["sum"][0] == f01 + f02  # each float32 value widened, then summed in float64
    assert got["min"][0] == f01 and got["max"][0] == f02
    assert got["mean"][0] == (f01 + f02) / 2
    assert _same([got["min"][1], got["max"][1], got["sum"][1]], [NAN, NAN, NAN])


def test_aggregate_strings_and_timestamps_min_max() -> None:
    got = _agg([("a", "b"), ("a", "ab"), ("a", "é"), ("a", None)], pa.string(),
               ["min", "max", "count"])
    assert got == {"key": ["a"], "min": ["ab"], "max": ["é"], "count": [4]}
    ts = pa.timestamp("us")
    t = run_single(builtin_operator("aggregate", value="v", aggs=["max"]),
                   _table([("a", 5), ("a", 9)], ts))
    assert t.schema.field("max").type == ts and t.column("max").cast(pa.int64()).to_pylist() == [9]


def test_aggregate_empty_input() -> None:
    op = builtin_operator("aggregate", value="v", aggs=["sum", "min", "count"])
    t = run_single(op, _table([], pa.int32()))
    assert t.num_rows == 0 and t.column_names == ["key", "sum", "min", "count"]
    assert t.schema.field("sum").type == pa.float64()  # type unknown: float64 assumed
    typed = Aggregate("v", ["sum", "min"], value_type=pa.int32())
    assert typed.result_schema() == pa.schema([("key", pa.string()), ("sum", pa.int64()),
                                               ("min", pa.int32())])
    assert bind(typed).finish(typed.create()).schema == typed.result_schema()


@pytest.mark.parametrize("kwargs, message", [
    ({"value": "v", "aggs": []}, "app.aggs: empty; list any of count, sum, min, max, mean"),
    ({"value": "v", "aggs": ["sum", "avg"]},
     "app.aggs: unknown aggregate 'avg' (known: count, sum, min, max, mean); did you mean 'mean'?"),
    ({"value": "v", "aggs": ["mx"]}, "did you mean 'max'?"),
    ({"value": "v", "aggs": ["sum", "min", "sum"]}, "app.aggs: 'sum' listed twice"),
    ({"value": "v", "aggs": "sum"}, "app.aggs: must be a list"),
    ({"value": "", "aggs": ["sum"]}, "app.value: must be a column name"),
    ({"value": "key", "aggs": ["sum"]}, "app.value: 'key' is the routing key"),
    ({"value": "v", "aggs": ["sum"], "value_type": pa.string()},
     "app.value: column 'v' is string; sum/mean need numbers"),
])
def test_aggregate_validation_is_one_line(kwargs, message) -> None:
    with pytest.raises(ValueError) as e:
        Aggregate(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_check_value_type() -> None:
    for t in (pa.string(), pa.bool_(), pa.timestamp("us"), pa.date32()):
        with pytest.raises(ValueError) as e:
            check_value_type(t, ["count", "mean"], "amount")
        assert str(e.value) == f"app.value: column 'amount' is {t}; sum/mean need numbers"
        check_value_type(t, ["count", "min", "max"], "amount")  # orderable: fine
    with pytest.raises(ValueError, match="decimals are not supported"):
        check_value_type(pa.decimal128(10, 2), ["sum"], "x")
    with pytest.raises(ValueError, match="is uint64"):
        check_value_type(pa.uint64(), ["mean"], "x")
    with pytest.raises(ValueError, match="min/max need an orderable type"):
        check_value_type(pa.list_(pa.int64()), ["max"], "x")
    for t in (pa.int8(), pa.uint32(), pa.float32(), pa.float64()):
        check_value_type(t, AGGS, "x")
    check_value_type(pa.decimal128(10, 2), ["min", "max", "count"], "x")


def test_aggregate_refuses_a_bad_column_at_the_first_batch() -> None:
    op = builtin_operator("aggregate", value="v", aggs=["sum"])
    s = op.add(op.create(), _table([("a", "x")], pa.string()).to_batches()[0])
    with pytest.raises(OperatorError) as e:
        op.compact(s)
    assert str(e.value) == ("app.kind: aggregate: ValueError in compact: app.value: column 'v' "
                            "is string; sum/mean need numbers")


# --------------------------------------------------------------------------- loading


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """
    import pyarrow as pa

    class Rows:
        def __init__(self, scale=1):
            self.scale = scale
        def create(self):
            return Box(0)
        def add(self, state, batch):
            state.n += batch.num_rows * self.scale
            return state
        def merge(self, a, b):
            return Box(a.n + b.n)
        def finish(self, state):
            return pa.table({"rows": [state.n]})

    class Box:
        def __init__(self, n):
            self.n = n

    def helper():
        pass

    class Half:
        def create(self):
            return 0
        def add(self, s, b):
            return s
"""


def _load_error(spec: str, base: Path | str = ".") -> str:
    with pytest.raises(OperatorError) as e:
        load_operator(spec, base)
    msg = str(e.value)
    assert "\n" not in msg and spec in msg and msg.startswith("app.operator: "), msg
    return msg


def test_load_by_file_path_relative_and_absolute(tmp_path) -> None:
    p = _write(tmp_path, "ops.py", GOOD)
    cls = load_operator("ops.py:Rows", tmp_path)
    assert cls is load_operator(f"{p}:Rows", "/")  # same file: same module, same class
    assert cls.__module__ == module_name_for(p) == module_name_for(tmp_path / "." / "ops.py")
    assert module_name_for(p) != module_name_for(tmp_path / "other" / "ops.py")
    op = make_operator("ops.py:Rows", tmp_path, {"scale": 2})
    s = op.add(op.create(), pa.record_batch({"key": pa.array(["a", "b"])}))
    assert op.finish(op.merge(op.create(), s)).to_pydict() == {"rows": [4]}
    assert op.spec.columns == () and op.spec.mergeable and not op.spec.has_compact


def test_a_file_operators_fingerprint_is_its_path_and_its_bytes(tmp_path) -> None:
    """What ``actors.pool`` keys a user's operator's processes by: the same
    file, unchanged, by any spelling; another file or changed bytes differ;
    a module spec, or a file that cannot be read, has none (never reused)."""
    p = _write(tmp_path, "ops.py", GOOD)
    first = file_fingerprint("ops.py:Rows", tmp_path)
    assert first is not None and first == file_fingerprint(f"{p}:Rows", "/")
    assert first == file_fingerprint("./ops.py:Other", tmp_path)  # the file, not the class
    (tmp_path / "other").mkdir()
    q = _write(tmp_path / "other", "ops.py", GOOD)
    assert file_fingerprint(f"{q}:Rows") != first
    _write(tmp_path, "ops.py", GOOD + "# edited\n")
    assert file_fingerprint("ops.py:Rows", tmp_path) not in (None, first)
    assert file_fingerprint("json:JSONDecoder") is None
    assert file_fingerprint("gone.py:Rows", tmp_path) is None
    assert file_fingerprint("no colon", tmp_path) is None


def test_load_by_module_from_base_dir(tmp_path) -> None:
    pkg = tmp_path / "mypkg_ops_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _write(pkg, "ops.py", GOOD)
    assert load_operator("mypkg_ops_test.ops:Rows", tmp_path).__name__ == "Rows"


def test_loading_errors_are_one_line_and_name_the_spec(tmp_path) -> None:
    _write(tmp_path, "ops.py", GOOD)
    _write(tmp_path, "bad.py", "x = 1\ndef f(:\n    pass\n")
    _write(tmp_path, "boom.py", "raise RuntimeError('no db\\nhere')\n")
    flag = "\nclass Flag(Rows):\n    mergeable = 'yes'\n"
    _write(tmp_path, "flags.py", textwrap.dedent(GOOD) + flag)
    _write(tmp_path, "imp.py", "import no_such_module_xyz\n")
    assert "expected 'module.path:ClassName' or 'path/to/file.py:ClassName'" in _load_error(
        "ops.py", tmp_path)
    assert f"file not found: {tmp_path / 'missing.py'}" in _load_error("missing.py:X", tmp_path)
    assert "No module named 'no_such_module_xyz'" in _load_error("no_such_module_xyz.sub:X")
    assert "No module named 'no_such_module_xyz'" in _load_error("imp.py:X", tmp_path)
    assert f"syntax error in {tmp_path / 'bad.py'}:2" in _load_error("bad.py:X", tmp_path)
    assert "RuntimeError: no db\\nhere" in _load_error("boom.py:X", tmp_path)
    assert "no 'Rowz' in" in (m := _load_error("ops.py:Rowz", tmp_path))
    assert "did you mean 'Rows'?" in m
    assert "classes there: Box, Half, Rows" in _load_error("ops.py:Zzzzzz", tmp_path)
    assert "'helper' is a function, not a class" in _load_error("ops.py:helper", tmp_path)
    assert "class Half lacks method(s) merge, finish" in _load_error("ops.py:Half", tmp_path)
    assert "Flag.mergeable must be True or False (got str 'yes')" in _load_error(
        "flags.py:Flag", tmp_path)
    assert "is not a class name" in _load_error("ops.py:1x", tmp_path)
    assert f"not a file: {tmp_path}" in _load_error(f"{tmp_path}:Rows")  # a directory
    (tmp_path / "notes.txt").write_text("")
    assert "not a .py file" in _load_error("./notes.txt:Rows", tmp_path)
    assert "neither a module path" in _load_error("a-b:Rows")


def test_bad_params_are_one_line(tmp_path) -> None:
    _write(tmp_path, "ops.py", GOOD)
    with pytest.raises(OperatorError) as e:
        make_operator("ops.py:Rows", tmp_path, {"scael": 2})
    assert str(e.value) == ("app.operator: ops.py:Rows: bad app.params ['scael']: Rows(): got an "
                            "unexpected keyword argument 'scael'")
    with pytest.raises(OperatorError, match=r"^app.operator: .*topk.py:TopK: ValueError in "
                                            r"__init__: k must be an integer >= 1 \(got 0\)$"):
        make_operator(TOPK, ROOT, {"k": 0})
    _write(tmp_path, "req.py", GOOD.replace("scale=1", "scale"))
    with pytest.raises(OperatorError, match=r"^app.operator: req.py:Rows: bad app.params \[\]: "
                                            r"Rows\(\): missing a required argument: 'scale'$"):
        make_operator("req.py:Rows", tmp_path)
    # a TypeError raised by the constructor's own code is not a parameter problem
    _write(tmp_path, "te.py", GOOD.replace("self.scale = scale", "self.scale = scale + 'x'"))
    with pytest.raises(OperatorError, match=r"^app.operator: te.py:Rows: TypeError in __init__: "
                                            r"unsupported operand"):
        make_operator("te.py:Rows", tmp_path)


def test_states_and_operators_unpickle_in_another_process(tmp_path) -> None:
    """A file-loaded class has a stable module name, and a BoundOperator
    pickles as "load the spec again": another process gets both back."""
    _write(tmp_path, "ops.py", GOOD)
    op = make_operator("ops.py:Rows", tmp_path, {"scale": 3})
    state = op.add(op.create(), pa.record_batch({"key": pa.array(["a"])}))
    blob = tmp_path / "blob.pkl"
    blob.write_bytes(pickle.dumps((op, state)))
    code = ("import pickle, sys; op, s = pickle.loads(open(sys.argv[1], 'rb').read());"
            "print(op.finish(op.merge(op.create(), s)).to_pydict())")
    out = subprocess.run([sys.executable, "-c", code, str(blob)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'rows': [3]}"


# --------------------------------------------------------------------------- the adapter


class Failing:
    """Fails in the method named by ``where``, with a two-line message."""

    def __init__(self, where: str = "add", result=None) -> None:
        self.where, self.result = where, result

    def _maybe(self, name: str) -> None:
        if self.where == name:
            raise KeyError("bad\nthing") if name == "merge" else ValueError("line1\nline2")

    def create(self):
        self._maybe("create")
        return []

    def add(self, state, batch):
        self._maybe("add")
        return None if self.where == "add-none" else state

    def compact(self, state):
        self._maybe("compact")
        return state

    def merge(self, a, b):
        self._maybe("merge")
        return a + b

    def finish(self, state):
        self._maybe("finish")
        return self.result if self.where == "result" else pa.table({"n": [len(state)]})


@pytest.mark.parametrize("where", ["create", "add", "compact", "merge", "finish"])
def test_adapter_turns_exceptions_into_one_line_errors(where) -> None:
    op = bind(Failing(where), name="my/ops.py:Failing")
    batch = pa.record_batch({"key": pa.array(["a"])})
    with pytest.raises(OperatorError) as e:
        s = op.create()
        s = op.compact(op.add(s, batch))
        op.finish(op.merge(s, s))
    msg = str(e.value)
    exc = "KeyError" if where == "merge" else "ValueError"
    text = "'bad\\nthing'" if where == "merge" else "line1\\nline2"
    assert msg.startswith(f"app.operator: my/ops.py:Failing: {exc} in {where}: {text}"), msg
    assert "\n" not in msg and f"(at {__file__}:" in msg  # the user's own line
    assert isinstance(e.value.__cause__, KeyError if where == "merge" else ValueError)


def test_adapter_checks_what_finish_and_add_return() -> None:
    op = bind(Failing("result", result={"n": [1]}), name="x:F")
    with pytest.raises(OperatorError, match=r"^app.operator: x:F: finish returned dict "
                                            r"\{'n': \[1\]\}, expected a pyarrow.Table$"):
        op.finish([])
    rb = pa.record_batch({"n": [1]})
    assert bind(Failing("result", result=rb)).finish([]).equals(pa.table({"n": [1]}))
    op = bind(Failing("add-none"), name="x:F")
    with pytest.raises(OperatorError, match=r"add returned None \(forgot to return the state\?\)"):
        op.add([], pa.record_batch({"key": pa.array(["a"])}))


def test_spec_columns_flags_and_mergeable_check() -> None:
    hh = builtin_operator("heavy-hitters")
    assert hh.spec.wants_key_hash and hh.spec.columns == () and hh.spec.field == "app.kind"
    agg = builtin_operator("aggregate", value="amount", aggs=["sum"])
    assert agg.spec.columns == ("amount",) and agg.spec.has_compact
    assert builtin_operator("naive-bayes").spec.columns == ("label",)
    assert spec_of(Failing(), columns=["x", "y"]).columns == ("x", "y")
    with pytest.raises(OperatorError, match="app.columns: 'key' is reserved"):
        spec_of(Failing(), columns=["key"])
    with pytest.raises(OperatorError, match="listed twice: x"):
        spec_of(Failing(), columns=["x", "x"])

    class Serial(Failing):
        mergeable = False

    s = bind(Serial(), name="ops:Serial").spec
    require_mergeable(s, "kg", splits_keys=False)
    with pytest.raises(OperatorError, match=r"^app.operator: ops:Serial: not mergeable .*'pkg'"):
        require_mergeable(s, "pkg", splits_keys=True)


def test_operator_for_app_sections() -> None:
    assert operator_for_app({"kind": "wordcount", "aggregate_every_s": 1.0, "counters": 1000,
                             "top_k": 100}).spec.name == "wordcount"
    op = operator_for_app({"kind": "heavy-hitters", "counters": 10, "top_k": 3})
    assert (op.op.counters, op.op.top_k) == (10, 3)
    op = operator_for_app({"kind": "operator", "operator": "examples/operators/topk.py:TopK",
                           "columns": ["ts"], "params": {"column": "ts", "k": 2}}, ROOT)
    assert op.spec.columns == ("ts",) and op.op.k == 2
    with pytest.raises(ValueError, match="app.kind: unknown application 'nope'"):
        operator_for_app({"kind": "nope"})
    with pytest.raises(ValueError, match="app.value: required"):
        operator_for_app({"kind": "aggregate"})
    with pytest.raises(ValueError, match="app.counters"):
        builtin_operator("heavy-hitters", counters=0)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['bogus'\]"):
        builtin_operator("wordcount", bogus=1)
    # built-ins pickle (to reach the actors) and keep working
    op2 = pickle.loads(pickle.dumps(builtin_operator("aggregate", value="v", aggs=["sum"])))
    assert op2.finish(op2.create()).column_names == ["key", "sum"]


def test_topk_example_semantics() -> None:
    op = make_operator(TOPK, ROOT, {"column": "ts", "k": 2})
    t = pa.table({"key": ["b", "a", "a", "a", None, "a", "b"],
                  "ts": pa.array([1, 5, None, 5, 3, 2, 7], pa.int64())})
    assert run_single(op, t).to_pydict() == {"key": ["a", "a", "b", "b", None],
                                             "rank": [1, 2, 1, 2, 1], "value": [5, 5, 7, 1, 3]}


# --------------------------------------------------------------------------- table comparison


def test_tables_equal() -> None:
    a = pa.table({"key": ["a", None], "x": pa.array([1.0, NAN]), "n": [1, None]})
    assert tables_equal(a, a)
    b = pa.table({"key": ["a", None], "x": pa.array([1.0 + 1e-12, NAN]), "n": [1, None]})
    assert tables_equal(a, b) and not tables_equal(a, b, rel=0.0)
    c = pa.table({"key": ["a", None], "x": pa.array([1.0, None]), "n": [1, None]})
    assert table_diff(a, c) == "column 'x' row 1 (key None): nan != None"
    d = pa.table({"key": ["a", None], "x": pa.array([1.0, NAN]), "n": [2, None]})
    assert table_diff(a, d) == "column 'n' row 0 (key 'a'): 1 != 2"
    assert table_diff(a, a.select(["key", "n", "x"])).startswith("columns ")
    assert table_diff(a, a.slice(0, 1)) == "2 rows != 1"
    assert "type double != float" in table_diff(a, a.cast(pa.schema(
        [("key", pa.string()), ("x", pa.float32()), ("n", pa.int64())])))
    inf = pa.table({"key": ["a", None], "x": pa.array([math.inf, NAN]), "n": [1, None]})
    assert not tables_equal(a, inf) and tables_equal(inf, inf)


# --------------------------------------------------------------------------- Spark reference (e2e)


@pytest.fixture
def spark(ray_spark):
    """The test session's one Spark session (conftest's ``ray_spark``): a
    second local session here would be the same JVM, and stopping it would
    stop everyone's."""
    return ray_spark


def _spark_df(spark, tmp_path: Path, t: pa.Table):
    path = tmp_path / "input.parquet"
    pq.write_table(t, path)
    return spark.read.parquet(str(path))


def _mixed_table() -> pa.Table:
    """int64 and float64 values with nulls, an all-null key, NaN, a null key."""
    rows = [("a", 5, 1.5), ("a", None, NAN), ("a", -2, -3.25), ("b", None, None),
            ("b", None, None), (None, 7, 2.0), ("c", 3, NAN), ("c", 1, NAN), ("é", 9, 0.1),
            ("é", 10**12, 1e300), ("é", 4, 1e-300), ("d", 1, math.inf), ("d", 2, -math.inf)]
    rng = np.random.default_rng(0)
    for _ in range(2000):  # and a bulk of ordinary rows
        rows.append((f"k{int(rng.integers(50))}", int(rng.integers(-10**9, 10**9)),
                     float(rng.normal())))
    return pa.table({"key": pa.array([r[0] for r in rows], pa.string()),
                     "iv": pa.array([r[1] for r in rows], pa.int64()),
                     "fv": pa.array([r[2] for r in rows], pa.float64()),
                     "f32": pa.array([r[2] for r in rows], pa.float32()),
                     "label": pa.array([i % 3 for i in range(len(rows))], pa.int64())})


@pytest.mark.e2e
@pytest.mark.parametrize("value", ["iv", "fv", "f32"])
def test_aggregate_equals_spark(spark, tmp_path, value) -> None:
    t = _mixed_table()
    df = _spark_df(spark, tmp_path, t)
    aggs = ["count", "sum", "min", "max", "mean"]
    want = spark_reference(df, {"kind": "aggregate", "value": value, "aggs": aggs},
                            t.schema.field(value).type)
    op = builtin_operator("aggregate", value=value, aggs=aggs)
    got = run_split(op, t, list(range(0, t.num_rows, 97)), [0, 1, 2], [False, True],
                    random.Random(0))
    assert got.schema == want.schema
    assert table_diff(got, want) is None, table_diff(got, want)
    row = {r["key"]: r for r in got.to_pylist()}
    assert row["b"]["count"] == 2 and row["b"]["sum"] is None  # all-null key
    assert None in row  # the null key is a key


@pytest.mark.e2e
def test_counting_and_heavy_hitters_equal_spark(spark, tmp_path) -> None:
    t = _mixed_table()
    df = _spark_df(spark, tmp_path, t)
    cuts, owners, flush = list(range(0, t.num_rows, 113)), [0, 1], [True, False, False]
    for app, op in (({"kind": "wordcount"}, builtin_operator("wordcount")),
                    ({"kind": "naive-bayes"}, builtin_operator("naive-bayes")),
                    ({"kind": "heavy-hitters", "top_k": 7},
                     builtin_operator("heavy-hitters", counters=100, top_k=7))):
        want = spark_reference(df, app)
        got = run_split(op, t, cuts, owners, flush, random.Random(1))
        assert got.equals(want), (app, table_diff(got, want))


@pytest.mark.e2e
def test_spark_min_max_nan_and_types_verified(spark) -> None:
    """The Spark 3.5 rules the Aggregate operator follows, checked on Spark itself."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType, IntegerType, LongType

    df = spark.createDataFrame([("a", 1.0), ("a", NAN), ("b", NAN), ("c", None)], "key string, v double")
    r = {x["key"]: x for x in df.groupBy("key").agg(F.min("v").alias("mn"), F.max("v").alias("mx"),
                                                    F.sum("v").alias("s")).collect()}
    assert r["a"]["mn"] == 1.0 and math.isnan(r["a"]["mx"]) and math.isnan(r["a"]["s"])
    assert math.isnan(r["b"]["mn"]) and r["c"]["mn"] is None and r["c"]["s"] is None
    df = spark.createDataFrame([("a", 1, 2.5)], "key string, i int, f float")
    out = df.groupBy("key").agg(F.min("i"), F.max("f"), F.sum("i"), F.sum("f"), F.avg("i")).schema
    assert [f.dataType for f in out.fields[1:]] == [IntegerType(), FloatType(), LongType(),
                                                    DoubleType(), DoubleType()]


def test_readme_shows_the_example_operator_as_it_is() -> None:
    """The README's operator listing is examples/operators/topk.py (without
    its docstring): what a reader copies is what the tests run."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\nimport heapq") + len("```python\n")
    listed = readme[start:readme.index("```", start)]
    source = (ROOT / "examples" / "operators" / "topk.py").read_text()
    assert listed == source[source.index("import heapq"):]


def test_an_operator_file_shipped_to_the_cluster_leaves_no_copy_behind(tmp_path) -> None:
    """The copy of a user's operator file made for Ray's ``py_modules`` goes
    when the process that made it ends (``hs-operator-*`` directories piled up
    in the temporary folder before)."""
    import subprocess
    import sys

    op = tmp_path / "myop.py"
    op.write_text("class Op:\n    pass\n")
    code = ("from runtime.operators.loading import runtime_env_for; import os; "
            f"p = runtime_env_for('{op}:Op')['py_modules'][0]; "
            "assert os.path.exists(p); print(p)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    shipped = Path(out.stdout.strip())
    assert shipped.name.startswith("_operator_myop_") and shipped.parent.name.startswith("hs-operator-")
    assert not shipped.parent.exists()
