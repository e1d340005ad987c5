"""scripts/sim_vs_real.py: the table of both engines, with the real engine's
median and range when it ran several times (``--repeat``), and its one-line
errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import sim_vs_real  # noqa: E402


def _run(eff: float, p50: float, p99: float) -> dict[str, float]:
    return {"efficiency": eff, "p50": p50, "p99": p99}


def test_repeated_real_runs_give_their_median_and_range() -> None:
    key = ("zipf-hetero", "cg")
    results = {"sim": {key: [_run(0.893, 53.2, 2201.0)]},
               "ray": {key: [_run(0.912, 55.3, 2245.1), _run(0.890, 54.2, 2290.0),
                             _run(0.898, 60.0, 3000.0)]}}
    row = sim_vs_real.table(results, 0.8).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["zipf-hetero", "cg", "0.893", "0.898 (0.890-0.912)", "-0.005",
                     "53.2 / 2,201.0", "55.3 / 2,290.0 (2,245.1-3,000.0)", "0.96x"]


def test_one_run_per_engine_gives_the_plain_numbers() -> None:
    key = ("demo", "acg")
    results = {"sim": {key: [_run(0.986, 77.5, 212.7)]}, "ray": {key: [_run(0.995, 80.6, 217.0)]}}
    row = sim_vs_real.table(results, 0.8).splitlines()[2]
    assert row == ("| demo | acg | 0.986 | 0.995 | -0.009 | 77.5 / 212.7 | 80.6 / 217.0 "
                   "| 0.98x |")


@pytest.mark.parametrize("argv", [["--repeat", "0"], ["--engines", "flink"],
                                  ["--offered", "2"], ["no/such/topology.yaml"]])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as e:
        sim_vs_real.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
