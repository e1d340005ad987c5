"""The driver of a real run: Spark input -> sources -> workers -> aggregator.

``run_pipeline(topo, out_dir, spark)`` runs one topology inside an already
initialized Ray cluster with a RayDP Spark session (``runtime.run`` sets both
up; tests share one session) and returns the report, phase by phase
(``_PipelineRun``'s methods):

1. workers: the ``aggregator`` and ``worker-<i>`` actors are created first,
   so their processes start and warm up while Spark loads the input;
2. load: the input handed to the sources while Spark still reads it
   (``actors.spark_input.FeedLoad``: Spark's Arrow batches, partition by
   partition, cut into blocks dealt to the sources; a generated stream chunk
   by chunk with ``input.chunk_messages``), or a live stream's first file;
   then ``source-<i>`` and the ``actors.faults.Supervisor`` over them all. Actors take ``num_cpus=0`` (they are I/O and sleep bound,
   and Spark's executor needs the CPU); each run has its own Ray namespace so
   names stay readable in the dashboard;
3. throttling: a duty-cycle (or cpulimit) throttler per node - a thread here
   for this node's workers, a pinned ``ThrottleActor`` for any other node -
   following ``workers.changes``; ``service`` mode instead tells each worker
   its new capacity;
4. live input: a live stream's ``LiveInput``; the progress bar and live metrics;
5. start: one ``t0`` for every actor, then the sources run;
6. supervise: faults, capacity changes, a progress bar on stderr (processed /
   total, rate, current imbalance), a live stream's results and stop conditions;
7. drain: resume every process, final flush, the aggregator's table;
8. report: the actors' statistics as ``runtime.reporting.report``'s engine-neutral
   input (``measurements``), the shared report plus this engine's sections
   (aggregator, throttlers, cluster, stream, failures), and ``report.json`` /
   ``timeseries.csv`` / ``result.parquet`` / ``report.png``.

Every throttled process is SIGCONTed and every actor of the run is killed on
the way out, whatever happened - except, after a clean run in a session that
runs again, its aggregator, workers and sources: recycled, they wait for the
session's next run (``actors.pool``), which takes them instead of starting
new processes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import ray

from actors import aggregator as aggregator_mod
from actors import cluster as cluster_mod
from actors import faults as faults_mod
from actors import pool as pool_mod
from actors import source as source_mod
from actors import stream_input as stream_mod
from actors import telemetry
from actors import throttle as throttle_mod
from actors import worker as worker_mod
from actors.spark_input import FeedLoad, feed_load, session_cpus
from runtime.dataflow import checkpoint as ckpt_mod
from runtime.dataflow import settings as settings_mod
from runtime.placement import actor_options
from runtime.reporting import phases as phases_mod
from runtime.reporting import report as report_mod
from runtime.reporting.cores import Capacities, counts_input_keys, measurements
from runtime.reporting.report import write_result, write_run
from runtime.topology import Topology, TopologyError

POLL_S = 0.25


def core_settings(topo: Topology, coordinator: Any) -> settings_mod.CoreSettings:
    """What the actors are built from: the topology's settings as they are
    (``runtime.sim.cores.core_settings`` differs only where the simulator
    models the throttle and the queue); ``coordinator``: the run's
    controller, or None."""
    return settings_mod.CoreSettings.from_topology(topo, coordinator)


class StopRequests:
    """A live stream's stop conditions: SIGINT / SIGTERM (the first asks for a
    graceful stop; a second one interrupts), ``run.duration_s`` and
    ``run.until_idle_s``. Signal handlers are installed only in the main
    thread, and the previous ones are back on exit."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        print(f"\n{self.signal}: stopping - what has arrived is processed and written "
              f"(again to interrupt)", file=sys.stderr)

    def reason(self, run: Any, now_s: float, idle_s: float) -> str | None:
        """Why to stop now (``now_s`` since the start, ``idle_s`` since the last
        data), or ``None``."""
        if self.signal is not None:
            return "signal"
        if run.duration_s is not None and now_s >= run.duration_s:
            return "duration"
        if run.until_idle_s is not None and idle_s >= run.until_idle_s:
            return "idle"
        return None


