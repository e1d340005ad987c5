"""``python -m runtime.compare`` on the simulator: one run per scheme, same input,
the side-by-side table and files; bad arguments exit 2 with one line. (The Ray
engine path is the same driver as ``runtime.run``, covered by the e2e tests.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from runtime.compare import main

ROOT = Path(__file__).resolve().parent.parent


def write_topology(tmp_path: Path, **workers) -> Path:
    t = {
        "name": "cmp",
        "input": {"format": "zipf", "messages": 20_000, "keys": 1_000, "skew": 1.2},
        "sources": 1,
        "workers": {"count": 4, "service_us": 50, "capacity": [1, 1, 1, 0.25], **workers},
        "grouping": {"scheme": "kg", "cg": {"eps": 0.1}},
        "run": {"batch": 500, "slot_s": 0.05},
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(t))
    return path


def test_compare_runs_every_scheme_on_the_same_input(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main([str(write_topology(tmp_path)), "--engine", "sim", "--schemes", "kg,sg,cg",
                 "--out", str(out), "--no-progress"]) == 0
    table = pd.read_csv(out / "compare.csv")
    assert table["scheme"].tolist() == ["kg", "sg", "cg"]
    assert (table["messages"] == 20_000).all()
    for s in ("kg", "sg", "cg"):
        report = json.loads((out / s / "report.json").read_text())
        assert report["scheme"] == s and report["engine"] == "sim"
        assert report["messages"]["processed"] == 20_000
    by = table.set_index("scheme")
    assert by.loc["kg", "replication"] == pytest.approx(1.0)
    assert by.loc["sg", "replication"] > by.loc["kg", "replication"]
    # a slow worker: the capacity-blind hash is the slowest, CG the fastest
    assert by.loc["cg", "throughput_msgs_per_s"] > by.loc["kg", "throughput_msgs_per_s"]
    assert (out / "compare.png").stat().st_size > 0
    md = (out / "compare.md").read_text()
    assert md.startswith("# cmp on sim, rate 0 (saturated)\n")
    assert "| kg |" in md and "| cg |" in md
    assert "| cg |" in capsys.readouterr().out
    # where each run's time went: only the first run of the session pays the
    # start-up (the command's, here this test process's); every report has phases
    assert by.loc["kg", "startup_s"] > 0
    assert (by.loc[["sg", "cg"], "startup_s"] == 0).all()
    assert (table[["input_s", "stream_s", "finish_s"]] >= 0).all().all()
    for s in ("kg", "sg", "cg"):
        ph = json.loads((out / s / "report.json").read_text())["phases"]
        assert ph["stream"] == pytest.approx(by.loc[s, "stream_s"])


def test_offered_sets_the_rate_from_the_capacities(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main([str(write_topology(tmp_path)), "--engine", "sim", "--schemes", "pkg",
                 "--offered", "0.5", "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "pkg" / "report.json").read_text())
    full = (1 + 1 + 1 + 0.25) * 1e6 / 50
    assert report["topology"]["rate"] == pytest.approx(0.5 * full)
    assert (out / "compare.md").read_text().startswith("# cmp on sim, offered 0.5x capacity\n")


def test_the_heading_names_the_topologys_own_rate(tmp_path: Path) -> None:
    """A topology paced by its own ``run.rate`` (no ``--offered``) is not
    called saturated."""
    out = tmp_path / "out"
    assert main([str(write_topology(tmp_path)), "--engine", "sim", "--schemes", "pkg",
                 "--set", "run.rate=20000", "--out", str(out), "--no-progress"]) == 0
    assert (out / "compare.md").read_text().startswith("# cmp on sim, rate 20,000 msgs/s\n")


@pytest.mark.parametrize(("args", "needle"), [
    (["--schemes", "kg,nope"], "--schemes: unknown scheme 'nope'"),
    (["--schemes", "kg,kg"], "--schemes: a scheme is listed twice"),
    (["--offered", "-1"], "--offered: must be > 0"),
    (["--engine", "spark"], "invalid choice"),
    (["--set", "workers.count=0"], "workers.count"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args, needle) -> None:
    p = subprocess.run([sys.executable, "-m", "runtime.compare",
                        str(write_topology(tmp_path)), "--engine", "sim", *args]
                       if "--engine" not in args else
                       [sys.executable, "-m", "runtime.compare", str(write_topology(tmp_path)),
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert not list(tmp_path.glob("runs*")) and not (ROOT / "runs" / "compare-cmp").exists()


def test_offered_needs_a_service_time(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "runtime.compare",
                        str(write_topology(tmp_path, service_us=0, capacity=1)),
                        "--engine", "sim", "--offered", "0.8"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip() == "error: --offered: needs workers.service_us > 0 (got 0.0)"
