"""scripts/vs_flink.py: the harness against Apache Flink.

The e2e test runs all three jobs on a tiny input on both real engines (our
runtime through ``python -m runtime.run`` / ``runtime.compare``, Flink 2.3 as a
standalone cluster on loopback, built in its own venv on first use: CI has
package-registry access) and checks that both are exact and that no Flink
process is left afterwards. The fast test checks that a venv that cannot be
installed fails with one line, without hanging.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import vs_flink  # noqa: E402


def _flink_processes(marker: str) -> list[int]:
    """Every process of ours whose environment or command line names ``marker``
    (the cluster's conf directory: the JVMs and their Python workers inherit it)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) or \
                    marker in p.environ().get("FLINK_CONF_DIR", ""):
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def test_an_uninstallable_flink_fails_with_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HETERO_FLINK_VENV", str(tmp_path / "venv"))
    # no index, no find-links: pip cannot find apache-flink (as with no registry)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(vs_flink.HarnessError) as e:
        vs_flink.ensure_flink(log=lambda m: None)
    msg = str(e.value)
    assert "pip install apache-flink==" in msg and "\n" not in msg
    assert not (tmp_path / "venv").exists()  # nothing half-built left to be used


def test_install_only_fails_with_one_line_and_exit_1(tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    monkeypatch.setenv("HETERO_FLINK_VENV", str(tmp_path / "venv"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert vs_flink.main(["--install-only"]) == 1
    err = capsys.readouterr().err.strip().splitlines()  # progress, then the error
    assert err[-1].startswith("error: flink: ") and "pip install apache-flink==" in err[-1]
    assert not (tmp_path / "venv").exists()


@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_both_engines_exact_and_no_flink_process_left(tmp_path: Path) -> None:
    out = tmp_path / "vs"
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    started = time.time()
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "vs_flink.py"), "--out", str(out),
         "--workers", "2", "--slow", "1", "--rows", "3000", "--count-rows", "20000",
         # one stateless Flink run: each takes a fresh cluster (~20 s); the plain
         # rebalance is the same job with the adaptive partitioner's flag off
         "--rebalance", "adaptive"],
        capture_output=True, text=True, env=env, timeout=1400, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    table = [ln for ln in p.stdout.splitlines() if ln.startswith("| ")][1:]  # no header
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in table]
    seen = {(c[0], c[1], c[2]) for c in cells}
    assert {("count", "ours", "acg"), ("count", "ours", "acg (warm)"),
            ("count", "flink", "GROUP BY"),
            ("keyed", "flink", "keyBy"), ("keyed", "ours", "kg"), ("keyed", "ours", "acg"),
            ("stateless", "flink", "rebalance+adaptive"), ("stateless", "ours", "acg")} <= seen
    assert ("stateless", "flink", "rebalance") not in seen  # --rebalance adaptive
    assert all(c[8] == "yes" for c in cells)  # every result equals the exact answer
    assert _flink_processes(str(out / "flink")) == []
    # Flink's scripts write pid files (default /tmp/flink-<user>-<service>.pid): in its dir
    assert [p for p in Path("/tmp").glob("flink-*.pid") if p.stat().st_mtime >= started] == []
    assert (out / "vs_flink.md").exists()
