"""Fault exploration over the real dataflow cores, in the manner of
FoundationDB's simulation testing: many short runs, each a function of one
seed, under overlapping failures; every result checked against the exact
answer; one command replays a failing seed.

``python -m runtime.sim.explore --seeds 10000`` (``--seed S`` replays one,
``--verbose`` prints its schedule and trace).

A run is the real ``SourceCore``, ``WorkerCore`` and ``AggregatorCore``
(``runtime.dataflow``) with a grouping scheme drawn from the seed, wired
in-process: calls go through an explorer transport and control instead of
Ray, on one virtual clock (service time is emulated and advances it). Every
source runs in its own thread, but exactly one thread runs at a time: at every
send, wait and control call (a *yield point*) the seeded generator picks who
goes on, so the interleaving - which source sends, which worker serves, when
a flush reaches the aggregator - is the seed's too. Faults are drawn per seed
and fire at yield-point counts, never at times:

- ``kill worker-w``: its process is gone - its queue, its open state and the
  flushes it has not delivered die with it (a flush already on its way may
  still arrive before the fence, or be refused after it); the driver notices
  some yield points later (fences it at the aggregator, tells the sources),
  and the sources notice by themselves when a call to it fails;
- ``kill source-s``: the source stops at its next yield point, whatever it
  was doing (routing, replaying a dead worker's sub-batches, draining); a new
  incarnation (``epoch + 1``) fences the live workers and resumes from what is
  committed, as ``actors.source.SourceActor.run`` does;
- ``kill aggregator``: everything committed is gone, so the attempt stops and
  the run starts again from the start of its input (``run_with_restarts``);
  faults not yet due move to the new attempt;
- message faults all run long: acks taken in random order (``reorder``),
  calls delivered twice (``duplicate``: the worker must drop what it already
  processed), flushes delivered late, out of order and twice.

Several faults of a seed may overlap: two workers in one yield point, a source
dying while it replays a dead worker, the aggregator dying during a flush.
The checks: the result equals the input's exact count; every source's
replay log is empty at its end; no duplicate flush is merged twice.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from runtime.dataflow.aggregator import AggregatorCore
from runtime.dataflow.messages import Verdict as CommitVerdict
from runtime.dataflow.recovery import plan_resume
from runtime.dataflow.reliability import Flush, Part, WorkerLost
from runtime.dataflow.settings import AggregatorSettings, SourceSettings, WorkerSettings
from runtime.dataflow.source import SourceCore
from runtime.dataflow.worker import WorkerCore
from runtime.grouping import SCHEMES as SCHEME_CLASSES
from runtime.grouping.coordination import RoutedReport
from runtime.operators import WorkerApp, builtin_operator

#: the schemes a seed draws from (every kind of routing state: hashing,
#: choices, virtual workers with signals, a controller, hot keys, the reference)
SCHEMES = ("kg", "sg", "pkg", "dchoices", "cg", "acg", "fish", "dalton", "wrr")
#: most yield points one attempt may take (a livelock is a failure, not a hang;
#: a run takes a few hundred to a few thousand)
MAX_STEPS = 20_000
#: two failures this close (in yield points) overlap: recovering from one
#: (fencing, re-routing, resuming) takes about as many
OVERLAP = 20


@dataclass(frozen=True)
class Fault:
    """``what`` ("worker-1", "source-0", "aggregator") dies at yield point ``at``."""

    at: int
    what: str


@dataclass
class Scenario:
    """Everything a seed decides before the run."""

    seed: int
    scheme: str
    workers: int
    sources: int
    messages: int
    batch: int
    keys: int
    aggregate_every_s: float
    faults: list[Fault]
    reorder: bool
    duplicate: float  # probability that a call is delivered twice
    late_flushes: bool  # flushes wait in flight, delivered in random order, sometimes twice

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        rng = np.random.default_rng(seed)
        workers = int(rng.integers(2, 6))
        sources = int(rng.integers(1, 4))
        batch = int(rng.choice([50, 100, 250]))
        messages = int(rng.integers(20, 60)) * batch
        faults: list[Fault] = []
        horizon = messages // batch * sources * 2  # roughly the yield points of a run
        for _ in range(int(rng.choice([0, 1, 1, 2, 2, 3]))):
            at = int(rng.integers(1, max(2, horizon)))
            kind = rng.choice(["worker", "worker", "source", "source", "aggregator"])
            if kind == "aggregator":
                faults.append(Fault(at, "aggregator"))
            elif kind == "worker":
                faults.append(Fault(at, f"worker-{int(rng.integers(workers))}"))
                if rng.random() < 0.3:  # a machine holding two workers
                    faults.append(Fault(at, f"worker-{int(rng.integers(workers))}"))
                if rng.random() < 0.3:  # a source dying while it replays the dead worker
                    faults.append(Fault(at + int(rng.integers(1, 20)),
                                        f"source-{int(rng.integers(sources))}"))
            else:
                faults.append(Fault(at, f"source-{int(rng.integers(sources))}"))
        return cls(seed=seed, scheme=str(rng.choice(SCHEMES)), workers=workers,
                   sources=sources, messages=messages, batch=batch,
                   keys=int(rng.choice([5, 50, 500])),
                   aggregate_every_s=float(rng.choice([0.001, 0.01, 0.05])),
                   faults=sorted(faults, key=lambda f: (f.at, f.what)),
                   reorder=bool(rng.random() < 0.5), duplicate=float(rng.choice([0, 0, 0.05])),
                   late_flushes=bool(rng.random() < 0.5))

    def data(self) -> list[list[str]]:
        """Each source's keys (Zipf over ``keys``)."""
        rng = np.random.default_rng(self.seed + 1)
        out = []
        for _ in range(self.sources):
            ranks = np.minimum(rng.zipf(1.2, size=self.messages), self.keys)
            out.append([f"k{r}" for r in ranks])
        return out


