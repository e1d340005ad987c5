"""The hand-over's block cutting (``actors.spark_input.Blocks``), without Spark:
Spark's Arrow batches of any sizes become blocks of exactly ``block_rows`` rows
in stream order (the last one shorter), as the simulator cuts its stream, and
a block carries only its own rows when pickled (``ray.put``)."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa

from actors.spark_input import Blocks


def _batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out, at = [], 0
    for n in sizes:
        ids = np.arange(at, at + n)
        out.append(pa.record_batch({"key": pa.array([f"k{i}" for i in ids]),
                                    "ts": pa.array(ids)}))
        at += n
    return out


def test_blocks_are_exact_and_in_stream_order_whatever_the_batches() -> None:
    rng = np.random.default_rng(7)
    sizes = [int(x) for x in rng.integers(0, 9_000, 60)]
    blocks = Blocks(4_096)
    got = [b for batch in _batches(sizes) for b in blocks.add(batch)] + list(blocks.rest())
    total = sum(sizes)
    assert [b.num_rows for b in got] == [4_096] * (total // 4_096) + (
        [total % 4_096] if total % 4_096 else [])
    ts = pa.concat_tables(got).column("ts").to_numpy()
    assert np.array_equal(ts, np.arange(total))  # every row once, in order


def test_a_block_cut_from_a_batch_carries_only_its_rows() -> None:
    (big,) = _batches([100_000])
    whole = len(pickle.dumps(pa.Table.from_batches([big]), protocol=5))
    blocks = Blocks(1_000)
    first = next(iter(blocks.add(big)))
    assert first.num_rows == 1_000
    assert len(pickle.dumps(first, protocol=5)) < whole / 20
