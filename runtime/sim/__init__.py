"""The discrete-event simulator (``python -m runtime.simulate``).

``simulate(topology) -> SimResult`` runs a topology in simulated time and
returns the report dict, time series and result table (no I/O);
``SimEngine`` is the simulator as a ``runtime.engine.Engine`` (simulate, write
the outputs, return the report). See ``runtime.simulate`` for the command line
and ``runtime.sim.engine`` for the model.
"""

from runtime.sim.api import SimEngine, SimResult, params_from_topology, simulate

__all__ = ["SimEngine", "SimResult", "params_from_topology", "simulate"]
