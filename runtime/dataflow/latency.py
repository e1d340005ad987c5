"""Mergeable log-binned latency histograms (pure numpy).

Workers cannot ship every message's latency to the driver (millions of floats
through actor calls), so each keeps counts in fixed logarithmic bins: 1 us to
~1000 s with a ratio of ``1 + 2 %`` between bin edges, so a percentile read
from a histogram is within ~2 % of the exact one. Histograms from different
workers and slots merge by addition; sum and max are kept exactly.
"""

from __future__ import annotations

import math

import numpy as np

MIN_S = 1e-6
RATIO = 1.02
N_BINS = int(math.ceil(math.log(1e9) / math.log(RATIO))) + 2  # bin 0: < MIN_S
_LOG_RATIO = math.log(RATIO)


def bin_of(latencies_s: np.ndarray) -> np.ndarray:
    # the log's argument is at least MIN_S / 2 (never 0: no divide-by-zero to silence)
    lat = np.maximum(np.asarray(latencies_s, dtype=np.float64), MIN_S * 0.5)
    b = np.floor(np.log(lat / MIN_S) / _LOG_RATIO).astype(np.int64) + 1
    np.maximum(b, 0, out=b)  # np.clip(b, 0, N_BINS - 1), without its per-call checks
    return np.minimum(b, N_BINS - 1, out=b)


#: latencies counted once (``binned``), to add to several histograms:
#: (counts per bin, count, sum in s, max in s)
Binned = tuple[np.ndarray, int, float, float]


def binned(latencies_s: np.ndarray) -> Binned | None:
    """``latencies_s`` counted per bin, once for every histogram it goes to
    (``LatencyHistogram.add_binned``); None when empty."""
    lat = np.asarray(latencies_s, dtype=np.float64)
    if lat.size == 0:
        return None
    return (np.bincount(bin_of(lat), minlength=N_BINS), int(lat.size), float(lat.sum()),
            float(lat.max()))


def bin_upper_s(b: np.ndarray) -> np.ndarray:
    """Representative value of each bin: its geometric middle (bin 0 -> 0)."""
    b = np.asarray(b, dtype=np.float64)
    return np.where(b <= 0, 0.0, MIN_S * RATIO ** (b - 0.5))


class LatencyHistogram:
    """Counts per log bin plus exact count, sum and max (seconds)."""

    __slots__ = ("counts", "count", "sum_s", "max_s")

    def __init__(self) -> None:
        self.counts = np.zeros(N_BINS, dtype=np.int64)
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0

    def add(self, latencies_s: np.ndarray) -> None:
        self.add_binned(binned(latencies_s))

    def add_binned(self, b: Binned | None) -> None:
        """Add latencies counted by ``binned`` (the same as ``add`` of them)."""
        if b is None:
            return
        counts, n, sum_s, max_s = b
        self.counts += counts
        self.count += n
        self.sum_s += sum_s
        self.max_s = max(self.max_s, max_s)

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        self.counts += other.counts
        self.count += other.count
        self.sum_s += other.sum_s
        self.max_s = max(self.max_s, other.max_s)
        return self

    def percentile_s(self, q: float) -> float:
        if self.count == 0:
            return 0.0
        rank = q / 100.0 * self.count
        cum = np.cumsum(self.counts)
        b = int(np.searchsorted(cum, max(rank, 1), side="left"))
        return float(min(bin_upper_s(np.array([b]))[0], self.max_s))

    def summary_ms(self) -> dict[str, float]:
        """``{"mean", "p50", "p95", "p99", "max"}`` in milliseconds (docs/design.md)."""
        if self.count == 0:
            return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
        return {
            "mean": self.sum_s / self.count * 1e3,
            "p50": self.percentile_s(50) * 1e3,
            "p95": self.percentile_s(95) * 1e3,
            "p99": self.percentile_s(99) * 1e3,
            "max": self.max_s * 1e3,
        }

    # compact wire form: only non-empty bins
    def to_sparse(self) -> tuple[np.ndarray, np.ndarray, int, float, float]:
        nz = np.flatnonzero(self.counts)
        return nz.astype(np.int32), self.counts[nz], self.count, self.sum_s, self.max_s

    @classmethod
    def from_sparse(cls, data: tuple[np.ndarray, np.ndarray, int, float, float]) -> LatencyHistogram:
        h = cls()
        idx, cnt, h.count, h.sum_s, h.max_s = data
        h.counts[np.asarray(idx, dtype=np.int64)] = cnt
        return h
