"""DistinctKeys (replication's numerator per worker) against np.unique."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.reporting.metrics import DistinctKeys

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(st.one_of(U64, st.integers(0, 40)), max_size=300), max_size=12),
       capacity=st.integers(1, 64))
def test_counts_the_distinct_hashes_ever_added(batches, capacity) -> None:
    """Any hashes - repeats, 0 (the table's empty marker), 2**64 - 1, batches
    larger than the table - in any number of calls: as many as np.unique."""
    d = DistinctKeys(capacity=capacity)
    seen = np.zeros(0, dtype=np.uint64)
    for b in batches:
        arr = np.array(b, dtype=np.uint64)
        d.add(arr)
        seen = np.concatenate([seen, arr])
        assert len(d) == len(np.unique(seen))


def test_a_million_zipf_keys() -> None:
    rng = np.random.default_rng(0)
    h = (rng.zipf(1.2, size=1_000_000) % 100_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    d = DistinctKeys()
    for i in range(0, len(h), 1000):
        d.add(h[i:i + 1000])
    assert len(d) == len(np.unique(h))
