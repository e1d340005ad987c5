"""How the balancing machinery scales with the number of workers (and sources).

    python scripts/scale_sim.py [--workers 10,100,1000] [--schemes kg,pkg,...]
                                [--messages 1000000] [--sim-sources 2,16] [--md]

Two tables, measured (nothing here is a formula):

1. **Routing, per source** - the grouping code itself (``runtime.grouping``),
   one instance per source as in the real runtime, routing ``--messages``
   Zipf(1.1) hashes over 100,000 keys in batches of 1,000 (after a warm-up, so
   JIT compilation is excluded):
   - ``state KiB``: the grouping object's memory after the stream, measured by
     walking it (numpy buffers, lists, dicts, sets, deques) - what every
     source holds;
   - ``B/VW``: for schemes with virtual workers (CG), bytes per virtual worker,
     measured as the state difference between 20 and 10 VWs per worker
     divided by the extra VWs;
   - ``ns/msg``: routing CPU time per message (this thread's CPU clock: robust
     on a shared box), median of 3;
   - ``sub/batch``: sub-batches a batch of 1,000 splits into (= actor calls per
     1,000 messages; each costs ~1 ms of CPU here, docs/design.md) and
     ``msgs/sub``: messages per call.
2. **Feedback, simulated** - ``runtime.sim`` (the runtime's own cores on a
   virtual clock) running CG with a quarter of the workers at capacity 0.3 and the
   sources offering more than the cluster can do: signals per second in
   total, per source and per worker, against the protocol's bound (each
   worker signals each source at most once per ``slot_s``), VW moves per
   second, acks per second (every call is acknowledged), capacity
   efficiency, and the simulator's own wall time. Batches grow with ``n``
   (``batch = max(1000, 20 n)``) so sub-batches stay ~20 messages - the
   setting a large deployment needs (see table 1's ``msgs/sub``).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from typing import Any

import numpy as np

from runtime.grouping import SCHEMES, make_grouping
from runtime.hashing import hash_keys

DEFAULT_SCHEMES = "kg,sg,pkg,dchoices,wchoices,ch,chbl,porc,cg,fish,gedik"
BATCH = 1000


def deep_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Memory held by ``obj`` and everything it references (numpy buffers
    included, shared objects once). Functions, classes and modules are not
    state and count zero."""
    seen = set() if seen is None else seen
    kind = type(obj)
    if id(obj) in seen or isinstance(obj, type) or kind.__module__.startswith("numba") \
            or kind.__name__ in ("module", "function", "method", "builtin_function_or_method",
                                 "CPUDispatcher", "partial"):
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        own = obj.nbytes if obj.base is None else 0
        base = deep_bytes(obj.base, seen) if isinstance(obj.base, np.ndarray) else 0
        return sys.getsizeof(obj) - (obj.nbytes if obj.base is None else 0) + own + base
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        return size + sum(deep_bytes(k, seen) + deep_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return size + sum(deep_bytes(x, seen) for x in obj)
    if hasattr(obj, "__dict__"):
        size += deep_bytes(vars(obj), seen)
    for slot in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, slot):
            size += deep_bytes(getattr(obj, slot), seen)
    return size


