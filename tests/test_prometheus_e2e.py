"""``runtime.run --prometheus``: a real Prometheus server (Debian's
``prometheus``) scrapes the run's Ray metrics; queried while the run goes on,
it has the ``hs_*`` series, and it is gone once the run ends.

Nothing waits on the clock to decide: the test polls the server until the
series answer or the run ends (then it fails). Once they have answered the
run is stopped as a user stops it (SIGTERM): the server must be gone then
too, and the test does not wait out the rest of the stream.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="no prometheus binary (.ci/run installs Debian's)"),
]

ROOT = Path(__file__).resolve().parent.parent


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expr)}"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return list(json.loads(r.read())["data"]["result"])
    except OSError:
        return []


def test_prometheus_scrapes_the_runs_hs_series_while_it_runs(tmp_path) -> None:
    port = 19090 + os.getpid() % 500
    topo = tmp_path / "t.yaml"
    topo.write_text(yaml.safe_dump({
        "name": "prometheus-e2e",
        "input": {"format": "zipf", "messages": 400_000, "keys": 1000},
        "workers": {"count": 2, "capacity": [1, 0.5], "service_us": 50},
        "grouping": {"scheme": "acg"},
        "run": {"rate": 10_000},  # 40 s of stream: many scrapes
    }))
    out = tmp_path / "out"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    run = subprocess.Popen([sys.executable, "-m", "runtime.run", str(topo), "--out", str(out),
                            "--no-progress", "--prometheus", str(port)],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    seen: dict[str, list[dict]] = {}
    try:
        while run.poll() is None and len(seen) < 3:
            for expr in ("ray_hs_worker_processed_total", "ray_hs_run_acked",
                         "ray_hs_worker_utilization"):
                found = [r for r in _query(port, expr)
                         if r["metric"].get("run", "").startswith("prometheus-e2e")]
                if found and float(found[0]["value"][1]) > 0 or expr in seen:
                    seen.setdefault(expr, found)
            time.sleep(0.5)
        if run.poll() is None:  # seen: stop the run (the rest of its stream is not needed)
            run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    # 130: stopped by the SIGTERM (interrupted); 0: it had ended just before
    assert run.returncode in (0, 130), stderr[-3000:]
    assert run.returncode == 0 or "interrupted" in stderr, stderr[-3000:]
    assert "SIGTERM received" not in stderr  # ours, not Ray's handler (a stack dump, exit 15)
    assert len(seen) == 3, f"only {sorted(seen)} answered while the run went on"
    workers = {r["metric"]["actor"] for r in seen["ray_hs_worker_processed_total"]}
    assert workers <= {"worker-0", "worker-1"} and workers
    assert f"prometheus: http://127.0.0.1:{port}" in stderr
    assert (out / "prometheus" / "prometheus.yml").exists()
    assert not _query(port, "up"), "the server outlived the run"
