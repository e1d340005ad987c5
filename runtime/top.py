"""``python -m runtime.top [--url HOST:PORT ...] [--address ADDR] [--run TEXT] [--once]``

A live terminal view of a running topology. Every second it reads our
application metrics (``actors.telemetry``, ``ray_hs_*``) from the Prometheus
endpoint of every Ray node and draws, for the newest run (or the one whose
name contains ``--run``): progress, throughput, the current imbalance, and per
worker a bar of its processing rate and of its utilization, queue length,
capacity, busy and stopped fractions, latency percentiles and the virtual
workers it owns (CG); per source the messages routed and acknowledged, the
load signals received and the virtual workers moved.

Where the endpoints come from: ``--url`` (repeatable); else ``--address``
(connects to that Ray cluster once and asks ``ray.nodes()``); else every
local Ray session under ``--ray-tmp`` (default ``$RAY_TMPDIR`` or
``/tmp/ray``), so it can be started before ``python -m runtime.run`` and
follows one run after another. No Ray import, no Prometheus server needed.

``--once`` prints one frame and exits (0 if a run was shown, 1 if none).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from runtime.grouping.signals import DEFAULT_SIGNALS
from runtime.reporting import live_metrics
from runtime.reporting.live_metrics import METRICS, exported

PREFIX = live_metrics.PROMETHEUS_PREFIX
STALE_S = 5.0

# ============================================================================ parsing

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str  # without Ray's "ray_" prefix, e.g. hs_worker_processed_total
    labels: dict[str, str]
    value: float


def _unescape(s: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], s)


def parse_prometheus(text: str, prefix: str = PREFIX) -> list[Sample]:
    """Samples of the Prometheus text exposition format whose name starts with
    ``prefix`` (comments, other metrics and malformed lines are skipped)."""
    out: list[Sample] = []
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name, _, body, value, _ = m.groups()
        labels: dict[str, str] = {}
        if body:
            pos = 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                if lm is None:
                    break
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
        try:
            v = float(value)
        except ValueError:
            continue
        out.append(Sample(name.removeprefix(live_metrics.RAY_PREFIX), labels, v))
    return out


# ============================================================================ model


@dataclass
class RunView:
    """Everything the live view knows about one run (tag ``run``)."""

    run: str
    info: dict[str, str] = field(default_factory=dict)
    messages: float | None = None
    acked: float | None = None
    imbalance: float | None = None
    lag: float | None = None  # a live stream's
    watermark: tuple[float, str] | None = None  # a windowed live stream's (ticks, unit)
    windows_open: float | None = None
    heartbeat: float = 0.0
    workers: dict[int, dict[str, float]] = field(default_factory=dict)
    sources: dict[int, dict[str, float]] = field(default_factory=dict)
    vw: dict[int, dict[int, float]] = field(default_factory=dict)  # worker -> source -> VWs

    def vw_owned(self, worker: int) -> float | None:
        per = self.vw.get(worker)
        return sum(per.values()) / len(per) if per else None

    def utilization_imbalance(self) -> float | None:
        u = [w["utilization"] for w in self.workers.values() if "utilization" in w]
        return max(u) - sum(u) / len(u) if u else None


#: exported sample name -> the field of ``RunView.workers`` / ``.sources`` it fills
_WORKER = {exported(name): f for name, f in (
    (live_metrics.WORKER_PROCESSED, "processed"),
    (live_metrics.WORKER_RATE, "rate"),
    (live_metrics.WORKER_QUEUE_MESSAGES, "queue_msgs"),
    (live_metrics.WORKER_QUEUE_BATCHES, "queue_batches"),
    (live_metrics.WORKER_UTILIZATION, "utilization"),
    (live_metrics.WORKER_BUSY, "busy"),
    (live_metrics.WORKER_CAPACITY, "capacity"),
    (live_metrics.WORKER_STOPPED, "stopped"),
    (live_metrics.WORKER_LATENCY_P50, "p50_s"),
    (live_metrics.WORKER_LATENCY_P99, "p99_s"),
)}
_SOURCE = {exported(name): f for name, f in (
    (live_metrics.SOURCE_ROUTED, "routed"),
    (live_metrics.SOURCE_ACKED, "acked"),
    (live_metrics.SOURCE_MIGRATIONS, "migrations"),
)}
_SIGNALS = exported(live_metrics.SOURCE_SIGNALS)
_RUN_INFO_TAGS = METRICS[live_metrics.RUN_INFO].extra_tags


def _index(actor: str, kind: str) -> int | None:
    if not actor.startswith(kind + "-"):
        return None
    try:
        return int(actor[len(kind) + 1:])
    except ValueError:
        return None


def collect(samples: Iterable[Sample]) -> dict[str, RunView]:
    """Group samples by run."""
    runs: dict[str, RunView] = {}
    for s in samples:
        run = s.labels.get("run")
        if run is None:
            continue
        r = runs.get(run)
        if r is None:
            r = runs[run] = RunView(run)
        actor = s.labels.get("actor", "")
        n = s.name
        if n == live_metrics.HEARTBEAT:
            r.heartbeat = max(r.heartbeat, s.value)
        elif n == live_metrics.RUN_INFO:
            r.info = {k: v for k, v in s.labels.items() if k in _RUN_INFO_TAGS}
        elif n == live_metrics.RUN_MESSAGES:
            r.messages = s.value
        elif n == live_metrics.RUN_ACKED:
            r.acked = s.value
        elif n == live_metrics.RUN_IMBALANCE:
            r.imbalance = s.value
        elif n == live_metrics.RUN_LAG:
            r.lag = s.value
        elif n == live_metrics.RUN_WATERMARK:
            r.watermark = (s.value, s.labels.get("unit", "int"))
        elif n == live_metrics.RUN_WINDOWS_OPEN:
            r.windows_open = s.value
        elif n in _WORKER:
            w = _index(actor, "worker")
            if w is not None:
                r.workers.setdefault(w, {})[_WORKER[n]] = s.value
        elif n in _SOURCE or n == _SIGNALS:
            i = _index(actor, "source")
            if i is None:
                continue
            key = _SOURCE.get(n) or "signals_" + s.labels.get("kind", "?")
            r.sources.setdefault(i, {})[key] = s.value
        elif n == live_metrics.SOURCE_VW_OWNED:
            i = _index(actor, "source")
            try:
                w = int(s.labels.get("worker", ""))
            except ValueError:
                continue
            if i is not None:
                r.vw.setdefault(w, {})[i] = s.value
    return runs


def pick_runs(runs: dict[str, RunView], match: str | None = None) -> list[RunView]:
    """The runs to show: those whose name contains ``match``, newest first (by the
    last update of any of their actors)."""
    chosen = [r for r in runs.values() if not match or match in r.run]
    return sorted(chosen, key=lambda r: r.heartbeat, reverse=True)


# ============================================================================ rendering

_BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float, width: int) -> str:
    """A bar of ``width`` cells filled to ``fraction`` (clipped to [0, 1]), eighths precision."""
    f = 0.0 if not math.isfinite(fraction) else min(max(fraction, 0.0), 1.0)
    eighths = int(round(f * width * 8))
    full, rest = divmod(eighths, 8)
    s = "█" * full + (_BLOCKS[rest] if rest else "")
    return s + "·" * (width - len(s))


def _color(text: str, code: str, on: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if on else text


def _util_color(u: float) -> str:
    """Green below CG's default idle threshold, red at or above its busy one."""
    if u < DEFAULT_SIGNALS.idle_below:
        return "32"
    return "33" if u < DEFAULT_SIGNALS.busy_above else "31"


