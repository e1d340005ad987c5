"""``actors.engine.shutdown_ray`` on a cluster this process started: every one
of Ray's own processes is gone when it returns, the autoscaler monitor too
(it is killed before Ray's own shut-down, which would give it a second to
exit on SIGTERM). Run in a process of its own: the test session's Ray must
stay up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, ray
from ray._private import worker
from actors.engine import shutdown_ray
ray.init(include_dashboard=True, logging_level="ERROR", log_to_driver=False)
procs = {k: [i.process.pid for i in v] for k, v in worker._global_node.all_processes.items()}
shutdown_ray()
print(json.dumps(procs))
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
    procs = json.loads(p.stdout.strip().splitlines()[-1])
    assert procs.get("monitor") and procs.get("raylet") and procs.get("gcs_server")
    left = {k: [pid for pid in v if _alive(pid)] for k, v in procs.items()}
    assert not any(left.values()), left