class _Progress:
    def __init__(self, total: int | None, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=sys.stderr, unit="msg", unit_scale=True,
                            dynamic_ncols=True, desc="processed", mininterval=0.25)
        self.done = 0

    def update(self, done: int, imbalance: float | None, lag: int | None = None) -> None:
        if self.bar is not None:
            if done > self.done:
                self.bar.update(done - self.done)
            post = [] if lag is None else [f"lag={lag:,}"]
            if imbalance is not None:
                post.append(f"I(t)={imbalance:.2f}")
            if post:
                self.bar.set_postfix_str(" ".join(post), refresh=False)
        self.done = max(self.done, done)

    def set_total(self, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Throttling:
    """Per-node throttlers for one run (a local thread + remote actors elsewhere)."""

    def __init__(self, mode: str, pids: list[int], nodes: list[str], caps: list[float],
                 changes: list[tuple[float, int, float]], namespace: str) -> None:
        self.local: Any = None
        self.remote: dict[str, Any] = {}
        self.status: dict[str, Any] = {}
        here = ray.get_runtime_context().get_node_id()
        by_node: dict[str, list[int]] = {}
        for w, node in enumerate(nodes):
            by_node.setdefault(node, []).append(w)
        self._targets: dict[str, Any] = {}
        for node, ws in by_node.items():
            if node == here:
                self.local = throttle_mod.make_throttler(mode)
                t = self.local
                for w in ws:
                    t.set_capacity(pids[w], caps[w])
                self._targets[node] = (t, ws)
            else:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                a = throttle_mod.actor_class().options(
                    name=f"throttle-{node[:8]}", namespace=namespace, num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(mode)
                ray.get([a.set_capacity.remote(pids[w], caps[w]) for w in ws])
                self.remote[node] = a
                self._targets[node] = (a, ws)
        self._changes = changes
        self._pids = pids

    def start(self, t0: float) -> None:
        for node, (t, ws) in self._targets.items():
            mine = [(at, self._pids[w], c) for at, w, c in self._changes if w in ws]
            if node in self.remote:
                ray.get([t.schedule.remote(mine, t0), t.start.remote()])
            else:
                t.schedule(mine, t0)
                t.start()

    def check(self) -> None:
        if self.local is not None and self.local.error is not None:
            raise RuntimeError(f"throttler failed: {self.local.error!r}")

    def stop(self) -> None:
        """Resume everything (idempotent; never raises for a dead remote throttler)."""
        if self.local is not None:
            self.local.stop()
            self.status["local"] = self.local.status()
        for node, a in self.remote.items():
            try:
                self.status[node] = ray.get(a.stop.remote(), timeout=10)
            except Exception as e:  # noqa: BLE001 - report, keep stopping the others
                self.status[node] = {"error": repr(e)}


def _operator_modules(op: Any) -> tuple[str, ...]:
    """The modules of a user's operator (its state's classes may live there)."""
    inner = op.op
    while hasattr(inner, "inner"):  # a windowed operator
        inner = inner.inner.op
    module = type(inner).__module__
    return () if module.startswith("runtime.") else (module,)


def _stream_checkpoint(topo: Topology, out_dir: str | Path,
                       resume: bool) -> ckpt_mod.Checkpoint | None:
    """The checkpoint a live stream resumes from (``None``: a new stream);
    one-line ``TopologyError`` for what cannot be resumed or would be overwritten."""
    if not resume:
        if ckpt_mod.exists(out_dir):
            raise TopologyError(f"--out: {out_dir} holds a live stream's checkpoint: add "
                                f"--resume to continue that stream, or choose another --out")
        if topo.run.checkpoint or topo.app.window is not None:
            from runtime.operators import operator_for_app

            op = operator_for_app(topo.app.model_dump(), topo.base_dir)
            if not op.spec.mergeable and topo.app.window is not None:
                raise TopologyError(f"app.window: {op.spec.name} is not mergeable, so a live "
                                    f"stream cannot emit its windows (the aggregator merges "
                                    f"them); window a finite input, or use a mergeable operator")
            if not op.spec.mergeable:
                raise TopologyError(f"run.checkpoint: {op.spec.name} is not mergeable, so its "
                                    f"state cannot be checkpointed; set run.checkpoint: false")
        return None
    from runtime.operators import operator_for_app

    try:
        ckpt = ckpt_mod.load(out_dir, _operator_modules(
            operator_for_app(topo.app.model_dump(), topo.base_dir)))
    except ValueError as e:
        raise TopologyError(f"--resume: {e}") from None
    if ckpt is None:
        raise TopologyError(f"--resume: no checkpoint in {out_dir} (a live stream's --out, "
                            f"run with run.checkpoint: true)")
    if ckpt.app != topo.app.model_dump():
        raise TopologyError(f"--resume: the checkpoint in {out_dir} is of another app "
                            f"({ckpt.app.get('kind')!r}; the topology's is {topo.app.kind!r})")
    return ckpt


RunRestart = faults_mod.RunRestart


def _lost_actor(agg: Any, faults: Any, live: bool) -> str | None:
    """``"the aggregator"`` if it died, or (a live stream, whose sources cannot
    be replaced in place) ``"source-i"``; else ``None``."""
    try:
        ray.get(agg.pid.remote(), timeout=10)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return "the aggregator"
    if not live:
        return None
    runs = list(getattr(faults, "runs", []))  # none before the sources started
    ready, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            return f"source-{runs.index(ref)}"
        except Exception:  # noqa: BLE001 - another failure: not a lost actor
            continue
    return None


def run_with_restarts(topo: Topology, out_dir: str | Path, spark: Any, *, resume: bool = False,
             restarts: int = 3, log: Callable[[str], None] | None = None,
             **kw: Any) -> dict[str, Any]:
    """``run_pipeline``, surviving the loss of an actor it cannot replace in
    place (``RunRestart``): the aggregator, or a live stream's source. The
    attempt is stopped and another one starts - a live stream from its last
    checkpoint, a finite input from its start (the aggregator held everything
    committed; the sources keep only what is not) - at most ``restarts`` times.
    The topology's ``faults`` that were due by then are not injected again; the
    later ones are, in the new attempt. The report is the last attempt's, with
    ``restarts`` (why and when each restart happened; a live stream's also in
    ``stream.restarts``) and every attempt's ``failures``."""
    say = log or (lambda m: print(m, file=sys.stderr))
    history: list[dict[str, Any]] = []
    live = topo.input.stream
    while True:
        try:
            return run_pipeline(topo, out_dir, spark, resume=resume, log=log,
                                history=history, **kw)
        except RunRestart as e:
            if live and (not topo.run.checkpoint or len(history) == restarts):
                raise TopologyError(f"{e}; the checkpoint in {out_dir} is intact: continue "
                                    f"with --resume") from None
            if len(history) == restarts:
                raise RuntimeError(f"{e}: given up after {restarts} restarts") from None
            say(f"[{topo.name}] {e}: restarting the "
                + ("stream from its checkpoint" if live else "run from the start of its input"))
            history.append({"cause": str(e), "at_s": e.at_s, "failures": e.failures})
            topo = topo.model_copy(update={"faults": faults_mod.still_to_inject(
                topo.faults, e.at_s, e.failures)})
            resume = live


class _LiveResults:
    """A live stream's ``result.parquet``, replaced every ``every_s`` by the
    aggregator's answer so far (``runtime.reporting.report.write_result``); the aggregator
    is asked without blocking the driver's loop."""

    def __init__(self, agg: Any, out_dir: str | Path, every_s: float, t0: float,
                 answer: Callable[[Any], Any]) -> None:
        """``answer``: the aggregator's result -> the stream's answer
        (``LiveInput.answer``: a windowed stream's emitted windows go in)."""
        self.agg, self.out_dir, self.every_s, self.answer = agg, out_dir, every_s, answer
        self.next_ts = t0 + every_s
        self.pending: Any = None
        self.written = 0
        self.open_windows: int | None = None  # a windowed stream's, at the last answer

    def poll(self) -> None:
        if self.pending is not None:
            ready, _ = ray.wait([self.pending], timeout=0)
            if not ready:
                return
            table = ray.get(self.pending)
            if "window_start" in table.column_names:
                self.open_windows = len(table.column("window_start").unique())
            write_result(self.out_dir, self.answer(table))
            self.pending = None
            self.written += 1
        if time.time() >= self.next_ts:
            self.next_ts = time.time() + self.every_s
            self.pending = self.agg.result.remote()


def run_pipeline(
    topo: Topology,
    out_dir: str | Path,
    spark: Any,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    df: Any = None,
    resume: bool = False,
    plot: bool = True,
    clock: phases_mod.RunClock | None = None,
    history: list[dict[str, Any]] | None = None,
    reuse_actors: bool = True,
) -> dict[str, Any]:
    """Run ``topo`` in the current Ray cluster; write the outputs; return the report.

    ``df``: the input DataFrame if the caller already built it (default:
    ``build_dataframe(spark, topo)``). ``resume``: a live stream continues from
    the checkpoint in ``out_dir`` (``runtime.dataflow.checkpoint``). ``plot``:
    write ``report.png`` (``False``: the caller plots later,
    ``report.write_plot``). ``clock``: the run's ``phases`` clock (default:
    one starting now, ``RunClock.take``).
    ``history``: the earlier attempts ``run_with_restarts`` restarted (for the report).
    ``reuse_actors``: take idle actors of this session's earlier runs, and
    leave this run's for the next one (``actors.pool``); ``False``: new actor
    processes, all killed at the end (a process that runs once).
    Raises ``RunRestart`` when the aggregator (or a live stream's source) died.
    """
    r = _PipelineRun(topo, out_dir, spark, progress=progress, log=log, plot=plot,
                     clock=clock if clock is not None else phases_mod.RunClock.take())
    r.history = list(history or [])
    r.reuse_actors = reuse_actors
    try:
        r.create_workers(resume)
        r.load(df)
        r.start_actors()
        r.start_throttling()
        r.open_stream()
        r.start()
        r.supervise()
        r.drain()
        r.completed = True
    except Exception as e:
        r.raise_restart_if_lost(e)
        raise
    finally:
        r.release()
    return r.write_outputs()


class _PipelineRun:
    """One run of ``run_pipeline``, phase by phase (the module's docstring);
    what a phase finds out is kept for the phases after it."""

    def __init__(self, topo: Topology, out_dir: str | Path, spark: Any, *, progress: bool,
                 log: Callable[[str], None] | None, plot: bool = True,
                 clock: phases_mod.RunClock | None = None) -> None:
        self.topo, self.out_dir, self.spark, self.progress = topo, out_dir, spark, progress
        self.plot, self.clock = plot, clock or phases_mod.RunClock(time.time(), 0.0)
        self.say = log or (lambda m: print(m, file=sys.stderr))
        self.n = topo.workers.total_count  # added workers are started up front, idle until added
        self.caps = Capacities(topo)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        self.namespace = f"{topo.name}-{stamp}"
        self.actors: list[Any] = []
        #: the actors the next run of this session may reuse (``actors.pool``), by key
        self.reusable: list[tuple[Any, Any]] = []
        self.completed = False  # drained without an exception
        self.reuse_actors = True
        self.reused = 0  # actors taken from the pool (named in the namespace of their first run)
        #: the user's code a reused process must hold (``actors.pool``): a
        #: file operator's fingerprint; ``None`` for a built-in app
        self.code: str | None = None
        if topo.app.kind == "operator" and topo.app.operator:
            from runtime.operators import file_fingerprint

            self.code = file_fingerprint(topo.app.operator, topo.base_dir)
        self.throttling: _Throttling | None = None
        self.bar = _Progress(0, False)
        self.stops = StopRequests()
        self.stream: stream_mod.LiveInput | None = None
        self.loader: FeedLoad | None = None  # a finite input, handed over as Spark reads it
        self.stopped_by: str | None = None
        self.lag_max = 0
        self.history: list[dict[str, Any]] = []  # earlier attempts (run_with_restarts)

    # ------------------------------------------------------------------ 1. workers
    def create_workers(self, resume: bool) -> None:
        """The aggregator and the workers, created before the input loads: their
        processes start (and warm up) while Spark works. Not waited for here."""
        topo, n, namespace = self.topo, self.n, self.namespace
        wspec, run = topo.workers, topo.run
        # fail in seconds (exit 2) if the cluster can never host this placement
        cluster_mod.check_placement(topo, spark_cpus=session_cpus())
        self.resume_from: ckpt_mod.Checkpoint | None = (
            _stream_checkpoint(topo, self.out_dir, resume) if topo.input.stream else None)
        self.inactive = inactive = faults_mod.not_yet_added(topo)
        coordinator = settings_mod.coordinator_for(
            topo, alive=[w for w in range(n) if w not in inactive])
        self.settings = settings = core_settings(topo, coordinator)
        app = settings.aggregator

        agg, self.agg_ready = self.actor(aggregator_mod, "aggregator", 0, {
            "name": "aggregator", "namespace": namespace,
            **actor_options(topo.placement.get("aggregator"))},
            app, coordinator,
            state=self.resume_from.state if self.resume_from is not None else None)

        workers, self.workers_ready = [], []
        for i in range(n):
            opts: dict[str, Any] = {
                "name": f"worker-{i}", "namespace": namespace,
                "max_concurrency": topo.sources * run.max_inflight + wspec.queue_batches + 8,
                **actor_options(topo.placement.get(f"worker-{i}")),  # num_cpus=0 unless asked
            }
            w, ready = self.actor(worker_mod, "worker", i, opts, i, app.app, app.base_dir, agg,
                                  settings.workers[i])
            workers.append(w)
            self.workers_ready.append(ready if ready is not None else w.pid.remote())
        self.agg, self.workers = agg, workers

    def _unknown_code(self) -> bool:
        """A user's operator whose code has no fingerprint (named by module
        path): its processes are neither taken from the pool nor left to it."""
        return self.topo.app.kind == "operator" and self.code is None

    def actor(self, module: Any, role: str, index: int, options: dict[str, Any],
              *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """``module.actor_class()`` with ``options``, built from ``args`` and
        ``kwargs``: an idle actor of this session reused (``actors.pool``;
        then also the ref of its ``rebind``, which returns its pid, else ``None``)
        or a new one."""
        key = (pool_mod.POOL.key(role, index, options, self.code)
               if self.reuse_actors and not self._unknown_code() else None)
        actor = pool_mod.POOL.take(key)
        ready = None
        if actor is None:
            actor = module.actor_class().options(**options).remote(*args, **kwargs)
        else:
            ready = actor.rebind.remote(*args, **kwargs)
            self.reused += 1
        self.actors.append(actor)
        if key is not None:
            self.reusable.append((key, actor))
        return actor, ready

    # ------------------------------------------------------------------ 2. load
    def load(self, df: Any) -> None:
        """The input: a ``FeedLoad`` started (its first block is in; ``load_s``
        is that wait), or (a live stream) its first file."""
        topo, say = self.topo, self.say
        t_load = time.time()
        self.distinct_input: int | None = None
        if topo.input.stream:
            self.shards: list[Any] = [None] * topo.sources  # the sources are fed micro-batches
            self.total: int | None = 0
            with self.stops:
                if not stream_mod.wait_for_first_file(topo.input_path() or Path(),
                                                      lambda: self.stops.signal is not None,
                                                      topo.run.until_idle_s, say):
                    raise TopologyError(f"input.path: no file arrived in {topo.input.path!r}")
            say(f"[{topo.name}] live stream over {topo.input.path}; {self.where_actors()}")
        else:  # the sources start on the first block while Spark produces the rest
            self.loader = feed_load(self.spark, topo, df,  # Spark plans the input
                                    count_distinct=counts_input_keys(topo))
            self.clock.input_part("plan", time.time() - t_load)
            self.actors.append(self.loader.feed)
            t_first = time.time()
            self.loader.start()
            self.clock.input_part("first_block", time.time() - t_first)
            self.shards, self.total = self.loader.shards, self.loader.messages
            say(f"[{topo.name}] input: the first block in {time.time() - t_load:.1f} s, "
                f"the sources start on it while Spark reads on; {self.where_actors()}")
        self.load_s = time.time() - t_load

    def where_actors(self) -> str:
        """Where to find this run's actors in Ray (the log's line)."""
        reused = (" (those reused from an earlier run of this session keep that run's)"
                  if self.reused else "")
        return f"actors in Ray namespace {self.namespace}{reused}"

    # ------------------------------------------------------------------ 2. sources
    def start_actors(self) -> None:
        """Wait for the workers; the sources and the ``Supervisor`` over them."""
        topo, n, namespace = self.topo, self.n, self.namespace
        agg, workers, inactive = self.agg, self.workers, self.inactive
        t_workers = time.time()
        # bounded: a placement the cluster cannot serve now fails instead of hanging
        self.pids = cluster_mod.wait_for_actors(self.workers_ready,
                                                [f"worker-{i}" for i in range(n)],
                                                topo.placement)
        self.nodes = ray.get([w.node_id.remote() for w in workers])
        if self.agg_ready is not None:  # a reused aggregator is the run's before anyone commits
            ray.get(self.agg_ready)
        self.clock.input_part("workers", time.time() - t_workers)  # (started before the load)

        shards = self.shards

        def make_source(s: int, epoch: int = 0, dead: list[int] | None = None) -> Any:
            """Source ``s`` (``epoch`` > 0: a restart after it died, see actors.faults)."""
            if epoch > 0 and topo.input.stream:  # its inbox died with it
                raise RunRestart(f"source-{s} died", time.time() - self.t0,
                                 self.faults.failure_events())
            src, ready = self.actor(source_mod, "source", s, {
                "name": f"source-{s}" + (f".{epoch}" if epoch else ""),
                "namespace": namespace, "max_concurrency": 4,
                **actor_options(topo.placement.get(f"source-{s}"))},
                s, shards[s], workers, self.settings.source, aggregator=agg, epoch=epoch,
                dead_workers=inactive if dead is None else dead)
            if ready is not None:  # rebound before any other call (a threaded actor)
                ray.get(ready)
            return src

        sources = [make_source(s) for s in range(topo.sources)]
        if self.reuse_actors:
            pool_mod.POOL.clear()  # what this run did not take
        t_sources = time.time()
        ray.get([s.prepare.remote() for s in sources])  # grouping compiled, first batch read
        self.clock.input_part("sources", time.time() - t_sources)
        self.sources = sources
        self.faults = faults_mod.Supervisor(topo, workers, sources, agg, make_source, self.say)
        self.cluster_info = cluster_mod.cluster_summary(
            {"aggregator": agg, **{f"worker-{i}": w for i, w in enumerate(workers)},
             **{f"source-{i}": s for i, s in enumerate(sources)}})

    # ------------------------------------------------------------------ 3. throttling
    def start_throttling(self) -> None:
        """A throttler per node when capacities are enforced by stopping processes."""
        wspec = self.topo.workers
        self.changes = [(c.at_s, c.worker, c.capacity) for c in wspec.changes]
        if wspec.throttle in ("duty-cycle", "cpulimit") and (
                any(c < 1 for c in self.caps.initial) or self.changes):
            self.throttling = _Throttling(wspec.throttle, self.pids, self.nodes,
                                          self.caps.initial, self.changes, self.namespace)

    # ------------------------------------------------------------------ 4. live input
    def open_stream(self) -> None:
        """A live stream's input (``None`` otherwise), the progress bar and live metrics."""
        topo, run = self.topo, self.topo.run
        if topo.input.stream:
            self.stream = stream_mod.LiveInput(self.spark, topo, self.sources, self.out_dir,
                                               aggregator=self.agg,
                                               checkpoint=run.checkpoint,
                                               checkpoint_every_s=run.checkpoint_every_s,
                                               resume_from=self.resume_from,
                                               count_keys=counts_input_keys(topo))
            if run.checkpoint:  # a --resume after this driver dies stops what is left
                ckpt_mod.record_processes(self.out_dir)
        self.bar = _Progress(None if self.stream else self.total, self.progress)
        self.live = telemetry.RunTelemetry(self.namespace, name=topo.name,
                                           scheme=topo.grouping.scheme, app=topo.app.kind,
                                           workers=self.n, sources=topo.sources,
                                           messages=self.total or 0)

    # ------------------------------------------------------------------ 5. start
    def start(self) -> None:
        """One ``t0`` for every actor; then the throttlers, the sources and the stream go."""
        topo, stream = self.topo, self.stream
        if topo.app.kind == "operator":  # what the user's operator prints: OUT/operators.log
            from actors.operator_output import OPERATOR_LOG

            log = str(Path(self.out_dir).resolve() / OPERATOR_LOG)
            ray.get([w.capture_output.remote(log, f"worker-{i}")
                     for i, w in enumerate(self.workers)]
                    + [self.agg.capture_output.remote(log, "aggregator")])
        self.t0 = t0 = time.time()
        ray.get([w.start_run.remote(t0, self.namespace) for w in self.workers]
                + [self.agg.start_run.remote(t0)])
        if self.throttling is not None:
            self.throttling.start(t0)
        self.faults.start(t0, self.namespace)  # the sources' runs (restarted ones replace theirs)
        if stream is not None:
            self.stops.__enter__()
            if topo.run.checkpoint:
                if self.resume_from is None:  # from now on a --resume always finds one
                    stream.checkpoint()
                elif stream.replay_log():
                    self.say(f"[{topo.name}] resumed: {stream.replayed_batches} logged "
                             f"micro-batch(es) handed over again")
            stream.start()
        self.results = _LiveResults(self.agg, self.out_dir, topo.app.aggregate_every_s, t0,
                                    stream.answer if stream is not None else (lambda t: t))

    # ------------------------------------------------------------------ 6. supervise
    def supervise(self) -> None:
        """Every ``POLL_S`` until the sources are done: faults, capacity changes,
        progress, and a live stream's results and stop conditions."""
        run, faults, stream, t0 = self.topo.run, self.faults, self.stream, self.t0
        # every worker learns its capacity changes (its live metrics show them); in
        # service mode that is also how the change is applied
        pending_changes = sorted(self.changes)
        next_imb = 0.0
        self.imb: float | None = None
        while True:
            ray.wait(faults.runs, num_returns=len(faults.runs), timeout=POLL_S)
            done = faults.acked()
            faults.poll(done)  # inject due faults, detect deaths, restart sources
            now_s = time.time() - t0
            while pending_changes and pending_changes[0][0] <= now_s:
                _, w, c = pending_changes.pop(0)
                self.workers[w].set_capacity.remote(c)
            if self.throttling is not None:
                self.throttling.check()
            if now_s >= next_imb:
                next_imb = now_s + 1.0
                utils = faults.utilizations()
                self.imb = float(max(utils) - np.mean(utils))
            if stream is None:
                if self.total is None and self.loader is not None and self.loader.done:
                    self.total = self.loader.rows  # a file's length: known once read
                    self.bar.set_total(self.total)
                self.bar.update(done, self.imb)
                self.live.update(done, self.imb, messages=self.total)
            else:
                stream.check()
                lag = max(0, stream.rows - done)
                self.lag_max = max(self.lag_max, lag)
                self.bar.update(done, self.imb, lag)
                events = stream.events
                self.live.update(done, self.imb, messages=stream.rows, lag=lag,
                                 watermark=(None if events is None or events.watermark is None
                                            else (events.watermark, str(events.unit))),
                                 windows_open=self.results.open_windows)
                self.results.poll()
                if self.stopped_by is None:
                    self.stopped_by = self.stops.reason(run, now_s, stream.idle_s(since=t0))
                    if self.stopped_by is not None:
                        stream.stop()
                        ray.get([s.end_stream.remote() for s in self.sources])
            if self.faults.finished():
                break

    # ------------------------------------------------------------------ 7. drain
    def drain(self) -> None:
        """The sources' statistics, resume every process, the workers' final
        flush and statistics, the aggregator's table."""
        stream = self.stream
        self.source_stats = ray.get(self.faults.runs)
        if self.loader is not None:  # every block was streamed: the load is over
            self.loader.join()
            self.total, self.distinct_input = self.loader.rows, self.loader.distinct
            if 0 in self.loader.per_source:
                self.say(f"[{self.topo.name}] warning: uneven shards {self.loader.per_source} "
                         f"(a source had nothing to send)")
        if stream is not None:
            self.total = stream.rows
            if stream.keys is not None:
                self.distinct_input = len(stream.keys)
            if stream.cutting:  # everything handed over is committed: the last one
                stream.finish_checkpoints()
                stream.checkpoint()
        # the last ack, not when this loop noticed it (sources' clock: time.time)
        self.duration_s = max(max(s.end_ts for s in self.source_stats) - self.t0, 1e-9)
        self.bar.update(sum(s.acked for s in self.source_stats), self.imb)
        self.live.update(sum(s.acked for s in self.source_stats), self.imb)
        self.bar.close()
        if self.throttling is not None:  # stopped workers cannot flush
            self.throttling.stop()
        self.worker_stats = self.faults.finish_workers()  # a dead worker's from the aggregator
        self.result = ray.get(self.agg.result.remote())
        if stream is not None:
            self.result = stream.answer(self.result)
        self.agg_stats = ray.get(self.agg.stats.remote())

    def raise_restart_if_lost(self, error: Exception) -> None:
        """A run that lost its aggregator (or a live stream's source) restarts
        (``run_with_restarts``), whatever error that death caused here first."""
        if isinstance(error, RunRestart) or not hasattr(self, "agg"):
            return
        lost = _lost_actor(self.agg, getattr(self, "faults", None), self.stream is not None)
        if lost is None:
            return
        supervisor = getattr(self, "faults", None)
        if lost == "the aggregator" and supervisor is not None:
            try:
                supervisor.aggregator_lost(type(error).__name__)
            except RunRestart as restart:
                raise restart from error
        at_s = time.time() - self.t0 if hasattr(self, "t0") else 0.0
        failures = supervisor.failure_events() if supervisor is not None else []
        raise RunRestart(f"{lost} died", at_s, failures) from error

    def release(self) -> None:
        """Whatever happened: no process left stopped, no actor of the run left
        (but those recycled for the session's next run, ``recycle``)."""
        self.bar.close()
        if self.loader is not None:
            self.loader.stop()
        if self.stream is not None:
            self.stops.__exit__()
            self.stream.stop()
        if self.throttling is not None:
            self.throttling.stop()
        kept = {id(a) for a in self.recycle()}
        for a in self.actors:
            if id(a) not in kept:
                pool_mod.kill_quietly(a)
        if self.stream is not None:
            # a checkpoint still being saved would otherwise finish beside the
            # next attempt and drop logged micro-batches that attempt replays
            # (the actors are gone, so it ends now: saved whole, or not at all)
            self.stream.finish_checkpoints()

    def recycle(self) -> list[Any]:
        """After a clean run, the actors this session's next run may reuse,
        now in the pool (``actors.pool``: they recycle while this run writes
        its outputs); ``release`` kills the others.
        Nothing is kept after a failure, an injected fault or a restart, nor
        from a user's operator whose code cannot be told (``_unknown_code``)."""
        supervisor = getattr(self, "faults", None)
        if (not self.reuse_actors or not self.completed or self.history or self.topo.faults
                or self._unknown_code() or supervisor is None
                or supervisor.failure_events()):
            return []
        return [a for key, a in self.reusable if pool_mod.POOL.give(key, a)]

    # ------------------------------------------------------------------ 8. report
    def write_outputs(self) -> dict[str, Any]:
        """``report.json`` (the shared report plus this engine's sections),
        ``timeseries.csv``, ``result.parquet``, ``report.png``; returns the report."""
        topo, throttling = self.topo, self.throttling
        measured = measurements(topo, self.caps, self.total or 0, self.duration_s, self.load_s,
                                self.source_stats, self.worker_stats, self.result,
                                self.agg_stats, self.distinct_input)
        report: dict[str, Any] = dict(report_mod.build_report(topo, measured))
        report["aggregator"] = self.agg_stats.as_report()
        report["throttle"] = throttling.status if throttling else {}
        for w_report, node in zip(report["workers"], self.nodes, strict=True):
            w_report["node_id"] = node  # where it ran (placement is checked against this)
        if throttling is not None:
            self.cluster_info["throttlers"] = {
                node: ("driver" if node not in throttling.remote else f"throttle-{node[:8]}")
                for node in throttling._targets}
        report["cluster"] = self.cluster_info
        if self.loader is not None:
            c = self.loader
            report["input_load"] = {"chunks": c.chunks, "chunk_messages": c.chunk,
                                    "block_rows": c.block_rows, "rows_per_source": c.per_source,
                                    "first_chunk_s": c.first_s, "all_chunks_s": c.all_s}
        if self.stream is not None:
            report["stream"] = {**self.stream.stats(), "stopped_by": self.stopped_by,
                                "lag_max": self.lag_max, "results_written": self.results.written,
                                "max_pending_rows": topo.run.max_pending_rows,
                                "max_files_per_trigger": topo.input.max_files_per_trigger}
        self.faults.annotate(report, self.source_stats, self.worker_stats,
                             self.agg_stats)  # failures, peak RSS
        if self.history or self.stream is not None:  # earlier attempts (run_with_restarts)
            report["restarts"] = self.history
            report["failures"] = [f for h in self.history for f in h["failures"]
                                  ] + report["failures"]
            if self.stream is not None:
                report["stream"]["restarts"] = [h["cause"] for h in self.history]
        self.clock.start(self.t0)  # the sources go, each holding its first batch
        self.clock.end(self.t0 + self.duration_s)  # the last ack
        report["phases"] = self.clock.block()
        write_run(self.out_dir, report, report_mod.timeseries(measured.series), self.result,
                  plot=self.plot)
        return {**report, "result": {"path": "result.parquet", "rows": self.result.num_rows}}
