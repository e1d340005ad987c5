"""The driver's side of failures: inject the topology's faults, detect deaths,
restart sources, sample memory, and report (docs/reliability.md).

``FaultManager`` is created by ``actors.pipeline.run_pipeline`` once the actors
exist and polled from its loop (every ``POLL_S``):

- **inject**: at ``at_s`` the named actor's process is killed for real -
  ``SIGKILL`` to its pid when it runs on this node, else
  ``ray.kill(no_restart=True)`` (Ray kills the process);
- **detect**: every live worker is pinged (``progress``; the answers are also
  the imbalance samples); a ``RayActorError`` is a death: the worker is fenced
  at the aggregator and every source is told (``worker_failed``), which makes
  it re-route the dead worker's uncommitted sub-batches (sources also find out
  by themselves when a call to it fails). A source's ``run`` failing with
  ``RayActorError`` is a source death: a new incarnation (``epoch + 1``) is
  started on the same shard and resumes from what is committed;
- **memory**: the peak RSS (``VmHWM``) of every actor process on this node,
  read from ``/proc`` on each poll (also from the dead ones, until they die);
- **report**: ``failures`` (one entry per fault: actor, at_s, killed_s,
  detected_s, recovered_s, recovery_s, replayed batches / messages) and
  ``peak_rss_mb`` per actor.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from runtime.latency import LatencyHistogram
from runtime.reliability import FaultEvent, FaultSchedule, peak_rss_mb
from runtime.topology import Topology


def not_yet_added(topo: Topology) -> list[int]:
    """Workers that join later (``workers.changes`` ``add``): not routed to at first."""
    return [w for _, w, _ in topo.workers.added()]


#: a worker ping not answered within this long is "busy", not dead (a stopped
#: or throttled process answers late; a dead one fails fast)
PING_TIMEOUT_S = 0.1


class FaultManager:
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
        self.schedule = FaultSchedule((f.at_s, f.kill) for f in topo.faults)
        # membership (workers.changes add/remove): "add:<w>" / "remove:<w>" events
        self.membership = FaultSchedule(
            [(a, f"add:{w}") for a, w, _ in topo.workers.added()]
            + [(m.at_s, f"remove:{m.remove}") for m in topo.workers.membership
               if m.remove is not None])
        self.inactive: set[int] = set(not_yet_added(topo))
        self.membership_log: list[dict[str, Any]] = []
        self.events: list[FaultEvent] = []
        self.dead_workers: set[int] = set()
        self.epochs = [0] * len(self.sources)
        self.restarts: list[tuple[int, int, FaultEvent]] = []  # (source, epoch, event)
        self.here = ray.get_runtime_context().get_node_id()
        self.pids: dict[str, int] = {}
        self.nodes: dict[str, str] = {}
        self.peak_rss: dict[str, float] = {}
        self._pings: dict[int, Any] = {}
        self._utilization = [0.0] * len(self.workers)
        self.t0 = time.time()
        self.namespace = ""
        self.runs: list[Any] = []
        #: the last failure records each source incarnation reported through
        #: ``progress`` - what a source replayed survives that source's own death
        self._source_failures: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self._register("aggregator", aggregator)
        for i, w in enumerate(self.workers):
            self._register(f"worker-{i}", w)
        for i, s in enumerate(self.sources):
            self._register(f"source-{i}", s)

    def _register(self, name: str, actor: Any) -> None:
        pid, node = ray.get([actor.pid.remote(), actor.node_id.remote()])
        self.pids[name], self.nodes[name] = int(pid), str(node)

    # ------------------------------------------------------------------ streaming
    def start(self, t0: float, namespace: str) -> list[Any]:
        """Start the sources' runs; returns their refs (kept up to date in ``runs``)."""
        self.t0, self.namespace = t0, namespace
        self.runs = [s.run.remote(t0, namespace) for s in self.sources]
        return self.runs

    def poll(self) -> None:
        now_s = time.time() - self.t0
        for at_s, name in self.schedule.due(now_s):
            self._kill(name, at_s)
        for at_s, what in self.membership.due(now_s):
            self._membership(what, at_s, now_s)
        self._ping_workers()
        self._check_sources()
        self._sample_memory()

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
            done += int(p["acked"])
            self._source_failures[(int(p["source"]), int(p["epoch"]))] = p["failures"]
        return done

    def _worker_failure_records(self, source_stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every source incarnation's re-routing records: the final ones from
        ``source_stats``, a dead incarnation's from its last ``progress``."""
        final = {(int(s["source"]), int(s.get("epoch", 0))) for s in source_stats}
        records = [f for s in source_stats for f in s.get("failures", [])]
        for key, fs in sorted(self._source_failures.items()):
            if key not in final:
                records.extend(fs)
        return records

    def utilizations(self) -> list[float]:
        """Latest utilization sample of every live worker."""
        return [u for i, u in enumerate(self._utilization)
                if i not in self.dead_workers and i not in self.inactive]

    # ------------------------------------------------------------------ membership
    def _membership(self, what: str, at_s: float, now_s: float) -> None:
        """A worker joins (every source adds it to its grouping) or leaves (it is
        retired exactly like a dead worker: fenced, its uncommitted work
        re-routed by the sources - nothing is lost - then its process ends)."""
        op, _, idx = what.partition(":")
        w = int(idx)
        entry: dict[str, Any] = {"op": op, "worker": w, "at_s": at_s, "applied_s": now_s}
        if op == "add":
            self.inactive.discard(w)
            self.agg.worker_added.remote(w)  # a coordinated scheme's controller
            for s in self.sources:
                s.worker_added.remote(w)
        elif w in self.dead_workers or w in self.inactive:
            entry["note"] = "not live: nothing to remove"
        elif len(self.dead_workers) + len(self.inactive) + 1 >= len(self.workers):
            entry["note"] = "not removed: it is the last live worker"
        else:
            self.dead_workers.add(w)
            entry["committed_seq"] = int(ray.get(self.agg.fence_worker.remote(w)))
            for s in self.sources:
                s.worker_failed.remote(w)
            ray.kill(self.workers[w], no_restart=True)  # fenced: its state is not needed
        self.membership_log.append(entry)
        self.say(f"[{self.topo.name}] workers: {op} worker-{w} at {now_s:.2f} s")

    # ------------------------------------------------------------------ inject
    def _kill(self, name: str, at_s: float) -> None:
        kind, _, idx = name.partition("-")
        i = int(idx)
        ev = FaultEvent(actor=name, at_s=at_s, pid=self.pids.get(name))
        self.events.append(ev)
        if kind == "worker" and i in self.dead_workers:
            ev.note = "already dead"
            return
        if kind == "worker" and len(self.dead_workers) + 1 >= len(self.workers):
            ev.note = "not injected: it is the last live worker"
            return
        actor = self.workers[i] if kind == "worker" else self.sources[i]
        if self.nodes.get(name) == self.here and ev.pid:
            try:
                os.kill(ev.pid, signal.SIGKILL)
                ev.note = "SIGKILL"
            except ProcessLookupError:
                ev.note = "process already gone"
        else:
            ray.kill(actor, no_restart=True)
            ev.note = "ray.kill"
        ev.killed_s = time.time() - self.t0
        self.say(f"[{self.topo.name}] fault: killed {name} (pid {ev.pid}) at "
                 f"{ev.killed_s:.2f} s")

    def _event(self, name: str) -> FaultEvent | None:
        for ev in self.events:
            if ev.actor == name and ev.detected_s is None and ev.killed_s is not None:
                return ev
        return None

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
                self._utilization[i] = float(ray.get(ref)["utilization"])
            except ray.exceptions.RayActorError as e:
                self._worker_died(i, type(e).__name__)

    def _worker_died(self, i: int, cause: str) -> None:
        if i in self.dead_workers:
            return
        self.dead_workers.add(i)
        now_s = time.time() - self.t0
        ev = self._event(f"worker-{i}")
        if ev is None:  # not injected by us: still a failure to survive and report
            ev = FaultEvent(actor=f"worker-{i}", at_s=now_s, kind="crash", killed_s=now_s,
                            pid=self.pids.get(f"worker-{i}"), note=cause)
            self.events.append(ev)
        ev.detected_s = now_s
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
        ev = self._event(name)
        if ev is None:
            ev = FaultEvent(actor=name, at_s=now_s, kind="crash", killed_s=now_s,
                            pid=self.pids.get(name), note=cause)
            self.events.append(ev)
        ev.detected_s = now_s
        self.epochs[i] += 1
        dead = sorted(self.dead_workers | self.inactive)
        src = self.make_source(i, self.epochs[i], dead)
        self.sources[i] = src
        self._register(f"{name}.{self.epochs[i]}", src)
        self.runs[i] = src.run.remote(self.t0, self.namespace)
        self.restarts.append((i, self.epochs[i], ev))
        self.say(f"[{self.topo.name}] detected {name} dead at {now_s:.2f} s; restarted as "
                 f"epoch {self.epochs[i]}")

    def _sample_memory(self) -> None:
        for name, pid in self.pids.items():
            if self.nodes.get(name) != self.here:
                continue
            mb = peak_rss_mb(pid)
            if mb is not None and mb > self.peak_rss.get(name, 0.0):
                self.peak_rss[name] = mb

    # ------------------------------------------------------------------ finish
    def finish_workers(self) -> list[dict[str, Any]]:
        """Every worker's ``finish`` stats; a dead worker's are rebuilt from the
        aggregator's ledger: processed = the messages of its committed flushes."""
        self._sample_memory()
        refs = {i: w.finish.remote() for i, w in enumerate(self.workers)
                if i not in self.dead_workers}
        got: dict[int, dict[str, Any]] = {}
        for i, ref in refs.items():
            try:
                got[i] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._worker_died(i, type(e).__name__)
        committed = ray.get(self.agg.stats.remote())["committed_messages"]
        return [got[i] if i in got else _dead_worker_stats(i, int(committed.get(str(i), 0)))
                for i in range(len(self.workers))]

    def report(self, source_stats: list[dict[str, Any]], worker_stats: list[dict[str, Any]],
               agg_stats: dict[str, Any]) -> dict[str, Any]:
        """``failures``, ``peak_rss_mb`` and ``restarts`` for report.json."""
        records = self._worker_failure_records(source_stats)
        for ev in self.events:
            if ev.kind == "kill" and ev.killed_s is None and not ev.note:
                ev.note = "not injected: the stream ended first"
            kind, _, idx = ev.actor.partition("-")
            if kind == "worker" and ev.detected_s is not None:
                w = int(idx)
                done = []
                for f in records:
                    if f["worker"] != w:
                        continue
                    ev.replayed_batches += int(f["replayed_batches"])
                    ev.replayed_messages += int(f["replayed_messages"])
                    if f.get("recovered_ts") is not None:
                        done.append(float(f["recovered_ts"]) - self.t0)
                if done:
                    ev.recovered_s = max(max(done), ev.detected_s)
        for src, epoch, ev in self.restarts:
            st = source_stats[src]
            if st.get("epoch") == epoch:
                ev.recovered_s = float(st["resumed_ts"]) - self.t0
                res = st.get("resume") or {}
                ev.replayed_batches = int(res.get("reread_batches", 0))
                ev.replayed_messages = int(res.get("resent_messages", 0))
                ev.skipped_messages = int(res.get("skipped_messages", 0))
        for entry in self.membership_log:
            if entry["op"] == "remove" and "committed_seq" in entry:
                fs = [f for f in records if f["worker"] == entry["worker"]]
                entry["replayed_messages"] = sum(int(f["replayed_messages"]) for f in fs)
                done = [float(f["recovered_ts"]) - self.t0 for f in fs
                        if f.get("recovered_ts") is not None]
                entry["recovered_s"] = max(done) if done else None
        peak = dict(self.peak_rss)
        for i, ws in enumerate(worker_stats):  # actors on other nodes report their own
            if ws.get("peak_rss_mb") is not None:
                peak[f"worker-{i}"] = max(peak.get(f"worker-{i}", 0.0), float(ws["peak_rss_mb"]))
        for ss in source_stats:
            name = f"source-{ss['source']}" + (f".{ss['epoch']}" if ss.get("epoch") else "")
            if ss.get("peak_rss_mb") is not None:
                peak[name] = max(peak.get(name, 0.0), float(ss["peak_rss_mb"]))
        if agg_stats.get("peak_rss_mb") is not None:
            peak["aggregator"] = max(peak.get("aggregator", 0.0), float(agg_stats["peak_rss_mb"]))
        return {
            "failures": [ev.as_dict() for ev in self.events],
            "peak_rss_mb": dict(sorted(peak.items())),
            "dead_workers": sorted(self.dead_workers),
            "membership_changes": self.membership_log,
            "source_restarts": [{"source": src, "epoch": epoch}
                                for src, epoch, _ in self.restarts],
        }


    def annotate(self, report: dict[str, Any], source_stats: list[dict[str, Any]],
                 worker_stats: list[dict[str, Any]], agg_stats: dict[str, Any]) -> None:
        """Add the failure and memory keys to a built report (never removes any)."""
        report.update(self.report(source_stats, worker_stats, agg_stats))
        report["messages"]["replayed"] = sum(f["replayed_messages"] for f in report["failures"])
        for i, w in enumerate(report["workers"]):
            w["dead"] = i in self.dead_workers
            w["peak_rss_mb"] = report["peak_rss_mb"].get(f"worker-{i}")
        for entry, st in zip(report.get("sources", []), source_stats, strict=False):
            entry["epoch"] = st.get("epoch", 0)
            entry["retained_peak_messages"] = st.get("retained_peak_messages")
            entry["peak_rss_mb"] = st.get("peak_rss_mb")
            entry["joins"] = st.get("joins", [])


def _dead_worker_stats(i: int, committed: int) -> dict[str, Any]:
    return {
        "id": i, "processed": committed, "batches": 0, "keys": 0, "flushes": 0,
        "stopped_s": 0.0, "latency": LatencyHistogram().to_sparse(),
        "signals_emitted": {"increase": 0, "decrease": 0}, "queue_capacity_batches": 1,
        "series": {"slot": [], "processed": [], "queue_msgs": [], "queue_batches": [],
                   "busy": [], "latency": {}},
        "dead": True,
    }
