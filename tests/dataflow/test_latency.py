"""Log-binned latency histograms (2 % bins): percentiles within 1 %, exact merge."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.dataflow.latency import LatencyHistogram
from runtime.reporting.metrics import latency_summary_ms


def test_percentiles_close_to_exact() -> None:
    rng = np.random.default_rng(1)
    lat = rng.lognormal(mean=-5, sigma=1.2, size=50_000)
    h = LatencyHistogram()
    h.add(lat[:20_000])
    other = LatencyHistogram()
    other.add(lat[20_000:])
    h.merge(LatencyHistogram.from_sparse(other.to_sparse()))
    got, exact = h.summary_ms(), latency_summary_ms(lat)
    # a percentile is its bin's geometric middle: within sqrt(1.02) (1%) of any value in it
    for k in ("p50", "p95", "p99"):
        assert got[k] == pytest.approx(exact[k], rel=0.01), k
    assert got["mean"] == pytest.approx(exact["mean"], rel=1e-9)
    assert got["max"] == pytest.approx(exact["max"], rel=1e-9)
    assert h.count == 50_000


def test_empty_and_zero() -> None:
    h = LatencyHistogram()
    assert h.summary_ms()["p99"] == 0.0
    h.add(np.zeros(10))
    assert h.summary_ms() == {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
