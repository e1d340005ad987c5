"""A worker whose flush the aggregator fails to commit (real Ray actors).

Not the aggregator's death (the driver restarts the run for that) and not the
user operator's merge (its own one-line error): an error in the commit itself.
That flush is not committed and no later one can be, so the worker must fail
every call from then on; it once swallowed the error and the run waited
forever for commits that never came.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from runtime.dataflow.reliability import Part

pytestmark = pytest.mark.e2e


def test_a_commit_that_fails_in_the_aggregator_fails_the_worker_not_hangs(ray_spark) -> None:
    import ray

    from actors.worker import actor_class
    from runtime.dataflow.settings import WorkerSettings

    agg = _FailingAggregator.remote()
    w = actor_class().options(num_cpus=0, max_concurrency=8).remote(
        0, {"kind": "wordcount"}, ".", agg, WorkerSettings(service_us=0.0, aggregate_every_s=0.1))
    keys = pa.array([f"k{i % 7}" for i in range(100)])
    try:
        ray.get(w.process.remote(0, [Part.of(keys, time.time())]))
        deadline = time.time() + 60
        while ray.get(agg.calls.remote()) == 0:  # its first flush went to the aggregator
            assert time.time() < deadline, "the worker never flushed"
            time.sleep(0.05)
        # whose commit raised: a wait for that flush learns that nothing will
        # commit (it once waited out its timeout, and the run retried forever)
        with pytest.raises(ray.exceptions.RayTaskError, match="a bug in the commit"):
            ray.get(w.commit_now.remote(600.0))
        with pytest.raises(ray.exceptions.RayTaskError, match="a bug in the commit"):
            ray.get(w.process.remote(0, [Part.of(keys, time.time())]))
    finally:
        ray.kill(w)
        ray.kill(agg)


try:
    import ray as _ray

    @_ray.remote(num_cpus=0)
    class _FailingAggregator:
        """Its ``commit`` raises, as a bug in the aggregator's code would."""

        def __init__(self) -> None:
            self.n = 0

        def commit(self, flush):
            self.n += 1
            raise ValueError("a bug in the commit")

        def calls(self) -> int:
            return self.n
except ImportError:  # pragma: no cover
    pass
