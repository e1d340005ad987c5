"""The live view (runtime.top) on a recorded sample of a Ray node's Prometheus
endpoint (tests/data/telemetry_metrics.prom: topologies/demo.yaml, ~10 s into
streaming; worker 3 at capacity 0.3, worker 1 about to drop to 0.5)."""

from __future__ import annotations

import http.server
import json
import math
import threading
from pathlib import Path

import pytest

from runtime import top
from runtime.top import bar, collect, local_endpoints, parse_prometheus, pick_runs, render

SAMPLE = Path(__file__).resolve().parent / "data" / "telemetry_metrics.prom"
RUN = "demo-20261123T114718632794"


@pytest.fixture(scope="module")
def text() -> str:
    return SAMPLE.read_text()


def test_parse_keeps_only_our_metrics(text: str) -> None:
    samples = parse_prometheus(text)
    assert samples and all(s.name.startswith("hs_") for s in samples)
    assert "ray_tasks" in text and not any("tasks" in s.name for s in samples)
    names = {s.name for s in samples}
    assert {"hs_worker_processed_total", "hs_worker_utilization", "hs_source_vw_owned",
            "hs_source_signals_total", "hs_run_imbalance", "hs_heartbeat_seconds",
            "hs_worker_batch_latency_seconds_bucket"} <= names
    b = [s for s in samples if s.name == "hs_worker_batch_latency_seconds_bucket"]
    assert {s.labels["le"] for s in b} >= {"0.001", "+Inf"}
    assert all(s.labels["run"] == RUN for s in samples)
    assert all(s.labels["Component"] == "core_worker" for s in samples)


def test_parse_edge_cases() -> None:
    text = "\n".join([
        "# HELP ray_hs_x a help line",
        'ray_hs_x{a="q\\"uote",b="back\\\\slash",c="new\\nline"} 1.5',
        "ray_hs_y 3 1712345678000",  # no labels, a timestamp
        'ray_hs_z{run="r"} NaN',
        'ray_hs_w{run="r"} +Inf',
        "ray_hs_broken{run=} 1",
        'ray_hs_bad{run="r"} notanumber',
        'ray_other{run="r"} 1',
    ])
    got = {s.name: s for s in parse_prometheus(text)}
    assert got["hs_x"].labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert got["hs_x"].value == 1.5
    assert got["hs_y"].labels == {} and got["hs_y"].value == 3
    assert math.isnan(got["hs_z"].value) and got["hs_w"].value == math.inf
    assert "hs_bad" not in got and "other" not in got


def test_collect_builds_the_run_view(text: str) -> None:
    runs = collect(parse_prometheus(text))
    assert list(runs) == [RUN]
    r = runs[RUN]
    assert r.info == {"name": "demo", "scheme": "cg", "app": "wordcount", "workers": "4",
                      "sources": "2"}
    assert r.messages == 300_000 and r.acked == 97_887
    assert r.imbalance == pytest.approx(0.3125)
    assert sorted(r.workers) == [0, 1, 2, 3] and sorted(r.sources) == [0, 1]
    w3 = r.workers[3]
    assert w3["capacity"] == 0.3 and w3["stopped"] == pytest.approx(0.736, abs=1e-3)
    assert w3["processed"] == 10_038 and w3["rate"] == pytest.approx(1318.5, abs=0.1)
    assert r.workers[0]["queue_msgs"] == 1198 and r.workers[2]["p50_s"] == pytest.approx(0.1043,
                                                                                         abs=1e-4)
    assert r.sources[0] == {"routed": 50_000, "acked": 47_334, "migrations": 19,
                            "signals_increase": 34, "signals_decrease": 30}
    # VWs owned: the mean over the sources' tables (each maps 40 VWs)
    assert [r.vw_owned(w) for w in range(4)] == [11.5, 10.5, 12.0, 6.0]
    assert sum(r.vw_owned(w) or 0 for w in range(4)) == 40
    assert r.utilization_imbalance() == pytest.approx(0.9775 - 0.7373, abs=1e-3)


def test_render_a_live_frame(text: str) -> None:
    r = collect(parse_prometheus(text))[RUN]
    out = render(r, r.heartbeat + 0.5, width=110)
    lines = out.splitlines()
    assert lines[0].startswith(f"run {RUN}") and "scheme cg" in lines[0]
    assert "running" in lines[1]
    assert "97,887 / 300,000 (33%)" in out and "imbalance I(t) 0.24" in out  # from util
    assert "throughput 13,494 msgs/s" in out
    first = next(i for i, ln in enumerate(lines) if ln.split()[:1] == ["worker"]) + 1
    rows = {int(ln.split()[0]): ln for ln in lines[first:first + 4]}
    assert "0.30" in rows[3] and "1,318" in rows[3] and rows[3].rstrip().endswith(" 6")
    assert rows[0].rstrip().endswith("11.5")
    assert "█" * 22 + " " in rows[0]  # the fastest worker's rate bar is full (110 - 88)
    assert "\x1b[" not in out
    assert max(len(ln) for ln in lines) < 110
    src = out[out.index("source"):]
    assert "50,000" in src and "34 / 30" in src