def _num(v: float | None, fmt: str = ",.0f", none: str = "-") -> str:
    return none if v is None or not math.isfinite(v) else format(v, fmt)


def render(r: RunView, now: float, *, width: int = 100, color: bool = False,
           stale_s: float = STALE_S) -> str:
    """One frame for run ``r`` as text (``now``: wall clock, for staleness)."""
    info = r.info
    age = now - r.heartbeat if r.heartbeat else float("inf")
    live = age <= stale_s
    status = (_color("running", "32", color) if live
              else _color(f"no update for {age:,.0f} s (finished?)", "33", color))
    head = f"run {r.run}"
    if info:
        head += (f"  scheme {info.get('scheme', '?')}  app {info.get('app', '?')}  "
                 f"{info.get('sources', '?')} source(s) -> {info.get('workers', '?')} workers")
    lines = [head[:width], f"status {status}   {time.strftime('%H:%M:%S', time.localtime(now))}"]

    rates = [w.get("rate", 0.0) for w in r.workers.values()]
    throughput = sum(rates)
    # the report's I(t) on 1-s slots (the util column); else the driver's sample
    imb = r.utilization_imbalance()
    if imb is None:
        imb = r.imbalance
    prog = ""
    if r.lag is not None:  # a live stream: no total, what arrived and what waits
        prog = f"{_num(r.acked or 0.0)} of {_num(r.messages)} arrived, lag {_num(r.lag)}   "
    elif r.messages:
        done = r.acked or 0.0
        frac = done / r.messages
        prog = f"{_num(done)} / {_num(r.messages)} ({frac:.0%}) {bar(frac, 20)}  "
    lines.append(f"processed {prog}throughput {_num(throughput)} msgs/s   "
                 f"imbalance I(t) {_num(imb, '.2f')}")
    if r.watermark is not None:  # a windowed live stream
        ticks, unit = r.watermark
        wm = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ticks / 1e6)) if unit == "us"
              else f"{ticks:,.0f}")
        lines.append(f"watermark {wm}   open windows {_num(r.windows_open)}")
    lines.append("")

    has_vw = bool(r.vw)
    rbar = max(8, min(24, width - 88))  # a row is 87 characters + the rate bar
    ubar = 12
    hdr = (f"{'worker':>6} {'cap':>5} {'rate msgs/s':>11} {'':<{rbar}} {'queue':>6} "
           f"{'util':>5} {'':<{ubar}} {'busy':>5} {'stop':>5} {'p50 ms':>8} {'p99 ms':>8}")
    if has_vw:
        hdr += f" {'VWs':>5}"
    lines.append(hdr)
    top = max(rates + [1e-9])
    for i in sorted(set(r.workers) | set(r.vw)):
        w = r.workers.get(i, {})
        rate = w.get("rate")
        u = w.get("utilization")
        ubar_s = bar(u or 0.0, ubar)
        if u is not None:
            ubar_s = _color(ubar_s, _util_color(u), color)
        p50, p99 = w.get("p50_s"), w.get("p99_s")
        row = (f"{i:>6} {_num(w.get('capacity'), '.2f'):>5} {_num(rate):>11} "
               f"{bar((rate or 0.0) / top, rbar)} {_num(w.get('queue_msgs')):>6} "
               f"{_num(u, '.2f'):>5} {ubar_s} {_num(w.get('busy'), '.2f'):>5} "
               f"{_num(w.get('stopped'), '.2f'):>5} "
               f"{_num(p50 * 1e3 if p50 is not None else None, ',.1f'):>8} "
               f"{_num(p99 * 1e3 if p99 is not None else None, ',.1f'):>8}")
        if has_vw:
            vw = r.vw_owned(i)
            row += f" {_num(vw, '.0f' if vw is not None and vw == int(vw) else '.1f'):>5}"
        lines.append(row)
    if r.sources:
        lines.append("")
        lines.append(f"{'source':>6} {'routed':>12} {'acked':>12} {'signals +/-':>15} "
                     f"{'VWs moved':>10}")
        for i in sorted(r.sources):
            s = r.sources[i]
            sig = f"{_num(s.get('signals_increase', 0))} / {_num(s.get('signals_decrease', 0))}"
            lines.append(f"{i:>6} {_num(s.get('routed', 0)):>12} {_num(s.get('acked', 0)):>12} "
                         f"{sig:>15} {_num(s.get('migrations', 0)):>10}")
    return "\n".join(lines)


