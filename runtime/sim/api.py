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
from runtime.sim.engine import (
    DEFAULT_ACK_DELAY_MS,
    SHARD_BLOCK_ROWS,
    Engine,
    EngineResult,
    SimParams,
)
from runtime.sim.inputs import SimInput, load_input
from runtime.sim.summary import measurements, result_table
from runtime.topology import Topology, TopologyError, load_topology


@dataclass
class SimResult:
    report: dict[str, Any]
    timeseries: pd.DataFrame
    result: pa.Table
    engine: EngineResult | None  # the queueing model's raw result (None: over the cores)
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


def params_from_topology(
    topo: Topology,
    *,
    ack_delay_ms: float = DEFAULT_ACK_DELAY_MS,
    shard_block_rows: int = SHARD_BLOCK_ROWS,
) -> SimParams:
    w = topo.workers
    if not (ack_delay_ms >= 0.0):
        raise TopologyError(f"--ack-delay-ms: must be >= 0 (got {ack_delay_ms})")
    if not (isinstance(shard_block_rows, int) and shard_block_rows >= 1):
        raise TopologyError(f"--shard-block-rows: must be an int >= 1 (got {shard_block_rows})")
    return SimParams(
        n_sources=topo.sources,
        n_workers=w.count,
        batch=topo.run.batch,
        rate=float(topo.run.rate),
        max_inflight=topo.run.max_inflight,
        seed=topo.run.seed,
        service_us=float(w.service_us),
        capacities=w.capacities(),
        changes=[(float(c.at_s), int(c.worker), float(c.capacity)) for c in w.changes],
        scheme=topo.grouping.scheme,
        scheme_params=topo.grouping_params(),
        slot_s=float(topo.run.slot_s),
        ack_delay_s=ack_delay_ms / 1e3,
        queue_batches=w.queue_batches,
        shard_block_rows=shard_block_rows,
        report_every_s=float(topo.app.aggregate_every_s),
    )


def simulate(
    topology: Topology | str | os.PathLike[str] | dict[str, Any],
    overrides: list[str] | None = None,
    *,
    ack_delay_ms: float = DEFAULT_ACK_DELAY_MS,
    shard_block_rows: int = SHARD_BLOCK_ROWS,
    sim_input: SimInput | None = None,
    progress: Callable[[int], None] | None = None,
    clock: phases.RunClock | None = None,
    model: str = "queueing",
) -> SimResult:
    """Simulate a topology (object, YAML path or dict, plus ``--set`` overrides).

    ``model``: ``"queueing"`` (``runtime.sim.engine``, the default) or
    ``"cores"`` (``runtime.sim.cores``: the runtime's own source, worker and
    aggregator cores on a virtual clock; ``ack_delay_ms``, ``shard_block_rows``
    and ``progress`` are the queueing model's).

    ``shard_block_rows``: stream blocks dealt round-robin to the sources (the
    real runtime's 65,536; smaller spreads small inputs over every source).
    ``sim_input`` reuses an already loaded stream (e.g. to compare schemes on
    the same input without re-reading it). Raises ``TopologyError`` on bad
    input (one line naming the field). ``clock``: the run's ``phases`` clock
    (default: one starting now); the report's ``phases`` are wall time.
    """
    topo = topology if isinstance(topology, Topology) else load_topology(topology, overrides)
    if isinstance(topology, Topology) and overrides:
        raise ValueError("overrides apply to a path or dict, not to a loaded Topology")
    clock = clock if clock is not None else phases.RunClock.take()
    t0 = time.perf_counter()
    inp = sim_input if sim_input is not None else load_input(topo)
    t_input = time.perf_counter() - t0
    if model not in MODELS:
        raise TopologyError(f"--model: one of {', '.join(MODELS)} (got {model!r})")
    if model == "cores":
        return _over_the_cores(topo, inp, clock, t0, t_input)
    params = params_from_topology(topo, ack_delay_ms=ack_delay_ms,
                                  shard_block_rows=shard_block_rows)
    try:
        engine = Engine(params, inp.key_ids, inp.message_hashes(), len(inp.keys), progress)
    except ValueError as e:  # a scheme rejecting its parameters
        raise TopologyError(f"grouping: {e}") from None
    clock.start(time.time())
    er = engine.run()
    clock.end(time.time())
    t_engine = time.perf_counter() - t0 - t_input
    m = measurements(er)
    ts = reporting.timeseries(m.series)
    report: dict[str, Any] = dict(reporting.build_report(topo, m))
    result = result_table(topo, inp, er)
    wall = time.perf_counter() - t0
    report["input"] = inp.description
    report["sim"] = {
        "model": "queueing",
        "wall_s": wall,
        "input_s": t_input,
        "engine_s": t_engine,
        "simulated_msgs_per_wall_s": er.n_messages / wall if wall > 0 else 0.0,
        "events": er.events,
    }
    report["result"] = {"path": "result.parquet", "rows": result.num_rows}
    report["phases"] = clock.block()  # in wall time (the simulator's stream: simulating)
    return SimResult(report, ts, result, er, clock)


#: the simulator's models (``simulate``'s ``model``)
MODELS = ("queueing", "cores")


def _over_the_cores(topo: Topology, inp: SimInput, clock: phases.RunClock, t0: float,
                    t_input: float) -> SimResult:
    from runtime.sim.cores import simulate_cores

    clock.start(time.time())
    try:
        m, result, agg_stats = simulate_cores(topo, inp)
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
        "wall_s": wall,
        "input_s": t_input,
        "engine_s": t_engine,
        "simulated_msgs_per_wall_s": inp.n / wall if wall > 0 else 0.0,
    }
    report["result"] = {"path": "result.parquet", "rows": result.num_rows}
    report["phases"] = clock.block()
    return SimResult(report, reporting.timeseries(m.series), result, None, clock)


class SimEngine:
    """The simulator behind ``runtime.engine.Engine``: ``run`` simulates a
    topology, writes its outputs and returns the report.

    ``ack_delay_ms``, ``shard_block_rows``: as ``simulate``'s. ``plot``: write
    ``report.png``.
    """

    def __init__(self, *, ack_delay_ms: float = DEFAULT_ACK_DELAY_MS,
                 shard_block_rows: int = SHARD_BLOCK_ROWS, plot: bool = True,
                 model: str = "queueing") -> None:
        self.ack_delay_ms = ack_delay_ms
        self.shard_block_rows = shard_block_rows
        self.plot = plot
        self.model = model

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
            res = simulate(topo, ack_delay_ms=self.ack_delay_ms, sim_input=inp,
                           shard_block_rows=self.shard_block_rows,
                           progress=bar.update if bar is not None else None, clock=clock,
                           model=self.model)
        finally:
            if bar is not None:
                bar.close()
        res.write(out_dir, plot=self.plot)
        return res.report
