"""Live streams measured: memory under overload, latency at 80% load, checkpoint cost.

    python scripts/bench_stream.py [--only overload,latency,checkpoint] [--out DIR]

One Ray + Spark session; 2 sources -> 4 workers, acg, word count on the bundled
real words (``data/gitgit-words-1m.parquet``), ``service_us: 100`` in service
mode: the cluster's capacity is 4 x 10,000 = 40,000 msgs/s. A writer thread
drops Parquet files into the stream's directory (written as ``_name``, then
renamed) at a chosen rate.

The writer starts once the run's first result is written (the stream is up).

- overload: files at 3x capacity for 60 s (``run.duration_s``). Every process
  of the run (actors, the Spark JVM, this driver) is sampled each second; it
  prints each one's RSS 10 s in and its peak after, and the run's lag.
- latency: files at 0.8x capacity for 30 s, then the same rows as one finite
  Parquet file paced at the same rate (``run.rate``): p50/p99 of both (the
  stream's latency starts when Spark hands a micro-batch over, the finite
  run's when the batch was due).
- checkpoint: 1,000,000 rows in 25 files already there, one per micro-batch
  (~1 s of work each): throughput with ``run.checkpoint`` on and off, and what
  a checkpoint costs (bytes, ms).

Writes ``DIR/stream.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402
from drop_files import FileDropper  # noqa: E402

from runtime.engine import Engine  # noqa: E402
from runtime.reporting.report import default_out_dir  # noqa: E402
from runtime.topology import load_topology  # noqa: E402

WORDS = ROOT / "data" / "gitgit-words-1m.parquet"
CAPACITY = 40_000  # msgs/s: 4 workers at 100 us a message


def _topology(name: str, path: Path, stream: bool, files_per_trigger: int | None = None,
              **run: Any) -> Any:
    spec: dict[str, Any] = {"format": "parquet", "path": str(path)}
    if stream:
        spec["stream"] = True
    if files_per_trigger:
        spec["max_files_per_trigger"] = files_per_trigger
    return load_topology({
        "name": name, "input": spec, "sources": 2,
        "workers": {"count": 4, "service_us": 100, "throttle": "service"},
        "grouping": {"scheme": "acg"},
        "app": {"kind": "wordcount", "aggregate_every_s": 1.0},
        "run": {"batch": 1000, **run},
    })


def _counted(result: Path) -> bool:
    """The run's live result holds the first file (the stream is up)."""
    try:
        return pq.read_table(result).num_rows > 0
    except (OSError, ValueError):
        return False


