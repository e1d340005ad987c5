"""The simulator (the runtime's cores on a virtual clock): conservation, exact
results, queueing behaviour, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from runtime.grouping import SCHEMES, Grouping
from runtime.grouping.signals import WorkerSignals
from runtime.inputs import generators
from runtime.reporting.report import REQUIRED_KEYS
from runtime.sim import SimResult, simulate
from runtime.sim.cores import ACK_TRANSIT_S, CALL_TRANSIT_S, _shards
from runtime.sim.inputs import load_input
from runtime.simulate import main as simulate_main
from runtime.topology import TopologyError, load_topology

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def topo(scheme: str = "kg", **over: Any) -> dict[str, Any]:
    """A small topology as a dict; keyword sections are merged shallowly."""
    t: dict[str, Any] = {
        "name": "t",
        "input": {"format": "zipf", "messages": 20_000, "keys": 2_000, "skew": 1.0},
        "sources": 2,
        "workers": {"count": 4, "service_us": 20},
        "grouping": {"scheme": scheme},
        "run": {"batch": 500, "slot_s": 0.05},
    }
    for k, v in over.items():
        t[k] = {**t[k], **v} if isinstance(v, dict) and isinstance(t.get(k), dict) else v
    return t


def sim(t: dict[str, Any], **kw: Any) -> SimResult:
    """Small inputs: deal blocks of 2,000 messages so that every source has some."""
    return simulate(t, **{"shard_block_rows": 2_000, **kw})


def direct_counts(spec: dict[str, Any], n: int) -> Counter[str]:
    full = {"format": "zipf", "seed": 0, "skew": 1.0, **spec}
    return Counter(generators.generate(0, n, full)["key"].tolist())


# --------------------------------------------------------------------------- conservation


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_conservation_every_scheme(scheme: str) -> None:
    r = sim(topo(scheme, workers={"capacity": [1, 1, 0.5, 0.25]}), shard_block_rows=3000)
    rep = r.report
    n = 20_000
    assert rep["messages"] == {"input": n, "processed": n}
    assert rep["in_flight_at_end"] == 0
    assert sum(w["processed"] for w in rep["workers"]) == n
    assert np.isfinite(rep["latency_ms"]["max"])
    assert rep["latency_ms"]["p50"] >= 20e-3 * (1 - 1e-6)  # at least one service time
    assert 1.0 <= rep["replication"] <= 4.0
    assert rep["engine"] == "sim" and rep["scheme"] == scheme


def test_kg_sends_every_key_to_one_worker_and_replication_is_one() -> None:
    r = sim(topo("kg"))
    assert r.report["replication"] == 1.0  # workers per key, averaged over the keys
    sg = sim(topo("sg")).report
    assert sg["replication"] > 2.0  # frequent keys on every worker
    # a result that holds only the top k: counted over the input's keys, not the k rows
    top = sim(topo("kg", app={"kind": "heavy-hitters", "top_k": 5})).report
    assert top["result"]["rows"] == 5 and top["replication"] == 1.0


def test_shards_are_dealt_round_robin_by_block() -> None:
    inp = load_input(load_topology(topo("kg", input={"messages": 10_000})))
    shards = [np.concatenate(batches) for batches in _shards(inp, 3, 500, 1_000)]
    assert [len(s) for s in shards] == [4_000, 3_000, 3_000]
    assert sorted(np.concatenate(shards).tolist()) == list(range(10_000))
    assert shards[0][:2_000].tolist() == list(range(1_000)) + list(range(3_000, 4_000))
    assert [len(s) for s in _shards(inp, 3, 500, 65_536)][1:] == [0, 0]  # one block
    # each source is paced at rate / sources = 10,000 msgs/s over its own shard:
    # source 0 (7 blocks) has routed its 7,000 messages at 0.7 s
    r = sim(topo("pkg", sources=3, run={"rate": 30_000}), shard_block_rows=1_000)
    assert r.report["messages"]["processed"] == 20_000
    assert 0.69 < r.report["duration_s"] < 0.71


# --------------------------------------------------------------------------- results


def test_wordcount_result_is_exact_generated() -> None:
    r = sim(topo("pkg", input={"format": "evolving-zipf", "shift_every": 5_000}))
    want = Counter(generators.generate(
        0, 20_000, {"format": "evolving-zipf", "keys": 2_000, "skew": 1.0, "seed": 0,
                    "shift_every": 5_000})["key"].tolist())
    got = dict(zip(r.result.column("key").to_pylist(), r.result.column("count").to_pylist(),
                   strict=True))
    assert got == dict(want)
    assert r.result.schema.field("count").type == "int64"
    assert r.report["result"]["rows"] == len(want)


def test_wordcount_result_is_exact_file_with_limit() -> None:
    path = ROOT / "data" / "gitgit-words-1m.parquet"
    r = sim(topo("sg", input={"format": "parquet", "path": str(path), "limit": 30_000,
                                   "messages": 200_000}))
    keys = pq.read_table(path, columns=["key"]).column("key").to_pylist()[:30_000]
    got = dict(zip(r.result.column("key").to_pylist(), r.result.column("count").to_pylist(),
                   strict=True))
    assert got == dict(Counter(keys))
    assert r.report["messages"]["input"] == 30_000


def test_csv_input_with_integer_keys(tmp_path: Path) -> None:
    csv = tmp_path / "in.csv"
    vals = [i % 7 for i in range(3_000)]
    csv.write_text("word,x\n" + "\n".join(f"{v},1" for v in vals) + "\n")
    r = sim(topo("kg", input={"format": "csv", "path": str(csv), "key": "word"}))
    got = dict(zip(r.result.column("key").to_pylist(), r.result.column("count").to_pylist(),
                   strict=True))
    assert got == {str(k): c for k, c in Counter(vals).items()}


def test_naive_bayes_and_heavy_hitters_results() -> None:
    nb = sim(topo("pkg", app={"kind": "naive-bayes"}, input={"classes": 3})).result
    g = generators.generate(0, 20_000, {"format": "zipf", "keys": 2_000, "skew": 1.0,
                                        "seed": 0, "classes": 3}, with_labels=True)
    want = Counter(zip(g["key"].tolist(), g["label"].tolist(), strict=True))
    got = {(k, lab): c for k, lab, c in zip(nb.column("key").to_pylist(),
                                            nb.column("label").to_pylist(),
                                            nb.column("count").to_pylist(), strict=True)}
    assert got == dict(want)
    hh = sim(topo("cg", app={"kind": "heavy-hitters", "top_k": 10})).result
    top = direct_counts({"keys": 2_000}, 20_000).most_common(10)
    assert hh.column("count").to_pylist() == [c for _, c in top]
    assert set(hh.column("key").to_pylist()) == {k for k, _ in top}
    assert hh.column("error").to_pylist() == [0] * 10


# --------------------------------------------------------------------------- queueing


@pytest.mark.parametrize("capacity, sources", [(0.5, 1), (0.3, 3), (1.0, 2)])
def test_single_worker_runs_at_its_capacity(capacity: float, sources: int) -> None:
    r = sim(topo("kg", sources=sources, workers={"count": 1, "capacity": capacity,
                                                 "service_us": 100, "throttle": "service"}))
    rep = r.report
    # virtual time: exact but for the first call's routing and its way to the
    # worker, and the last ack's way back
    n = rep["messages"]["processed"]
    want = n / (n * 100e-6 / capacity + CALL_TRANSIT_S + ACK_TRANSIT_S)
    assert rep["throughput_msgs_per_s"] == pytest.approx(want, rel=1e-3)
    assert rep["capacity_efficiency"] == pytest.approx(want * 100e-6 / capacity, rel=1e-3)
    assert rep["workers"][0]["busy_fraction"] == pytest.approx(1.0, rel=1e-2)


def test_a_duty_cycle_stops_and_continues_a_slow_worker() -> None:
    """workers.throttle duty-cycle (the default): every 0.1 s the worker runs
    for capacity x 0.1 s, then is stopped to the period's end, as the real
    throttler does; the rate is still its capacity's."""
    r = sim(topo("kg", sources=1, workers={"count": 1, "capacity": 0.3, "service_us": 100}))
    rep = r.report
    d = rep["duration_s"]
    assert rep["throughput_msgs_per_s"] == pytest.approx(3_000, rel=0.02)
    assert rep["workers"][0]["stopped_s"] == pytest.approx(0.7 * d, abs=0.1)
    # a message that arrives as its worker is stopped waits up to 70 ms more
    scaled = sim(topo("kg", sources=1, workers={"count": 1, "capacity": 0.3, "service_us": 100,
                                                "throttle": "service"})).report
    assert scaled["workers"][0]["stopped_s"] == 0.0
    assert scaled["duration_s"] == pytest.approx(d, rel=0.03)


