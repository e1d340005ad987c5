"""ServiceEmulator: virtual clock, overshoot pay-back, stopped-time accounting."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.service import ServiceEmulator


class FakeTime:
    """A clock whose sleeps overshoot by ``overshoot_s`` and may be "stopped"."""

    def __init__(self, overshoot_s: float = 0.0) -> None:
        self.t = 100.0
        self.overshoot_s = overshoot_s
        self.stop_windows: list[tuple[float, float]] = []  # [start, end) process stopped
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        end = self.t + s + self.overshoot_s
        for a, b in self.stop_windows:  # a SIGSTOP during the sleep delays the wake-up
            if a < end and b > self.t:
                end = max(end, b + 1e-6)
        self.t = end


def test_finish_times_per_message() -> None:
    ft = FakeTime()
    em = ServiceEmulator(100.0, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    fin = em.serve(10)
    assert fin == pytest.approx(t0 + np.arange(1, 11) * 100e-6)  # idle before: starts now
    assert ft.t >= fin[-1]
    assert all(s <= em.slice_s + 1e-12 for s in ft.sleeps)


def test_rate_matches_cost_despite_overshoot() -> None:
    ft = FakeTime(overshoot_s=100e-6)
    em = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    for _ in range(200):
        em.serve(100)  # 20 ms of service each
    elapsed = ft.t - t0
    rate = 200 * 100 / elapsed
    assert rate == pytest.approx(1e6 / 200.0, rel=0.02)


def test_service_mode_scales_cost_by_capacity() -> None:
    ft = FakeTime()
    em = ServiceEmulator(100.0, capacity_scale=0.25, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    for _ in range(50):
        em.serve(100)
    assert 50 * 100 / (ft.t - t0) == pytest.approx(0.25 * 1e4, rel=0.02)
    em.set_capacity_scale(1.0)
    assert em.cost_s == pytest.approx(100e-6)


@pytest.mark.parametrize("duty", [0.7, 0.3, 0.1])
def test_stopped_time_is_not_service(duty: float) -> None:
    """A 100 ms SIGSTOP duty cycle: the achieved rate is ``duty`` of full rate."""
    ft = FakeTime(overshoot_s=60e-6)
    period = 0.1
    ft.stop_windows = [(ft.t + k * period + duty * period, ft.t + (k + 1) * period)
                       for k in range(400)]
    em = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    n = 0
    while ft.t - t0 < 20.0:
        em.serve(100)
        n += 100
    rate = n / (ft.t - t0)
    # half a 1 ms slice per 100 ms stop still counts as service: +0.005
    assert rate / 5000.0 == pytest.approx(duty + 0.005, abs=0.005)
    assert em.stopped_s == pytest.approx((1 - duty) * (ft.t - t0), rel=0.1)


def _stopped_clock(ft: FakeTime):
    """What the duty-cycle throttler publishes: seconds stopped in windows ended so far."""
    return lambda: sum(min(b, ft.t) - a for a, b in ft.stop_windows if a < ft.t)


@pytest.mark.parametrize("duty", [0.7, 0.3, 0.1])
def test_published_stopped_time_is_exact_and_late_wake_ups_are_service(duty: float) -> None:
    """With the throttler's published stopped time, the rate is exactly
    ``duty`` of full rate (no half-slice bonus), and a wake-up 2 ms late (a
    busy CPU, another thread holding the GIL) is not taken for a stop -
    guessing from the overshoot would lose that time."""
    ft = FakeTime(overshoot_s=2e-3)
    period = 0.1
    ft.stop_windows = [(ft.t + k * period + duty * period, ft.t + (k + 1) * period)
                       for k in range(400)]
    em = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep, stopped_clock=_stopped_clock(ft))
    t0 = ft.t
    n = 0
    while ft.t - t0 < 20.0:
        em.serve(100)
        n += 100
    rate = n / (ft.t - t0)
    assert rate / 5000.0 == pytest.approx(duty, abs=0.002)
    guessed = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep)
    t1 = ft.t
    ft.stop_windows = []
    for _ in range(50):
        guessed.serve(100)
    assert 5000 / (ft.t - t1) < 0.75 * 5000.0  # every late wake-up counted as a stop


def test_zero_service_time_does_not_sleep() -> None:
    ft = FakeTime()
    em = ServiceEmulator(0.0, clock=ft.clock, sleep=ft.sleep)
    fin = em.serve(5)
    assert list(fin) == [ft.t] * 5 and ft.sleeps == []
    assert len(em.serve(0)) == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="service_us"):
        ServiceEmulator(-1)
    with pytest.raises(ValueError, match="capacity_scale"):
        ServiceEmulator(1, capacity_scale=0)
