"""scripts/stress_grid.py and scripts/stress_recovery.py on the simulator (tiny
grids), the recovery measure on constructed time series, and one e2e run of
the grid on the real engine in the shared Ray + Spark session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import stress_common as sc  # noqa: E402
import stress_grid as sg  # noqa: E402
import stress_recovery as sr  # noqa: E402

TINY_GRID = ["--schemes", "kg,cg", "--hetero", "homo,slow1@0.3", "--skews", "0.8,1.4",
             "--workers", "4", "--messages", "20000", "--keys", "1000",
             "--service-us", "100", "--no-progress"]


# ----------------------------------------------------------------------------- grid


def test_grid_csv_has_every_cell_and_consistent_metrics(tmp_path: Path, capsys) -> None:
    out = tmp_path / "grid"
    assert sg.main([*TINY_GRID, "--out", str(out)]) == 0
    df = pd.read_csv(out / "grid.csv")
    assert len(df) == 8
    cells = set(zip(df["hetero"], df["skew"], df["scheme"], strict=True))
    assert cells == {(h, z, s) for h in ("homo", "slow1@0.3") for z in (0.8, 1.4)
                     for s in ("kg", "cg")}
    assert (df["engine"] == "sim").all() and (df["messages"] == 20_000).all()
    # efficiency = throughput / total capacity, with the cell's capacities
    slow = df[df["hetero"] == "slow1@0.3"]
    assert (slow["capacities"] == "1 1 1 0.3").all()
    assert np.allclose(slow["total_capacity_msgs_per_s"], 3.3 * 1e6 / 100)
    assert np.allclose(df["capacity_efficiency"],
                       df["throughput_msgs_per_s"] / df["total_capacity_msgs_per_s"], rtol=1e-6)
    assert ((df["capacity_efficiency"] > 0) & (df["capacity_efficiency"] <= 1.01)).all()
    assert (df["latency_p99_ms"] >= df["latency_p50_ms"]).all()
    by = df.set_index(["hetero", "skew", "scheme"])
    assert (df[df["scheme"] == "kg"]["replication"] == 1.0).all()
    # under heavy skew on equal workers KG is stuck on the hot key's worker; CG is not
    assert (by.loc[("homo", 1.4, "cg"), "capacity_efficiency"]
            > 1.5 * by.loc[("homo", 1.4, "kg"), "capacity_efficiency"])
    for s in ("kg", "cg"):
        assert (out / "sim" / "slow1@0.3-z1.4" / s / "report.json").exists()
    md = (out / "grid.md").read_text()
    assert "| homo | 1.4 |" in md and "| sim | slow1@0.3 | 0.8 | cg |" in md
    assert (out / "grid-sim.png").stat().st_size > 0
    assert "| slow1@0.3 | 0.8 |" in capsys.readouterr().out


def test_grid_offered_sets_the_rate(tmp_path: Path) -> None:
    args = sg.build_parser().parse_args([*TINY_GRID, "--offered", "0.5"])
    cfg = sg.settings(args)
    topo = sg.cell_topology(cfg, cfg["hetero"][1], 1.4, "pkg")
    assert topo.run.rate == pytest.approx(0.5 * 3.3 * 1e6 / 100)
    assert topo.input.skew == 1.4 and topo.grouping.scheme == "pkg"


def test_quick_grid_is_smaller_and_options_override_it() -> None:
    cfg = sg.settings(sg.build_parser().parse_args(["--quick"]))
    full = sg.settings(sg.build_parser().parse_args([]))
    n_quick = len(cfg["hetero"]) * len(cfg["skews"]) * len(cfg["schemes"])
    n_full = len(full["hetero"]) * len(full["skews"]) * len(full["schemes"])
    assert n_quick < n_full and cfg["messages"] < full["messages"]
    cfg = sg.settings(sg.build_parser().parse_args(["--quick", "--workers", "6"]))
    assert cfg["workers"] == 6


def test_heterogeneity_specs() -> None:
    fast, slow, homo = sc.parse_hetero("fast3x5,slow2@0.3,homo", 10)
    assert fast.capacities(10) == [1, 1, 1] + [0.2] * 7
    assert slow.capacities(10) == [1] * 8 + [0.3] * 2
    assert homo.capacities(10) == [1] * 10
    assert all(0 < c <= 1 for h in (fast, slow) for c in h.capacities(10))


BAD_ARGUMENTS = [
    ("grid", ["--engine", "spark"], "invalid choice"),
    ("grid", ["--schemes", "kg,nope"], "--schemes: unknown scheme 'nope'"),
    ("grid", ["--hetero", "fast10x5"], "y must be in 1..9"),
    ("grid", ["--hetero", "fast3x1"], "z must be > 1"),
    ("grid", ["--hetero", "slow2@1.5"], "must be in (0, 1)"),
    ("grid", ["--hetero", "bogus"], "unknown heterogeneity 'bogus'"),
    ("grid", ["--skews", "1,-1"], "--skews: every value must be >= 0"),
    ("grid", ["--skews", "x"], "--skews: not a number"),
    ("grid", ["--workers", "1"], "--workers: must be >= 2"),
    ("grid", ["--offered", "0"], "--offered: must be > 0"),
    ("grid", ["--set", "workers.service_us=-3"], "workers.service_us"),
    ("recovery", ["--scenarios", "nope"], "--scenarios: unknown scenario 'nope'"),
    ("recovery", ["--threshold", "2"], "--threshold: must be in (0, 1]"),
    ("recovery", ["--phase-s", "0"], "--phase-s: must be > 0"),
    ("recovery", ["--workers", "2"], "capacity-change needs >= 3 workers"),
    ("recovery", ["--engine", "both", "--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize(("script", "args", "needle"), BAD_ARGUMENTS)
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys, script, args,
                                            needle) -> None:
    main = sg.main if script == "grid" else sr.main
    with pytest.raises(SystemExit) as e:
        main([*args, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("script", "args"), [
    ("stress_grid.py", ["--hetero", "fast3x1"]),
    ("stress_recovery.py", ["--set", "workers.count=0"]),
])
def test_the_scripts_exit_2_from_the_command_line(tmp_path: Path, script, args) -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- recovery


def series(eff: list[float], caps: list[list[float]] | None = None, slot_s: float = 0.5,
           service_us: float = 100.0) -> pd.DataFrame:
    """A timeseries.csv frame whose per-interval efficiency is ``eff``."""
    n = len(eff)
    caps = caps or [[1.0, 1.0]] * n
    total = np.array([sum(c) for c in caps]) * 1e6 / service_us
    cols = {"t_s": (np.arange(n) + 1) * slot_s, "throughput_msgs_per_s": np.array(eff) * total}
    for w in range(len(caps[0])):
        cols[f"capacity_w{w}"] = [c[w] for c in caps]
    return pd.DataFrame(cols)


def test_efficiency_follows_the_capacity_in_force() -> None:
    caps = [[1.0, 1.0]] * 4 + [[1.0, 0.25]] * 4
    ts = series([0.5] * 8, caps)
    ts["throughput_msgs_per_s"] = 10_000.0  # constant rate, total capacity drops
    eff = sc.efficiency_series(ts, 100.0)
    assert eff["t_start"].tolist()[:2] == [0.0, 0.5]
    assert np.allclose(eff["efficiency"], [0.5] * 4 + [0.8] * 4)


def test_recovery_time_on_a_constructed_series() -> None:
    # 0.5 s slots: 1.0 until 10 s, then 0.3 with a one-slot spike to 1.0 at
    # 12 s (noise, shorter than the 2 s smoothing), back to 0.95 from 14 s
    eff = [1.0] * 20 + [0.3] * 4 + [1.0] + [0.3] * 3 + [0.95] * 20
    e = sc.efficiency_series(series(eff), 100.0)
    r = sr.recovery(e, 10.0, 24.0, threshold=0.9, smooth_s=2.0, level_s=5.0)
    assert r["recovery_s"] == pytest.approx(4.0)
    assert r["before"] == pytest.approx(1.0)
    assert r["level"] == pytest.approx(0.95)
    assert r["dip"] == pytest.approx(0.3)
    # recovered at 12 s; a one-slot dip to 0.8 at 15 s is noise under the 2 s
    # smoothing, without smoothing it would postpone the recovery to 5.5 s
    eff3 = [1.0] * 20 + [0.3] * 4 + [0.95] * 6 + [0.8] + [0.95] * 13
    e3 = sc.efficiency_series(series(eff3), 100.0)
    assert sr.recovery(e3, 10.0, 24.0, smooth_s=2.0)["recovery_s"] == pytest.approx(2.0)
    assert sr.recovery(e3, 10.0, 24.0, smooth_s=0.5)["recovery_s"] == pytest.approx(5.5)


def test_recovery_never_reports_the_level_reached() -> None:
    eff = [0.95] * 10 + [0.2] * 4 + [0.6] * 30
    e = sc.efficiency_series(series(eff), 100.0)
    r = sr.recovery(e, 5.0, 22.0, threshold=0.9, smooth_s=2.0, level_s=5.0)
    assert r["recovery_s"] is None
    assert r["level"] == pytest.approx(0.6) and r["before"] == pytest.approx(0.95)
    assert sr.cell(r) == "never (0.60)"
    # no dip at all: recovered at once
    r0 = sr.recovery(sc.efficiency_series(series([0.97] * 40), 100.0), 5.0, 20.0)
    assert r0["recovery_s"] == 0.0 and sr.cell(r0) == "0.0 s"


def test_recovery_is_not_claimed_before_a_delayed_drop() -> None:
    # efficiency stays high for 2 s after the disturbance (queues absorb it),
    # then settles at 0.4: never recovered, not "recovered at once"
    eff = [1.0] * 10 + [1.0] * 4 + [0.4] * 30
    e = sc.efficiency_series(series(eff), 100.0)
    r = sr.recovery(e, 5.0, 22.0, threshold=0.9, smooth_s=2.0, level_s=5.0)
    assert r["recovery_s"] is None and sr.cell(r) == "never (0.40)"
    # a dip, a recovery, a second dip, then a lasting recovery: the last one counts
    eff2 = [1.0] * 10 + [0.3] * 4 + [1.0] * 8 + [0.3] * 4 + [1.0] * 20
    r2 = sr.recovery(sc.efficiency_series(series(eff2), 100.0), 5.0, 23.0)
    assert r2["recovery_s"] == pytest.approx(8.0)


def test_cumulative_times_interpolate() -> None:
    e = sc.efficiency_series(series([0.5] * 10), 100.0)  # 10,000 msgs/s -> 5,000 per slot
    assert sr.cumulative_times(e, [5_000, 12_500, 1e9]) == pytest.approx(
        [0.5, 1.25, float("nan")], nan_ok=True)


def test_scenarios() -> None:
    cfg = sr.settings(sr.build_parser().parse_args([]))
    a = sr.build_scenario("capacity-change", cfg, "sim")
    assert a.capacities == [1, 1, 1] + [0.2] * 7
    caps = list(a.capacities)
    for t in a.disturbance_times():
        for at, w, c in a.changes:
            if at == t:
                caps[w] = c
        assert sum(caps) == pytest.approx(sum(a.capacities))  # the total stays constant
    assert caps == [0.2] * 6 + [1, 1, 1, 0.2]  # the fast role moved twice
    assert a.disturbance_times() == [30.0, 60.0]
    b = sr.build_scenario("hot-keys", cfg, "sim")
    assert b.messages == 4 * b.shift_every and b.shift_every % (2 * 65_536) == 0
    assert b.capacities == [1] * 8 + [0.3] * 2
    c = sr.build_scenario("slowdown", cfg, "sim")
    assert c.changes == [(30.0, 0, 0.1)] and c.messages % (2 * 65_536) == 0
    # the real engine cuts the stream into 4 x sources blocks
    r = sr.build_scenario("hot-keys", sr.settings(sr.build_parser().parse_args(["--quick"])),
                          "ray")
    assert r.shift_every % (r.messages // 8) == 0


def test_acg_recovers_from_a_sudden_slowdown_kg_does_not(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    assert sr.main(["--scenarios", "slowdown", "--schemes", "kg,acg", "--workers", "4",
                    "--phase-s", "5", "--service-us", "200", "--keys", "1000",
                    "--sources", "1", "--no-progress", "--out", str(out)]) == 0
    df = pd.read_csv(out / "recovery.csv").set_index("scheme")
    assert df.loc["acg", "before"] > 0.9 and df.loc["kg", "before"] < df.loc["acg", "before"]
    assert df.loc["acg", "recovery_s"] == df.loc["acg", "recovery_s"]  # a number
    # 0 only if its 2 s mean never fell below 0.9 (the slowed worker is seen
    # within one of its calls, LoadMeter.change_seen's steady rule)
    assert 0 <= df.loc["acg", "recovery_s"] < 10
    assert df.loc["acg", "recovery_s"] > 0 or df.loc["acg", "dip"] >= 0.9
    assert np.isnan(df.loc["kg", "recovery_s"])  # never
    assert df.loc["kg", "level"] < 0.5 < df.loc["acg", "level"]
    md = (out / "recovery.md").read_text()
    assert "| kg | never (" in md
    assert (out / "recovery-sim.png").stat().st_size > 0


# ----------------------------------------------------------------------------- e2e


@pytest.mark.e2e
def test_grid_on_the_real_engine(ray_spark, tmp_path: Path) -> None:
    args = sg.build_parser().parse_args(
        ["--engine", "ray", "--schemes", "kg,cg", "--hetero", "slow1@0.3", "--skews", "1.2",
         "--workers", "2", "--messages", "8000", "--keys", "500", "--service-us", "200",
         "--no-progress"])
    cfg = sg.settings(args)
    df = sg.run_grid(cfg, ["ray"], tmp_path, address=None, progress=False)
    assert df["scheme"].tolist() == ["kg", "cg"] and (df["engine"] == "ray").all()
    assert (df["messages"] == 8000).all()
    assert ((df["capacity_efficiency"] > 0) & (df["capacity_efficiency"] < 1.2)).all()
    by = df.set_index("scheme")
    assert by.loc["kg", "replication"] == 1.0 < by.loc["cg", "replication"]
    assert (tmp_path / "grid.csv").exists()