def test_capacity_change_takes_effect_at_its_time() -> None:
    # 1 worker at full speed (100 us/msg) for 1 s = 10,000 msgs, then 4x slower
    r = sim(topo("kg", sources=1, workers={
        "count": 1, "service_us": 100, "changes": [{"at_s": 1.0, "worker": 0, "capacity": 0.25}]}))
    # (within a message: the one in service at 1.0 s finishes at the old speed;
    # the first call reaches the worker CALL_TRANSIT_S after the start, the
    # last ack is back at the source ACK_TRANSIT_S after it was done)
    assert r.report["duration_s"] == pytest.approx(
        1.0 + 10_000 * 400e-6 + CALL_TRANSIT_S + ACK_TRANSIT_S, abs=1e-3)
    ts = r.timeseries
    assert ts.loc[ts.t_s <= 1.0, "capacity_w0"].eq(1.0).all()
    assert ts.loc[ts.t_s > 1.05, "capacity_w0"].eq(0.25).all()
    assert r.report["capacity_changes"] == [{"at_s": 1.0, "worker": 0, "capacity": 0.25}]


def test_rate_limit_is_honoured_below_capacity() -> None:
    # 4 workers x 50,000 msgs/s; offer 40,000 msgs/s: the stream paces the run
    r = sim(topo("sg", run={"rate": 40_000}))
    rep = r.report
    # each source paces its 10,000 messages at 20,000 msgs/s: it has routed
    # them all at 0.5 s
    assert 0.49 < rep["duration_s"] < 0.51
    assert rep["throughput_msgs_per_s"] == pytest.approx(20_000 / rep["duration_s"])
    # no backlog: a message waits at most for its source's linger (10 ms), its
    # call's way to the worker, its own sub-batch and one of the other
    # source's (~125 msgs x 20 us each)
    assert rep["latency_ms"]["max"] < 10 + 1e3 * CALL_TRANSIT_S + 2 * 200 * 20e-3


