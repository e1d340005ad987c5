"""The throughput table: the whole pipeline with no emulated work, per batch size and scheme.

    python scripts/bench_throughput.py [--messages 2000000] [--batches 1000,5000]
                                       [--lingers 5] [--behind 50]
                                       [--schemes kg,cg,acg,fish]
                                       [--offered 0.8] [--out DIR]

One Ray + Spark session. For every batch size, ``run.linger_ms`` (``--lingers``)
and ``run.behind_linger_ms`` (``--behind``; both default to the topology's
defaults), every scheme runs twice on the
same generated Zipf(1.0) input (100,000 keys, 2 sources, 4 workers,
``service_us: 0``, word count): saturated (``run.rate = 0``: msgs/s, the
mean messages per actor call) and at ``--offered`` x its own saturated rate
(p50/p99 latency at that load). It prints one markdown table with the input's
load time (Spark -> Ray shards) beside the streaming time, and writes it to
``DIR/throughput.md``.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.cli import parse_schemes  # noqa: E402
from runtime.compare import run_all  # noqa: E402
from runtime.reporting.report import default_out_dir  # noqa: E402
from runtime.topology import load_topology  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--batches", default="1000,5000")
    p.add_argument("--lingers", default=None,
                   help="run.linger_ms values to compare (default: the default only)")
    p.add_argument("--behind", default=None,
                   help="run.behind_linger_ms values to compare (default: the default only)")
    p.add_argument("--schemes", default="kg,cg,acg,fish")
    p.add_argument("--offered", type=float, default=0.8)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    schemes = parse_schemes(args.schemes)
    batches = [int(b) for b in args.batches.split(",") if b]
    from runtime.topology import RunSpec

    def values(arg: str | None, default: float) -> list[float]:
        return [float(x) for x in arg.split(",") if x] if arg else [default]

    lingers = [(lg, bh) for lg in values(args.lingers, RunSpec().linger_ms)
               for bh in values(args.behind, RunSpec().behind_linger_ms)]
    out = args.out or default_out_dir("throughput")

    def topo(scheme: str, batch: int, linger: tuple[float, float], rate: float) -> Any:
        return load_topology({
            "name": f"throughput-{scheme}-{batch}-{linger[0]:g}-{linger[1]:g}ms",
            "input": {"format": "zipf", "messages": args.messages, "keys": 100_000,
                      "skew": 1.0},
            "sources": 2,
            "workers": {"count": 4, "service_us": 0},
            "grouping": {"scheme": scheme},
            "app": {"kind": "wordcount", "aggregate_every_s": 1.0},
            "run": {"batch": batch, "linger_ms": linger[0], "behind_linger_ms": linger[1],
                    "rate": rate},
        })

    def say(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    from actors.engine import RayEngine

    reports: dict[tuple[int, tuple[float, float], str, str], dict[str, Any]] = {}
    lines = [f"| batch | linger ms | behind ms | scheme | msgs/s | msgs/call | load s | stream s | "
             f"p50 ms at {args.offered:g}x | p99 ms at {args.offered:g}x |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    with RayEngine("bench-throughput") as engine:
        for batch in batches:
            for linger in lingers:
                for phase in ("saturated", "offered"):
                    topos = [topo(s, batch, linger, 0.0 if phase == "saturated" else
                                  args.offered * reports[(batch, linger, s, "saturated")]
                                  ["throughput_msgs_per_s"]) for s in schemes]
                    pending = iter(schemes)

                    def keep(report: dict[str, Any], b: int = batch,
                             lg: tuple[float, float] = linger,
                             ph: str = phase, it: Any = pending) -> None:
                        reports[(b, lg, next(it), ph)] = report

                    run_all(topos, engine,
                            out / f"batch-{batch}-linger-{linger[0]:g}-{linger[1]:g}" / phase,
                            progress=False, say=say, on_run=keep)
                for s in schemes:
                    sat = reports[(batch, linger, s, "saturated")]
                    off = reports[(batch, linger, s, "offered")]
                    calls = sum(x.get("calls", 0) for x in sat["sources"])
                    routed = sum(x["routed"] for x in sat["sources"])
                    lines.append(
                        f"| {batch:,} | {linger[0]:g} | {linger[1]:g} | {s} | {sat['throughput_msgs_per_s']:,.0f} | "
                        f"{routed / max(calls, 1):,.0f} | {sat['load_s']:.1f} | "
                        f"{sat['duration_s']:.1f} | {off['latency_ms']['p50']:,.1f} | "
                        f"{off['latency_ms']['p99']:,.1f} |")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"throughput, {stamp}: {args.messages:,} Zipf(1.0) messages, 2 sources, "
            f"4 workers, service_us 0, word count\n\n" + "\n".join(lines) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.md").write_text(text)
    print(text)
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
