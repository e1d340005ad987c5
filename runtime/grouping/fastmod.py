"""Exact ``x mod n`` for uint64 ``x`` without a hardware division (compiled).

A 64-bit ``%`` costs ~12 ns on the machines here (more than the rest of a
PKG routing step). ``mod_n(x, n, magic)`` with ``magic = mod_magic(n) =
floor((2^64 - 1) / n)`` computes the same value exactly: the estimate
``q' = mulhi64(x, magic)`` satisfies ``x/n - 2 < q' <= x/n`` (because
``magic > 2^64/n - 1`` and ``x < 2^64``), so ``x - q' n`` lies in ``[r, r + 2n)``
and exactly two conditional (branch-free) subtractions of ``n`` give
``r = x mod n``. ``mulhi64`` is
four 32x32-bit products.
"""

from __future__ import annotations

import numpy as np

from runtime.jit import kernel

_MASK32 = np.uint64(0xFFFFFFFF)


def mod_magic(n: int) -> np.uint64:
    """The reciprocal used by ``mod_n``: ``floor((2^64 - 1) / n)``, ``n >= 1``."""
    return np.uint64((2**64 - 1) // int(n))


@kernel(inline=True)
def mulhi64(a: np.uint64, b: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """The high 64 bits of the 128-bit product ``a * b``."""
    m32 = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    a_lo = a & m32
    a_hi = a >> s32
    b_lo = b & m32
    b_hi = b >> s32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    hi_hi = a_hi * b_hi
    cross = (lo_lo >> s32) + (hi_lo & m32) + lo_hi
    return hi_hi + (hi_lo >> s32) + (cross >> s32)


@kernel(inline=True)
def mod_n(x: np.uint64, n: np.uint64, magic: np.uint64) -> np.uint64:  # pragma: no cover
    """``x % n`` exactly, given ``magic = mod_magic(n)``."""
    r = x - mulhi64(x, magic) * n
    # two branch-free corrections (r < r_true + 2n): a data-dependent loop
    # mispredicts on real hashes and cost ~5 ns per call
    r = r - n if r >= n else r
    return r - n if r >= n else r


@kernel(inline=True)
def magic_of(n: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """``mod_magic`` inside compiled code (one division per call site)."""
    return np.uint64(0xFFFFFFFFFFFFFFFF) // n
