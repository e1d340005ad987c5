"""How many keys move when a worker joins or leaves (same grouping code as both engines).

``key_moves(scheme, n_workers, op)`` routes a stream of keys through one
grouping instance, changes its membership (``op``: ``"add"`` a worker or
``"remove"`` one), routes the same key distribution again, and compares each
distinct key's *home* - the set of workers it went to - before and after.
The ideal for one membership change between ``n`` and ``n + 1`` workers is
``1 / (n + 1)`` of the keys: the newcomer's fair share when one joins, exactly
the leaver's keys when one leaves. ``op="none"`` measures the baseline drift
of load-aware schemes whose homes move without any membership change (PKG,
PoRC, CG split keys by load).

Schemes with native membership (CH and FISH's ring, CG's virtual workers)
change it directly; the others are built with one spare worker id marked
departed (``Grouping.on_workers_changed``'s liveness mask), so that "add" is
the spare joining - the only way a hash-mod-n scheme can grow without
rehashing everything (see docs/reliability.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.grouping import make_grouping
from runtime.hashing import hash_keys


def _homes(worker_of: np.ndarray, keys: np.ndarray) -> dict[int, frozenset[int]]:
    homes: dict[int, set[int]] = {}
    for k, w in zip(keys.tolist(), worker_of.tolist(), strict=True):
        homes.setdefault(k, set()).add(w)
    return {k: frozenset(v) for k, v in homes.items()}


def key_moves(scheme: str, n_workers: int, op: str, *, n_keys: int = 20_000,
              messages: int = 200_000, skew: float = 0.0, seed: int = 0,
              **params: Any) -> dict[str, Any]:
    """Fraction of distinct keys (and of messages) whose home changed; see module doc.

    ``skew``: Zipf exponent of the key popularity (0 = uniform).
    """
    if op not in ("add", "remove", "none"):
        raise ValueError(f"op must be 'add', 'remove' or 'none' (got {op!r})")
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -skew
    p /= p.sum()
    keys = rng.choice(n_keys, size=2 * messages, p=p).astype(np.int64)
    before_keys, after_keys = keys[:messages], keys[messages:]
    h_before, h_after = hash_keys(before_keys), hash_keys(after_keys)

    g = make_grouping(scheme, n_workers + 1, seed=seed, **params)
    live = list(range(n_workers + 1))
    if op == "add":
        g.on_workers_changed(live[:-1])  # n workers running, id n is the spare
    batch = 1000
    out_b = np.concatenate([g.route(h_before[i:i + batch]) for i in range(0, messages, batch)])
    ideal = 1.0 / (n_workers + 1)
    if op == "add":
        g.add_worker(n_workers)
    elif op == "remove":
        g.remove_worker(n_workers)  # n + 1 running, the last one leaves
    else:  # the baseline: how much homes drift with no change at all
        ideal = 0.0
    out_a = np.concatenate([g.route(h_after[i:i + batch]) for i in range(0, messages, batch)])
    hb, ha = _homes(out_b, before_keys), _homes(out_a, after_keys)
    common = [k for k in hb if k in ha]
    moved = {k for k in common if hb[k] != ha[k]}
    counts = np.bincount(after_keys, minlength=n_keys)
    moved_msgs = int(sum(counts[k] for k in moved))
    n_before = n_workers if op == "add" else n_workers + 1
    n_after = n_workers if op == "remove" else n_workers + 1
    return {
        "scheme": scheme, "op": op, "workers_before": n_before,
        "workers_after": n_after, "keys": len(common),
        "moved_keys_fraction": len(moved) / max(1, len(common)),
        "moved_messages_fraction": moved_msgs / max(1, int(counts[common].sum())),
        "ideal_fraction": ideal,
    }
