"""Exact ``x mod n`` for uint64 ``x`` without a hardware division (compiled).

A 64-bit ``%`` costs ~12 ns on the machines here (more than the rest of a
PKG routing step). ``mod_n(x, n, magic)`` with ``magic = mod_magic(n) =
floor((2^64 - 1) / n)`` computes the same value exactly: the estimate
``q' = mulhi64(x, magic)`` satisfies ``x/n - 2 < q' <= x/n`` (because
``magic > 2^64/n - 1`` and ``x < 2^64``), so ``x - q' n`` lies in ``[r, r + 2n)``
and exactly two conditional (branch-free) subtractions of ``n`` give
``r = x mod n``. ``mulhi64`` is one 64x64->128-bit multiply (an LLVM ``i128``
product: a single ``mul`` on x86-64, 22 -> 18 ns per PKG message measured;
``mulhi64_portable`` is the same value from four 32x32-bit products).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from runtime.kernels.jit import kernel

_MASK32 = np.uint64(0xFFFFFFFF)


def mod_magic(n: int) -> np.uint64:
    """The reciprocal used by ``mod_n``: ``floor((2^64 - 1) / n)``, ``n >= 1``."""
    return np.uint64((2**64 - 1) // int(n))


@intrinsic
def _mulhi64_i128(typingctx: Any, a: Any, b: Any) -> Any:  # pragma: no cover - compiled
    """``(zext128(a) * zext128(b)) >> 64``, emitted as LLVM IR."""
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i128 = ir.IntType(128)
        p = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
        return builder.trunc(builder.lshr(p, ir.Constant(i128, 64)), ir.IntType(64))

    return sig, codegen


_mulhi128: Any = _mulhi64_i128  # called with (a, b) in compiled code; the stubs want typingctx


@kernel(inline=True)
def mulhi64(a: np.uint64, b: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """The high 64 bits of the 128-bit product ``a * b`` (one hardware multiply)."""
    return _mulhi128(np.uint64(a), np.uint64(b))


@kernel(inline=True)
def mulhi64_portable(a: np.uint64, b: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """``mulhi64`` from four 32x32-bit products (reference for tests)."""
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
