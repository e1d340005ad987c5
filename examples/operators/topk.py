"""TopK: per key, the k largest values of one column (an example user operator).

Result: ``key``, ``rank`` (int64, 1..k), ``value``, sorted by key (UTF-8 byte
order, null key last) then rank. A key's rows are its k largest values with
multiplicity, largest first (rank = position, so equal values get consecutive
ranks and any tie-break yields the same rows). Nulls and NaNs are skipped.
Mergeable: the top k of a union is the top k of the parts' top k.
Loaded by file path: ``operator: examples/operators/topk.py:TopK``.
"""

import heapq
import math

import pyarrow as pa


class TopK:
    mergeable = True

    def __init__(self, column: str = "ts", k: int = 3) -> None:
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1 (got {k!r})")
        self.column, self.k, self.columns = column, k, (column,)

    def create(self) -> dict:
        return {}  # key -> min-heap of its (at most k) largest values so far

    def add(self, state: dict, batch: pa.RecordBatch) -> dict:
        k = self.k  # plain Python per record: the "real CPU work" example
        for key, v in zip(batch.column("key").to_pylist(),
                          batch.column(self.column).to_pylist(), strict=True):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            heap = state.setdefault(key, [])
            if len(heap) < k:
                heapq.heappush(heap, v)
            elif v > heap[0]:
                heapq.heapreplace(heap, v)
        return state

    def merge(self, a: dict, b: dict) -> dict:
        for key, heap in b.items():
            both = a.get(key, []) + heap
            a[key] = both if len(both) <= self.k else heapq.nlargest(self.k, both)
            heapq.heapify(a[key])
        return a

    def finish(self, state: dict) -> pa.Table:
        keys, ranks, values = [], [], []
        for key in sorted(state, key=lambda s: (s is None, s or "")):
            for rank, v in enumerate(sorted(state[key], reverse=True), start=1):
                keys.append(key)
                ranks.append(rank)
                values.append(v)
        return pa.table({"key": pa.array(keys, pa.string()),
                         "rank": pa.array(ranks, pa.int64()), "value": pa.array(values)})
