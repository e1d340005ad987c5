"""Shared fixtures.

``ray_spark``: ONE real Ray cluster + RayDP Spark session for the whole test
session (``raydp.init_spark`` costs ~10 s, so every e2e test shares it).
Started lazily by the first test that asks for it; torn down at the end.
"""

from __future__ import annotations

import os

import pytest

#: logical CPUs for the test cluster: the Spark executor takes 1, the rest
#: (fractional) source/worker/aggregator actors; the machine has 2 cores
RAY_TEST_CPUS = int(os.environ.get("RAY_TEST_CPUS", "4"))


@pytest.fixture(scope="session")
def ray_spark():
    """``(SparkSession)`` on a fresh local Ray cluster; both stopped at the end."""
    import ray

    from actors.spark_input import start_spark, stop_spark
    from actors.telemetry import ray_system_config

    if ray.is_initialized():  # a previous fixture/test left one: start clean
        ray.shutdown()
    ray.init(
        num_cpus=RAY_TEST_CPUS,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        configure_logging=True,
        _system_config=ray_system_config() or None,  # live metrics pushed every second
    )
    try:
        spark = start_spark()
        yield spark
    finally:
        stop_spark()
        ray.shutdown()
