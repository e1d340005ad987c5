"""Heterogeneity by throttling: SIGSTOP/SIGCONT duty cycles on worker processes.

``DutyCycleThrottler`` (plain class; the clock, sleep and ``kill`` are
injected) runs one thread that, every ``period_s`` (100 ms, cpulimit-style),
lets each throttled PID run for ``capacity * period_s`` and keeps it stopped
for the rest. It follows a capacity schedule (``workers.changes``: ``at_s``
seconds after the run start). PIDs at capacity >= 1 are never stopped.

``CpulimitThrottler`` runs the Debian ``cpulimit`` binary per PID instead
(``workers.throttle: cpulimit``). cpulimit limits *CPU usage*, so it slows a
CPU-bound process; a worker whose service time is emulated with sleeps uses
little CPU and is barely slowed by it - use ``duty-cycle`` for sleep-emulated
work (see docs/design.md, "Facts about the platform").

Exact stopped time: a duty-cycle throttler publishes, for every process it
throttles, the seconds it has kept it stopped so far and when its latest
period started, in a small file on its node (``stopped_path(pid)``, in
``/dev/shm``), updated at each period's start, just before the SIGCONT. A
worker's service emulator reads it (``StoppedClock``) to know how much of a
sleep was a stop - exactly, where guessing from the sleep's overshoot also
counts a late wake-up (GIL, busy CPU) as a stop - and its rate meter to take
its running share over whole periods (``runtime.dataflow.worker.LoadMeter``).

Safety: every PID ever stopped gets SIGCONT on ``stop()``, when the thread
exits for any reason (also on exceptions), and at interpreter exit; a
throttler is also a context manager. A process must never be left stopped,
also when the throttler's own process dies at once (SIGKILL, or a Ray actor
whose raylet is gone): a throttler that signals for real starts a
``DeadMansSwitch``, a small watchdog process told every PID the throttler
touches, which resumes them all when the throttler's process ends without
saying goodbye.

Multi-node: a throttler only signals processes of its own machine. The driver
runs one in a thread for the workers on its node, and ``ThrottleActor`` (the
same class behind ``ray.remote``, pinned to a node) for every other node.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

Clock = Callable[[], float]

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _release_all() -> None:  # pragma: no cover - interpreter exit
    for t in list(_LIVE):
        try:
            t.stop()
        except Exception:
            pass


class ThrottleError(RuntimeError):
    pass


#: where throttlers publish stopped time (tmpfs when there is one)
STOP_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
#: seconds stopped so far, and the clock time at which the latest period
#: started (0: none yet)
_STOP_FMT = struct.Struct("dd")


def stopped_path(pid: int) -> str:
    return os.path.join(STOP_DIR, f"hetero-stream-stopped-{int(pid)}")


def publish_stopped(pid: int, seconds: float, period_start: float = 0.0) -> None:
    """Write ``pid``'s total stopped seconds and its latest period's start
    (one 16-byte write; ``StoppedClock`` reads until two reads agree)."""
    fd = os.open(stopped_path(pid), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, _STOP_FMT.pack(float(seconds), float(period_start)), 0)
    finally:
        os.close(fd)


class StoppedClock:
    """Seconds this process (``pid``) has been kept stopped by a duty-cycle
    throttler of its node, as published by it; 0 while it publishes nothing
    (not throttled). Cheap: one ``pread`` per call once the file exists."""

    def __init__(self, pid: int | None = None, retry_s: float = 0.5) -> None:
        self.path = stopped_path(os.getpid() if pid is None else pid)
        self.retry_s = retry_s
        self._fd: int | None = None
        self._next_try = 0.0

    def __call__(self) -> float:
        seen = self._read()
        return 0.0 if seen is None else seen[0]

    def resumed(self) -> tuple[float, float] | None:
        """When this process's latest throttle period started (clock time)
        and the seconds it was stopped before; None before the first."""
        seen = self._read()
        return None if seen is None or seen[1] <= 0 else (seen[1], seen[0])

    def _read(self) -> tuple[float, float] | None:
        if self._fd is None:
            now = time.monotonic()
            if now < self._next_try:
                return None
            self._next_try = now + self.retry_s
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return None
        data, again = b"", os.pread(self._fd, _STOP_FMT.size, 0)
        while data != again:  # a write came between: it may have been half done
            data, again = again, os.pread(self._fd, _STOP_FMT.size, 0)
        if len(data) != _STOP_FMT.size:
            return None
        seconds, start = _STOP_FMT.unpack(data)
        return seconds, start

    def rearm(self) -> None:
        """Look for the throttler's file at the next call, not ``retry_s``
        after the last miss: a run starts now, and its throttler published
        before (``WorkerActor.start_run``). Without it, a worker built less
        than ``retry_s`` before its run read no stops in its run's first
        ``retry_s``, then all of them at once: its first rate reports said
        it ran at up to twice its capacity."""
        self._next_try = 0.0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


#: the watchdog (``python -S -c``): detaches from its parent (so a Ray worker's
#: exit, which ends its children, does not end it), then reads ``c PID`` (resume
#: it), ``t PID`` (a cpulimit process: terminate it, it resumes its target),
#: ``u PID`` (forget a ``t``) and ``q`` (a clean stop: do nothing) lines until
#: EOF - which comes when the throttler's process ends, however it ends
WATCHDOG_NAME = "hetero-stream-throttle-watchdog"  # in its command line, with our PID
_WATCHDOG = """
import os, signal, sys
if os.fork():
    os._exit(0)
