"""A real multi-node Ray cluster on this machine: one raylet per node, on loopback.

    python scripts/local_cluster.py start  [--port 6390] [--node NAME:cpus=N,RES=K ...]
    python scripts/local_cluster.py status [--port 6390]
    python scripts/local_cluster.py kill-node NAME [--port 6390]   # a node failure
    python scripts/local_cluster.py stop   [--port 6390]

``start`` runs ``ray start --head`` and one ``ray start --address`` per extra
node, each node with its own ``--num-cpus``, ``--resources`` and temp dir
(``/tmp/hs-ray-<port>/<name>``), then waits until every node is alive in the
GCS and prints the address to give ``runtime.run --address``. Default nodes
(the shape ``topologies/cluster-hetero.yaml`` expects)::

    head:cpus=1                 Spark's executor, driver-side actors
    fast:cpus=2,fast=100        worker-0..3
    slow:cpus=1,slow=100        worker-4, worker-5

The machine is shared: nothing here touches other Ray clusters. Every port is
explicit and away from Ray's defaults (GCS ``--port``, default 6390; node
ports from ``--port-base``, default ``20000 + 1200 * (port % 10)``: per node
10 fixed ports and a range of 100 worker ports), the dashboard is off unless
``--dashboard``, and ``stop`` never runs ``ray stop`` (which would kill every
Ray process of the machine): it signals only the processes whose command
line names one of *this* cluster's temp dirs (raylet, GCS, agents, Python and
Java workers), SIGTERM then SIGKILL after ``--grace`` seconds, by PID.
``kill-node`` SIGKILLs one node's raylet (its workers die with it), as a
machine failure would.

State (address, nodes, node ids) is kept in ``/tmp/hs-ray-<port>/cluster.json``;
logs stay under the node temp dirs until the next ``start`` on that port
(``stop --clean`` removes them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PORT = 6390
DEFAULT_NODES = ("head:cpus=1", "fast:cpus=2,fast=100", "slow:cpus=1,slow=100")
HOST = "127.0.0.1"
#: bytes of object store per node (the machine's default would be 30% of RAM each)
OBJECT_STORE_BYTES = 400 * 1024**2
#: bytes of "memory" resource per node (each raylet would report the whole machine)
MEMORY_BYTES = 4 * 1024**3


@dataclass
class NodeSpec:
    name: str
    cpus: int
    resources: dict[str, float] = field(default_factory=dict)
    temp_dir: str = ""
    node_manager_port: int = 0
    node_id: str | None = None


def parse_node(text: str) -> NodeSpec:
    """``NAME:cpus=N,RES=K,...`` -> NodeSpec (``cpus`` defaults to 1)."""
    name, _, rest = text.partition(":")
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--node: bad node name in {text!r} (letters, digits, - and _)")
    cpus, res = 1, {}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        try:
            val = float(v)
        except ValueError:
            val = -1.0
        if not eq or val < 0:
            raise ValueError(f"--node {name}: expected KEY=NUMBER (got {item!r})")
        if k == "cpus":
            if not val.is_integer():
                raise ValueError(f"--node {name}: cpus must be a whole number (got {v})")
            cpus = int(val)
        else:
            res[k] = val
    return NodeSpec(name, cpus, res)


def port_base_for(port: int) -> int:
    return 20000 + 1200 * (port % 10)


def root_for(port: int) -> Path:
    return Path(f"/tmp/hs-ray-{port}")


def node_command(node: NodeSpec, index: int, *, port: int, port_base: int,
                 dashboard: bool = False) -> list[str]:
    """The ``ray start`` command line of node ``index`` (0 = head)."""
    base = port_base + 10 * index
    ray_cli = str(Path(sys.executable).with_name("ray"))
    cmd = [ray_cli, "start", "--node-ip-address", HOST, "--temp-dir", node.temp_dir,
           "--num-cpus", str(node.cpus), "--object-store-memory", str(OBJECT_STORE_BYTES),
           "--memory", str(MEMORY_BYTES), "--disable-usage-stats",
           "--node-manager-port", str(base), "--object-manager-port", str(base + 1),
           "--metrics-export-port", str(base + 2),
           "--dashboard-agent-listen-port", str(base + 3),
           "--dashboard-agent-grpc-port", str(base + 4),
           "--runtime-env-agent-port", str(base + 5),
           "--min-worker-port", str(port_base + 100 + 100 * index),
           "--max-worker-port", str(port_base + 199 + 100 * index)]
    if node.resources:
        cmd += ["--resources", json.dumps(node.resources)]
    if index == 0:
        cmd += ["--head", "--port", str(port), "--ray-client-server-port", str(port_base + 9),
                "--include-dashboard", "true" if dashboard else "false",
                # live metrics every second (runtime.top), as for clusters runtime.run starts
                "--system-config", json.dumps({"metrics_report_interval_ms": 1000})]
        if dashboard:
            cmd += ["--dashboard-host", HOST, "--dashboard-port", str(port_base + 8)]
    else:
        cmd += ["--address", f"{HOST}:{port}"]
    return cmd


def ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "disabled"  # local cluster, loopback only (docs/monitoring.md)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # a raylet gives up (crashes) when its agents do not report within this time;
    # on a loaded 2-core box their Python start-up alone took 13 s (default: 10 s)
    env.setdefault("RAY_agent_register_timeout_ms", "120000")
    # workers, Spark's executors and their Python workers import our packages
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH")) if x)
    env.pop("RAY_ADDRESS", None)
    return env


# --------------------------------------------------------------------------- processes


def pids_naming(marker: str) -> list[int]:
    """PIDs of our user's processes whose command line contains ``marker``, or
    that hold a file open whose path does: a Ray worker's command line is its
    task's name (``ray::WorkerActor.process``), but its output goes to its
    node's log directory. One whose raylet was killed while the throttler had
    it SIGSTOPped never notices and stays, stopped, until it is killed."""
    me, uid = os.getpid(), os.getuid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if d.stat().st_uid != uid:
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd or _holds_file_under(d, marker):
            out.append(int(d.name))
    return sorted(out)


def _holds_file_under(proc: Path, marker: str) -> bool:
    try:
        for fd in (proc / "fd").iterdir():
            with contextlib.suppress(OSError):
                if marker in os.readlink(fd):
                    return True
    except OSError:
        pass
    return False


def _exe(pid: int) -> str:
    try:
        exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return ""
    return os.path.basename(exe.decode(errors="replace"))


def raylet_pids(temp_dir: str) -> list[int]:
    return [p for p in pids_naming(temp_dir.rstrip("/") + "/") if _exe(p) == "raylet"]


def _names(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
            out.append(f"{pid}:{' '.join(os.path.basename(x.decode()) for x in exe)}")
        except OSError:
            out.append(str(pid))
    return ", ".join(out)


def terminate(pids: list[int], grace_s: float, say: Any = None) -> list[int]:
    """SIGTERM ``pids``, SIGKILL what is left after ``grace_s``; returns the PIDs
    that survived even SIGKILL (none, normally). SIGCONT first: a stopped
    process (throttled) acts on SIGTERM only once it runs again."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if sig == signal.SIGKILL and say is not None:
            say(f"  still running {grace_s:.0f} s after SIGTERM, SIGKILL: {_names(pids)}")
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.time() + (grace_s if sig == signal.SIGTERM else 5.0)
        while alive and time.time() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if _exists(p)]
        if not alive:
            return []
        pids = alive
    return pids


