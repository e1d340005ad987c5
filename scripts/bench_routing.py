"""Routing speed of every registered grouping scheme, in ns per message.

Routes ``--messages`` Zipf(``--skew``) key hashes in micro-batches of
``--batch`` through a fresh instance of each scheme (after a warm-up call, so
JIT compilation is excluded) and compares with a vectorized ``hash % n``
baseline measured in the same run. Each number is the median of ``--repeat``
repetitions. New schemes are picked up automatically from ``SCHEMES``.
``acg+admission`` is acg as a source runs it once the controller's first
table is in: the table carries rate shares (a quarter of the workers at 0.3),
so every step first hands the grouping what this source holds per worker
(``on_held``: here the last step's messages, unacknowledged) and the routing
goes through the admission bounds (``porc_admit_route``); plain ``acg``
(no table yet) routes with PoRC alone.

    python scripts/bench_routing.py [--messages 2000000] [--workers 8] [--batch 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.grouping import SCHEMES, make_grouping
from runtime.grouping.coordination import VwTable
from runtime.hashing import hash_keys


def zipf_hashes(m: int, n_keys: int, skew: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -skew
    p /= p.sum()
    return hash_keys(rng.choice(n_keys, size=m, p=p).astype(np.int64))


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter


def time_batches(route: Callable[[np.ndarray], np.ndarray], batches: list[np.ndarray]) -> float:
    t0 = clock()
    for b in batches:
        route(b)
    return clock() - t0


def admission_router(n: int) -> Callable[[np.ndarray], np.ndarray]:
    """acg with a table that carries rate shares (``acg+admission``, above)."""
    g: Any = make_grouping("acg", n_workers=n, seed=0)
    caps = np.array([0.3 if w < max(1, n // 4) else 1.0 for w in range(n)])
    g.adopt(VwTable(1, g.vw_owner.copy(), caps / caps.sum()))
    rate = caps * 5000.0
    held = np.zeros(n)

    def route(b: np.ndarray) -> np.ndarray:
        g.on_held(held, rate)
        out: np.ndarray = g.route(b)
        held[:] = np.bincount(out, minlength=n)
        return out

    return route


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys")
    ap.add_argument("--skew", type=float, default=1.1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--schemes", default="", help="comma-separated subset (default: all)")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall (perf_counter) or cpu (this thread's CPU time: robust on a busy box)",
    )
    args = ap.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.messages < 1 or args.workers < 1 or args.batch < 1 or args.repeat < 1:
        print("--messages, --workers, --batch and --repeat must be >= 1", file=sys.stderr)
        return 2
    names = [s for s in args.schemes.split(",") if s] or sorted(SCHEMES)
    unknown = [s for s in names if s not in SCHEMES]
    if unknown:
        print(f"unknown scheme(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    h = zipf_hashes(args.messages, args.keys, args.skew, seed=0)
    batches = [h[i : i + args.batch] for i in range(0, len(h), args.batch)]
    n = args.workers
    nn = np.uint64(n)

    def baseline(b: np.ndarray) -> np.ndarray:
        return (b % nn).astype(np.int32)

    base_s = statistics.median(time_batches(baseline, batches) for _ in range(args.repeat))
    base_ns = base_s / len(h) * 1e9
    rows = []
    routers: list[tuple[str, Callable[[], Callable[[np.ndarray], np.ndarray]]]] = [
        (name, lambda name=name: make_grouping(name, n_workers=n, seed=0).route)
        for name in names]
    if "acg" in names:
        routers.append(("acg+admission", lambda: admission_router(n)))
    for i, (name, make) in enumerate(routers, start=1):
        print(f"[{i}/{len(routers)}] {name} ...", file=sys.stderr, flush=True)
        make()(h[: 2 * args.batch])  # JIT warm-up
        times = [time_batches(make(), batches) for _ in range(args.repeat)]
        ns = statistics.median(times) / len(h) * 1e9
        rows.append((name, ns, ns / base_ns))
    print(
        f"{len(h):,} Zipf({args.skew}) messages over {args.keys:,} keys, "
        f"{n} workers, batches of {args.batch}, median of {args.repeat}, {args.clock} clock"
    )
    print(f"{'scheme':<14} {'ns/msg':>8} {'x hash%n':>9}")
    print(f"{'hash % n':<14} {base_ns:>8.1f} {1.0:>9.2f}")
    for name, ns, ratio in rows:
        print(f"{name:<14} {ns:>8.1f} {ratio:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
