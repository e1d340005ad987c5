"""Duty-cycle throttler: signal sequence with a fake kill, schedule, never leave a stop.

Fake clock and fake kill, except ``test_real_process_is_stopped_and_always_resumed``
(a real child process and the wall clock: e2e).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import FakeTime

from actors import throttle as throttle_mod
from actors.throttle import CpulimitThrottler, DutyCycleThrottler, StoppedClock, ThrottleError


@pytest.fixture(autouse=True)
def _stop_files_in_tmp(tmp_path, monkeypatch):
    """Throttlers publish stopped time per PID: fake PIDs' files go to a temp dir."""
    monkeypatch.setattr(throttle_mod, "STOP_DIR", str(tmp_path))


class FakeKill:
    def __init__(self, clock) -> None:
        self.clock = clock
        self.calls: list[tuple[float, int, str]] = []
        self.gone: set[int] = set()

    def __call__(self, pid: int, sig: int) -> None:
        if pid in self.gone:
            raise ProcessLookupError(pid)
        self.calls.append((round(self.clock(), 6), pid, signal.Signals(sig).name))


def test_cycle_stops_each_pid_for_its_share_of_the_period() -> None:
    clk = FakeTime(0.0)
    kill = FakeKill(clk.clock)
    th = DutyCycleThrottler(0.1, clock=clk.clock, kill=kill)
    th.set_capacity(11, 0.3)
    th.set_capacity(12, 0.7)
    th.set_capacity(13, 1.0)  # full speed: never signalled during cycles
    th.cycle(clk.wait)
    th.cycle(clk.wait)
    assert kill.calls == [
        (0.03, 11, "SIGSTOP"), (0.07, 12, "SIGSTOP"),
        (0.1, 11, "SIGCONT"), (0.1, 12, "SIGCONT"),
        (0.13, 11, "SIGSTOP"), (0.17, 12, "SIGSTOP"),
    ]
    th.release()
    assert {(p, s) for _, p, s in kill.calls[-3:]} == {
        (11, "SIGCONT"), (12, "SIGCONT"), (13, "SIGCONT")}


def test_stopped_time_is_published_before_each_sigcont() -> None:
    """A worker reads exactly how long it was stopped (not a late wake-up's
    guess): the total is written before the SIGCONT that ends each stop."""
    clk = FakeTime(0.0)
    reads: list[float] = []
    clock11 = StoppedClock(11)

    def kill(pid: int, sig: int) -> None:
        if sig == signal.SIGCONT and pid == 11:
            reads.append(clock11())  # what the process sees when it runs again

    th = DutyCycleThrottler(0.1, clock=clk.clock, kill=kill)
    th.set_capacity(11, 0.3)
    assert StoppedClock(11)() == 0.0  # published at 0 before the first stop
    for _ in range(3):
        th.cycle(clk.wait)
    assert reads == pytest.approx([0.07, 0.14])  # two stops ended, 70 ms each
    th.release()  # the third stop ends here
    assert StoppedClock(11)() == pytest.approx(0.21)
    assert StoppedClock(99)() == 0.0  # not throttled: nothing published
    th.stop()
    assert not os.path.exists(throttle_mod.stopped_path(11))


def test_each_period_start_is_published_with_the_stops_before_it() -> None:
    """A worker's rate meter takes its running share over whole periods: it
    reads when its latest period started, the first one too (nothing was
    stopped before it), and the stops before it, in one consistent read."""
    clk = FakeTime(5.0)
    seen: list[tuple[float, float] | None] = []
    clock11 = StoppedClock(11)

    def kill(pid: int, sig: int) -> None:
        if sig == signal.SIGCONT and pid == 11:
            seen.append(clock11.resumed())

    th = DutyCycleThrottler(0.1, clock=clk.clock, kill=kill)
    th.set_capacity(11, 0.3)
    assert clock11.resumed() is None  # set up: no period yet
    th.cycle(clk.wait)
    assert clock11.resumed() == pytest.approx((5.0, 0.0))  # never stopped before it
    for _ in range(2):
        th.cycle(clk.wait)
    assert seen == [pytest.approx((5.1, 0.07)), pytest.approx((5.2, 0.14))]
    assert clock11() == pytest.approx(0.14)
    th.stop()
    clock11.close()


