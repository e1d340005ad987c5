"""The Ray cluster a run lands on: its nodes, placement checks, where actors are.

- ``nodes()``: every alive node (id, address, total resources, head or not).
- ``check_placement(topo, spark_cpus)``: exit-2 material (``TopologyError``,
  one line) when the topology's ``placement`` can never be satisfied by this
  cluster - checked right after ``ray.init``, before Spark starts, so a wrong
  resource name fails in seconds instead of leaving actors pending forever.
- ``wait_for_actors(refs, names, demands, timeout_s)``: the run's actors must
  start within ``timeout_s`` (``HS_PLACEMENT_TIMEOUT_S``, default 120 s);
  otherwise a ``TopologyError`` naming the first one still pending, what it
  asks for and what the cluster has free. That covers what the static check
  cannot see: resources held by other jobs.
- ``actor_nodes(handles)`` / ``spark_executor_nodes()``: the node id each
  actor runs on, from the GCS actor table (no dashboard needed), for
  ``report.json``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from runtime.placement import fmt_resources, placement_problem
from runtime.topology import Topology, TopologyError

#: seconds a run's actors may stay pending before the run fails
PLACEMENT_TIMEOUT_S = float(os.environ.get("HS_PLACEMENT_TIMEOUT_S", "120"))


def nodes() -> list[dict[str, Any]]:
    """Alive nodes: ``node_id``, ``address``, ``resources`` (totals), ``head``."""
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = {k: float(v) for k, v in (n.get("Resources") or {}).items()}
        out.append({"node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
                    "resources": res, "head": "node:__internal_head__" in res})
    return out


def placement_demands(topo: Topology) -> dict[str, dict[str, float]]:
    return {name: dict(res) for name, res in topo.placement.items()}


def check_spark_fits(spark_cpus: float) -> None:
    """Raise ``TopologyError`` if Spark's executors would hold every CPU of the
    cluster: Ray Data's tasks that take Spark's output (``from_spark``) each
    need one CPU, and would wait for one forever."""
    total = float(ray.cluster_resources().get("CPU", 0.0))
    if total - spark_cpus < 1:
        raise TopologyError(
            f"--spark-executors x --spark-executor-cores: Spark's executors would hold "
            f"{spark_cpus:g} of the cluster's {total:g} CPUs, and loading the input takes "
            f"Ray tasks of 1 CPU beside them (ask for at most {max(total - 1, 0):g})")


def check_placement(topo: Topology, spark_cpus: float = 1.0) -> None:
    """Raise ``TopologyError`` if ``topo.placement`` can never be satisfied here."""
    demands = placement_demands(topo)
    if not demands:
        return
    problem = placement_problem(demands, [n["resources"] for n in nodes()],
                                reserved={"CPU": spark_cpus} if spark_cpus else None)
    if problem:
        raise TopologyError(problem)


def wait_for_actors(refs: Sequence[Any], names: Sequence[str],
                    demands: Mapping[str, Mapping[str, float]] | None = None,
                    timeout_s: float | None = None) -> list[Any]:
    """``ray.get(refs)`` (one call per actor, e.g. ``pid()``), bounded in time.

    An actor whose creation is still pending after ``timeout_s`` fails the
    run with one line instead of hanging; an actor that died while starting
    raises its error.
    """
    limit = PLACEMENT_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.time() + limit
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending),
                              timeout=max(0.0, deadline - time.time()))
        if pending and time.time() >= deadline:
            i = [r.hex() for r in refs].index(pending[0].hex())
            name = names[i]
            ask = (demands or {}).get(name)
            free = ray.available_resources()
            show = {k: v for k, v in free.items()
                    if not k.startswith("node:") and k not in ("object_store_memory", "memory")}
            what = f"placement.{name}: " if ask else ""
            need = f"asks for {fmt_resources(ask)}" if ask else "asks for no special resources"
            raise TopologyError(
                f"{what}{name} not started after {limit:.0f} s: it {need}, free now in the "
                f"cluster {fmt_resources(show) if show else '{}'} (held by other actors or jobs?)")
    return ray.get(list(refs))


def _actor_table() -> dict[str, dict[str, Any]]:
    try:
        return dict(ray._private.state.actors())  # GCS actor table: no dashboard needed
    except Exception:  # noqa: BLE001 - an internal API: node ids are optional in reports
        return {}


def actor_nodes(handles: Sequence[Any]) -> list[str | None]:
    """The node id each actor runs on (``None`` if unknown)."""
    table = _actor_table()
    out: list[str | None] = []
    for h in handles:
        info = table.get(h._actor_id.hex()) or {}
        out.append((info.get("Address") or {}).get("NodeID") or None)
    return out


def spark_executor_nodes() -> dict[str, str | None]:
    """This session's alive Spark executors (RayDP's ``raydp-executor-<id>``
    actors) -> node id. RayDP's JVM side runs as a job of its own but names
    its executors in our namespace; other jobs' RayDP executors are skipped."""
    ns = ray.get_runtime_context().namespace
    out: dict[str, str | None] = {}
    for aid, info in _actor_table().items():
        name = info.get("Name") or ""
        if not name.startswith("raydp-executor-") or info.get("State") != "ALIVE":
            continue
        try:
            mine = ray.get_actor(name, namespace=ns)._actor_id.hex() == aid
        except Exception:  # noqa: BLE001 - not in our namespace
            mine = False
        if mine:
            out[name] = (info.get("Address") or {}).get("NodeID")
    return out


def cluster_summary(handles: Mapping[str, Any]) -> dict[str, Any]:
    """``report.json``'s ``cluster`` block: nodes, and where each named actor ran."""
    names = list(handles)
    where = actor_nodes([handles[n] for n in names])
    return {
        "nodes": [{"node_id": n["node_id"], "address": n["address"], "head": n["head"],
                   "resources": {k: v for k, v in n["resources"].items()
                                 if not k.startswith("node:")}}
                  for n in nodes()],
        "actors": dict(zip(names, where, strict=True)),
        "spark_executors": spark_executor_nodes(),
    }
