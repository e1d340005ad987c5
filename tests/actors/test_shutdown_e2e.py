"""``actors.engine.shutdown_ray`` on a cluster this process started: every one
of Ray's own processes is gone when it returns, the autoscaler monitor too
(it is killed before Ray's own shut-down, which would give it a second to
exit on SIGTERM), and the dashboard, which ``dashboard_beside_raylet``
started from a thread beside the raylet and which answered before
``ray.init`` returned. Run in a process of its own: the test session's Ray
must stay up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import ray

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, ray, urllib.request
from ray._private import worker
from actors.engine import dashboard_beside_raylet, shutdown_ray
with dashboard_beside_raylet():
    ctx = ray.init(include_dashboard=True, logging_level="ERROR", log_to_driver=False)
with urllib.request.urlopen(f"http://{ctx.dashboard_url}/api/version", timeout=30) as r:
    version = json.load(r)["ray_version"]
procs = {k: [i.process.pid for i in v] for k, v in worker._global_node.all_processes.items()}
shutdown_ray()
print(json.dumps({"procs": procs, "version": version}))
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_shutdown_leaves_none_of_rays_processes_and_stops_the_monitor_too() -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    said = json.loads(p.stdout.strip().splitlines()[-1])
    procs = said["procs"]
    assert said["version"] == ray.__version__  # the dashboard answered
    assert procs.get("monitor") and procs.get("raylet") and procs.get("gcs_server")
    assert procs.get("dashboard")
    left = {k: [pid for pid in v if _alive(pid)] for k, v in procs.items()}
    assert not any(left.values()), left
