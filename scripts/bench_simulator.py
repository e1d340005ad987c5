"""Simulator speed per scheme: simulated messages per wall-clock second.

    python scripts/bench_simulator.py [--messages N] [--workers N] [--sources N]
                                      [--batch N] [--schemes kg,sg,...]

Every registered scheme (``runtime.grouping.SCHEMES``) on the same zipf stream
(loaded once), heterogeneous workers (a quarter at capacity 0.3), rate 0
(backpressure-bound). Prints end-to-end msgs/s (engine + report + result,
excluding input generation, which is shared) on the wall clock and on the
process's CPU clock (the honest figure on a shared, busy machine: the
simulator runs one thread at a time), engine-only msgs/s (wall) and the
sources' calls (each one a simulated actor call and its ack).
A warm-up run per scheme compiles the numba kernels first.
"""

from __future__ import annotations

import argparse
import time

from runtime.grouping import SCHEMES
from runtime.sim import simulate
from runtime.sim.inputs import load_input
from runtime.topology import load_topology


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--sources", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--skew", type=float, default=1.0)
    ap.add_argument("--schemes", default=",".join(sorted(SCHEMES)))
    args = ap.parse_args()
    n = args.workers
    caps = [0.3 if w < max(1, n // 4) else 1.0 for w in range(n)]
    topo_data = {
        "name": "bench-sim",
        "input": {"format": "zipf", "messages": args.messages, "keys": args.keys,
                  "skew": args.skew},
        "sources": args.sources,
        "workers": {"count": n, "capacity": caps, "service_us": 10.0},
        "grouping": {"scheme": "kg"},
        "run": {"batch": args.batch, "rate": 0},
    }
    t = time.perf_counter()
    inp = load_input(load_topology(topo_data))
    print(f"input: {args.messages:,} zipf messages, {len(inp.keys):,} keys, generated in "
          f"{time.perf_counter() - t:.2f} s ({args.messages / (time.perf_counter() - t):,.0f} msgs/s)")
    print(f"{n} workers (capacities {caps}), {args.sources} sources, batch {args.batch}\n")
    print(f"{'scheme':<10} {'msgs/s':>12} {'cpu msgs/s':>12} {'engine msgs/s':>14} "
          f"{'wall s':>8} {'calls':>9} "
          f"{'sim thr msgs/s':>15} {'p99 ms':>8} {'repl':>6}")
    for name in [s for s in args.schemes.split(",") if s]:
        topo = load_topology({**topo_data, "grouping": {"scheme": name}})
        small = load_topology({**topo_data, "grouping": {"scheme": name},
                               "input": {**topo_data["input"], "messages": 20_000}})
        simulate(small)  # warm-up: numba compilation / cache load
        t, c = time.perf_counter(), time.process_time()
        r = simulate(topo, sim_input=inp)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        rep = r.report
        print(f"{name:<10} {args.messages / wall:>12,.0f} {args.messages / cpu:>12,.0f} "
              f"{args.messages / rep['sim']['engine_s']:>14,.0f} {wall:>8.2f} "
              f"{sum(src['calls'] for src in rep['sources']):>9,} "
              f"{rep['throughput_msgs_per_s']:>15,.0f} "
              f"{rep['latency_ms']['p99']:>8.1f} {rep['replication']:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