def test_backpressure_bounds_queues() -> None:
    r = sim(topo("kg", input={"skew": 1.4}, run={"max_inflight": 3}))
    ts = r.timeseries
    util = ts[[f"util_w{i}" for i in range(4)]].to_numpy()
    assert util.max() <= 1.0 + 1e-9  # never more than sources * max_inflight batches queued
    assert util.max() > 0.5  # and the hot worker does fill its window
    assert r.report["topology"]["queue_capacity_batches"] == 6


def test_kg_is_more_imbalanced_than_sg_on_skew() -> None:
    kg = sim(topo("kg", input={"skew": 1.2})).report
    sg = sim(topo("sg", input={"skew": 1.2})).report
    assert kg["imbalance"]["mean"] > sg["imbalance"]["mean"] + 0.15
    assert kg["throughput_msgs_per_s"] < 0.8 * sg["throughput_msgs_per_s"]


HETERO = {
    "name": "hetero",
    "input": {"format": "zipf", "messages": 300_000, "keys": 10_000, "skew": 1.2},
    "sources": 2,
    "workers": {"count": 8, "capacity": [1, 1, 1, 1, 1, 1, 0.3, 0.3], "service_us": 100},
    "run": {"batch": 1000, "rate": 0.8 * 6.6 * 1e4, "slot_s": 0.5},
}


