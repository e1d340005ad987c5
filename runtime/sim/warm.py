"""Compile the runtime's kernels into numba's on-disk cache before a run needs them.

numba compiles a kernel on its first call and caches it on disk, in one
directory per version of the sources (``runtime/__init__.py``). Cold - the
first run after an install or an update - every source and worker of a real
run compiled the same kernels at once, after the run's clock had started:
1.5-2.5 s with nothing processed, and that run's latency counted it
(docs/benchmarks.md, "A cold first run"). ``warm()`` runs tiny simulations
over the runtime's own cores (``runtime.sim.cores``) for every scheme,
saturated and paced, and one of the heavy-hitters operator, in one process:
they call every routing, hashing and worker kernel a run calls;
then a marker file in the cache directory says this version is warm - for
this checkout: numba files a kernel under the absolute path of its source's
directory, so two checkouts of one version (two clones, CI's fresh clone
beside a work tree) share the directory but not the kernels.

    python -m runtime.sim.warm        # make setup runs it

``runtime.run`` starts it beside Ray's and Spark's start-up when the cache is
cold (``start_if_cold``), and waits for it before the actors start.

Each update of the sources makes a new cache directory (0.1-9 MB); a
warm-up deletes the other versions' directories that no run has used for
``PRUNE_AFTER_DAYS`` (``start_if_cold`` marks this version's used).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

MARKER = "warm"
#: a version's kernel cache that no run used for this long is deleted (``prune``)
PRUNE_AFTER_DAYS = 14


def _marker() -> Path:
    """This checkout's marker in this version's cache directory: ``warm-``
    and a digest of the package's path (numba's cache subdirectories are
    named after the sources' directories' absolute paths)."""
    import runtime  # sets NUMBA_CACHE_DIR for this version

    root = str(Path(runtime.__file__).resolve().parent)
    tag = hashlib.sha1(root.encode()).hexdigest()[:12]
    return Path(os.environ["NUMBA_CACHE_DIR"]) / f"{MARKER}-{tag}"


def is_warm() -> bool:
    return _marker().exists()


def warm() -> float:
    """Every scheme's kernels compiled (or loaded) in this process and cached
    on disk; returns the seconds it took."""
    from runtime.grouping import SCHEMES
    from runtime.sim.api import simulate
    from runtime.topology import load_topology

    t0 = time.perf_counter()
    # every scheme saturated and paced (at 0.8 of the 2.5 workers' 20,000
    # msgs/s each): a paced source knows what each worker holds, and acg then
    # routes with its admission bounds (``porc_admit_route``), which a
    # saturated source never calls
    for scheme in sorted(SCHEMES):
        for run in ({"batch": 500}, {"batch": 500, "rate": 40_000}):
            simulate(load_topology({
                "input": {"format": "zipf", "messages": 5_000, "keys": 200},
                "sources": 2,
                "workers": {"count": 3, "capacity": [1, 1, 0.5], "service_us": 50},
                "grouping": {"scheme": scheme}, "app": {"kind": "wordcount"}, "run": run}))
    # the heavy-hitters operator's sketches (a worker's Space-Saving kernels)
    simulate(load_topology({
        "input": {"format": "zipf", "messages": 5_000, "keys": 200},
        "sources": 2, "workers": {"count": 3, "service_us": 50},
        "grouping": {"scheme": "kg"}, "app": {"kind": "heavy-hitters", "top_k": 10},
        "run": {"batch": 500}}))
    _warm_array_kinds()
    marker = _marker()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return time.perf_counter() - t0


def _warm_array_kinds() -> None:
    """numba compiles a kernel once per kind of argument: the real engine also
    hashes keys whose Arrow buffers are read-only (what arrives from Spark and
    through Ray's object store) and counts distinct keys over read-only
    arrays, which the simulation does not (found by the signatures a real run
    still compiled after a warm-up)."""
    import numpy as np
    import pyarrow as pa

    from runtime.hashing import hash_arrow
    from runtime.reporting.metrics import DistinctKeys

    def read_only(keys: pa.Array) -> pa.Array:  # as Arrow IPC (Spark, Ray) hands them over
        batch = pa.record_batch([keys], names=["key"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return pa.ipc.open_stream(sink.getvalue()).read_next_batch().column(0)

    for typ in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        for keys in (pa.array(["a", "b", "c"], typ), pa.array(["a", None, "c"], typ)):
            for part in (keys, keys.slice(1), read_only(keys), read_only(keys).slice(1)):
                hashes = hash_arrow(part)
                frozen = np.array(hashes)
                frozen.flags.writeable = False
                DistinctKeys().add(hashes)
                DistinctKeys().add(frozen)


def prune(now: float | None = None) -> list[Path]:
    """Delete the other versions' kernel caches (``numba-<digest>`` beside
    this one) that no run used for ``PRUNE_AFTER_DAYS``; what was deleted.
    A running process keeps the kernels it loaded; one that needs a deleted
    version's again compiles them again."""
    import shutil

    here = Path(os.environ["NUMBA_CACHE_DIR"])
    cutoff = (time.time() if now is None else now) - PRUNE_AFTER_DAYS * 86_400
    gone = []
    for d in here.parent.glob("numba-*"):
        if d == here or not d.is_dir() or not re.fullmatch(r"numba-[0-9a-f]{16}", d.name):
            continue
        try:
            if d.stat().st_mtime < cutoff:
                shutil.rmtree(d)
                gone.append(d)
        except OSError:  # another process's prune, or not ours to delete
            continue
    return gone


def start_if_cold() -> subprocess.Popen[bytes] | None:
    """``python -m runtime.sim.warm`` in the background when this version's
    cache is cold (its output discarded), else None. A warm version's cache
    is marked used now (``prune`` keeps it)."""
    if is_warm():
        with contextlib.suppress(OSError):
            os.utime(_marker().parent)
        return None
    return subprocess.Popen([sys.executable, "-m", "runtime.sim.warm", "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--force", action="store_true", help="run even when the cache is warm")
    args = p.parse_args(argv)
    if is_warm() and not args.force:
        if not args.quiet:
            print(f"kernels: already compiled ({_marker().parent})")
        return 0
    took = warm()
    gone = prune()
    if not args.quiet:
        print(f"kernels: compiled for every scheme in {took:.1f} s ({_marker().parent})")
        if gone:
            print(f"kernels: deleted {len(gone)} other versions' caches unused for "
                  f"{PRUNE_AFTER_DAYS} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())
