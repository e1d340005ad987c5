"""Heterogeneity stress grid: schemes x heterogeneity x skew, on either engine.

    python scripts/stress_grid.py [--engine sim|ray|both] [--quick]
        [--schemes kg,sg,pkg,cg,fish,dalton,acg,wrr] [--hetero homo,fast3x5,fast5x2,slow2@0.3]
        [--skews 0.6,1.0,1.4] [--workers 10] [--messages N] [--keys N]
        [--service-us US] [--sources N] [--batch N] [--offered F]
        [--set key.path=value ...] [--out DIR] [--address ADDR] [--no-progress]

The values shown are the defaults (``DEFAULTS``); ``--schemes`` defaults to
every scheme of ``runtime.compare``: kg, sg, pkg, cg, fish, dalton, acg, wrr.

Every cell runs one generated Zipf stream (``--messages`` messages over
``--keys`` keys, exponent = the cell's skew, the same stream for every scheme
of the cell) on ``--workers`` workers whose capacities (fractions of full
speed) follow the cell's heterogeneity (see ``stress_common``: ``fast3x5`` =
3 of the workers 5x faster than the rest, the CG paper's setup; ``slow2@0.3``
= 2 workers throttled to 30%). Sources are saturated (``run.rate = 0``,
backpressure) unless ``--offered F`` sets the rate to ``F`` x the total
capacity, so capacity efficiency = throughput / (sum of capacities x 1e6 /
service_us) says how much of the cluster a scheme can use.

Per cell (engine, heterogeneity, skew, scheme): throughput, capacity
efficiency, p50/p99 latency, mean imbalance I(t), replication (KG = 1),
migrations, duration. Outputs in ``--out`` (default
``runs/stress-grid-<UTC stamp>/``): ``grid.csv`` (one row per cell),
``grid.md`` (pivot tables + the full table), ``grid-<engine>.png`` and one
run directory per cell under ``<engine>/<hetero>-z<skew>/<scheme>/``.

The real engine (``--engine ray``) starts Ray and Spark once for the whole
grid and runs every cell in that session (``runtime.compare.run_all``).
``--quick`` is a grid small enough for the real engine on 2 cores (4 workers,
two heterogeneity settings, one skew, a shorter stream); explicit options
override it. The defaults take a few minutes on the simulator.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stress_common as sc  # noqa: E402

from runtime.cli import run_main  # noqa: E402
from runtime.compare import run_all  # noqa: E402
from runtime.reporting.report import default_out_dir  # noqa: E402
from runtime.topology import Topology, TopologyError, load_topology  # noqa: E402

DEFAULTS: dict[str, Any] = {
    "schemes": "kg,sg,pkg,cg,fish,dalton,acg,wrr",
    "hetero": "homo,fast3x5,fast5x2,slow2@0.3",
    "skews": "0.6,1.0,1.4",
    "workers": 10,
    "messages": 524_288,  # 8 x 65,536: the simulator deals 65,536-row blocks to the sources
    "keys": 10_000,
    "service_us": 1000.0,
}
QUICK: dict[str, Any] = {
    "hetero": "fast1x4,slow1@0.3",
    "skews": "1.0",
    "workers": 4,
    "messages": 131_072,  # one 65,536-row block per source in the simulator too
    "service_us": 250.0,
}

#: grid.csv columns, in order
CSV_COLUMNS = (
    "engine", "hetero", "skew", "scheme", "workers", "capacities", "total_capacity_msgs_per_s",
    "messages", "duration_s", "throughput_msgs_per_s", "capacity_efficiency",
    "latency_p50_ms", "latency_p99_ms", "imbalance_mean", "replication", "migrations",
    "offered_msgs_per_s",
)
#: the full markdown table: (column, header, format)
MD_COLUMNS = (
    ("engine", "engine", "{}"), ("hetero", "heterogeneity", "{}"), ("skew", "skew", "{:g}"),
    ("scheme", "scheme", "{}"), ("throughput_msgs_per_s", "msgs/s", "{:,.0f}"),
    ("capacity_efficiency", "cap. eff.", "{:.3f}"), ("latency_p50_ms", "p50 ms", "{:,.1f}"),
    ("latency_p99_ms", "p99 ms", "{:,.1f}"), ("imbalance_mean", "I(t) mean", "{:.3f}"),
    ("replication", "replication", "{:.2f}"),
)


def build_parser() -> sc.Parser:
    p = sc.Parser(prog="stress_grid.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=sc.ENGINES, default="sim",
                   help="sim (default), ray (the real runtime) or both")
    p.add_argument("--quick", action="store_true",
                   help="a small grid for the real engine (explicit options override it)")
    p.add_argument("--schemes", default=None, help=f"default {DEFAULTS['schemes']}")
    p.add_argument("--hetero", default=None,
                   help=f"heterogeneity settings: homo, fast<y>x<z>, slow<k>@<f> "
                        f"(default {DEFAULTS['hetero']})")
    p.add_argument("--skews", default=None, help=f"Zipf exponents (default {DEFAULTS['skews']})")
    p.add_argument("--workers", type=int, default=None, help="workers n (default 10)")
    p.add_argument("--messages", type=int, default=None, help="messages per run")
    p.add_argument("--keys", type=int, default=None, help="distinct keys (default 10,000)")
    p.add_argument("--service-us", type=float, default=None,
                   help="emulated work per message at full speed (default 1000)")
    p.add_argument("--offered", type=float, default=None, metavar="F",
                   help="offered rate as a fraction of the total capacity (default: saturated)")
    sc.add_run_arguments(p)
    return p


def settings(args: Any) -> dict[str, Any]:
    """The effective grid: explicit options > --quick > defaults, validated."""
    merged = {**DEFAULTS, **(QUICK if args.quick else {})}
    for k in ("schemes", "hetero", "skews", "workers", "messages", "keys", "service_us"):
        v = getattr(args, k)
        if v is not None:
            merged[k] = v
    n = sc.positive_int("--workers", int(merged["workers"]), 2)
    cfg = {
        "schemes": sc.parse_schemes(merged["schemes"]),
        "hetero": sc.parse_hetero(merged["hetero"], n),
        "skews": sc.parse_floats(merged["skews"], "--skews", low=0.0),
        "workers": n,
        "messages": sc.positive_int("--messages", int(merged["messages"]), 1000),
        "keys": sc.positive_int("--keys", int(merged["keys"])),
        "service_us": float(merged["service_us"]),
        "sources": sc.positive_int("--sources", args.sources),
        "batch": sc.positive_int("--batch", args.batch),
        "seed": args.seed,
        "offered": args.offered,
        "overrides": list(args.overrides),
    }
    if not cfg["service_us"] > 0:
        sc.fail(f"--service-us: must be > 0 (got {cfg['service_us']:g})")
    if args.offered is not None and not args.offered > 0:
        sc.fail(f"--offered: must be > 0 (got {args.offered})")
    return cfg


def cell_topology(cfg: dict[str, Any], hetero: sc.Hetero, skew: float, scheme: str) -> Topology:
    n = cfg["workers"]
    caps = hetero.capacities(n)
    rate = 0.0
    if cfg["offered"] is not None:
        rate = cfg["offered"] * sum(caps) * 1e6 / cfg["service_us"]
    data = {
        "name": f"stress-{hetero.label}-z{skew:g}",
        "input": {"format": "zipf", "messages": cfg["messages"], "keys": cfg["keys"],
                  "skew": skew, "seed": cfg["seed"]},
        "sources": cfg["sources"],
        "workers": {"count": n, "capacity": caps, "service_us": cfg["service_us"]},
        "grouping": {"scheme": scheme},
        "run": {"batch": cfg["batch"], "rate": rate, "seed": cfg["seed"]},
    }
    try:
        return load_topology(data, [*cfg["overrides"], f"grouping.scheme={scheme}"])
    except TopologyError as e:
        sc.fail(str(e))


def cell_row(engine: str, hetero: sc.Hetero, skew: float, topo: Topology,
             r: dict[str, Any]) -> dict[str, Any]:
    caps = topo.workers.capacities()
    return {
        "engine": engine, "hetero": hetero.label, "skew": skew, "scheme": r["scheme"],
        "workers": topo.workers.count, "capacities": " ".join(f"{c:g}" for c in caps),
        "total_capacity_msgs_per_s": sum(caps) * 1e6 / topo.workers.service_us,
        **{k: r[k] for k in CSV_COLUMNS if k in r and k != "scheme"},
    }


def fmt(v: Any, f: str) -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else f.format(v)


def full_table(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in MD_COLUMNS) + " |",
             "|" + "|".join("---" for _ in MD_COLUMNS) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(fmt(r[c], f) for c, _, f in MD_COLUMNS) + " |")
    return "\n".join(lines)


def pivot_table(df: pd.DataFrame, value: str, f: str) -> str:
    """Rows (heterogeneity, skew), one column per scheme."""
    schemes = list(dict.fromkeys(df["scheme"]))
    lines = ["| heterogeneity | skew | " + " | ".join(schemes) + " |",
             "|---|---|" + "|".join("---" for _ in schemes) + "|"]
    for (h, z), g in df.groupby(["hetero", "skew"], sort=False):
        by = g.set_index("scheme")[value]
        lines.append(f"| {h} | {z:g} | " + " | ".join(fmt(by.get(s), f) for s in schemes) + " |")
    return "\n".join(lines)


def markdown(df: pd.DataFrame, title: str) -> str:
    parts = [f"# {title}", ""]
    for engine, g in df.groupby("engine", sort=False):
        parts += [f"## {engine}: capacity efficiency (throughput / total capacity)", "",
                  pivot_table(g, "capacity_efficiency", "{:.3f}"), "",
                  f"## {engine}: p99 latency (ms)", "",
                  pivot_table(g, "latency_p99_ms", "{:,.0f}"), "",
                  f"## {engine}: replication (KG = 1)", "",
                  pivot_table(g, "replication", "{:.2f}"), ""]
    parts += ["## Every cell", "", full_table(df), ""]
    return "\n".join(parts)


def plot(df: pd.DataFrame, title: str, path: Path) -> None:
    """Per heterogeneity setting (columns): capacity efficiency, p99 latency and
    imbalance against skew, one line per scheme."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heteros = list(dict.fromkeys(df["hetero"]))
    metrics = (("capacity_efficiency", "capacity efficiency", False),
               ("latency_p99_ms", "p99 latency (ms)", True),
               ("imbalance_mean", "imbalance I(t) mean", False))
    fig, axes = plt.subplots(len(metrics), len(heteros), squeeze=False,
                             figsize=(3.6 * len(heteros) + 1, 2.6 * len(metrics)))
    for j, h in enumerate(heteros):
        g = df[df["hetero"] == h]
        for i, (col, label, log) in enumerate(metrics):
            ax = axes[i][j]
            if g["skew"].nunique() == 1:  # one skew: bars per scheme
                for k, (scheme, gs) in enumerate(g.groupby("scheme", sort=False)):
                    ax.bar(k, gs[col].iloc[0], color=f"C{k}", label=scheme)
                ax.set_xticks(range(g["scheme"].nunique()), list(dict.fromkeys(g["scheme"])))
            else:
                for scheme, gs in g.groupby("scheme", sort=False):
                    gs = gs.sort_values("skew")
                    ax.plot(gs["skew"], gs[col], marker="o", lw=1, ms=3, label=scheme)
            if log and g["skew"].nunique() > 1:
                ax.set_yscale("log")
            if i == 0:
                ax.set_title(h, fontsize=9)
                ax.set_ylim(0, 1.05)
            if j == 0:
                ax.set_ylabel(label, fontsize=8)
            if i == len(metrics) - 1:
                ax.set_xlabel(f"scheme (Zipf {g['skew'].iloc[0]:g})" if g["skew"].nunique() == 1
                              else "Zipf exponent", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run_grid(cfg: dict[str, Any], engine_names: list[str], out: Path, *, address: str | None,
             progress: bool) -> pd.DataFrame:
    """Run every cell; returns grid.csv's frame (also written as it grows)."""
    cells = [(h, z) for h in cfg["hetero"] for z in cfg["skews"]]
    rows: list[dict[str, Any]] = []
    for engine in engine_names:
        bar = sc.progress_bar(len(cells) * len(cfg["schemes"]), f"stress grid ({engine})",
                              progress)

        def say(m: str, bar: Any = bar) -> None:
            bar.write(m, file=sys.stderr)

        try:
            with sc.session(engine, "stress-grid", address, out / "engine.log") as session:
                for h, z in cells:
                    topos = [cell_topology(cfg, h, z, s) for s in cfg["schemes"]]
                    bar.set_postfix_str(f"{h.label} z={z:g}")
                    by_scheme = {t.grouping.scheme: t for t in topos}

                    def on_run(report: dict[str, Any], bar: Any = bar) -> None:
                        bar.update(1)

                    done, _ = run_all(topos, session, out / engine / f"{h.label}-z{z:g}",
                                      progress=False, say=say, on_run=on_run)
                    for r in done:
                        rows.append(cell_row(engine, h, z, by_scheme[r["scheme"]], r))
                    pd.DataFrame(rows, columns=list(CSV_COLUMNS)).to_csv(out / "grid.csv",
                                                                         index=False)
        finally:
            bar.close()
    return pd.DataFrame(rows, columns=list(CSV_COLUMNS))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = settings(args)
    for h in cfg["hetero"]:  # every cell's topology validated before anything runs
        for z in cfg["skews"]:
            for s in cfg["schemes"]:
                cell_topology(cfg, h, z, s)
    out = Path(args.out or default_out_dir("stress-grid"))
    out.mkdir(parents=True, exist_ok=True)
    engine_names = sc.engines(args.engine)
    t0 = time.perf_counter()
    df = run_grid(cfg, engine_names, out, address=args.address, progress=not args.no_progress)
    wall = time.perf_counter() - t0
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = "saturated (rate 0)" if cfg["offered"] is None else f"offered {cfg['offered']:g}x"
    short = f"Stress grid, {cfg['workers']} workers, {cfg['messages']:,} msgs/run"
    title = (f"Stress grid, {'+'.join(engine_names)}, {stamp}: {cfg['workers']} workers, "
             f"{cfg['messages']:,} msgs/run, {cfg['keys']:,} keys, service "
             f"{cfg['service_us']:g} us, {load}")
    df.to_csv(out / "grid.csv", index=False)
    (out / "grid.md").write_text(markdown(df, title) + f"\nwall time {wall:.0f} s\n")
    for engine, g in df.groupby("engine", sort=False):
        plot(g, f"{short} ({engine}, {load})", out / f"grid-{engine}.png")
    for engine, g in df.groupby("engine", sort=False):
        print(f"{engine}: capacity efficiency\n\n{pivot_table(g, 'capacity_efficiency', '{:.3f}')}"
              f"\n\n{engine}: p99 latency (ms)\n\n{pivot_table(g, 'latency_p99_ms', '{:,.0f}')}\n")
    print(f"{len(df)} cells in {wall:.0f} s; outputs: {out}")
    return 0


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]))