def test_heterogeneity_kg_vs_sg_vs_cg() -> None:
    """2 of 8 workers at 0.3, offered 80% of the total capacity.

    Neither KG nor SG knows capacities, so both overload the slow workers and
    the sources block on them; KG also piles the hot keys on single workers,
    so its p99 latency and throughput are much worse. CG learns from signals
    and moves virtual workers off the slow workers.
    """
    res = {s: simulate({**HETERO, "grouping": {"scheme": s}}) for s in ("kg", "sg", "cg")}
    kg, sg, cg = (res[s].report for s in ("kg", "sg", "cg"))
    assert kg["latency_ms"]["p99"] > 1.5 * sg["latency_ms"]["p99"]
    assert kg["throughput_msgs_per_s"] < 0.75 * sg["throughput_msgs_per_s"]
    vw = np.array(cg["vw_ownership"]["final"])
    assert vw.sum() == pytest.approx(80)  # VWs only move, 10 per worker at the start
    assert vw[6:].max() < 8 and vw[6:].mean() < vw[:6].mean() - 3
    assert cg["migrations"] > 0 and cg["signals"]["decrease"] > 0
    assert cg["throughput_msgs_per_s"] > 1.3 * sg["throughput_msgs_per_s"]
    ts = res["cg"].timeseries
    assert ts["vw_w0"].iloc[0] == 10.0


# --------------------------------------------------------------------------- time series


def test_timeseries_columns_and_consistency() -> None:
    r = sim(topo("cg", workers={"capacity": [1, 1, 0.5, 0.5]}))
    ts = r.timeseries
    for c in ("t_s", "throughput_msgs_per_s", "imbalance", "latency_p50_ms", "latency_p99_ms"):
        assert c in ts.columns
    for prefix in ("queue", "util", "capacity", "vw"):
        assert [f"{prefix}_w{i}" for i in range(4)] == [c for c in ts.columns
                                                        if c.startswith(prefix + "_w")]
    util = ts[[f"util_w{i}" for i in range(4)]].to_numpy()
    np.testing.assert_allclose(ts["imbalance"], util.max(axis=1) - util.mean(axis=1))
    slot = 0.05
    assert (ts["throughput_msgs_per_s"] * slot).sum() == pytest.approx(20_000)
    assert ts["t_s"].iloc[-1] >= r.report["duration_s"] > ts["t_s"].iloc[-1] - slot
    assert r.report["imbalance"]["mean"] == pytest.approx(ts["imbalance"].mean())
    assert (ts["latency_p99_ms"].dropna() >= ts["latency_p50_ms"].dropna()).all()
    assert ts["latency_p99_ms"].max() <= r.report["latency_ms"]["max"] * 1.03


def test_deterministic() -> None:
    a = sim(topo("cg", workers={"capacity": [1, 1, 0.5, 0.5]}))
    b = sim(topo("cg", workers={"capacity": [1, 1, 0.5, 0.5]}))
    strip = ("sim", "phases")  # wall time
    ra = {k: v for k, v in a.report.items() if k not in strip}
    rb = {k: v for k, v in b.report.items() if k not in strip}
    assert ra == rb
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)


# --------------------------------------------------------------------------- feedback plumbing