class MemorySampler(threading.Thread):
    """RSS of this process and every process below it, each second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: dict[int, list[tuple[float, float, str]]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        start = time.time()
        while not self.stop.wait(1.0):
            for p in [me, *me.children(recursive=True)]:
                try:
                    name = " ".join(p.cmdline()[:1])[-40:] if p.pid != me.pid else "driver"
                    title = p.name()
                    rss = p.memory_info().rss / 2**20
                except Exception:  # noqa: BLE001 - a process that just ended
                    continue
                label = title if title.startswith("ray::") else name
                self.samples.setdefault(p.pid, []).append((time.time() - start, rss, label))


def overload(engine: Engine, base: Path, words: Any, lines: list[str]) -> None:
    d = base / "overload-in"
    d.mkdir(parents=True)
    writer = FileDropper(words, d, 3 * CAPACITY, seconds=70,
                         start_when=lambda: _counted(base / "overload" / "result.parquet"))
    pq.write_table(words.slice(0, 1000), d / "f-first.parquet")
    mem = MemorySampler()
    writer.start()
    mem.start()
    topo = _topology("stream-overload", d, True, duration_s=65)
    rep = engine.run(topo, base / "overload", log=lambda m: None)
    writer.stop.set()
    mem.stop.set()
    mem.join()
    s = rep["stream"]
    lines += ["## Overload: files at 3x capacity for 60 s", "",
              f"written {writer.written:,} rows; handed over {s['rows']:,} in "
              f"{s['micro_batches']} micro-batches; processed {rep['messages']['processed']:,} "
              f"({rep['throughput_msgs_per_s']:,.0f} msgs/s, capacity {CAPACITY:,}); "
              f"lag max {s['lag_max']:,}", "",
              "| process | RSS at 10 s (MB) | peak after (MB) | growth (MB) |",
              "|---|---|---|---|"]
    rows = []
    for samples in mem.samples.values():
        early = [r for t, r, _ in samples if t <= 10.5]
        later = [r for t, r, _ in samples if t > 10.5]
        if not early or not later or max(later) < 50:
            continue
        rows.append((samples[-1][2], early[-1], max(later)))
    for label, a, b in sorted(rows, key=lambda r: -(r[2] - r[1])):
        lines.append(f"| {label} | {a:,.0f} | {b:,.0f} | {b - a:+,.0f} |")
    lines.append("")


def latency(engine: Engine, base: Path, words: Any, lines: list[str]) -> None:
    rate = 0.8 * CAPACITY
    d = base / "latency-in"
    d.mkdir(parents=True)
    pq.write_table(words.slice(0, 1000), d / "f-first.parquet")
    writer = FileDropper(words, d, rate, seconds=30,
                         start_when=lambda: _counted(base / "latency-stream" / "result.parquet"))
    writer.start()
    live = engine.run(_topology("stream-80", d, True, until_idle_s=5), base / "latency-stream",
                      log=lambda m: None)
    writer.join()
    finite_file = base / "latency-finite.parquet"
    pq.write_table(words.slice(0, writer.written), finite_file)
    fin = engine.run(_topology("finite-80", finite_file, False, rate=rate),
                     base / "latency-finite", log=lambda m: None)
    lines += ["## Latency at 80% of capacity (32,000 msgs/s offered)", "",
              "| input | messages | p50 ms | p99 ms |", "|---|---|---|---|"]
    for name, r in (("live stream (files every 0.5 s)", live), ("finite file, paced", fin)):
        lat = r["latency_ms"]
        lines.append(f"| {name} | {r['messages']['processed']:,} | {lat['p50']:,.0f} | "
                     f"{lat['p99']:,.0f} |")
    lines += ["", f"p99 ratio stream / finite: "
                  f"{live['latency_ms']['p99'] / fin['latency_ms']['p99']:.2f}", ""]


def checkpoint(engine: Engine, base: Path, words: Any, lines: list[str]) -> None:
    d = base / "checkpoint-in"
    d.mkdir(parents=True)
    for k in range(25):
        pq.write_table(words.slice(k * 40_000, 40_000), d / f"f{k:03d}.parquet")
    lines += ["## Checkpoint cost: 1,000,000 rows, 25 micro-batches of 40,000 (~1 s each)", "",
              "| run.checkpoint | msgs/s | checkpoints | ms each | bytes each |",
              "|---|---|---|---|---|"]
    got = {}
    for on in (False, True, False, True):
        topo = _topology("stream-ckpt", d, True, files_per_trigger=1, until_idle_s=3,
                         checkpoint=on)
        out = base / f"checkpoint-{on}-{len(got)}"
        r = engine.run(topo, out, log=lambda m: None)
        s = r["stream"]
        busy_s = r["duration_s"] - topo.run.until_idle_s  # the idle wait is not work
        rate = r["messages"]["processed"] / busy_s
        got.setdefault(on, []).append(rate)
        each = 1e3 * s["checkpoint_s"] / s["checkpoints"] if s["checkpoints"] else 0.0
        lines.append(f"| {'on' if on else 'off'} | {rate:,.0f} | {s['checkpoints']} | "
                     f"{each:,.0f} | {s['checkpoint_bytes']:,} |")
    off, on_ = sum(got[False]) / 2, sum(got[True]) / 2
    lines += ["", f"throughput with checkpoints / without: {on_ / off:.3f}", ""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="overload,latency,checkpoint")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or default_out_dir("bench-stream")
    out.mkdir(parents=True, exist_ok=True)
    words = pq.read_table(WORDS).select(["key"])
    lines = [f"# Live streams ({datetime.now(UTC):%Y-%m-%d}, load average "
             f"{os.getloadavg()[0]:.2f} at the start)", ""]
    from actors.engine import RayEngine

    todo = {"overload": overload, "latency": latency, "checkpoint": checkpoint}
    with RayEngine("bench-stream") as engine:
        for name in args.only.split(","):
            print(f"[bench_stream] {name} ...", file=sys.stderr, flush=True)
            todo[name](engine, out, words, lines)
            print("\n".join(lines), file=sys.stderr, flush=True)
    (out / "stream.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten: {out / 'stream.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
