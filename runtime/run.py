"""``python -m runtime.run TOPOLOGY.yaml [--out DIR] [--set k.p=v ...] [--address ADDR] [--check]``

Runs a topology on the real engine: Ray actors fed by Spark (RayDP). See
``actors.pipeline`` for the run itself and DESIGN.md for the contracts: exit 0
with a summary table on stdout and the outputs in DIR; bad input -> exit 2 and
one line on stderr; Ctrl-C -> 130. Every throttled worker is resumed and Spark
and Ray are shut down on every exit path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runtime.cli import base_parser, fail, load_or_exit, run_main
from runtime.report import default_out_dir, summary_table
from runtime.topology import Topology, TopologyError

ROOT = Path(__file__).resolve().parent.parent


def check_input_columns(topo: Topology) -> None:
    """Fail (exit 2, one line) before Ray and Spark start if the input file is
    missing, unreadable or empty, or lacks the key (or label) column
    (``runtime.input_check.preflight``)."""
    from runtime.input_check import preflight

    try:
        preflight(topo)
    except TopologyError as e:
        fail(str(e))


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _announce(ctx: Any) -> None:
    """Where to watch: the Ray dashboard, the cluster address, the live view."""
    gcs = (getattr(ctx, "address_info", None) or {}).get("gcs_address", "?")
    url = getattr(ctx, "dashboard_url", None)
    dash = f"dashboard http://{url}, " if url else ""
    print(f"ray: {dash}cluster {gcs} (ray list actors --address {gcs}); "
          f"live view: python -m runtime.top", file=sys.stderr)


@contextlib.contextmanager
def engine_session(app_name: str, address: str | None = None) -> Iterator[Any]:
    """Ray (local, or the cluster at ``address``) and a RayDP Spark session;
    both are shut down on every exit path (SIGTERM included)."""
    import ray

    from actors import spark_input, telemetry

    signal.signal(signal.SIGTERM, _sigterm)
    pythonpath = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    os.environ["PYTHONPATH"] = pythonpath  # workers started by this driver import our code
    # a cluster we start pushes live metrics every second (runtime.top); an
    # existing cluster keeps its own settings
    starts = address is None and not os.environ.get("RAY_ADDRESS")
    system_config = telemetry.ray_system_config() if starts else {}
    try:
        ctx = ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
                       logging_level=logging.WARNING, log_to_driver=False,
                       _system_config=system_config or None)
        _announce(ctx)
        yield spark_input.start_spark(app_name=app_name)
    finally:
        try:
            spark_input.stop_spark()
        finally:
            if ray.is_initialized():
                ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = base_parser("runtime.run", "Run a topology on Ray, fed by Spark (RayDP).")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: start a local cluster)")
    p.add_argument("--check", action="store_true",
                   help="validate the topology and its input, then exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    topo = load_or_exit(args.topology, args.overrides, check_input=True)
    check_input_columns(topo)
    if args.check:
        what = topo.input.path or f"{topo.input.format} ({topo.input.messages:,} messages)"
        print(f"ok: {topo.name}: {topo.sources} source(s) -> {topo.workers.count} workers, "
              f"scheme {topo.grouping.scheme}, app {topo.app.kind}, input {what}")
        return 0
    out = args.out or default_out_dir(topo.name)

    with engine_session(topo.name, args.address) as spark:
        from actors.pipeline import run_pipeline

        report = run_pipeline(topo, out, spark, progress=not args.no_progress)
    print(summary_table(report))
    print(f"\noutputs: {out}")
    return 0


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]))
