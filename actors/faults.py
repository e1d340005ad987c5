"""The driver's side of failures and membership (docs/reliability.md).

``FaultInjector`` (pure: no Ray, no clock) says what the topology's schedule
asks for, and when: ``faults`` (``Kill``) and ``workers.changes`` add/remove
(``Join`` / ``Leave``), each returned once, when due; it also refuses the ones
that would leave no live worker.

``Supervisor`` is created by
``actors.pipeline.run_pipeline`` once the actors exist and polled from its loop
(every ``POLL_S``); it carries out what the injector says and watches the run:

- **inject**: a ``Kill`` kills the named actor's process for real -
  ``SIGKILL`` to its pid when it runs on this node, else
  ``ray.kill(no_restart=True)`` (Ray kills the process); a ``Join`` tells every
  source (and the aggregator) about the new worker; a ``Leave`` retires the
  worker as if it had died;
- **detect**: every live worker is pinged (``progress``; the answers are also
  the imbalance samples); a ``RayActorError`` is a death: the worker is fenced
  at the aggregator and every source is told (``worker_failed``), which makes
  it re-route the dead worker's uncommitted sub-batches (sources also find out
  by themselves when a call to it fails). A source's ``run`` failing with
  ``RayActorError`` is a source death: a new incarnation (``epoch + 1``) is
  started on the same shard and resumes from what is committed;
- **progress**: messages acked by the sources (``acked``), the workers'
  latest utilizations (``utilizations``);
- **memory** (``ActorProcesses``): the peak RSS (``VmHWM``) of every actor
  process on this node, read from ``/proc`` on each poll (also from the dead
  ones, until they die);
- **report**: ``failures`` (one entry per fault: actor, at_s, killed_s,
  detected_s, recovered_s, recovery_s, replayed batches / messages) and
  ``peak_rss_mb`` per actor.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import ray

from runtime.dataflow.latency import LatencyHistogram
from runtime.dataflow.messages import AggregatorStats, SourceStats, WorkerSeries, WorkerStats
from runtime.dataflow.reliability import FaultEvent, FaultSchedule, peak_rss_mb
from runtime.topology import FaultSpec, Topology


def not_yet_added(topo: Topology) -> list[int]:
    """Workers that join later (``workers.changes`` ``add``): not routed to at first."""
    return [w for _, w in topo.workers.added()]


#: a worker ping not answered within this long is "busy", not dead (a stopped
#: or throttled process answers late; a dead one fails fast)
PING_TIMEOUT_S = 0.1


class RunRestart(RuntimeError):
    """The run lost an actor it cannot replace in place: the aggregator (it
    holds everything committed) or a live stream's source (its inbox is in
    memory). ``actors.pipeline.run_with_restarts`` stops the attempt and starts
    another:
    a live stream from its last checkpoint, a finite input from its start.
    ``at_s``: when it was noticed (seconds into the attempt); ``failures``: the
    attempt's fault events (report.json ``failures``)."""

    def __init__(self, message: str, at_s: float = 0.0,
                 failures: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(message)
        self.at_s = at_s
        self.failures = list(failures)


# ============================================================================ injector


@dataclass(frozen=True)
class Kill:
    """Kill ``actor`` ("worker-3", "source-0") at ``at_s`` (a ``faults``
    entry; ``after_messages``: its trigger, when by progress)."""

    at_s: float
    actor: str
    after_messages: int | None = None

    @property
    def kind(self) -> str:
        """``worker``, ``source`` or ``aggregator``."""
        return self.actor.partition("-")[0]

    @property
    def index(self) -> int:
        return int(self.actor.partition("-")[2] or 0)


@dataclass(frozen=True)
class Join:
    """Worker ``worker`` joins at ``at_s`` (``workers.changes`` ``add``)."""

    op: ClassVar[str] = "add"
    at_s: float
    worker: int
    after_messages: int | None = None


@dataclass(frozen=True)
class Leave:
    """Worker ``worker`` leaves at ``at_s`` (``workers.changes`` ``remove``)."""

    op: ClassVar[str] = "remove"
    at_s: float
    worker: int
    after_messages: int | None = None


class FaultInjector:
    """The run's scheduled disruptions: ``due(now_s, acked)`` returns each one
    once, when its ``at_s`` has come or the sources have had its
    ``after_messages`` acked - the kills first, then the membership changes,
    each in trigger order (ties: by name). Whether one may still go ahead
    depends on who is alive then: ``kill_refused`` / ``leave_refused``.
    Each entry is ``(at_s, after_messages, actor or worker)``, one of the two
    triggers ``None``."""

    def __init__(self, kills: Iterable[tuple[float | None, int | None, str]] = (),
                 joins: Iterable[tuple[float | None, int | None, int]] = (),
                 leaves: Iterable[tuple[float | None, int | None, int]] = ()) -> None:
        self._kills = FaultSchedule(kills)
        self._membership = FaultSchedule(
            [(a, n, f"add:{w}") for a, n, w in joins]
            + [(a, n, f"remove:{w}") for a, n, w in leaves])

    @classmethod
    def of(cls, topo: Topology) -> FaultInjector:
        """The schedule of ``topo``'s ``faults`` and ``workers.changes``."""
        return cls([(f.at_s, f.after_messages, f.kill) for f in topo.faults],
                   [(m.at_s, m.after_messages, w) for m, w in topo.workers.added()],
                   [(m.at_s, m.after_messages, m.remove) for m in topo.workers.membership
                    if m.remove is not None])

    def due(self, now_s: float, acked: int = 0) -> list[Kill | Join | Leave]:
        """What is due by ``now_s`` (seconds into the run) with ``acked``
        messages acked, and was not returned before."""
        out: list[Kill | Join | Leave] = [Kill(a, name, n)
                                          for a, n, name in self._kills.due(now_s, acked)]
        for at_s, n, what in self._membership.due(now_s, acked):
            op, _, w = what.partition(":")
            out.append(Join(at_s, int(w), n) if op == "add" else Leave(at_s, int(w), n))
        return out

    def __len__(self) -> int:
        """Actions not yet due."""
        return len(self._kills) + len(self._membership)

    @staticmethod
    def kill_refused(kill: Kill, dead: set[int], inactive: set[int], n_workers: int) -> str:
        """Why ``kill`` must not go ahead ("" if it may) while workers ``dead``
        are dead and ``inactive`` have not joined yet: the worker is dead
        already or not joined (a worker killed before it joins would be
        joined dead), or it is the last live one."""
        if kill.kind != "worker":
            return ""
        if kill.index in dead:
            return "already dead"
        if kill.index in inactive:
            return "not injected: it has not joined yet"
        if len(dead) + len(inactive) + 1 >= n_workers:
            return "not injected: it is the last live worker"
        return ""

    @staticmethod
    def leave_refused(leave: Leave, dead: set[int], inactive: set[int], n_workers: int) -> str:
        """Why ``leave`` must not go ahead ("" if it may): the worker is not
        live (dead, or not joined yet), or it is the last live one."""
        if leave.worker in dead or leave.worker in inactive:
            return "not live: nothing to remove"
        if len(dead) + len(inactive) + 1 >= n_workers:
            return "not removed: it is the last live worker"
        return ""


# ============================================================================ memory


class ActorProcesses:
    """Where every actor's process runs (pid, node), and the peak RSS of the
    ones on this node (``sample`` on every poll)."""

    def __init__(self) -> None:
        self.here = ray.get_runtime_context().get_node_id()
        self.pids: dict[str, int] = {}
        self.nodes: dict[str, str] = {}
        self.peak_rss: dict[str, float] = {}

    def register(self, name: str, actor: Any) -> None:
        pid, node = ray.get([actor.pid.remote(), actor.node_id.remote()])
        self.pids[name], self.nodes[name] = int(pid), str(node)

    def on_this_node(self, name: str) -> bool:
        return self.nodes.get(name) == self.here

    def sample(self) -> None:
        for name, pid in self.pids.items():
            if not self.on_this_node(name):
                continue
            mb = peak_rss_mb(pid)
            if mb is not None and mb > self.peak_rss.get(name, 0.0):
                self.peak_rss[name] = mb

    def peaks(self, source_stats: list[SourceStats], worker_stats: list[WorkerStats],
              agg_stats: AggregatorStats) -> dict[str, float]:
        """Peak RSS per actor, by name: the larger of what was sampled here
        and what the actor measured itself (the only number for other nodes)."""
        peak = dict(self.peak_rss)

        def merge(name: str, mb: Any) -> None:
            if mb is not None:
                peak[name] = max(peak.get(name, 0.0), float(mb))

        for i, ws in enumerate(worker_stats):
            merge(f"worker-{i}", ws.peak_rss_mb)
        for ss in source_stats:
            merge(f"source-{ss.source}" + (f".{ss.epoch}" if ss.epoch else ""), ss.peak_rss_mb)
        merge("aggregator", agg_stats.peak_rss_mb)
        return dict(sorted(peak.items()))


# ============================================================================ supervisor


class Supervisor:
    """Runs the sources, carries out the ``FaultInjector``'s schedule, detects
    deaths and recovers from them, supplies the driver's progress and
    imbalance samples, and reports (see the module docstring)."""

    def __init__(
        self,
        topo: Topology,
        workers: Sequence[Any],
        sources: Sequence[Any],
        aggregator: Any,
        make_source: Callable[[int, int, list[int]], Any],
        say: Callable[[str], None],
    ) -> None:
        self.topo = topo
        self.workers = list(workers)
        self.sources = list(sources)
        self.agg = aggregator
        self.make_source = make_source
        self.say = say
        self.injector = FaultInjector.of(topo)
        self.inactive: set[int] = set(not_yet_added(topo))
        self.membership_log: list[dict[str, Any]] = []
        self.events: list[FaultEvent] = []
        self.dead_workers: set[int] = set()
        self.epochs = [0] * len(self.sources)
        self.restarts: list[tuple[int, int, FaultEvent]] = []  # (source, epoch, event)
        self.processes = ActorProcesses()
        self._pings: dict[int, Any] = {}
        self._agg_ping: Any = None
        self._utilization = [0.0] * len(self.workers)
        self.t0 = time.time()
        self._acked_max = 0
        self.namespace = ""
        self.runs: list[Any] = []
        #: the last failure records each source incarnation reported through
        #: ``progress`` - what a source replayed survives that source's own death
        self._source_failures: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self.processes.register("aggregator", aggregator)
        for i, w in enumerate(self.workers):
            self.processes.register(f"worker-{i}", w)
        for i, s in enumerate(self.sources):
            self.processes.register(f"source-{i}", s)

    # ------------------------------------------------------------------ streaming
    def start(self, t0: float, namespace: str) -> list[Any]:
        """Start the sources' runs; returns their refs (kept up to date in ``runs``)."""
        self.t0, self.namespace = t0, namespace
        self.runs = [s.run.remote(t0, namespace) for s in self.sources]
        return self.runs

    def poll(self, acked: int = 0) -> None:
        """Inject what is due (``acked``: the sources' acked messages, ``acked()``),
        detect deaths, restart dead sources, sample memory."""
        now_s = time.time() - self.t0
        self._acked_max = max(self._acked_max, acked)  # a restarting source counts 0 a while
        for action in self.injector.due(now_s, self._acked_max):
            if isinstance(action, Kill):
                self._kill(action)
            else:
                self._change_membership(action, now_s)
        self._ping_workers()
        self._ping_aggregator()
        self._check_sources()
        self.processes.sample()

    def finished(self) -> bool:
        """Every source's current incarnation returned."""
        ready, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        if len(ready) < len(self.runs):
            return False
        self._check_sources()  # a failed run is restarted, not finished
        ready, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        return len(ready) == len(self.runs)

    def acked(self) -> int:
        """Messages acked so far (a source being restarted counts 0 for now)."""
        refs = [s.progress.remote() for s in self.sources]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
        done = 0
        for r in ready:
            try:
                p = ray.get(r)
            except ray.exceptions.RayActorError:
                continue
            done += int(p.acked)
            self._source_failures[(int(p.source), int(p.epoch))] = p.failures
        return done

    def utilizations(self) -> list[float]:
        """Latest utilization sample of every live worker."""
        return [u for i, u in enumerate(self._utilization)
                if i not in self.dead_workers and i not in self.inactive]

    # ------------------------------------------------------------------ inject
    def _change_membership(self, change: Join | Leave, now_s: float) -> None:
        """A worker joins (every source adds it to its grouping) or leaves (it is
        retired exactly like a dead worker: fenced, its uncommitted work
        re-routed by the sources - nothing is lost - then its process ends)."""
        w = change.worker
        entry: dict[str, Any] = {"op": change.op, "worker": w, "at_s": change.at_s,
                                 "applied_s": now_s}
        if change.after_messages is not None:
            entry["after_messages"] = change.after_messages
        if isinstance(change, Join):
            self.inactive.discard(w)
            self.agg.worker_added.remote(w)  # a coordinated scheme's controller
            for s in self.sources:
                s.worker_added.remote(w)
        elif note := FaultInjector.leave_refused(change, self.dead_workers, self.inactive,
                                                 len(self.workers)):
            entry["note"] = note
        else:
            self.dead_workers.add(w)
            entry["committed_seq"] = int(ray.get(self.agg.fence_worker.remote(w)))
            for s in self.sources:
                s.worker_failed.remote(w)
            ray.kill(self.workers[w], no_restart=True)  # fenced: its state is not needed
        self.membership_log.append(entry)
        self.say(f"[{self.topo.name}] workers: {change.op} worker-{w} at {now_s:.2f} s"
                 + _after(change.after_messages))

    def _kill(self, kill: Kill) -> None:
        name = kill.actor
        ev = FaultEvent(actor=name, at_s=kill.at_s, after_messages=kill.after_messages,
                        pid=self.processes.pids.get(name))
        self.events.append(ev)
        ev.note = FaultInjector.kill_refused(kill, self.dead_workers, self.inactive,
                                             len(self.workers))
        if ev.note:
            return
        if self.processes.on_this_node(name) and ev.pid:
            try:
                os.kill(ev.pid, signal.SIGKILL)
                ev.note = "SIGKILL"
            except ProcessLookupError:
                ev.note = "process already gone"
        else:
            actor = {"worker": self.workers, "source": self.sources,
                     "aggregator": [self.agg]}[kill.kind][kill.index]
            ray.kill(actor, no_restart=True)
            ev.note = "ray.kill"
        ev.killed_s = time.time() - self.t0
        self.say(f"[{self.topo.name}] fault: killed {name} (pid {ev.pid}) at "
                 f"{ev.killed_s:.2f} s" + _after(kill.after_messages))

    # ------------------------------------------------------------------ detect
    def _ping_workers(self) -> None:
        for i, w in enumerate(self.workers):
            if i not in self.dead_workers and i not in self._pings:
                self._pings[i] = w.progress.remote()
        if not self._pings:
            return
        ready, _ = ray.wait(list(self._pings.values()), num_returns=len(self._pings),
                            timeout=PING_TIMEOUT_S)
        ready_set = set(ready)
        for i, ref in list(self._pings.items()):
            if ref not in ready_set:
                continue
            del self._pings[i]
            try:
                self._utilization[i] = float(ray.get(ref).utilization)
            except ray.exceptions.RayActorError as e:
                self._worker_died(i, type(e).__name__)

    def _ping_aggregator(self) -> None:
        """The aggregator holds everything committed: once it is dead the attempt
        cannot finish (its sources would wait for commits forever), so it ends
        here with ``RunRestart``."""
        if self._agg_ping is None:
            self._agg_ping = self.agg.pid.remote()
        ready, _ = ray.wait([self._agg_ping], timeout=0)
        if not ready:
            return
        ref, self._agg_ping = self._agg_ping, None
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as e:
            self.aggregator_lost(type(e).__name__)

    def aggregator_lost(self, cause: str) -> None:
        """Raise ``RunRestart`` for the aggregator's death (detected now)."""
        now_s = time.time() - self.t0
        ev = self._detected("aggregator", cause, now_s)
        what = "its checkpoint" if self.topo.input.stream else "the start of its input"
        ev.note = (ev.note + "; " if ev.note else "") + f"the run restarted from {what}"
        self.say(f"[{self.topo.name}] detected the aggregator dead at {now_s:.2f} s")
        raise RunRestart("the aggregator died", now_s, self.failure_events())

    def failure_events(self) -> list[dict[str, Any]]:
        """Every fault event so far, as report.json's ``failures`` entries."""
        return [ev.as_dict() for ev in self.events]

    def _detected(self, name: str, cause: str, now_s: float) -> FaultEvent:
        """The fault event of ``name``'s death, detected at ``now_s``: the
        injected kill's, or a new ``crash`` (not injected by us: still a
        failure to survive and report)."""
        for ev in self.events:
            if ev.actor == name and ev.detected_s is None and ev.killed_s is not None:
                break
        else:
            ev = FaultEvent(actor=name, at_s=now_s, kind="crash", killed_s=now_s,
                            pid=self.processes.pids.get(name), note=cause)
            self.events.append(ev)
        ev.detected_s = now_s
        return ev

    def _worker_died(self, i: int, cause: str) -> None:
        if i in self.dead_workers:
            return
        self.dead_workers.add(i)
        now_s = time.time() - self.t0
        ev = self._detected(f"worker-{i}", cause, now_s)
        ev.committed_seq = int(ray.get(self.agg.fence_worker.remote(i)))
        for s in self.sources:
            s.worker_failed.remote(i)  # fire and forget: a dead source is restarted anyway
        self.say(f"[{self.topo.name}] detected worker-{i} dead at {now_s:.2f} s "
                 f"(committed flushes: {ev.committed_seq}); sources re-route its work")

    def _check_sources(self) -> None:
        ready, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for ref in ready:
            i = self.runs.index(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._restart_source(i, type(e).__name__)

    def _restart_source(self, i: int, cause: str) -> None:
        now_s = time.time() - self.t0
        name = f"source-{i}"
        ev = self._detected(name, cause, now_s)
        self.epochs[i] += 1
        dead = sorted(self.dead_workers | self.inactive)
        src = self.make_source(i, self.epochs[i], dead)
        self.sources[i] = src
        self.processes.register(f"{name}.{self.epochs[i]}", src)
        self.runs[i] = src.run.remote(self.t0, self.namespace)
        self.restarts.append((i, self.epochs[i], ev))
        self.say(f"[{self.topo.name}] detected {name} dead at {now_s:.2f} s; restarted as "
                 f"epoch {self.epochs[i]}")

    # ------------------------------------------------------------------ finish
    def finish_workers(self) -> list[WorkerStats]:
        """Every worker's ``finish`` stats; a dead worker's are rebuilt from the
        aggregator's ledger: processed = the messages of its committed flushes."""
        self.processes.sample()
        refs = {i: w.finish.remote() for i, w in enumerate(self.workers)
                if i not in self.dead_workers}
        got: dict[int, WorkerStats] = {}
        for i, ref in refs.items():
            try:
                got[i] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._worker_died(i, type(e).__name__)
        committed = ray.get(self.agg.stats.remote()).committed_messages
        return [got[i] if i in got else _dead_worker_stats(i, int(committed.get(str(i), 0)))
                for i in range(len(self.workers))]

    def report(self, source_stats: list[SourceStats], worker_stats: list[WorkerStats],
               agg_stats: AggregatorStats) -> dict[str, Any]:
        """``failures``, ``peak_rss_mb`` and ``restarts`` for report.json."""
        records = self._worker_failure_records(source_stats)
        for ev in self.events:
            if ev.kind == "kill" and ev.killed_s is None and not ev.note:
                ev.note = "not injected: the stream ended first"
            kind, _, idx = ev.actor.partition("-")
            if kind == "worker" and ev.detected_s is not None:
                self._settle_worker_fault(ev, [f for f in records if f["worker"] == int(idx)])
        for src, epoch, ev in self.restarts:
            self._settle_source_restart(ev, source_stats[src], epoch)
        for entry in self.membership_log:
            if entry["op"] == "remove" and "committed_seq" in entry:
                fs = [f for f in records if f["worker"] == entry["worker"]]
                entry["replayed_messages"] = sum(int(f["replayed_messages"]) for f in fs)
                done = [float(f["recovered_ts"]) - self.t0 for f in fs
                        if f.get("recovered_ts") is not None]
                entry["recovered_s"] = max(done) if done else None
        return {
            "failures": [ev.as_dict() for ev in self.events],
            "peak_rss_mb": self.processes.peaks(source_stats, worker_stats, agg_stats),
            "dead_workers": sorted(self.dead_workers),
            "membership_changes": self.membership_log,
            "source_restarts": [{"source": src, "epoch": epoch}
                                for src, epoch, _ in self.restarts],
        }

    def _worker_failure_records(self, source_stats: list[SourceStats]) -> list[dict[str, Any]]:
        """Every source incarnation's re-routing records: the final ones from
        ``source_stats``, a dead incarnation's from its last ``progress``."""
        final = {(int(s.source), int(s.epoch)) for s in source_stats}
        records = [f for s in source_stats for f in s.failures]
        for key, fs in sorted(self._source_failures.items()):
            if key not in final:
                records.extend(fs)
        return records

    def _settle_worker_fault(self, ev: FaultEvent, records: list[dict[str, Any]]) -> None:
        """What the sources replayed of a dead worker (``records``: theirs
        about it), and when the last of them finished doing so."""
        done = []
        for f in records:
            ev.replayed_batches += int(f["replayed_batches"])
            ev.replayed_messages += int(f["replayed_messages"])
            if f.get("recovered_ts") is not None:
                done.append(float(f["recovered_ts"]) - self.t0)
        if done:
            assert ev.detected_s is not None
            ev.recovered_s = max(max(done), ev.detected_s)

    def _settle_source_restart(self, ev: FaultEvent, stats: SourceStats, epoch: int) -> None:
        """When a restarted source resumed and what it re-read, if ``stats`` are
        of that incarnation (``epoch``) - a later restart's settle the later event."""
        if stats.epoch != epoch:
            return
        assert stats.resumed_ts is not None  # set by every source actor's run
        ev.recovered_s = float(stats.resumed_ts) - self.t0
        res = stats.resume or {}
        ev.replayed_batches = int(res.get("reread_batches", 0))
        ev.replayed_messages = int(res.get("resent_messages", 0))
        ev.skipped_messages = int(res.get("skipped_messages", 0))

    def annotate(self, report: dict[str, Any], source_stats: list[SourceStats],
                 worker_stats: list[WorkerStats], agg_stats: AggregatorStats) -> None:
        """Add the failure and memory keys to a built report (never removes any)."""
        report.update(self.report(source_stats, worker_stats, agg_stats))
        report["messages"]["replayed"] = sum(f["replayed_messages"] for f in report["failures"])
        for i, w in enumerate(report["workers"]):
            w["dead"] = i in self.dead_workers
            w["peak_rss_mb"] = report["peak_rss_mb"].get(f"worker-{i}")
        for entry, st in zip(report.get("sources", []), source_stats, strict=False):
            entry["epoch"] = st.epoch
            entry["retained_peak_messages"] = st.retained_peak_messages
            entry["peak_rss_mb"] = st.peak_rss_mb
            entry["joins"] = st.joins


def _after(after_messages: int | None) -> str:
    return "" if after_messages is None else f" ({after_messages:,} messages acked)"


def still_to_inject(faults: Sequence[FaultSpec], at_s: float,
                    failures: Sequence[dict[str, Any]]) -> list[FaultSpec]:
    """The ``faults`` a restarted attempt injects (``run_with_restarts``): a
    timed one not due by ``at_s`` (when the attempt ended), a count-triggered
    one that was not due in it (no entry in its ``failures``; the new attempt
    counts its own acks from 0)."""
    fired = {(f["actor"], f.get("after_messages")) for f in failures}
    return [f for f in faults
            if (f.at_s > at_s if f.at_s is not None else (f.kill, f.after_messages) not in fired)]


def _dead_worker_stats(i: int, committed: int) -> WorkerStats:
    return WorkerStats(
        id=i, processed=committed, batches=0, keys=0, flushes=0, stopped_s=0.0,
        latency=LatencyHistogram().to_sparse(), signals_emitted={"increase": 0, "decrease": 0},
        queue_capacity_batches=1, series=WorkerSeries(), dead=True)
