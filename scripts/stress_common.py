"""Shared pieces of the heterogeneity stress scripts (``stress_grid.py``,
``stress_recovery.py``): argument parsing with exit code 2, heterogeneity
specs, one engine session for many ``runtime.compare.run_all`` calls, and
per-interval capacity efficiency from a run's ``timeseries.csv``.

Heterogeneity specs (capacities are fractions of full speed, in (0, 1]):

- ``homo``: every worker at 1.
- ``fast{y}x{z}``: ``y`` of the ``n`` workers are ``z`` times faster than the
  rest (the CG paper's setup, e.g. ``fast3x5``): the first ``y`` at 1, the
  others at ``1/z``.
- ``slow{k}@{f}``: the last ``k`` workers throttled to ``f`` (``slow2@0.3``:
  two workers at 30%, the CG paper's Storm experiment), the others at 1.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runtime.cli import Parser, fail, parse_schemes  # noqa: E402,F401 (re-exported for the scripts)
from runtime.engine import Engine  # noqa: E402

ENGINES = ("sim", "ray", "both")


def engines(choice: str) -> list[str]:
    return ["sim", "ray"] if choice == "both" else [choice]


def parse_floats(text: str, option: str, *, low: float | None = None,
                 low_open: bool = False) -> list[float]:
    """``"0.8,1.2"`` -> [0.8, 1.2]; every value checked against ``low``."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        fail(f"{option}: empty list")
    out = []
    for s in items:
        try:
            v = float(s)
        except ValueError:
            fail(f"{option}: not a number: {s!r}")
        if not math.isfinite(v) or (low is not None and (v <= low if low_open else v < low)):
            bound = f"> {low:g}" if low_open else f">= {low:g}"
            fail(f"{option}: every value must be {bound} (got {s})")
        out.append(v)
    if len(set(out)) != len(out):
        fail(f"{option}: a value is listed twice ({text!r})")
    return out


_FAST = re.compile(r"fast(\d+)x(\d+(?:\.\d+)?)")
_SLOW = re.compile(r"slow(\d+)@(\d*\.?\d+)")


@dataclass(frozen=True)
class Hetero:
    """A heterogeneity setting: ``capacities(n)`` for ``n`` workers."""

    label: str
    kind: str  # homo | fast | slow
    count: int = 0  # y (fast) or k (slow)
    factor: float = 1.0  # z (fast) or f (slow)

    def capacities(self, n: int) -> list[float]:
        if self.kind == "fast":
            return [1.0] * self.count + [1.0 / self.factor] * (n - self.count)
        if self.kind == "slow":
            return [1.0] * (n - self.count) + [self.factor] * self.count
        return [1.0] * n

    def describe(self, n: int) -> str:
        if self.kind == "fast":
            return f"{self.count} of {n} workers {self.factor:g}x faster"
        if self.kind == "slow":
            return f"{self.count} of {n} workers at {self.factor:g}"
        return f"{n} equal workers"


def parse_hetero(text: str, n_workers: int, option: str = "--hetero") -> list[Hetero]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        fail(f"{option}: empty list")
    out = []
    for s in items:
        if s == "homo":
            out.append(Hetero("homo", "homo"))
            continue
        m = _FAST.fullmatch(s)
        if m:
            y, z = int(m.group(1)), float(m.group(2))
            if not 1 <= y < n_workers:
                fail(f"{option}: {s!r}: y must be in 1..{n_workers - 1} for "
                     f"{n_workers} workers (got {y})")
            if not z > 1:
                fail(f"{option}: {s!r}: z must be > 1 (got {z:g})")
            out.append(Hetero(s, "fast", y, z))
            continue
        m = _SLOW.fullmatch(s)
        if m:
            k, f = int(m.group(1)), float(m.group(2))
            if not 1 <= k < n_workers:
                fail(f"{option}: {s!r}: k must be in 1..{n_workers - 1} for "
                     f"{n_workers} workers (got {k})")
            if not 0 < f < 1:
                fail(f"{option}: {s!r}: the throttled capacity must be in (0, 1) (got {f:g})")
            out.append(Hetero(s, "slow", k, f))
            continue
        fail(f"{option}: unknown heterogeneity {s!r} (expected homo, fast<y>x<z> "
             f"such as fast3x5, or slow<k>@<fraction> such as slow2@0.3)")
    if len({h.label for h in out}) != len(out):
        fail(f"{option}: a setting is listed twice ({text!r})")
    return out


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options every stress script shares: sources, batch, seed, overrides,
    output, cluster address, progress."""
    p.add_argument("--sources", type=int, default=2)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY.PATH=VALUE", help="topology override for every run (repeatable)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--address", default=None, help="Ray cluster address (engine ray)")
    p.add_argument("--no-progress", action="store_true")


def positive_int(option: str, value: int, low: int = 1) -> int:
    if value < low:
        fail(f"{option}: must be >= {low} (got {value})")
    return value


# ----------------------------------------------------------------------------- engines


@contextlib.contextmanager
def session(engine: str, app_name: str, address: str | None,
            log_file: Path | None = None) -> Iterator[Engine]:
    """The engine every run inside the ``with`` shares: the simulator, or one
    Ray + RayDP Spark session (``actors.engine.RayEngine``; started once:
    ~10-20 s, or the session already running in this process, left running),
    whose own messages (Spark's, the JVMs', Ray's start-up) go to ``log_file``
    (default: the console)."""
    if engine == "sim":
        from runtime.sim import SimEngine

        yield SimEngine()
        return
    from actors.engine import RayEngine

    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    with RayEngine(app_name, address, log_file=log_file) as ray_engine:
        yield ray_engine


def progress_bar(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, leave=True)


# ----------------------------------------------------------------------------- efficiency


def efficiency_series(ts: pd.DataFrame, service_us: float) -> pd.DataFrame:
    """Per-interval capacity efficiency of a run's time series.

    ``efficiency = throughput / total capacity at that time`` where the total
    is ``sum_w capacity_w * 1e6 / service_us`` from the ``capacity_w{i}``
    columns (the capacity in force in the middle of the interval). Returns
    ``t_start, t_end, throughput, capacity_msgs_per_s, efficiency``.
    """
    cap_cols = [c for c in ts.columns if re.fullmatch(r"capacity_w\d+", c)]
    if not cap_cols:
        raise ValueError("timeseries has no capacity_w<i> columns")
    t_end = ts["t_s"].to_numpy(dtype=np.float64)
    slot = float(np.median(np.diff(t_end))) if len(t_end) > 1 else float(t_end[0])
    cap = ts[cap_cols].to_numpy(dtype=np.float64).sum(axis=1) * 1e6 / service_us
    thr = ts["throughput_msgs_per_s"].to_numpy(dtype=np.float64)
    return pd.DataFrame({"t_start": t_end - slot, "t_end": t_end, "throughput": thr,
                         "capacity_msgs_per_s": cap, "efficiency": thr / cap})