class _Probe(Grouping):
    """Records what a source's grouping sees: route and ack times on its clock."""

    name = "probe-sim"
    uses_feedback = True
    log: ClassVar[list[tuple[str, float, int, int, int]]] = []

    @classmethod
    def worker_signals(cls, params):  # workers signal to it, as to CG
        return WorkerSignals(slot_s=0.01, busy_above=0.85, idle_below=0.75)

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        _Probe.log.append(("route", self.clock(), self.seed, -1, len(key_hashes)))
        return (key_hashes % np.uint64(self.n_workers)).astype(np.int32)

    def on_ack(self, worker: int, signal: int = 0, acked: int = 0) -> None:
        super().on_ack(worker, signal, acked)
        _Probe.log.append(("ack", self.clock(), self.seed, signal, acked))


def test_acks_reach_the_grouping_in_simulated_time() -> None:
    _Probe.log.clear()
    SCHEMES[_Probe.name] = _Probe
    try:
        rep = simulate({"input": {"format": "zipf", "messages": 12_000, "keys": 500},
                        "sources": 2,
                        "workers": {"count": 3, "capacity": [1.0, 1.0, 0.2], "service_us": 50},
                        "grouping": {"scheme": _Probe.name},
                        "run": {"batch": 300, "max_inflight": 2, "seed": 5, "slot_s": 0.01}},
                       shard_block_rows=1000).report
    finally:
        del SCHEMES[_Probe.name]
    log = _Probe.log
    times = [t for _, t, _, _, _ in log]
    assert times == sorted(times) and times[-1] > times[0]  # one simulated clock, monotonic
    assert times[-1] - times[0] <= rep["duration_s"]  # virtual seconds, not wall seconds
    assert {seed for _, _, seed, _, _ in log} == {5, 6}  # seed = run.seed + source
    acks = [e for e in log if e[0] == "ack"]
    assert sum(e[4] for e in acks) == 12_000
    sig = [e[3] for e in acks if e[3]]
    assert -1 in sig and 1 in sig  # the slow worker is busy, the others idle
    assert rep["signals"]["increase"] + rep["signals"]["decrease"] == len(sig)
    # at most one signal per (source, worker) per slot
    assert len(sig) <= 2 * 3 * (int(rep["duration_s"] / 0.01) + 1)


# --------------------------------------------------------------------------- command line


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "runtime.simulate", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_cli_bad_topology_exits_2_with_one_line(tmp_path: Path) -> None:
    t = tmp_path / "t.yaml"
    t.write_text(json.dumps(topo("kg")))
    p = run_cli(str(t), "--set", "workers.capacity=0", "--out", str(tmp_path / "o"))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "workers.capacity" in lines[0]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()


def test_a_calls_transit_is_a_what_if() -> None:
    """``call_transit_s``: how long a call takes to reach its worker (default
    ``CALL_TRANSIT_S``, recorded in the report). One worker at 10,000 msgs/s
    and 20,000 messages: the run takes 2 s plus one transit, the first call's,
    and the last ack's way back (``ACK_TRANSIT_S`` whatever the call's)."""
    t = topo("kg", sources=1, workers={"count": 1, "service_us": 100, "throttle": "service"})
    for transit, want in ((None, CALL_TRANSIT_S), (0.0, 0.0), (0.05, 0.05)):
        rep = sim(t, call_transit_s=transit).report
        assert rep["sim"]["call_transit_s"] == want
        assert rep["sim"]["ack_transit_s"] == ACK_TRANSIT_S
        assert rep["duration_s"] == pytest.approx(2.0 + want + ACK_TRANSIT_S, abs=1e-3)
    # a message's latency counts its call's way: the slower network, the higher every percentile
    fast, slow = (sim(topo("kg", run={"rate": 40_000}), call_transit_s=x).report["latency_ms"]
                  for x in (0.0, 0.02))
    assert slow["p50"] > fast["p50"] + 15 and slow["p99"] > fast["p99"] + 15


