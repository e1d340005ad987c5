"""KG - key grouping (hashing). Nasir et al., ICDE 2015, section 2.

``w = H_1(k) mod n``. Guarantee: exactly one worker per key (memory-optimal),
imbalanced under skew.
"""

from __future__ import annotations

import numpy as np

from runtime.grouping.base import Grouping, register
from runtime.grouping.fastmod import magic_of, mod_n
from runtime.hashing import choice_scalar
from runtime.kernels.jit import kernel


@kernel()
def _kg_route(key_hashes: np.ndarray, n_workers: int, out: np.ndarray) -> None:  # pragma: no cover
    """``out[i] = H_1(key_hashes[i]) mod n``: one fused loop, division-free mod."""
    nn = np.uint64(n_workers)
    magic = magic_of(nn)
    for i in range(key_hashes.shape[0]):
        out[i] = np.int32(mod_n(choice_scalar(key_hashes[i], 1), nn, magic))


@register
class KeyGrouping(Grouping):
    name = "kg"
    splits_keys = False

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(key_hashes, dtype=np.uint64)
        out = np.empty(len(h), dtype=np.int32)
        _kg_route(h, self.n_workers, out)
        return self._live(h, out)
