"""Dalton (``runtime/grouping/dalton.py``): its own behaviour, beyond the
conformance suite.

The core check is a plain-Python model written from the module docstring with
literal windows (per-slide lists of what was sent where, dicts for counts and
the Q-table): the compiled kernel must make exactly its decisions. The other
tests pin single properties: cold keys on KG's worker, hot keys spread and
bounded by ``maxSplit``, windows forget, a key's worker set shrinks (the
reference's bug), the threshold stays ``slide / n``, the reward's sign, dead
workers get nothing, the exact/sketch switch.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.grouping import make_grouping
from runtime.grouping.base import reroute_dead
from runtime.grouping.dalton import (
    _CM_SALT,
    _TK,
    CM_DEPTH,
    CM_WIDTH,
    LC_BITS,
    LEARNING_RATE,
    MAX_SPLIT_CAP,
    MAX_SPLIT_START,
    Q_INIT,
    SPLIT_GROWTH,
    W_LOAD,
    W_RED,
    Dalton,
    occupancy_limit,
)
from runtime.hashing import hash_keys

HYP = settings(max_examples=30, deadline=None)
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(x: int) -> int:
    x &= M64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def choice(h: int, i: int) -> int:
    return mix64(h + i * GOLDEN)


def below(x: int, k: int) -> int:
    return (x * k) >> 64


def make(n: int, seed: int = 0, **params: object) -> Dalton:
    g = make_grouping("dalton", n, seed=seed, **params)
    assert isinstance(g, Dalton)
    return g


def keys_hashes(keys: np.ndarray | list[int]) -> np.ndarray:
    return hash_keys(np.asarray(keys, dtype=np.int64))


def kg_workers(h: np.ndarray, n: int) -> np.ndarray:
    return make_grouping("kg", n).route(h)


class Model:
    """Dalton, one message at a time, with literal windows (no membership)."""

    def __init__(self, n: int, rng_base: int, size: int, slide: int, explore: float,
                 exact_keys: int) -> None:
        self.n, self.base, self.slide, self.explore = n, rng_base, slide, explore
        self.S = -(-size // slide)
        self.occ_limit = occupancy_limit(exact_keys)
        self.t = 0
        self.ctr = 0
        self.sent: dict[int, list[tuple[int, int]]] = defaultdict(list)  # slide -> (key, w)
        self.threshold = math.inf
        self.exact = exact_keys > 0
        self.counts: Counter[int] = Counter()
        self.cm = [[0] * CM_WIDTH for _ in range(CM_DEPTH)]
        self.lc: dict[int, int] = {}  # bucket -> last slide
        self.q: dict[int, list[float]] = {}
        self.hot_epoch: dict[int, int] = {}  # key in the Q-table -> epoch it last crossed
        self.members: set[int] = set()
        self.split = MAX_SPLIT_START

    def draw(self) -> int:
        x = choice(self.base, self.ctr)
        self.ctr += 1
        return x

    def window(self, s: int) -> list[tuple[int, int]]:
        return [p for x in range(max(0, s - self.S), s + 1) for p in self.sent[x]]

    def key_workers(self, key: int, s: int) -> set[int]:
        return {w for k, w in self.window(s) if k == key}

    def boundary(self, s: int) -> None:
        self.threshold = self.slide / self.n
        occ = sum(1 for v in self.lc.values() if v >= s - self.S)
        self.exact = occ < self.occ_limit
        self.counts.clear()
        self.cm = [[0] * CM_WIDTH for _ in range(CM_DEPTH)]
        for k in [k for k, e in self.hot_epoch.items() if e < s - 1]:
            del self.hot_epoch[k], self.q[k]
            self.members.discard(k)

    def count(self, key: int) -> float:
        x = choice(key, _CM_SALT)
        est = math.inf
        for r in range(CM_DEPTH):
            c = (((x >> (16 * r)) & 0xFFFF) * CM_WIDTH) >> 16
            self.cm[r][c] += 1
            est = min(est, self.cm[r][c])
        if not self.exact:
            return est
        self.counts[key] += 1
        return self.counts[key]

    def route_one(self, key: int) -> int:
        n, s = self.n, self.t // self.slide
        if self.t and self.t % self.slide == 0:
            self.boundary(s)
        if self.hot_epoch.get(key) != s and self.count(key) > self.threshold:
            if self.hot_epoch.get(key) != s - 1:
                self.q[key] = [Q_INIT] * n
                self.members.discard(key)
            self.hot_epoch[key] = s
        home = choice(key, 1) % n
        w = home
        hot = key in self.q
        if hot:
            row = self.q[key]
            if ((self.draw() >> 11) * 2.0**-53) < 1.0 - self.explore:
                for x in range(n):
                    if row[x] > row[w]:
                        w = x
            elif key in self.members:
                mine = sorted(self.key_workers(key, s))
                w = mine[below(self.draw(), len(mine))] if mine else below(self.draw(), n)
            else:
                w = below(self.draw(), n)
        self.sent[s].append((key, w))
        self.lc[mix64(key) >> (64 - LC_BITS)] = s
        if hot:
            kf = len(self.key_workers(key, s))
            loads = Counter(x for _, x in self.window(s))
            mean = sum(loads.values()) / n
            lw = float(loads[w])
            c_load = (lw - mean) / max(lw, mean)
            reward = -(W_LOAD * c_load + W_RED * (kf / n))
            row[w] = (1.0 - LEARNING_RATE) * row[w] + LEARNING_RATE * reward
            if kf >= self.split:
                self.members.add(key)
            else:
                self.members.discard(key)
            if (self.split < min(MAX_SPLIT_CAP, n)
                    and len(self.members) >= SPLIT_GROWTH * len(self.q)):
                self.split += 1
                self.members.clear()
        self.t += 1
        return w


def skewed_keys(m: int, n_keys: int, z: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -z
    p /= p.sum()
    return rng.choice(n_keys, size=m, p=p).astype(np.int64)


# --------------------------------------------------------------- the model


@HYP
@given(
    n=st.integers(2, 9),
    slide=st.integers(4, 40),
    slides=st.integers(1, 6),
    explore=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    n_keys=st.integers(2, 60),
    z=st.floats(0.5, 2.0),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.integers(0, 1200), max_size=6),
)
def test_kernel_makes_the_models_decisions(
    n: int, slide: int, slides: int, explore: float, n_keys: int, z: float, seed: int,
    cuts: list[int],
) -> None:
    slide = max(slide, n)  # n > slide: a key turns hot on its first tuple (docstring)
    keys = skewed_keys(1200, n_keys, z, seed)
    h = keys_hashes(keys)
    size = slides * slide - (seed % slide if slides > 1 else 0)  # also sizes off the slide grid
    g = make(n, seed=seed, size=size, slide=slide, explore=explore)
    model = Model(n, int(g._rng_base), size, slide, explore, exact_keys=10_000)
    got = np.concatenate([g.route(part) for part in np.split(h, sorted(set(cuts)))])
    want = np.array([model.route_one(int(k)) for k in h.tolist()], dtype=np.int32)
    np.testing.assert_array_equal(got, want)
    s = (len(h) - 1) // slide
    assert sorted(g.hot_keys()) == sorted(model.q)
    for k, row in model.q.items():
        np.testing.assert_allclose(g.q_values(k), row, rtol=0, atol=1e-12)
        assert g.key_workers(k) == sorted(model.key_workers(k, s))
    assert g.max_split == model.split
    np.testing.assert_array_equal(
        g.window_loads(), np.bincount([w for _, w in model.window(s)], minlength=n)
    )


@settings(max_examples=10, deadline=None)
@given(n=st.integers(2, 12), seed=st.integers(0, 2**32 - 1), exact_keys=st.sampled_from([0, 30]))
def test_sketch_mode_finds_the_models_hot_keys(n: int, seed: int, exact_keys: int) -> None:
    """With Count-Min counts (``exact_keys=0``, or over 30 distinct keys in the
    window) the Q-table holds exactly the keys whose estimate crossed."""
    keys = skewed_keys(3000, 400, 1.1, seed)
    h = keys_hashes(keys)
    g = make(n, seed=seed, size=200, slide=50, exact_keys=exact_keys)
    model = Model(n, int(g._rng_base), 200, 50, 0.1, exact_keys=exact_keys)
    for i in range(0, len(h), 50):
        g.route(h[i : i + 50])
        for k in h[i : i + 50].tolist():
            model.route_one(int(k))
        assert sorted(g.hot_keys()) == sorted(model.q)
        assert g.exact_counting == model.exact
    assert not g.exact_counting  # 400 Zipf keys: well over 30 in a 200-tuple window


# --------------------------------------------------------------- properties


@HYP
@given(n=st.integers(1, 16), seed=st.integers(0, 1000))
def test_cold_keys_go_to_their_hash_worker(n: int, seed: int) -> None:
    """A stream where no key reaches ``slide / n`` per epoch is KG exactly."""
    keys = np.random.default_rng(seed).permutation(np.tile(np.arange(5000), 2))
    h = keys_hashes(keys)
    g = make(n, seed=seed, slide=1000)
    np.testing.assert_array_equal(g.route(h), kg_workers(h, n))
    assert g.stats()["hot_crossings"] == 0 and g.hot_keys() == []


@pytest.mark.parametrize("n", [3, 8, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_very_hot_key_is_spread_within_max_split(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.integers(1, 3000, size=40_000)
    keys[rng.random(40_000) < 0.5] = 0  # key 0: half of the stream
    h = keys_hashes(keys)
    g = make(n, seed=seed, size=10_000, slide=1000)
    w = g.route(h)
    hot = int(h[keys == 0][0])
    assert g.hot_keys() == [hot]
    cap = min(MAX_SPLIT_CAP, n)
    assert g.max_split == cap  # one hot key: it alone is 100% of the Q-table
    held = g.key_workers(hot)
    assert 2 <= len(held) <= cap
    # the spread is real traffic: in the last window every held worker got it
    tail = w[-10_000:][keys[-10_000:] == 0]
    assert set(np.unique(tail).tolist()) <= set(held)
    # and it helps: the hot key's load is shared (KG puts all 50% on one worker)
    assert np.bincount(w[-10_000:], minlength=n).max() / 10_000 < 0.45


@HYP
@given(
    n=st.integers(1, 8),
    slide=st.integers(1, 50),
    slides=st.integers(1, 5),
    m=st.integers(1, 800),
    seed=st.integers(0, 1000),
)
def test_window_loads_count_exactly_the_window(
    n: int, slide: int, slides: int, m: int, seed: int
) -> None:
    """``L_w`` = messages to ``w`` among the window's slides ``s - S .. s``."""
    h = keys_hashes(skewed_keys(m, 30, 1.2, seed))
    g = make(n, seed=seed, size=slides * slide, slide=slide)
    w = g.route(h)
    s = (m - 1) // slide
    first = max(0, s - slides) * slide
    np.testing.assert_array_equal(g.window_loads(), np.bincount(w[first:], minlength=n))