def test_render_stale_color_and_missing_parts(text: str) -> None:
    r = collect(parse_prometheus(text))[RUN]
    stale = render(r, r.heartbeat + 100)
    assert "no update for 100 s" in stale
    colored = render(r, r.heartbeat, color=True)
    assert "\x1b[31m" in colored and "\x1b[32m" in colored  # busy red, idle green
    # a run seen only through its workers (no driver, no sources, no VWs)
    only = [s for s in parse_prometheus(text) if s.labels["actor"].startswith("worker-")]
    r2 = collect(only)[RUN]
    out = render(r2, r2.heartbeat)
    assert "VWs" not in out and "source" not in out and "imbalance I(t) 0.24" in out
    # no utilization at all: the driver's sampled imbalance
    drv = collect([s for s in parse_prometheus(text) if s.labels["actor"] == "driver"])[RUN]
    assert "imbalance I(t) 0.31" in render(drv, drv.heartbeat)


def test_pick_runs_newest_first_and_by_name(text: str) -> None:
    samples = parse_prometheus(text)
    older = [type(s)(s.name, {**s.labels, "run": "other-1"},
                     s.value - 60 if s.name == "hs_heartbeat_seconds" else s.value)
             for s in samples]
    runs = collect(samples + older)
    assert [r.run for r in pick_runs(runs)] == [RUN, "other-1"]
    assert [r.run for r in pick_runs(runs, "other")] == ["other-1"]
    assert pick_runs(runs, "nope") == []


def test_bar() -> None:
    assert bar(0.5, 4) == "██··"
    assert bar(1.5, 3) == "███" and bar(-1, 3) == "···" and bar(math.nan, 2) == "··"
    assert bar(0.5, 1) == "▌" and bar(1 / 8, 1) == "▏" and bar(1 / 16, 2) == "▏·"
    assert all(len(bar(f / 10, 7)) == 7 for f in range(11))


def test_local_endpoints(tmp_path: Path) -> None:
    a = tmp_path / "session_2026-01-01_00-00-00_1"
    a.mkdir()
    (a / "prom_metrics_service_discovery.json").write_text(json.dumps(
        [{"labels": {"job": "ray"}, "targets": ["10.0.0.1:1234", "10.0.0.2:1234"]}]))
    (a / "metrics_export_port_abc").write_text("9999")
    b = tmp_path / "session_2026-01-02_00-00-00_2"
    b.mkdir()
    (b / "metrics_export_port_def").write_text("4321\n")
    (b / "prom_metrics_service_discovery.json").write_text("not json")
    (tmp_path / "session_latest").symlink_to(b)
    import os

    os.utime(a, (1, 1))  # b is the newest session
    assert local_endpoints(tmp_path) == ["127.0.0.1:4321", "10.0.0.1:1234", "10.0.0.2:1234"]
    assert local_endpoints(tmp_path / "missing") == []


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def test_main_once_against_an_http_endpoint(text: str, capsys, monkeypatch) -> None:
    _Handler.body = text.encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert top.main(["--once", "--url", f"127.0.0.1:{port}"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"run {RUN}") and "VWs moved" in out
        assert top.main(["--once", "--url", f"http://127.0.0.1:{port}/metrics",
                         "--run", "nothing-like-this"]) == 1
        assert "waiting for a run matching 'nothing-like-this'" in capsys.readouterr().out
    finally:
        server.shutdown()
        server.server_close()
    assert top.main(["--once", "--url", f"127.0.0.1:{port}"]) == 1  # nobody answers
    assert "0 of 1 metrics endpoint(s) answered" in capsys.readouterr().out


def test_a_windowed_stream_shows_its_watermark_and_open_windows(text: str) -> None:
    run = f'run="{RUN}",actor="driver"'
    extra = (f'ray_hs_run_watermark{{{run},unit="us"}} 1795621711664649\n'
             f'ray_hs_run_windows_open{{{run}}} 3\n')
    r = collect(parse_prometheus(text + extra))[RUN]
    assert r.watermark == (1795621711664649, "us") and r.windows_open == 3
    out = render(r, r.heartbeat + 0.5, width=110)
    assert "watermark 2026-11-25 15:48:31 UTC   open windows 3" in out
    r.watermark = (12345.0, "int")
    assert "watermark 12,345   open windows 3" in render(r, r.heartbeat + 0.5, width=110)
