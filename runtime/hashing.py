"""64-bit key hashing shared by every source, worker and the simulator.

Keys are hashed once to 64 bits; a key's i-th independent choice is
``H_i(k) = mix64(h(k) + i * SEED_STEP)`` (docs/algorithms.md). Never Python's
built-in ``hash``: it is salted per process, so sources would disagree.

- ``str``/``bytes`` keys: MurmurHash3 x64-128 (seed 0) of the UTF-8 bytes,
  first 64 bits (``mmh3.hash64``).
- integer keys: Murmur3's 64-bit finalizer ``fmix64`` of the two's-complement
  value (vectorized; an int key ``5`` and a string key ``"5"`` differ).
- ``None``: a fixed hash (``NULL_HASH``), so null keys form one group, as in
  Spark's ``groupBy``.

Arrow string/binary arrays are hashed by ``hash_arrow`` in one compiled loop
over the offsets and data buffers (~10 ns/key instead of ~250 ns through
Python strings), bit-identical to ``hash_keys(arr.to_pylist())``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa
from numba import njit

from runtime.kernels.jit import kernel

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


# --- MurmurHash3_x64_128 (seed 0) over Arrow buffers ------------------------

@njit(cache=True, inline="always")
def _rotl64(x: np.uint64, r: int) -> np.uint64:  # pragma: no cover - compiled
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True, inline="always")
def _load_le(d: np.ndarray, p: int, n: int) -> np.uint64:  # pragma: no cover - compiled
    """``n`` (<= 8) bytes of ``d`` at ``p`` as a little-endian uint64 (no
    alignment needed: LLVM folds the full 8-byte case into one load)."""
    k = np.uint64(0)
    for j in range(n):
        k |= np.uint64(d[p + j]) << np.uint64(8 * j)
    return k


@njit(cache=True, inline="always")
def _murmur3_64(d: np.ndarray, p: int, length: int) -> np.uint64:  # pragma: no cover - compiled
    """MurmurHash3_x64_128(d[p:p+length], seed=0), first 64 bits (h1)."""
    c1 = np.uint64(0x87C37B91114253D5)
    c2 = np.uint64(0x4CF5AD432745937F)
    five = np.uint64(5)
    h1 = np.uint64(0)
    h2 = np.uint64(0)
    nblocks = length >> 4
    for b in range(nblocks):
        q = p + 16 * b
        k1 = _load_le(d, q, 8)
        k2 = _load_le(d, q + 8, 8)
        k1 *= c1
        k1 = _rotl64(k1, 31)
        k1 *= c2
        h1 ^= k1
        h1 = _rotl64(h1, 27)
        h1 += h2
        h1 = h1 * five + np.uint64(0x52DCE729)
        k2 *= c2
        k2 = _rotl64(k2, 33)
        k2 *= c1
        h2 ^= k2
        h2 = _rotl64(h2, 31)
        h2 += h1
        h2 = h2 * five + np.uint64(0x38495AB5)
    # tail: the C switch on len & 15 (cases 15..9 feed k2, 8..1 feed k1)
    tail = p + 16 * nblocks
    rem = length & 15
    if rem > 8:
        k2 = _load_le(d, tail + 8, rem - 8)
        k2 *= c2
        k2 = _rotl64(k2, 33)
        k2 *= c1
        h2 ^= k2
    if rem > 0:
        k1 = _load_le(d, tail, min(rem, 8))
        k1 *= c1
        k1 = _rotl64(k1, 31)
        k1 *= c2
        h1 ^= k1
    # finalization
    ln = np.uint64(length)
    h1 ^= ln
    h2 ^= ln
    h1 += h2
    h2 += h1
    h1 = mix64_scalar(h1)
    h2 = mix64_scalar(h2)
    h1 += h2
    return h1


@kernel()
def _hash_varbinary(offsets: np.ndarray, data: np.ndarray, validity: np.ndarray,
                    has_validity: bool, start: int, n: int,
                    out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Hash elements ``start .. start+n`` of an Arrow (large_)string/binary
    array given its offsets (int32|int64), data (uint8) and validity (uint8
    bitmap) buffers into ``out[:n]``; nulls get ``NULL_HASH``."""
    null = np.uint64(0x6E756C6C6B657921)
    for i in range(n):
        j = start + i
        if has_validity and not (validity[j >> 3] >> (j & 7)) & 1:
            out[i] = null
        else:
            lo = offsets[j]
            out[i] = _murmur3_64(data, lo, offsets[j + 1] - lo)


_EMPTY_U8 = np.zeros(0, dtype=np.uint8)


def _buffer_u8(buf: pa.Buffer | None) -> np.ndarray:
    return _EMPTY_U8 if buf is None or buf.size == 0 else np.frombuffer(buf, dtype=np.uint8)


