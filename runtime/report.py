"""Run outputs, the same for both engines (DESIGN.md "Output directory").

``write_run(out_dir, report, timeseries, result)`` writes ``report.json``,
``timeseries.csv``, ``result.parquet`` and ``report.png`` atomically: every
file is written into a hidden staging directory that is renamed into place
only once all are complete, so an interrupted run leaves nothing half-written.

Time-series columns (one row per interval):
``t_s, throughput_msgs_per_s, imbalance, latency_p50_ms, latency_p99_ms``,
then per worker ``queue_w{i}``, ``util_w{i}``, ``capacity_w{i}`` and, for
schemes with virtual workers, ``vw_w{i}``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REQUIRED_KEYS = (
    "name", "engine", "scheme", "messages", "duration_s", "throughput_msgs_per_s",
    "latency_ms", "imbalance", "replication", "migrations", "signals", "workers", "result",
)


def default_out_dir(name: str, root: str | os.PathLike[str] = "runs") -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return Path(root) / f"{name}-{stamp}"


def validate_report(report: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in report]
    if missing:
        raise ValueError(f"report is missing keys: {', '.join(missing)}")


def write_run(
    out_dir: str | os.PathLike[str],
    report: dict[str, Any],
    timeseries: pd.DataFrame,
    result: pa.Table,
    *,
    plot: bool = True,
) -> Path:
    """Write a run's outputs into ``out_dir`` atomically; returns the directory."""
    out = Path(out_dir)
    report = {**report, "result": {"path": "result.parquet", "rows": result.num_rows}}
    validate_report(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        pq.write_table(result, stage / "result.parquet")
        timeseries.to_csv(stage / "timeseries.csv", index=False)
        (stage / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        if plot:
            from runtime.plots import plot_run

            plot_run(report, timeseries, stage / "report.png")
        if out.exists() and any(out.iterdir()):
            # an existing, non-empty --out: file by file, report.json last, so a
            # report.json on disk always describes complete outputs
            for f in sorted(stage.iterdir(), key=lambda f: f.name == "report.json"):
                os.replace(f, out / f.name)
            stage.rmdir()
        else:  # absent or empty: one rename (POSIX replaces an empty directory)
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out


def write_result(out_dir: str | os.PathLike[str], result: pa.Table) -> Path:
    """Replace ``out_dir/result.parquet`` atomically (a live stream's answer so
    far): a reader sees the previous file or the new one, never half of one."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".result.parquet.tmp"
    try:
        pq.write_table(result, tmp)
        os.replace(tmp, out / "result.parquet")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out / "result.parquet"


def summary_table(report: dict[str, Any]) -> str:
    """The final summary printed on stdout."""
    lat = report["latency_ms"]
    rows = [
        ("engine / scheme", f"{report['engine']} / {report['scheme']}"),
        ("messages (input / processed)",
         f"{report['messages']['input']:,} / {report['messages']['processed']:,}"),
        ("duration", f"{report['duration_s']:.2f} s"),
        ("throughput", f"{report['throughput_msgs_per_s']:,.0f} msgs/s"),
    ]
    if report.get("capacity_efficiency") is not None:
        rows.append(("capacity efficiency", f"{report['capacity_efficiency']:.3f}"))
    rows += [
        ("latency p50 / p99 / max",
         f"{lat['p50']:.1f} / {lat['p99']:.1f} / {lat['max']:.1f} ms"),
        ("imbalance I(t) mean / max",
         f"{report['imbalance']['mean']:.3f} / {report['imbalance']['max']:.3f}"),
        ("replication (KG = 1)", f"{report['replication']:.3f}"),
        ("migrations / signals +/-",
         f"{report['migrations']} / {report['signals']['increase']} / "
         f"{report['signals']['decrease']}"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{a:<{width}}  {b}" for a, b in rows]
    lines.append("")
    lines.append(f"{'worker':>6} {'capacity':>8} {'processed':>10} {'util':>6} {'keys':>8}")
    for w in report["workers"]:
        lines.append(f"{w['id']:>6} {w['capacity']:>8.2f} {w['processed']:>10,} "
                     f"{w['utilization']:>6.2f} {w['keys']:>8,}")
    return "\n".join(lines)
