"""The aggregator actor: merges the workers' periodic partials into the final table.

``AggregatorCore`` wraps the app's aggregator (``runtime.apps``): ``merge``
partials from any worker in any order, ``result()`` the final table. A plain
(single-threaded) Ray actor, so merges run one at a time in arrival order.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


class AggregatorCore:
    def __init__(self, app_kind: str, app_params: dict[str, Any]) -> None:
        from runtime.apps import make_app

        self.app = make_app(app_kind, **app_params)
        self.agg = self.app.new_aggregator()
        self.partials = 0

    def merge(self, partial: Any) -> None:
        self.agg.merge(partial)
        self.partials += 1

    def result(self) -> pa.Table:
        return self.agg.result()

    def stats(self) -> dict[str, Any]:
        return {"partials": self.partials}


def actor_class() -> Any:
    import ray

    return ray.remote(AggregatorCore)
