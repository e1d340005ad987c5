"""actors.pool on the real engine: a session's clean run leaves its
aggregator, workers and sources to the next run, which reuses their processes
and is exact; a run with a fault leaves nothing; what the next run does not
take is killed; a user's operator's processes serve the next run of the same
file, until the file changes.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import ray
from test_run_e2e import FILES, ROOT, _input, _run_and_check, _topology

from actors import pool as pool_mod
from actors.pipeline import run_pipeline
from runtime.operators import table_diff

pytestmark = pytest.mark.e2e

ROLES = {("aggregator", 0), *(("worker", i) for i in range(4)), *(("source", s) for s in range(2))}


def _idle() -> dict:
    """The pool's idle actors by ``(role, index)``, and their pids."""
    entries = pool_mod.POOL.idle()
    idle = {key: actor for key, (actor, _) in entries.items()}
    assert all(ray.get([r for _, r in entries.values()], timeout=60))  # recycled
    pids = ray.get([a.pid.remote() for a in idle.values()], timeout=30)
    return {key[:2]: (a._actor_id, pid) for (key, a), pid in zip(idle.items(), pids, strict=True)}


def test_a_clean_run_leaves_its_actors_to_the_next_which_is_exact(ray_spark, tmp_path) -> None:
    files = {"format": "parquet", "path": FILES, "limit": 30_000}
    _run_and_check(ray_spark, _topology("kg", files), tmp_path / "a")
    first = _idle()
    assert set(first) == ROLES  # 7 processes, none killed

    # another scheme, throttled workers: the same processes, an exact answer
    topo = _topology("acg", files, workers={"count": 4, "service_us": 50,
                                            "capacity": [1, 1, 1, 0.5],
                                            "throttle": "duty-cycle"})
    report = _run_and_check(ray_spark, topo, tmp_path / "b")
    assert report["workers"][3]["stopped_s"] > 0  # the reused process was really throttled
    second = _idle()
    assert second == first  # every actor reused (same actor, same pid), and kept again
    assert all(v > 0 for v in report.get("peak_rss_mb", {}).values())

    # a run with a fault: its actors are killed, none left for the next run
    faulty = _topology("kg", files, faults=[{"kill": "worker-1", "at_s": 0.0}])
    df, ref = _input(ray_spark, faulty)
    run_pipeline(faulty, tmp_path / "c", ray_spark, progress=False, log=lambda m: None, df=df)
    assert table_diff(pq.read_table(tmp_path / "c" / "result.parquet"), ref) is None
    assert pool_mod.POOL.idle() == {}

    # a run of another shape takes new processes; then it leaves its own
    _run_and_check(ray_spark, _topology("kg", files, sources=1,
                                        workers={"count": 2, "service_us": 0}), tmp_path / "d")
    third = _idle()
    assert set(third) == {("aggregator", 0), ("worker", 0), ("worker", 1), ("source", 0)}
    assert not {v[1] for v in third.values()} & {v[1] for v in first.values()}


def test_a_file_operators_processes_serve_its_next_run_until_the_file_changes(
        ray_spark, tmp_path) -> None:
    """A user's operator (a file) lives in its processes: the next run of the
    same file, unchanged, takes them and is exact; once the file changes, the
    next run starts new ones (a reused process would run the old code)."""
    op = tmp_path / "topk.py"
    op.write_text((ROOT / "examples" / "operators" / "topk.py").read_text())
    files = {"format": "parquet", "path": FILES, "limit": 30_000}
    app = {"kind": "operator", "operator": f"{op}:TopK", "columns": ["ts"],
           "params": {"column": "ts", "k": 3}}
    _run_and_check(ray_spark, _topology("pkg", files, app=app), tmp_path / "a")
    first = _idle()
    assert set(first) == ROLES

    _run_and_check(ray_spark, _topology("acg", files, app=app), tmp_path / "b")
    assert _idle() == first  # every actor reused, the answer exact

    op.write_text(op.read_text() + "\n# edited\n")
    _run_and_check(ray_spark, _topology("acg", files, app=app), tmp_path / "c")
    third = _idle()
    assert set(third) == ROLES
    assert not {v[1] for v in third.values()} & {v[1] for v in first.values()}