# ============================================================================ endpoints


def local_endpoints(ray_tmp: str | Path, newest: int = 10) -> list[str]:
    """``host:port`` metrics endpoints of the newest local Ray sessions: from each
    session's Prometheus service-discovery file (every node of that cluster),
    else its ``metrics_export_port_*`` files (this node)."""
    root = Path(ray_tmp)
    try:
        sessions = [p for p in root.glob("session_*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    sessions.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    out: list[str] = []
    for d in sessions[:newest]:
        found: list[str] = []
        sd = d / "prom_metrics_service_discovery.json"
        try:
            for group in json.loads(sd.read_text()):
                found += [str(t) for t in group.get("targets", [])]
        except (OSError, ValueError, AttributeError, TypeError):
            pass
        if not found:
            for f in d.glob("metrics_export_port_*"):
                try:
                    found.append(f"127.0.0.1:{int(f.read_text().strip())}")
                except (OSError, ValueError):
                    pass
        out += [e for e in found if e not in out]
    return out


def fetch(endpoint: str, timeout: float = 1.0) -> str | None:
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def scrape(endpoints: list[str], timeout: float = 1.0) -> tuple[list[Sample], int]:
    """Samples from every endpoint that answers, and how many answered."""
    if not endpoints:
        return [], 0
    with ThreadPoolExecutor(max_workers=min(16, len(endpoints))) as ex:
        texts = list(ex.map(lambda e: fetch(e, timeout), endpoints))
    samples: list[Sample] = []
    for t in texts:
        if t is not None:
            samples += parse_prometheus(t)
    return samples, sum(t is not None for t in texts)


# ============================================================================ main


def frame(endpoints: list[str], match: str | None, now: float, *, width: int,
          color: bool) -> tuple[str, bool]:
    samples, answered = scrape(endpoints)
    runs = pick_runs(collect(samples), match)
    if not runs:
        what = f" matching {match!r}" if match else ""
        return (f"waiting for a run{what}... ({answered} of {len(endpoints)} metrics "
                f"endpoint(s) answered; start one with python -m runtime.run TOPOLOGY.yaml)",
                False)
    text = render(runs[0], now, width=width, color=color)
    others = [r.run for r in runs[1:] if now - r.heartbeat <= STALE_S]
    if others:
        text += f"\n\nalso running: {', '.join(others)} (--run TEXT to pick)"
    return text, True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m runtime.top",
        description="Live terminal view of a running topology (our metrics from Ray's "
                    "Prometheus endpoints).")
    p.add_argument("--url", action="append", default=[],
                   help="a metrics endpoint HOST:PORT (repeatable; default: discover)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address to ask for its nodes' endpoints (e.g. auto)")
    p.add_argument("--ray-tmp", default=os.environ.get("RAY_TMPDIR", "/tmp/ray"),
                   help="where local Ray sessions live (default: %(default)s)")
    p.add_argument("--run", default=None, help="show the run whose name contains this")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--no-color", action="store_true")
    args = p.parse_args(argv)

    tty = sys.stdout.isatty()
    color = tty and not args.no_color and os.environ.get("NO_COLOR") is None
    cluster: list[str] = []
    next_discovery = 0.0
    try:
        while True:
            now = time.time()
            if args.url:
                endpoints = list(args.url)
            elif args.address:
                if not cluster or now >= next_discovery:
                    from actors.telemetry import prometheus_endpoints

                    try:
                        cluster = prometheus_endpoints(args.address)
                    except Exception as e:  # noqa: BLE001 - keep waiting for the cluster
                        print(f"cannot reach Ray at {args.address}: {e}", file=sys.stderr)
                        cluster = []
                    next_discovery = now + 30.0
                endpoints = cluster
            else:
                endpoints = local_endpoints(args.ray_tmp)
            width = shutil.get_terminal_size((100, 30)).columns
            text, shown = frame(endpoints, args.run, now, width=width, color=color)
            if args.once:
                print(text)
                return 0 if shown else 1
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
            else:
                sys.stdout.write(text + "\n\n")
            sys.stdout.flush()
            time.sleep(max(0.1, args.interval - (time.time() - now)))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
