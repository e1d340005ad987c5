"""``simulate(topology) -> SimResult``: the simulator as a Python function;
``SimEngine``: the simulator as a ``runtime.engine.Engine``.

``simulate`` writes no files (``SimResult.write(out_dir)`` does that through
``runtime.reporting.report.write_run``); input files are read. ``SimEngine.run``
simulates and writes the outputs, as the entry points do.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from runtime.reporting import phases
from runtime.reporting import report as reporting
from runtime.reporting.report import write_run
from runtime.sim.inputs import SimInput, load_input
from runtime.topology import Topology, TopologyError, load_topology


@dataclass
class SimResult:
    report: dict[str, Any]
    timeseries: pd.DataFrame
    result: pa.Table
    clock: phases.RunClock | None = None

    def write(self, out_dir: str | os.PathLike[str], *, plot: bool = True) -> Path:
        """``report.json``, ``timeseries.csv``, ``result.parquet``, ``report.png``;
        the report's ``phases`` then count the writing (``finish_parts.outputs``)."""
        out = write_run(out_dir, self.report, self.timeseries, self.result, plot=plot)
        if self.clock is not None:
            self.clock.part("outputs", self.clock.since_end())
            self.report["phases"] = self.clock.block(final=True)  # nothing follows
            phases.rewrite(out, self.report["phases"])
        return out


def simulate(
    topology: Topology | str | os.PathLike[str] | dict[str, Any],
    overrides: list[str] | None = None,
    *,
    shard_block_rows: int | None = None,
    sim_input: SimInput | None = None,
    progress: Callable[[int], None] | None = None,
    clock: phases.RunClock | None = None,
    model: str = "cores",
    call_transit_s: float | None = None,
) -> SimResult:
    """Simulate a topology (object, YAML path or dict, plus ``--set`` overrides)
    over the runtime's own source, worker and aggregator cores on a virtual
    clock (``runtime.sim.cores``).

    ``shard_block_rows``: stream blocks dealt round-robin to the sources
    (default: the real runtime's, ``runtime.inputs.input_check.shard_block_rows``).
    ``sim_input`` reuses an already loaded stream (e.g. to compare schemes on
    the same input without re-reading it). ``progress(n)``: ``n`` more
    messages acked. Raises ``TopologyError`` on bad input (one line naming the
    field). ``clock``: the run's ``phases`` clock (default: one starting now);
    the report's ``phases`` are wall time. ``model``: ``"cores"``, the only
    one (kept for callers that named it; the queueing model was removed).
    ``call_transit_s``: how long a call takes to reach its worker (default
    ``runtime.sim.cores.CALL_TRANSIT_S``, Ray's as measured on this project's
    machines; 0: at once) - a what-if for another network; the report's
    ``sim.call_transit_s`` says which was simulated. An ack's way back is
    ``runtime.sim.cores.ACK_TRANSIT_S`` (the report's ``sim.ack_transit_s``).
    """
    from runtime.sim.cores import ACK_TRANSIT_S, CALL_TRANSIT_S, simulate_cores

    if model != "cores":
        raise TopologyError(f"--model: the simulator has one model, cores (got {model!r}; "
                            "the queueing model was removed)")
    topo = topology if isinstance(topology, Topology) else load_topology(topology, overrides)
    if isinstance(topology, Topology) and overrides:
        raise ValueError("overrides apply to a path or dict, not to a loaded Topology")
    if shard_block_rows is not None and not (isinstance(shard_block_rows, int)
                                             and shard_block_rows >= 1):
        raise TopologyError(f"--shard-block-rows: must be an int >= 1 (got {shard_block_rows})")
    transit_s = CALL_TRANSIT_S if call_transit_s is None else check_call_transit(call_transit_s)
    clock = clock if clock is not None else phases.RunClock.take()
    t0 = time.perf_counter()
    inp = sim_input if sim_input is not None else load_input(topo)
    t_input = time.perf_counter() - t0
    clock.start(time.time())
    try:
        m, result, agg_stats = simulate_cores(topo, inp, block_rows=shard_block_rows,
                                              progress=progress, transit_s=transit_s)
    except ValueError as e:  # a scheme rejecting its parameters
        raise TopologyError(f"grouping: {e}") from None
    clock.end(time.time())
    t_engine = time.perf_counter() - t0 - t_input
    report: dict[str, Any] = dict(reporting.build_report(topo, m))
    wall = time.perf_counter() - t0
    report["input"] = inp.description
    report["aggregator"] = {k: v for k, v in agg_stats.as_report().items()
                            if k != "peak_rss_mb"}
    report["sim"] = {
        "model": "cores",
        "call_transit_s": transit_s,
        "ack_transit_s": ACK_TRANSIT_S,
        "wall_s": wall,
        "input_s": t_input,
        "engine_s": t_engine,
        "simulated_msgs_per_wall_s": inp.n / wall if wall > 0 else 0.0,
    }
    report["result"] = {"path": "result.parquet", "rows": result.num_rows}
    report["phases"] = clock.block()  # in wall time (the simulator's stream: simulating)
    return SimResult(report, reporting.timeseries(m.series), result, clock)


