"""Live streams without Ray: the source's inbox, stop conditions, the topology
fields, the atomic result file and the live view's lag."""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FakeTime
from test_actors_core import DirectTransport, make_workers, words

from actors.pipeline import StopRequests
from actors.stream_input import LiveInput, split_even
from runtime.dataflow.aggregator import AggregatorCore
from runtime.dataflow.settings import AggregatorSettings, SourceSettings
from runtime.dataflow.source import SourceCore, StreamInbox
from runtime.grouping import make_grouping
from runtime.reporting.report import write_result
from runtime.top import RunView, render
from runtime.topology import TopologyError, load_topology


def _table(n: int, start: int = 0) -> pa.Table:
    return pa.table({"key": [f"k{i}" for i in range(start, start + n)]})


# --------------------------------------------------------------------------- inbox


def test_inbox_hands_out_tables_in_order_then_ends() -> None:
    box = StreamInbox(max_rows=100)
    box.put(_table(3), 1.0)
    box.put(_table(2, 3), 2.0)
    assert box.rows == 5
    assert box.get(timeout=0) == (_table(3), 1.0)
    box.close()
    assert box.get(timeout=0) == (_table(2, 3), 2.0)  # what came before the end still comes
    assert box.get(timeout=0) is None
    assert box.rows == 0
    with pytest.raises(RuntimeError, match="ended"):
        box.put(_table(1), 3.0)


def test_inbox_get_says_nothing_came() -> None:
    assert StreamInbox(max_rows=10).get(timeout=0) is False


def test_a_full_inbox_blocks_the_next_put_until_rows_are_taken() -> None:
    box = StreamInbox(max_rows=5)
    box.put(_table(8), 1.0)  # larger than the bound: goes in since the inbox is empty
    entered, returned = threading.Event(), threading.Event()

    def put() -> None:
        entered.set()
        box.put(_table(1), 2.0)
        returned.set()

    t = threading.Thread(target=put, daemon=True)
    t.start()
    assert entered.wait(5)
    assert not returned.wait(0.2), "put returned while the inbox was full"
    assert box.rows == 8
    assert box.get(timeout=0)[0].num_rows == 8  # type: ignore[index]
    assert returned.wait(5)
    t.join(5)
    assert box.rows == 1


# --------------------------------------------------------------------------- source


