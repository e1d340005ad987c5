"""TopK: per key, the k largest values of one column (an example user operator).

Result: ``key``, ``rank`` (int64, 1..k), ``value``, sorted by key (null last)
then rank. A key's rows are its k largest values with multiplicity, largest
first (rank = position, so equal values get consecutive ranks and any
tie-break yields the same rows). Nulls and NaNs are skipped. Mergeable: the
top k of a union is the top k of the parts' top k. Its ``add`` is plain
Python per record: the example of real CPU work that throttling slows down.
Loaded by file path: ``operator: examples/operators/topk.py:TopK``.
"""

import heapq
import math

import pyarrow as pa


class TopK:
    mergeable = True                       # partial states of one key merge exactly

    def __init__(self, column="ts", k=3):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1 (got {k!r})")
        self.column, self.k, self.columns = column, k, (column,)

    def create(self):                      # an empty partial state
        return {}                          # key -> min-heap of its k largest values

    def add(self, state, batch: pa.RecordBatch):   # 'key' + the requested columns
        for key, v in zip(batch.column("key").to_pylist(),
                          batch.column(self.column).to_pylist(), strict=True):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            heap = state.setdefault(key, [])
            (heapq.heappush if len(heap) < self.k else heapq.heappushpop)(heap, v)
        return state

    def merge(self, a, b):                 # a key may be split across workers and flushes
        for key, heap in b.items():
            a[key] = heapq.nlargest(self.k, a.get(key, []) + heap)
            heapq.heapify(a[key])
        return a

    def finish(self, state) -> pa.Table:   # the final table: result.parquet
        rows = [(key, rank, v) for key in sorted(state, key=lambda s: (s is None, s or ""))
                for rank, v in enumerate(sorted(state[key], reverse=True), 1)]
        return pa.table({"key": pa.array([r[0] for r in rows], pa.string()),
                         "rank": pa.array([r[1] for r in rows], pa.int64()),
                         "value": pa.array([r[2] for r in rows])})
