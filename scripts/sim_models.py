"""The simulator's two models side by side: the queueing model
(``runtime.sim.engine``) and the runtime's own cores on a virtual clock
(``runtime.sim.cores``), on the same topologies and schemes, saturated and at
a fraction of capacity. Both are deterministic: the numbers do not depend on
the machine's load (only the wall time does).

    python scripts/sim_models.py                      # zipf-hetero, wordcount-hetero, demo
    python scripts/sim_models.py topologies/demo.yaml --schemes acg,wrr --offered 0.8

Prints one markdown table: capacity efficiency saturated, p50 and p99 at the
offered load, and each model's simulated messages per wall second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.compare import total_capacity_msgs_per_s  # noqa: E402
from runtime.sim import simulate  # noqa: E402
from runtime.sim.inputs import load_input  # noqa: E402
from runtime.topology import load_topology  # noqa: E402

TOPOLOGIES = ["topologies/zipf-hetero.yaml", "topologies/wordcount-hetero.yaml",
              "topologies/demo.yaml"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("topologies", nargs="*", default=TOPOLOGIES)
    p.add_argument("--schemes", default="acg,cg,wrr,kg")
    p.add_argument("--offered", type=float, default=0.8,
                   help="the offered load for the latency columns (fraction of capacity)")
    args = p.parse_args(argv)
    print("| topology | scheme | model | capacity efficiency (saturated) | p50 ms at "
          f"{args.offered}x | p99 ms at {args.offered}x | simulated msgs per wall s |")
    print("|---|---|---|---|---|---|---|")
    for path in args.topologies:
        base = load_topology(ROOT / path)
        inp = load_input(base)
        full = total_capacity_msgs_per_s(base)
        for scheme in args.schemes.split(","):
            for model in ("queueing", "cores"):
                t = time.perf_counter()
                sat = simulate(ROOT / path, [f"grouping.scheme={scheme}"], sim_input=inp,
                               model=model).report
                wall = time.perf_counter() - t
                paced = simulate(ROOT / path, [f"grouping.scheme={scheme}",
                                               f"run.rate={args.offered * full:.6g}"],
                                 sim_input=inp, model=model).report
                lat = paced["latency_ms"]
                print(f"| {base.name} | {scheme} | {model} | "
                      f"{sat['capacity_efficiency']:.3f} | {lat['p50']:,.1f} | "
                      f"{lat['p99']:,.1f} | {inp.n / wall:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