def test_a_stopped_clock_built_before_its_throttler_reads_it_once_rearmed() -> None:
    """A worker is built before the run's throttler publishes; its run starts
    after: ``rearm`` (at ``start_run``) reads the file at once, instead of
    seeing no stop until ``retry_s`` after its miss and then all of them."""
    clk = FakeTime(0.0)
    clock12 = StoppedClock(12, retry_s=60.0)
    assert clock12() == 0.0  # nothing published yet: a miss
    th = DutyCycleThrottler(0.1, clock=clk.clock, kill=lambda pid, sig: None)
    th.set_capacity(12, 0.3)
    for _ in range(2):
        th.cycle(clk.wait)
    th.release()  # two stops of 70 ms published
    assert clock12() == 0.0  # within retry_s of the miss: not looked for again
    clock12.rearm()
    assert clock12() == pytest.approx(0.14)
    th.stop()
    clock12.close()


def test_schedule_applies_changes_at_their_time() -> None:
    clk = FakeTime(0.0)
    kill = FakeKill(clk.clock)
    th = DutyCycleThrottler(0.1, clock=clk.clock, kill=kill)
    th.set_capacity(5, 1.0)
    th.schedule([(0.2, 5, 0.5), (0.4, 5, 1.0)], t0=0.0)
    for _ in range(6):
        th.cycle(clk.wait)
    stops = [t for t, _, s in kill.calls if s == "SIGSTOP"]
    assert stops == [pytest.approx(0.25), pytest.approx(0.35)]
    assert [(p, c) for _, p, c in th.applied] == [(5, 0.5), (5, 1.0)]


def test_vanished_process_is_forgotten() -> None:
    clk = FakeTime(0.0)
    kill = FakeKill(clk.clock)
    th = DutyCycleThrottler(0.1, clock=clk.clock, kill=kill)
    th.set_capacity(7, 0.5)
    kill.gone.add(7)
    th.cycle(clk.wait)
    assert 7 not in th.capacities


class _FakeHalt(threading.Event):
    """The throttler's halt event on a fake clock: ``wait`` advances the clock."""

    def __init__(self, clk: FakeTime) -> None:
        super().__init__()
        self.clk = clk

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set():
            assert timeout is not None
            self.clk.sleep(timeout)
        return self.is_set()


def test_error_in_thread_still_resumes_everything() -> None:
    """The throttler's own thread dies of an error in its 3rd SIGSTOP: the error
    is kept, the thread ends, and the process it stopped is resumed by the
    thread itself (before anyone calls ``stop``)."""
    clk = FakeTime(0.0)
    sent: list[tuple[float, int, int]] = []

    def kill(pid: int, sig: int) -> None:
        sent.append((clk.t, pid, sig))
        if sig == signal.SIGSTOP and len(sent) > 3:
            raise PermissionError("boom")

    th = DutyCycleThrottler(0.02, clock=clk.clock, kill=kill)
    th._halt = _FakeHalt(clk)
    th.set_capacity(21, 0.5)
    th.start()
    assert th._thread is not None
    th._thread.join(timeout=10)
    assert not th._thread.is_alive()  # it ended on its own
    assert isinstance(th.error, PermissionError)
    stop, cont = signal.SIGSTOP, signal.SIGCONT
    # stop at 10 ms, resume at 20, stop at 30, resume at 40, stop at 50 (fails): resumed
    assert sent == [(pytest.approx(0.01), 21, stop), (pytest.approx(0.02), 21, cont),
                    (pytest.approx(0.03), 21, stop), (pytest.approx(0.04), 21, cont),
                    (pytest.approx(0.05), 21, stop), (pytest.approx(0.05), 21, cont)]
    th.stop()


