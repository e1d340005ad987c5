"""The simulator beside the real engine: the same topologies and schemes, run
by both, saturated and at a fraction of capacity, in one table.

    python scripts/sim_vs_real.py                      # zipf-hetero, wordcount-hetero, demo
    python scripts/sim_vs_real.py topologies/demo.yaml --schemes acg,wrr --offered 0.8
    python scripts/sim_vs_real.py --engines sim        # the simulator's columns only
    python scripts/sim_vs_real.py --repeat 3           # the real engine 3 times: its spread

Every topology runs once per scheme saturated (capacity efficiency) and once
with ``run.rate`` at ``--offered`` times the cluster's capacity (p50 and p99
latency), first on the simulator (``runtime.sim``: the runtime's own cores
on a virtual clock; deterministic), then on Ray + RayDP Spark (one session
for every run). Prints one markdown table with both engines' numbers and how
far apart they are: the efficiency difference (simulator - real) and the
p99 ratio (simulator / real). Real-engine numbers depend on the machine:
measure on a quiet one. ``--repeat N`` runs the real engine N times (the
simulator, deterministic, once): its columns then give the median and, in
brackets, the lowest and highest of the N runs, and the difference and the
ratio are taken against the median. Run directories go to ``--out`` (default
``runs/sim-vs-real-<UTC timestamp>/``). A topology path is taken as given
when it exists, else relative to the repository.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runtime.cli import Parser, fail, parse_schemes, run_main  # noqa: E402
from runtime.compare import open_engine, run_all, topologies  # noqa: E402
from runtime.reporting.report import default_out_dir  # noqa: E402

TOPOLOGIES = ["topologies/zipf-hetero.yaml", "topologies/wordcount-hetero.yaml",
              "topologies/demo.yaml"]
ENGINES = ("sim", "ray")


Runs = dict[tuple[str, str], list[dict[str, Any]]]


def measure(engine_name: str, paths: list[Path], schemes: list[str], offered: float,
            out: Path, address: str | None, repeat: int = 1) -> Runs:
    """``(topology, scheme) -> [{efficiency, p50, p99}, ...]`` on one engine (one
    session), one entry per repeat."""
    got: Runs = {}
    first = topologies(str(paths[0]), [], schemes[:1], None)[0]
    with open_engine(engine_name, address, first, out / "engine.log") as engine:
        for k in range(repeat):
            for path in paths:
                sat = topologies(str(path), [], schemes, None)
                paced = topologies(str(path), [], schemes, offered)
                name = sat[0].name
                where = out / engine_name / name / (f"run-{k + 1}" if repeat > 1 else "")

                def say(m: str, n: str = name) -> None:
                    print(f"  {engine_name} {n} {m}", file=sys.stderr)

                rows_sat, _ = run_all(sat, engine, where / "saturated", progress=False, say=say)
                rows_paced, _ = run_all(paced, engine, where / f"at-{offered:g}",
                                        progress=False, say=say)
                for s, p in zip(rows_sat, rows_paced, strict=True):
                    got.setdefault((name, s["scheme"]), []).append(
                        {"efficiency": s["capacity_efficiency"], "p50": p["latency_p50_ms"],
                         "p99": p["latency_p99_ms"]})
    return got


def _median(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: float(statistics.median(r[k] for r in runs)) for k in runs[0]}


def _spread(runs: list[dict[str, Any]], key: str, fmt: str) -> str:
    """`` (lowest-highest)`` of ``key`` over several runs; nothing for one."""
    if len(runs) < 2:
        return ""
    vals = [r[key] for r in runs]
    return f" ({format(min(vals), fmt)}-{format(max(vals), fmt)})"


def _cells(runs: list[dict[str, Any]] | None,
           m: dict[str, float] | None) -> tuple[str, str]:
    """An engine's efficiency cell and its p50 / p99 cell: the medians ``m``
    over its runs, with the range when it ran more than once ("-": not run)."""
    if not runs or m is None:
        return "-", "-"
    return (f"{m['efficiency']:.3f}" + _spread(runs, "efficiency", ".3f"),
            f"{m['p50']:,.1f} / {m['p99']:,.1f}" + _spread(runs, "p99", ",.1f"))


def table(results: dict[str, Runs], offered: float) -> str:
    """One row per (topology, scheme): each engine's median over its runs
    (and the real engine's range when it ran more than once), the efficiency
    difference and the p99 ratio of the medians."""
    sim, real = results.get("sim", {}), results.get("ray", {})
    head = ["topology", "scheme", "sim: efficiency", "real: efficiency", "difference",
            f"sim: p50 / p99 ms at {offered:g}x", f"real: p50 / p99 ms at {offered:g}x",
            "p99 ratio (sim / real)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in dict.fromkeys([*sim, *real]):
        ra, rb = sim.get(key), real.get(key)
        a, b = (_median(ra) if ra else None), (_median(rb) if rb else None)
        (eff_a, lat_a), (eff_b, lat_b) = _cells(ra, a), _cells(rb, b)
        diff = ratio = "-"
        if a is not None and b is not None:
            diff = f"{a['efficiency'] - b['efficiency']:+.3f}"
            ratio = f"{a['p99'] / b['p99']:.2f}x" if b["p99"] > 0 else "-"
        lines.append(f"| {key[0]} | {key[1]} | {eff_a} | {eff_b} | {diff} | {lat_a} | "
                     f"{lat_b} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python scripts/sim_vs_real.py", description=__doc__.split("\n\n")[0])
    p.add_argument("topologies", nargs="*", default=TOPOLOGIES)
    p.add_argument("--schemes", default="acg,cg,wrr,kg")
    p.add_argument("--engines", default="sim,ray",
                   help="which engines to run (comma-separated: sim, ray)")
    p.add_argument("--offered", type=float, default=0.8,
                   help="the offered load for the latency columns (fraction of capacity)")
    p.add_argument("--address", default=None, help="a running Ray cluster to attach to")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of the real engine per topology and scheme (default 1; the "
                        "table gives their median and range)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not 1 <= args.repeat <= 100:
        fail(f"--repeat: must be an integer in [1, 100] (got {args.repeat})")
    schemes = parse_schemes(args.schemes)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        fail(f"--engines: one or more of {', '.join(ENGINES)} (got {args.engines!r})")
    if not 0 < args.offered <= 1.5:
        fail(f"--offered: must be in (0, 1.5] (got {args.offered})")
    paths = []
    for name in args.topologies:
        path = Path(name) if Path(name).exists() else ROOT / name
        if not path.exists():
            fail(f"topology: no such file: {name}")
        paths.append(path)
    out = Path(args.out) if args.out else default_out_dir("sim-vs-real")
    results = {e: measure(e, paths, schemes, args.offered, out, args.address,
                          args.repeat if e == "ray" else 1) for e in engines}
    print(table(results, args.offered))
    print(f"\nrun directories in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
