"""KG - key grouping (hashing). Nasir et al., ICDE 2015, section 2.

``w = H_1(k) mod n``. Guarantee: exactly one worker per key (memory-optimal),
imbalanced under skew.
"""

from __future__ import annotations

import numpy as np

from runtime.grouping.base import Grouping, register
from runtime.hashing import choice


@register
class KeyGrouping(Grouping):
    name = "kg"

    def route(self, key_hashes: np.ndarray) -> np.ndarray:
        return (choice(key_hashes, 1) % np.uint64(self.n_workers)).astype(np.int32)
