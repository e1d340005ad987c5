"""Placement (``runtime.placement``): actor options and never-satisfiable placements,
without Ray; topology validation of ``placement:``; remote input URIs."""

from __future__ import annotations

import pytest

from runtime.placement import actor_options, fmt_resources, placement_problem
from runtime.topology import TopologyError, load_topology

HEAD = {"CPU": 1.0, "memory": 8e9, "node:__internal_head__": 1.0, "node:127.0.0.1": 1.0}
FAST = {"CPU": 2.0, "memory": 8e9, "fast": 100.0, "node:127.0.0.1": 1.0}
SLOW = {"CPU": 1.0, "memory": 8e9, "slow": 100.0, "node:127.0.0.1": 1.0}
NODES = [HEAD, FAST, SLOW]


def test_actor_options_split_builtin_and_custom_resources() -> None:
    assert actor_options(None) == {"num_cpus": 0}
    assert actor_options({"fast": 1}) == {"num_cpus": 0, "resources": {"fast": 1.0}}
    assert actor_options({"CPU": 1, "GPU": 0.5, "memory": 2e9, "big": 0.01}) == {
        "num_cpus": 1, "num_gpus": 0.5, "memory": 2_000_000_000, "resources": {"big": 0.01}}


def test_feasible_placements_pass() -> None:
    demands = {f"worker-{i}": {"fast": 1} for i in range(4)} | {"worker-4": {"slow": 1}}
    assert placement_problem(demands, NODES, reserved={"CPU": 1}) is None
    assert placement_problem({}, []) is None
    assert placement_problem({"worker-0": {"CPU": 2, "fast": 1}}, NODES) is None


def test_unknown_resource_names_the_worker_and_the_resource() -> None:
    msg = placement_problem({"worker-0": {"fast": 1}, "worker-1": {"gpu_node": 1}}, NODES)
    assert msg is not None and msg.startswith("placement.worker-1: ")
    assert "'gpu_node'" in msg and "fast=100" in msg and "node:" not in msg


def test_demand_that_fits_no_single_node() -> None:
    # fast and slow exist, but never on the same node
    msg = placement_problem({"worker-2": {"fast": 1, "slow": 1}}, NODES)
    assert msg is not None and msg.startswith("placement.worker-2: no single node has")
    msg = placement_problem({"worker-0": {"CPU": 3}}, NODES)
    assert msg is not None and "CPU: 2" in msg


def test_more_units_in_total_than_the_cluster_has() -> None:
    nodes = [HEAD, {**FAST, "fast": 2.0}]
    msg = placement_problem({f"worker-{i}": {"fast": 1} for i in range(3)}, nodes)
    assert msg is not None and "fast=3" in msg and "fast=2" in msg and "fraction" in msg
    # Spark's executor holds a CPU for the whole run
    msg = placement_problem({"worker-0": {"CPU": 2}, "worker-1": {"CPU": 1}}, [HEAD, FAST],
                            reserved={"CPU": 1})
    assert msg is not None and "Spark" in msg
    assert placement_problem({"worker-0": {"CPU": 2}}, [HEAD, FAST], reserved={"CPU": 1}) is None


def test_fmt_resources() -> None:
    assert fmt_resources({"fast": 1.0, "CPU": 0.5}) == "{fast: 1, CPU: 0.5}"


def _topo(placement: dict) -> object:
    return load_topology({"workers": {"count": 4}, "placement": placement})


