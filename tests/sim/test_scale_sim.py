"""scripts/scale_sim.py on a tiny grid: both tables, every requested row, and the
measurements it reports are sane (no Ray)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import scale_sim  # noqa: E402


def test_deep_bytes_counts_buffers_once_and_skips_functions() -> None:
    a = np.zeros(1000, dtype=np.int64)

    class Holder:
        def __init__(self) -> None:
            self.a, self.b, self.view, self.f = a, a, a[:10], len

    assert scale_sim.deep_bytes(Holder()) - scale_sim.deep_bytes(Holder.__new__(Holder)) < 8000 + 2000
    assert scale_sim.deep_bytes(Holder()) > 8000


def test_tiny_grid_prints_both_tables(capsys) -> None:
    assert scale_sim.main(["--workers", "4,8", "--schemes", "kg,cg", "--messages", "4000",
                           "--sim-sources", "2", "--sim-seconds", "2"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["4"], ["8"])]
    routing = [r for r in rows if r[1] in ("kg", "cg")]
    assert [(r[0], r[1]) for r in routing] == [("4", "kg"), ("4", "cg"), ("8", "kg"), ("8", "cg")]
    assert all(float(r[3]) > 0 for r in routing if r[1] == "cg")  # bytes per VW measured
    sim = [r for r in rows if r[1] == "2"]
    assert len(sim) == 2
    for r in sim:  # columns: n, sources, batch, sim s, signals/s, ..., bound/s (8th)
        signals, bound = (float(r[i].replace(",", "")) for i in (4, 7))
        # CG with a quarter of the workers slowed signals, at most once per slot,
        # source and worker (bound: n x sources / 0.5 s)
        assert 0 < signals <= bound == int(r[0]) * 2 / 0.5, r
    assert "LoadSignaler" in out
