"""Placement of workers on cluster nodes by Ray resources (topology ``placement:``).

``placement: {worker-0: {fast: 1}, worker-3: {CPU: 1, big: 1}}`` asks Ray to
start each named worker on a node that has those resources; unnamed workers
go wherever Ray puts them. Pure functions (no Ray), so they are unit tested
without a cluster; ``actors.cluster`` feeds them ``ray.nodes()``.

- ``actor_options(resources)``: the ``.options(...)`` of one actor. ``CPU``,
  ``GPU`` and ``memory`` (bytes) are Ray's built-in resources and go to
  ``num_cpus`` / ``num_gpus`` / ``memory`` (Ray refuses them inside
  ``resources=``); anything else is a custom resource. Without ``CPU`` a
  worker asks for no CPU (``num_cpus=0``, as every actor of a run: they sleep,
  and Spark's executor needs the cores).
- ``placement_problem(demands, nodes, reserved)``: one line saying why the
  placement can *never* be satisfied by these nodes (a resource no node has;
  a worker whose demand fits no single node; more units asked in total than
  the cluster has, counting what Spark's executors hold for the whole run),
  or ``None``. Ray itself would just keep such an actor pending forever.
  Feasible on totals is not a promise: resources held by other jobs, or a
  packing the per-resource sums cannot see, are caught at start-up by a
  time limit instead (``actors.cluster.wait_for_actors``).

A resource is *consumed* by the actor holding it: a node started with
``--resources '{"fast": 2}'`` hosts at most two workers asking for
``{fast: 1}``. To pin many workers to one node, give the node many units
(``{"fast": 100}``) or ask for a fraction (``{fast: 0.01}``; Ray allows
fractions below 1, and whole numbers above).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Ray's built-in resources and the actor option that requests each
BUILTIN = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}


def fmt_resources(res: Mapping[str, float]) -> str:
    """``{fast: 1, CPU: 2}`` - the YAML spelling, for messages."""
    return "{" + ", ".join(f"{k}: {_num(v)}" for k, v in res.items()) + "}"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def validate_amounts(name: str, res: Mapping[str, float]) -> None:
    """Raise ``ValueError`` (one line) for an amount Ray would refuse."""
    if not res:
        raise ValueError(f"placement.{name}: no resources given (e.g. {{fast: 1}})")
    for k, v in res.items():
        if not k:
            raise ValueError(f"placement.{name}: empty resource name")
        if not v > 0:
            raise ValueError(f"placement.{name}.{k}: must be > 0 (got {v})")
        if v > 1 and not float(v).is_integer() and k != "memory":
            raise ValueError(f"placement.{name}.{k}: amounts above 1 must be whole numbers "
                             f"(Ray's rule; got {v})")


def actor_options(resources: Mapping[str, float] | None, *, default_cpus: float = 0) -> dict[str, Any]:
    """Ray actor options asking for ``resources`` (see the module docstring)."""
    opts: dict[str, Any] = {"num_cpus": default_cpus}
    custom: dict[str, float] = {}
    for k, v in (resources or {}).items():
        if k in BUILTIN:
            opts[BUILTIN[k]] = int(v) if k == "memory" else v
        else:
            custom[k] = float(v)
    if custom:
        opts["resources"] = custom
    return opts


def placement_problem(
    demands: Mapping[str, Mapping[str, float]],
    nodes: Sequence[Mapping[str, float]],
    reserved: Mapping[str, float] | None = None,
) -> str | None:
    """Why ``demands`` (actor name -> resources) can never run on ``nodes``.

    ``nodes``: the total resources of every alive node. ``reserved``: what
    other actors of the run hold for its whole length (Spark's executors'
    CPUs). Returns one line naming the topology field, or ``None``.
    """
    if not demands:
        return None
    totals: dict[str, float] = {}
    for n in nodes:
        for k, v in n.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    have = ", ".join(f"{k}={_num(v)}" for k, v in sorted(totals.items())
                     if not k.startswith("node:") and k not in ("object_store_memory",))
    for name, res in demands.items():
        for k in res:
            if k not in totals:
                return (f"placement.{name}: no node of the cluster has resource {k!r} "
                        f"(cluster: {have or 'no nodes'}); start a node with "
                        f"ray start --resources '{{\"{k}\": 100}}'")
    for name, res in demands.items():
        if not any(all(n.get(k, 0.0) >= v for k, v in res.items()) for n in nodes):
            best = {k: max(n.get(k, 0.0) for n in nodes) for k in res}
            return (f"placement.{name}: no single node has {fmt_resources(res)} "
                    f"(the most any node has: {fmt_resources(best)})")
    asked: dict[str, float] = dict(reserved or {})
    for res in demands.values():
        for k, v in res.items():
            asked[k] = asked.get(k, 0.0) + float(v)
    for k, v in asked.items():
        if k in totals and v > totals[k] + 1e-9:
            names = [n for n, r in demands.items() if k in r]
            spark = f" + {_num(reserved[k])} for Spark's executors" if reserved and reserved.get(k) else ""
            return (f"placement: {len(names)} worker(s) ask for {k}="
                    f"{_num(v - (reserved or {}).get(k, 0.0))} in total{spark}, the cluster has "
                    f"{k}={_num(totals[k])} (a resource is held by its actor: give the nodes "
                    f"more units, e.g. {{\"{k}\": 100}}, or ask for a fraction, e.g. {{{k}: 0.01}})")
    return None
