"""Load rate of the Spark -> RayDP -> Ray input path.

    python scripts/bench_spark_input.py [--input data/gitgit-words-1m.parquet]
        [--sources 2] [--batch 1000] [--repeat 2]

Phases, timed separately (docs/spark.md: report loading and streaming apart):
  spark:  ``build_dataframe`` (plan only, plus Spark's emptiness check)
  load:   ``to_ray_shards`` = ``ray.data.from_spark`` (Spark job, Arrow blocks
          into Ray's object store) + cutting into per-source shards
  stream: every shard iterated with ``iter_batches(batch_format="pyarrow")``
          inside its own actor, in parallel
"""

from __future__ import annotations

import argparse
import time

import ray

from actors.spark_input import build_dataframe, start_spark, stop_spark, to_ray_shards
from runtime.topology import load_topology


@ray.remote(num_cpus=0.5)
class _Drain:
    def run(self, shard, batch: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        n = 0
        for b in shard.iter_batches(batch_size=batch, batch_format="pyarrow"):
            n += b.num_rows
        return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default="data/gitgit-words-1m.parquet")
    ap.add_argument("--sources", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    t0 = time.perf_counter()
    spark = start_spark()
    print(f"start_spark: {time.perf_counter() - t0:.1f} s")
    fmt = a.input.rsplit(".", 1)[-1]
    topo = load_topology({"input": {"format": fmt, "path": a.input}})
    drains = [_Drain.remote() for _ in range(a.sources)]
    for r in range(a.repeat):
        t0 = time.perf_counter()
        df = build_dataframe(spark, topo)
        t1 = time.perf_counter()
        shards = to_ray_shards(df, a.sources)
        t2 = time.perf_counter()
        out = ray.get([d.run.remote(s, a.batch) for d, s in zip(drains, shards, strict=True)])
        t3 = time.perf_counter()
        rows = sum(n for n, _ in out)
        print(
            f"run {r}: {rows:,} rows | spark {t1 - t0:.2f} s | load {t2 - t1:.2f} s "
            f"({rows / (t2 - t1):,.0f} rows/s) | stream {t3 - t2:.2f} s "
            f"({rows / (t3 - t2):,.0f} rows/s) | load+stream {rows / (t3 - t1):,.0f} rows/s"
        )
    stop_spark()
    ray.shutdown()


if __name__ == "__main__":
    main()
