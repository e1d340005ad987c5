"""The discrete-event simulator (``python -m runtime.simulate``).

``simulate(topology) -> SimResult`` runs a topology in simulated time and
returns the report dict, time series and result table (no I/O); see
``runtime.simulate`` for the command line and ``runtime.sim.engine`` for the
model.
"""

from runtime.sim.api import SimResult, params_from_topology, simulate

__all__ = ["SimResult", "params_from_topology", "simulate"]
