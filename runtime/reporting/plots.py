"""``report.png``: a run's time series on one page (matplotlib, Agg)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def _per_worker(ts: pd.DataFrame, prefix: str) -> list[str]:
    cols = [c for c in ts.columns if re.fullmatch(rf"{prefix}_w\d+", c)]
    return sorted(cols, key=lambda c: int(c.rsplit("w", 1)[1]))


def plot_run(report: dict[str, Any], ts: pd.DataFrame, path: str | Path) -> None:
    panels = [("queue", "queue length (msgs)"), ("util", "utilization"),
              ("vw", "virtual workers owned")]
    panels = [p for p in panels if _per_worker(ts, p[0])]
    n = len(panels) + 2
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.3 * n), sharex=True)
    t = ts["t_s"] if "t_s" in ts else pd.Series(range(len(ts)))
    changes = report.get("capacity_changes", [])
    for ax, (prefix, label) in zip(axes, panels, strict=False):
        for c in _per_worker(ts, prefix):
            ax.plot(t, ts[c], lw=1, label=c.rsplit("_", 1)[1])
        ax.set_ylabel(label)
    if panels:
        axes[0].legend(ncol=8, fontsize=7, loc="upper right")
    ax = axes[len(panels)]
    if "throughput_msgs_per_s" in ts:
        ax.plot(t, ts["throughput_msgs_per_s"], color="k", lw=1)
    ax.set_ylabel("throughput (msgs/s)")
    ax2 = ax.twinx()
    if "imbalance" in ts:
        ax2.plot(t, ts["imbalance"], color="tab:red", lw=1)
    ax2.set_ylabel("imbalance I(t)", color="tab:red")
    ax = axes[-1]
    for col in ("latency_p50_ms", "latency_p99_ms"):
        if col in ts:
            ax.plot(t, ts[col], lw=1, label=col.split("_")[1])
    ax.set_ylabel("latency (ms)")
    ax.legend(fontsize=7)
    ax.set_xlabel("time (s)")
    for a in axes:
        for ch in changes:
            a.axvline(ch["at_s"], color="grey", ls="--", lw=0.8)
    lat = report["latency_ms"]
    fig.suptitle(
        f"{report['name']} - {report['engine']} / {report['scheme']}: "
        f"{report['throughput_msgs_per_s']:,.0f} msgs/s, p99 {lat['p99']:.1f} ms, "
        f"replication {report['replication']:.2f}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
