"""64-bit key hashing shared by every source, worker and the simulator.

Keys are hashed once to 64 bits; a key's i-th independent choice is
``H_i(k) = mix64(h(k) + i * SEED_STEP)`` (ALGORITHMS.md). Never Python's
built-in ``hash``: it is salted per process, so sources would disagree.

- ``str``/``bytes`` keys: MurmurHash3 x64-128 (seed 0) of the UTF-8 bytes,
  first 64 bits (``mmh3.hash64``).
- integer keys: Murmur3's 64-bit finalizer ``fmix64`` of the two's-complement
  value (vectorized; an int key ``5`` and a string key ``"5"`` differ).
- ``None``: a fixed hash (``NULL_HASH``), so null keys form one group, as in
  Spark's ``groupBy``.
"""

from __future__ import annotations

from collections.abc import Iterable

import mmh3
import numpy as np
from numba import njit

SEED_STEP = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
NULL_HASH = np.uint64(0x6E756C6C6B657921)  # "nullkey!"


def mix64(x: np.ndarray) -> np.ndarray:
    """Murmur3 fmix64 on a uint64 array (vectorized, wraps modulo 2**64)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> _S33)
        x = x * _C1
        x = x ^ (x >> _S33)
        x = x * _C2
        x = x ^ (x >> _S33)
    return x


@njit(cache=True, inline="always")
def mix64_scalar(x: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    x = x ^ (x >> np.uint64(33))
    return x


@njit(cache=True, inline="always")
def choice_scalar(h: np.uint64, i: int) -> np.uint64:  # pragma: no cover - compiled
    """The i-th independent 64-bit choice of a key hash (compiled)."""
    return mix64_scalar(h + np.uint64(i) * np.uint64(0x9E3779B97F4A7C15))


def choice(key_hashes: np.ndarray, i: int) -> np.ndarray:
    """The i-th independent 64-bit choice ``H_i`` of every key hash (vectorized)."""
    h = np.asarray(key_hashes, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix64(h + np.uint64(i) * SEED_STEP)


def hash_one(key: object) -> int:
    """Hash one key (str, bytes, int or None) to an unsigned 64-bit int."""
    if key is None:
        return int(NULL_HASH)
    if isinstance(key, str):
        return mmh3.hash64(key.encode("utf-8"), 0, signed=False)[0]
    if isinstance(key, bytes):
        return mmh3.hash64(key, 0, signed=False)[0]
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(mix64(np.array([int(key) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0])
    raise TypeError(f"unsupported key type {type(key).__name__}: {key!r}")


def hash_keys(keys: Iterable[object] | np.ndarray) -> np.ndarray:
    """Hash keys (iterable or array of str|bytes|int|None) to ``uint64[n]``.

    Integer arrays are hashed vectorized; strings cost one ``mmh3`` call each
    (~60 ns).
    """
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
        return mix64(keys.astype(np.int64).view(np.uint64))
    if isinstance(keys, np.ndarray) and keys.dtype.kind == "b":
        raise TypeError("unsupported key type bool")
    h64 = mmh3.hash64
    out: list[int] = []
    append = out.append
    for k in keys:
        if isinstance(k, str):
            append(h64(k.encode("utf-8"), 0, signed=False)[0])
        else:
            append(hash_one(k))
    return np.fromiter(out, dtype=np.uint64, count=len(out))