def test_a_keys_worker_set_shrinks_with_the_window() -> None:
    """The reference's expiry cleared the key's bit, not the worker's, so a
    key's worker set (and its ``c_red``) never shrank. Here: key 0 is hot and
    spread, then turns cold (one tuple per slide); one window later it is
    held by its hash worker alone."""
    n, slide, size = 8, 100, 500
    rng = np.random.default_rng(4)
    hot_phase = np.where(rng.random(3000) < 0.5, 0, rng.integers(1, 500, 3000))
    cold_phase = rng.integers(1, 500, 1000)
    cold_phase[slide::slide] = 0  # (its Q-row outlives the first cold slide)
    k0 = int(keys_hashes([0])[0])
    g = make(n, seed=1, size=size, slide=slide)
    g.route(keys_hashes(hot_phase))
    assert len(g.key_workers(k0)) >= 3
    w = g.route(keys_hashes(cold_phase))
    home = int(kg_workers(np.array([k0], dtype=np.uint64), n)[0])
    assert set(w[cold_phase == 0].tolist()) == {home}  # cold: only its hash worker
    assert g.key_workers(k0) == [home]
    assert g.q_values(k0) is None  # its Q-row expired with its hotness
    # hot again: the first reward's c_red counts the hash worker (and the
    # worker just chosen), not the workers of the old hot phase
    g.route(keys_hashes([0] * 12))  # a new epoch: 12 <= 100 / 8, still cold
    loads = g.window_loads()
    w = int(g.route(keys_hashes([0]))[0])
    q = g.q_values(k0)
    assert q is not None
    mean, lw = (loads.sum() + 1) / n, float(loads[w] + 1)
    r = -(W_LOAD * (lw - mean) / max(lw, mean) + W_RED * len({home, w}) / n)
    assert q[w] == pytest.approx((1 - LEARNING_RATE) * Q_INIT + LEARNING_RATE * r, abs=1e-15)


