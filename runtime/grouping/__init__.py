"""Grouping schemes: one module per scheme, pure numpy/numba, no Ray.

``make_grouping(name, n_workers, seed=0, clock=None, **params)`` builds one;
``SCHEMES`` maps names to classes. Importing this package registers all.
"""

from runtime.grouping import (  # noqa: F401  (registration side effects)
    acg,
    cg,
    ch,
    chbl,
    dalton,
    dchoices,
    fish,
    gedik,
    kg,
    pkg,
    porc,
    potc,
    sg,
    wrr,
)
from runtime.grouping.base import SCHEMES, Grouping, make_grouping, register, scheme_params

__all__ = ["SCHEMES", "Grouping", "make_grouping", "register", "scheme_params"]
