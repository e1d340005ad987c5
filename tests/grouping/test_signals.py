"""LoadSignaler: at most one signal per slot, thresholds respected, fake clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.grouping.signals import LoadSignaler


def test_thresholds_map_to_signals() -> None:
    for u, expected in ((0.95, -1), (0.86, -1), (0.85, 0), (0.80, 0), (0.75, 0), (0.5, 1), (0, 1)):
        s = LoadSignaler(slot_s=1.0)
        s.observe(0.0, u)
        assert s.take_signal(0.5) == 0  # slot 0 not finished yet
        assert s.take_signal(1.0) == expected, u
        assert s.take_signal(1.7) == 0  # already taken for slot 0


def test_slot_mean_is_time_weighted() -> None:
    s = LoadSignaler(slot_s=1.0)
    s.observe(0.0, 1.0)
    s.observe(0.25, 0.0)  # 1.0 for a quarter of the slot, 0 for the rest
    assert s.utilization_of_last_slot(1.0) == pytest.approx(0.25)
    assert s.take_signal(1.0) == 1
    s.observe(1.0, 2.0)  # queue above its nominal capacity: allowed
    s.observe(1.5, 0.8)
    assert s.utilization_of_last_slot(2.2) == pytest.approx(1.4)
    assert s.take_signal(2.2) == -1


def test_observation_starting_mid_slot_counts_only_the_covered_part() -> None:
    s = LoadSignaler(slot_s=0.5)
    s.observe(10.3, 0.9)  # slot 20 covers [10.0, 10.5)
    assert s.take_signal(10.6) == -1
    assert s.emitted == {"increase": 0, "decrease": 1}


def test_only_the_latest_completed_slot_counts() -> None:
    s = LoadSignaler(slot_s=1.0)
    s.observe(0.0, 0.99)
    s.observe(3.2, 0.1)  # slots 0..2 were busy, slot 3 idle
    assert s.take_signal(4.0) == 1  # stale overload is not reported late
    assert s.take_signal(4.9) == 0
    assert s.take_signal(5.0) == 1  # the low value is held through slot 4


def test_no_observation_no_signal() -> None:
    s = LoadSignaler()
    assert s.take_signal(100.0) == 0
    assert math.isnan(s.utilization_of_last_slot(100.0))


def test_validation_names_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"slot_s must be in \(0, 3600\] seconds \(got 0\)"):
        LoadSignaler(slot_s=0)
    with pytest.raises(ValueError, match="idle_below"):
        LoadSignaler(busy_above=0.7, idle_below=0.75)
    with pytest.raises(ValueError, match="utilization"):
        LoadSignaler().observe(0.0, -0.1)
    s = LoadSignaler()
    s.observe(5.0, 0.5)
    with pytest.raises(ValueError, match="backwards"):
        s.observe(4.0, 0.5)


@settings(max_examples=60, deadline=None)
@given(
    slot_s=st.sampled_from([0.1, 0.5, 1.0]),
    busy_above=st.floats(0.5, 1.2),
    gap=st.floats(0.0, 0.4),
    steps=st.lists(
        st.tuples(st.floats(0.0, 0.4), st.floats(0.0, 1.5), st.booleans()), min_size=1, max_size=120
    ),
)
def test_at_most_one_signal_per_slot_and_thresholds_respected(
    slot_s: float,
    busy_above: float,
    gap: float,
    steps: list[tuple[float, float, bool]],
) -> None:
    idle_below = busy_above - gap
    s = LoadSignaler(slot_s=slot_s, busy_above=busy_above, idle_below=max(0.0, idle_below))
    t = 0.0
    signalled_slots: list[int] = []
    for dt, u, ask in steps:
        t += dt
        s.observe(t, u)
        if ask:
            sig = s.take_signal(t)
            if sig != 0:
                slot = math.floor(t / slot_s)
                signalled_slots.append(slot)
                # the signal is about the slot just completed, and matches it
                mean = s.utilization_of_last_slot(t)
                assert (sig < 0 and mean > s.busy_above) or (sig > 0 and mean < s.idle_below)
    assert len(signalled_slots) == len(set(signalled_slots))
    assert sum(s.emitted.values()) == len(signalled_slots)
