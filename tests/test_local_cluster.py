"""scripts/local_cluster.py without starting Ray: node specs, the ``ray start``
command lines (explicit, distinct ports; nothing on Ray's defaults), and that
stopping finds and ends only processes naming this cluster's temp dirs (real
child processes and the wall clock: e2e)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import local_cluster as lc  # noqa: E402

RAY_DEFAULT_PORTS = {6379, 8265, 10001, 52365}


def test_parse_node() -> None:
    n = lc.parse_node("fast:cpus=2,fast=100,gpu_like=0.5")
    assert (n.name, n.cpus, n.resources) == ("fast", 2, {"fast": 100.0, "gpu_like": 0.5})
    assert lc.parse_node("head").cpus == 1
    for bad in ("fast:cpus=x", "fast:cpus=1.5", ":cpus=1", "a b:cpus=1", "fast:fast"):
        with pytest.raises(ValueError):
            lc.parse_node(bad)


def _flags(cmd: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(cmd, cmd[1:], strict=False) if a.startswith("--")}


def test_commands_use_explicit_distinct_ports_off_ray_defaults() -> None:
    specs = [lc.parse_node(t) for t in lc.DEFAULT_NODES]
    for s in specs:
        s.temp_dir = f"/tmp/hs-ray-6390/{s.name}"
    cmds = [lc.node_command(s, i, port=6390, port_base=lc.port_base_for(6390))
            for i, s in enumerate(specs)]
    ports: list[int] = []
    for i, cmd in enumerate(cmds):
        f = _flags(cmd)
        assert f["--temp-dir"] == specs[i].temp_dir and f["--num-cpus"] == str(specs[i].cpus)
        for k in ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                  "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                  "--runtime-env-agent-port", "--ray-client-server-port", "--port"):
            if k in f:
                ports.append(int(f[k]))
        lo, hi = int(f["--min-worker-port"]), int(f["--max-worker-port"])
        assert hi - lo == 99
        ports += list(range(lo, hi + 1))
    assert len(ports) == len(set(ports)), "two nodes share a port"
    assert not RAY_DEFAULT_PORTS & set(ports)
    head, fast = _flags(cmds[0]), _flags(cmds[1])
    assert "--head" in cmds[0] and head["--include-dashboard"] == "false"
    assert fast["--address"] == "127.0.0.1:6390" and fast["--resources"] == '{"fast": 100.0}'
    assert "--head" not in cmds[1] and "--port" not in fast


def test_two_clusters_on_different_ports_do_not_overlap() -> None:
    a, b = lc.port_base_for(6390), lc.port_base_for(6391)
    assert abs(a - b) >= 10 * 10 + 100 * 10  # fixed ports and worker ranges of 10 nodes


@pytest.mark.e2e
def test_terminate_only_processes_naming_the_marker(tmp_path: Path) -> None:
    marker = str(tmp_path / "n1") + "/"
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              str(tmp_path / "n10")])
    try:
        deadline = time.time() + 5
        while mine.pid not in lc.pids_naming(marker) and time.time() < deadline:
            time.sleep(0.05)
        pids = lc.pids_naming(marker)
        assert pids == [mine.pid]
        assert lc.terminate(pids, grace_s=5) == []
        assert mine.wait(timeout=5) == -signal.SIGTERM  # ended by the first signal
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_status_and_kill_node_without_a_cluster(capsys) -> None:
    assert lc.main(["status", "--port", "6399"]) == 1
    assert "no cluster on port 6399" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no node 'slow'"):
        lc.main(["kill-node", "slow", "--port", "6399"])