def test_forgotten_keys_leave_the_tracked_table() -> None:
    """A key neither in the Q-table nor in the window is dropped (bounded memory)."""
    g = make(4, seed=0, size=100, slide=50)
    g.route(keys_hashes([7] * 400))  # hot from epoch 1 on
    assert g.key_workers(int(keys_hashes([7])[0])) != []
    g.route(keys_hashes(np.arange(100, 600)))  # 10 slides of distinct keys
    assert int(g._st[_TK]) == 0  # nothing tracked
    assert g.key_workers(int(keys_hashes([7])[0])) == []


@pytest.mark.parametrize("n,slide", [(1, 1000), (4, 1000), (7, 300), (16, 50)])
def test_the_threshold_is_the_last_epochs_count_over_n(n: int, slide: int) -> None:
    """The reference's cooperative mode let it collapse to ~0 (every key hot).
    Here it stays ``slide / n`` epoch after epoch; a flat stream has no hot key."""
    g = make(n, seed=0, slide=slide, size=slide * 4)
    assert g.threshold == math.inf  # epoch 0: nothing is hot
    flat = keys_hashes(np.tile(np.arange(4 * n + 3), 300))  # each key ~1 / (4n)
    for i in range(0, len(flat), 777):
        g.route(flat[i : i + 777])
        if i + 777 > slide:
            assert g.threshold == slide / n
    assert g.stats()["hot_crossings"] == 0
    if n > 1:
        g.remove_worker(0)
    g.route(flat[: 2 * slide])
    assert g.threshold == slide / max(1, n - 1)


