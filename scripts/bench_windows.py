"""What windows cost: the same word count with and without ``app.window``, on the real engine.

    python scripts/bench_windows.py [--messages 2000000] [--schemes kg,acg] [--rounds 2]
                                    [--out DIR]

One Ray + Spark session. Each input is read once (the windowed one carries
the ``ts`` column to the workers, the plain one does not). Every round runs,
per scheme, the plain count, one window holding everything (what carrying
``ts`` and the window code cost), tumbling windows (``size`` = messages /
20: 20 windows) and sliding windows (the same size, ``slide`` = size / 2: every
record in 2 windows), saturated (``run.rate: 0``), on a generated Zipf(1.0)
stream of 100,000 keys, 2 sources, 4 workers, ``service_us: 0``. It prints
one markdown table (msgs/s, and each windowed run's ratio to the plain run
of the same round and scheme) and writes it to ``DIR/windows.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.cli import parse_schemes  # noqa: E402
from runtime.reporting.report import default_out_dir  # noqa: E402
from runtime.topology import load_topology  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--schemes", default="kg,acg")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    schemes = parse_schemes(args.schemes)
    out = args.out or default_out_dir("windows")
    size = max(1, args.messages // 20)
    kinds: dict[str, dict[str, Any] | None] = {
        "plain": None,
        # every record in one window: what carrying ts and the window code cost,
        # without more state (the result equals plain's, per window)
        "one-window": {"column": "ts", "size": 10**15},
        "tumbling": {"column": "ts", "size": size},
        "sliding": {"column": "ts", "size": size, "slide": max(1, size // 2)},
    }

    def topo(scheme: str, kind: str) -> Any:
        app: dict[str, Any] = {"kind": "wordcount", "aggregate_every_s": 1.0}
        if kinds[kind] is not None:
            app["window"] = kinds[kind]
        return load_topology({
            "name": f"windows-{scheme}-{kind}",
            "input": {"format": "zipf", "messages": args.messages, "keys": 100_000,
                      "skew": 1.0},
            "sources": 2,
            "workers": {"count": 4, "service_us": 0},
            "grouping": {"scheme": scheme},
            "app": app,
        })

    def say(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    from actors.engine import RayEngine

    rates: dict[tuple[str, str], list[float]] = {}
    lines = ["| round | scheme | window | msgs/s | vs plain | result rows |",
             "|---:|---|---|---:|---:|---:|"]
    with (RayEngine("bench-windows") as engine,
          engine.shared_input(topo(schemes[0], "plain")) as plain_data,
          engine.shared_input(topo(schemes[0], "tumbling")) as win_data):
        for rnd in range(1, args.rounds + 1):
            for scheme in schemes:
                base = None
                for kind in kinds:
                    t = topo(scheme, kind)
                    report = engine.run(t, out / f"round-{rnd}" / scheme / kind, progress=False,
                                        log=say, data=plain_data if kind == "plain"
                                        else win_data, plot=False)
                    rate = float(report["throughput_msgs_per_s"])
                    rates.setdefault((scheme, kind), []).append(rate)
                    base = rate if kind == "plain" else base
                    ratio = "" if kind == "plain" or not base else f"{rate / base:.2f}"
                    lines.append(f"| {rnd} | {scheme} | {kind} | {rate:,.0f} | {ratio} | "
                                 f"{report['result']['rows']:,} |")
                    say(lines[-1])
    summary = ["", "| scheme | window | median msgs/s | median vs plain |", "|---|---|---:|---:|"]
    for scheme in schemes:
        plain = statistics.median(rates[(scheme, "plain")])
        for kind in kinds:
            med = statistics.median(rates[(scheme, kind)])
            summary.append(f"| {scheme} | {kind} | {med:,.0f} | {med / plain:.2f} |")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists(
        "/proc/loadavg") else "?"
    text = (f"windows, {stamp} (load average at the end {load}): {args.messages:,} Zipf(1.0) "
            f"messages, 2 sources, 4 workers, service_us 0, word count; window size "
            f"{size:,} (ts = message index)\n\n" + "\n".join(lines + summary) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "windows.md").write_text(text)
    print(text)
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
