"""``python -m runtime.compare TOPOLOGY.yaml --schemes kg,sg,pkg,cg,fish [--engine ray|sim]``

Runs one topology once per grouping scheme on the same input and prints a
side-by-side table: throughput, capacity efficiency, p50/p99 latency,
imbalance, replication, migrations. The real engine starts Ray and Spark once
and reads the input once (a cached DataFrame); the simulator reads it once.

``--offered F`` sets ``run.rate`` to ``F`` times the cluster's total capacity
at the start of the run (``sum(capacities) * 1e6 / service_us`` msgs/s), the
way latency is compared at a fixed offered load (``--offered 0.8``).

Outputs in ``--out`` (default ``runs/compare-<name>-<UTC timestamp>/``): one
run directory per scheme (the usual report.json, timeseries.csv,
result.parquet, report.png), ``compare.csv``, ``compare.md`` and
``compare.png`` (the schemes' time series on shared axes).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pandas as pd

from runtime.cli import base_parser, check_address, fail, load_or_exit, parse_schemes, run_main
from runtime.engine import Engine
from runtime.reporting import phases
from runtime.reporting.report import default_out_dir
from runtime.run import check_input_columns, exit_now
from runtime.topology import Topology

#: every comparison: the baselines, the papers' schemes, the newest peer, ours, and the
#: reference that knows the capacities (wrr: an upper bound, not a real scheme)
DEFAULT_SCHEMES = ("kg", "sg", "pkg", "cg", "fish", "dalton", "acg", "wrr")

COLUMNS = (  # (column, header, format)
    ("scheme", "scheme", "{}"),
    ("throughput_msgs_per_s", "msgs/s", "{:,.0f}"),
    ("capacity_efficiency", "cap. eff.", "{:.3f}"),
    ("latency_p50_ms", "p50 ms", "{:,.1f}"),
    ("latency_p99_ms", "p99 ms", "{:,.1f}"),
    ("imbalance_mean", "I(t) mean", "{:.3f}"),
    ("replication", "replication", "{:.2f}"),
    ("migrations", "migrations", "{:,}"),
    ("duration_s", "duration s", "{:.1f}"),
)


def total_capacity_msgs_per_s(topo: Topology) -> float:
    """What the configured capacities allow at the start of the run."""
    if topo.workers.service_us <= 0:
        return 0.0
    return sum(topo.workers.capacities()) * 1e6 / topo.workers.service_us


def topologies(path: str, overrides: Sequence[str], schemes: Sequence[str],
               offered: float | None) -> list[Topology]:
    """One topology per scheme, all validated before anything runs."""
    out = []
    for s in schemes:
        topo = load_or_exit(path, [*overrides, f"grouping.scheme={s}"])
        if offered is not None:
            full = total_capacity_msgs_per_s(topo)
            if full <= 0:
                fail(f"--offered: needs workers.service_us > 0 (got {topo.workers.service_us})")
            topo = load_or_exit(path, [*overrides, f"grouping.scheme={s}",
                                       f"run.rate={offered * full:.6g}"])
        out.append(topo)
    return out


def row(report: dict[str, Any]) -> dict[str, Any]:
    lat = report["latency_ms"]
    eff = report.get("capacity_efficiency")
    return {
        "scheme": report["scheme"],
        "engine": report["engine"],
        "messages": report["messages"]["processed"],
        "duration_s": report["duration_s"],
        "throughput_msgs_per_s": report["throughput_msgs_per_s"],
        # null without an emulated service time (no capacity to compare with)
        "capacity_efficiency": float("nan") if eff is None else eff,
        "latency_p50_ms": lat["p50"],
        "latency_p99_ms": lat["p99"],
        "imbalance_mean": report["imbalance"]["mean"],
        "replication": report["replication"],
        "migrations": report["migrations"],
        "offered_msgs_per_s": report.get("topology", {}).get("rate", 0.0),
        # where the run's wall time went (runtime.reporting.phases); a later
        # run in the shared session has no start-up
        **{f"{k}_s": report.get("phases", {}).get(k, float("nan"))
           for k in ("startup", "input", "stream", "finish")},
    }


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            v = r.get(key)
            cells.append("-" if v is None or v != v else fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_compare(series: dict[str, pd.DataFrame], rows: Sequence[dict[str, Any]],
                 title: str, path: Path) -> None:
    """Every scheme's throughput, p99 latency and imbalance over time, plus
    capacity efficiency and replication side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 10))
    for scheme, ts in series.items():
        for ax, col in zip(axes[:3], ("throughput_msgs_per_s", "latency_p99_ms", "imbalance"),
                           strict=True):
            if col in ts:
                ax.plot(ts["t_s"], ts[col], lw=1, label=scheme)
    for ax, label in zip(axes[:3], ("throughput (msgs/s)", "p99 latency (ms)", "imbalance I(t)"),
                         strict=True):
        ax.set_ylabel(label)
        ax.set_xlabel("time (s)")
    axes[1].set_yscale("log")
    axes[0].legend(ncol=len(series), fontsize=8)
    names = [r["scheme"] for r in rows]
    x = range(len(rows))
    ax = axes[3]
    ax.bar([i - 0.2 for i in x], [r["capacity_efficiency"] for r in rows], width=0.4,
           label="capacity efficiency")
    ax.bar([i + 0.2 for i in x], [r["replication"] / max(r2["replication"] for r2 in rows)
                                  for r in rows], width=0.4, label="replication (/ max)")
    ax.set_xticks(list(x), names)
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def open_engine(engine: str, address: str | None, topo: Topology,
                log_file: Path | None = None) -> AbstractContextManager[Engine]:
    """The engine ``run_all`` runs ``topo``'s schemes on: the simulator, or a
    Ray + Spark session (``actors.engine.RayEngine``, attached to ``address``)
    once ``topo``'s input passed its checks (else exit 2 before Ray starts).
    ``log_file``: where Spark's and Ray's own messages go (default: the console)."""
    if engine == "sim":
        from runtime.sim import SimEngine

        phases.engine_ready()
        return contextlib.nullcontext(SimEngine())
    check_input_columns(topo)
    from actors.engine import RayEngine

    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    return RayEngine(f"compare-{topo.name}", address, topo=topo, log_file=log_file)


