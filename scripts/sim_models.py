"""The simulator's two models side by side: the queueing model
(``runtime.sim.engine``) and the runtime's own cores on a virtual clock
(``runtime.sim.cores``), on the same topologies and schemes, saturated and at
a fraction of capacity. Both are deterministic: the numbers do not depend on
the machine's load (only the wall time does).

    python scripts/sim_models.py                      # zipf-hetero, wordcount-hetero, demo
    python scripts/sim_models.py topologies/demo.yaml --schemes acg,wrr --offered 0.8
    python scripts/sim_models.py /tmp/my.yaml --schemes acg,wrr --models cores

Prints one markdown table: capacity efficiency and replication saturated, p50
and p99 at the offered load, and each model's simulated messages per wall
second. A topology path is taken as given when it exists, else relative to
the repository.
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
    p.add_argument("--models", default="queueing,cores",
                   help="which models to run (comma-separated: queueing, cores)")
    p.add_argument("--offered", type=float, default=0.8,
                   help="the offered load for the latency columns (fraction of capacity)")
    args = p.parse_args(argv)
    models = args.models.split(",")
    print("| topology | scheme | model | capacity efficiency (saturated) | replication | "
          f"p50 ms at {args.offered}x | p99 ms at {args.offered}x | simulated msgs per wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.topologies:
        path = Path(name) if Path(name).exists() else ROOT / name
        base = load_topology(path)
        inp = load_input(base)
        full = total_capacity_msgs_per_s(base)
        for scheme in args.schemes.split(","):
            for model in models:
                t = time.perf_counter()
                sat = simulate(path, [f"grouping.scheme={scheme}"], sim_input=inp,
                               model=model).report
                wall = time.perf_counter() - t
                paced = simulate(path, [f"grouping.scheme={scheme}",
                                               f"run.rate={args.offered * full:.6g}"],
                                 sim_input=inp, model=model).report
                lat = paced["latency_ms"]
                print(f"| {base.name} | {scheme} | {model} | "
                      f"{sat['capacity_efficiency']:.3f} | {sat['replication']:.2f} | "
                      f"{lat['p50']:,.1f} | "
                      f"{lat['p99']:,.1f} | {inp.n / wall:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