@pytest.mark.parametrize(
    "placement, needle",
    [
        ({"worker-4": {"fast": 1}}, "'worker-4' is not an actor of this topology"),
        ({"source-1": {"fast": 1}}, "'source-1' is not an actor"),
        ({"sink": {"fast": 1}}, "(worker-0..3, source-0..0 or aggregator)"),
        ({"worker-0": {"fast": 0}}, "placement.worker-0.fast: must be > 0 (got 0"),
        ({"worker-1": {"fast": -1}}, "placement.worker-1.fast: must be > 0"),
        ({"worker-0": {"fast": 1.5}}, "whole numbers (Ray's rule; got 1.5)"),
        ({"worker-0": {}}, "placement.worker-0: no resources given"),
        ({"worker-0": {"fast": "lots"}}, "placement.worker-0.fast"),
    ],
)
def test_bad_placement_is_one_line_naming_the_field(placement: dict, needle: str) -> None:
    with pytest.raises(TopologyError) as e:
        _topo(placement)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_good_placement_loads() -> None:
    t = _topo({"worker-0": {"fast": 1}, "worker-3": {"CPU": 1, "slow": 0.01},
               "source-0": {"node:__internal_head__": 0.01}, "aggregator": {"head": 1}})
    assert t.placement["worker-3"] == {"CPU": 1.0, "slow": 0.01}  # type: ignore[attr-defined]
    assert actor_options(t.placement["source-0"]) == {  # type: ignore[attr-defined]
        "num_cpus": 0, "resources": {"node:__internal_head__": 0.01}}


def test_remote_input_uris_go_to_spark_as_given() -> None:
    t = load_topology({"input": {"format": "parquet", "path": "s3a://bucket/words.parquet"}},
                      check_input=True)  # not checked locally: the executors read it
    assert t.input_path() is None and t.input_uri() == "s3a://bucket/words.parquet"
    t = load_topology({"input": {"format": "csv", "path": "hdfs://nn:8020/w.csv"}})
    assert t.input_uri() == "hdfs://nn:8020/w.csv"


def test_local_paths_and_file_uris_are_absolute_for_the_executors(tmp_path) -> None:
    f = tmp_path / "w.parquet"
    f.write_bytes(b"x")
    t = load_topology({"input": {"format": "parquet", "path": f"file://{f}"}}, check_input=True)
    assert t.input_path() == f and t.input_uri() == str(f)
    (tmp_path / "t.yaml").write_text("input: {format: parquet, path: w.parquet}\n")
    t = load_topology(tmp_path / "t.yaml", check_input=True)
    assert t.input_uri() == str(f.resolve())
    with pytest.raises(TopologyError, match="file not found"):
        load_topology({"input": {"format": "parquet", "path": "file:///nope/x.parquet"}},
                      check_input=True)


@pytest.mark.parametrize("args, needle", [
    (["--spark-executors", "0"], "--spark-executors: "),
    (["--spark-executor-cores", "two"], "--spark-executor-cores: "),
    (["--spark-conf", "executor.memory=2g"], "--spark-conf: "),
])
def test_run_cli_bad_spark_sizing_exits_2_with_one_line(args: list[str], needle: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-m", "runtime.run", "topologies/cluster-hetero.yaml",
                        "--check", *args], cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {needle}"), p.stderr


@pytest.mark.parametrize("spark_cpus, total, fits", [(1, 2, True), (2, 2, False), (3, 2, False),
                                                     (4, 8, True), (2, 2.5, False)])
def test_spark_must_leave_a_cpu_for_the_input_tasks(monkeypatch, spark_cpus, total, fits) -> None:
    import ray

    from actors.cluster import check_spark_fits

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": float(total)})
    if fits:
        check_spark_fits(spark_cpus)
    else:
        with pytest.raises(TopologyError, match=r"^--spark-executors x --spark-executor-cores: "
                                                rf"Spark's executors would hold {spark_cpus} of"):
            check_spark_fits(spark_cpus)


@pytest.mark.e2e
def test_run_with_spark_holding_every_cpu_exits_2_instead_of_hanging(tmp_path) -> None:
    """RayDP places the executor, then Ray Data's tasks that take Spark's output
    wait for a CPU forever: the run is refused before Spark starts."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "runtime.run", "topologies/demo.yaml",
                        "--spark-executor-cores", "64", "--out", str(out)],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, (p.stdout, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [ln for ln in errors if "would hold 64 of the cluster's" in ln] != [], p.stderr
    assert not out.exists()
