"""Spark -> RayDP -> Ray input path, end to end (real Ray, real Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray

from actors.spark_input import (
    FeedLoad,
    arrow_batches,
    build_dataframe,
    reference_result,
    to_ray_shards,
)
from runtime.dataflow.reliability import Part
from runtime.inputs.generators import generate
from runtime.operators import AggregatorApp, WorkerApp, builtin_operator, sort_result
from runtime.topology import TopologyError, load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e

WORDS = "data/gitgit-words-1m.parquet"
FILES = "data/gitgit-files.parquet"


def _topo(input_: dict, kind: str = "wordcount", **app):
    return load_topology({"input": input_, "app": {"kind": kind, **app}})


def _collect(df) -> pa.Table:
    """Whole DataFrame as the sources get it (the production path: Spark's
    Arrow batches, partition by partition)."""
    return pa.Table.from_batches(list(arrow_batches(df))).combine_chunks()


@ray.remote(num_cpus=0.25)
class _ShardReader:
    """Iterates a shard inside an actor, as a source does."""

    def read(self, shard, batch: int) -> tuple[list, list[int]]:
        import time

        from actors.shard_feed import FedShard

        keys, ts = [], []
        batches = ((b for t in shard.tables(time.sleep) for b in t.to_batches(batch))
                   if isinstance(shard, FedShard)
                   else shard.iter_batches(batch_size=batch, batch_format="pyarrow"))
        for b in batches:
            assert b.num_rows <= batch
            keys.extend(b.column("key").to_pylist())
            if "label" in b.column_names:
                ts.extend(b.column("label").to_pylist())
        return keys, ts


@pytest.mark.parametrize("fmt", ["zipf", "evolving-zipf"])
def test_generated_stream_by_spark_equals_numpy(ray_spark, fmt) -> None:
    spec = {"format": fmt, "messages": 30_000, "keys": 500, "skew": 1.1, "seed": 7}
    if fmt == "evolving-zipf":
        spec["shift_every"] = 4_000
    topo = _topo(spec, "naive-bayes")
    df = build_dataframe(ray_spark, topo)
    assert df.columns == ["key", "label"]
    got = _collect(df)
    want = generate(0, 30_000, {**spec, "classes": 2}, with_labels=True)
    assert got.column("key").to_pylist() == want["key"].tolist()
    assert got.column("label").to_numpy().tolist() == want["label"].tolist()
    assert got.schema.field("label").type == pa.int64()


def test_generated_payload_columns_equal_numpy_with_nan_as_null(ray_spark) -> None:
    """Spark's executor builds the batches as Arrow (``mapInArrow``): the
    payload columns equal the numpy stream's, ``amount``'s NaN a null."""
    spec = {"format": "zipf", "messages": 20_000, "keys": 300, "skew": 1.0, "seed": 3}
    op = str(ROOT / "examples" / "operators" / "topk.py") + ":TopK"
    topo = _topo(spec, "operator", operator=op, columns=["value", "amount"])
    df = build_dataframe(ray_spark, topo)
    assert df.columns == ["key", "value", "amount"]
    got = _collect(df)
    want = generate(0, 20_000, spec, columns=("value", "amount"))
    assert got.column("key").to_pylist() == want["key"].tolist()
    assert got.column("value").to_pylist() == want["value"].tolist()
    amount = want["amount"]
    assert got.column("amount").null_count == int(np.isnan(amount).sum()) > 0
    assert got.column("amount").to_pylist() == [None if np.isnan(a) else a for a in amount]


def test_generated_limit_and_wordcount_columns(ray_spark) -> None:
    topo = _topo({"format": "zipf", "messages": 5_000, "keys": 100, "limit": 1234})
    df = build_dataframe(ray_spark, topo)
    assert df.columns == ["key"]
    got = _collect(df)
    assert got.column("key").to_pylist() == generate(0, 1234, {"format": "zipf", "keys": 100, "skew": 1.0})["key"].tolist()


def test_parquet_sample_equals_pyarrow_read(ray_spark) -> None:
    df = build_dataframe(ray_spark, _topo({"format": "parquet", "path": FILES}))
    got = _collect(df)
    want = pq.read_table(FILES).column("key").combine_chunks()
    assert got.column_names == ["key"]
    assert got.column("key").combine_chunks().equals(want)


def test_parquet_limit_keeps_the_first_rows(ray_spark) -> None:
    df = build_dataframe(ray_spark, _topo({"format": "parquet", "path": WORDS, "limit": 10_000}))
    got = _collect(df).column("key").combine_chunks()
    assert got.equals(pq.read_table(WORDS).column("key").slice(0, 10_000).combine_chunks())


def test_csv_and_json_round_trip_with_int_and_null_keys(ray_spark, tmp_path) -> None:
    keys = ["a", None, "007", "é ü", "a", None, "x,y"]
    ids = [5, 17, None, -3, 5, 5, 2**40]
    csv = tmp_path / "in.csv"
    import pyarrow.csv as pacsv

    pacsv.write_csv(pa.table({"key": keys, "id": pa.array(ids, pa.int64()), "label": [0, 1, 1, 0, 0, 1, 1]}), csv)
    js = tmp_path / "in.json"
    js.write_text("\n".join(json.dumps({"key": k, "id": i}) for k, i in zip(keys, ids, strict=True)))

    # CSV: text as is (no inference); an empty CSV field is read as null
    got = _collect(build_dataframe(ray_spark, _topo({"format": "csv", "path": str(csv)})))
    assert got.column("key").to_pylist() == keys
    # integer keys (JSON infers bigint) are cast to strings; null stays null
    got = _collect(build_dataframe(ray_spark, _topo({"format": "json", "path": str(js), "key": "id"})))
    assert got.column("key").to_pylist() == [None if i is None else str(i) for i in ids]
    # naive-bayes labels from a file: cast to int64
    df = build_dataframe(ray_spark, _topo({"format": "csv", "path": str(csv)}, "naive-bayes"))
    assert _collect(df).column("label").to_pylist() == [0, 1, 1, 0, 0, 1, 1]
    # null keys are one group in Spark's reference, as in runtime.operators
    ref = reference_result(build_dataframe(ray_spark, _topo({"format": "json", "path": str(js)})), "wordcount")
    assert ref.to_pylist()[-1] == {"key": None, "count": 2}


def test_a_text_file_is_read_in_several_partitions_in_file_order(ray_spark, tmp_path) -> None:
    """One CSV or JSON file of a few MB is read in partitions of ~1 MB (its
    first rows reach the sources before Spark has parsed it all), its rows in
    the file's order; then a Parquet read has Spark's own split settings again."""
    keys = [f"k{i:07d}" for i in range(300_000)]  # ~2.7 MB of CSV
    csv = tmp_path / "big.csv"
    csv.write_text("key\n" + "\n".join(keys) + "\n")
    js = tmp_path / "big.json"
    js.write_text("\n".join(f'{{"key": "{k}"}}' for k in keys[:150_000]) + "\n")
    for path, fmt, want in ((csv, "csv", keys), (js, "json", keys[:150_000])):
        df = build_dataframe(ray_spark, _topo({"format": fmt, "path": str(path)}))
        got = _collect(df)
        assert df.rdd.getNumPartitions() >= 2, fmt
        assert got.column("key").to_pylist() == want, fmt
    assert ray_spark.conf.get("spark.sql.files.minPartitionNum") == "16"
    # a limit still takes the file's first rows, across its pieces
    df = build_dataframe(ray_spark, _topo({"format": "csv", "path": str(csv), "limit": 250_000}))
    assert _collect(df).column("key").to_pylist() == keys[:250_000]
    df = build_dataframe(ray_spark, _topo({"format": "parquet", "path": FILES}))
    assert ray_spark.conf.get("spark.sql.files.minPartitionNum", None) is None
    assert _collect(df).num_rows == pq.read_metadata(FILES).num_rows


def test_reference_wordcount_equals_pyarrow_and_the_apps(ray_spark) -> None:
    df = build_dataframe(ray_spark, _topo({"format": "parquet", "path": FILES}))
    ref = reference_result(df, "wordcount")
    keys = pq.read_table(FILES).column("key").combine_chunks()
    vc = pc.value_counts(keys)
    want = sort_result(pa.table({"key": vc.field(0), "count": vc.field(1)}), "wordcount")
    assert ref.equals(want)
    # and the operator, fed the same keys split over 3 workers, agrees exactly
    op = builtin_operator("wordcount")
    states = [WorkerApp(op) for _ in range(3)]
    agg = AggregatorApp(op)
    for i, lo in enumerate(range(0, len(keys), 997)):
        part = Part.of(keys.slice(lo, 997))
        states[i % 3].add(part.records, part.hashes)
    for w, s in enumerate(states):
        agg.merge(s.flush(), w)
    assert agg.result().equals(ref)
    # heavy-hitters reference = the head of the exact counts, error 0
    hh = reference_result(df, "heavy-hitters", top_k=5)
    assert hh.column("key").to_pylist() == sort_result(want, "heavy-hitters").column("key").to_pylist()[:5]
    assert hh.column("error").to_pylist() == [0] * 5


def test_missing_key_column_is_one_line_error(ray_spark) -> None:
    with pytest.raises(TopologyError) as e:
        build_dataframe(ray_spark, _topo({"format": "parquet", "path": FILES, "key": "word"}))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("input.key: no column 'word'") and "available: ts, key" in msg


def test_a_files_own_schema_is_the_one_spark_infers(ray_spark, tmp_path) -> None:
    """Spark is handed a local Parquet file's schema from its footer, and a CSV
    file's from its header line (no inference job): it must be the schema
    Spark infers, and the rows read the same."""
    from actors.spark_input import known_schema

    p = tmp_path / "typed.parquet"
    pq.write_table(pa.table({
        "key": ["a", None, "b"], "n": pa.array([1, None, 3], pa.int64()),
        "i": pa.array([1, 2, 3], pa.int32()), "x": [0.5, None, 1.5],
        "flag": [True, False, None], "ts": pa.array([1, 2, 3], pa.timestamp("us", "UTC")),
        "d": pa.array([1, 2, 3], pa.date32()), "tags": [["u"], [], None],
    }), p)
    known = known_schema("parquet", p)
    assert known is not None and known[1]
    assert known[0] == ray_spark.read.parquet(str(p)).schema
    topo = _topo({"format": "parquet", "path": str(p)}, "aggregate", value="n", aggs=["sum"])
    assert _collect(build_dataframe(ray_spark, topo)).to_pydict() == {
        "key": ["a", None, "b"], "n": [1, None, 3]}

    c = tmp_path / "in.csv"
    c.write_text("key,Amount,_c\r\nx,1,\r\n\r\n,2,z\r\n")
    known = known_schema("csv", c)
    assert known is not None and known[1]
    assert known[0] == ray_spark.read.option("header", "true").csv(str(c)).schema
    topo = _topo({"format": "csv", "path": str(c)}, "aggregate", value="Amount", aggs=["sum"])
    assert _collect(build_dataframe(ray_spark, topo)).to_pydict() == {
        "key": ["x", None], "Amount": ["1", "2"]}
    # a header only: no rows, and Spark is asked (the one-line error)
    c.write_text("key,amount\n\n")
    assert known_schema("csv", c) is not None and not known_schema("csv", c)[1]
    with pytest.raises(TopologyError, match="input.path: no rows in"):
        build_dataframe(ray_spark, _topo({"format": "csv", "path": str(c)}))
    # names Spark would rewrite (quotes, blanks, duplicates): Spark infers them
    for header in ('"key",n', "key,,n", "key,Key", "key, n"):
        c.write_text(header + "\na,1,2\n")
        assert known_schema("csv", c) is None
    assert known_schema("json", c) is None and known_schema("parquet", tmp_path) is None


def test_empty_input_is_a_clear_error(ray_spark, tmp_path) -> None:
    p = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"key": pa.array([], pa.string())}), p)
    with pytest.raises(TopologyError, match="input.path: no rows in"):
        build_dataframe(ray_spark, _topo({"format": "parquet", "path": str(p)}))


def _fed(df, n_sources: int, block_rows: int) -> list:
    """The production hand-over (``FeedLoad``), loaded whole: one shard per source."""
    load = FeedLoad(iter([df]), n_sources, messages=None, block_rows=block_rows)
    load.start()
    load.join()
    return load.shards


@pytest.mark.parametrize("hand_over", ["feed", "ray-data"])
def test_shards_cover_every_row_once_iterated_in_actors(ray_spark, hand_over) -> None:
    """Blocks of exactly 20k rows dealt round-robin (block j to source j % 2),
    as the simulator deals them (``runtime.sim.cores``): by the production
    hand-over, and by Ray Data's ``from_spark`` (the benchmarks' baseline)."""
    topo = _topo({"format": "evolving-zipf", "messages": 200_000, "keys": 1000, "shift_every": 50_000}, "naive-bayes")
    df = build_dataframe(ray_spark, topo)
    shards = _fed(df, 2, 20_000) if hand_over == "feed" else to_ray_shards(df, 2, block_rows=20_000)
    assert len(shards) == 2
    readers = [_ShardReader.remote() for _ in shards]
    parts = ray.get([r.read.remote(s, 1000) for r, s in zip(readers, shards, strict=True)])
    sizes = [len(k) for k, _ in parts]
    assert sum(sizes) == 200_000 and min(sizes) >= 80_000  # both sources get work
    # round-robin blocks of 20k rows: reassembling them gives the stream back
    want = generate(0, 200_000, {"format": "evolving-zipf", "keys": 1000, "skew": 1.0, "seed": 0,
                                 "shift_every": 50_000}, with_labels=True)
    blocks = [[], []]
    for s, (keys, labels) in enumerate(parts):
        blocks[s] = [(keys[i:i + 20_000], labels[i:i + 20_000]) for i in range(0, len(keys), 20_000)]
    rebuilt_k, rebuilt_l = [], []
    for j in range(10):
        k, lab = blocks[j % 2][j // 2]
        rebuilt_k += k
        rebuilt_l += lab
    assert rebuilt_k == want["key"].tolist()
    assert np.array_equal(np.array(rebuilt_l), want["label"])
    # more sources than blocks: the extra shards are empty, nothing lost
    tiny_df = build_dataframe(ray_spark, _topo({"format": "zipf", "messages": 100}))
    if hand_over == "feed":
        tiny = _fed(tiny_df, 3, 20_000)
        got = ray.get([r.read.remote(s, 1000) for r, s in zip(
            [_ShardReader.remote() for _ in tiny], tiny, strict=True)])
        assert [len(k) for k, _ in got] == [100, 0, 0]
    else:
        assert [s.count() for s in to_ray_shards(tiny_df, 3)] == [100, 0, 0]


def test_ray_data_still_works_after_from_spark(ray_spark) -> None:
    """The raydp 1.6.5 load_code_from_local fix (docs/spark.md): after from_spark,
    Ray Data's reader actors and module-level actor classes still start."""
    for s in to_ray_shards(build_dataframe(ray_spark, _topo({"format": "parquet", "path": FILES})), 2):
        s.count()
    assert ray.data.read_parquet(FILES).count() == pq.read_metadata(FILES).num_rows
    # pooled 0-CPU workers (where raydp's fetch tasks ran) create actors
    assert ray.get([_make_actor_in_task.remote() for _ in range(6)], timeout=120) == [1] * 6


@ray.remote(num_cpus=0, max_retries=0)
def _make_actor_in_task() -> int:
    r = _ShardReader.options(num_cpus=0).remote()
    keys, _ = ray.get(r.read.remote(ray.data.from_items([{"key": "a"}]), 10))
    ray.kill(r)
    return len(keys)

