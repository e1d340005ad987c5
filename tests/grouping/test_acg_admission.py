"""ACG's admission at the sources (``porc_admit_route``, docs/algorithms.md,
"ACG"): the workers' share and backlog bounds, what they leave alone, and the
spill the controller plans with."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.grouping.acg import AcgController, AdaptiveConsistentGrouping, VwTable
from runtime.grouping.porc import PorcBins

R = 16


def _zipf_hashes(n: int, keys: int, seed: int, skew: float = 1.2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, keys + 1) ** skew
    ids = rng.choice(keys, size=n, p=p / p.sum())
    key_hash = rng.integers(1, 2**63, size=keys, dtype=np.int64).astype(np.uint64)
    return key_hash[ids]


def _grouping(n: int = 4, **kw: float) -> AdaptiveConsistentGrouping:
    return AdaptiveConsistentGrouping(n, virtual_per_worker=R, **kw)  # type: ignore[arg-type]


def _table(g: AdaptiveConsistentGrouping, share: list[float], version: int = 1) -> VwTable:
    return VwTable(version, g.vw_owner.copy(), np.asarray(share, dtype=np.float64))


def test_without_bounds_it_routes_as_porc() -> None:
    """No table with shares yet and no backlog known: exactly CG's PoRC."""
    h = _zipf_hashes(20_000, 3_000, seed=1)
    g = _grouping()
    bins = PorcBins(g.n_virtual, g.eps)
    assert (g.route_virtual(h) == bins.route(h, bins.bin_ids)).all()
    assert g.take_spill() is None


def test_same_vws_for_one_batch_or_any_split() -> None:
    h = _zipf_hashes(12_000, 2_000, seed=2)
    one, split = _grouping(), _grouping()
    for g in (one, split):
        g.on_table(_table(g, [0.4, 0.4, 0.1, 0.1]))
    a = one.route_virtual(h)
    b = np.concatenate([split.route_virtual(part) for part in np.array_split(h, [7, 1000, 5003])])
    assert (a == b).all()
    assert (one.take_spill() == split.take_spill()).all()


def test_a_worker_takes_at_most_its_bound_of_the_recent_messages() -> None:
    """A hot key's worker over ``(1 + admit) x share`` sheds it to its next
    PoRC choices; the spill says where the keys asked to go."""
    share = [0.3, 0.3, 0.3, 0.1]
    g = _grouping(admit=0.2, admit_window=1500)
    g.on_table(_table(g, share))
    h = _zipf_hashes(30_000, 2_000, seed=3)
    vws = g.route_virtual(h)
    got = np.bincount(g.owner_of(vws[-1500:]), minlength=4) / 1500
    assert got[3] <= 1.2 * share[3] + 0.03
    spill = g.take_spill()
    # routed + spill = first choices: as many messages, moved between VWs
    assert spill is not None and spill.sum() == 0
    assert 0 < spill[spill > 0].sum() <= g.stats()["admission_spilled"]
    assert (np.bincount(vws, minlength=g.n_virtual) + spill >= 0).all()
    assert g.take_spill() is None  # taken once


def test_only_keys_seen_recently_are_shed() -> None:
    """A worker far over its bounds sheds its frequent keys; a key not in the
    probe memo (light: once in a long while) keeps its first choice."""
    g = _grouping()
    g.on_held(np.array([0, 0, 0, 10_000]), np.array([1000.0] * 4))  # worker 3: 10 s held
    hot = _zipf_hashes(1, 1, seed=4)
    h = np.repeat(hot, 50)
    vws = g.route_virtual(h)
    assert (g.owner_of(vws[1:]) != 3).all()  # its repeats never go to worker 3
    bins = PorcBins(g.n_virtual, g.eps)
    light = np.arange(1, 200, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    g2 = _grouping()
    g2.on_held(np.array([0, 0, 0, 10_000]), np.array([1000.0] * 4))
    assert (g2.route_virtual(light) == bins.route(light, bins.bin_ids)).all()


def test_a_source_behind_its_input_routes_with_no_bound() -> None:
    h = _zipf_hashes(20_000, 3_000, seed=5)
    g = _grouping()
    g.on_table(_table(g, [0.45, 0.45, 0.05, 0.05]))
    g.on_held(np.array([0, 0, 0, 10_000]), np.array([1000.0] * 4), behind=True)
    bins = PorcBins(g.n_virtual, g.eps)
    assert (g.route_virtual(h) == bins.route(h, bins.bin_ids)).all()


def test_an_unmeasured_worker_is_as_slow_as_its_first_calls_age_says() -> None:
    g = _grouping()
    rate = np.array([1000.0, 1000.0, 1000.0, 0.0])  # worker 3: no ack yet
    g.on_held(np.array([10, 10, 10, 100]), rate, rate_bound=np.array([np.inf] * 3 + [100.0]))
    assert g._held_s[3] == pytest.approx(1.0)


def test_the_controller_plans_with_what_the_keys_asked_for() -> None:
    """A source reports what it routed and, in ``spill``, what its admission
    sent elsewhere: the loads are the first choices'."""
    n, b = 4, 4 * R
    ctl = AcgController(n, b, t0=0.0, sources=1)
    routed = np.full(b, 100, dtype=np.int64)
    spill = np.zeros(b, dtype=np.int64)
    spill[0], spill[1] = 50, -50  # 50 asked for VW 0, went to VW 1
    t = 0.0
    for _ in range(6):
        ctl.report_routed(0, t, t + 0.5, np.arange(b), routed, spill)
        for w in range(n):
            ctl.report(w, 1000, 0.5, t + 0.5)
        t += 0.5
        ctl.tick(t)
    assert ctl.vw_rate is not None
    assert ctl.vw_rate[0] == pytest.approx(300.0, rel=0.05)
    assert ctl.vw_rate[1] == pytest.approx(100.0, rel=0.05)


def test_tables_carry_the_rate_shares() -> None:
    ctl = AcgController(2, 2 * R, t0=0.0)
    assert ctl.table().share is None
    t = 0.0
    for _ in range(4):
        ctl.report_routed(0, t, t + 0.5, np.arange(2 * R), np.full(2 * R, 50))
        ctl.report(0, 1500, 0.5, t + 0.5)
        ctl.report(1, 500, 0.5, t + 0.5)
        t += 0.5
        ctl.tick(t)
    share = ctl.table().share
    assert ctl.version >= 1 and share is not None
    assert share == pytest.approx([0.75, 0.25], abs=0.02)
