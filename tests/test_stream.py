"""Live streams without Ray: the source's inbox, stop conditions, the topology
fields, the atomic result file and the live view's lag."""

from __future__ import annotations

import collections
import os
import threading
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FakeTime
from test_actors_core import DirectTransport, make_workers, words

from actors.aggregator import AggregatorCore
from actors.pipeline import StopRequests
from actors.source import SourceCore, StreamInbox
from actors.stream_input import split_even
from runtime.grouping import make_grouping
from runtime.report import write_result
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
    src = SourceCore(0, make_grouping("kg", 2, seed=0), DirectTransport(workers), n_workers=2,
                     clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    data = words(3000)
    handed = ft.t - 2.0  # handed over 2 s before the source took it
    batches = [(pa.table({"key": data[i:i + 1000]}), handed) for i in range(0, 3000, 1000)]
    stats = src.run(batches)
    assert stats["routed"] == stats["acked"] == 3000
    for w in workers:  # every message waited at least the 2 s since the handover
        assert w.latency.count and w.latency.sum_s / w.latency.count >= 2.0
        w.finish()
    agg = AggregatorCore({"kind": "wordcount"})
    for flush in sink:
        agg.merge(flush)
    assert dict(zip(*agg.result().to_pydict().values(), strict=True)) == dict(
        collections.Counter(data))


def test_idle_source_sends_what_its_outboxes_hold() -> None:
    ft = FakeTime()
    workers = make_workers(1, ft, [])
    src = SourceCore(0, make_grouping("kg", 1, seed=0), DirectTransport(workers), n_workers=1,
                     max_inflight=1, call_messages=10, clock=ft.clock, sleep=ft.sleep,
                     t0=ft.t)
    # two batches, one call each: the second waits in the outbox for the first's ack
    src._route_entries(0, *_routed(src, _table(10)))
    src._route_entries(1, *_routed(src, _table(10, 10)))
    src._flush()
    assert src._outbox_n[0] == 10 and len(src._inflight) == 1
    src.idle(0.02)  # takes the ack, sends the rest
    assert src._outbox_n[0] == 0
    src.idle(0.02)
    assert src.acked == 20 and not src._inflight
    before = ft.t
    src.idle(0.02)  # nothing left: it sleeps
    assert ft.t == pytest.approx(before + 0.02)


def _routed(src: SourceCore, table: pa.Table):
    import numpy as np

    from actors.source import as_record_batch
    from runtime.hashing import hash_arrow

    records = as_record_batch(table)
    return (np.arange(table.num_rows, dtype=np.int64), records,
            hash_arrow(records.column("key")), src.clock())


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
    ({"stream": True}, {}, {"faults": [{"at_s": 1, "kill": "source-0"}]},
     "faults.0.kill: restarting a source is not supported on a live stream"),
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
    from runtime.input_check import preflight

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
