"""The aggregator actor (``aggregator``): ``runtime.dataflow.aggregator.AggregatorCore``
as a plain (single-threaded) Ray actor, so its calls run one at a time in
arrival order: a flush is committed atomically or not at all.
"""

from __future__ import annotations

import os
from typing import Any

from runtime.dataflow.aggregator import AggregatorCore
from runtime.dataflow.reliability import reset_peak_rss


class AggregatorActor(AggregatorCore):
    """``AggregatorCore`` plus where its process runs (fault injection, peak RSS)."""

    def pid(self) -> int:
        return os.getpid()

    def capture_output(self, path: str, name: str) -> bool:
        """The operator's prints go to the run's ``operators.log`` (``actors.operator_output``)."""
        from actors.operator_output import capture

        return capture(path, name)

    def recycle(self) -> bool:
        """The run is over (``actors.pool``): its state dropped; ``False`` if
        this process cannot be reused."""
        del self.app, self.ledger, self._early, self.coordinator
        return reset_peak_rss()

    def rebind(self, settings: Any, coordinator: Any = None, state: Any = None) -> int:
        """A recycled aggregator becomes the next run's (``__init__``'s arguments); its pid."""
        AggregatorCore.__init__(self, settings, coordinator, state=state)
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def actor_class() -> Any:
    import ray

    return ray.remote(AggregatorActor)
