"""Property tests of each scheme's own guarantee: CH, PoRC, CG, FISH.

The conformance suite checks what every scheme shares; these check what each
one promises (docs/algorithms.md). Hypothesis drives the parameters and sequences.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import FakeTime
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.grouping import make_grouping
from runtime.grouping.cg import ConsistentGrouping
from runtime.grouping.ch import Ring
from runtime.grouping.fish import FISH
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
    """Plain-Python PoRC straight from docs/algorithms.md, as an oracle."""
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


# --------------------------------------------------------------------------- CG

SIGNALS = st.lists(st.tuples(st.integers(0, 5), st.sampled_from([-1, 0, 1])), max_size=200)


def check_cg_invariants(g: ConsistentGrouping) -> None:
    per = g.vw_per_worker()
    assert per.sum() == g.n_virtual == g.n_workers * g.virtual_per_worker
    assert all(per[w] >= 1 for w in g._alive)
    for w, vws in enumerate(g._owned):  # table and per-worker lists agree
        assert np.all(g.vw_owner[vws] == w) and len(vws) == per[w]
    assert not set(g.idle.as_list()) & set(g.busy.as_list())


@FAST
@given(r=st.integers(1, 4), seq=SIGNALS)
def test_cg_conserves_virtual_workers_and_never_takes_the_last(
    r: int, seq: list[tuple[int, int]]
) -> None:
    g = make_grouping("cg", 6, virtual_per_worker=r)
    assert isinstance(g, ConsistentGrouping)
    h = zipf_hashes(600)
    for i, (w, s) in enumerate(seq):
        g.on_ack(w, s, acked=10)
        check_cg_invariants(g)
        if i % 50 == 0:
            routed = g.route(h)
            assert routed.min() >= 0 and routed.max() < 6
    st_ = g.stats()
    assert st_["signals"] == {
        "increase": sum(s > 0 for _, s in seq),
        "decrease": sum(s < 0 for _, s in seq),
    }
    assert st_["vw_per_worker"] == g.vw_per_worker().tolist()
    assert st_["migrations"] <= len(seq)


def test_cg_pairs_in_fcfs_order() -> None:
    g = make_grouping("cg", 6, virtual_per_worker=3)
    for o in (2, 0, 4, 0):  # duplicate decrease from 0 is deduplicated
        g.on_ack(o, -1)
    assert g.busy.as_list() == [2, 0, 4] and g.migrations == 0
    g.on_ack(5, +1)
    g.on_ack(3, +1)
    per = g.vw_per_worker()
    assert per[2] == 2 and per[0] == 2 and per[4] == 3 and per[5] == 4 and per[3] == 4
    assert g.busy.as_list() == [4] and g.migrations == 2
    # symmetric: idle workers are served in arrival order
    g = make_grouping("cg", 6, virtual_per_worker=3)
    for u in (1, 5, 1, 3):
        g.on_ack(u, +1)
    assert g.idle.as_list() == [1, 5, 3]
    g.on_ack(0, -1)
    assert g.vw_per_worker()[1] == 4 and g.idle.as_list() == [5, 3]
    g.on_ack(2, -1)
    assert g.vw_per_worker()[5] == 4 and g.idle.as_list() == [3]


def test_cg_moves_the_most_recently_acquired_vw_first() -> None:
    g = make_grouping("cg", 3, virtual_per_worker=2)
    assert isinstance(g, ConsistentGrouping)
    g.on_ack(0, -1)
    g.on_ack(1, +1)  # 0 -> 1: VW 3 (0's last)
    assert g.vw_owner[3] == 1
    g.on_ack(1, -1)
    g.on_ack(0, +1)  # 1 gives back the VW it just got
    assert g.vw_owner.tolist() == [0, 1, 2, 0, 1, 2]


def test_cg_a_busy_worker_loses_vws_to_an_idle_one_and_traffic_follows() -> None:
    g = make_grouping("cg", 4, virtual_per_worker=10)
    assert isinstance(g, ConsistentGrouping)
    h = zipf_hashes(40_000, n_keys=5000, z=1.0)
    before = np.bincount(g.route(h[:20_000]), minlength=4)
    for _ in range(30):
        g.on_ack(0, -1)
        g.on_ack(3, +1)
    per = g.vw_per_worker()
    assert per[0] == 1 and per[3] == 19 and per[1] == per[2] == 10
    assert g.migrations == 9 and g.signals == {"increase": 30, "decrease": 30}
    after = np.bincount(g.route(h[20_000:]), minlength=4)
    # PoRC keeps VWs equal, so each worker's share follows its VW count
    assert after[0] < 0.2 * before[0]
    np.testing.assert_allclose(after / after.sum(), per / per.sum(), atol=0.02)


def test_cg_worker_failure_reassigns_its_vws() -> None:
    g = make_grouping("cg", 4, virtual_per_worker=5)
    assert isinstance(g, ConsistentGrouping)
    g.on_ack(1, -1)
    g.on_workers_changed([0, 2, 3])
    assert g.vw_per_worker().tolist()[1] == 0 and g.vw_per_worker().sum() == 20
    assert 1 not in g.route(zipf_hashes(3000)).tolist()
    g.on_ack(1, +1)  # a dead worker's signal is ignored
    assert 1 not in g.idle
    g.on_workers_changed([0, 1, 2, 3])
    assert g.vw_per_worker()[1] == 5 and g.vw_per_worker().sum() == 20


def test_cg_validates_parameters() -> None:
    with pytest.raises(ValueError, match="virtual_per_worker must be an int in"):
        make_grouping("cg", 4, virtual_per_worker=0)
    with pytest.raises(
        ValueError, match=r"idle_below must be in \[0, busy_above=0.5\] \(got 0.75\)"
    ):
        make_grouping("cg", 4, busy_above=0.5)
    with pytest.raises(ValueError, match="eps must be"):
        make_grouping("cg", 4, eps=float("nan"))
    g = make_grouping("cg", 4, epsilon=0.2, slot_s=2.0)
    assert isinstance(g, ConsistentGrouping)
    assert g.eps == 0.2 and g.slot_s == 2.0 and g.busy_above == 0.85 and g.idle_below == 0.75


# ------------------------------------------------------------------------- FISH


def one_hot_stream(m: int, hot_share: float, n_tail: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = rng.integers(1, n_tail + 1, size=m)
    keys[rng.random(m) < hot_share] = 0  # key 0 is the hot one
    return keys.astype(np.int64)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(4, 16), hot_share=st.floats(0.2, 0.6), seed=st.integers(0, 1000))
def test_fish_hot_keys_get_more_candidates_cold_keys_exactly_one(
    n: int, hot_share: float, seed: int
) -> None:
    keys = one_hot_stream(30_000, hot_share, 5000, seed)
    h = hash_keys(keys)
    g = make_grouping("fish", n, epoch=5000)
    assert isinstance(g, FISH)
    w1 = g.route(h[:25_000])  # 5 epochs: the start-up estimate has been decayed away
    hot_h = int(h[keys == 0][0])
    d_start = g.hot_keys()[hot_h]
    assert d_start == min(n, max(2, math.ceil(g.counters()[0][hot_h] / g.counters()[1] * n)))
    w2 = g.route(h[25_000:])  # exactly one epoch
    w = np.concatenate([w1, w2])
    d_max = min(n, max(2, math.ceil((hot_share + 0.05) * n)))
    used = np.unique(w2[keys[25_000:] == 0])
    assert 1 <= len(used) <= d_max
    assert set(used.tolist()) <= set(g.ring.distinct_successors(hot_h, d_max).tolist())
    # it really is spread after start-up (within one epoch it may use a single
    # candidate: with the constant clock nothing drains, and one candidate can
    # start the epoch thousands of messages behind the others)
    assert len(np.unique(w[5000:][keys[5000:] == 0])) >= 2
    # cold keys: exactly one worker, their consistent-hash successor
    # (after start-up, when a couple of early occurrences look hot)
    counts = np.bincount(keys)
    cold = (keys != 0) & (counts[keys] <= 15)
    cold[:5000] = False
    np.testing.assert_array_equal(w[cold], g.ring.lookup(h[cold]))


@pytest.mark.parametrize("n,z", [(50, 1.1), (100, 1.1), (50, 0.9)])
def test_fish_hot_needs_the_guaranteed_count_with_many_workers(n: int, z: float) -> None:
    """Regression: a key inserted by ReplaceMin starts at ``c_min + 1`` and
    ``c_min / N`` reaches ``1 / K``, above ``theta = 1/(5n)`` for ``n > K / 5``:
    classifying on ``C[k]`` made such cold keys hot (d = 2), so 4-24% of the
    keys with frequency below theta / 2 used two workers. On ``C - E`` cold
    keys stay on their consistent-hash successor, hot keys still spread."""
    rng = np.random.default_rng(1)
    p = np.arange(1, 100_001, dtype=np.float64) ** -z
    p /= p.sum()
    h = hash_keys(rng.choice(100_000, size=200_000, p=p).astype(np.int64))
    g = make_grouping("fish", n)
    assert isinstance(g, FISH)
    w = np.concatenate([g.route(h[i : i + 1000]) for i in range(0, len(h), 1000)])
    pairs = np.unique(np.stack([h, w.astype(np.uint64)]), axis=1)
    keys, used = np.unique(pairs[0], return_counts=True)
    _, count = np.unique(h, return_counts=True)
    cold = count <= len(h) / (5 * n) / 2
    assert (used[cold] > 1).mean() < 0.005
    cold_msgs = np.isin(h, keys[cold & (used == 1)])
    np.testing.assert_array_equal(w[cold_msgs], g.ring.lookup(h[cold_msgs]))
    if z > 1.0:  # p_1 n > 2: the hottest key is spread over more than 2 workers
        assert used[np.argmax(count)] > 2
    else:
        assert used[np.argmax(count)] >= 2


def test_fish_hotter_keys_get_more_candidates() -> None:
    rng = np.random.default_rng(3)
    keys = rng.integers(10, 3000, size=40_000)
    r = rng.random(40_000)
    keys[r < 0.4] = 1
    keys[(r >= 0.4) & (r < 0.5)] = 2
    h = hash_keys(keys.astype(np.int64))
    g = make_grouping("fish", 16, epoch=10_000)
    assert isinstance(g, FISH)
    g.route(h)
    hot = g.hot_keys()
    h1, h2 = (int(hash_keys(np.array([k]))[0]) for k in (1, 2))
    assert hot[h1] == math.ceil(0.4 * 16) or abs(hot[h1] - 0.4 * 16) <= 1
    assert 1 < hot[h2] < hot[h1]


def test_fish_decays_per_epoch_not_per_message() -> None:
    g = make_grouping("fish", 4, epoch=1000, decay=0.5)
    assert isinstance(g, FISH)
    a, b = hash_keys(np.array([11, 12]))
    g.route(np.full(998, a, dtype=np.uint64))
    g.route(np.array([b], dtype=np.uint64))
    c, total = g.counters()
    assert c == {int(a): 998.0, int(b): 1.0} and total == 999.0  # no decay yet
    g.route(np.array([a], dtype=np.uint64))  # the 1000th message closes the epoch
    c, total = g.counters()
    assert c == {int(a): 499.5} and total == 500.0  # b fell below 1: dropped
    assert g.stats()["epoch"] == 1


def test_fish_d_does_not_shrink_within_its_epoch() -> None:
    g = make_grouping("fish", 10, epoch=10_000)
    assert isinstance(g, FISH)
    hot = hash_keys(np.array([0]))
    g.route(np.repeat(hot, 2000))
    d0 = g.hot_keys()[int(hot[0])]
    assert d0 == 10  # f = 1
    g.route(hash_keys(np.arange(1, 7001, dtype=np.int64)))  # dilute within the epoch
    assert g.hot_keys()[int(hot[0])] == d0
    g.route(hash_keys(np.arange(7001, 8001, dtype=np.int64)))  # epoch ends: f ~ 0.2
    assert g.hot_keys()[int(hot[0])] == 2


def simulate_acks(rates: list[float], n_batches: int = 1000, batch: int = 100) -> tuple:
    """Sources route Zipf batches every 10 ms; worker w drains rates[w] msgs/s
    and acks what it processed. Returns (messages per worker in the second
    half, the grouping)."""
    clk = FakeTime(0.0)
    n, dt = len(rates), 0.01
    # ring_seed=1: a ring on which worker 0 is among the hot keys' candidates
    # (with ring_seed=0 it is not, so its share cannot react to its speed)
    g = make_grouping("fish", n, seed=1, clock=clk.clock, ring_seed=1)
    rng = np.random.default_rng(0)
    p = np.arange(1, 201, dtype=np.float64) ** -1.4
    p /= p.sum()
    rate = np.array(rates)
    backlog, credit = np.zeros(n), np.zeros(n)
    counts = np.zeros(n, dtype=np.int64)
    for b in range(n_batches):
        c = np.bincount(g.route(hash_keys(rng.choice(200, batch, p=p))), minlength=n)
        backlog += c
        if b >= n_batches // 2:
            counts += c
        clk.t += dt
        credit = np.minimum(credit + rate * dt, rate * dt + 1)
        done = np.minimum(backlog, np.floor(credit))
        credit -= done
        backlog -= done
        for x in range(n):
            if done[x] > 0:
                g.on_ack(x, 0, int(done[x]))
    return counts, g


def test_fish_learns_heterogeneity_from_ack_timings() -> None:
    homo, _ = simulate_acks([3000, 3000, 3000, 3000])
    hetero, g = simulate_acks([1000, 3500, 3500, 3500])
    share_homo, share_het = homo / homo.sum(), hetero / hetero.sum()
    assert share_het[0] < 0.6 * share_homo[0]
    assert share_het[0] < share_het[1:].min()
    t = g.service_time_estimates()
    assert t[0] == pytest.approx(1 / 1000, rel=0.1)  # learned, never configured
    assert t[0] > 1.5 * t[1:].max()


def test_fish_unobserved_workers_share_a_neutral_prior() -> None:
    clk = FakeTime(0.0)
    g = make_grouping("fish", 3, clock=clk.clock)
    assert isinstance(g, FISH)
    assert np.all(g.service_time_estimates() == g.service_time_estimates()[0])
    w = g.route(np.repeat(hash_keys(np.array([5])), 300))
    clk.t = 1.0
    g.on_ack(int(w[0]), 0, acked=int((w == w[0]).sum()))
    t = g.service_time_estimates()
    others = [x for x in range(3) if x != w[0]]
    assert t[others[0]] == t[others[1]] == t[w[0]]


def test_fish_validates_parameters() -> None:
    for bad in ({"epoch": 0}, {"decay": 0.0}, {"theta": 2.0}, {"capacity": 0}, {"ewma_weight": 0}):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=name):
            make_grouping("fish", 4, **bad)


@FAST
@given(n=st.integers(1, 40), vnodes=st.integers(1, 50), seed=st.integers(0, 2**32))
def test_ch_successor_index_equals_binary_search(n: int, vnodes: int, seed: int) -> None:
    ring = Ring(n, vnodes=vnodes, seed=seed)
    h = np.concatenate([UNIFORM[:3000], ring.points, ring.points - np.uint64(1)])
    h = np.concatenate([h, np.array([0, 2**64 - 1], dtype=np.uint64)])
    expected = np.searchsorted(ring.points, h, side="left")
    expected[expected == len(ring.points)] = 0
    np.testing.assert_array_equal(ring.successor_index(h), expected)
    ring.add_worker(n + 3)
    if n > 1:
        ring.remove_worker(0)
    expected = np.searchsorted(ring.points, h, side="left")
    expected[expected == len(ring.points)] = 0
    np.testing.assert_array_equal(ring.successor_index(h), expected)
