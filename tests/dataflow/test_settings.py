"""The cores' settings (runtime.dataflow.settings): derived from the topology
once, the same for the Ray engine and the simulator over the cores, and able
to cross Ray (picklable)."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from runtime.dataflow.settings import (
    AggregatorSettings,
    CoreSettings,
    SourceSettings,
    WorkerSettings,
    coordinator_for,
)
from runtime.grouping.signals import WorkerSignals
from runtime.topology import load_topology

TOPOLOGIES = sorted((Path(__file__).resolve().parents[2] / "topologies").glob("*.yaml"))
#: what the simulator models differently (runtime.sim.cores.core_settings: cpulimit
#: as the duty cycle it is, a queue that never fills)
SIMULATED = {"throttle", "queue_batches"}


@pytest.mark.parametrize("scheme", [None, "acg", "cg", "wrr", "kg"])
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_the_ray_engine_and_the_simulator_derive_the_same_settings(path: Path,
                                                                    scheme: str | None) -> None:
    from actors.pipeline import core_settings as ray_settings  # imports Ray, starts nothing
    from runtime.sim.cores import core_settings as sim_settings

    topo = load_topology(path, [f"grouping.scheme={scheme}"] if scheme else [])
    coordinator = coordinator_for(topo)
    ray, sim = ray_settings(topo, coordinator), sim_settings(topo, coordinator)
    assert sim.source == ray.source
    assert sim.aggregator == ray.aggregator
    assert len(sim.workers) == len(ray.workers) == topo.workers.total_count
    for r, s in zip(ray.workers, sim.workers, strict=True):
        differ = {f.name for f in dataclasses.fields(r) if getattr(r, f.name) != getattr(s, f.name)}
        assert differ <= SIMULATED, differ
        assert s.throttle == ("service" if r.throttle == "service" else "duty-cycle")
        assert dataclasses.replace(s, throttle=r.throttle, queue_batches=r.queue_batches) == r


def test_settings_are_derived_from_the_topology() -> None:
    topo = load_topology({
        "grouping": {"scheme": "acg", "epoch_s": 0.5},
        "sources": 2,
        "workers": {"count": 3, "capacity": [1.0, 0.5, 0.25], "queue_batches": 16,
                    "service_us": 50.0},
        "run": {"rate": 10_000, "linger_ms": 5, "behind_linger_ms": 20, "max_inflight": 3,
                "seed": 7},
    })
    coordinator = coordinator_for(topo)
    assert coordinator is not None and coordinator.epoch_s == 0.5
    s = CoreSettings.from_topology(topo, coordinator)
    src = s.source
    assert (src.n_workers, src.max_inflight, src.rate_per_source) == (3, 3, 5_000.0)
    assert (src.linger_s, src.behind_linger_s, src.report_every_s) == (0.005, 0.02, 0.5)
    assert src.capacities == (1.0, 0.5, 0.25) and src.seed == 7
    assert src.grouping(1).seed == 8  # each source its own grouping instance
    assert [w.capacity for w in s.workers] == [1.0, 0.5, 0.25]
    w = s.workers[0]
    assert (w.service_us, w.queue_batches, w.report_every_s) == (50.0, 16, 0.5)
    assert w.queue_capacity_batches == 2 * 3  # one call per in-flight slot of every source
    assert w.signals is None
    assert s.aggregator == AggregatorSettings(topo.app.model_dump(), topo.base_dir)
    # schemes without a coordinator: no reports; CG's workers signal
    cg = CoreSettings.from_topology(load_topology({"grouping": {"scheme": "cg"}}))
    assert cg.workers[0].report_every_s is None and cg.source.report_every_s == 1.0
    assert isinstance(cg.workers[0].signals, WorkerSignals)


def test_settings_are_frozen_and_cross_ray() -> None:
    s = CoreSettings.from_topology(load_topology({"grouping": {"scheme": "cg"}}))
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.source.max_inflight = 5  # type: ignore[misc]
    assert SourceSettings(n_workers=2) == SourceSettings(n_workers=2)
    assert WorkerSettings(service_us=1.0).queue_capacity_batches is None