cont, term = set(), set()
for line in sys.stdin.buffer:
    op, _, pid = line.strip().partition(b" ")
    if op == b"q":
        sys.exit(0)
    if op == b"u":
        term.discard(int(pid))
    elif op in (b"c", b"t"):
        (cont if op == b"c" else term).add(int(pid))
for sig, pids in ((signal.SIGTERM, term), (signal.SIGCONT, cont)):
    for pid in pids:
        if pid > 1:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
"""


class DeadMansSwitch:
    """A watchdog process that resumes every PID it was told of once this
    process ends without ``close()`` (killed, crashed): it holds the read end of
    a pipe whose only write end is ours, so it sees EOF exactly then."""

    def __init__(self) -> None:
        r, w = os.pipe()  # both ends close-on-exec: no other child inherits ours
        try:
            launcher = subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHDOG, WATCHDOG_NAME, str(os.getpid())],
                stdin=r, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            launcher.wait(timeout=30)  # it forks the watchdog and returns at once
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._w: int | None = w
        self._told: set[tuple[str, int]] = set()

    def _say(self, line: str) -> None:
        if self._w is not None:
            with contextlib.suppress(OSError):
                os.write(self._w, line.encode() + b"\n")

    def guard(self, pid: int, op: str = "c") -> None:
        """``c``: resume ``pid``; ``t``: terminate ``pid`` (a helper process);
        ``u``: forget a ``t`` (the helper ended: its PID may be reused)."""
        if op == "u":
            self._told.discard(("t", pid))
        elif (op, pid) in self._told:
            return
        else:
            self._told.add((op, pid))
        self._say(f"{op} {pid}")

    def close(self) -> None:
        """A clean stop: the watchdog exits and does nothing."""
        if self._w is not None:
            self._say("q")
            os.close(self._w)
            self._w = None


def _switch_for(kill: Callable[[int, int], None]) -> DeadMansSwitch | None:
    """A switch for a throttler that signals for real (not a test's fake ``kill``)."""
    return DeadMansSwitch() if kill is os.kill else None


class DutyCycleThrottler:
    """Duty-cycle throttling of local PIDs to their capacities; see the module docstring."""

    def __init__(
        self,
        period_s: float = 0.1,
        *,
        clock: Clock = time.time,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0 (got {period_s})")
        self.period_s = float(period_s)
        self.clock = clock
        self.kill = kill
        self.capacities: dict[int, float] = {}
        self._schedule: list[tuple[float, int, float]] = []  # (absolute time, pid, capacity)
        self._stopped: dict[int, float] = {}  # PIDs stopped and not resumed: since when
        self._stopped_total: dict[int, float] = {}  # published stopped seconds per PID
        self._period_start: dict[int, float] = {}  # published: each PID's latest period start
        self._ever: set[int] = set()
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.applied: list[tuple[float, int, float]] = []  # changes applied (time, pid, cap)
        self.error: BaseException | None = None
        self.cycles = 0
        self._switch: DeadMansSwitch | None = None
        _LIVE.add(self)

    def _track(self, pid: int) -> None:
        """``pid`` may be stopped from now on: the dead man's switch resumes it."""
        if pid not in self._ever:
            self._ever.add(pid)
            if self._switch is None:
                self._switch = _switch_for(self.kill)
            if self._switch is not None:
                self._switch.guard(pid)

    # ------------------------------------------------------------------ configuration
    def set_capacity(self, pid: int, capacity: float) -> None:
        if not capacity > 0:
            raise ValueError(f"capacity must be > 0 (got {capacity} for pid {pid})")
        with self._lock:
            self.capacities[int(pid)] = float(capacity)
            self._track(int(pid))
            self._publish(int(pid))

    def schedule(self, changes: Iterable[tuple[float, int, float]], t0: float) -> None:
        """Capacity changes ``(at_s, pid, capacity)``, ``at_s`` seconds after ``t0``."""
        with self._lock:
            self._schedule += [(t0 + float(at), int(pid), float(c)) for at, pid, c in changes]
            self._schedule.sort()

    def _apply_due(self, now: float) -> None:
        while self._schedule and self._schedule[0][0] <= now:
            _, pid, cap = self._schedule.pop(0)
            self.capacities[pid] = cap
            self._track(pid)
            self.applied.append((now, pid, cap))

    # ------------------------------------------------------------------ signals
    def _signal(self, pid: int, sig: int) -> bool:
        try:
            self.kill(pid, sig)
            return True
        except ProcessLookupError:  # the process is gone: forget it
            self.capacities.pop(pid, None)
            self._stopped.pop(pid, None)
            return False

    def _publish(self, pid: int) -> None:
        try:
            publish_stopped(pid, self._stopped_total.get(pid, 0.0),
                            self._period_start.get(pid, 0.0))
        except OSError:  # no shared file: the worker guesses stops from its sleeps
            pass

    def _stop_pid(self, pid: int) -> None:
        # mark first: if the kill races with release, release will SIGCONT it
        self._stopped[pid] = self.clock()
        if not self._signal(pid, signal.SIGSTOP):
            self._stopped.pop(pid, None)

    def _end_stop(self, pid: int, period_start: float | None = None) -> None:
        """Publish the stop of ``pid`` that ends now (before its SIGCONT, so the
        process, when it runs again, already reads a total that includes it),
        and ``period_start``: the period that starts with it (``release``:
        none - the process runs from now on)."""
        since = self._stopped.pop(pid, None)
        if since is not None:
            now = self.clock()
            self._stopped_total[pid] = self._stopped_total.get(pid, 0.0) + max(0.0, now - since)
            self._period_start[pid] = now if period_start is None else period_start
            self._publish(pid)

    def release(self) -> None:
        """SIGCONT every PID this throttler ever touched (idempotent)."""
        with self._lock:
            stopped = list(self._stopped)
            for pid in stopped:
                self._end_stop(pid)
            pids = set(stopped) | set(self._ever)
        for pid in pids:
            try:
                self.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass

    # ------------------------------------------------------------------ the cycle
    def cycle(self, wait: Callable[[float], bool]) -> None:
        """One period: run everyone, stop each PID after ``capacity * period``.

        ``wait(seconds)`` sleeps and returns True if the throttler was halted.
        """
        start = self.clock()
        with self._lock:
            self._apply_due(start)
            plan = sorted((c, pid) for pid, c in self.capacities.items() if c < 1.0)
            for pid in list(self._stopped):
                self._end_stop(pid, start)
                self._signal(pid, signal.SIGCONT)
            for _, pid in plan:  # one not stopped in the last period: its first
                if self._period_start.get(pid) != start:
                    self._period_start[pid] = start
                    self._publish(pid)
        self.cycles += 1
        for cap, pid in plan:
            delay = start + cap * self.period_s - self.clock()
            if delay > 0 and wait(delay):
                return
            with self._lock:
                if self.capacities.get(pid, 1.0) < 1.0:
                    self._stop_pid(pid)
        delay = start + self.period_s - self.clock()
        if delay > 0:
            wait(delay)

    def _run(self) -> None:
        try:
            while not self._halt.is_set():
                self.cycle(self._halt.wait)
        except BaseException as e:  # never leave a process stopped
            self.error = e
        finally:
            self.release()

    def start(self) -> DutyCycleThrottler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="throttle", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.release()
        for pid in self._ever:
            with contextlib.suppress(OSError):
                os.unlink(stopped_path(pid))
        if self._switch is not None:
            self._switch.close()
        _LIVE.discard(self)

    def status(self) -> dict[str, Any]:
        return {"capacities": dict(self.capacities), "cycles": self.cycles,
                "applied": list(self.applied),
                "error": repr(self.error) if self.error else None}

    def __enter__(self) -> DutyCycleThrottler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CpulimitThrottler:
    """One ``cpulimit -p PID -l PCT`` process per throttled PID (Debian binary)."""

    def __init__(self, binary: str | None = None, *, clock: Clock = time.time,
                 kill: Callable[[int, int], None] = os.kill) -> None:
        found = binary or shutil.which("cpulimit")
        if not found:
            raise ThrottleError(
                "workers.throttle: cpulimit is not installed (apt-get install cpulimit), "
                "or use throttle: duty-cycle"
            )
        self.binary = found
        self.clock = clock
        self.kill = kill
        self.capacities: dict[int, float] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._schedule: list[tuple[float, int, float]] = []
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.applied: list[tuple[float, int, float]] = []
        self.error: BaseException | None = None
        self._switch: DeadMansSwitch | None = None
        _LIVE.add(self)

    def _launch(self, pid: int, cap: float) -> None:
        old = self._procs.pop(pid, None)
        if old is not None:
            self._end(old)
            self._cont(pid)
        if cap < 1.0:
            pct = max(1, round(cap * 100))
            if self._switch is None:
                self._switch = _switch_for(self.kill)
            p = self._procs[pid] = subprocess.Popen(
                [self.binary, "-p", str(pid), "-l", str(pct)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._switch is not None:
                self._switch.guard(pid)
                self._switch.guard(p.pid, "t")

    def _end(self, p: subprocess.Popen[bytes]) -> None:
        _terminate(p)
        if self._switch is not None:
            self._switch.guard(p.pid, "u")

    def _cont(self, pid: int) -> None:
        try:
            self.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass

    def set_capacity(self, pid: int, capacity: float) -> None:
        with self._lock:
            self.capacities[int(pid)] = float(capacity)
            if self._thread is not None:
                self._launch(int(pid), float(capacity))

    def schedule(self, changes: Iterable[tuple[float, int, float]], t0: float) -> None:
        with self._lock:
            self._schedule += [(t0 + float(at), int(pid), float(c)) for at, pid, c in changes]
            self._schedule.sort()

    def _run(self) -> None:
        try:
            while not self._halt.wait(0.05):
                with self._lock:
                    now = self.clock()
                    while self._schedule and self._schedule[0][0] <= now:
                        _, pid, cap = self._schedule.pop(0)
                        self.capacities[pid] = cap
                        self.applied.append((now, pid, cap))
                        self._launch(pid, cap)
        except BaseException as e:
            self.error = e
        finally:
            self.release()

    def start(self) -> CpulimitThrottler:
        with self._lock:
            for pid, cap in self.capacities.items():
                self._launch(pid, cap)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cpulimit", daemon=True)
                self._thread.start()
        return self

    def release(self) -> None:
        with self._lock:
            procs, self._procs = self._procs, {}
            for pid, p in procs.items():
                self._end(p)
                self._cont(pid)
            for pid in self.capacities:
                self._cont(pid)

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.release()
        if self._switch is not None:
            self._switch.close()
        _LIVE.discard(self)

    def status(self) -> dict[str, Any]:
        return {"capacities": dict(self.capacities), "applied": list(self.applied),
                "error": repr(self.error) if self.error else None}

    def __enter__(self) -> CpulimitThrottler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=2)


def make_throttler(mode: str, period_s: float = 0.1) -> DutyCycleThrottler | CpulimitThrottler:
    """``duty-cycle`` or ``cpulimit`` (``service`` mode needs no throttler)."""
    if mode == "duty-cycle":
        return DutyCycleThrottler(period_s)
    if mode == "cpulimit":
        return CpulimitThrottler()
    raise ValueError(f"workers.throttle: no process throttler for mode {mode!r}")


class ThrottleActor:
    """A throttler for the workers of one node (``ray.remote`` + node affinity).

    Same methods as the local throttlers; ``stop`` resumes everything.
    """

    def __init__(self, mode: str, period_s: float = 0.1) -> None:
        self.t = make_throttler(mode, period_s)

    def set_capacity(self, pid: int, capacity: float) -> None:
        self.t.set_capacity(pid, capacity)

    def schedule(self, changes: list[tuple[float, int, float]], t0: float) -> None:
        self.t.schedule(changes, t0)

    def start(self) -> None:
        self.t.start()

    def stop(self) -> dict[str, Any]:
        self.t.stop()
        return self.t.status()

    def status(self) -> dict[str, Any]:
        return self.t.status()


def actor_class() -> Any:
    import ray

    return ray.remote(ThrottleActor)
