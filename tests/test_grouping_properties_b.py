"""Property tests of each scheme's own guarantee: CH, PoRC, CG, FISH.

The conformance suite checks what every scheme shares; these check what each
one promises (ALGORITHMS.md). Hypothesis drives the parameters and sequences.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.grouping import make_grouping
from runtime.grouping.ch import Ring
from runtime.grouping.porc import capacity_for, porc_assign
from runtime.hashing import choice, hash_keys

FAST = settings(max_examples=25, deadline=None)


def zipf_keys(m: int, n_keys: int = 1000, z: float = 1.2, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -z
    p /= p.sum()
    return rng.choice(n_keys, size=m, p=p).astype(np.int64)


def zipf_hashes(m: int, n_keys: int = 1000, z: float = 1.2, seed: int = 7) -> np.ndarray:
    return hash_keys(zipf_keys(m, n_keys, z, seed))


UNIFORM = hash_keys(np.arange(20_000, dtype=np.int64))


# --------------------------------------------------------------------------- CH


@FAST
@given(n=st.integers(1, 24), vnodes=st.integers(1, 200), seed=st.integers(0, 2**40))
def test_ch_adding_a_worker_moves_keys_only_to_it(n: int, vnodes: int, seed: int) -> None:
    ring = Ring(n, vnodes=vnodes, seed=seed)
    before = ring.lookup(UNIFORM)
    ring.add_worker(n)
    after = ring.lookup(UNIFORM)
    moved = before != after
    assert np.all(after[moved] == n)
    assert np.all(np.diff(ring.points.astype(np.float64)) >= 0)


@FAST
@given(n=st.integers(2, 24), vnodes=st.integers(1, 200), data=st.data())
def test_ch_removing_a_worker_moves_only_its_keys(n: int, vnodes: int, data: st.DataObject) -> None:
    gone = data.draw(st.integers(0, n - 1))
    g = make_grouping("ch", n, seed=3, vnodes=vnodes)
    before = g.route(UNIFORM)
    g.on_workers_changed([w for w in range(n) if w != gone])
    after = g.route(UNIFORM)
    moved = before != after
    assert np.all(before[moved] == gone)
    assert not np.any(after == gone)
    assert np.all(moved[before == gone])


@pytest.mark.parametrize("n", [4, 10, 32])
def test_ch_moved_fraction_is_about_one_over_n(n: int) -> None:
    g = make_grouping("ch", n, seed=1)  # vnodes=100
    before = g.route(UNIFORM)
    g.on_workers_changed(list(range(n + 1)))
    frac_add = np.mean(before != g.route(UNIFORM))
    assert abs(frac_add - 1 / (n + 1)) < 0.5 / (n + 1)
    g.on_workers_changed(list(range(n + 1)))  # no change, no movement
    g2 = make_grouping("ch", n, seed=1)
    b2 = g2.route(UNIFORM)
    g2.on_workers_changed(list(range(1, n)))
    frac_rm = np.mean(b2 != g2.route(UNIFORM))
    assert abs(frac_rm - 1 / n) < 0.5 / n


def test_ch_ring_interface_and_wraparound() -> None:
    ring = Ring(5, vnodes=10, seed=9)
    assert ring.points.dtype == np.uint64 and ring.owners.dtype == np.int32
    assert len(ring.points) == 50 and np.all(ring.points[:-1] <= ring.points[1:])
    top = np.array([ring.points[-1] + np.uint64(1), np.uint64(2**64 - 1)], dtype=np.uint64)
    assert np.all(ring.successor_index(top) == 0)
    exact = ring.points[[3, 7]]
    np.testing.assert_array_equal(ring.successor_index(exact), [3, 7])
    np.testing.assert_array_equal(ring.lookup(exact), ring.owners[[3, 7]])
    cands = ring.distinct_successors(int(UNIFORM[0]), 3)
    assert len(set(cands.tolist())) == 3 and cands[0] == ring.lookup(UNIFORM[:1])[0]
    assert len(ring.distinct_successors(int(UNIFORM[0]), 99)) == 5
    with pytest.raises(ValueError, match="vnodes"):
        Ring(3, vnodes=0)
    with pytest.raises(ValueError, match="vnodes must be in"):
        make_grouping("ch", 3, vnodes=-5)


# ------------------------------------------------------------------------- PoRC


def porc_reference(key_hashes: np.ndarray, n_bins: int, eps: float) -> list[int]:
    """Plain-Python PoRC straight from ALGORITHMS.md, as an oracle."""
    loads = [0] * n_bins
    out = []
    for m, h in enumerate(key_hashes.tolist(), start=1):
        cap = capacity_for(m, eps, n_bins)
        i = 1
        while True:
            b = int(choice(np.array([h], dtype=np.uint64), i)[0] % np.uint64(n_bins))
            if loads[b] < cap:
                break
            i += 1
        loads[b] += 1
        out.append(b)
    return out


EPS = st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0])


@FAST
@given(
    eps=EPS,
    bins=st.integers(1, 60),
    z=st.floats(0.0, 2.5),
    seed=st.integers(0, 10_000),
    m=st.integers(1, 3000),
)
def test_porc_bin_load_bounded_at_every_prefix(
    eps: float, bins: int, z: float, seed: int, m: int
) -> None:
    g = make_grouping("porc", 1, eps=eps, bins=bins)
    assigned = g.route_bins(zipf_hashes(m, n_keys=200, z=z, seed=seed))
    loads = np.zeros(bins, dtype=np.int64)
    for t, b in enumerate(assigned.tolist(), start=1):
        loads[b] += 1  # only this bin changed, and capacity never decreases
        assert loads[b] <= capacity_for(t, eps, bins) == math.ceil((1 + eps) * t / bins)
    np.testing.assert_array_equal(loads, g.loads)


@FAST
@given(eps=EPS, bins=st.integers(1, 20), seed=st.integers(0, 10_000), m=st.integers(1, 300))
def test_porc_matches_the_plain_reference(eps: float, bins: int, seed: int, m: int) -> None:
    h = zipf_hashes(m, n_keys=30, z=1.5, seed=seed)
    g = make_grouping("porc", 1, eps=eps, bins=bins)
    assert g.route_bins(h).tolist() == porc_reference(h, bins, eps)


def test_porc_light_keys_stay_on_their_principal_bin() -> None:
    # Many light keys and a generous eps: once the capacity exceeds a few
    # messages (warm-up) no principal bin fills, so PoRC is hashing onto bins.
    g = make_grouping("porc", 8, eps=1.0)
    h = UNIFORM
    principal = (choice(h, 1) % np.uint64(g.bins)).astype(np.int64)
    b = g.route_bins(h)
    np.testing.assert_array_equal(b[1000:], principal[1000:])
    assert np.mean(b == principal) > 0.99
    # Under skew the heavy keys spill, the light ones mostly stay.
    keys = zipf_keys(50_000, n_keys=5000, z=1.2, seed=1)
    h = hash_keys(keys)
    g = make_grouping("porc", 8, eps=0.1)
    b = g.route_bins(h)
    principal = (choice(h, 1) % np.uint64(g.bins)).astype(np.int64)
    counts = np.bincount(keys)
    light = counts[keys] <= 5
    heavy = keys == np.argmax(counts)
    assert np.mean(b[light] == principal[light]) > 0.6
    assert np.mean(b[heavy] == principal[heavy]) < 0.2
    assert len(np.unique(b[heavy])) > 5


def replication(keys: np.ndarray, places: np.ndarray) -> float:
    pairs = np.unique(keys.astype(np.int64) * 1_000_003 + places)
    return len(pairs) / len(np.unique(keys))


@pytest.mark.parametrize("z", [0.8, 1.4])
def test_porc_replication_grows_as_eps_shrinks(z: float) -> None:
    keys = zipf_keys(30_000, n_keys=2000, z=z, seed=4)
    h = hash_keys(keys)
    reps = []
    for eps in (2.0, 0.5, 0.1, 0.01, 0.0):
        g = make_grouping("porc", 10, eps=eps)
        reps.append(replication(keys, g.route_bins(h)))
    assert all(a < b for a, b in zip(reps, reps[1:], strict=False)), reps


def test_porc_validates_parameters() -> None:
    with pytest.raises(ValueError, match=r"eps must be in \[0, 10.0\] \(got -0.1\)"):
        make_grouping("porc", 4, eps=-0.1)
    with pytest.raises(ValueError, match="bins must be"):
        make_grouping("porc", 4, bins=3)
    assert make_grouping("porc", 4).bins == 40


def test_porc_terminates_when_a_single_bin_has_room() -> None:
    # 1000 bins at capacity 10 but one: ~e**-8 of keys miss it in all their
    # probes and take the least-loaded-bin fallback; all must land there.
    loads = np.full(1000, 10, dtype=np.int64)
    loads[500] = 0
    out = np.empty(1, dtype=np.int64)
    for h in UNIFORM[:20_000]:
        porc_assign(np.array([h], dtype=np.uint64), loads, 9500, 0.0, out)
        assert out[0] == 500
        loads[500] = 0
