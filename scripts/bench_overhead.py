"""What the runtime costs over a bare Ray actor pipeline, in the same run.

Both pipelines get the same Spark-generated input (through RayDP, one Ray
dataset shard per source), the same number of source and worker actors, the
same micro-batch size and in-flight window, and no emulated service time:

- ours: ``actors.engine.RayEngine.run`` (word count; hashing, the grouping,
  backpressure, signals, latency histograms, metrics, periodic aggregation);
- bare: a source actor per shard that reads the same micro-batches, routes
  them by ``hash % n`` with pandas' vectorized hash, and calls plain worker
  actors that count the words in a dict, with the same in-flight window per
  worker; the counts are merged at the end.

Input loading is excluded from both: the clock starts when the sources start.
The pair is repeated ``--repeats`` times alternating the order; the script
prints each run and the median ratio ours / bare (goal >= 0.7).

``--columns value,amount`` adds a third pipeline to every repeat: ours again,
with the same word count run as an operator (``runtime.operators.counting:
WordCount``) that is handed those generated payload columns too, so every
record batch carries them through sources, replay log and workers. It prints
the median ratio payload / keys-only (goal >= 0.85: at most 15% fewer msgs/s).

``--bare-batch N``: the bare pipeline reads micro-batches of N instead (its
calls carry N / workers messages): our sources coalesce a worker's
sub-batches into calls (``run.linger_ms``, the call cap), so at the same
micro-batch our calls are larger than the bare pipeline's; the script prints
our mean messages per call, and a bare batch of that times ``--workers``
compares the two at the same call size.

    python scripts/bench_overhead.py [--messages 2000000] [--sources 2] [--workers 4]
                                     [--batch 1000] [--bare-batch N] [--scheme kg]
                                     [--repeats 3] [--columns value,amount]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.topology import load_topology  # noqa: E402


class BareWorker:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def process(self, keys: Any) -> int:
        import pyarrow.compute as pc

        vc = pc.value_counts(keys)
        for k, c in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(),
                        strict=True):
            self.counts[k] += c
        return len(keys)

    def result(self) -> dict[str, int]:
        return dict(self.counts)


class BareSource:
    def __init__(self, shard: Any, workers: list[Any], batch: int, max_inflight: int) -> None:
        self.shard, self.workers = shard, workers
        self.batch, self.max_inflight = batch, max_inflight

    def run(self) -> dict[str, float]:
        import numpy as np
        import pandas as pd
        import ray

        n = len(self.workers)
        inflight: dict[Any, int] = {}
        per_worker = [0] * n
        sent = 0

        def drain(block: bool) -> None:
            ready, _ = ray.wait(list(inflight), num_returns=1 if block else len(inflight),
                                timeout=None if block else 0)
            for r in ready:
                per_worker[inflight.pop(r)] -= 1

        for b in self.shard.iter_batches(batch_size=self.batch, batch_format="pyarrow"):
            keys = b.column("key").combine_chunks()
            dest = (pd.util.hash_array(keys.to_numpy(zero_copy_only=False)) % n).astype(np.int64)
            order = np.argsort(dest, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(np.bincount(dest, minlength=n))])
            for w in range(n):
                if bounds[w] == bounds[w + 1]:
                    continue
                while per_worker[w] >= self.max_inflight:
                    drain(block=True)
                ref = self.workers[w].process.remote(keys.take(order[bounds[w]:bounds[w + 1]]))
                inflight[ref] = w
                per_worker[w] += 1
            sent += len(keys)
            if inflight:
                drain(block=False)
        ray.get(list(inflight))
        return {"sent": sent, "end_ts": time.time()}


def run_bare(shards: list[Any], n_workers: int, batch: int, max_inflight: int) -> dict:
    import ray

    workers = [ray.remote(BareWorker).options(num_cpus=0).remote() for _ in range(n_workers)]
    sources = [ray.remote(BareSource).options(num_cpus=0).remote(s, workers, batch, max_inflight)
               for s in shards]
    ray.get([w.result.remote() for w in workers])  # started
    t0 = time.time()
    stats = ray.get([s.run.remote() for s in sources])
    end = max(s["end_ts"] for s in stats)
    merged: Counter[str] = Counter()
    for part in ray.get([w.result.remote() for w in workers]):
        merged.update(part)
    for a in [*sources, *workers]:
        ray.kill(a)
    sent = sum(s["sent"] for s in stats)
    return {"messages": sent, "seconds": end - t0, "msgs_per_s": sent / (end - t0),
            "distinct": len(merged), "total": sum(merged.values())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--sources", type=int, default=2)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--bare-batch", type=int, default=None,
                   help="the bare pipeline's micro-batch (default: --batch)")
    p.add_argument("--scheme", default="kg")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--columns", default="",
                   help="comma-separated generated payload columns (ts, value, amount): "
                        "also run ours carrying them")
    args = p.parse_args()
    columns = [c for c in args.columns.split(",") if c]

    def topology(app: dict) -> Any:
        return load_topology({
            "name": "overhead",
            "input": {"format": "zipf", "messages": args.messages, "keys": args.keys,
                      "skew": 1.0},
            "sources": args.sources,
            "workers": {"count": args.workers, "service_us": 0},
            "grouping": {"scheme": args.scheme},
            "app": {**app, "aggregate_every_s": 1.0},
            "run": {"batch": args.batch},
        })

    topo = topology({"kind": "wordcount"})
    topo_cols = topology({"kind": "operator", "operator": "runtime.operators.counting:WordCount",
                          "columns": columns}) if columns else None

    from actors.engine import RayEngine
    from actors.spark_input import to_ray_shards
    from runtime.inputs.input_check import shard_block_rows

    rows = []
    with contextlib.ExitStack() as session:
        engine = session.enter_context(RayEngine("bench-overhead"))
        df = session.enter_context(engine.shared_input(topo))
        df.count()
        shards = to_ray_shards(df, topo.sources, block_rows=shard_block_rows(topo))
        for s in shards:
            s.materialize()
        df_cols = None
        if topo_cols is not None:
            df_cols = session.enter_context(engine.shared_input(topo_cols))
            df_cols.count()

        per_call: list[float] = []  # our mean messages per worker call, per run

        def ours(t: Any, frame: Any) -> float:
            with tempfile.TemporaryDirectory() as d:
                rep = engine.run(t, Path(d) / "run", log=lambda m: None, data=frame)
            assert rep["messages"]["processed"] == args.messages, rep["messages"]
            calls = sum(x.get("calls", 0) for x in rep["sources"])
            per_call.append(args.messages / max(calls, 1))
            return float(rep["throughput_msgs_per_s"])

        bare_batch = args.bare_batch or topo.run.batch

        for r in range(args.repeats):
            order = ["ours", "bare"] if r % 2 == 0 else ["bare", "ours"]
            if topo_cols is not None:
                order.insert(1, "payload")
            pair = {}
            for which in order:
                if which == "bare":
                    b = run_bare(shards, topo.workers.count, bare_batch, topo.run.max_inflight)
                    assert b["total"] == args.messages, b
                    pair["bare"] = b["msgs_per_s"]
                elif which == "payload":
                    pair["payload"] = ours(topo_cols, df_cols)
                else:
                    pair["ours"] = ours(topo, df)
                    pair["per_call"] = per_call[-1]
            pair["ratio"] = pair["ours"] / pair["bare"]
            line = (f"repeat {r + 1}: ours {pair['ours']:,.0f} msgs/s ({pair['per_call']:,.0f} "
                    f"per call), bare {pair['bare']:,.0f} msgs/s "
                    f"({bare_batch / topo.workers.count:,.0f} per call), "
                    f"ratio {pair['ratio']:.2f}")
            if "payload" in pair:
                pair["payload_ratio"] = pair["payload"] / pair["ours"]
                line += (f"; ours + {','.join(columns)} {pair['payload']:,.0f} msgs/s, "
                         f"ratio to keys only {pair['payload_ratio']:.2f}")
            rows.append(pair)
            print(line, flush=True)
    med = statistics.median(x["ratio"] for x in rows)
    print(f"\n{args.messages:,} messages, {args.sources} sources, {args.workers} workers, "
          f"batch {args.batch} (bare {bare_batch}), scheme {args.scheme}: "
          f"median ours/bare = {med:.2f} "
          f"(goal >= 0.70)")
    if topo_cols is not None:
        med_p = statistics.median(x["payload_ratio"] for x in rows)
        print(f"carrying {','.join(columns)}: median payload/keys-only = {med_p:.2f} "
              f"(goal >= 0.85)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
