"""The simulator (``python -m runtime.simulate``): the runtime's own source,
worker and aggregator cores on a virtual clock (``runtime.sim.cores``).

``simulate(topology) -> SimResult`` runs a topology in simulated time and
returns the report dict, time series and result table (no I/O);
``SimEngine`` is the simulator as a ``runtime.engine.Engine`` (simulate, write
the outputs, return the report). See ``runtime.simulate`` for the command line.
"""

from runtime.sim.api import SimEngine, SimResult, simulate

__all__ = ["SimEngine", "SimResult", "simulate"]
