"""ServiceEmulator: virtual clock, overshoot pay-back, stopped-time accounting."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from conftest import FakeTime

from runtime.dataflow.reliability import Part
from runtime.dataflow.service import ServiceEmulator
from runtime.dataflow.settings import WorkerSettings
from runtime.dataflow.worker import WorkerCore
from runtime.hashing import hash_arrow
from runtime.operators import WorkerApp, builtin_operator

T0 = 100.0  # the fake clock's start


def test_finish_times_per_message() -> None:
    ft = FakeTime(T0)
    em = ServiceEmulator(100.0, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    fin = em.serve(10)
    assert fin == pytest.approx(t0 + np.arange(1, 11) * 100e-6)  # idle before: starts now
    assert ft.t >= fin[-1]
    assert all(s <= em.slice_s + 1e-12 for s in ft.sleeps)


def test_rate_matches_cost_despite_overshoot() -> None:
    ft = FakeTime(T0, overshoot_s=100e-6)
    em = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    for _ in range(200):
        em.serve(100)  # 20 ms of service each
    # every sleep wakes 100 us late and the next one pays it back: 4 s of service,
    # plus only the last wake-up's lateness
    assert ft.t - t0 == pytest.approx(200 * 100 * 200e-6 + 100e-6)


def test_service_mode_scales_cost_by_capacity() -> None:
    ft = FakeTime(T0)
    em = ServiceEmulator(100.0, capacity_scale=0.25, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    for _ in range(50):
        em.serve(100)
    assert ft.t - t0 == pytest.approx(50 * 100 * 100e-6 / 0.25)  # 400 us per message
    em.set_capacity_scale(1.0)
    assert em.cost_s == pytest.approx(100e-6)


@pytest.mark.parametrize("duty", [0.7, 0.3, 0.1])
def test_stopped_time_is_not_service(duty: float) -> None:
    """A 100 ms SIGSTOP duty cycle: the achieved rate is ``duty`` of full rate."""
    ft = FakeTime(T0, overshoot_s=60e-6)
    period = 0.1
    ft.stop_windows = [(ft.t + k * period + duty * period, ft.t + (k + 1) * period)
                       for k in range(400)]
    em = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep)
    t0 = ft.t
    n = 0
    while ft.t - t0 < 20.0:
        em.serve(100)
        n += 100
    elapsed = ft.t - t0
    rate = n / elapsed
    # half a 1 ms slice per 100 ms stop still counts as service: +0.005
    assert rate / 5000.0 == pytest.approx(duty + 0.005, abs=0.001)
    # every second is service or a stop, but for the last wake-up's lateness
    assert elapsed - n * 200e-6 - em.stopped_s == pytest.approx(60e-6, abs=1e-9)
    # the stops it guessed: the real ones, less under a slice (the bonus) per stop
    stops = [(a, min(b, ft.t)) for a, b in ft.stop_windows if a < ft.t]
    missed = sum(b - a for a, b in stops) - em.stopped_s
    assert 0 < missed < len(stops) * em.slice_s


def _stopped_clock(ft: FakeTime):
    """What the duty-cycle throttler publishes: seconds stopped in windows ended so far."""
    return lambda: sum(min(b, ft.t) - a for a, b in ft.stop_windows if a < ft.t)


@pytest.mark.parametrize("duty", [0.7, 0.3, 0.1])
def test_published_stopped_time_is_exact_and_late_wake_ups_are_service(duty: float) -> None:
    """With the throttler's published stopped time, the rate is exactly
    ``duty`` of full rate (no half-slice bonus), and a wake-up 2 ms late (a
    busy CPU, another thread holding the GIL) is not taken for a stop -
    guessing from the overshoot would lose that time."""
    ft = FakeTime(T0, overshoot_s=2e-3)
    period = 0.1
    ft.stop_windows = [(ft.t + k * period + duty * period, ft.t + (k + 1) * period)
                       for k in range(400)]
    em = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep, stopped_clock=_stopped_clock(ft))
    t0 = ft.t
    n = 0
    while ft.t - t0 < 20.0:
        em.serve(100)
        n += 100
    elapsed = ft.t - t0
    # exactly the stopped time the throttler published, none of the 2 ms late wake-ups
    assert em.stopped_s == pytest.approx(_stopped_clock(ft)(), abs=1e-9)
    assert 0 <= elapsed - n * 200e-6 - em.stopped_s <= 2e-3 + 1e-9  # the last one's
    # (the stream ends within a 20 ms serve of a period boundary: +-0.001)
    assert n / elapsed / 5000.0 == pytest.approx(duty, abs=0.001)
    guessed = ServiceEmulator(200.0, clock=ft.clock, sleep=ft.sleep)
    t1 = ft.t
    ft.stop_windows = []
    for _ in range(50):
        guessed.serve(100)
    # every 1 ms slice wakes 2 ms late, all taken for a stop: a third of full rate
    assert 5000 / (ft.t - t1) / 5000.0 == pytest.approx(1 / 3, abs=0.02)
    assert guessed.stopped_s == pytest.approx(ft.t - t1 - 50 * 100 * 200e-6, abs=2e-3)


def test_zero_service_time_does_not_sleep() -> None:
    ft = FakeTime(T0)
    em = ServiceEmulator(0.0, clock=ft.clock, sleep=ft.sleep)
    fin = em.serve(5)
    assert list(fin) == [ft.t] * 5 and ft.sleeps == []
    assert len(em.serve(0)) == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="service_us"):
        ServiceEmulator(-1)
    with pytest.raises(ValueError, match="capacity_scale"):
        ServiceEmulator(1, capacity_scale=0)


@pytest.mark.parametrize("throttle", ["service", "cpulimit"])
def test_a_service_throttled_worker_pays_late_wake_ups_back(throttle: str) -> None:
    """Nothing stops a ``throttle: service`` worker's process, so its
    emulator takes no late wake-up for a stop: on a busy machine (every 1 ms
    slice wakes 2 ms late) it still serves at its capacity's rate. An
    external ``cpulimit`` publishes no stopped time, so its emulator must
    guess, and loses those wake-ups."""
    ft = FakeTime(T0, overshoot_s=2e-3)
    w = WorkerCore(0, WorkerApp(builtin_operator("wordcount")),
                   WorkerSettings(service_us=200.0, capacity=0.5 if throttle == "service" else 1.0,
                                  throttle=throttle),
                   clock=ft.clock, sleep=ft.sleep, t0=ft.t)
    keys = pa.array([f"k{i % 7}" for i in range(100)])
    part = Part(None, pa.RecordBatch.from_arrays([keys], names=["key"]), hash_arrow(keys),
                np.array([ft.t]))
    t0 = ft.t
    for _ in range(50):
        w.enqueue(0, [part])
        assert w.step(timeout=0)
    rate = 5000 / (ft.t - t0)
    if throttle == "service":  # 400 us a message at 0.5: 2,500 msgs/s
        assert rate == pytest.approx(2500, rel=0.01)
        assert w.service.stopped_s == 0
    else:  # every slice's 2 ms taken for a stop: a third of 5,000 msgs/s
        assert rate == pytest.approx(5000 / 3, rel=0.03)
        assert w.service.stopped_s > 0
