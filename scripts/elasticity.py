"""Fraction of keys moved when a worker joins or leaves, per scheme, vs the ideal.

    python scripts/elasticity.py [--schemes ch,fish,kg,...] [--workers 4,8,16]
        [--keys 20000] [--messages 200000] [--skew 0.0] [--csv FILE]

Uses ``runtime.sim.elasticity.key_moves`` (the grouping code both engines route
with). ``ideal`` is ``1 / (n + 1)`` for a change between ``n`` and ``n + 1``
workers; ``none`` is the drift with no change (load-aware schemes move keys
anyway), so the cost of the change itself is roughly ``add - none``.
"""

from __future__ import annotations

import argparse
import sys

from runtime.grouping import SCHEMES
from runtime.sim.elasticity import key_moves


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="ch,fish,gedik,chbl,kg,cg,pkg")
    ap.add_argument("--workers", default="4,8,16")
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--skew", type=float, default=0.0)
    ap.add_argument("--csv", default=None)
    a = ap.parse_args(argv)
    schemes = [s for s in a.schemes.split(",") if s]
    bad = [s for s in schemes if s not in SCHEMES]
    if bad:
        print(f"--schemes: unknown scheme {bad[0]!r}", file=sys.stderr)
        return 2
    rows = []
    print(f"{'scheme':8} {'n->':>6} {'op':6} {'keys moved':>10} {'msgs moved':>10} "
          f"{'ideal':>7} {'ratio':>6}")
    for s in schemes:
        for n in [int(x) for x in a.workers.split(",")]:
            for op in ("add", "remove", "none"):
                r = key_moves(s, n, op, n_keys=a.keys, messages=a.messages, skew=a.skew)
                rows.append(r)
                ratio = (r["moved_keys_fraction"] / r["ideal_fraction"]
                         if r["ideal_fraction"] else float("nan"))
                print(f"{s:8} {r['workers_before']:>2}->{r['workers_after']:<3} {op:6} "
                      f"{r['moved_keys_fraction']:>10.3f} {r['moved_messages_fraction']:>10.3f} "
                      f"{r['ideal_fraction']:>7.3f} {ratio:>6.2f}", flush=True)
    if a.csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
