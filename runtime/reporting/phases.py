"""Where a run's wall time goes: ``report.json``'s ``phases`` (seconds).

One clock per process, its origin the command's start (``begin``: the
process's creation, so the interpreter's and the imports' time count). Each
engine marks what it reaches; ``phases`` turns the marks into the report's
block. The phases of a run, in order (docs/benchmarks.md, "Where a run's
time goes"):

- ``startup``: from the command's start until the engine is up (Ray started
  or attached, Spark/RayDP up; the simulator: its imports). 0 for a run in a
  session that was already up (``runtime.compare``'s later runs, a notebook).
- ``input``: from then until every source holds its first data (Spark reads
  the input and hands it to Ray, the actors start; the simulator: reading the
  input). A chunked input keeps loading during the stream: this is until the
  first chunk is in.
- ``first_message``: seconds *from the command's start* (not a duration) to
  the first message routed: the moment the sources are told to go, each
  holding its first batch (they route it at once). For a later run in a
  shared session, from that run's start instead.
- ``stream``: from the first message to the last one processed (and acked):
  the report's ``duration_s`` (the simulator: its wall time simulating).
- ``finish``: from the last message processed until the command returns:
  result, report, summary, plot and the engine's shut-down.

``startup + input + stream + finish`` is the run's wall time; ``total`` is it
as measured. ``startup_parts`` (the first run only) splits the start-up:
``python`` (interpreter, imports, checks), ``ray``, ``spark``. ``finish_parts`` splits ``finish``: ``outputs`` (the actors'
statistics, ``result.parquet`` and ``report.json`` written: the result is
safe), ``plot`` (``report.png``) and ``shutdown`` (Spark and Ray stopped).
A block written while the command still runs (the summary is printed, and
``report.json`` first written, before the plot and the shut-down) has
``final: false`` and its ``finish`` so far; ``report.json`` is rewritten with
the final block at the end.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the keys every ``phases`` block has (the contract), in order
PHASES = ("startup", "input", "first_message", "stream", "finish")

_lock = threading.Lock()
_origin: float | None = None
_ready: float | None = None  # the engine came up
_session_used = False  # a run already took the start-up
_startup_parts: dict[str, float] = {}  # the engine's start-up, step by step


def process_start() -> float:
    """When this process was created (``time.time`` scale); now if unknown.
    On Linux from ``/proc`` (to 10 ms: the kernel's start time against its
    uptime; psutil's rounds the boot time to the second), else psutil's."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return float(psutil.Process(os.getpid()).create_time())
    except Exception:  # noqa: BLE001 - no psutil either: from now on
        return time.time()


def begin(origin: float | None = None) -> float:
    """Set the clock's origin (default: the process's creation): an entry
    point calls this first. Returns the origin."""
    global _origin, _ready, _session_used
    with _lock:
        _origin = process_start() if origin is None else origin
        _ready, _session_used = None, False
        _startup_parts.clear()
        return _origin


def origin() -> float | None:
    return _origin


def engine_ready(at: float | None = None) -> None:
    """The engine is up (Ray and Spark, or the simulator's imports). Without
    an origin (no entry point called ``begin``: a notebook, a test) the clock
    starts here, with no start-up measured."""
    global _origin, _ready
    now = time.time() if at is None else at
    with _lock:
        if _origin is None:
            _origin = now
        _ready = now


def startup_step(name: str, start: float, end: float | None = None) -> None:
    """A step of the engine's start-up (``ray``: Ray started or attached,
    ``spark``: RayDP's Spark session up), from ``start`` to ``end`` (default
    now); the first run's ``startup_parts`` show them, with ``python``: the
    command's start until the first step (interpreter, imports, checks)."""
    with _lock:
        if _origin is not None and "python" not in _startup_parts:
            _startup_parts["python"] = start - _origin
        _startup_parts[name] = (time.time() if end is None else end) - start


def take_startup() -> tuple[float, float]:
    """For a run that starts now: ``(origin, startup)``. The first run after
    ``engine_ready`` gets the start-up and the command's origin; later runs
    (a shared session) start at their own start with ``startup`` 0."""
    global _session_used
    now = time.time()
    with _lock:
        if _ready is None or _session_used or _origin is None:
            return now, 0.0
        _session_used = True
        return _origin, max(0.0, _ready - _origin)


class RunClock:
    """One run's marks (``time.time``): the first message (``start``, the
    sources told to go), the last one processed (``end``) and the finish's
    parts (``part``); ``block`` is the ``phases`` block so far."""

    def __init__(self, origin: float, startup: float,
                 startup_parts: dict[str, float] | None = None) -> None:
        self.origin, self.startup = origin, startup
        self.startup_parts = dict(startup_parts or {})
        self.t0: float | None = None
        self.last_ts: float | None = None
        self.parts: dict[str, float] = {}
        self.input_parts: dict[str, float] = {}

    @classmethod
    def take(cls) -> RunClock:
        """The clock of a run starting now (``take_startup``)."""
        origin, startup = take_startup()
        return cls(origin, startup, dict(_startup_parts) if startup > 0 else None)

    def start(self, t0: float) -> None:
        self.t0 = t0

    def end(self, last_ts: float) -> None:
        self.last_ts = last_ts

    def part(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    def input_part(self, name: str, seconds: float) -> None:
        """A step of the input phase (``input_parts``): e.g. ``plan``,
        ``first_block``, ``sources`` of a real run."""
        self.input_parts[name] = self.input_parts.get(name, 0.0) + seconds

    def since_end(self, now: float | None = None) -> float:
        """Seconds since the last message was processed."""
        now = time.time() if now is None else now
        return max(0.0, now - (self.last_ts if self.last_ts is not None else now))

    def block(self, *, final: bool = False, now: float | None = None) -> dict[str, Any]:
        """The ``phases`` block at ``now`` (default: now)."""
        now = time.time() if now is None else now
        t0 = self.t0 if self.t0 is not None else now
        last = self.last_ts if self.last_ts is not None else t0
        ready = self.origin + self.startup

        def s(x: float) -> float:
            return round(max(0.0, x), 3)

        out = {
            "startup": s(self.startup),
            "input": s(t0 - ready),
            "first_message": s(t0 - self.origin),
            "stream": s(last - t0),
            "finish": s(now - last),
            "total": s(now - self.origin),
            "finish_parts": {k: s(v) for k, v in self.parts.items()},
            "final": final,
        }
        if self.startup_parts:
            out["startup_parts"] = {k: s(v) for k, v in self.startup_parts.items()}
        if self.input_parts:
            out["input_parts"] = {k: s(v) for k, v in self.input_parts.items()}
        return out


def rewrite(out_dir: str | os.PathLike[str], phases: Mapping[str, Any]) -> None:
    """Replace ``report.json``'s ``phases`` block (atomically; the rest of
    the file as it is on disk, e.g. a ``verify`` block)."""
    path = Path(out_dir) / "report.json"
    on_disk = json.loads(path.read_text())
    on_disk["phases"] = dict(phases)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(on_disk, indent=2) + "\n")
    os.replace(tmp, path)


def summary_rows(ph: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The summary table's rows for a ``phases`` block."""

    def detail(parts: Mapping[str, float] | None) -> str:
        return f" ({', '.join(f'{k} {v:.1f}' for k, v in parts.items())})" if parts else ""

    so_far = "" if ph.get("final", True) else " so far"
    return [
        ("phase: start-up", f"{ph['startup']:.1f} s{detail(ph.get('startup_parts'))}"),
        ("phase: input", f"{ph['input']:.1f} s{detail(ph.get('input_parts'))}"),
        ("first message at", f"{ph['first_message']:.1f} s"),
        ("phase: stream", f"{ph['stream']:.2f} s"),
        ("phase: finish" + so_far, f"{ph['finish']:.1f} s{detail(ph.get('finish_parts'))}"),
        ("wall time" + so_far, f"{ph['total']:.1f} s"),
    ]


__all__ = ["PHASES", "RunClock", "begin", "startup_step", "engine_ready", "origin", "process_start", "rewrite",
           "summary_rows", "take_startup"]