def zipf_hashes(m: int, n_keys: int = 100_000, skew: float = 1.1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -skew
    p /= p.sum()
    return hash_keys(rng.choice(n_keys, size=m, p=p).astype(np.int64))


def route_all(g: Any, batches: list[np.ndarray]) -> tuple[float, list[int]]:
    """CPU seconds to route every batch; distinct workers per batch."""
    t0 = time.thread_time()
    parts = []
    for b in batches:
        w = g.route(b)
        parts.append(w)
    cpu = time.thread_time() - t0
    return cpu, [len(np.unique(w)) for w in parts[:: max(1, len(parts) // 50)]]


def routing_rows(ns: list[int], schemes: list[str], messages: int,
                 say: Any) -> list[dict[str, Any]]:
    h = zipf_hashes(messages)
    batches = [h[i: i + BATCH] for i in range(0, len(h), BATCH)]
    rows = []
    for n in ns:
        for name in schemes:
            say(f"routing: n={n} {name}")
            make_grouping(name, n, seed=0).route(h[: 2 * BATCH])  # JIT warm-up
            cpus, subs, g = [], [], None
            for _ in range(3):
                g = make_grouping(name, n, seed=0)
                cpu, sub = route_all(g, batches)
                cpus.append(cpu)
                subs = sub
            state = deep_bytes(g)
            per_vw = None
            if name == "cg":
                g10 = make_grouping("cg", n, seed=0, virtual_per_worker=10)
                g20 = make_grouping("cg", n, seed=0, virtual_per_worker=20)
                route_all(g10, batches)
                route_all(g20, batches)
                per_vw = (deep_bytes(g20) - deep_bytes(g10)) / (10 * n)
            sub_mean = float(np.mean(subs))
            rows.append({"n": n, "scheme": name, "state_kib": state / 1024,
                         "bytes_per_vw": per_vw,
                         "ns_per_msg": statistics.median(cpus) / len(h) * 1e9,
                         "sub_per_batch": sub_mean, "msgs_per_sub": BATCH / sub_mean})
    return rows


def sim_rows(ns: list[int], sources: list[int], say: Any,
             seconds: float = 8.0) -> list[dict[str, Any]]:
    from runtime.sim import simulate
    from runtime.topology import load_topology

    rows = []
    for n in ns:
        for s in sources:
            caps = [0.3 if w < max(1, n // 4) else 1.0 for w in range(n)]
            service_us = 1000.0  # 1,000 msgs/s per worker at full speed
            cluster_rate = sum(caps) * 1e6 / service_us
            batch = max(BATCH, 20 * n)
            messages = int(cluster_rate * seconds)
            messages = max(messages, 4 * batch * s)
            topo = load_topology({
                "name": f"scale-n{n}-s{s}",
                "input": {"format": "zipf", "messages": messages, "keys": 100_000,
                          "skew": 1.1},
                "sources": s,
                "workers": {"count": n, "capacity": caps, "service_us": service_us},
                "grouping": {"scheme": "cg", "eps": 0.1},
                "run": {"batch": batch, "rate": 0},
            })
            say(f"simulating: n={n} sources={s} batch={batch} messages={messages:,}")
            t0 = time.perf_counter()
            # small blocks so that every source gets its share of the stream
            rep = simulate(topo, shard_block_rows=max(batch, messages // (8 * s))).report
            wall = time.perf_counter() - t0
            d = rep["duration_s"]
            sig = rep["signals"]["increase"] + rep["signals"]["decrease"]
            rows.append({
                "n": n, "sources": s, "batch": batch, "messages": messages, "sim_s": d,
                "signals_per_s": sig / d, "per_source_per_s": sig / d / s,
                "per_worker_per_s": sig / d / n, "bound_per_s": n * s / 0.5,
                "moves_per_s": rep["migrations"] / d, "acks_per_s": sum(src["calls"] for src in rep["sources"]) / d,
                "efficiency": rep["capacity_efficiency"], "wall_s": wall,
            })
    return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_tables(rrows: list[dict[str, Any]], srows: list[dict[str, Any]], md: bool) -> None:
    def table(head: list[str], rows: list[list[str]]) -> None:
        if md:
            print("| " + " | ".join(head) + " |")
            print("|" + "|".join("---:" for _ in head) + "|")
            for r in rows:
                print("| " + " | ".join(r) + " |")
        else:
            widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
            print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
            for r in rows:
                print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        print()

    if rrows:
        print(f"Routing, per source (batches of {BATCH}; state after the whole stream)\n")
        table(["n", "scheme", "state KiB", "B/VW", "ns/msg", "sub/batch", "msgs/sub"],
              [[str(r["n"]), r["scheme"], _fmt(r["state_kib"], ",.1f"),
                _fmt(r["bytes_per_vw"], ",.1f"), _fmt(r["ns_per_msg"], ",.1f"),
                _fmt(r["sub_per_batch"], ",.1f"), _fmt(r["msgs_per_sub"], ",.2f")]
               for r in rrows])
    if rrows:
        from runtime.grouping.signals import LoadSignaler

        sig = LoadSignaler()
        sig.observe(0.0, 0.5)
        print(f"Worker side: one LoadSignaler per source, {deep_bytes(sig):,} bytes each "
              f"(n workers x S sources of them in the cluster).\n")
    if srows:
        print("Feedback, simulated (CG, a quarter of the workers at 0.3, saturated)\n")
        table(["n", "sources", "batch", "sim s", "signals/s", "/source/s", "/worker/s",
               "bound/s", "VW moves/s", "acks/s", "efficiency", "wall s"],
              [[str(r["n"]), str(r["sources"]), f"{r['batch']:,}", f"{r['sim_s']:.1f}",
                f"{r['signals_per_s']:,.0f}", f"{r['per_source_per_s']:,.0f}",
                f"{r['per_worker_per_s']:.2f}", f"{r['bound_per_s']:,.0f}",
                f"{r['moves_per_s']:,.1f}", f"{r['acks_per_s']:,.0f}",
                _fmt(r["efficiency"], ".3f"), f"{r['wall_s']:.1f}"]
               for r in srows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="10,100,1000", help="worker counts n")
    ap.add_argument("--schemes", default=DEFAULT_SCHEMES)
    ap.add_argument("--messages", type=int, default=1_000_000, help="routing: messages")
    ap.add_argument("--sim-sources", default="2,16", help="simulator: source counts")
    ap.add_argument("--sim-seconds", type=float, default=8.0,
                    help="simulator: simulated seconds of input at the cluster's capacity")
    ap.add_argument("--no-routing", action="store_true")
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--md", action="store_true", help="markdown tables")
    args = ap.parse_args(argv)
    try:
        ns = [int(x) for x in args.workers.split(",") if x]
        sources = [int(x) for x in args.sim_sources.split(",") if x]
    except ValueError:
        print("--workers and --sim-sources: comma-separated integers", file=sys.stderr)
        return 2
    schemes = [s for s in args.schemes.split(",") if s]
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown or not ns or min(ns) < 1 or args.messages < BATCH:
        print(f"bad arguments (unknown schemes: {unknown})", file=sys.stderr)
        return 2

    def say(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    rrows = [] if args.no_routing else routing_rows(ns, schemes, args.messages, say)
    srows = [] if args.no_sim else sim_rows(ns, sources, say, args.sim_seconds)
    print_tables(rrows, srows, args.md)
    print(f"({time.perf_counter() - t0:.0f} s; python scripts/scale_sim.py "
          f"{' '.join(argv if argv is not None else sys.argv[1:])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
