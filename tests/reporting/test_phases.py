"""Where a run's time goes (``runtime.reporting.phases``): the ``phases``
block's arithmetic and schema in both engines' reports, the summary's rows,
and ``runtime.run``'s console plumbing (the engine's log, named on failure;
a child's output sent to it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.reporting import phases
from runtime.reporting import report as report_mod
from runtime.sim import SimEngine, simulate
from runtime.topology import TopologyError, load_topology

SMALL = {"name": "ph", "input": {"format": "zipf", "messages": 4_000, "keys": 200},
         "workers": {"count": 3, "service_us": 10}, "grouping": {"scheme": "pkg"},
         "run": {"batch": 250, "slot_s": 0.05}}


@pytest.fixture(autouse=True)
def fresh_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """No origin and no engine start-up left by another test."""
    monkeypatch.setattr(phases, "_origin", None)
    monkeypatch.setattr(phases, "_ready", None)
    monkeypatch.setattr(phases, "_session_used", False)


def test_a_block_splits_the_wall_time_into_contiguous_phases() -> None:
    clock = phases.RunClock(origin=100.0, startup=5.0)
    clock.start(112.5)  # input: 105 -> 112.5
    clock.end(115.5)  # stream: 3 s
    clock.part("outputs", 0.25)
    ph = clock.block(now=116.0)
    assert {k: ph[k] for k in phases.PHASES} == {
        "startup": 5.0, "input": 7.5, "first_message": 12.5, "stream": 3.0, "finish": 0.5}
    assert ph["total"] == 16.0 == ph["startup"] + ph["input"] + ph["stream"] + ph["finish"]
    assert ph["finish_parts"] == {"outputs": 0.25} and ph["final"] is False
    clock.part("shutdown", 1.0)
    final = clock.block(final=True, now=117.5)
    assert final["finish"] == 2.0 and final["total"] == 17.5 and final["final"] is True
    assert final["finish_parts"] == {"outputs": 0.25, "shutdown": 1.0}
    assert "input_parts" not in final  # the simulator has none


def test_the_input_phase_has_its_steps_in_the_block_and_the_summary() -> None:
    clock = phases.RunClock(origin=100.0, startup=5.0)
    clock.input_part("plan", 4.0)
    clock.input_part("first_block", 2.5)
    clock.input_part("sources", 1.0)
    clock.start(112.5)
    ph = clock.block(now=113.0)
    assert ph["input_parts"] == {"plan": 4.0, "first_block": 2.5, "sources": 1.0}
    assert sum(ph["input_parts"].values()) <= ph["input"]
    rows = dict(phases.summary_rows(ph))
    assert rows["phase: input"] == "7.5 s (plan 4.0, first_block 2.5, sources 1.0)"


def test_only_the_first_run_of_a_session_pays_the_start_up() -> None:
    phases.begin(origin=50.0)
    phases.engine_ready(at=58.0)
    phases.startup_step("ray", 51.0, 54.0)
    phases.startup_step("spark", 54.0, 58.0)
    first = phases.RunClock.take()
    assert (first.origin, first.startup) == (50.0, 8.0)
    assert first.startup_parts == {"python": 1.0, "ray": 3.0, "spark": 4.0}
    later = phases.RunClock.take()  # compare's next scheme
    assert later.startup == 0.0 and later.origin > 58.0 and later.startup_parts == {}
    assert "startup_parts" in first.block() and "startup_parts" not in later.block()


def test_without_an_entry_point_nothing_is_counted_as_start_up() -> None:
    _, startup = phases.take_startup()  # a notebook: no begin, no engine_ready
    assert startup == 0.0
    phases.engine_ready()
    assert phases.take_startup()[1] == 0.0  # the clock started when the engine was up


def test_the_command_starts_when_the_process_was_created() -> None:
    import time

    before = time.time()
    child = subprocess.run([sys.executable, "-c", "from runtime.reporting.phases import "
                            "process_start; print(repr(process_start()))"],
                           capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2])
    after = time.time()
    # created after ``before`` (the kernel's clock: to 10 ms), before it answered
    assert before - 0.05 <= float(child.stdout) <= after
    t = phases.begin()
    assert t == phases.origin() and t <= time.time()


def test_a_simulated_run_reports_its_phases(tmp_path: Path) -> None:
    engine = SimEngine(plot=False)
    report = engine.run(load_topology(SMALL), tmp_path / "run")
    on_disk = json.loads((tmp_path / "run" / "report.json").read_text())
    report_mod.validate_report(on_disk)
    ph = on_disk["phases"]
    assert ph == report["phases"]
    assert all(ph[k] >= 0 for k in phases.PHASES)
    assert ph["first_message"] == pytest.approx(ph["startup"] + ph["input"], abs=2e-3)
    assert ph["total"] == pytest.approx(
        ph["startup"] + ph["input"] + ph["stream"] + ph["finish"], abs=5e-3)
    assert ph["final"] is True and ph["finish_parts"]["outputs"] <= ph["finish"] + 1e-3
    # the simulator's stream is its wall time simulating, not the simulated time
    assert ph["stream"] <= on_disk["sim"]["wall_s"] + 1e-3


def test_phases_are_checked_by_the_schema(tmp_path: Path) -> None:
    r = simulate(SMALL)
    rep = dict(r.report)
    report_mod.validate_report(rep)
    bad = {**rep, "phases": {**rep["phases"], "stream": "3 s"}}
    with pytest.raises(ValueError, match="report.phases.stream: expected float"):
        report_mod.validate_report(bad)
    gone = {k: v for k, v in rep["phases"].items() if k != "finish"}
    with pytest.raises(ValueError, match="report.phases: missing keys: finish"):
        report_mod.validate_report({**rep, "phases": gone})
    # every run's report.json has them
    no_phases = {k: v for k, v in rep.items() if k != "phases"}
    with pytest.raises(ValueError, match="missing keys: phases"):
        report_mod.write_run(tmp_path / "x", no_phases, r.timeseries, r.result, plot=False)
    assert not (tmp_path / "x").exists()


def test_the_summary_shows_the_phases() -> None:
    rep = dict(simulate(SMALL).report)
    rep["phases"] = phases.RunClock(100.0, 4.0).block(now=100.0)
    rep["phases"].update(startup=4.0, input=6.5, first_message=10.5, stream=3.25,
                         finish=0.75, total=14.5, finish_parts={"outputs": 0.5})
    rep["phases"]["startup_parts"] = {"python": 1.0, "ray": 1.5, "spark": 1.5}
    text = " ".join(report_mod.summary_table(rep).split())  # spaces as the table aligns them
    assert "phase: start-up 4.0 s (python 1.0, ray 1.5, spark 1.5)" in text
    assert "phase: input 6.5 s" in text
    assert "first message at 10.5 s" in text
    assert "phase: stream 3.25 s" in text
    assert "phase: finish so far 0.8 s (outputs 0.5)" in text
    assert "wall time so far 14.5 s" in text
    rep["phases"]["final"] = True
    assert "so far" not in report_mod.summary_table(rep)


def test_rewrite_replaces_only_the_phases(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps({"name": "x", "verify": {"equal": True},
                                                      "phases": {"finish": 0.1}}))
    phases.rewrite(tmp_path, {"finish": 2.0, "final": True})
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk == {"name": "x", "verify": {"equal": True},
                       "phases": {"finish": 2.0, "final": True}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_the_plot_comes_after_the_result(tmp_path: Path) -> None:
    r = simulate(SMALL)
    out = report_mod.write_run(tmp_path / "run", r.report, r.timeseries, r.result, plot=False)
    assert not (out / "report.png").exists()
    report_mod.write_plot(out, r.report)  # from timeseries.csv
    assert (out / "report.png").stat().st_size > 0
    assert sorted(p.name for p in out.iterdir()) == [
        "report.json", "report.png", "result.parquet", "timeseries.csv"]


# --------------------------------------------------------------------------- console


def test_a_child_started_inside_output_to_writes_to_the_log(tmp_path: Path,
                                                            capfd: pytest.CaptureFixture) -> None:
    from actors.spark_input import output_to

    log = tmp_path / "engine.log"
    print("ours, before", flush=True)
    with output_to(log):
        child = subprocess.Popen([sys.executable, "-c",
                                  "import sys, time; print('jvm says hi'); "
                                  "sys.stderr.write('WARN Utils: hostname\\n'); "
                                  "sys.stderr.flush(); time.sleep(0.3); "
                                  "sys.stderr.write('ERROR later\\n')"])
    print("ours, after", flush=True)
    child.wait(timeout=30)  # it keeps writing to the log after the block
    out, err = capfd.readouterr()
    assert out == "ours, before\nours, after\n" and err == ""
    assert log.read_text().splitlines() == ["jvm says hi", "WARN Utils: hostname",
                                            "ERROR later"]


def test_output_to_none_leaves_the_console_alone(capfd: pytest.CaptureFixture) -> None:
    from actors.spark_input import output_to

    with output_to(None):
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('x\\n')"],
                       check=True)
    assert capfd.readouterr().err == "x\n"


def _failed(error: BaseException, out: Path, existed: bool,
            capsys: pytest.CaptureFixture) -> str:
    from runtime.run import ENGINE_LOG, _failed

    _failed(error, out, out / ENGINE_LOG, existed)
    return str(capsys.readouterr().err)


@pytest.mark.parametrize("error", [TopologyError("input.path: bad"), SystemExit(2),
                                   KeyboardInterrupt()])
def test_bad_input_leaves_no_output_directory(tmp_path: Path, error: BaseException,
                                              capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "engine.log").write_text("WARN Utils: ...\n")
    assert _failed(error, out, False, capsys) == ""
    assert not out.exists()


def test_bad_input_keeps_a_directory_the_user_had(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "engine.log").write_text("x\n")
    assert _failed(TopologyError("bad"), out, True, capsys) == ""
    assert (out / "engine.log").exists()


def test_a_failed_run_names_the_engine_log(tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "engine.log").write_text("java.lang.OutOfMemoryError\n")
    err = _failed(RuntimeError("executor lost"), out, False, capsys)
    assert err == (f"error: the run failed; Spark's, the JVM's and Ray's own messages are in "
                   f"{out / 'engine.log'}\n")
    assert (out / "engine.log").exists()  # kept: that is where to look


def test_a_failing_operator_keeps_its_own_one_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.operators as ops

    out = tmp_path / "out"
    out.mkdir()
    (out / "engine.log").write_text("x\n")
    monkeypatch.setattr(ops, "find_operator_error", lambda e: e)
    assert _failed(ValueError("bad record"), out, False, capsys) == ""
