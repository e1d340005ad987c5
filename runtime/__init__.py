"""Load-balancing runtime for stream processing on heterogeneous clusters.

``runtime`` is engine independent: the topology schema, hashing, grouping
schemes (``grouping``), operators, the actor cores' pure machinery
(``dataflow``), inputs, reporting, compiled kernels and the simulator
(``sim``: the same cores on a virtual clock). Only ``actors/`` imports Ray; the entry points (``run``,
``compare``, ``top``, ``api``) reach it through ``actors.engine`` from inside
one function (``tests/test_layering.py`` checks both).

Compiled kernels are cached by numba (``cache=True``), but numba only checks
the file that defines a function, not the helpers it inlines from other files:
after an update, a stale cache would keep running old code. So the cache lives
in a directory named after a hash of this package's sources
(``~/.cache/hetero-stream/numba-<hash>``), unless ``NUMBA_CACHE_DIR`` is set.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

__version__ = "0.1.0"


def _numba_cache_dir() -> str:
    root = Path(__file__).resolve().parent
    h = hashlib.sha1()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return str(base / "hetero-stream" / f"numba-{h.hexdigest()[:16]}")


if not os.environ.get("NUMBA_CACHE_DIR"):
    os.environ["NUMBA_CACHE_DIR"] = _numba_cache_dir()  # read when numba is imported
    if "numba" in sys.modules:  # imported already: its config is read, set it directly
        sys.modules["numba"].config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
