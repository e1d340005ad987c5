"""The input hand-over, Spark -> Ray sources, two ways side by side in one process.

    python scripts/bench_spark_input.py [--input data/gitgit-words-1m.parquet]
        [--times 4] [--sources 2] [--batch 1000] [--repeat 2]

``--times N`` repeats the file's rows N times (a Parquet file in a temporary
directory). Each round times, for the same DataFrame:

  ray-data: ``to_ray_shards`` = ``ray.data.from_spark`` (a Spark job over
            every partition, Arrow blocks into Ray's object store, then Ray
            tasks cutting them into per-source shards) - the earlier path;
  feed:     ``FeedLoad`` (what a run uses): Spark's Arrow batches reach the
            driver partition by partition and are dealt block by block.

``first`` is when a source could start (ray-data: everything loaded; feed: the
first block in), ``all`` when the whole input is in Ray, ``stream`` when two
actors have read every row of their shard (started as soon as they could).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from actors.spark_input import (
    FeedLoad,
    build_dataframe,
    start_spark,
    stop_spark,
    to_ray_shards,
)
from runtime.inputs.input_check import SHARD_BLOCK_ROWS
from runtime.topology import load_topology


@ray.remote(num_cpus=0)
class _Drain:
    def run(self, shard, batch: int) -> int:
        from actors.shard_feed import FedShard

        if isinstance(shard, FedShard):
            return sum(t.num_rows for t in shard.tables(time.sleep))
        return sum(b.num_rows for b in shard.iter_batches(batch_size=batch,
                                                          batch_format="pyarrow"))


def _ray_data(df, sources: int, drains, batch: int) -> tuple[float, float, float, int]:
    t0 = time.perf_counter()
    shards = to_ray_shards(df, sources, block_rows=SHARD_BLOCK_ROWS)
    loaded = time.perf_counter() - t0
    rows = sum(ray.get([d.run.remote(s, batch) for d, s in zip(drains, shards, strict=True)]))
    return loaded, loaded, time.perf_counter() - t0, rows


def _feed(df, sources: int, drains, batch: int) -> tuple[float, float, float, int]:
    t0 = time.perf_counter()
    load = FeedLoad(iter([df]), sources, messages=None, block_rows=SHARD_BLOCK_ROWS)
    load.start()
    first = time.perf_counter() - t0
    reads = [d.run.remote(s, batch) for d, s in zip(drains, load.shards, strict=True)]
    load.join()
    loaded = time.perf_counter() - t0
    rows = sum(ray.get(reads))
    ray.kill(load.feed)
    return first, loaded, time.perf_counter() - t0, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", default="data/gitgit-words-1m.parquet")
    ap.add_argument("--times", type=int, default=4)
    ap.add_argument("--sources", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.input
        if a.times > 1:
            path = str(Path(tmp) / "input.parquet")
            pq.write_table(pa.concat_tables([pq.read_table(a.input)] * a.times), path)
        ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING",
                 log_to_driver=False)
        t0 = time.perf_counter()
        spark = start_spark(log_file=Path(tmp) / "engine.log")
        print(f"start_spark: {time.perf_counter() - t0:.1f} s")
        topo = load_topology({"input": {"format": "parquet", "path": path}})
        drains = [_Drain.remote() for _ in range(a.sources)]
        print("| round | hand-over | rows | first s | all in s | streamed s | rows/s to streamed |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in range(a.repeat):
            for name, way in (("ray-data", _ray_data), ("feed", _feed)):
                first, loaded, done, rows = way(build_dataframe(spark, topo), a.sources,
                                                drains, a.batch)
                print(f"| {r} | {name} | {rows:,} | {first:.2f} | {loaded:.2f} | {done:.2f} "
                      f"| {rows / done:,.0f} |", flush=True)
        stop_spark()
        ray.shutdown()


if __name__ == "__main__":
    main()