# ============================================================================ scheduling


class Killed(BaseException):
    """Raised in a thread at a yield point: its actor (or attempt) is gone.
    A ``BaseException``, so no ``except Exception`` in the cores catches it."""


class VirtualClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, float(s))


class Baton:
    """Exactly one thread runs at a time; ``switch`` lets the seeded generator
    pick who goes on (the caller included)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.cv = threading.Condition()
        self.turn: str | None = None
        self.runnable: list[str] = []

    def join(self, name: str) -> None:
        with self.cv:
            self.runnable.append(name)

    def wait_turn(self, name: str) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.turn == name)

    def switch(self, name: str) -> None:
        with self.cv:
            self.turn = self.runnable[int(self.rng.integers(len(self.runnable)))]
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.turn == name)

    def leave(self, name: str) -> None:
        with self.cv:
            self.runnable.remove(name)
            self.turn = (self.runnable[int(self.rng.integers(len(self.runnable)))]
                         if self.runnable else None)
            self.cv.notify_all()


# ============================================================================ one attempt


@dataclass
class Outcome:
    counts: dict[str, int] | None = None  # None: the attempt ended (the aggregator died)
    steps: int = 0
    trace: list[str] = field(default_factory=list)
    replays: int = 0
    source_restarts: int = 0
    fired: list[tuple[int, str]] = field(default_factory=list)  # (yield point, actor)
    duplicate_messages: int = 0


class Attempt:
    """One attempt of a run: the cores, the schedule, the driver's part."""

    def __init__(self, sc: Scenario, faults: Sequence[Fault], attempt: int,
                 verbose: bool = False) -> None:
        self.sc = sc
        self.rng = np.random.default_rng([sc.seed, attempt])
        self.vc = VirtualClock()
        self.baton = Baton(self.rng)
        self.faults = list(faults)
        self.verbose = verbose
        self.out = Outcome()
        params = {"virtual_per_worker": 4} if sc.scheme in ("cg", "acg") else {}
        self.params = params
        scheme = SCHEME_CLASSES[sc.scheme]
        coordinator = None
        if scheme.coordinated:
            coordinator = scheme.coordinator(sc.workers, params, alive=range(sc.workers),
                                             sources=sc.sources)
            coordinator.start(self.vc.t)
        self.coordinated = coordinator is not None
        self.agg = AggregatorCore(AggregatorSettings({"kind": "wordcount"}),
                                  coordinator=coordinator, clock=self.vc.clock)
        op = builtin_operator("wordcount")
        settings = WorkerSettings(
            service_us=20.0, aggregate_every_s=sc.aggregate_every_s, queue_batches=1 << 16,
            throttle="service", signals=scheme.worker_signals(params),
            report_every_s=0.05 if coordinator is not None else None,
            report_jump=coordinator.jump if coordinator is not None else None)
        self.workers = [WorkerCore(w, WorkerApp(op), settings, clock=self.vc.clock,
                                   sleep=self.vc.sleep, t0=self.vc.t, sink=self._sink(w))
                        for w in range(sc.workers)]
        self.dead: set[int] = set()  # processes gone
        self.fenced: set[int] = set()  # the driver noticed (fenced at the aggregator)
        self.detect_at: dict[int, int] = {}  # worker -> yield point the driver notices it
        self.in_flight: dict[int, list[Flush]] = collections.defaultdict(list)
        self.cores: dict[int, SourceCore] = {}
        self.epochs = [0] * sc.sources
        self.killed_sources: set[int] = set()  # due to stop at their next yield point
        self.aborted = False
        self.step = 0
        self.tables: dict[int, Any] = {}
        self.data = sc.data()

    # ------------------------------------------------------------------ log
    def log(self, what: str) -> None:
        if self.verbose:
            self.out.trace.append(f"{self.step:>7} {what}")

    # ------------------------------------------------------------------ yield points
    def yield_point(self, source: int) -> None:
        """Every send, wait and control call: faults and the driver's duties
        that are due, then maybe another thread's turn."""
        self.step += 1
        if self.step > MAX_STEPS:
            raise RuntimeError(f"no end after {MAX_STEPS} yield points (livelock)")
        while self.faults and self.faults[0].at <= self.step:
            self._inject(self.faults.pop(0))
        for w, at in sorted(self.detect_at.items()):
            if at <= self.step:
                del self.detect_at[w]
                self._driver_detects(w)
        if self.sc.late_flushes and self.in_flight and self.rng.random() < 0.3:
            self._deliver_one()
        if self.aborted or source in self.killed_sources:
            raise Killed()
        self.baton.switch(f"source-{source}")
        if self.aborted or source in self.killed_sources:
            raise Killed()

    def _inject(self, f: Fault) -> None:
        kind, _, idx = f.what.partition("-")
        if not (kind == "worker" and (int(idx) in self.dead
                                      or len(self.dead) + 1 >= self.sc.workers)):
            self.out.fired.append((self.step, f.what))
        if kind == "aggregator":
            self.log("kill aggregator: the attempt stops")
            self.aborted = True
        elif kind == "worker":
            w = int(idx)
            if w in self.dead or len(self.dead) + 1 >= self.sc.workers:
                self.log(f"kill {f.what}: refused (dead already, or the last live worker)")
                return
            self.dead.add(w)
            self.detect_at[w] = self.step + int(self.rng.integers(0, 50))
            # its flushes still on their way: each arrives (maybe after the fence) or not
            self.in_flight[w] = [fl for fl in self.in_flight[w] if self.rng.random() < 0.5]
            self.log(f"kill {f.what}")
        else:
            self.killed_sources.add(int(idx))
            self.log(f"kill {f.what}")

    def _driver_detects(self, w: int) -> None:
        """The driver's ping failed: fence ``w`` at the aggregator, tell every source."""
        if w in self.fenced:
            return
        self.fenced.add(w)
        self.agg.fence_worker(w)
        for core in self.cores.values():
            core.notify_worker_failed(w)
        self.log(f"driver: worker-{w} detected dead and fenced")

    # ------------------------------------------------------------------ commits
    def _sink(self, w: int) -> Any:
        def sink(flush: Flush) -> None:
            if w in self.dead:
                return
            self.in_flight[w].append(flush)
            if self.sc.late_flushes and self.rng.random() < 0.1:
                self.in_flight[w].append(flush)  # delivered twice
            if not self.sc.late_flushes:
                self._deliver(w)
        return sink

    def _deliver_one(self) -> None:
        w = int(self.rng.choice(sorted(self.in_flight)))
        flushes = self.in_flight[w]
        if not flushes:
            del self.in_flight[w]
            return
        flush = flushes.pop(int(self.rng.integers(len(flushes))))
        self._commit(w, flush)

    def _deliver(self, w: int) -> None:
        flushes = self.in_flight.pop(w, [])
        if self.sc.late_flushes:
            self.rng.shuffle(flushes)  # type: ignore[arg-type]
        for flush in flushes:
            self._commit(w, flush)

    def _commit(self, w: int, flush: Flush) -> None:
        answer = self.agg.commit(flush)
        self.log(f"commit worker-{w} flush {flush.seq}: {answer.verdict.value}")
        if w not in self.dead:  # the answer reaches a live worker only
            if answer.verdict is CommitVerdict.FENCED:
                raise RuntimeError(f"worker-{w} is alive but fenced")
            self.workers[w].on_table(answer.table)
            self.workers[w].on_committed(answer.committed_seq)

    # ------------------------------------------------------------------ transport
    def transport(self, s: int) -> Transport:
        return Transport(self, s)

    # ------------------------------------------------------------------ control
    def fence_worker(self, w: int, source: int) -> tuple[int, list[Any]]:
        self.yield_point(source)
        if w not in self.fenced:
            self.fenced.add(w)
        seq, held = self.agg.fence_for_source(w, source)
        self.log(f"source-{source} fences worker-{w}: committed flush {seq}, "
                 f"{sum(len(i) for _, i in held)} of its messages committed there")
        return seq, held

    def commit(self, workers: Sequence[int], source: int) -> dict[int, Any]:
        self.yield_point(source)
        out: dict[int, Any] = {}
        for w in workers:
            if w in self.dead:
                out[w] = WorkerLost(w, "dead")
                continue
            seq = self.workers[w].flush_now()
            self._deliver(w)
            out[w] = self.workers[w].wait_committed(seq, 0)
        return out

    def report_routed(self, source: int, report: RoutedReport) -> None:
        self.tables[source] = self.agg.report_routed(source, report)

    def poll_table(self, source: int) -> Any:
        return self.tables.pop(source, None)

    def committed(self) -> dict[int, int]:
        return {int(w): int(s) for w, s in self.agg.ledger.committed_seq.items()}

    def fence_source(self, source: int, epoch: int, live: Sequence[int]) -> Any:
        """As ``actors.source.RayControl.fence_source``: a dead worker cannot
        answer, so it is fenced at the aggregator instead."""
        def fence_dead(w: int) -> None:
            self.fenced.add(w)
            self.agg.fence_worker(w)

        return plan_resume(live, lambda w: None if w in self.dead
                           else self.workers[w].fence_source(source, epoch),
                           fence_dead, lambda: self.agg.committed_claims(source))

    # ------------------------------------------------------------------ sources
    def _batches(self, s: int) -> Iterator[pa.Table]:
        keys, b = self.data[s], self.sc.batch
        for i in range(0, len(keys), b):
            yield pa.table({"key": keys[i:i + b]})

    def _new_core(self, s: int) -> SourceCore:
        sc = self.sc
        settings = SourceSettings(n_workers=sc.workers, max_inflight=2,
                                  call_messages=int(self.rng.choice([1, 4096])),
                                  report_every_s=0.05, scheme=sc.scheme,
                                  grouping_params=self.params)
        core = SourceCore(s, settings.grouping(s, clock=self.vc.clock), self.transport(s),
                          settings, clock=self.vc.clock, sleep=self.vc.sleep, t0=self.vc.t,
                          control=Control(self, s), epoch=self.epochs[s],
                          dead_workers=sorted(self.fenced))
        self.cores[s] = core
        return core

    def _source_thread(self, s: int, errors: list[BaseException]) -> None:
        name = f"source-{s}"
        self.baton.wait_turn(name)
        try:
            while True:
                core = self._new_core(s)
                try:
                    plan = None
                    if self.epochs[s] > 0:
                        plan = self.fence_source(s, self.epochs[s], sorted(core.members.live))
                    if plan is not None:
                        self.log(f"source-{s} epoch {self.epochs[s]} resumes: {plan}")
                    core.run(self._batches(s), plan)
                    self.log(f"source-{s} ends: {core.failures.records}, "
                             f"resume {core.resume.stats if core.resume else None}")
                    self.out.replays += sum(int(r["replayed_messages"])
                                            for r in core.failures.records)
                    if len(core.log):
                        raise AssertionError(f"{name} ended with {len(core.log)} sub-batches "
                                             f"not committed")
                    return
                except Killed:
                    if self.aborted or s not in self.killed_sources:
                        return
                    self.killed_sources.discard(s)
                    self.epochs[s] += 1
                    self.out.source_restarts += 1
                    self.log(f"source-{s} restarts as epoch {self.epochs[s]}")
        except BaseException as e:  # noqa: BLE001 - reported by the run
            errors.append(e)
            self.aborted = True
        finally:
            self.baton.leave(name)

    def run(self) -> Outcome:
        errors: list[BaseException] = []
        threads = [threading.Thread(target=self._source_thread, args=(s, errors), daemon=True)
                   for s in range(self.sc.sources)]
        for s in range(self.sc.sources):
            self.baton.join(f"source-{s}")
        for t in threads:
            t.start()
        with self.baton.cv:
            self.baton.turn = "source-0"
            self.baton.cv.notify_all()
        for t in threads:
            t.join(120)
            if t.is_alive():
                raise RuntimeError("a source thread hung")
        if errors:
            raise errors[0]
        self.out.steps = self.step
        if self.aborted:
            return self.out
        for w, core in enumerate(self.workers):
            if w not in self.dead:
                core.flush_now()
                self._deliver(w)
        self.out.duplicate_messages = sum(int(w.claims.duplicates) for w in self.workers)
        result = self.agg.result().to_pydict()
        self.out.counts = dict(zip(result["key"], result["count"], strict=True))
        return self.out