@pytest.mark.e2e
def test_real_process_is_stopped_and_always_resumed() -> None:
    """A real child process: it is stopped part of the time, and running after stop()."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        with DutyCycleThrottler(0.1) as th:
            th.set_capacity(child.pid, 0.2)
            seen_stopped = False
            for _ in range(100):
                time.sleep(0.013)
                if _state(child.pid) == "T":
                    seen_stopped = True
                    break
            assert seen_stopped
        # stop() sent SIGCONT: the child leaves the stopped state (within 2 s)
        deadline = time.monotonic() + 2.0
        while _state(child.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.005)
        assert _state(child.pid) in ("S", "R")
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_cpulimit_missing_is_a_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cpulimit on it, installed or not
    with pytest.raises(ThrottleError, match="cpulimit is not installed"):
        CpulimitThrottler()


def test_bad_period() -> None:
    with pytest.raises(ValueError, match="period_s"):
        DutyCycleThrottler(0)


def _watchdogs(owner: int) -> list[int]:
    """PIDs of the dead man's switches that ``owner`` started."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if throttle_mod.WATCHDOG_NAME in cmd and cmd[-1] == str(owner):
            found.append(p.info["pid"])
    return found


def _wait_until(ok, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.01)


@pytest.mark.e2e
def test_a_killed_throttlers_stopped_process_is_resumed_by_its_dead_mans_switch() -> None:
    """The throttler's process is SIGKILLed while its target is stopped (as a Ray
    throttle actor dies with its raylet): the watchdog resumes the target. Timing
    free: the throttler is frozen (SIGSTOP) until it is seen holding the target
    stopped, and only then killed."""
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (f"import sys, time\nsys.path.insert(0, {root!r})\n"
            "from actors.throttle import DutyCycleThrottler\n"
            f"th = DutyCycleThrottler(0.05).start()\nth.set_capacity({target.pid}, 0.05)\n"
            "print('ready', flush=True)\ntime.sleep(600)\n")
    thr = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert thr.stdout is not None and thr.stdout.readline().strip() == "ready"
        assert len(_watchdogs(thr.pid)) == 1
        for _ in range(10_000):
            os.kill(thr.pid, signal.SIGSTOP)
            _wait_until(lambda: _state(thr.pid) == "T", "the throttler frozen")
            if _state(target.pid) == "T":
                break
            os.kill(thr.pid, signal.SIGCONT)
            time.sleep(0.003)
        assert _state(target.pid) == "T"
        thr.kill()
        thr.wait()
        _wait_until(lambda: _state(target.pid) != "T", "the target resumed")
        _wait_until(lambda: not _watchdogs(thr.pid), "the watchdog gone")
    finally:
        thr.kill()
        os.kill(target.pid, signal.SIGCONT)
        target.kill()
        target.wait()


@pytest.mark.e2e
def test_a_cleanly_stopped_throttlers_switch_exits_and_touches_nothing() -> None:
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        th = DutyCycleThrottler(0.05).start()
        th.set_capacity(target.pid, 0.5)
        assert len(_watchdogs(os.getpid())) == 1
        th.stop()
        _wait_until(lambda: not _watchdogs(os.getpid()), "the watchdog gone")
        os.kill(target.pid, signal.SIGSTOP)  # ours now, not the throttler's:
        time.sleep(0.2)  # nothing resumes it
        assert _state(target.pid) == "T"
    finally:
        os.kill(target.pid, signal.SIGCONT)
        target.kill()
        target.wait()


def test_a_fake_kill_starts_no_watchdog(fake_time) -> None:
    th = DutyCycleThrottler(0.1, clock=fake_time.clock, kill=FakeKill(fake_time.clock))
    th.set_capacity(11, 0.5)
    assert th._switch is None and not _watchdogs(os.getpid())
    th.stop()