def test_source_routes_a_stream_and_latency_starts_at_the_handover() -> None:
    ft = FakeTime()
    sink: list = []
    workers = make_workers(2, ft, sink)
    src = SourceCore(0, make_grouping("kg", 2, seed=0), DirectTransport(workers),
                     SourceSettings(n_workers=2), clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    data = words(3000)
    handed = ft.t - 2.0  # handed over 2 s before the source took it
    batches = [(pa.table({"key": data[i:i + 1000]}), handed) for i in range(0, 3000, 1000)]
    stats = src.run(batches)
    assert stats.routed == stats.acked == 3000
    for w in workers:  # every message waited at least the 2 s since the handover
        assert w.latency.count and w.latency.sum_s / w.latency.count >= 2.0
        w.finish()
    agg = AggregatorCore(AggregatorSettings({"kind": "wordcount"}))
    for flush in sink:
        agg.merge(flush)
    assert dict(zip(*agg.result().to_pydict().values(), strict=True)) == dict(
        collections.Counter(data))


def test_idle_source_sends_what_its_outboxes_hold() -> None:
    ft = FakeTime()
    workers = make_workers(1, ft, [])
    src = SourceCore(0, make_grouping("kg", 1, seed=0), DirectTransport(workers),
                     SourceSettings(n_workers=1, max_inflight=1, call_messages=10), clock=ft.clock,
                     sleep=ft.sleep, t0=ft.t)
    # two batches, one call each: the second waits in the outbox for the first's ack
    _route(src, 0, _table(10))
    _route(src, 1, _table(10, 10))
    src._flush()
    assert src.outboxes.queued_n[0] == 10 and len(src.outboxes.inflight) == 1
    src.idle(0.02)  # takes the ack, sends the rest
    assert src.outboxes.queued_n[0] == 0
    src.idle(0.02)
    assert src.acked == 20 and not src.outboxes.inflight
    before = ft.t
    src.idle(0.02)  # nothing left: it sleeps
    assert ft.t == pytest.approx(before + 0.02)
    src.outboxes.linger_s = 60.0  # no data to wait for: an outbox does not linger
    _route(src, 2, _table(5, 20))
    src.idle(0.02)
    assert src.outboxes.queued_n[0] == 0 and src.outboxes.calls == 3


def _route(src: SourceCore, batch: int, table: pa.Table) -> None:
    """Route ``table`` as batch ``batch`` into the outboxes, without sending."""
    import numpy as np

    from runtime.dataflow.source import as_record_batch
    from runtime.hashing import hash_arrow

    records = as_record_batch(table)
    src._route_entries([(batch, np.arange(table.num_rows, dtype=np.int64), src.clock())],
                       records, hash_arrow(records.column("key")))


def test_split_even_keeps_order_and_sizes_within_one() -> None:
    t = _table(10)
    parts = split_even(t, 3)
    assert [p.num_rows for p in parts] == [3, 3, 4]
    assert pa.concat_tables(parts).equals(t)
    assert [p.num_rows for p in split_even(_table(1), 2)] == [0, 1]


# --------------------------------------------------------------------------- stopping


def _run(**kw):
    base = {"duration_s": None, "until_idle_s": None}
    return SimpleNamespace(**{**base, **kw})


def test_stop_reasons() -> None:
    s = StopRequests()
    assert s.reason(_run(), now_s=1e6, idle_s=1e6) is None  # runs until told
    assert s.reason(_run(duration_s=10), now_s=9.9, idle_s=0) is None
    assert s.reason(_run(duration_s=10), now_s=10, idle_s=0) == "duration"
    assert s.reason(_run(until_idle_s=5), now_s=100, idle_s=4.9) is None
    assert s.reason(_run(until_idle_s=5), now_s=100, idle_s=5) == "idle"
    s.signal = "SIGTERM"
    assert s.reason(_run(duration_s=10), now_s=0, idle_s=0) == "signal"


def test_the_idle_clock_starts_at_sparks_first_look_at_the_input(monkeypatch) -> None:
    """``LiveInput.idle_s``: a query that has not finished a trigger yet (a
    resumed one still planning the files that came while nobody ran) has not
    seen that no data came: not idle, however long since the start. From its
    first look on, the seconds without data count."""
    now = [1000.0]
    monkeypatch.setattr("actors.stream_input.time.time", lambda: now[0])
    query = SimpleNamespace(lastProgress=None, status={"isDataAvailable": False})
    live = object.__new__(LiveInput)  # (the clock's part only: no Spark, no Ray)
    live.busy, live.query, live.last_data_ts, live._looked = False, query, None, False
    now[0] = 1030.0
    assert live.idle_s(since=1000.0) == 0.0  # 30 s in, no trigger done yet
    query.lastProgress = {"batchId": 0}
    now[0] = 1032.5
    assert live.idle_s(since=1000.0) == 2.5  # from the last poll before the look
    query.status = {"isDataAvailable": True}
    assert live.idle_s(since=1000.0) == 0.0
    live.query = SimpleNamespace(status={})  # (a stopped query: the look is kept)
    now[0] = 1033.0
    assert live.idle_s(since=1000.0) == 0.5


def test_first_signal_asks_to_stop_the_second_interrupts() -> None:
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    with StopRequests() as s:
        os.kill(os.getpid(), signal.SIGTERM)
        assert s.signal == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is previous


# --------------------------------------------------------------------------- topology


def _topo(tmp_path, input_spec: dict, run: dict | None = None, **over):
    data = {"input": {"format": "parquet", "path": str(tmp_path), **input_spec},
            "run": run or {}, **over}
    return load_topology(data, check_input=True)


def test_stream_topology(tmp_path) -> None:
    t = _topo(tmp_path, {"stream": True}, {"until_idle_s": 5, "duration_s": 60})
    assert t.input.stream and t.input.max_files_per_trigger == 8
    assert t.run.until_idle_s == 5 and t.run.max_pending_rows == 100_000


@pytest.mark.parametrize("input_spec, run, over, message", [
    ({"format": "zipf", "path": None, "stream": True}, {}, {}, "input.stream: only for files"),
    ({"stream": True, "limit": 10}, {}, {}, "input.limit: not for a live stream"),
    ({"max_files_per_trigger": 2}, {}, {}, "input.max_files_per_trigger: only for a live"),
    ({}, {"until_idle_s": 3}, {}, "run.until_idle_s: only for a live stream"),
    ({}, {"duration_s": 3}, {}, "run.duration_s: only for a live stream"),
    ({"stream": True}, {"until_idle_s": 0}, {}, "run.until_idle_s"),
])
def test_stream_fields_are_checked(tmp_path, input_spec, run, over, message) -> None:
    spec = {k: v for k, v in input_spec.items() if v is not None}
    if input_spec.get("path", "") is None:
        data = {"input": spec, "run": run, **over}
        with pytest.raises(TopologyError, match=message):
            load_topology(data)
        return
    with pytest.raises(TopologyError, match=message):
        _topo(tmp_path, spec, run, **over)


def test_a_stream_reads_a_directory(tmp_path) -> None:
    f = tmp_path / "one.parquet"
    pq.write_table(_table(3), f)
    with pytest.raises(TopologyError, match="reads a directory.*is a file"):
        load_topology({"input": {"format": "parquet", "path": str(f), "stream": True}},
                      check_input=True)
    with pytest.raises(TopologyError, match="reads a directory.*not found"):
        load_topology({"input": {"format": "parquet", "path": str(tmp_path / "nope"),
                                 "stream": True}}, check_input=True)


def test_preflight_lets_an_empty_stream_directory_start_and_checks_a_full_one(tmp_path) -> None:
    from runtime.inputs.input_check import preflight

    preflight(_topo(tmp_path, {"stream": True}))  # empty: the run waits for a file
    pq.write_table(pa.table({"word": ["a"]}), tmp_path / "one.parquet")
    with pytest.raises(TopologyError, match="input.key: no column 'key'"):
        preflight(_topo(tmp_path, {"stream": True}))


# --------------------------------------------------------------------------- outputs


def test_write_result_replaces_the_file_whole(tmp_path) -> None:
    out = tmp_path / "run"
    write_result(out, _table(2))
    write_result(out, _table(5))
    assert pq.read_table(out / "result.parquet").num_rows == 5
    assert sorted(p.name for p in out.iterdir()) == ["result.parquet"]  # no temp file left


def test_live_view_shows_a_streams_lag() -> None:
    r = RunView("stream-x", messages=5000, acked=4000, lag=1000, heartbeat=100.0)
    text = render(r, now=100.0)
    assert "4,000 of 5,000 arrived, lag 1,000" in text
    r2 = RunView("batch-x", messages=5000, acked=4000, heartbeat=100.0)
    assert "4,000 / 5,000 (80%)" in render(r2, now=100.0)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_and_atomic_replace(tmp_path) -> None:
    from runtime.dataflow import checkpoint as ck

    assert ck.load(tmp_path) is None and not ck.exists(tmp_path)
    first = ck.Checkpoint(3, 1200, {"a": 1}, {"kind": "wordcount"})
    size = ck.save(tmp_path, first)
    assert size == (tmp_path / ".checkpoint" / "state.pkl").stat().st_size
    assert ck.load(tmp_path) == first
    ck.save(tmp_path, ck.Checkpoint(4, 1500, {"a": 2}, {"kind": "wordcount"}))
    assert ck.load(tmp_path).batch_id == 4  # type: ignore[union-attr]
    assert sorted(p.name for p in (tmp_path / ".checkpoint").iterdir()) == ["state.pkl"]


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path) -> None:
    import pickle

    from runtime.dataflow import checkpoint as ck

    d = tmp_path / ".checkpoint"
    d.mkdir()
    (d / "state.pkl").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        ck.load(tmp_path)
    (d / "state.pkl").write_bytes(pickle.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a checkpoint of this version"):
        ck.load(tmp_path)


def test_a_dead_drivers_leftover_processes_are_stopped(tmp_path) -> None:
    """A driver that records itself and its child, then dies (SIGKILL): its
    child is what ``stop_leftovers`` stops; nothing else is touched."""
    import json
    import signal
    import subprocess
    import sys

    import psutil

    from runtime.dataflow import checkpoint as ck

    code = ("import subprocess, sys, time\n"
            "from runtime.dataflow import checkpoint\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"checkpoint.record_processes({str(tmp_path)!r})\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(120)\n")
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).resolve().parents[2]))
    try:
        orphan = int(driver.stdout.readline())  # type: ignore[union-attr]
        assert ck.recorded_driver(tmp_path) == driver.pid  # alive: a resume must refuse
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        assert ck.recorded_driver(tmp_path) is None
        assert psutil.pid_exists(orphan)  # the dead driver's child lives on
        # a line naming another process (its pid and start time, another command
        # line) is not the dead run's: it is left alone
        path = ck.checkpoint_dir(tmp_path) / ck.PROCESSES_FILE
        data = json.loads(path.read_text())
        me = psutil.Process()
        data["children"].append([me.pid, me.create_time(), ["not", "what", "runs"]])
        path.write_text(json.dumps(data))
        assert ck.stop_leftovers(tmp_path) == 1
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie"
        assert ck.stop_leftovers(tmp_path) == 0
    finally:
        if driver.poll() is None:
            driver.kill()