def test_q_update_and_the_sign_of_the_reward() -> None:
    """``Q <- 0.9 Q + 0.1 r``, ``r = -(0.5 c_load + 0.5 c_red)``: a hot key's
    first tuple earns ``r < 0`` on its overloaded hash worker and ``r > 0`` on
    an idle one; once every arm was tried often, the hash worker's Q is lowest."""
    n, slide = 4, 100
    k0 = int(keys_hashes([0])[0])
    home = int(kg_workers(np.array([k0], dtype=np.uint64), n)[0])
    signs = set()
    for seed in range(12):
        g = make(n, seed=seed, size=400, slide=slide, explore=1.0)  # explore: uniform arms
        g.route(keys_hashes([0] * (slide + 25)))  # cold: epoch 0 and 25 tuples of epoch 1
        loads = g.window_loads()
        assert loads[home] == slide + 25 and g.hot_keys() == []
        w = int(g.route(keys_hashes([0]))[0])  # 26 > 100 / 4: hot from this tuple on
        q = g.q_values(k0)
        assert q is not None
        mean = (slide + 26) / n
        lw = float(loads[w] + 1)
        r = -(W_LOAD * (lw - mean) / max(lw, mean) + W_RED * len({home, w}) / n)
        assert q[w] == pytest.approx((1 - LEARNING_RATE) * Q_INIT + LEARNING_RATE * r, abs=1e-15)
        assert all(q[x] == Q_INIT for x in range(n) if x != w)
        assert (r < 0) == (w == home)
        signs.add(r < 0)
        g.route(keys_hashes([0] * 300))
        q = g.q_values(k0)
        assert q is not None
        assert q[home] < min(q[x] for x in range(n) if x != home)
    assert signs == {True, False}


