"""ACG's controller and table (runtime.grouping.acg), driven by scripted reports
on a fake clock: the plan is capacity-proportional, balanced clusters make no
moves, capacity changes are followed, every source computes the same table,
and no worker ever loses its last virtual worker."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.grouping import make_grouping
from runtime.grouping.acg import (
    AcgController,
    AdaptiveConsistentGrouping,
    VwTable,
    bottleneck,
    plan_table,
    reassign_departed,
    rebalance_joined,
    table_agreement,
)
from runtime.grouping.coordination import RateReport, RoutedReport

R = 16


def proportional(rates: list[float], n_virtual: int) -> np.ndarray:
    r = np.asarray(rates, dtype=np.float64)
    return n_virtual * r / r.sum()


# ----------------------------------------------------------------------------- plan_table


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 9),
    per=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    gain=st.sampled_from([0.0, 0.02, 0.1]),
    with_held=st.booleans(),
)
def test_plan_never_strips_a_worker_and_never_gets_worse(n: int, per: int, seed: int,
                                                          gain: float, with_held: bool) -> None:
    rng = np.random.default_rng(seed)
    b = n * per
    owner = rng.integers(0, n, size=b).astype(np.int32)
    owner[:n] = np.arange(n)  # everyone starts with >= 1 VW
    lam = rng.uniform(0.05, 3.0, size=b)
    rate = rng.uniform(0.1, 5.0, size=n)
    alive = list(range(n))
    held = rng.random((b, n)) < 0.3 if with_held else None
    new, moved = plan_table(owner, lam, rate, alive, min_gain=gain, held=held)
    assert np.bincount(new, minlength=n).min() >= 1
    assert moved == int((new != owner).sum())
    before, after = bottleneck(owner, lam, rate, alive), bottleneck(new, lam, rate, alive)
    if moved:
        assert after <= before * (1 - gain) + 1e-12  # hysteresis
    else:
        np.testing.assert_array_equal(new, owner)
    again, _ = plan_table(owner, lam, rate, alive, min_gain=gain, held=held)
    np.testing.assert_array_equal(again, new)  # a function of its inputs: sources agree


def test_plan_reaches_the_capacity_proportional_table() -> None:
    """Equal VW loads, capacities [1, 1, 1, 0.2 x 7]: every worker's VW count is
    within one of its capacity share of the 160 VWs."""
    rates = [1.0] * 3 + [0.2] * 7
    n = len(rates)
    owner = (np.arange(n * R) % n).astype(np.int32)
    new, moved = plan_table(owner, np.ones(n * R), np.array(rates), list(range(n)))
    counts = np.bincount(new, minlength=n)
    assert moved > 0
    assert np.abs(counts - proportional(rates, n * R)).max() <= 1.0


def test_plan_makes_no_move_on_a_balanced_cluster() -> None:
    n = 8
    owner = (np.arange(n * R) % n).astype(np.int32)
    new, moved = plan_table(owner, np.ones(n * R), np.ones(n), list(range(n)))
    assert moved == 0 and new is not None
    np.testing.assert_array_equal(new, owner)


def test_plan_gives_nothing_to_a_departed_worker() -> None:
    n = 5
    owner = reassign_departed((np.arange(n * R) % n).astype(np.int32), {0, 1, 2, 4})
    rates = np.array([1.0, 1.0, 1.0, 9.0, 0.5])  # worker 3 is gone, however fast
    new, _ = plan_table(owner, np.ones(n * R), rates, [0, 1, 2, 4])
    assert 3 not in new
    assert np.bincount(new, minlength=n)[[0, 1, 2, 4]].min() >= 1


def test_plan_gives_a_vw_back_to_a_worker_that_held_it() -> None:
    """Worker 0 holds 4 of 6 equal VWs, workers 1 and 2 one each: two VWs must
    go. VW 2 was on worker 2 before and VW 3 on worker 1 (their keys' state is
    there): the plan moves those two back, not the lowest ids to new workers
    (replication), with the same bottleneck."""
    owner = np.array([0, 0, 0, 0, 1, 2], dtype=np.int32)
    lam, rate = np.ones(6), np.ones(3)
    held = np.zeros((6, 3), dtype=bool)
    held[np.arange(6), owner] = True
    held[2, 2] = held[3, 1] = True
    blind, _ = plan_table(owner, lam, rate, [0, 1, 2])
    assert list(blind) == [1, 2, 0, 0, 1, 2]  # ties break on the lowest ids
    new, moved = plan_table(owner, lam, rate, [0, 1, 2], held=held)
    assert moved == 2 and list(new) == [0, 0, 2, 1, 1, 2]
    assert held[np.arange(6), new].all()  # no VW on a worker that never held it
    assert bottleneck(new, lam, rate, [0, 1, 2]) == bottleneck(blind, lam, rate, [0, 1, 2])


def test_the_controller_remembers_which_workers_held_each_vw() -> None:
    """``held``: the first table's owners, then every table's; a worker that
    joins again is a new process and holds nothing."""
    ctl = AcgController(3, 3 * R)
    first = ctl.owner.copy()
    assert ctl.held.sum() == 3 * R and ctl.held[np.arange(3 * R), first].all()
    ctl.remove_worker(2)
    assert ctl.held[np.arange(3 * R), ctl.owner].all()
    assert ctl.held[:, 2].sum() == R  # what it held before it left
    ctl.add_worker(2)
    assert ctl.held[:, 2].sum() == int((ctl.owner == 2).sum())  # only what it got back


def test_a_controller_that_came_through_rays_object_store_plans() -> None:
    """The driver builds the controller and Ray hands it to the aggregator
    with its numpy arrays read-only (pickle protocol 5, buffers out of band):
    it must never write one of them in place. (``held`` once was, so every
    plan raised in the aggregator's commit, the workers lost those commits'
    answers, and a real run hung; the simulator never pickles it.)"""
    n = 4
    sc = Script([1000.0, 1000.0, 1000.0, 250.0])
    bufs: list[pickle.PickleBuffer] = []
    data = pickle.dumps(AdaptiveConsistentGrouping.coordinator(n, {"virtual_per_worker": R}),
                        protocol=5, buffer_callback=bufs.append)
    sc.ctl = pickle.loads(data, buffers=[b.raw().toreadonly() for b in bufs])
    assert not sc.ctl.held.flags.writeable and not sc.ctl.owner.flags.writeable
    sc.ctl.start(0.0)
    for _ in range(4):
        sc.epoch()
    assert sc.tables and sc.counts()[3] < R  # planned: the slow worker gave VWs away
    assert sc.ctl.held[np.arange(n * R), sc.ctl.owner].all()
    assert sc.ctl.remove_worker(3) is not None and sc.ctl.add_worker(3) is not None


# ----------------------------------------------------------------------------- membership


def test_membership_rule_is_deterministic_and_fair() -> None:
    n = 6
    owner = (np.arange(n * R) % n).astype(np.int32)
    gone = reassign_departed(owner, {0, 1, 2, 3, 5})
    counts = np.bincount(gone, minlength=n)
    assert counts[4] == 0 and counts.max() - counts[[0, 1, 2, 3, 5]].min() <= 1
    back = rebalance_joined(gone, {0, 1, 2, 3, 4, 5}, [4])
    assert np.bincount(back, minlength=n)[4] == R  # B // |alive|
    np.testing.assert_array_equal(back, rebalance_joined(gone, {0, 1, 2, 3, 4, 5}, [4]))


def test_sources_and_controller_agree_through_departures_and_tables() -> None:
    """Two sources and the controller see the same events (a table, a death, a
    join, a later table): they end with identical tables, and a table that
    still names a departed worker is fixed the same way on every source."""
    n = 5
    ctl = AcgController(n, n * R, t0=0.0)
    a, b = (AdaptiveConsistentGrouping(n, seed=s, virtual_per_worker=R) for s in (0, 1))
    t1 = VwTable(1, np.array(list(range(n)) * R, dtype=np.int32)[::-1].copy())
    a.on_table(t1)
    a.remove_worker(2)
    b.remove_worker(2)  # b learns of the death first, then gets the older table
    b.on_table(t1)
    ctl.owner, ctl.version = t1.owner.copy(), 1
    ctl.remove_worker(2)
    np.testing.assert_array_equal(a.vw_owner, b.vw_owner)
    np.testing.assert_array_equal(a.vw_owner, ctl.owner)
    assert 2 not in a.vw_owner
    for g in (a, b):
        g.add_worker(2)
    ctl.add_worker(2)
    np.testing.assert_array_equal(a.vw_owner, ctl.owner)
    np.testing.assert_array_equal(b.vw_owner, ctl.owner)
    assert not a.on_table(VwTable(1, t1.owner))  # an older version is ignored


# ----------------------------------------------------------------------------- controller


class Script:
    """Scripted reports: ``n`` workers at ``rates`` (msgs/s), always busy, two
    sources routing ``load`` msgs/s spread evenly over the VWs, reporting
    every ``epoch`` on a fake clock (sources at different phases)."""

    def __init__(self, rates: list[float], *, load: float = 4000.0, noise: float = 0.0,
                 seed: int = 0, split_vws: bool = False, sources: int | None = None,
                 **params) -> None:
        self.n = len(rates)
        self.rates = list(rates)
        self.load = load
        self.noise = noise
        self.split_vws = split_vws  # each source routes to its own half of the VWs
        self.rng = np.random.default_rng(seed)
        self.ctl = AdaptiveConsistentGrouping.coordinator(
            self.n, {"virtual_per_worker": R, **params}, t0=0.0, sources=sources)
        self.t = 0.0
        self.tables: list[VwTable] = []

    def epoch(self, dt: float = 1.0, stopped: frozenset[int] = frozenset()) -> None:
        ctl, b = self.ctl, self.ctl.n_virtual
        for s, phase in ((0, 0.0), (1, 0.37)):  # staggered source reports
            t = self.t + dt - phase * dt
            since = max(0.0, t - dt)  # (the run starts at 0)
            ids = np.arange(s, b, 2) if self.split_vws else np.arange(b)
            counts = np.full(len(ids), self.load * (t - since) / len(ids) / 2)
            ctl.report_routed(s, since, t, ids, counts)
        self.t += dt
        for w in range(self.n):
            if w in stopped:
                continue
            jitter = 1.0 + self.noise * self.rng.standard_normal()
            ctl.report(w, int(self.rates[w] * dt * jitter), dt, self.t)
            table = ctl.tick(self.t)
            if table is not None:
                self.tables.append(table)

    def counts(self) -> np.ndarray:
        return np.bincount(self.ctl.owner, minlength=self.n)


def test_controller_converges_to_the_capacity_proportional_table() -> None:
    sc = Script([1000.0] * 3 + [200.0] * 7)
    for _ in range(6):
        sc.epoch()
    assert np.abs(sc.counts() - proportional(sc.rates, sc.ctl.n_virtual)).max() <= 1.0
    moves = sc.ctl.stats.moves
    for _ in range(20):  # steady: nothing more to do
        sc.epoch()
    assert sc.ctl.stats.moves == moves


def test_controller_makes_no_moves_on_a_homogeneous_cluster_despite_noisy_rates() -> None:
    sc = Script([1000.0] * 8, noise=0.05, seed=3)
    for _ in range(60):
        sc.epoch()
    assert sc.ctl.stats.moves == 0 and sc.ctl.version == 0
    assert (sc.counts() == R).all()


def test_a_final_load_report_ends_planning_so_every_source_ends_on_the_last_table() -> None:
    sc = Script([1000.0] * 3 + [200.0] * 7)
    for _ in range(2):
        sc.epoch()
    assert sc.ctl.version >= 1
    sc.ctl.routed_from(0, RoutedReport(since=sc.t, now=sc.t + 0.5, vw_ids=np.arange(4),
                                       vw_counts=np.ones(4), final=True))
    last = sc.ctl.version  # the answer to the final report (its end plan, if any)
    sc.rates[0], sc.rates[5] = 200.0, 1000.0  # a change after the end: no new plan
    for _ in range(5):
        sc.epoch()
    assert sc.ctl.finished and sc.ctl.version == last


def test_planning_goes_on_until_every_source_has_ended() -> None:
    """A source whose share of the input is small (none: fewer rows than a
    block) ends first; the table the others still route on keeps following
    the cluster, and planning ends with the last source."""
    sc = Script([1000.0] * 3 + [200.0] * 7, sources=2)
    end = RoutedReport(since=0.0, now=0.0, vw_ids=np.arange(0), vw_counts=np.ones(0),
                       final=True)
    sc.ctl.routed_from(1, end)  # source 1 had nothing to route
    for _ in range(3):
        sc.epoch()
    assert not sc.ctl.finished and sc.ctl.version >= 1
    sc.ctl.routed_from(0, RoutedReport(since=sc.t, now=sc.t + 0.5, vw_ids=np.arange(4),
                                       vw_counts=np.ones(4), final=True))
    last = sc.ctl.version
    sc.rates[0], sc.rates[5] = 200.0, 1000.0  # a change after the end: no new plan
    for _ in range(5):
        sc.epoch()
    assert sc.ctl.finished and sc.ctl.version == last


def test_controller_follows_a_capacity_change_within_three_epochs() -> None:
    sc = Script([1000.0] * 3 + [200.0] * 7)
    for _ in range(8):
        sc.epoch()
    sc.rates[0], sc.rates[5] = 200.0, 1000.0  # the fast role moves (total kept)
    for _ in range(3):
        sc.epoch()
    assert sc.ctl.stats.rate_resets >= 2
    assert np.abs(sc.counts() - proportional(sc.rates, sc.ctl.n_virtual)).max() <= 1.0


def test_a_stopped_worker_keeps_one_vw_and_gets_them_back() -> None:
    sc = Script([1000.0] * 4)
    for _ in range(3):
        sc.epoch()
    for _ in range(6):  # worker 3 stops: no reports
        sc.epoch(stopped=frozenset({3}))
    assert sc.counts()[3] == 1  # never its last one
    for _ in range(12):
        sc.epoch()
    assert abs(sc.counts()[3] - R) <= 1


def test_reports_before_the_run_starts_are_ignored_and_a_long_silence_is_cheap() -> None:
    ctl = AcgController(4, 4 * R)
    ctl.report(0, 1000, 1.0, now=1.7e9)  # a worker's pre-run flush: wall-clock times
    ctl.report_routed(0, 1.7e9 - 1, 1.7e9, np.arange(4 * R), np.ones(4 * R))
    assert ctl.tick(1.7e9) is None and not ctl.started
    ctl.start(1.7e9)
    ctl.report_routed(0, 1.7e9, 1.7e9 + 1e4, np.arange(4 * R), np.ones(4 * R))
    assert ctl.tick(1.7e9 + 1e4) is None  # folds at most MAX_BUCKETS buckets


def test_load_estimates_are_not_biased_by_staggered_reports() -> None:
    """Even loads, each source routing to its own half of the VWs and
    reporting at its own phase: the per-VW estimates stay even (one half
    would look doubled or absent if reports were divided by the controller's
    own tick interval instead of put on a timeline by their windows)."""
    sc = Script([1000.0] * 4, split_vws=True)
    for _ in range(10):
        sc.epoch()
    lam = sc.ctl.vw_rate
    assert lam is not None
    assert lam.max() / lam.min() == pytest.approx(1.0, abs=1e-6)
    assert lam.sum() == pytest.approx(sc.load, rel=1e-6)


def test_table_agreement_measures_lag_and_disagreement() -> None:
    history = [(10.0, 1, 4), (20.0, 2, 3)]
    adopted = [[(10.1, 1), (20.2, 2)], [(10.3, 1), (20.2, 2)]]
    got = table_agreement(history, adopted, duration_s=40.0)
    assert got["tables"] == 2
    assert got["lag_ms"]["max"] == pytest.approx(300.0)
    assert got["disagree_fraction"] == pytest.approx(0.2 / 40.0)


# ----------------------------------------------------------------------------- WRR


def test_wrr_shares_follow_the_capacities_within_one_message() -> None:
    g = make_grouping("wrr", 4, seed=0)
    for w, c in enumerate([1.0, 1.0, 0.5, 0.25]):
        g.on_capacity(w, c)
    total = 0
    counts = np.zeros(4, dtype=np.int64)
    for m in (1, 7, 100, 1000, 2):
        counts += np.bincount(g.route(np.zeros(m, dtype=np.uint64)), minlength=4)
        total += m
        share = total * np.array([1.0, 1.0, 0.5, 0.25]) / 2.75
        assert np.abs(counts - share).max() <= 1.0 + 1e-9
    g.on_capacity(3, 1.0)  # a change as it happens
    more = np.bincount(g.route(np.zeros(350, dtype=np.uint64)), minlength=4)
    assert np.abs(more - 350 * np.array([1.0, 1.0, 0.5, 1.0]) / 3.5).max() <= 2.0


def test_wrr_routes_nothing_to_a_departed_worker() -> None:
    g = make_grouping("wrr", 3, seed=1)
    g.remove_worker(1)
    w = g.route(np.zeros(300, dtype=np.uint64))
    assert 1 not in w and set(np.unique(w)) == {0, 2}
    with pytest.raises(ValueError, match="capacity must be > 0"):
        g.on_capacity(0, 0.0)


# ----------------------------------------------------------------------------- load jumps


def _skewed_epochs(ctl: AcgController, t: float, weights: np.ndarray, epochs: int,
                   load: float = 4000.0) -> float:
    """``epochs`` 1 s epochs of ``load`` msgs/s spread over the VWs by
    ``weights``, from one source; four equal workers always busy."""
    for _ in range(epochs):
        ctl.report_routed(0, t, t + 1.0, np.arange(len(weights)),
                          load * weights / weights.sum())
        t += 1.0
        for w in range(4):
            ctl.report(w, 1000, 1.0, t)
        ctl.tick(t)
    return t


def test_a_vw_load_that_jumps_two_ticks_in_a_row_is_followed_at_once() -> None:
    """A hot key lands on VW 0 (its load x10): the estimate starts over from the
    new count after two ticks, instead of creeping up at ``load_tau_s``."""
    ctl = AcgController(4, 4 * R, t0=0.0, load_tau_s=20.0)
    even = np.ones(4 * R)
    t = _skewed_epochs(ctl, 0.0, even, 10)
    assert ctl.stats.load_resets == 0
    hot = even.copy()
    hot[0] = 10.0
    t = _skewed_epochs(ctl, t, hot, 1)
    assert ctl.stats.load_resets == 0  # one tick could be a burst
    assert ctl.vw_rate is not None and ctl.vw_rate[0] < 2 * 4000.0 / even.sum()
    t = _skewed_epochs(ctl, t, hot, 2)
    assert ctl.stats.load_resets >= 1
    assert ctl.vw_rate[0] == pytest.approx(4000.0 * 10.0 / hot.sum(), rel=0.02)


def test_a_one_tick_burst_and_a_stream_that_slows_as_a_whole_move_no_estimate() -> None:
    ctl = AcgController(4, 4 * R, t0=0.0, load_tau_s=20.0)
    even = np.ones(4 * R)
    burst = even.copy()
    burst[3] = 10.0
    t = _skewed_epochs(ctl, 0.0, even, 10)
    t = _skewed_epochs(ctl, t, burst, 1)
    t = _skewed_epochs(ctl, t, even, 3)
    t = _skewed_epochs(ctl, t, even, 3, load=500.0)  # everything 8x slower
    assert ctl.stats.load_resets == 0


def test_the_first_loads_wait_for_every_sources_first_report() -> None:
    """Workers report first (0.5 s), then the two sources (0.55 s, 0.6 s): the
    first load estimate holds both sources' counts from the run's start - no
    bucket is taken before a source has reported - and the first plan comes
    with it, not a report interval later."""
    ctl = AcgController(2, 2 * R, t0=0.0, sources=2)
    ids = np.arange(2 * R)
    a = np.where(ctl.owner == 0, 3.0, 1.0) * 10  # worker 0's VWs 3x as loaded
    b = a * 2
    for w, rate in ((0, 1000), (1, 1000)):
        ctl.report(w, rate // 2, 0.5, 0.5)
    assert ctl.tick(0.5) is None
    ctl.report_routed(0, 0.0, 0.55, ids, a)
    assert ctl.tick(0.55) is None and ctl.vw_rate is None  # source 1 still to come
    ctl.report_routed(1, 0.0, 0.6, ids, b)
    table = ctl.tick(0.6)
    assert ctl.vw_rate == pytest.approx(a / 0.55 + b / 0.6)
    assert table is not None and ctl.stats.plans == 1
    assert np.bincount(table.owner, minlength=2)[0] < R  # worker 0 sheds VWs


def test_a_source_that_never_reports_is_waited_for_two_epochs_at_most() -> None:
    ctl = AcgController(2, 2 * R, t0=0.0, sources=2, epoch_s=1.0)
    ids = np.arange(2 * R)
    for t in (0.5, 1.0, 1.5, 2.0):
        ctl.report_routed(0, t - 0.5, t, ids, np.ones(2 * R))
        for w in (0, 1):
            ctl.report(w, 250, 0.5, t)
        ctl.tick(t)
        assert (ctl.vw_rate is None) == (t < 2.0)



def test_a_source_reporting_less_often_than_two_epochs_keeps_its_counts() -> None:
    """Two sources paced at one batch every 1.2 s report that seldom (a
    report goes as a source routes). Ticks every half second must not take
    the buckets past their last reports as empty - and then drop the counts
    that arrive for them: the loads add up to what was routed, and so do the
    arrivals the backlogs are counted from."""
    ctl = AcgController(2, 2 * R, t0=0.0, sources=2, epoch_s=0.5)
    ids = np.arange(2 * R)
    load = 1000.0  # msgs/s per source
    events = [(round(0.5 * k, 6), "tick", -1) for k in range(1, 25)]
    # the first report a tenth of a second in (FIRST_PLAN_S), then one per batch
    events += [(0.1 if k == 0 else round(0.1 + 0.5 * s + 1.2 * k, 6), "report", s)
               for s in (0, 1) for k in range(10)]
    last = {0: 0.0, 1: 0.0}
    for t, kind, s in sorted(events):
        if kind == "report":
            since, last[s] = last[s], t
            ctl.report_routed(s, since, t, ids, np.full(2 * R, load * (t - since) / (2 * R)))
        else:
            for w in (0, 1):
                ctl.report(w, 500, 0.5, t)
            ctl.tick(t)
    assert ctl.vw_rate is not None
    assert ctl.vw_rate.sum() == pytest.approx(2 * load, rel=0.02)
    # every message routed up to the last complete bucket arrived at a worker
    assert ctl._arr_cum[-1].sum() == pytest.approx(2 * load * ctl._arr_t[-1], rel=0.02)


# ----------------------------------------------------------------------------- start-up and backlogs


def test_the_first_plan_comes_a_tenth_of_a_second_in() -> None:
    """A worker at a quarter of the other's speed: the first reports (0.1 s
    in: ``FIRST_PLAN_S``) already give the first plan, which moves VWs off
    the slow worker (it used to wait for 0.5 s of blind routing)."""
    ctl = AcgController(2, 2 * R, t0=0.0, sources=1)
    ctl.report(0, 50, 0.05, 0.1)  # 1000 msgs/s, idle half the time
    ctl.report(1, 25, 0.1, 0.1)  # 250 msgs/s, busy all along
    ctl.report_routed(0, 0.0, 0.1, np.arange(2 * R), np.full(2 * R, 100 / (2 * R)))
    table = ctl.tick(0.1)
    assert table is not None and ctl.stats.plans == 1
    assert np.bincount(table.owner, minlength=2)[1] <= R // 2


def test_a_first_report_with_nothing_served_yet_is_no_rate() -> None:
    """A worker whose first call is still in service (nothing served, time
    with work) is not measured at 0 - which would strip it of its VWs - until
    it has been busy a whole epoch without serving anything."""
    ctl = AcgController(2, 2 * R, t0=0.0, sources=1)
    ctl.report(0, 100, 0.1, 0.1)
    ctl.report(1, 0, 0.08, 0.1)  # its first call not done yet
    ctl.report_routed(0, 0.0, 0.1, np.arange(2 * R), np.full(2 * R, 100 / (2 * R)))
    assert ctl.tick(0.1) is None and ctl.rates[1].value is None  # no plan on a guess
    ctl.report(0, 100, 0.1, 0.2)
    ctl.report(1, 100, 0.1, 0.2)  # the call done: 100 messages in 0.18 s of work
    ctl.report_routed(0, 0.1, 0.2, np.arange(2 * R), np.full(2 * R, 100 / (2 * R)))
    ctl.tick(0.2)
    assert ctl.rates[1].value == pytest.approx(100 / 0.18)
    stalled = AcgController(2, 2 * R, t0=0.0, sources=1, epoch_s=0.5)
    for k in range(1, 7):  # worker 1 busy all along and serving nothing: measured at 0
        stalled.report(0, 100, 0.1, 0.1 * k)
        stalled.report(1, 0, 0.1, 0.1 * k)
        stalled.tick(0.1 * k)
    assert stalled.rates[1].value == 0.0


def test_backlog_is_what_a_worker_was_sent_and_did_not_serve_since_it_was_idle() -> None:
    """Worker 0 busy all along gets 200 more than it serves, then 100 more; a
    window it was idle in (busy 0.4 of 0.5 s) starts its count again at 0.
    Worker 1 is idle in every window: 0. (``min_gain=1``: no plan moves
    anything, so this is the accounting alone.)"""
    ctl = AcgController(2, 2 * R, t0=0.0, sources=1, epoch_s=0.5, min_gain=1.0)
    mine = [np.flatnonzero(ctl.owner == w) for w in (0, 1)]
    ids = np.concatenate(mine)
    t = 0.0
    for sent, served, busy, expect in (((600, 300), (400, 300), (0.5, 0.3), (200, 0)),
                                       ((300, 300), (400, 300), (0.5, 0.3), (100, 0)),
                                       ((300, 300), (300, 300), (0.4, 0.3), (0, 0))):
        t += 0.5
        counts = np.concatenate([np.full(R, sent[w] / R) for w in (0, 1)])
        ctl.report_routed(0, t - 0.5, t, ids, counts)
        for w in (0, 1):
            ctl.report(w, served[w], busy[w], t)
        ctl.tick(t)
        np.testing.assert_allclose(ctl.backlog(), expect, atol=1e-6)


def _fluid_run(drain_s: float, epochs: int = 12) -> tuple[list[float], np.ndarray]:
    """Two workers, 1000 and 250 msgs/s, offered 1000 msgs/s spread evenly over
    the VWs, reporting every 0.5 s (the first time at 0.5 s: half a second of
    blind routing, the slow worker getting twice its rate). A moved VW takes
    its share of its old owner's backlog along (the sources re-route what
    their outboxes hold). Returns the slow worker's true backlog (seconds of
    its work) after each epoch and the table."""
    cap, dt = np.array([1000.0, 250.0]), 0.5
    ctl = AcgController(2, 2 * R, t0=0.0, sources=1, epoch_s=dt, drain_s=drain_s)
    backlog, out, t = np.zeros(2), [], 0.0
    for _ in range(epochs):
        share = np.bincount(ctl.owner, minlength=2) / (2 * R)
        arrived = 1000.0 * dt * share
        served = np.minimum(backlog + arrived, cap * dt)
        backlog = backlog + arrived - served
        t += dt
        ctl.report_routed(0, t - dt, t, np.arange(2 * R), np.full(2 * R, 1000.0 * dt / (2 * R)))
        for w in (0, 1):
            ctl.report(w, int(round(served[w])), served[w] / cap[w], t)
        old = ctl.owner.copy()
        if ctl.tick(t) is not None:
            moved = np.zeros((2, 2))  # [from, to]: VWs
            for v in np.flatnonzero(old != ctl.owner):
                moved[old[v], ctl.owner[v]] += 1
            have = np.bincount(old, minlength=2)
            take = backlog * moved.sum(axis=1) / have
            backlog = backlog - take + moved.T @ (backlog / have)
        out.append(backlog[1] / cap[1])
    return out, ctl.owner


def test_a_backlogged_worker_sheds_vws_until_its_backlog_is_drained() -> None:
    """The backlog left by the blind start counts as load to drain within
    ``drain_s``: the first plan gives the slow worker fewer VWs than its rate
    alone would, and what is left of its backlog after each of the next two
    epochs is half or less of what is left without the drain term
    (``drain_s=0``, the old behaviour: the slow worker planned at the fast
    one's utilization, 0.8, drains at a fifth of its rate); then the table
    goes back to the capacity-proportional one."""
    with_drain, owner = _fluid_run(1.0)
    without, owner0 = _fluid_run(0.0)
    assert with_drain[0] <= without[0] / 2  # after the first plan: half as much left
    assert with_drain[1] <= without[1] / 2
    assert max(with_drain[2:]) == max(without[2:]) == 0.0
    proportional_share = 2 * R * 250 / 1250
    assert abs(np.bincount(owner, minlength=2)[1] - proportional_share) <= 1
    assert abs(np.bincount(owner0, minlength=2)[1] - proportional_share) <= 1


def test_a_saturated_cluster_drains_nothing() -> None:
    """Every worker busy all along: the backlogs are the sources' memory
    bounds, not a misplaced load - the same tables as without the drain
    term, though worker 0 was sent twice what worker 1 was."""
    tables = []
    for drain_s in (1.0, 0.0):
        ctl = AcgController(2, 2 * R, t0=0.0, sources=1, epoch_s=0.5, drain_s=drain_s)
        for k in range(1, 8):
            t = 0.5 * k
            ctl.report_routed(0, t - 0.5, t, np.arange(2 * R),
                              np.where(ctl.owner == 0, 2000.0, 1000.0) * 0.5 / R)
            ctl.report(0, 500, 0.5, t)
            ctl.report(1, 500, 0.5, t)
            ctl.tick(t)
        assert ctl.backlog()[0] > ctl.backlog()[1] > 0
        tables.append(ctl.owner.copy())
    np.testing.assert_array_equal(tables[0], tables[1])


def test_a_cluster_without_spare_capacity_drains_nothing_though_one_worker_idles() -> None:
    """Worker 0 (1000 msgs/s) filled a backlog at the start (its sources'
    memory bound) and then serves what it is sent; worker 1 (500 msgs/s) is
    busy 90% of each window from then on: below ``IDLE_BUSY``, so it counts as
    idle. Its spare, 50 msgs/s, is less than 5% of the cluster's 1500: there
    is nothing to drain into, and the tables are those without the drain term
    (with it, worker 0 would shed VWs onto worker 1 to drain a backlog that is
    its memory bound - the real engine's demo did so, and moved them back)."""
    tables = []
    for drain_s in (1.0, 0.0):
        ctl = AcgController(2, 2 * R, t0=0.0, sources=1, epoch_s=0.5, drain_s=drain_s)
        for k in range(1, 9):
            t, filling = 0.5 * k, k <= 3
            per_vw = np.where(ctl.owner == 0, (550.0 if filling else 500.0) / R, 225.0 / R)
            ctl.report_routed(0, t - 0.5, t, np.arange(2 * R), per_vw)
            ctl.report(0, 500, 0.5, t)
            ctl.report(1, 225, 0.5 if filling else 0.45, t)
            ctl.tick(t)
        assert ctl.backlog()[0] >= 100 and ctl.rates[1].idle
        tables.append(ctl.owner.copy())
    np.testing.assert_array_equal(tables[0], tables[1])


RATES = np.array([1000.0, 250.0])


def _ending_with_a_slow_backlog(drain_s: float) -> tuple[AcgController, np.ndarray]:
    """Workers at 1000 and 250 msgs/s, busy all along, one source routing
    625 messages per 0.5 s evenly over the VWs (the first half second blind,
    R VWs each: the slow worker gets twice its rate). Saturated, so no plan
    drains the backlog the blind start left on the slow worker. Then the
    source has routed its whole input, and says what its outboxes hold;
    returns the controller and each worker's backlog (in seconds of its
    work) just before."""
    ctl = AcgController(2, 2 * R, t0=0.0, sources=1, epoch_s=0.5, drain_s=drain_s)
    t = 0.0
    for _ in range(6):
        t += 0.5
        arrived = np.bincount(ctl.owner, minlength=2) * 625 / (2 * R)
        ctl.report_routed(0, t - 0.5, t, np.arange(2 * R), np.full(2 * R, 625 / (2 * R)))
        ctl.report(0, int(min(arrived[0], 500)), 0.5, t)
        ctl.report(1, 125, 0.5, t)
        ctl.tick(t)
    backlog = ctl.backlog()
    # the source's outboxes hold 90% of each backlog (the rest was sent), evenly by VW
    have = np.bincount(ctl.owner, minlength=2)
    queued = (0.9 * backlog / have)[ctl.owner]
    ctl.routed_from(0, RoutedReport(since=t, now=t + 0.1, vw_ids=np.arange(0),
                                    vw_counts=np.ones(0), queued=queued))
    return ctl, backlog / RATES


def test_at_the_streams_end_the_backlogs_are_planned_to_finish_together() -> None:
    """What is left once every source has routed its whole input is the
    backlogs: the answer to the report that says so moves VWs of the worker
    that would finish last - with what the source's outboxes hold for them,
    which it re-routes - to the other, so the last finish comes at least 40%
    sooner (here 0.86 s of the slow worker's work against 0.13 s of the
    fast one's before). ``drain_s=0`` (backlogs never count in plans) keeps
    the table."""
    ctl, before = _ending_with_a_slow_backlog(1.0)
    assert before[1] > 2 * before[0] > 0
    assert ctl.stats.end_plans == 1 and ctl.finished  # the last plan
    after = ctl.backlog() / RATES
    assert after.max() <= 0.6 * before.max() and after[0] > before[0]
    assert np.bincount(ctl.owner, minlength=2)[1] >= 1
    still, before0 = _ending_with_a_slow_backlog(0.0)
    assert still.stats.end_plans == 0 and still.finished
    np.testing.assert_allclose(still.backlog() / RATES, before0)


def test_a_change_the_worker_saw_is_planned_at_once_from_its_recent_rate() -> None:
    """A report that says the worker saw its rate change (``recent``) resets
    the rate to that recent one and plans at once - if it is beyond ``jump``
    of the estimate; within it, the report is an ordinary one."""
    sc = Script([1000.0] * 4, epoch_s=0.5)
    for _ in range(8):
        sc.epoch(dt=0.5)
    ctl = sc.ctl
    due = ctl._next_plan
    ctl.report_from(0, RateReport(90, 0.1, recent=(82, 0.1)), sc.t + 0.1)  # 820: within
    assert ctl._next_plan == due and ctl.tick(sc.t + 0.1) is None
    # the report's whole window straddles the change (700); the recent part is 400
    ctl.report_from(0, RateReport(70, 0.1, recent=(40, 0.1)), sc.t + 0.2)
    assert ctl._next_plan == pytest.approx(sc.t + 0.2) and sc.t + 0.2 < due
    table = ctl.tick(sc.t + 0.2)
    assert ctl.stats.rate_resets == 1
    assert ctl.summary()["rates"][0] == pytest.approx(400.0)
    assert table is not None and np.bincount(table.owner, minlength=4)[0] < R


def test_short_noisy_reports_move_nothing_on_a_homogeneous_cluster() -> None:
    """Reports of 0.1 s with 10% noise: no two in a row beyond ``jump``."""
    sc = Script([1000.0] * 8, noise=0.1, seed=5)
    for _ in range(300):
        sc.epoch(dt=0.1)
    assert sc.ctl.stats.rate_resets == 0
    assert sc.ctl.stats.moves == 0 and (sc.counts() == R).all()


def test_plan_counts_a_workers_extra_load() -> None:
    owner = np.repeat(np.arange(2, dtype=np.int32), 8)
    lam, rate = np.ones(16), np.ones(2)
    same, moved = plan_table(owner, lam, rate, [0, 1])
    assert moved == 0
    new, moved = plan_table(owner, lam, rate, [0, 1], extra=np.array([0.0, 4.0]))
    assert moved == 2 and np.bincount(new, minlength=2).tolist() == [10, 6]


def test_a_capacity_change_is_planned_at_the_report_that_confirms_it() -> None:
    """The second deviating report in a row is a capacity change (the rate is
    reset): the controller plans at once, not at its next epoch."""
    sc = Script([1000.0] * 4, epoch_s=0.5)
    for _ in range(12):  # reports every 0.25 s: every other one falls between plans
        sc.epoch(dt=0.25)
    assert sc.ctl._next_plan > sc.t + 0.2  # the last tick planned: the next is an epoch away
    before = len(sc.tables)
    sc.rates[0] = 400.0
    sc.epoch(dt=0.25)  # the first deviation: maybe noise, no reset
    assert sc.ctl.stats.rate_resets == 0
    planned_at = sc.ctl._next_plan
    sc.epoch(dt=0.25)  # the second, before the epoch's plan is due
    assert sc.t < planned_at
    assert sc.ctl.stats.rate_resets == 1
    assert len(sc.tables) > before and sc.counts()[0] < R  # worker 0 gave VWs away


@pytest.mark.parametrize("short", [True, False])
def test_a_speed_up_is_taken_at_once_from_an_idle_worker_while_the_cluster_is_short(
        short: bool) -> None:
    """The fast role moves: worker 0 slows (it says so, ``recent``) while
    worker 1 speeds up. Once the slow-down is known the cluster looks short of
    capacity (load 3,400 msgs/s, rates 200 + 3 x 1,000), and worker 1's first
    report of its new rate - mostly idle - is taken at once, with no second
    sample to confirm it. Without the slow-down the cluster has room, and the
    same report waits for the next, as any other deviation does."""
    sc = Script([1000.0] * 4, load=3400.0, epoch_s=0.5)
    for _ in range(12):
        sc.epoch(dt=0.5)
    ctl = sc.ctl
    t = sc.t
    if short:
        ctl.report_from(0, RateReport(40, 0.2, recent=(20, 0.1)), t + 0.1)
        ctl.tick(t + 0.1)
        assert ctl.summary()["rates"][0] == pytest.approx(200.0)
    resets = ctl.stats.rate_resets
    ctl.report(1, 510, 0.17, t + 0.3)  # 3,000 msgs/s, idle 15 of its window's 20 hundredths
    assert (ctl._next_plan == pytest.approx(t + 0.3)) == short  # else the epoch's, at t + 0.5
    ctl.tick(t + 0.3)
    assert ctl.stats.rate_resets == resets + short
    assert (ctl.summary()["rates"][1] == pytest.approx(3000.0)) == short
    if not short:
        ctl.tick(t + 0.5)  # the epoch's plan: one deviation, maybe noise
        assert ctl.stats.rate_resets == resets
        ctl.report(1, 850, 0.28, t + 0.8)  # the second in a row confirms it
        assert ctl._next_plan == pytest.approx(t + 0.8)
        ctl.tick(t + 0.8)
        assert ctl.stats.rate_resets == resets + 1
        assert ctl.summary()["rates"][1] == pytest.approx(3035.7, rel=1e-3)