@pytest.mark.parametrize("bad", ["-1", "nan", "20000"])
def test_a_bad_call_transit_exits_2_with_one_line_before_reading(tmp_path: Path, bad: str) -> None:
    t = tmp_path / "t.yaml"
    t.write_text(json.dumps(topo("kg", input={"format": "parquet", "path": "missing.parquet"})))
    p = run_cli(str(t), "--call-transit-ms", bad, "--out", str(tmp_path / "o"))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--call-transit-ms" in lines[0] and "Traceback" not in p.stderr
    assert "missing.parquet" not in lines[0]  # the option is checked first
    assert not (tmp_path / "o").exists()
    with pytest.raises(TopologyError, match="call-transit-ms"):
        simulate(topo("kg"), call_transit_s=float(bad) / 1e3)


def test_the_removed_queueing_model_is_refused_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="one model, cores"):
        simulate(topo("kg"), model="queueing")
    code = None
    try:
        simulate_main([str(ROOT / "topologies" / "demo.yaml"), "--model", "queueing",
                       "--out", str(tmp_path / "o")])
    except SystemExit as e:
        code = e.code
    assert code == 2 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("overrides, field", [
    (["input.format=parquet", "input.path=nope.parquet"], "input.path"),
    (["input.format=parquet", f"input.path={ROOT / 'data' / 'gitgit-words-1m.parquet'}",
      "input.key=word"], "input.key"),
    (["grouping.scheme=cg", "grouping.virtual_per_worker=0"], "virtual_per_worker"),
])
def test_bad_input_exits_2_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      overrides: list[str], field: str) -> None:
    t = tmp_path / "t.yaml"
    t.write_text(json.dumps(topo("kg")))
    argv = [str(t), "--no-progress", "--out", str(tmp_path / "o")]
    for o in overrides:
        argv += ["--set", o]
    from runtime.cli import run_main

    with pytest.raises(SystemExit) as e:
        run_main(lambda: simulate_main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]


def test_cli_writes_all_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = tmp_path / "t.yaml"
    t.write_text(json.dumps(topo("kg")))
    out = tmp_path / "run"
    assert simulate_main([str(t), "--out", str(out), "--set", "grouping.scheme=pkg",
                          "--shard-block-rows", "2000"]) == 0
    stdout = capsys.readouterr().out
    assert "throughput" in stdout and "sim / pkg" in stdout
    for f in ("report.json", "timeseries.csv", "result.parquet", "report.png"):
        assert (out / f).is_file(), f
    rep = json.loads((out / "report.json").read_text())
    assert set(REQUIRED_KEYS) <= set(rep)
    assert rep["engine"] == "sim" and rep["scheme"] == "pkg"
    assert set(rep["latency_ms"]) == {"mean", "p50", "p95", "p99", "max"}
    assert set(rep["workers"][0]) >= {"id", "capacity", "processed", "utilization", "keys"}
    assert rep["result"] == {"path": "result.parquet", "rows": pq.read_table(
        out / "result.parquet").num_rows}
    assert "capacity_efficiency" in rep and "capacity_changes" in rep
    ts = pd.read_csv(out / "timeseries.csv")
    assert {"t_s", "throughput_msgs_per_s", "imbalance", "util_w0", "queue_w3"} <= set(ts)


def test_sim_hetero_topology(tmp_path: Path) -> None:
    """The CG-paper-like topology: CG follows the fast role as it moves."""
    out = tmp_path / "het"
    code = simulate_main([str(ROOT / "topologies" / "sim-hetero.yaml"), "--out", str(out),
                          "--no-progress", "--no-plot"])
    assert code == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["messages"]["input"] == rep["messages"]["processed"] == 1_200_000
    assert rep["scheme"] == "cg" and len(rep["capacity_changes"]) == 12
    ts = pd.read_csv(out / "timeseries.csv")
    vw = ts[[f"vw_w{i}" for i in range(10)]].to_numpy()
    t = ts["t_s"].to_numpy()
    before = vw[np.searchsorted(t, 19.0)]  # end of phase 1: workers 0-2 are fast
    end = vw[-1]  # phase 3: workers 6-8 are fast
    assert before[:3].min() > before[3:].max()
    assert end[6:9].min() > max(end[:6].max(), end[9])
    sg = simulate(ROOT / "topologies" / "sim-hetero.yaml", ["grouping.scheme=sg"]).report
    assert rep["throughput_msgs_per_s"] > 1.15 * sg["throughput_msgs_per_s"]


