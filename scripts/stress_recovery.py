"""How fast each scheme recovers from a disturbance, on either engine.

    python scripts/stress_recovery.py [--engine sim|ray|both] [--quick]
        [--scenarios capacity-change,hot-keys,slowdown]
        [--schemes kg,sg,pkg,cg,fish,dalton,acg,wrr]
        [--workers 10] [--phase-s 30] [--service-us 1000] [--skew 1.0] [--keys 10000]
        [--threshold 0.9] [--smooth-s 2] [--hold-s 10] [--set key.path=value ...] [--out DIR]
        [--address ADDR] [--no-progress]

The values shown are the defaults (``DEFAULTS``); ``--schemes`` defaults to
every scheme of ``runtime.compare``: kg, sg, pkg, cg, fish, dalton, acg, wrr.

Scenarios (``n`` workers, capacities as fractions of full speed, sources
saturated: ``run.rate = 0`` with backpressure, Zipf(``--skew``) keys):

- ``capacity-change``: the CG paper's Fig 12: ``y = 0.3 n`` workers are 5x
  faster than the rest (1 vs 0.2); after one phase the fast role moves to
  the next ``y`` workers, after two phases to the next ``y`` again; the total
  capacity stays constant. Two disturbances.
- ``hot-keys``: FISH's time-evolving stream (``evolving-zipf``): the hot keys
  move to other keys every quarter of the stream, on a cluster with
  ``n / 5`` workers throttled to 30%. Three disturbances, at the moments
  the cumulative processed count crosses a shift (the sources advance through
  the stream together).
- ``slowdown``: ``n`` equal workers; after one phase worker 0 drops to 10%.

Each scenario's stream is sized so that a scheme that uses the whole
capacity spends about ``--phase-s`` seconds in each phase (rounded so that
the stream splits evenly between the sources on each engine); slower schemes
take longer and see the same disturbances at the same times (capacity
changes) or stream positions (hot keys).

Recovery: per interval, capacity efficiency ``e = throughput / total
capacity at that time`` (``sum_w capacity_w x 1e6 / service_us``, from the
time series). The recovery time after a disturbance at ``t_d`` is
``t - t_d`` for the first interval start ``t >= t_d`` from which the
efficiency, averaged over the ``--smooth-s`` seconds from each interval on,
stays ``>= --threshold`` (0.9) for ``--hold-s`` seconds (10; or to the end of
the phase, if sooner: a scheme whose efficiency only falls some seconds after
the disturbance, while queues absorb it, has not recovered at once), searched
within the phase (up to the next disturbance, or to 98% of
the stream processed, which cuts the final drain). ``never`` when no such
``t`` exists; ``level`` is then the mean efficiency over the phase's last
``--level-s`` seconds (what the scheme settles at), ``before`` the same over
the ``--level-s`` seconds before the disturbance.

Outputs in ``--out`` (default ``runs/stress-recovery-<UTC stamp>/``):
``recovery.csv`` (one row per engine x scenario x scheme x disturbance),
``recovery.md``, ``recovery-<engine>.png`` (efficiency over time per
scenario), run directories under ``<engine>/<scenario>/<scheme>/``. The real
engine runs everything in one Ray + Spark session.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stress_common as sc  # noqa: E402

from runtime.cli import run_main  # noqa: E402
from runtime.compare import run_all  # noqa: E402
from runtime.reporting.report import default_out_dir  # noqa: E402
from runtime.topology import Topology, TopologyError, load_topology  # noqa: E402

SCENARIOS = ("capacity-change", "hot-keys", "slowdown")
#: the CG paper's speed ratio between fast and slow workers (Fig 8 / Fig 12)
FAST_FACTOR = 5.0
#: hot-keys: throttled workers' capacity; slowdown: the slowed worker's
THROTTLED = 0.3
SLOWED = 0.1
#: the analysis stops once this share of the stream is processed (final drain)
END_FRACTION = 0.98

DEFAULTS: dict[str, Any] = {"schemes": "kg,sg,pkg,cg,fish,dalton,acg,wrr", "workers": 10, "phase_s": 30.0,
                            "service_us": 1000.0}
QUICK: dict[str, Any] = {"workers": 4, "phase_s": 10.0, "service_us": 300.0}

CSV_COLUMNS = (
    "engine", "scenario", "scheme", "disturbance", "at_s", "before", "recovery_s", "level",
    "dip", "phase_end_s", "messages", "duration_s", "throughput_msgs_per_s",
    "capacity_efficiency", "latency_p99_ms", "replication", "migrations",
)


@dataclass
class Scenario:
    name: str
    what: str
    capacities: list[float]
    messages: int
    changes: list[tuple[float, int, float]] = field(default_factory=list)
    shift_every: int | None = None  # hot-keys: disturbances at stream positions

    def disturbance_times(self) -> list[float]:
        return sorted({t for t, _, _ in self.changes})


def build_parser() -> sc.Parser:
    p = sc.Parser(prog="stress_recovery.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=sc.ENGINES, default="sim")
    p.add_argument("--quick", action="store_true",
                   help="smaller scenarios for the real engine (4 workers, 10 s phases, "
                        "300 us/message); explicit options override it")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--schemes", default=None, help=f"default {DEFAULTS['schemes']}")
    p.add_argument("--workers", type=int, default=None, help="workers n (default 10)")
    p.add_argument("--phase-s", type=float, default=None,
                   help="seconds per phase for a scheme using the whole capacity (default 30)")
    p.add_argument("--service-us", type=float, default=None,
                   help="emulated work per message at full speed (default 1000)")
    p.add_argument("--skew", type=float, default=1.0, help="Zipf exponent (default 1.0)")
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--threshold", type=float, default=0.9,
                   help="recovered = capacity efficiency back to >= this (default 0.9)")
    p.add_argument("--smooth-s", type=float, default=2.0,
                   help="efficiency averaged over this window from each interval on (default 2)")
    p.add_argument("--level-s", type=float, default=5.0,
                   help="window for the before / settled levels (default 5)")
    p.add_argument("--hold-s", type=float, default=10.0,
                   help="recovered = the efficiency holds >= the threshold this long "
                        "(or to the phase's end; default 10)")
    sc.add_run_arguments(p)
    return p


def settings(args: Any) -> dict[str, Any]:
    merged = {**DEFAULTS, **(QUICK if args.quick else {})}
    for k in ("schemes", "workers", "phase_s", "service_us"):
        v = getattr(args, k)
        if v is not None:
            merged[k] = v
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not names:
        sc.fail("--scenarios: empty list")
    for s in names:
        if s not in SCENARIOS:
            sc.fail(f"--scenarios: unknown scenario {s!r} (known: {', '.join(SCENARIOS)})")
    if len(set(names)) != len(names):
        sc.fail(f"--scenarios: a scenario is listed twice ({args.scenarios!r})")
    n = sc.positive_int("--workers", int(merged["workers"]), 2)
    if "capacity-change" in names and n < 3:
        sc.fail(f"--workers: capacity-change needs >= 3 workers (got {n})")
    for opt, v in (("--phase-s", merged["phase_s"]), ("--service-us", merged["service_us"]),
                   ("--smooth-s", args.smooth_s), ("--level-s", args.level_s),
                   ("--hold-s", args.hold_s)):
        if not (math.isfinite(v) and v > 0):
            sc.fail(f"{opt}: must be > 0 (got {v:g})")
    if not 0 < args.threshold <= 1:
        sc.fail(f"--threshold: must be in (0, 1] (got {args.threshold:g})")
    if not (math.isfinite(args.skew) and args.skew >= 0):
        sc.fail(f"--skew: must be >= 0 (got {args.skew:g})")
    return {
        "scenarios": names, "schemes": sc.parse_schemes(merged["schemes"]), "workers": n,
        "phase_s": float(merged["phase_s"]), "service_us": float(merged["service_us"]),
        "skew": args.skew, "keys": sc.positive_int("--keys", args.keys),
        "sources": sc.positive_int("--sources", args.sources),
        "batch": sc.positive_int("--batch", args.batch), "seed": args.seed,
        "threshold": args.threshold, "smooth_s": args.smooth_s, "level_s": args.level_s, "hold_s": args.hold_s,
        "overrides": list(args.overrides),
    }


def aligned(target: float, engine: str, sources: int, parts: int = 1) -> int:
    """``target`` messages rounded up so that the stream splits into ``parts``
    equal segments, each dealt evenly to the sources in whole blocks.

    The simulator deals blocks of 65,536 messages round-robin; the real
    runtime cuts the stream into ``4 x sources`` blocks (of at most 65,536).
    Even shards keep every source busy to the end, and a hot-key shift at a
    segment boundary then reaches every source at the same moment.
    """
    block = 65_536
    if engine == "ray" and target <= block * 4 * sources:
        unit = 4 * sources * 1000
    else:
        unit = block * sources * parts
    return int(max(1, math.ceil(target / unit - 1e-6)) * unit)


def build_scenario(name: str, cfg: dict[str, Any], engine: str) -> Scenario:
    n, phase, rate_1 = cfg["workers"], cfg["phase_s"], 1e6 / cfg["service_us"]
    src = cfg["sources"]
    if name == "capacity-change":
        y = max(1, round(0.3 * n))
        slow = 1.0 / FAST_FACTOR
        caps = [1.0] * y + [slow] * (n - y)
        changes = []
        for k, at in ((1, phase), (2, 2 * phase)):
            for w in range(n):
                was = 1.0 if (k - 1) * y <= w < k * y else slow
                now = 1.0 if k * y <= w < (k + 1) * y else slow
                if was != now:
                    changes.append((at, w, now))
        total = sum(caps) * rate_1
        return Scenario(name, f"{y} of {n} workers {FAST_FACTOR:g}x faster; the fast role "
                        f"moves at {phase:g} s and {2 * phase:g} s (total constant)",
                        caps, aligned(total * 3 * phase, engine, src), changes)
    if name == "hot-keys":
        k = max(1, n // 5)
        caps = [1.0] * (n - k) + [THROTTLED] * k
        total = sum(caps) * rate_1
        m = aligned(total * 4 * phase, engine, src, parts=4)
        return Scenario(name, f"evolving Zipf, hot keys move every {m // 4:,} messages; "
                        f"{k} of {n} workers at {THROTTLED:g}", caps, m, shift_every=m // 4)
    caps = [1.0] * n
    before, after = n * rate_1, (n - 1 + SLOWED) * rate_1
    return Scenario(name, f"{n} equal workers; worker 0 drops to {SLOWED:g} at {phase:g} s",
                    caps, aligned((before + after) * phase, engine, src),
                    [(phase, 0, SLOWED)])


def scenario_topology(sc_: Scenario, cfg: dict[str, Any], scheme: str) -> Topology:
    inp: dict[str, Any] = {"format": "zipf", "messages": sc_.messages, "keys": cfg["keys"],
                           "skew": cfg["skew"], "seed": cfg["seed"]}
    if sc_.shift_every is not None:
        inp.update(format="evolving-zipf", shift_every=sc_.shift_every)
    data = {
        "name": f"recovery-{sc_.name}",
        "input": inp,
        "sources": cfg["sources"],
        "workers": {"count": cfg["workers"], "capacity": sc_.capacities,
                    "service_us": cfg["service_us"],
                    "changes": [{"at_s": t, "worker": w, "capacity": c}
                                for t, w, c in sc_.changes]},
        "grouping": {"scheme": scheme},
        "run": {"batch": cfg["batch"], "rate": 0, "seed": cfg["seed"]},
    }
    try:
        return load_topology(data, [*cfg["overrides"], f"grouping.scheme={scheme}"])
    except TopologyError as e:
        sc.fail(str(e))


# ----------------------------------------------------------------------------- analysis


def cumulative_times(eff: pd.DataFrame, counts: list[float]) -> list[float]:
    """When the cumulative processed count reaches each of ``counts``
    (linear within an interval); NaN if never."""
    slot = (eff["t_end"] - eff["t_start"]).to_numpy()
    done = eff["throughput"].to_numpy() * slot
    cum = np.cumsum(done)
    out = []
    for c in counts:
        i = int(np.searchsorted(cum, c, side="left"))
        if i >= len(cum):
            out.append(float("nan"))
            continue
        prev = cum[i - 1] if i > 0 else 0.0
        frac = (c - prev) / done[i] if done[i] > 0 else 0.0
        out.append(float(eff["t_start"].iloc[i] + frac * slot[i]))
    return out


def recovery(eff: pd.DataFrame, at_s: float, until_s: float, *, threshold: float = 0.9,
             smooth_s: float = 2.0, level_s: float = 5.0,
             hold_s: float = 10.0) -> dict[str, float | None]:
    """Recovery after a disturbance at ``at_s``, searched up to ``until_s``.

    ``eff``: ``efficiency_series``' frame (``t_start, t_end, efficiency``).
    Returns ``recovery_s`` (None = never within the phase), ``level`` (mean
    efficiency over the last ``level_s`` of the phase), ``before`` (the
    ``level_s`` before ``at_s``; NaN at the start of a run) and ``dip`` (the
    lowest smoothed efficiency in the phase).
    """
    t0 = eff["t_start"].to_numpy(dtype=np.float64)
    t1 = eff["t_end"].to_numpy(dtype=np.float64)
    e = eff["efficiency"].to_numpy(dtype=np.float64)
    slot = float(np.median(t1 - t0))
    k = max(1, int(round(smooth_s / slot)))
    tol = 1e-6 * max(1.0, slot)
    phase = np.flatnonzero((t0 >= at_s - tol) & (t1 <= until_s + tol))

    def mean_over(mask: np.ndarray) -> float:
        return float(e[mask].mean()) if mask.any() else float("nan")

    before = mean_over((t1 <= at_s + tol) & (t0 >= at_s - level_s - tol))
    level = mean_over((t0 >= max(at_s, until_s - level_s) - tol) & (t1 <= until_s + tol))
    rec: float | None = None
    smoothed = [float(e[i:i + k].mean()) for i in phase if i + k - 1 <= phase[-1]]
    # recovered at the first window from which the smoothed efficiency holds
    # >= the threshold for hold_s (or to the phase's end, if sooner): a scheme
    # whose efficiency falls only seconds after the disturbance (queues and
    # outboxes still absorbing it) has not "recovered at once"
    hold = max(1, int(round(hold_s / slot)))
    ok = np.asarray(smoothed) >= threshold
    for j in range(len(smoothed)):
        if ok[j:j + hold].all():
            rec = max(0.0, float(t0[phase[j]] - at_s))
            break
    dip = min(smoothed) if smoothed else float("nan")
    return {"before": before, "recovery_s": rec, "level": level, "dip": dip}


def analyse(sc_: Scenario, ts: pd.DataFrame, service_us: float,
            cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per disturbance of a run."""
    eff = sc.efficiency_series(ts, service_us)
    total = float((eff["throughput"] * (eff["t_end"] - eff["t_start"])).sum())
    end_s = cumulative_times(eff, [END_FRACTION * total])[0]
    if sc_.shift_every is not None:
        shifts = [k * sc_.shift_every for k in range(1, sc_.messages // sc_.shift_every)]
        times = cumulative_times(eff, [float(c) for c in shifts])
    else:
        times = sc_.disturbance_times()
    rows = []
    for j, at in enumerate(times):
        until = min([t for t in times[j + 1:] if t == t] + [end_s])
        if not (at == at) or at >= end_s:
            r: dict[str, Any] = {"before": float("nan"), "recovery_s": None,
                                 "level": float("nan"), "dip": float("nan")}
        else:
            r = recovery(eff, at, until, threshold=cfg["threshold"],
                         smooth_s=cfg["smooth_s"], level_s=cfg["level_s"],
                         hold_s=cfg["hold_s"])
        rows.append({"disturbance": j + 1, "at_s": at, "phase_end_s": until, **r})
    return rows


def cell(r: dict[str, Any]) -> str:
    """``2.5 s`` or ``never (0.47)``."""
    if r["recovery_s"] is None or r["recovery_s"] != r["recovery_s"]:
        lvl = r["level"]
        return "never" + (f" ({lvl:.2f})" if lvl == lvl else "")
    return f"{r['recovery_s']:.1f} s"


DIST_LABEL = {"capacity-change": "capacity change", "hot-keys": "hot-key shift",
              "slowdown": "slowdown to 10%"}


def summary_table(df: pd.DataFrame) -> str:
    """Schemes as rows, one column per (scenario, disturbance)."""
    cols = list(dict.fromkeys(zip(df["scenario"], df["disturbance"], strict=True)))
    several = {s for s, d in cols if d > 1}
    heads = [DIST_LABEL.get(s, s) + (f" {d}" if s in several else "") for s, d in cols]
    lines = ["| scheme | " + " | ".join(heads) + " |",
             "|---|" + "|".join("---" for _ in cols) + "|"]
    for scheme in dict.fromkeys(df["scheme"]):
        g = df[df["scheme"] == scheme]
        cells = []
        for s, d in cols:
            m = g[(g["scenario"] == s) & (g["disturbance"] == d)]
            cells.append(cell(m.iloc[0].to_dict()) if len(m) else "-")
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(df: pd.DataFrame) -> str:
    heads = ("scenario", "#", "scheme", "at s", "before", "dip", "recovery", "level",
             "run msgs/s", "run cap. eff.", "p99 ms", "replication")
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]

    def f(v: Any, spec: str) -> str:
        return "-" if v is None or v != v else spec.format(v)

    for _, r in df.iterrows():
        lines.append("| " + " | ".join([
            r["scenario"], str(r["disturbance"]), r["scheme"], f(r["at_s"], "{:.1f}"),
            f(r["before"], "{:.2f}"), f(r["dip"], "{:.2f}"), cell(r.to_dict()),
            f(r["level"], "{:.2f}"), f(r["throughput_msgs_per_s"], "{:,.0f}"),
            f(r["capacity_efficiency"], "{:.3f}"), f(r["latency_p99_ms"], "{:,.0f}"),
            f(r["replication"], "{:.2f}")]) + " |")
    return "\n".join(lines)


def plot(series: dict[str, dict[str, pd.DataFrame]], df: pd.DataFrame, cfg: dict[str, Any],
         title: str, path: Path) -> None:
    """Capacity efficiency over time (smoothed as for the recovery test), one
    panel per scenario, disturbances marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(series)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.8 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        g = df[df["scenario"] == name]
        per_scheme = g.groupby("scheme")["at_s"].apply(lambda a: tuple(a.round(2)))
        shared = per_scheme.nunique() <= 1  # capacity changes: the same times for all
        for k, (scheme, eff) in enumerate(series[name].items()):
            slot = float(np.median(eff["t_end"] - eff["t_start"]))
            w = max(1, int(round(cfg["smooth_s"] / slot)))
            sm = eff["efficiency"][::-1].rolling(w, min_periods=1).mean()[::-1]
            ax.plot(eff["t_start"], sm, lw=1, color=f"C{k}", label=scheme)
            if not shared:  # hot-key shifts: each scheme reaches them at its own time
                for at in per_scheme.get(scheme, ()):
                    ax.axvline(at, color=f"C{k}", ls="--", lw=0.7, alpha=0.7)
        if shared and len(per_scheme):
            for at in per_scheme.iloc[0]:
                ax.axvline(at, color="grey", ls="--", lw=0.8)
        ax.axhline(cfg["threshold"], color="k", ls=":", lw=0.8)
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("capacity efficiency")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7, ncol=len(series[name]), loc="lower right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run_all_scenarios(cfg: dict[str, Any], engine_names: list[str], out: Path, *,
                      address: str | None, progress: bool,
                      ) -> tuple[pd.DataFrame, dict[str, dict[str, dict[str, pd.DataFrame]]]]:
    rows: list[dict[str, Any]] = []
    series: dict[str, dict[str, dict[str, pd.DataFrame]]] = {}
    for engine in engine_names:
        scen = [build_scenario(s, cfg, engine) for s in cfg["scenarios"]]
        topos = {s.name: [scenario_topology(s, cfg, k) for k in cfg["schemes"]] for s in scen}
        bar = sc.progress_bar(len(scen) * len(cfg["schemes"]), f"recovery ({engine})",
                              progress)
        series[engine] = {}

        def say(m: str, bar: Any = bar) -> None:
            bar.write(m, file=sys.stderr)

        def on_run(report: dict[str, Any], bar: Any = bar) -> None:
            bar.update(1)

        try:
            with sc.session(engine, "stress-recovery", address, out / "engine.log") as session:
                for s in scen:
                    bar.set_postfix_str(s.name)
                    say(f"[{engine}] {s.name}: {s.what}; {s.messages:,} messages")
                    done, ts = run_all(topos[s.name], session, out / engine / s.name,
                                       progress=False, say=say, on_run=on_run)
                    series[engine][s.name] = {}
                    service_us = topos[s.name][0].workers.service_us
                    for r in done:
                        eff_ts = ts[r["scheme"]]
                        series[engine][s.name][r["scheme"]] = sc.efficiency_series(
                            eff_ts, service_us)
                        for d in analyse(s, eff_ts, service_us, cfg):
                            rows.append({"engine": engine, "scenario": s.name,
                                         "scheme": r["scheme"], **d,
                                         **{k: r[k] for k in CSV_COLUMNS if k in r
                                            and k != "scheme"}})
                    pd.DataFrame(rows, columns=list(CSV_COLUMNS)).to_csv(
                        out / "recovery.csv", index=False)
        finally:
            bar.close()
    return pd.DataFrame(rows, columns=list(CSV_COLUMNS)), series


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = settings(args)
    engine_names = sc.engines(args.engine)
    for engine in engine_names:  # every topology validated before anything runs
        for name in cfg["scenarios"]:
            for scheme in cfg["schemes"]:
                scenario_topology(build_scenario(name, cfg, engine), cfg, scheme)
    out = Path(args.out or default_out_dir("stress-recovery"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    df, series = run_all_scenarios(cfg, engine_names, out, address=args.address,
                                   progress=not args.no_progress)
    wall = time.perf_counter() - t0
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    setup = (f"{cfg['workers']} workers, {cfg['phase_s']:g} s phases, service "
             f"{cfg['service_us']:g} us, Zipf {cfg['skew']:g} over {cfg['keys']:,} keys, "
             f"saturated; recovered = efficiency >= {cfg['threshold']:g} "
             f"({cfg['smooth_s']:g} s average)")
    parts = [f"# Recovery, {'+'.join(engine_names)}, {stamp}", "", setup, ""]
    for engine, g in df.groupby("engine", sort=False):
        scen = {s: build_scenario(s, cfg, str(engine)) for s in cfg["scenarios"]}
        parts += [f"## {engine}: time back to {cfg['threshold']:g} capacity efficiency "
                  "(never: the level reached)", ""]
        parts += [f"- {s.name}: {s.what}; {s.messages:,} messages" for s in scen.values()]
        parts += ["", summary_table(g), "", f"## {engine}: details", "", detail_table(g), ""]
        plot(series[str(engine)], g, cfg, f"Recovery on {engine}\n{setup}",
             out / f"recovery-{engine}.png")
    parts.append(f"wall time {wall:.0f} s")
    (out / "recovery.md").write_text("\n".join(parts) + "\n")
    df.to_csv(out / "recovery.csv", index=False)
    for engine, g in df.groupby("engine", sort=False):
        print(f"{engine}: time back to {cfg['threshold']:g} capacity efficiency\n\n"
              f"{summary_table(g)}\n")
    print(f"{len(df)} rows in {wall:.0f} s; outputs: {out}")
    return 0


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]))
