"""``python -m runtime.simulate TOPOLOGY.yaml [--out DIR] [--set key.path=value ...]``

The simulator: the same topology and report schema as ``runtime.run``
(``"engine": "sim"``), in simulated time. It runs the runtime's own source,
worker and aggregator cores on a virtual clock (``runtime.sim.cores``); the
Python API is ``runtime.sim.simulate``, and ``runtime.sim.SimEngine`` runs it
here (simulate, write the outputs).
Input files are read with pyarrow here (the real runtime reads them through
Spark); generated streams are identical in both engines.
"""

from __future__ import annotations

import time

from runtime.cli import base_parser, load_or_exit, run_main
from runtime.reporting import phases
from runtime.reporting.report import default_out_dir, summary_table
from runtime.sim import SimEngine, SimResult, simulate

__all__ = ["SimResult", "main", "simulate"]


def main(argv: list[str] | None = None) -> int:
    p = base_parser("python -m runtime.simulate",
                    "Simulate a topology: the runtime's own cores on a virtual clock "
                    "(same report schema).")
    p.add_argument("--shard-block-rows", type=int, default=None,
                   help="stream blocks dealt round-robin to the sources (default: as the "
                        "real runtime)")
    p.add_argument("--model", choices=("cores",), default="cores",
                   help="cores (the only one: the runtime's own cores on a virtual clock; the "
                        "former queueing model was removed)")
    p.add_argument("--call-transit-ms", type=float, default=None, metavar="MS",
                   help="how long a call takes to reach its worker (default 3.5: Ray on a "
                        "shared 2-core machine, as measured; 0: at once) - a what-if for "
                        "another network (an ack's way back stays 1.3 ms, as measured)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plot", action="store_true", help="skip report.png")
    args = p.parse_args(argv)
    phases.begin()  # the command's start: this process's creation
    phases.engine_ready()  # the simulator is up once imported
    engine = SimEngine(shard_block_rows=args.shard_block_rows, plot=not args.no_plot,
                       call_transit_s=None if args.call_transit_ms is None
                       else args.call_transit_ms / 1e3)  # (checked before anything is read)
    topo = load_or_exit(args.topology, args.overrides)
    out = args.out or default_out_dir(topo.name)
    t0 = time.perf_counter()
    report = engine.run(topo, out, progress=not args.no_progress)
    print(summary_table(report))
    wall = time.perf_counter() - t0
    n = report["messages"]["input"]
    print(f"\nsimulated {n:,} messages in {wall:.2f} s ({n / wall:,.0f} msgs/s, input and "
          f"outputs included); outputs in {out}")
    return 0


if __name__ == "__main__":
    run_main(main)
