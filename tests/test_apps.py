"""runtime.apps: worker states + aggregators (pure, fast)."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.apps import (
    HEAVY_HITTERS_SCHEMA,
    NAIVE_BAYES_SCHEMA,
    WORDCOUNT_SCHEMA,
    as_string_array,
    make_app,
    sort_result,
)
from runtime.generators import generate

KEYS = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "é", "", "the", "zz"]), st.text(max_size=3))


def _expected_counts(keys: list[str | None]) -> pa.Table:
    c = Counter(keys)
    t = pa.table({"key": pa.array(list(c), pa.string()),
                  "count": pa.array(list(c.values()), pa.int64())})
    return sort_result(t, "wordcount")


def _run_split(app, keys, labels, cuts, owners, flush_after):
    """Feed ``keys`` in batches (``cuts``), batch i to worker ``owners[i]``,
    flushing worker w after batch i when ``flush_after[i]``; merge everything."""
    n_workers = max(owners, default=0) + 1
    states = [app.new_worker_state() for _ in range(n_workers)]
    agg = app.new_aggregator()
    bounds = [0, *sorted(cuts), len(keys)]
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        w = owners[i % len(owners)] if owners else 0
        lab = None if labels is None else labels[lo:hi]
        states[w].process(pa.array(keys[lo:hi], pa.string()), lab)
        if flush_after[i % len(flush_after)]:
            # partials travel between actors: must survive pickling
            agg.merge(pickle.loads(pickle.dumps(states[w].flush())))
    for s in states:
        agg.merge(s.flush())
    return agg.result(), states


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(KEYS, max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=12),
    owners=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    flush_after=st.lists(st.booleans(), min_size=1, max_size=12),
)
def test_wordcount_split_across_workers_is_exact(keys, cuts, owners, flush_after) -> None:
    cuts = [min(c, len(keys)) for c in cuts]
    app = make_app("wordcount")
    split, _ = _run_split(app, keys, None, cuts, owners, flush_after)
    single, _ = _run_split(app, keys, None, [], [0], [False])
    assert split.equals(single)
    assert split.equals(_expected_counts(keys))
    assert split.schema == WORDCOUNT_SCHEMA


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(st.tuples(KEYS, st.integers(0, 3)), max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=12),
    owners=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    flush_after=st.lists(st.booleans(), min_size=1, max_size=12),
)
def test_naive_bayes_split_across_workers_is_exact(data, cuts, owners, flush_after) -> None:
    keys = [k for k, _ in data]
    labels = np.array([c for _, c in data], dtype=np.int64)
    cuts = [min(c, len(keys)) for c in cuts]
    app = make_app("naive-bayes")
    split, _ = _run_split(app, keys, labels, cuts, owners, flush_after)
    c = Counter(data)
    want = sort_result(pa.table({
        "key": pa.array([k for k, _ in c], pa.string()),
        "label": pa.array([lab for _, lab in c], pa.int64()),
        "count": pa.array(list(c.values()), pa.int64()),
    }), "naive-bayes")
    assert split.schema == NAIVE_BAYES_SCHEMA
    assert split.equals(want)


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(KEYS, max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=12),
    owners=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    flush_after=st.lists(st.booleans(), min_size=1, max_size=12),
    top_k=st.integers(1, 10),
)
def test_heavy_hitters_exact_when_counters_suffice(keys, cuts, owners, flush_after, top_k) -> None:
    """No eviction (counters >= distinct keys) -> the merged top-k is exact."""
    cuts = [min(c, len(keys)) for c in cuts]
    app = make_app("heavy-hitters", counters=400, top_k=top_k)
    got, _ = _run_split(app, keys, None, cuts, owners, flush_after)
    want = sort_result(_expected_counts(keys), "heavy-hitters").slice(0, top_k)
    assert got.schema == HEAVY_HITTERS_SCHEMA
    assert got.select(["key", "count"]).equals(want.combine_chunks())
    assert pc.sum(got["error"]).as_py() in (None, 0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 1000),
    n_workers=st.integers(1, 5),
    batch=st.integers(50, 2000),
    flush_every=st.integers(1, 8),
)
def test_heavy_hitters_bounds_under_eviction(seed, n_workers, batch, flush_every) -> None:
    """Few counters, a zipf stream over more keys, weighted updates: every
    reported count brackets the truth, and the clear heavy hitters are found."""
    n, counters = 20_000, 50
    keys = generate(0, n, {"format": "zipf", "keys": 2000, "skew": 1.2, "seed": seed})["key"]
    truth = Counter(keys.tolist())
    app = make_app("heavy-hitters", counters=counters, top_k=10)
    states = [app.new_worker_state() for _ in range(n_workers)]
    agg = app.new_aggregator()
    rng = np.random.default_rng(seed)
    for i, lo in enumerate(range(0, n, batch)):
        w = int(rng.integers(n_workers))
        states[w].process(pa.array(keys[lo:lo + batch], pa.string()))
        if i % flush_every == 0:
            agg.merge(states[w].flush())
    for s in states:
        agg.merge(s.flush())
    got = agg.result().to_pylist()
    assert len(got) == 10
    for row in got:
        f = truth[row["key"]]
        assert row["count"] - row["error"] <= f <= row["count"], row
    # keys far above the error bound are reported, in the true order
    true_top = [k for k, _ in sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]
    assert [r["key"] for r in got[:3]] == true_top


def test_flush_is_a_delta_and_resets() -> None:
    s = make_app("wordcount").new_worker_state()
    s.process(pa.array(["a", "b", "a"]))
    assert s.flush().to_pydict() == {"key": ["a", "b"], "count": [2, 1]}
    assert s.flush().num_rows == 0
    s.process(pa.array(["a"]))
    assert s.flush().to_pydict() == {"key": ["a"], "count": [1]}


def test_distinct_keys_counts_every_key_ever_held_nulls_as_one() -> None:
    s = make_app("wordcount").new_worker_state()
    s.process(pa.array(["a", None, "b", None]))
    assert s.distinct_keys() == 3  # before any flush too
    s.flush()
    s.process(pa.array(["c", "a"]))
    s.flush()
    assert s.distinct_keys() == 4
    hh = make_app("heavy-hitters", counters=2).new_worker_state()
    hh.process(pa.array(["x", "y", "z", None]))
    hh.flush()
    assert hh.distinct_keys() == 4  # routed keys, not just the tracked counters


def test_keys_in_other_arrow_string_types_and_chunks() -> None:
    s = make_app("wordcount").new_worker_state()
    s.process(pa.chunked_array([pa.array(["a", "b"], pa.large_string()), pa.array(["a"], pa.large_string())]))
    s.process(np.array(["b", None], dtype=object))
    assert s.flush().to_pydict() == {"key": ["a", "b", None], "count": [2, 2, 1]}
    with pytest.raises(TypeError, match="keys must be strings"):
        as_string_array(pa.array([1, 2]))


def test_naive_bayes_needs_labels_of_matching_length() -> None:
    s = make_app("naive-bayes").new_worker_state()
    with pytest.raises(ValueError, match="needs labels"):
        s.process(pa.array(["a"]))
    with pytest.raises(ValueError, match="length 2"):
        s.process(pa.array(["a"]), np.array([0, 1]))


def test_make_app_validates_and_accepts_the_app_section() -> None:
    from runtime.topology import AppSpec

    section = AppSpec(kind="heavy-hitters", counters=10, top_k=3).model_dump()
    app = make_app(**section)
    assert (app.counters, app.top_k) == (10, 3)
    with pytest.raises(ValueError, match="unknown application 'nope'"):
        make_app("nope")
    with pytest.raises(ValueError, match="unknown parameter"):
        make_app("wordcount", bogus=1)
    with pytest.raises(ValueError, match="app.counters"):
        make_app("heavy-hitters", counters=0)


def test_aggregator_compaction_keeps_totals_on_a_real_stream() -> None:
    """Many workers, many flushes, a generated 200k-message zipf stream."""
    spec = {"format": "evolving-zipf", "keys": 50_000, "skew": 0.8, "seed": 3, "shift_every": 40_000}
    keys = generate(0, 200_000, spec)["key"]
    app = make_app("wordcount")
    states = [app.new_worker_state() for _ in range(4)]
    agg = app.new_aggregator()
    for i, lo in enumerate(range(0, len(keys), 1000)):
        st_ = states[i % 4]
        st_.process(pa.array(keys[lo:lo + 1000], pa.string()))
        if i % 7 == 0:
            agg.merge(st_.flush())
    for s in states:
        agg.merge(s.flush())
    got = agg.result()
    vc = pc.value_counts(pa.array(keys, pa.string()))
    want = sort_result(pa.table({"key": vc.field(0), "count": vc.field(1)}), "wordcount")
    assert got.equals(want)
    assert pc.sum(got["count"]).as_py() == 200_000