def _exists(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# --------------------------------------------------------------------------- GCS


def gcs_nodes(address: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """``ray.nodes()`` of the cluster at ``address``, from a short-lived subprocess
    (this process never becomes a Ray driver)."""
    code = ("import json, logging, ray\n"
            f"ray.init(address={address!r}, logging_level=logging.ERROR, log_to_driver=False)\n"
            "print(json.dumps([{k: n.get(k) for k in ('NodeID', 'Alive', 'NodeManagerPort', "
            "'Resources')} for n in ray.nodes()]))\n"
            "ray.shutdown()\n")
    p = subprocess.run([sys.executable, "-c", code], env=ray_env(), capture_output=True,
                       text=True, timeout=timeout_s + 30)
    if p.returncode != 0:
        raise RuntimeError(f"cannot reach the cluster at {address}: "
                           f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- commands


def state_path(port: int) -> Path:
    return root_for(port) / "cluster.json"


def load_state(port: int) -> dict[str, Any] | None:
    p = state_path(port)
    return json.loads(p.read_text()) if p.exists() else None


def start(port: int, specs: list[NodeSpec], *, port_base: int | None = None,
          dashboard: bool = False, timeout_s: float = 90.0,
          say: Any = print) -> dict[str, Any]:
    root = root_for(port)
    state = load_state(port)
    if state and any(raylet_pids(n["temp_dir"]) for n in state["nodes"]):
        raise SystemExit(f"a cluster is already running on port {port} "
                         f"(python scripts/local_cluster.py stop --port {port})")
    leftovers = pids_naming(str(root) + "/")
    if leftovers:
        raise SystemExit(f"processes of an earlier cluster on port {port} are still "
                         f"running ({leftovers[:5]}...): run stop first")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    pb = port_base_for(port) if port_base is None else port_base
    for i, node in enumerate(specs):
        node.temp_dir = str(root / node.name)
        node.node_manager_port = pb + 10 * i
    address = f"{HOST}:{port}"
    state = {"address": address, "port": port, "port_base": pb, "root": str(root),
             "dashboard": f"http://{HOST}:{pb + 8}" if dashboard else None,
             "nodes": [asdict(n) for n in specs], "started": time.time()}
    state_path(port).write_text(json.dumps(state, indent=1))
    env = ray_env()
    t0 = time.time()
    try:
        head = subprocess.run(node_command(specs[0], 0, port=port, port_base=pb,
                                           dashboard=dashboard),
                              env=env, capture_output=True, text=True, timeout=timeout_s)
        if head.returncode != 0:
            raise RuntimeError(f"head node failed to start: {_tail(head.stderr + head.stdout)} "
                               f"(logs: {specs[0].temp_dir}/session_latest/logs)")
        for i, n in enumerate(specs[1:], start=1):  # one at a time: gentler on a busy box
            p = subprocess.run(node_command(n, i, port=port, port_base=pb), env=env,
                               capture_output=True, text=True,
                               timeout=max(10.0, t0 + timeout_s - time.time()))
            if p.returncode != 0:
                raise RuntimeError(f"node {n.name} failed to start: {_tail(p.stderr + p.stdout)} "
                                   f"(logs: {n.temp_dir}/session_latest/logs)")
        deadline = t0 + timeout_s
        while True:
            alive = [n for n in gcs_nodes(address) if n["Alive"]]
            by_port = {int(n["NodeManagerPort"]): n["NodeID"] for n in alive}
            if all(s.node_manager_port in by_port for s in specs):
                break
            if time.time() > deadline:
                raise RuntimeError(f"only {len(alive)} of {len(specs)} nodes alive after "
                                   f"{timeout_s:.0f} s")
            time.sleep(0.5)
    except subprocess.TimeoutExpired as e:
        stop(port, grace_s=3.0, say=lambda m: None)
        raise RuntimeError(f"{' '.join(e.cmd[1:3])} timed out after {e.timeout:.0f} s (load "
                           f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); "
                           f"nothing left running") from None
    except BaseException:
        stop(port, grace_s=3.0, say=lambda m: None)
        raise
    for s in specs:
        s.node_id = by_port[s.node_manager_port]
    state["nodes"] = [asdict(n) for n in specs]
    state_path(port).write_text(json.dumps(state, indent=1))
    say(f"cluster up in {time.time() - t0:.1f} s: {len(specs)} nodes at {address}")
    for s in specs:
        say(f"  {s.name:<6} cpus={s.cpus} resources={json.dumps(s.resources)} "
            f"node_id={s.node_id}")
    say(f"run:  RAY_AUTH_MODE=disabled python -m runtime.run TOPOLOGY.yaml --address {address}")
    say(f"  or: export RAY_ADDRESS={address}, then --address auto (plain auto could find "
        f"another cluster of this machine)")
    if dashboard:
        say(f"dashboard: {state['dashboard']}")
    return state


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"


def stop(port: int, *, grace_s: float = 10.0, clean: bool = False, say: Any = print) -> int:
    """Stop this cluster's processes (worker nodes first, the head last)."""
    root = root_for(port)
    state = load_state(port)
    node_dirs = [n["temp_dir"] for n in state["nodes"]] if state else []
    stopped = 0
    gcs: list[int] = []
    for d in reversed(node_dirs):
        pids = pids_naming(d.rstrip("/") + "/")
        # the GCS last: raylets unregister through it (with the GCS gone first, the
        # head's raylet hangs reconnecting until SIGKILL)
        gcs += [p for p in pids if _exe(p) == "gcs_server"]
        pids = [p for p in pids if p not in gcs]
        left = terminate(pids, grace_s, say)
        stopped += len(pids)
        if left:
            say(f"warning: could not stop {left} ({d})")
    if gcs:  # on SIGTERM it may sit flushing events for a long while: 3 s is plenty
        terminate(gcs, min(grace_s, 3.0))
        stopped += len(gcs)
    rest = pids_naming(str(root) + "/")  # anything else that names our temp root
    if rest:
        terminate(rest, grace_s, say)
        stopped += len(rest)
    if state_path(port).exists():
        state_path(port).unlink()
    if clean and root.exists():
        shutil.rmtree(root, ignore_errors=True)
    say(f"stopped {stopped} process(es) of the cluster on port {port}")
    return stopped


def status(port: int, say: Any = print) -> int:
    state = load_state(port)
    if not state:
        say(f"no cluster on port {port} (no {state_path(port)})")
        return 1
    try:
        gcs = {n["NodeID"]: n for n in gcs_nodes(state["address"])}
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        gcs = {}
        say(f"GCS: {e}")
    say(f"cluster at {state['address']} (temp dirs under {state['root']})")
    ok = True
    for n in state["nodes"]:
        g = gcs.get(n["node_id"] or "", {})
        alive = bool(g.get("Alive"))
        ok &= alive
        say(f"  {n['name']:<6} {'ALIVE' if alive else 'DEAD '} node_id={n['node_id']} "
            f"cpus={n['cpus']} resources={json.dumps(n['resources'])} "
            f"raylet={raylet_pids(n['temp_dir'])} processes={len(pids_naming(n['temp_dir'] + '/'))}")
    return 0 if ok else 1


def kill_node(port: int, name: str, say: Any = print) -> list[int]:
    """SIGKILL one node's raylet (a machine failure); ``stop`` cleans the rest."""
    state = load_state(port)
    nodes = {n["name"]: n for n in (state or {}).get("nodes", [])}
    if name not in nodes:
        raise SystemExit(f"no node {name!r} in the cluster on port {port} "
                         f"(nodes: {', '.join(nodes) or 'none'})")
    if name == state["nodes"][0]["name"]:  # type: ignore[index]
        raise SystemExit("kill-node: that is the head node (the whole cluster would go)")
    pids = raylet_pids(nodes[name]["temp_dir"])
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    say(f"killed raylet {pids} of node {name} ({nodes[name]['node_id']})")
    return pids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["start", "stop", "status", "kill-node"])
    ap.add_argument("name", nargs="?", help="kill-node: the node's name")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="GCS port of the head")
    ap.add_argument("--port-base", type=int, default=None,
                    help="first of the nodes' ports (default 20000 + 1200 * (port %% 10))")
    ap.add_argument("--node", action="append", default=None, metavar="NAME:cpus=N,RES=K",
                    help=f"a node; the first is the head (default: {' '.join(DEFAULT_NODES)})")
    ap.add_argument("--dashboard", action="store_true", help="start the Ray dashboard")
    ap.add_argument("--timeout", type=float, default=90.0, help="start: seconds to wait")
    ap.add_argument("--grace", type=float, default=10.0, help="stop: seconds before SIGKILL")
    ap.add_argument("--clean", action="store_true", help="stop: remove the temp dirs (logs)")
    args = ap.parse_args(argv)
    if args.command == "start":
        try:
            specs = [parse_node(t) for t in (args.node or DEFAULT_NODES)]
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            print(f"error: --node: duplicate node names {names}", file=sys.stderr)
            return 2
        try:
            start(args.port, specs, port_base=args.port_base, dashboard=args.dashboard,
                  timeout_s=args.timeout)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    if args.command == "stop":
        stop(args.port, grace_s=args.grace, clean=args.clean)
        return 0
    if args.command == "status":
        return status(args.port)
    if not args.name:
        print("error: kill-node needs a node name", file=sys.stderr)
        return 2
    kill_node(args.port, args.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