class Transport:
    """One source incarnation's calls. ``send`` enqueues at the worker (twice,
    sometimes); ``wait`` serves queued calls until one of ``tokens`` is done
    and returns the done ones (all of them in order, or a random subset)."""

    def __init__(self, attempt: Attempt, source: int) -> None:
        self.a = attempt
        self.source = source
        self.calls: dict[int, tuple[int, Any]] = {}
        self.next = 0

    def send(self, worker: int, parts: list[Part]) -> int:
        a = self.a
        a.yield_point(self.source)
        tok = self.next
        self.next += 1
        item = None
        if worker not in a.dead:
            item = a.workers[worker].enqueue(self.source, parts)
            if a.sc.duplicate and a.rng.random() < a.sc.duplicate:
                a.workers[worker].enqueue(self.source, parts)  # its ack is lost
        self.calls[tok] = (worker, item)
        return tok

    def wait(self, tokens: Sequence[int], timeout: float | None) -> list[tuple[int, Any]]:
        a = self.a
        a.yield_point(self.source)
        ready = [t for t in tokens if self._done(t)]
        if not ready and timeout != 0:
            pending = [t for t in tokens if t in self.calls]
            if pending:
                tok = (pending[int(a.rng.integers(len(pending)))] if a.sc.reorder
                       else min(pending))
                w, item = self.calls[tok]
                while w not in a.dead and not item.done.is_set():
                    if not a.workers[w].step(timeout=0):
                        break
                ready = [t for t in tokens if self._done(t)]
        if a.sc.reorder and len(ready) > 1:
            ready = [t for t in ready if a.rng.random() < 0.7] or ready[:1]
        out = []
        for t in ready:
            w, item = self.calls.pop(t)
            out.append((t, WorkerLost(w, "dead") if w in a.dead or item is None else item.ack))
        return out

    def _done(self, tok: int) -> bool:
        if tok not in self.calls:
            return False
        w, item = self.calls[tok]
        return w in self.a.dead or item is None or item.done.is_set()


