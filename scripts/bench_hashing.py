"""Key hashing throughput: the sources' old path vs ``runtime.hashing.hash_arrow``.

- old: what ``actors.source.hash_arrow_keys`` did for string keys,
  ``keys.to_numpy(zero_copy_only=False)`` (Python ``str`` objects) then one
  ``mmh3.hash64`` call per key (the former ``hash_keys`` loop, copied here);
- new: ``hash_arrow(keys)``, MurmurHash3_x64_128 in one compiled loop over the
  Arrow offsets and data buffers.

Both on 1M keys of the bundled real data (``data/gitgit-words-1m.parquet``,
column ``key``) and on 1M generated ``k<id>`` strings, in the same process,
checking that both give the same hashes. Wall time by ``time.perf_counter``,
median of 5 runs each (the JIT compile / cache load is a warm-up, excluded).
A second table hashes the same keys in micro-batches of 1,000 (one call per
batch, as the sources do). Takes ~10 s.

    python scripts/bench_hashing.py [--repeats 5] [--batch 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.hashing import hash_arrow, hash_one  # noqa: E402
from runtime.inputs.generators import key_strings  # noqa: E402


def old_hash_keys(keys: np.ndarray) -> np.ndarray:
    """The former ``hash_keys`` loop for non-integer arrays (unchanged)."""
    h64 = mmh3.hash64
    out: list[int] = []
    append = out.append
    for k in keys:
        if isinstance(k, str):
            append(h64(k.encode("utf-8"), 0, signed=False)[0])
        else:
            append(hash_one(k))
    return np.fromiter(out, dtype=np.uint64, count=len(out))


def old_path(keys: pa.Array) -> np.ndarray:
    return old_hash_keys(keys.to_numpy(zero_copy_only=False))


def median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args()

    t = time.perf_counter()
    hash_arrow(pa.array(["warm"], type=pa.string()))
    print(f"JIT compile / cache load: {time.perf_counter() - t:.2f} s (excluded)")

    words = pq.read_table(ROOT / "data" / "gitgit-words-1m.parquet", columns=["key"])
    sets = {
        "gitgit words (1M, real)": words.column("key").combine_chunks(),
        "generated k<id> (1M)": pa.array(key_strings(np.arange(1_000_000)), type=pa.string()),
    }
    print(f"timer: time.perf_counter (wall), median of {args.repeats}; "
          "old = to_numpy(zero_copy_only=False) + mmh3 loop, new = hash_arrow")
    print(f"{'keys':26s} {'calls':>12s} {'old ns/key':>11s} {'new ns/key':>11s} {'speedup':>8s}")
    for name, keys in sets.items():
        n = len(keys)
        assert np.array_equal(old_path(keys), hash_arrow(keys)), name
        batches = [keys.slice(i, args.batch) for i in range(0, n, args.batch)]
        for label, old, new in (
            ("1 x 1M", lambda k=keys: old_path(k), lambda k=keys: hash_arrow(k)),
            (f"batches {args.batch}",
             lambda b=batches: [old_path(x) for x in b],
             lambda b=batches: [hash_arrow(x) for x in b]),
        ):
            t_old = median_s(old, args.repeats) / n * 1e9
            t_new = median_s(new, args.repeats) / n * 1e9
            print(f"{name:26s} {label:>12s} {t_old:11.1f} {t_new:11.1f} {t_old / t_new:7.1f}x")


if __name__ == "__main__":
    main()