@HYP
@given(n=st.integers(2, 10), seed=st.integers(0, 1000), data=st.data())
def test_a_dead_worker_never_receives_a_message(n: int, seed: int, data: st.DataObject) -> None:
    dead = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    rng = np.random.default_rng(seed)
    keys = rng.integers(10, 2000, size=12_000)
    keys[rng.random(12_000) < 0.3] = 1
    keys[rng.random(12_000) < 0.1] = 2
    h = keys_hashes(keys)
    g = make(n, seed=seed, size=4000, slide=500)
    g.route(h[:6000])
    for d in sorted(dead):
        g.remove_worker(d)
    w1 = g.route(h[6000:])
    assert not set(w1.tolist()) & dead
    assert g.live_workers() == sorted(set(range(n)) - dead)
    assert all(not set(g.key_workers(k)) & dead for k in g.hot_keys())
    assert not g.window_loads()[sorted(dead)].any()
    # cold keys whose hash worker died go to the same stand-in as every scheme's
    mask = np.zeros(n, dtype=bool)
    mask[sorted(dead)] = True
    cold = ~np.isin(keys[6000:], [1, 2])
    want = reroute_dead(h[6000:], kg_workers(h[6000:], n), mask)
    np.testing.assert_array_equal(w1[cold], want[cold])
    # a worker that comes back starts fresh and gets its keys again
    back = min(dead)
    g.add_worker(back)
    w2 = g.route(h[:6000])
    assert back in set(w2.tolist())


def test_routing_is_the_same_across_growth_of_the_tracked_table() -> None:
    """Over 64 keys hot in turn (one new hot key per slide, 100-slide window)
    grow the tracked table; one batch, single messages and odd splits agree."""
    slide = 10
    keys = np.concatenate([[k] * 6 + [1000 + k, 2000 + k, 3000 + k, 4000 + k] for k in range(150)])
    h = keys_hashes(keys)
    whole = make(2, seed=5, size=1000, slide=slide)
    a = whole.route(h)
    assert len(whole._tk_key) > 64
    g = make(2, seed=5, size=1000, slide=slide)
    b = np.concatenate([g.route(h[i : i + 1]) for i in range(len(h))])
    g = make(2, seed=5, size=1000, slide=slide)
    c = np.concatenate([g.route(p) for p in np.split(h, [3, 333, 334, 1001])])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_counts_are_exact_below_exact_keys_distinct_keys_else_sketched() -> None:
    few = keys_hashes(np.tile(np.arange(200), 30))
    many = keys_hashes(np.arange(6000))
    g = make(8, size=2000, slide=500, exact_keys=300)
    g.route(few)
    assert g.exact_counting
    g.route(many)
    assert not g.exact_counting  # 2000 distinct keys in the window
    g.route(few)
    assert g.exact_counting  # the window forgot them
    # the switch sits at the linear-counting estimate of exact_keys
    assert occupancy_limit(0) == 0
    assert occupancy_limit(10_000) == math.ceil(65536 * (1 - math.exp(-10_000 / 65536)))


def test_exploration_is_per_source_but_seeded() -> None:
    keys = np.where(np.random.default_rng(0).random(20_000) < 0.4, 0, np.arange(20_000))
    h = keys_hashes(keys)
    a, b, c = (make(8, seed=s).route(h) for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()  # another source explores differently
    cold = keys != 0
    np.testing.assert_array_equal(a[cold], c[cold])  # but agrees on every cold key


@pytest.mark.parametrize(
    "params,match",
    [
        ({"size": 0}, r"size must be an int in \[1, 1000000000\] \(got 0\)"),
        ({"size": 100, "slide": 101}, r"slide must be an int in \[1, 100\] \(got 101\)"),
        ({"size": 10**6, "slide": 10}, r"size must be <= 10000 \* slide \(got size=1000000, slide=10\)"),
        ({"explore": 1.5}, r"explore must be in \[0, 1\] \(got 1.5\)"),
        ({"explore": True}, r"explore must be in \[0, 1\] \(got True\)"),
        ({"exact_keys": -1}, r"exact_keys must be an int in \[0, 1000000\] \(got -1\)"),
        ({"slide": 2.5}, r"slide must be an int"),
    ],
)
def test_bad_parameters_are_named(params: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_grouping("dalton", 4, **params)
