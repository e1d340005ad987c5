"""Deterministic generated streams: message i is a pure function of (i, params).

The same functions run in numpy (simulator, tests) and inside Spark
(``mapInArrow`` over ``spark.range``), so both engines see the very same
stream, message for message, whatever the partitioning.

- ``zipf``: key ranks drawn from Zipf(``skew``) over ``keys`` keys.
- ``evolving-zipf``: the same, but every ``shift_every`` messages the ranks are
  remapped to other keys, so the hot keys change (FISH's time-evolving streams).
- naive-bayes labels: a class per message, correlated with the key so that the
  per-(feature, class) counters are meaningful.
- payload columns, for apps over records (``GENERATED_COLUMNS``): ``ts``
  (int64, the message's index), ``value`` (int64 in [0, 1000)), ``amount``
  (float64 in [0, 1000) with cents; null for ~5% of the messages - NaN in
  the numpy arrays returned here, a null in Arrow and Spark).
Keys are strings ``k<id>`` (the original key of the result table).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa

from runtime.hashing import choice

_TWO64 = float(2**64)
#: the columns a generated stream offers besides ``key``
GENERATED_COLUMNS = ("ts", "label", "value", "amount")
#: share of generated ``amount`` values that are null
NULL_AMOUNT = 0.05


def zipf_cdf(n_keys: int, skew: float) -> np.ndarray:
    """Cumulative Zipf(skew) over ranks 1..n_keys (skew 0 = uniform)."""
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -float(skew)
    c = np.cumsum(p)
    return c / c[-1]


def _uniform(idx: np.ndarray, seed: int, stream: int) -> np.ndarray:
    h = choice(idx.astype(np.uint64) + np.uint64(seed & 0xFFFFFFFF) * np.uint64(1 << 32), stream)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def key_ids(
    start: int,
    count: int,
    *,
    n_keys: int,
    skew: float,
    seed: int = 0,
    shift_every: int | None = None,
    cdf: np.ndarray | None = None,
) -> np.ndarray:
    """Key ids (int64 in [0, n_keys)) of messages ``start .. start+count-1``."""
    idx = np.arange(start, start + count, dtype=np.int64)
    cdf = zipf_cdf(n_keys, skew) if cdf is None else cdf
    ranks = np.minimum(np.searchsorted(cdf, _uniform(idx, seed, 1), side="right"), n_keys - 1)
    if not shift_every:
        return ranks.astype(np.int64)
    phase = idx // shift_every
    # a different offset per phase: the hot ranks land on other keys
    offset = choice(phase.astype(np.uint64) + np.uint64(seed), 3) % np.uint64(n_keys)
    return ((ranks.astype(np.uint64) + offset) % np.uint64(n_keys)).astype(np.int64)


def key_strings(ids: np.ndarray) -> np.ndarray:
    """``k<id>`` string keys (object array)."""
    return np.array([f"k{i}" for i in ids.tolist()], dtype=object)


@functools.lru_cache(maxsize=4)
def key_names(n_keys: int) -> pa.Array:
    """Every key's string, ``k0`` .. ``k<n_keys - 1>``, as one Arrow array: a
    stream's key column is ``key_names(n).take(ids)`` (equal to
    ``key_strings(ids)``, without a Python string per message)."""
    return pa.array(key_strings(np.arange(int(n_keys))), type=pa.string())


def labels(ids: np.ndarray, idx_start: int, *, classes: int, seed: int = 0) -> np.ndarray:
    """A class per message: the key's own class 80% of the time, else uniform."""
    idx = np.arange(idx_start, idx_start + len(ids), dtype=np.int64)
    own = choice(ids.astype(np.uint64) + np.uint64(seed), 5) % np.uint64(classes)
    rnd = (_uniform(idx, seed, 6) * classes).astype(np.uint64)
    noisy = _uniform(idx, seed, 7) < 0.2
    return np.where(noisy, rnd, own).astype(np.int64)


def payload(name: str, start: int, count: int, seed: int = 0) -> np.ndarray:
    """A generated payload column (``value`` or ``amount``) for messages
    ``start..start+count-1``; ``amount``'s nulls are NaN."""
    idx = np.arange(start, start + count, dtype=np.int64)
    if name == "value":
        return (_uniform(idx, seed, 8) * 1000).astype(np.int64)
    if name == "amount":
        amount = np.floor(_uniform(idx, seed, 9) * 100_000) / 100
        return np.where(_uniform(idx, seed, 10) < NULL_AMOUNT, np.nan, amount)
    raise ValueError(f"no generated column {name!r} (known: {', '.join(GENERATED_COLUMNS)})")


def generate(
    start: int, count: int, spec: dict, *, with_labels: bool = False,
    columns: tuple[str, ...] = (), arrow_keys: bool = False,
) -> dict[str, Any]:
    """Columns of messages ``start..start+count-1`` for a generator spec.

    ``spec`` holds the topology's input fields (format, keys, skew, seed,
    shift_every, classes). Returns ``{"key": object[str], "ts": int64}``,
    ``"label"`` when asked (``with_labels``) and the payload ``columns``;
    ``arrow_keys``: the keys as an Arrow string array (``key_names``).
    """
    shift = spec.get("shift_every") if spec.get("format") == "evolving-zipf" else None
    seed = int(spec.get("seed", 0))
    ids = key_ids(
        start, count, n_keys=int(spec["keys"]), skew=float(spec["skew"]),
        seed=seed, shift_every=shift,
    )
    keys = key_names(int(spec["keys"])).take(pa.array(ids)) if arrow_keys else key_strings(ids)
    out = {"ts": np.arange(start, start + count, dtype=np.int64), "key": keys}
    if with_labels or "label" in columns:
        out["label"] = labels(ids, start, classes=int(spec.get("classes", 2)), seed=seed)
    for name in columns:
        if name not in out:
            out[name] = payload(name, start, count, seed)
    return out
