"""A long run with failures whose result must equal Spark's groupBy exactly.

    python scripts/soak.py [TOPOLOGY.yaml] [--set key.path=value ...] [--out DIR]
        [--address ADDR]

Default topology: ``scripts/soak.yaml`` (10M messages of an evolving Zipf
stream, capacity changes, a worker SIGKILLed mid-run). Runs it on the real
engine (``actors.engine.RayEngine``), computes Spark's own answer on the
same cached DataFrame, compares row for row, and prints (and writes to
``DIR/soak.json``) the figures docs/reliability.md quotes: messages, failures
survived with their recovery, peak memory per actor, duration. Exit 1 if the
result differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.reporting.report import default_out_dir  # noqa: E402
from runtime.topology import TopologyError, load_topology  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("topology", nargs="?", default=str(ROOT / "scripts" / "soak.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=None)
    ap.add_argument("--address", default=None)
    a = ap.parse_args(argv)
    try:
        topo = load_topology(a.topology, a.overrides, check_input=True)
    except TopologyError as e:
        print(e, file=sys.stderr)
        return 2
    out = Path(a.out or default_out_dir(f"soak-{topo.name}"))
    import pyarrow.parquet as pq

    from actors.engine import RayEngine
    from actors.spark_input import reference_result

    t_all = time.time()
    with RayEngine(topo.name, a.address) as engine, engine.shared_input(topo) as df:
        t = time.time()
        report = engine.run(topo, out, progress=True, data=df)
        run_s = time.time() - t
        t = time.time()
        ref = reference_result(df, topo.app.kind, topo.app.top_k)
        ref_s = time.time() - t
        got = pq.read_table(out / "result.parquet")
        exact = got.num_rows == ref.num_rows and got.equals(ref.cast(got.schema))
    on_disk = json.loads((out / "report.json").read_text())
    summary = {
        "topology": topo.name, "scheme": topo.grouping.scheme,
        "messages": on_disk["messages"], "exact": exact, "result_rows": got.num_rows,
        "duration_s": on_disk["duration_s"], "run_wall_s": run_s,
        "reference_s": ref_s, "total_wall_s": time.time() - t_all,
        "throughput_msgs_per_s": on_disk["throughput_msgs_per_s"],
        "failures": on_disk.get("failures", []),
        "failures_survived": sum(1 for f in on_disk.get("failures", [])
                                 if f.get("recovered_s") is not None),
        "peak_rss_mb": on_disk.get("peak_rss_mb", {}),
        "capacity_changes": on_disk.get("capacity_changes", []),
        "retained_peak_messages": [s.get("retained_peak_messages")
                                   for s in on_disk.get("sources", [])],
        "migrations": report.get("migrations"),
        "out": str(out),
    }
    (out / "soak.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print("EXACT: result equals Spark's groupBy" if exact else "MISMATCH with Spark's groupBy")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