def test_latency_counts_from_the_scheduled_time_when_sources_fall_behind() -> None:
    """One worker at 10,000 msgs/s offered 20,000 msgs/s: backpressure holds the
    source back and that wait is latency (as in the real source)."""
    t = topo("kg", input={"format": "zipf", "messages": 10_000, "keys": 100},
             sources=1, workers={"count": 1, "service_us": 100}, run={"batch": 100, "rate": 20_000})
    r = sim(t)
    # the worker's pace (its first call reaches it CALL_TRANSIT_S after the
    # start; the last ack is back ACK_TRANSIT_S after it was done)
    assert r.report["duration_s"] == pytest.approx(1.0 + CALL_TRANSIT_S + ACK_TRANSIT_S,
                                                   rel=1e-3)
    # batch j's messages are due at its scheduled time, j x 5 ms; message k of it is
    # done at (100 j + k + 1) x 100 us (+ the transit): a mean of 252.55 ms (+ 3.5)
    j, k = np.arange(100)[:, None], np.arange(100)[None, :]
    done = (100 * j + k + 1) * 100e-6 + CALL_TRANSIT_S
    # (plus the source's CPU to route and send, 0.4 ms before the first batch is served)
    assert r.report["latency_ms"]["mean"] == pytest.approx(1e3 * float((done - j * 5e-3).mean()),
                                                           abs=0.5)


# --------------------------------------------------------------------------- every app, every scheme

_AGGREGATE = {"kind": "aggregate", "value": "amount", "aggs": ["count", "sum", "min", "max", "mean"]}
_TOPK = {"kind": "operator", "operator": str(ROOT / "examples" / "operators" / "topk.py") + ":TopK",
         "columns": ["ts"], "params": {"column": "ts", "k": 3}}
_APP_INPUTS = {
    "aggregate": (_AGGREGATE, {"format": "zipf", "messages": 10_000, "keys": 500, "skew": 1.1,
                               "seed": 5}),  # a float column with ~5% nulls
    "operator": (_TOPK, {"format": "parquet", "path": str(ROOT / "data" / "gitgit-files.parquet"),
                         "limit": 8_000}),
}


def _app_topology(scheme: str, app: str, workers: int):
    spec, inp = _APP_INPUTS[app]
    return load_topology({"input": inp, "sources": 2,
                          "workers": {"count": workers,
                                      "capacity": [1.0, 0.5, 0.25, 1.0][:workers]},
                          "grouping": {"scheme": scheme}, "app": spec, "run": {"batch": 500}})


@pytest.mark.parametrize("app", sorted(_APP_INPUTS))
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_every_scheme_splits_and_merges_every_app_exactly(scheme: str, app: str) -> None:
    """An aggregate of records with nulls and a user's operator (TopK), keys
    split over uneven workers by ``scheme``, equal the same operator run on one
    worker (the real engine runs each scheme with one of the two: test_run_e2e)."""
    from runtime.operators import table_diff

    order = [("key", "ascending"), ("rank", "ascending")] if app == "operator" else None
    want = simulate(_app_topology("kg", app, 1)).result
    got = simulate(_app_topology(scheme, app, 4)).result
    if order:
        want, got = want.sort_by(order), got.sort_by(order)
    assert want.num_rows > 400
    assert table_diff(got, want) is None