class Control:
    """``runtime.dataflow.source.Control`` for one source, through the attempt."""

    def __init__(self, attempt: Attempt, source: int) -> None:
        self.a = attempt
        self.source = source

    def fence_worker(self, worker: int, source: int) -> tuple[int, list[Any]]:
        return self.a.fence_worker(worker, source)

    def commit(self, workers: Sequence[int]) -> dict[int, Any]:
        return self.a.commit(workers, self.source)

    def report_routed(self, source: int, report: RoutedReport) -> None:
        self.a.report_routed(source, report)

    def poll_table(self, timeout: float | None = 0.0) -> Any:
        return self.a.poll_table(self.source)

    def committed(self) -> dict[int, int]:
        return self.a.committed()


# ============================================================================ a run


@dataclass
class SeedResult:
    scenario: Scenario
    ok: bool
    message: str
    attempts: int
    steps: int
    trace: list[str]
    fired: list[tuple[int, str]]  # (yield point in its attempt, actor), every attempt

    def overlapping(self) -> bool:
        """Two failures within ``OVERLAP`` yield points of each other: the second
        came while the first was being recovered from."""
        steps = sorted(t for t, _ in self.fired)
        return any(b - a <= OVERLAP for a, b in zip(steps, steps[1:], strict=False))


def explore_one(seed: int, verbose: bool = False) -> SeedResult:
    """Run seed ``seed`` (every attempt) and check its result."""
    sc = Scenario.draw(seed)
    want = collections.Counter(k for keys in sc.data() for k in keys)
    faults = list(sc.faults)
    trace: list[str] = []
    fired: list[tuple[int, str]] = []
    steps = 0
    for attempt in range(4):
        a = Attempt(sc, faults, attempt, verbose)
        try:
            out = a.run()
        except Exception as e:  # noqa: BLE001 - a failed seed, reported
            return SeedResult(sc, False, f"{type(e).__name__}: {e}", attempt + 1,
                           steps + a.step, trace + a.out.trace, fired + a.out.fired)
        trace += out.trace
        fired += out.fired
        steps += out.steps
        if out.counts is not None:
            ok = out.counts == dict(want)
            msg = "exact" if ok else _diff(out.counts, dict(want))
            return SeedResult(sc, ok, msg, attempt + 1, steps, trace, fired)
        # the aggregator died: the faults still to come move to the next attempt
        faults = [Fault(f.at - out.steps, f.what) for f in a.faults if f.at > out.steps]
    return SeedResult(sc, False, "the aggregator died in every attempt", 4, steps, trace, fired)


