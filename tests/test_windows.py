"""Event-time windows (``app.window``) without an engine: the ``Windowed``
operator against a brute-force reference for every built-in kind and a
user's operator, under any split into workers, flushes and merge orders; the
live stream's event clock (watermark, late records, emission files); the
topology's refusals; the simulator's windowed result (both models)."""

from __future__ import annotations

import collections
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runtime.dataflow import event_time
from runtime.hashing import hash_arrow
from runtime.operators import AggregatorApp, WorkerApp, operator_for_app
from runtime.operators.windows import WindowLengths, window_starts
from runtime.topology import TopologyError, load_topology

ROOT = Path(__file__).resolve().parent.parent


def _records(n: int = 4000, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ts = [None if i % 41 == 0 else int(t) for i, t in enumerate(rng.integers(-40, 400, n))]
    keys = [None if i % 53 == 0 else f"k{k}" for i, k in enumerate(rng.integers(0, 12, n))]
    return pa.table({"key": pa.array(keys, pa.string()), "ts": pa.array(ts, pa.int64()),
                     "value": pa.array(rng.integers(0, 100, n), pa.int64()),
                     "label": pa.array(rng.integers(0, 3, n), pa.int64())})


def _windows_of(t: int, size: int, slide: int) -> list[int]:
    first = (t // slide) * slide
    return sorted(s for s in range(first, first - size - slide, -slide) if s <= t < s + size)


def _run(app: dict, table: pa.Table, seed: int = 0, workers: int = 3) -> pa.Table:
    """``table`` through ``workers`` WorkerApps in random 97-row batches,
    flushed at random moments, merged in arrival order."""
    rnd = random.Random(seed)
    op = operator_for_app(app, ROOT)
    agg, ws = AggregatorApp(op), [WorkerApp(op) for _ in range(workers)]
    cols = ["key", *op.spec.columns]
    for i in range(0, table.num_rows, 97):
        part = table.slice(i, 97)
        batch = pa.RecordBatch.from_pydict({c: part.column(c).combine_chunks() for c in cols})
        ws[rnd.randrange(workers)].add(batch, hash_arrow(batch.column("key")))
        if rnd.random() < 0.25:
            w = rnd.randrange(workers)
            agg.merge(ws[w].flush(), w)
    for w in range(workers):
        agg.merge(ws[w].flush(), w)
    return agg.result()


@pytest.mark.parametrize("size,slide", [(20, 20), (30, 10), (25, 7)])
def test_window_starts_are_every_window_holding_the_time(size: int, slide: int) -> None:
    ts = np.arange(-100, 100, dtype=np.int64)
    starts, rows = window_starts(ts, size, slide)
    got = collections.defaultdict(list)
    for s, r in zip(starts.tolist(), rows.tolist(), strict=True):
        got[int(ts[r])].append(s)
    for t in ts.tolist():
        assert sorted(got[t]) == _windows_of(t, size, slide)


@pytest.mark.parametrize("size,slide", [(20, None), (30, 10), (25, 7)])
def test_windowed_wordcount_equals_a_count_per_window(size: int, slide: int | None) -> None:
    table = _records()
    want = collections.Counter()
    for k, t in zip(table.column("key").to_pylist(), table.column("ts").to_pylist(), strict=True):
        if t is not None:  # a record without an event time is in no window (as in Spark)
            for s in _windows_of(t, size, slide or size):
                want[(s, s + size, k)] += 1
    app = {"kind": "wordcount", "window": {"column": "ts", "size": size, "slide": slide}}
    for seed in range(3):
        got = _run(app, table, seed)
        assert got.column_names == ["window_start", "window_end", "key", "count"]
        rows = got.to_pylist()
        assert {(r["window_start"], r["window_end"], r["key"]): r["count"] for r in rows} == want
        order = [(r["window_start"], r["key"] is None, r["key"] or "") for r in rows]
        assert order == sorted(order)  # windows in order, keys in order (null last)


@pytest.mark.parametrize("app", [
    {"kind": "naive-bayes"},
    {"kind": "heavy-hitters", "top_k": 3, "counters": 1000},
    {"kind": "aggregate", "value": "value", "aggs": ["count", "sum", "min", "max", "mean"]},
    {"kind": "operator", "operator": "examples/operators/topk.py:TopK",
     "columns": ["ts"], "params": {"column": "ts", "k": 2}},
])
def test_every_kind_windowed_equals_itself_per_window(app: dict) -> None:
    """Per window, the windowed app's rows are the plain app's rows over that
    window's records: the operator needs no window code."""
    table = _records(3000, seed=4)
    app = {**app, "window": {"column": "ts", "size": 60, "slide": 30}}
    got = _run(app, table, seed=1)
    plain = {k: v for k, v in app.items() if k != "window"}
    ts = table.column("ts").to_numpy(zero_copy_only=False)
    starts = sorted({s for t in table.column("ts").to_pylist() if t is not None
                     for s in _windows_of(t, 60, 30)})
    assert got.num_rows > 0
    for s in starts:
        inside = np.flatnonzero((ts >= s) & (ts < s + 60) & ~np.isnan(ts.astype(float)))
        want = _run(plain, table.take(pa.array(inside)), seed=2)
        mine = got.filter(pa.compute.equal(got.column("window_start"), s))
        assert mine.drop_columns(["window_start", "window_end"]).equals(want), s
        assert set(mine.column("window_end").to_pylist()) == {s + 60}


def test_timestamp_windows_take_units_and_report_utc_timestamps() -> None:
    table = _records(2000, seed=3)
    micros = pa.array([None if t is None else t * 1_000_000 + 5 for t in
                       table.column("ts").to_pylist()], pa.int64())
    table = table.set_column(1, "ts", micros.view(pa.timestamp("us")))
    app = {"kind": "wordcount", "window": {"column": "ts", "size": "30s", "slide": "15s"}}
    got = _run(app, table)
    assert got.schema.field("window_start").type == pa.timestamp("us", tz="UTC")
    want = collections.Counter()
    for k, t in zip(table.column("key").to_pylist(),
                    micros.to_pylist(), strict=True):
        if t is not None:
            for s in _windows_of(t, 30_000_000, 15_000_000):
                want[(s, k)] += 1
    rows = got.to_pylist()
    ticks = got.column("window_start").cast(pa.timestamp("us")).cast(pa.int64()).to_pylist()
    assert {(s, r["key"]): r["count"] for s, r in zip(ticks, rows, strict=True)} == want


@pytest.mark.parametrize("window,field", [
    ({"column": "ts", "size": 0}, "app.window.size"),
    ({"column": "ts", "size": 10, "slide": 20}, "app.window.slide"),
    ({"column": "ts", "size": 10, "slide": 0.001}, "app.window.slide"),
    ({"column": "ts", "size": "1 minute"}, "app.window.size"),
    ({"column": "ts", "size": 10, "lateness": -1}, "app.window.lateness"),
    ({"column": "key", "size": 10}, "app.window.column"),
    ({"column": "ts", "size": True}, "app.window.size"),
    ({"column": "ts"}, "app.window.size"),
    ({"column": "ts", "size": 10, "every": 3}, "app.window.every"),
])
def test_a_bad_window_is_one_line_naming_its_field(window: dict, field: str) -> None:
    with pytest.raises(TopologyError) as e:
        load_topology({"app": {"kind": "wordcount", "window": window}})
    msg = str(e.value)
    assert msg.startswith(field) and "\n" not in msg and len(msg) <= 200, msg


def test_lengths_with_units_on_a_whole_number_column_exit_2(tmp_path: Path) -> None:
    topo = tmp_path / "t.yaml"
    topo.write_text("input: {format: zipf, messages: 1000}\n"
                    "app: {kind: wordcount, window: {column: ts, size: 1m}}\n")
    r = subprocess.run([sys.executable, "-m", "runtime.run", str(topo), "--out",
                        str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: app.window.size") or "app.window.size" in line, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_the_event_clock_sends_late_records_away_and_bounds_final_windows(
        tmp_path: Path) -> None:
    w = WindowLengths("ts", 10.0, 10.0, 5.0)
    clock = event_time.EventClock(w)

    def piece(ts: list[int | None]) -> pa.Table:
        return pa.table({"key": ["a"] * len(ts), "ts": pa.array(ts, pa.int64())})

    kept, late = clock.take(0, [piece([1, 2, 30]), piece([25, None])], handed=100.0)
    assert late is None and [p.num_rows for p in kept] == [3, 2]
    assert clock.bound_at(0) == 25  # newest 30, lateness 5
    kept, late = clock.take(1, [piece([26, 24, 40]), piece([10, None, 31])], handed=101.0)
    # judged against the watermark before the batch (30): older than 25 is late
    assert late is not None and late.column("ts").to_pylist() == [24, 10]
    assert [p.num_rows for p in kept] == [2, 2] and clock.late_per_source == [1, 1]
    assert clock.bound_at(0) == 25 and clock.bound_at(1) == 35
    clock.emitted_windows([20, 30], now=103.5)  # final after batch 0 and batch 1
    assert clock.emit_delays_s == [3.5, 2.5]
    assert clock.stats()["emit_delay_s"] == {"p50": 3.0, "p99": pytest.approx(3.49), "max": 3.5}
    again = event_time.EventClock(w, clock.state_at(1))  # a resumed stream
    assert again.watermark == 40 and again.late_rows == 2
    # the checkpoint's cut behind the batches taken: batch 2 counts once
    batch2 = [piece([41, 20]), piece([3, 42])]
    clock.take(2, batch2, handed=102.0)
    assert clock.late_rows == 4 and clock.late_per_source == [2, 2]
    resumed = event_time.EventClock(w, clock.state_at(1))
    assert resumed.watermark == 40 and resumed.late_per_source == [1, 1]
    resumed.take(2, batch2, handed=110.0)  # the resumed stream takes batch 2 again
    assert resumed.late_rows == 4 and resumed.late_per_source == [2, 2]
    assert event_time.EventClock(w, clock.state_at(2)).late_rows == 4
    event_time.write_late(tmp_path, 1, late)
    event_time.write_late(tmp_path, 1, late)  # a replayed micro-batch: the same file
    assert not (tmp_path / "late.parquet").exists()  # gathered with the result, not per batch
    parts = event_time.FileParts(tmp_path / event_time.LATE_DIR)
    assert event_time.gather_late(tmp_path, parts) is True
    assert pq.read_table(tmp_path / "late.parquet").num_rows == 2
    assert event_time.gather_late(tmp_path, parts) is False  # nothing new: not rewritten
    event_time.write_late(tmp_path, 2, late.slice(0, 1))
    assert event_time.gather_late(tmp_path, parts) is True
    assert pq.read_table(tmp_path / "late.parquet").num_rows == 3


def test_emitted_windows_leave_the_state_and_never_come_back(tmp_path: Path,
                                                             monkeypatch) -> None:
    """Emit, then a replayed record of an emitted window (a resumed stream)
    changes nothing; the stream's answer is every emitted window plus the open."""
    app = {"kind": "wordcount", "window": {"column": "ts", "size": 10}}
    op = operator_for_app(app)
    agg, worker = AggregatorApp(op), WorkerApp(op)
    batch = pa.RecordBatch.from_pydict({"key": ["a", "b", "a", "c"],
                                        "ts": pa.array([1, 5, 12, 25], pa.int64())})
    worker.add(batch, hash_arrow(batch.column("key")))
    agg.merge(worker.flush())
    final = agg.emit_windows(20)
    assert final.column("window_start").to_pylist() == [0, 0, 10]
    assert event_time.window_ends(final) == [10, 20]
    assert event_time.write_emission(tmp_path, 3, final, 20) is not None
    assert event_time.write_emission(tmp_path, 3, final, 20) is None  # written once
    assert event_time.emitted_bound(tmp_path) == 20
    assert agg.window_stats()["open"] == 1
    resumed = AggregatorApp(op)
    resumed.restore(pickle_copy(agg.state()))
    resumed.close_windows(event_time.emitted_bound(tmp_path))
    worker.add(batch, hash_arrow(batch.column("key")))  # replayed
    resumed.merge(worker.flush())
    answer = event_time.with_emitted(tmp_path, resumed.result(), "wordcount")
    rows = [(r["window_start"], r["key"], r["count"]) for r in answer.to_pylist()]
    assert rows == [(0, "a", 1), (0, "b", 1), (10, "a", 1), (20, "c", 2)]
    # a stream's reader of its emissions reads each file once, and the new ones
    reads: list[str] = []
    real_read = event_time.pq.read_table

    def counted(path, *a, **k):
        reads.append(Path(path).name)
        return real_read(path, *a, **k)

    monkeypatch.setattr(event_time.pq, "read_table", counted)
    emitted = event_time.FileParts(tmp_path / event_time.WINDOWS_DIR)
    for _ in range(3):
        again = event_time.with_emitted(tmp_path, resumed.result(), "wordcount", emitted)
        assert again.equals(answer)
    later = agg.emit_windows(30)  # c's window
    assert event_time.write_emission(tmp_path, 5, later, 30) is not None
    last = event_time.with_emitted(tmp_path, resumed.result().slice(0, 0), "wordcount", emitted)
    assert [(r["window_start"], r["key"]) for r in last.to_pylist()][-1] == (20, "c")
    assert reads == ["000000000003.parquet", "000000000005.parquet"]


@pytest.mark.parametrize("kind", ["wordcount", "aggregate"])
def test_sliding_windows_are_kept_as_panes_and_emitted_once_each(kind: str) -> None:
    """Windows of 30 sliding by 10 are kept as panes of 10: a record updates
    one state, not three. A stream emitting as its watermark moves (records in
    time order, three workers, a replayed pane after its windows went) gives
    each window once, equal to the count over its records, and frees a pane
    once its last window is out."""
    app = {"kind": kind, "window": {"column": "ts", "size": 30, "slide": 10}}
    if kind == "aggregate":
        app.update(value="value", aggs=["count", "sum"])
    op = operator_for_app(app, ROOT)
    assert op.op.panes("int") == 3
    assert operator_for_app({**app, "window": {"column": "ts", "size": 30, "slide": 7}},
                            ROOT).op.panes("int") == 0  # 30 is no whole number of 7s
    table = _records(3000, seed=5).sort_by("ts")
    agg, ws = AggregatorApp(op), [WorkerApp(op) for _ in range(3)]
    cols = ["key", *op.spec.columns]
    emitted: list[pa.Table] = []
    for i in range(0, table.num_rows, 200):
        part = table.slice(i, 200)
        batch = pa.RecordBatch.from_pydict({c: part.column(c).combine_chunks() for c in cols})
        ws[i // 200 % 3].add(batch, hash_arrow(batch.column("key")))
        for w, worker in enumerate(ws):
            agg.merge(worker.flush(), w)
        held = agg.state().windows
        assert all(p % 10 == 0 for p in held)  # pane starts: one state per slice of 10
        watermark = (max(t for t in part.column("ts").to_pylist() if t is not None) // 10) * 10
        emitted.append(agg.emit_windows(watermark))
        assert all(p + 30 > watermark for p in agg.state().windows)  # freed after its last
    got = pa.concat_tables([*emitted, agg.result()])
    ends = [s + 30 for s in got.column("window_start").to_pylist()]
    assert ends == got.column("window_end").to_pylist()
    per_window = {}
    for r in got.to_pylist():
        assert (r["window_start"], r["key"]) not in per_window  # each window once
        per_window[(r["window_start"], r["key"])] = r["count"]
    want = collections.Counter()
    for k, t in zip(table.column("key").to_pylist(), table.column("ts").to_pylist(), strict=True):
        if t is not None:
            for s in _windows_of(t, 30, 10):
                want[(s, k)] += 1
    assert per_window == dict(want)


def test_the_emitted_bound_is_the_last_emission_files(tmp_path: Path) -> None:
    """Emission files in micro-batch order carry growing bounds; the newest is
    read from the last file alone."""
    t = pa.table({"window_start": pa.array([0], pa.int64()),
                  "window_end": pa.array([10], pa.int64()), "key": ["a"], "count": [1]})
    assert event_time.emitted_bound(tmp_path) is None
    for batch, bound in ((3, 20), (9, 40), (12, 50)):
        event_time.write_emission(tmp_path, batch, t, bound)
    assert event_time.emitted_bound(tmp_path) == 50


def pickle_copy(state: object) -> object:
    import pickle

    return pickle.loads(pickle.dumps(state))


def _schemes() -> list[str]:
    from runtime.grouping import SCHEMES

    return sorted(SCHEMES)


@pytest.mark.parametrize("scheme", _schemes())
def test_the_simulator_runs_windows_with_the_same_operator(scheme: str) -> None:
    """Every scheme, exact per window (heterogeneous workers: keys split)."""
    from runtime.inputs.generators import generate
    from runtime.sim.api import simulate

    topo = load_topology({
        "input": {"format": "zipf", "messages": 12_000, "keys": 300, "skew": 1.1},
        "sources": 2, "workers": {"count": 3, "capacity": [1.0, 0.5, 0.25]},
        "grouping": {"scheme": scheme},
        "app": {"kind": "wordcount", "window": {"column": "ts", "size": 3000, "slide": 1000}},
        "run": {"batch": 500},
    })
    res = simulate(topo)
    cols = generate(0, 12_000, topo.input.model_dump())
    want = collections.Counter()
    for k, t in zip(cols["key"].tolist(), cols["ts"].tolist(), strict=True):
        for s in _windows_of(t, 3000, 1000):
            want[(s, k)] += 1
    got = {(r["window_start"], r["key"]): r["count"] for r in res.result.to_pylist()}
    assert got == want