def test_warm_marks_this_checkout_of_the_kernels_compiled(tmp_path, monkeypatch) -> None:
    """``runtime.sim.warm`` (make setup; runtime.run when cold) leaves a marker in
    this version's cache directory; then nothing is started in the background.
    The marker is this checkout's: numba files each kernel under a subdirectory
    named after its source directory's absolute path, so another checkout of
    this version (same cache directory) has none of these kernels and is not
    warm. One marker per version made a fresh clone skip the warm-up, and its
    first run's sources compiled the kernels after its clock had started."""
    import hashlib
    import os
    from pathlib import Path

    import runtime
    from runtime.sim import warm

    warm.warm()
    assert warm.is_warm()
    assert warm.start_if_cold() is None
    kernels = Path(runtime.__file__).resolve().parent / "kernels"
    subdir = f"kernels_{hashlib.sha1(str(kernels).encode()).hexdigest()}"
    assert (Path(os.environ["NUMBA_CACHE_DIR"]) / subdir).is_dir()  # numba's layout
    monkeypatch.setattr(runtime, "__file__", str(tmp_path / "runtime" / "__init__.py"))
    assert not warm.is_warm()  # another checkout of the same sources


def test_a_warm_up_deletes_other_versions_kernel_caches_unused_for_weeks(
        tmp_path, monkeypatch) -> None:
    """Each update of the sources makes a new cache directory; a warm-up
    deletes the other versions' that no run used for ``PRUNE_AFTER_DAYS``,
    and nothing else. A run of a warm version marks its cache used."""
    import os
    import time

    from runtime.sim import warm

    now = time.time()
    here = tmp_path / "numba-00000000000000aa"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(here))
    old, recent = tmp_path / "numba-00000000000000bb", tmp_path / "numba-00000000000000cc"
    others = [tmp_path / "numba-notours", tmp_path / "jvm-036c3d83479f"]
    for d in (here, old, recent, *others):
        (d / "sub").mkdir(parents=True)
    (tmp_path / "numba-00000000000000dd").write_text("a file")
    weeks, days = now - (warm.PRUNE_AFTER_DAYS + 1) * 86_400, now - 86_400
    for p in (here, old, *others, tmp_path / "numba-00000000000000dd"):
        os.utime(p, (weeks, weeks))
    os.utime(recent, (days, days))
    warm._marker().touch()
    os.utime(here, (weeks, weeks))
    assert warm.start_if_cold() is None  # warm: used now
    assert here.stat().st_mtime > days
    assert warm.prune(now) == [old]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [here.name, recent.name, "numba-00000000000000dd", *(p.name for p in others)])


def test_the_warm_up_calls_the_kernels_a_run_calls_that_its_simulations_miss() -> None:
    """In a fresh process, ``warm()`` calls acg's admission route (a source
    takes it once it knows what each worker holds: paced, never saturated,
    and the warm-up's simulations were all saturated) and the heavy-hitters
    operator's Space-Saving kernels (every simulation counted words). Missed,
    a cold first run compiled them in its actors mid-stream: acg's route cost
    its sources 0.8-0.9 s."""
    code = ("from runtime.sim import warm; from runtime.grouping import acg; "
            "from runtime.kernels import sketches; warm.warm(); "
            "print(len(acg.porc_admit_route.signatures), "
            "len(sketches.ss_update_many.signatures))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1"]


def test_acg_measures_a_duty_cycled_worker_at_its_capacity_under_partial_load() -> None:
    """At 0.8 of capacity a 0.2 worker's calls often fit in a running part of
    its duty cycle; its measured service rate is still 0.2 of full speed
    (``RateMeter``). Counting its busy seconds as they were, this case
    measured it 11% fast (887 msgs/s for 800), the real engine 1.4-1.6x."""
    t = topo("acg", input={"messages": 60_000},
             workers={"count": 4, "capacity": [1, 1, 1, 0.2], "service_us": 250,
                      "throttle": "duty-cycle"},
             run={"batch": 1000, "rate": 0.8 * 3.2 * 4000})
    rates = sim(t).report["coordinator"]["rates"]
    assert rates[3] == pytest.approx(0.2 * 4000, rel=0.05)
    assert rates[:3] == pytest.approx([4000] * 3, rel=0.01)