def _diff(got: dict[str, int], want: dict[str, int]) -> str:
    keys = sorted(set(got) | set(want), key=lambda k: (got.get(k, 0) - want.get(k, 0)))
    bad = [(k, got.get(k, 0), want.get(k, 0)) for k in keys if got.get(k, 0) != want.get(k, 0)]
    lost = sum(max(0, w - g) for _, g, w in bad)
    extra = sum(max(0, g - w) for _, g, w in bad)
    return (f"NOT EXACT: {len(bad)} keys differ, {lost} messages lost, {extra} counted "
            f"twice (first: {bad[:3]})")


def describe(sc: Scenario) -> str:
    faults = ", ".join(f"{f.what}@{f.at}" for f in sc.faults) or "none"
    return (f"seed {sc.seed}: {sc.scheme}, {sc.sources} source(s) x {sc.messages:,} messages "
            f"-> {sc.workers} workers, batch {sc.batch}, flush every {sc.aggregate_every_s} s; "
            f"faults: {faults}; acks {'reordered' if sc.reorder else 'in order'}, "
            f"duplicates {sc.duplicate}, flushes {'late' if sc.late_flushes else 'at once'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m runtime.sim.explore",
        description="Explore overlapping failures over the real dataflow cores: every "
                    "seed is one run, checked against the exact count.")
    p.add_argument("--seeds", type=int, default=1000, help="how many seeds (default 1000)")
    p.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--seed", type=int, default=None, help="replay this one seed")
    p.add_argument("--verbose", action="store_true", help="print the seed's trace")
    args = p.parse_args(argv)
    if args.seed is not None:
        v = explore_one(args.seed, verbose=True)
        print(describe(v.scenario))
        if args.verbose:
            print("\n".join(v.trace))
        print(f"{'ok' if v.ok else 'FAILED'}: {v.message} ({v.attempts} attempt(s), "
              f"{v.steps:,} yield points)")
        return 0 if v.ok else 1
    if args.seeds < 1:
        p.error(f"--seeds: must be >= 1 (got {args.seeds})")
    from tqdm import tqdm

    failed: list[SeedResult] = []
    kinds: collections.Counter[str] = collections.Counter()
    several = overlapping = 0
    t = time.time()
    seeds = range(args.first, args.first + args.seeds)
    for seed in tqdm(seeds, desc="seeds", unit="seed", file=sys.stderr, mininterval=0.5):
        v = explore_one(seed)
        for _, what in v.fired:
            kinds[what.partition("-")[0]] += 1
        several += len(v.fired) >= 2
        overlapping += v.overlapping()
        if not v.ok:
            failed.append(v)
            tqdm.write(f"FAILED {describe(v.scenario)}: {v.message}", file=sys.stderr)
    print(f"{len(seeds):,} seeds in {time.time() - t:.1f} s: {len(seeds) - len(failed):,} "
          f"exact, {len(failed):,} failed")
    print(f"failures injected: {dict(sorted(kinds.items()))}; seeds with two or more: "
          f"{several:,}, overlapping (within {OVERLAP} yield points): {overlapping:,}")
    for v in failed[:10]:
        print(f"  replay: python -m runtime.sim.explore --seed {v.scenario.seed} --verbose")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
