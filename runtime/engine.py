"""The seam between the entry points and the two engines.

An ``Engine`` runs a topology, writes its outputs to a directory (docs/design.md:
``report.json``, ``timeseries.csv``, ``result.parquet``, ``report.png``) and
returns the report, as written to ``report.json``:

- ``runtime.sim.SimEngine``: the simulator, the runtime's own cores on a
  virtual clock (``"engine": "sim"``);
- ``actors.engine.RayEngine``: Ray actors fed by Spark (RayDP), a context
  manager that owns the Ray + Spark session (``"engine": "ray"``).

The entry points (``runtime.run``, ``runtime.simulate``, ``runtime.compare``,
``runtime.api``) pick one and stay engine-free; ``runtime.compare.run_all``
drives either.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from runtime.topology import Topology

#: where a run's one-line messages go (``None``: the engine's default, stderr)
Log = Callable[[str], None]


class Engine(Protocol):
    def shared_input(self, topo: Topology) -> AbstractContextManager[Any]:
        """``topo``'s input, read once for several runs of topologies that share
        it (``runtime.compare``: one per scheme); pass it to ``run`` as ``data``."""
        ...

    def run(self, topo: Topology, out_dir: str | os.PathLike[str], *, progress: bool = False,
            log: Log | None = None, data: Any = None) -> dict[str, Any]:
        """Run ``topo``, write its outputs to ``out_dir`` and return the report.

        ``progress``: a progress bar on stderr. ``data``: what ``shared_input``
        gave for a topology with the same input (default: read ``topo``'s)."""
        ...


__all__ = ["Engine", "Log"]