#: the longest call transit ``simulate`` takes (10 s: beyond any network)
MAX_CALL_TRANSIT_S = 10.0


def check_call_transit(seconds: Any) -> float:
    """``seconds`` as a call transit (``simulate``'s ``call_transit_s``), or
    ``TopologyError`` naming the option and the value (in its milliseconds)."""
    if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            and 0.0 <= seconds <= MAX_CALL_TRANSIT_S):
        try:
            got = f"{float(seconds) * 1e3:g}"
        except (TypeError, ValueError):
            got = repr(seconds)
        raise TopologyError(f"--call-transit-ms: must be a number of milliseconds in "
                            f"[0, {MAX_CALL_TRANSIT_S * 1e3:g}] (got {got})")
    return float(seconds)


class SimEngine:
    """The simulator behind ``runtime.engine.Engine``: ``run`` simulates a
    topology, writes its outputs and returns the report.

    ``shard_block_rows``, ``call_transit_s``: as ``simulate``'s (a bad
    transit is refused here, before any input is read). ``plot``: write
    ``report.png``.
    """

    def __init__(self, *, shard_block_rows: int | None = None, plot: bool = True,
                 call_transit_s: float | None = None) -> None:
        self.shard_block_rows = shard_block_rows
        self.plot = plot
        self.call_transit_s = (None if call_transit_s is None
                               else check_call_transit(call_transit_s))

    @contextlib.contextmanager
    def shared_input(self, topo: Topology) -> Iterator[SimInput]:
        """``topo``'s stream, read once (``load_input``)."""
        yield load_input(topo)

    def run(self, topo: Topology, out_dir: str | os.PathLike[str], *, progress: bool = False,
            log: Callable[[str], None] | None = None, data: SimInput | None = None,
            ) -> dict[str, Any]:
        """Simulate ``topo`` on ``data`` (default: its input, read first, so
        the report's ``sim.input_s`` counts no reading), write the outputs to
        ``out_dir``, return the report. The simulator logs nothing: ``log`` is
        unused."""
        clock = phases.RunClock.take()  # its input phase: reading the input
        inp = data if data is not None else load_input(topo)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=inp.n, unit="msg", unit_scale=True, desc="simulated (acked)",
                       file=sys.stderr, mininterval=0.5, leave=False)
        try:
            res = simulate(topo, sim_input=inp, shard_block_rows=self.shard_block_rows,
                           progress=bar.update if bar is not None else None, clock=clock,
                           call_transit_s=self.call_transit_s)
        finally:
            if bar is not None:
                bar.close()
        res.write(out_dir, plot=self.plot)
        return res.report