def _hash_chunk(arr: pa.Array, out: np.ndarray) -> None:
    """Hash one (non-chunked) Arrow array into ``out`` (``uint64[len(arr)]``)."""
    n = len(arr)
    if n == 0:
        return
    t = arr.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = arr.cast(pa.large_binary())  # views: 16-byte structs, simpler copied
        t = arr.type
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        validity, offsets, data = arr.buffers()
        large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offs = np.frombuffer(offsets, dtype=np.int64 if large else np.int32)
        has_validity = validity is not None and arr.null_count > 0
        _hash_varbinary(offs, _buffer_u8(data), _buffer_u8(validity) if has_validity
                        else _EMPTY_U8, has_validity, arr.offset, n, out)
        return
    if pa.types.is_integer(t):
        if arr.null_count == 0:
            out[:] = hash_keys(arr.to_numpy())
        else:
            vals = arr.fill_null(0).to_numpy()
            out[:] = hash_keys(vals)
            out[arr.is_null().to_numpy(zero_copy_only=False)] = NULL_HASH
        return
    if pa.types.is_null(t):
        out[:] = NULL_HASH
        return
    if pa.types.is_dictionary(t) and (_is_varbinary(t.value_type)
                                      or pa.types.is_integer(t.value_type)):
        codes = arr.indices
        per_value = hash_arrow(arr.dictionary)
        if codes.null_count == 0:
            out[:] = per_value[codes.to_numpy()]
        else:
            out[:] = per_value[codes.fill_null(0).to_numpy()] if len(per_value) else NULL_HASH
            out[codes.is_null().to_numpy(zero_copy_only=False)] = NULL_HASH
        return
    out[:] = hash_keys(arr.to_pylist())  # anything else: the generic (scalar) path


def _is_varbinary(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t)
                or pa.types.is_string_view(t) or pa.types.is_binary_view(t))


def hash_arrow(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Hash an Arrow array's keys to ``uint64[n]``, equal to
    ``hash_keys(keys.to_pylist())`` bit for bit.

    ``string``/``large_string``/``binary``/``large_binary`` (and the view
    types, cast first): MurmurHash3_x64_128 of each value's bytes in one
    compiled loop over the Arrow buffers, nulls ``NULL_HASH``. Integers:
    vectorized ``mix64``. Dictionary arrays: their dictionary is hashed once.
    Other types go through ``hash_keys(keys.to_pylist())`` (same errors:
    e.g. bool raises ``TypeError``).
    """
    out = np.empty(len(keys), dtype=np.uint64)
    if isinstance(keys, pa.ChunkedArray):
        pos = 0
        for chunk in keys.chunks:
            _hash_chunk(chunk, out[pos:pos + len(chunk)])
            pos += len(chunk)
    else:
        _hash_chunk(keys, out)
    return out


_ARROW_MIN = 64  # shorter str sequences: the plain loop (pa.array's fixed cost)


def _str_fast_path(keys: Any) -> np.ndarray | None:
    """``hash_arrow(pa.array(keys))`` for a list/tuple/object array of ``str``
    (Nones allowed), or ``None`` if ``keys`` is anything else, so that the
    scalar loop then keeps today's behaviour and errors."""
    if len(keys) < _ARROW_MIN or not isinstance(keys[0], str):
        return None
    try:
        arr = pa.array(keys)
    except Exception:  # mixed types, surrogates, ...: the loop raises as before
        return None
    # only all-str (+ None) infers ``string``: bytes/bytearray make ``binary``
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return None
    if arr.null_count:  # pyarrow's nulls must be exactly the Nones
        nulls = np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))
        if any(keys[i] is not None for i in nulls.tolist()):
            return None
    return hash_arrow(arr)


def hash_keys(keys: Iterable[object] | np.ndarray | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Hash keys (iterable or array of str|bytes|int|None) to ``uint64[n]``.

    Integer arrays are hashed vectorized; Arrow arrays by ``hash_arrow``
    (compiled, ~10 ns/key for strings); long lists/object arrays of ``str``
    via ``pa.array`` + ``hash_arrow``; anything else costs one ``mmh3`` call
    per key (~60 ns + the Python loop).
    """
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return hash_arrow(keys)
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
        return mix64(keys.astype(np.int64).view(np.uint64))
    if isinstance(keys, np.ndarray) and keys.dtype.kind == "b":
        raise TypeError("unsupported key type bool")
    if isinstance(keys, (list, tuple)) or (isinstance(keys, np.ndarray)
                                            and keys.dtype == object and keys.ndim == 1):
        fast = _str_fast_path(keys)
        if fast is not None:
            return fast
    h64 = mmh3.hash64
    out: list[int] = []
    append = out.append
    for k in keys:
        if isinstance(k, str):
            append(h64(k.encode("utf-8"), 0, signed=False)[0])
        else:
            append(hash_one(k))
    return np.fromiter(out, dtype=np.uint64, count=len(out))
