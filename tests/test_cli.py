"""``python -m runtime.run``: --check exits 0; bad input exits 2 with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_every_bundled_topology_checks(path: Path) -> None:
    p = run_cli(str(path), "--check")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ok: ")


def test_check_with_overrides() -> None:
    p = run_cli("topologies/demo.yaml", "--check", "--set", "grouping.scheme=pkg",
                "--set", "workers.count=8", "--set", "workers.capacity=0.5")
    assert p.returncode == 0, p.stderr
    assert "8 workers, scheme pkg" in p.stdout


def _bad(tmp_path: Path, text: str, *extra: str) -> str:
    f = tmp_path / "t.yaml"
    f.write_text(text)
    p = run_cli(str(f), *extra)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr  # one line, no traceback
    assert "Traceback" not in p.stderr
    return lines[0]


def test_unknown_field(tmp_path: Path) -> None:
    assert "workers.speed" in _bad(tmp_path, "workers: {count: 2, speed: 3}\n", "--check")


def test_bad_capacity_value(tmp_path: Path) -> None:
    line = _bad(tmp_path, "workers: {count: 2, capacity: [1, -1]}\n", "--check")
    assert "workers.capacity" in line and "-1" in line


def test_unknown_scheme_from_set(tmp_path: Path) -> None:
    line = _bad(tmp_path, "name: x\n", "--set", "grouping.scheme=nope")
    assert "grouping.scheme" in line and "nope" in line


def test_missing_input_file_without_check(tmp_path: Path) -> None:
    line = _bad(tmp_path, "input: {format: parquet, path: nowhere.parquet}\n")
    assert "input.path" in line and "nowhere.parquet" in line


def test_missing_key_column(tmp_path: Path) -> None:
    data = ROOT / "data" / "gitgit-files.parquet"
    line = _bad(tmp_path, f"input: {{format: parquet, path: {data}, key: word}}\n", "--check")
    assert "input.key" in line and "'word'" in line


def test_unreadable_parquet(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    line = _bad(tmp_path, f"input: {{format: parquet, path: {junk}}}\n", "--check")
    assert line.startswith("error: input.path")


def test_malformed_yaml_and_missing_topology(tmp_path: Path) -> None:
    assert "malformed YAML" in _bad(tmp_path, "workers: [\n", "--check")
    p = run_cli(str(tmp_path / "absent.yaml"), "--check")
    assert p.returncode == 2 and "not found" in p.stderr


def test_bad_option() -> None:
    p = run_cli("topologies/demo.yaml", "--bogus")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_exit_codes_tell_a_bug_from_bad_input_and_an_operator(capsys) -> None:
    from runtime.cli import EXIT_INTERNAL, run_main
    from runtime.operators import OperatorError
    from runtime.topology import TopologyError

    def crash() -> int:
        raise RuntimeError("a bug\nsecond line")

    def bad() -> int:
        raise TopologyError("workers.count: must be >= 1 (got 0)")

    def operator() -> int:
        raise OperatorError("app.operator: x.py:Op: ValueError in add: no")

    for main, code, line in ((crash, EXIT_INTERNAL, "error: internal error: RuntimeError: a bug "
                                                    "(exit 70; the traceback is above)"),
                             (bad, 2, "error: workers.count: must be >= 1 (got 0)"),
                             (operator, 1, "error: app.operator: x.py:Op: ValueError in add: no")):
        with pytest.raises(SystemExit) as e:
            run_main(main)
        assert e.value.code == code
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == line
        assert ("Traceback" in err) == (code == EXIT_INTERNAL)
