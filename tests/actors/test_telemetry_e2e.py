"""Live metrics on the real engine: while a short paced run streams, the Ray
node's Prometheus endpoint shows our workers', sources' and driver's metrics
(``actors.telemetry``) with sensible values, and the actors carry their names."""

from __future__ import annotations

import threading
import time

import pytest

from runtime.top import collect, render
from runtime.topology import load_topology

pytestmark = pytest.mark.e2e


class Scraper(threading.Thread):
    """Scrapes the metrics endpoints and lists named actors every 0.5 s until stopped."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(daemon=True)
        self.endpoints = endpoints
        self.stop = threading.Event()
        self.samples: list = []  # (time, [Sample])
        self.named: set[tuple[str, str]] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        import ray

        from runtime.top import scrape

        try:
            while not self.stop.wait(0.5):
                got, _ = scrape(self.endpoints)
                self.samples.append((time.time(), got))
                for a in ray.util.list_named_actors(all_namespaces=True):
                    self.named.add((a["namespace"], a["name"]))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def test_metrics_on_the_prometheus_endpoint_during_a_run(ray_spark, tmp_path) -> None:
    from actors.pipeline import run_pipeline
    from actors.telemetry import prometheus_endpoints

    topo = load_topology({
        "name": "e2e-telemetry",
        "input": {"format": "zipf", "messages": 48_000, "keys": 2_000, "skew": 1.0, "seed": 3},
        "sources": 2,
        "workers": {"count": 3, "service_us": 200, "capacity": [1, 1, 0.5],
                    "throttle": "service", "changes": [{"at_s": 1.5, "worker": 0,
                                                        "capacity": 0.5}]},
        "grouping": {"scheme": "cg", "virtual_per_worker": 10},
        "app": {"kind": "wordcount", "aggregate_every_s": 0.5},
        "run": {"batch": 500, "seed": 1, "rate": 8_000},  # paced: ~6 s of streaming
    }, check_input=True)
    endpoints = prometheus_endpoints()
    assert endpoints, "no Prometheus metrics endpoint in the cluster"
    scraper = Scraper(endpoints)
    scraper.start()
    try:
        # new actors, as runtime.run starts them (reused ones keep their first run's names)
        report = run_pipeline(topo, tmp_path / "run", ray_spark, progress=False,
                              log=lambda m: None, reuse_actors=False)
        t_end = time.time()
    finally:
        scraper.stop.set()
        scraper.join(timeout=10)
    assert scraper.error is None, scraper.error
    assert report["messages"]["processed"] == 48_000

    # everything seen while run_pipeline had not returned yet, for this run only
    during = [s for t, got in scraper.samples if t < t_end for s in got
              if s.labels.get("run", "").startswith("e2e-telemetry-")]
    assert during, "none of our metrics appeared on the endpoint during the run"
    runs = collect(during)
    assert len(runs) == 1
    (view,) = runs.values()
    ns = view.run

    assert view.info["scheme"] == "cg" and view.info["workers"] == "3"
    assert view.messages == 48_000
    assert set(view.workers) == {0, 1, 2} and set(view.sources) == {0, 1}

    def values(name: str, **labels: str) -> list[float]:
        return [s.value for s in during if s.name == name
                and all(s.labels.get(k) == v for k, v in labels.items())]

    processed = values("hs_worker_processed_total")
    assert processed and max(processed) > 0
    assert 0 < max(values("hs_source_routed_total")) <= 24_000  # per source
    assert max(values("hs_run_acked")) > 0
    for name in ("hs_worker_utilization", "hs_worker_busy"):
        vals = values(name)
        assert vals and all(0 <= v <= 1.5 for v in vals), (name, vals)
    rates = values("hs_worker_rate")
    assert rates and max(rates) > 100 and all(r < 20_000 for r in rates), rates
    # capacities: initial ones, then worker 0's change to 0.5 at 1.5 s
    assert set(values("hs_worker_capacity", actor="worker-2")) == {0.5}
    assert 0.5 in values("hs_worker_capacity", actor="worker-0")
    # CG: each source maps its 30 virtual workers onto the 3 workers
    for src in ("source-0", "source-1"):
        last = {s.labels["worker"]: s.value for s in during
                if s.name == "hs_source_vw_owned" and s.labels["actor"] == src}
        assert set(last) == {"0", "1", "2"} and sum(last.values()) == 30, last
    assert max(values("hs_worker_batch_latency_seconds_count")) > 0
    assert max(values("hs_worker_latency_p99_seconds")) > 0
    assert all(s.labels["actor"] in {"driver", "source-0", "source-1", "worker-0",
                                     "worker-1", "worker-2"} for s in during)

    text = render(view, t_end)
    assert "worker" in text and ns in text

    # the actors are named in the run's namespace (what the dashboard shows)
    named = {name for n, name in scraper.named if n == ns}
    assert {"aggregator", "source-0", "source-1", "worker-0", "worker-1",
            "worker-2"} <= named, scraper.named