def run_all(topos: Sequence[Topology], engine: Engine, out: Path, *, progress: bool,
            say: Callable[[str], None],
            on_run: Callable[[dict[str, Any]], None] | None = None,
            ) -> tuple[list[dict], dict]:
    """Run every topology on ``engine``; returns the table rows and time series.

    The topologies share one input, ``topos[0]``'s, read once
    (``engine.shared_input``). ``on_run(report)`` is called after each run.
    """
    rows: list[dict[str, Any]] = []
    series: dict[str, pd.DataFrame] = {}
    with engine.shared_input(topos[0]) as data:
        for topo in topos:
            run_dir = out / topo.grouping.scheme
            report = engine.run(topo, run_dir, progress=progress, log=say, data=data)
            rows.append(row(report))
            series[topo.grouping.scheme] = pd.read_csv(run_dir / "timeseries.csv")
            r = rows[-1]
            say(f"[{topo.grouping.scheme}] {r['throughput_msgs_per_s']:,.0f} msgs/s, "
                f"efficiency {r['capacity_efficiency']:.3f}, p99 {r['latency_p99_ms']:,.1f} ms, "
                f"replication {r['replication']:.2f}")
            if on_run is not None:
                on_run(report)
    return rows, series


def main(argv: list[str] | None = None) -> int:
    p = base_parser("python -m runtime.compare",
                    "Run one topology with several grouping schemes and compare them.",
                    out_default="runs/compare-<name>-<UTC timestamp>/, one directory per "
                                "scheme in it")
    p.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES),
                   help=f"comma-separated schemes (default {','.join(DEFAULT_SCHEMES)})")
    p.add_argument("--engine", choices=("ray", "sim"), default="ray",
                   help="ray: the real runtime (default); sim: the simulator")
    p.add_argument("--offered", type=float, default=None, metavar="F",
                   help="offered rate as a fraction of the total capacity (sets run.rate)")
    p.add_argument("--address", default=None, help="Ray cluster address (engine ray)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    phases.begin()  # the command's start: this process's creation
    schemes = parse_schemes(args.schemes)
    if args.offered is not None and not args.offered > 0:
        fail(f"--offered: must be > 0 (got {args.offered})")
    topos = topologies(args.topology, args.overrides, schemes, args.offered)
    if args.engine == "ray":
        check_address(args.address)
    name = topos[0].name
    out = Path(args.out or default_out_dir(f"compare-{name}"))

    def say(m: str) -> None:
        print(m, file=sys.stderr)

    log_file = out / "engine.log" if args.engine == "ray" else None
    with open_engine(args.engine, args.address, topos[0], log_file) as engine:
        rows, series = run_all(topos, engine, out, progress=not args.no_progress, say=say)
    table = markdown_table(rows)
    rate = topos[0].run.rate
    offered = (f", offered {args.offered:g}x capacity" if args.offered
               else f", rate {rate:,.0f} msgs/s" if rate else ", rate 0 (saturated)")
    title = f"{name} on {args.engine}{offered}"
    pd.DataFrame(rows).to_csv(out / "compare.csv", index=False)
    (out / "compare.md").write_text(f"# {title}\n\n{table}\n")
    plot_compare(series, rows, title, out / "compare.png")
    print(f"{title}\n\n{table}\n\noutputs: {out}")
    return 0


if __name__ == "__main__":
    try:
        run_main(lambda: main(sys.argv[1:]))
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            raise
        exit_now(e.code or 0)  # (runtime.run's: no slow teardown of the interpreter)
