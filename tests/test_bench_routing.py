"""scripts/bench_routing.py: every scheme asked for is timed, and acg also as a
source runs it once a table with rate shares is in (``acg+admission``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bench_routing  # noqa: E402


def test_acg_is_timed_with_and_without_its_admission(capsys) -> None:
    assert bench_routing.main(["--messages", "4000", "--batch", "500", "--repeat", "1",
                               "--schemes", "kg,acg", "--clock", "cpu"]) == 0
    rows = {line[:14].strip(): float(line.split()[-2])
            for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"hash % n", "kg", "acg", "acg+admission"}
    assert all(v > 0 for v in rows.values())


def test_the_admission_router_bounds_the_slow_workers() -> None:
    """Its table's shares reach the grouping: on a skewed stream the two slow
    workers (0.3 of 6.6 workers' worth: a 4.5% share, bounded at 1.2x that)
    take ~5.5% each, where PoRC alone gives them 11-15%."""
    import numpy as np

    from runtime.grouping import make_grouping

    h = bench_routing.zipf_hashes(40_000, 1000, 1.1, seed=0)
    route, plain = bench_routing.admission_router(8), make_grouping("acg", n_workers=8, seed=0)
    got = np.concatenate([route(h[i:i + 1000]) for i in range(0, len(h), 1000)])
    alone = np.concatenate([plain.route(h[i:i + 1000]) for i in range(0, len(h), 1000)])
    slow = np.bincount(got, minlength=8)[:2] / len(h)
    assert slow.max() < 0.065 < (np.bincount(alone, minlength=8)[:2] / len(h)).min()
