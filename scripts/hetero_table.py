"""The heterogeneity table: every scheme saturated, then at 80% offered load.

    python scripts/hetero_table.py [topologies/wordcount-hetero.yaml] [--engine ray|sim]
                                   [--schemes kg,sg,pkg,cg,fish,dalton,acg,wrr] [--offered 0.8]
                                   [--out DIR]

The values shown are the defaults: ``topologies/wordcount-hetero.yaml``, the
real engine (``--engine ray``), every scheme of ``runtime.compare`` (kg, sg, pkg,
cg, fish, dalton, acg, wrr) and 80% offered load.

Two ``runtime.compare`` passes over the same topology: ``run.rate = 0`` (as
fast as backpressure allows: throughput, capacity efficiency = throughput /
sum of the capacities at full speed, replication) and ``run.rate = offered x``
the total capacity (latency at a fixed offered load). Prints one markdown
table with both, the CG-vs-KG and ACG-vs-peers ratios and the goals, and writes it to
``DIR/hetero.md`` (run directories of both passes under ``DIR``).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.cli import parse_schemes  # noqa: E402
from runtime.compare import open_engine, run_all, topologies  # noqa: E402
from runtime.reporting.report import default_out_dir  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("topology", nargs="?", default=str(ROOT / "topologies/wordcount-hetero.yaml"))
    p.add_argument("--engine", choices=("ray", "sim"), default="ray")
    p.add_argument("--schemes", default="kg,sg,pkg,cg,fish,dalton,acg,wrr")
    p.add_argument("--offered", type=float, default=0.8)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    schemes = parse_schemes(args.schemes)
    out = args.out or default_out_dir("hetero-table")

    def say(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    sat_topos = topologies(args.topology, [], schemes, None)
    off_topos = topologies(args.topology, [], schemes, args.offered)
    log_file = out / "engine.log" if args.engine == "ray" else None  # Spark's and Ray's own lines
    with open_engine(args.engine, None, sat_topos[0], log_file) as engine:
        sat, _ = run_all(sat_topos, engine, out / "saturated", progress=False, say=say)
        off, _ = run_all(off_topos, engine, out / f"offered-{args.offered:g}", progress=False,
                         say=say)
    rate = off[0]["offered_msgs_per_s"]
    lines = [
        f"| scheme | msgs/s (rate 0) | capacity efficiency | replication | "
        f"p50 ms at {args.offered:g}x | p99 ms at {args.offered:g}x | msgs/s at {args.offered:g}x |",
        "|---|---|---|---|---|---|---|",
    ]
    for a, b in zip(sat, off, strict=True):
        lines.append(
            f"| {a['scheme']} | {a['throughput_msgs_per_s']:,.0f} | "
            f"{a['capacity_efficiency']:.3f} | {a['replication']:.2f} | "
            f"{b['latency_p50_ms']:,.1f} | {b['latency_p99_ms']:,.1f} | "
            f"{b['throughput_msgs_per_s']:,.0f} |")
    by_sat = {r["scheme"]: r for r in sat}
    by_off = {r["scheme"]: r for r in off}
    notes = []
    if "cg" in by_sat and "kg" in by_sat:
        thr = by_sat["cg"]["throughput_msgs_per_s"] / by_sat["kg"]["throughput_msgs_per_s"]
        p99 = by_off["kg"]["latency_p99_ms"] / by_off["cg"]["latency_p99_ms"]
        rep = by_sat["cg"]["replication"] / by_sat["kg"]["replication"]
        notes += [f"- cg / kg throughput: {thr:.2f}x (goal >= 2)",
                  f"- kg / cg p99 latency at {args.offered:g}x: {p99:.1f}x (goal >= 3.44)",
                  f"- cg / kg replication: {rep:.2f}x (goal <= 1.5)"]
    eff = {s: r["capacity_efficiency"] for s, r in by_sat.items()}
    if "acg" in eff:
        notes.append(f"- acg capacity efficiency: {eff['acg']:.3f} (goal >= 0.90)")
        for peer in ("cg", "fish", "dalton"):
            if peer in by_sat:
                ratio = (by_sat["acg"]["throughput_msgs_per_s"]
                         / by_sat[peer]["throughput_msgs_per_s"])
                goal = "goal >= 1.3" if peer == "cg" else "goal > 1"
                notes.append(f"- acg / {peer} throughput: {ratio:.2f}x ({goal})")
    if "wrr" in eff:
        notes.append(f"- wrr capacity efficiency: {eff['wrr']:.3f} (goal >= 0.95; the ceiling)")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    text = (f"{Path(args.topology).name} on {args.engine}, {stamp}; offered load "
            f"{args.offered:g}x = {rate:,.0f} msgs/s\n\n" + "\n".join(lines) + "\n\n"
            + "\n".join(notes) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "hetero.md").write_text(text)
    print(text)
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
