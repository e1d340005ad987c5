"""Property tests of each scheme's own guarantee: CH, PoRC, CG, FISH.

The conformance suite checks what every scheme shares; these check what each
one promises (ALGORITHMS.md). Hypothesis drives the parameters and sequences.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.grouping import make_grouping
from runtime.grouping.ch import Ring
from runtime.hashing import hash_keys

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