def test_aggregator_snapshot_restores_into_a_new_one() -> None:
    from runtime.operators import builtin_operator

    op = builtin_operator("wordcount")
    a = AggregatorCore(AggregatorSettings({"kind": "wordcount"}))
    state = op.create()
    state = op.add(state, pa.record_batch({"key": ["x", "y", "x"]}))
    a.merge(op.compact(state))
    b = AggregatorCore(AggregatorSettings({"kind": "wordcount"}), state=a.snapshot())
    b.merge(op.compact(op.add(op.create(), pa.record_batch({"key": ["x"]}))))
    assert dict(zip(*b.result().to_pydict().values(), strict=True)) == {"x": 3, "y": 1}


@pytest.mark.parametrize("args, message", [
    (["--resume"], "--resume: only for a live stream"),
])
def test_resume_errors_before_anything_starts(tmp_path, capsys, args, message) -> None:
    from runtime.run import main

    topo = tmp_path / "t.yaml"
    topo.write_text("input: {format: zipf, messages: 100}\n")
    with pytest.raises(SystemExit) as e:
        main([str(topo), "--out", str(tmp_path / "out"), *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_resume_needs_a_checkpoint_and_a_checkpoint_needs_resume(tmp_path, capsys) -> None:
    from runtime.dataflow import checkpoint as ck
    from runtime.run import main

    indir, out = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    topo = tmp_path / "t.yaml"
    topo.write_text(f"input: {{format: parquet, path: {indir}, stream: true}}\n")
    with pytest.raises(SystemExit) as e:
        main([str(topo), "--resume"])
    assert e.value.code == 2 and "--resume: needs --out DIR" in capsys.readouterr().err
    ck.save(out, ck.Checkpoint(0, 10, None, {"kind": "wordcount"}))
    with pytest.raises(SystemExit) as e:
        main([str(topo), "--out", str(out)])
    assert e.value.code == 2
    assert "holds a live stream's checkpoint: add --resume" in capsys.readouterr().err


def test_a_source_routes_nothing_after_a_cut_until_the_checkpoint_lets_it_go(
        monkeypatch) -> None:
    """However long the checkpoint takes: a source that went on after a wait
    (it used to, after ``CUT_WAIT_S``) would route rows from after the cut, and
    the checkpoint would then label them with the earlier batch id - counted
    again on a resume."""
    import time

    from actors import source as source_mod

    monkeypatch.setattr(source_mod, "CUT_WAIT_S", 0.05, raising=False)
    src = source_mod.SourceActor(0, None, [], SourceSettings(n_workers=2, scheme="kg", batch=10))
    assert src.inbox is not None
    src.feed(_table(5), 1.0)
    src.cut()
    src.feed(_table(5, 5), 2.0)
    src.end_stream()
    got: list[int] = []

    def consume() -> None:
        for table, _ in src._stream_batches(src.inbox):
            got.append(table.num_rows)

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    assert src.reached_cut(timeout=5)
    time.sleep(0.3)  # the checkpoint is being saved (slowly)
    assert got == [5], "rows after the cut were routed before the checkpoint was saved"
    src.pass_cut()
    th.join(5)
    assert got == [5, 5]


def test_a_failed_attempt_returns_only_once_its_checkpoint_save_ended(tmp_path) -> None:
    """``release`` waits for a checkpoint being saved: an old save finishing
    beside the next attempt would drop logged micro-batches that attempt
    replays (it read the checkpoint before that save)."""
    import time

    from actors.pipeline import _PipelineRun

    topo = load_topology({"name": "t", "input": {"format": "zipf", "messages": 10}})
    saved = threading.Event()

    def save() -> None:
        time.sleep(0.3)
        saved.set()

    class Stream:
        def __init__(self) -> None:
            self._checkpointer = threading.Thread(target=save, daemon=True)
            self._checkpointer.start()

        def stop(self) -> None:
            pass

        def finish_checkpoints(self) -> None:
            self._checkpointer.join()

    run = _PipelineRun(topo, tmp_path, None, progress=False, log=None)
    run.stream = Stream()  # type: ignore[assignment]
    run.release()
    assert saved.is_set(), "release returned while a checkpoint was still being saved"


def test_resume_before_the_first_checkpoint_starts_the_stream_afresh(tmp_path, capsys) -> None:
    """A driver killed while starting left no checkpoint (maybe not even its
    --out, maybe its process list): nothing was committed, so ``--resume``
    starts the stream afresh instead of refusing."""
    import json

    from runtime.dataflow import checkpoint as ck
    from runtime.run import _take_over

    indir = tmp_path / "in"
    indir.mkdir()
    topo = load_topology({"input": {"format": "parquet", "path": str(indir), "stream": True}})
    assert _take_over(topo, tmp_path / "never-created") is False
    assert "starting the stream afresh" in capsys.readouterr().err
    out = tmp_path / "out"
    (ck.checkpoint_dir(out) / "wal").mkdir(parents=True)
    (ck.checkpoint_dir(out) / ck.PROCESSES_FILE).write_text(json.dumps(
        {"driver": [1, 0.0], "children": []}))  # a dead driver's (pid 1 started long ago)
    assert _take_over(topo, out) is False
    assert not ck.exists(out)  # a fresh run may start there
    ck.save(out, ck.Checkpoint(3, 10, None, {"kind": "wordcount"}))
    assert _take_over(topo, out) is True


def test_a_second_run_on_a_live_out_directory_exits_2(tmp_path) -> None:
    """``--out`` is locked for the run's whole life: a second run (two
    ``--resume``s of one stream, or any run) on it stops at once."""
    import subprocess
    import sys

    from runtime import cli

    out, indir = tmp_path / "out", tmp_path / "in"
    indir.mkdir()
    finite, stream = tmp_path / "finite.yaml", tmp_path / "stream.yaml"
    finite.write_text("input: {format: zipf, messages: 100}\n")
    stream.write_text(f"input: {{format: parquet, path: {indir}, stream: true}}\n")
    cli.claim_out_dir(out)  # this process is the live run
    try:
        for args in ([finite], [stream], [stream, "--resume"]):
            p = subprocess.run([sys.executable, "-m", "runtime.run", str(args[0]), "--out",
                                str(out), *args[1:]], capture_output=True, text=True,
                               timeout=60, cwd=Path(__file__).resolve().parents[2])
            assert p.returncode == 2, p.stderr
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and "is in use by another run" in lines[0], p.stderr
    finally:
        import os

        os.close(cli._CLAIMED.pop(out.resolve()))


class _Evil:
    """A pickle that runs a command when loaded (what a forged state.pkl holds)."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_before_any_runs(tmp_path) -> None:
    import pickle

    from runtime.dataflow import checkpoint as ck

    marker = tmp_path / "ran"
    d = tmp_path / ".checkpoint"
    d.mkdir()
    (d / "state.pkl").write_bytes(pickle.dumps(
        {"format": ck.FORMAT, "batch_id": 0, "messages": 0, "state": _Evil(marker),
         "app": {"kind": "wordcount"}}))
    with pytest.raises(ValueError, match=r"not a checkpoint of this runtime \(refuses "
                                         r"(posix|os)\.system\)"):
        ck.load(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("app", [
    {"kind": "wordcount"}, {"kind": "naive-bayes"}, {"kind": "heavy-hitters"},
    {"kind": "aggregate", "value": "amount", "aggs": ["count", "sum", "min", "max", "mean"]},
    {"kind": "wordcount", "window": {"column": "ts", "size": 2}},
    {"kind": "aggregate", "value": "amount", "aggs": ["mean"],
     "window": {"column": "ts", "size": 2}},
])
def test_every_built_in_state_survives_the_checkpoints_safe_loader(tmp_path, app) -> None:
    import pyarrow as pa

    from runtime.dataflow import checkpoint as ck
    from runtime.hashing import hash_arrow
    from runtime.operators import AggregatorApp, WorkerApp, operator_for_app

    op = operator_for_app(app)
    agg, worker = AggregatorApp(op), WorkerApp(op)
    batch = pa.record_batch({"key": ["a", None, "b"], "ts": pa.array([1, 2, 5]),
                             "amount": [1.5, None, 2.0], "label": [0, 1, 1]})
    for _ in range(3):
        worker.add(batch.select(["key", *op.spec.columns]), hash_arrow(batch.column("key")))
        agg.merge(worker.flush())
    ck.save(tmp_path, ck.Checkpoint(7, 9, agg.state(), app))
    again = AggregatorApp(op)
    again.restore(ck.load(tmp_path).state)  # type: ignore[union-attr]
    assert again.result().equals(agg.result())
