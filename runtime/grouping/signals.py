"""Worker-side load signals for consistent grouping (CG paper, section 5.2).

A worker measures its own utilization over time slots of ``slot_s`` seconds
and, when it next acknowledges a batch, piggybacks at most one binary signal
per slot: *decrease* (-1, "I am busy") if the slot's utilization was above
``busy_above``, *increase* (+1, "I am idle, send more") if below
``idle_below``, nothing (0) otherwise. Used by both the simulator's workers
and the Ray worker actors; pure, clock passed in, no Ray.

What "utilization" means is the caller's choice, as long as it is a number
``>= 0`` where 1 means "exactly at capacity":
- queue length / queue capacity (sampled when convenient), or
- busy fraction: seconds spent serving / seconds elapsed over an interval.
Values above 1 are allowed (a queue past its nominal capacity).

``observe(now, u)`` means: utilization is ``u`` from ``now`` until the next
observation (a step function, sample-and-hold). A slot's utilization is the
time-weighted mean of that step function over the part of the slot it covers.
Slots are aligned to multiples of ``slot_s`` on the caller's clock. For a busy
fraction measured over the interval *ending* at ``now``, observe often
(per batch, much shorter than a slot): the attribution error is at most one
observation interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_THRESHOLD = 100.0
_NEVER = -(2**62)  # slot index before any slot


def validate_thresholds(busy_above: float, idle_below: float, slot_s: float) -> None:
    """Raise ``ValueError`` naming the parameter if the signal settings are bad."""
    for name, v in (("busy_above", busy_above), ("idle_below", idle_below), ("slot_s", slot_s)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number (got {v!r})")
    if not 0.0 < busy_above <= MAX_THRESHOLD:
        raise ValueError(f"busy_above must be in (0, {MAX_THRESHOLD}] (got {busy_above})")
    if not 0.0 <= idle_below <= busy_above:
        raise ValueError(f"idle_below must be in [0, busy_above={busy_above}] (got {idle_below})")
    if not 0.0 < slot_s <= 3600.0:
        raise ValueError(f"slot_s must be in (0, 3600] seconds (got {slot_s})")


@dataclass(frozen=True)
class WorkerSignals:
    """The worker-side load signals a grouping asks for (``Grouping.worker_signals``):
    each worker signals over slots of ``slot_s`` seconds, *decrease* above
    ``busy_above`` and *increase* below ``idle_below`` (utilization, 1 = at
    capacity). The defaults here are the only ones (CG's, section 5.2).
    Validated on construction (``validate_thresholds``)."""

    slot_s: float = 0.5
    busy_above: float = 0.85
    idle_below: float = 0.75

    def __post_init__(self) -> None:
        validate_thresholds(self.busy_above, self.idle_below, self.slot_s)
        # frozen: normalise ints from YAML to floats in place
        object.__setattr__(self, "slot_s", float(self.slot_s))
        object.__setattr__(self, "busy_above", float(self.busy_above))
        object.__setattr__(self, "idle_below", float(self.idle_below))


#: the default worker-side signal settings
DEFAULT_SIGNALS = WorkerSignals()


class LoadSignaler:
    """At most one increase/decrease signal per time slot, from observed utilization.

    ``observe(now, utilization)`` records a sample; ``take_signal(now)``
    returns the signal of the most recent *completed* slot (+1, -1 or 0) the
    first time it is asked for that slot, and 0 afterwards, so no more than
    one nonzero signal is emitted per slot. Slots with no observation at all
    (and none carried over from before) give 0. If ``take_signal`` is not
    called for several slots, only the latest completed one counts: a stale
    overload is not reported late.
    """

    def __init__(
        self,
        slot_s: float = DEFAULT_SIGNALS.slot_s,
        busy_above: float = DEFAULT_SIGNALS.busy_above,
        idle_below: float = DEFAULT_SIGNALS.idle_below,
    ) -> None:
        s = WorkerSignals(slot_s, busy_above, idle_below)  # validated
        self.slot_s, self.busy_above, self.idle_below = s.slot_s, s.busy_above, s.idle_below
        self._slot = _NEVER  # index of the slot being accumulated
        self._area = 0.0  # integral of utilization over the covered part of the slot
        self._covered = 0.0  # seconds of the slot covered by observations
        self._last_t = math.nan  # time of the last observation
        self._last_u = math.nan  # its value (held until the next observation)
        self._done_slot = _NEVER  # latest completed slot and its mean utilization
        self._done_u = math.nan
        self._emitted_slot = _NEVER  # latest slot whose signal was taken
        self.emitted = {"increase": 0, "decrease": 0}

    @classmethod
    def of(cls, settings: WorkerSignals) -> LoadSignaler:
        """A signaler with ``settings`` (what a grouping's ``worker_signals`` asked for)."""
        return cls(settings.slot_s, settings.busy_above, settings.idle_below)

    def _slot_of(self, t: float) -> int:
        return math.floor(t / self.slot_s)

    def _advance(self, now: float) -> None:
        """Integrate the held value up to ``now``, closing finished slots."""
        if math.isnan(self._last_t):
            return
        if now < self._last_t:
            raise ValueError(f"clock went backwards: {now} < {self._last_t}")
        u = self._last_u
        t = self._last_t
        cur = self._slot_of(now)
        while self._slot < cur:
            end = (self._slot + 1) * self.slot_s
            span = max(0.0, end - t)
            self._area += u * span
            self._covered += span
            self._close()
            self._slot += 1
            t = end
            if cur - self._slot > 1:
                # whole slots under the held value: only the last completed one matters
                self._slot = cur - 1
                t = self._slot * self.slot_s
        span = max(0.0, now - t)
        self._area += u * span
        self._covered += span
        self._last_t = now

    def _close(self) -> None:
        self._done_slot = self._slot
        self._done_u = self._area / self._covered if self._covered > 0 else self._last_u
        self._area = 0.0
        self._covered = 0.0

    def observe(self, now: float, utilization: float) -> None:
        """Utilization is ``utilization`` from ``now`` on (>= 0; 1 = at capacity)."""
        if not (utilization >= 0.0 and math.isfinite(utilization)):
            raise ValueError(f"utilization must be a finite number >= 0 (got {utilization})")
        if math.isnan(self._last_t):
            self._slot = self._slot_of(now)
            self._last_t = now
        else:
            self._advance(now)
        self._last_u = float(utilization)

    def utilization_of_last_slot(self, now: float) -> float:
        """Mean utilization of the latest completed slot (NaN if none)."""
        self._advance(now)
        if self._done_slot == self._slot_of(now) - 1:
            return self._done_u
        return math.nan

    def take_signal(self, now: float) -> int:
        """+1 increase, -1 decrease or 0; nonzero at most once per slot."""
        self._advance(now)
        prev = self._slot_of(now) - 1
        if self._done_slot != prev or prev <= self._emitted_slot:
            return 0
        self._emitted_slot = prev
        u = self._done_u
        if math.isnan(u):
            return 0
        if u > self.busy_above:
            self.emitted["decrease"] += 1
            return -1
        if u < self.idle_below:
            self.emitted["increase"] += 1
            return 1
        return 0
