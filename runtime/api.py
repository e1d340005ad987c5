"""Run a topology from Python, on either engine, and get the report back.

    from runtime.api import run
    report = run({"input": {"format": "zipf", "messages": 100_000},
                  "workers": {"count": 4, "capacity": [1, 1, 1, 0.3]},
                  "grouping": {"scheme": "acg"},
                  "app": {"kind": "aggregate", "value": "amount", "aggs": ["sum", "mean"]}},
                 engine="sim")
    report["throughput_msgs_per_s"], report["out"]   # result.parquet is in report["out"]

``topology``: a dict (the YAML's fields), a loaded ``Topology`` or a YAML path;
``overrides``: ``["grouping.scheme=kg", ...]`` as ``--set``. Bad input raises
``TopologyError`` (one line naming the field and the value) before anything
starts; an exception in a user's operator raises ``OperatorError`` (one line)
and writes nothing. ``engine="ray"`` uses the Ray cluster and RayDP Spark
session already running in this process if there is one (a notebook, a test
session), else starts both for this call (``address``: attach to a cluster)
and stops them afterwards. The outputs go to ``out`` (default
``runs/<name>-<UTC stamp>/``), as with the command line tools.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runtime.topology import Topology, TopologyError, load_topology

ENGINES = ("ray", "sim")


def load(topology: Topology | dict[str, Any] | str | os.PathLike[str],
         overrides: list[str] | None = None) -> Topology:
    """The topology, validated with its input and its app (``runtime.run --check``)."""
    from runtime.inputs.input_check import check_app, preflight

    if isinstance(topology, Topology):
        if overrides:
            raise TopologyError("overrides: apply them to a YAML path or a dict, "
                                "not to a loaded Topology")
        topo = topology
    else:
        topo = load_topology(topology if isinstance(topology, dict) else Path(topology),
                             overrides, check_input=True)
    preflight(topo)
    check_app(topo)
    return topo


def run(topology: Topology | dict[str, Any] | str | os.PathLike[str], *, engine: str = "ray",
        out: str | os.PathLike[str] | None = None, overrides: list[str] | None = None,
        address: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Run ``topology`` on ``engine`` (``ray`` or ``sim``); the run's report
    (``report.json``'s content plus ``out``: where the outputs are)."""
    if engine not in ENGINES:
        raise TopologyError(f"engine: must be one of {', '.join(ENGINES)} (got {engine!r})")
    topo = load(topology, overrides)
    from runtime.reporting.report import default_out_dir

    out_dir = Path(out) if out is not None else default_out_dir(topo.name)
    if engine == "sim":
        from runtime.sim import SimEngine

        report = SimEngine().run(topo, out_dir, progress=progress)
    else:
        report = _run_ray(topo, out_dir, address, progress)
    report["out"] = str(out_dir)
    return report


def _run_ray(topo: Topology, out: Path, address: str | None, progress: bool) -> dict[str, Any]:
    from actors.engine import RayEngine

    with RayEngine(topo.name, address, topo=topo) as ray_engine:
        return ray_engine.run(topo, out, progress=progress, log=lambda m: None)


__all__ = ["ENGINES", "load", "run"]
