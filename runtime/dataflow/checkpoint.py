"""A live stream's checkpoint: the aggregator's state and the stream position,
written together, atomically, in the output directory (docs/reliability.md).

``OUT/.checkpoint/`` holds:

- ``state.pkl``: a ``Checkpoint`` - the last Spark micro-batch whose every
  message is in the aggregator's committed state, that state, and how many
  messages it holds. Written to a temporary file, fsynced, then renamed over the
  previous one: a reader (a ``--resume``) sees the previous checkpoint or the
  new one, never a mix.
- ``wal/``: every micro-batch handed over since that checkpoint, as Arrow
  (written before Spark may commit the batch; dropped once a checkpoint holds
  it). A resume hands these over again first.
- ``spark/``: Spark's own checkpoint location (which files each micro-batch
  took). Spark re-runs a micro-batch it planned but did not commit, with the
  same files and batch id; one already checkpointed or logged is skipped, a
  later one is processed: no message lost, none counted twice.
- ``processes.json``: the Ray and Spark processes of the run that writes it,
  so that a ``--resume`` after the driver was killed stops what is left of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from pathlib import Path
from typing import Any

CHECKPOINT_DIR = ".checkpoint"
STATE_FILE = "state.pkl"
PROCESSES_FILE = "processes.json"
#: what a checkpoint file says it is (a file of another format is refused).
#: 2: sliding windows are kept as panes (``runtime.operators.windows``), so a
#: windowed state of format 1 would be read wrongly
FORMAT = "hetero-stream checkpoint 2"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    batch_id: int  # the last Spark micro-batch in ``state`` (-1: none)
    messages: int  # messages in ``state``, over every run of the stream
    state: Any  # the aggregator's (``AggregatorCore.snapshot``)
    app: dict[str, Any]  # the app it belongs to (a resume with another app is refused)
    #: a windowed stream's event time at ``batch_id`` (``runtime.dataflow.event_time``)
    event_time: dict[str, Any] | None = None


def checkpoint_dir(out_dir: str | os.PathLike[str]) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(out_dir: str | os.PathLike[str], ckpt: Checkpoint) -> int:
    """Write ``ckpt`` atomically and durably; returns its size in bytes."""
    d = checkpoint_dir(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{STATE_FILE}.tmp"
    data = pickle.dumps({"format": FORMAT, **dataclasses.asdict(ckpt)},
                        protocol=pickle.HIGHEST_PROTOCOL)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / STATE_FILE)
        _fsync_dir(d)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(data)


#: what a checkpoint's state may be built from, besides plain data (dicts, lists,
#: numbers, strings, bytes): Arrow's and numpy's reconstructors...
_ALLOWED = {
    "pyarrow.lib": {"_reconstruct_table", "_reconstruct_record_batch", "_restore_array",
                    "chunked_array", "field", "schema", "type_for_alias", "py_buffer",
                    "timestamp", "duration", "date32", "date64", "time32", "time64", "list_",
                    "large_list", "struct", "dictionary", "decimal128", "decimal256", "map_",
                    "binary", "large_binary", "string", "large_string", "null", "bool_"},
    "numpy": {"dtype", "ndarray"},
    "numpy._core.numeric": {"_frombuffer"}, "numpy.core.numeric": {"_frombuffer"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "builtins": {"set", "frozenset", "bytearray", "complex", "slice"},
    "collections": {"OrderedDict", "defaultdict", "Counter", "deque"},
}
#: ... and the classes of these modules (the built-in operators' states)
_ALLOWED_MODULES = ("runtime.operators.",)


class _Refused(pickle.UnpicklingError):
    pass


class _StateUnpickler(pickle.Unpickler):
    """Unpickles only what a state is made of (``_ALLOWED``, classes of the
    built-in operators' modules and of the user's operator ``modules``):
    a file that names anything else (``os.system``) is refused before any
    of it runs."""

    def __init__(self, file: Any, modules: tuple[str, ...]) -> None:
        super().__init__(file)
        self.modules = modules

    def find_class(self, module: str, name: str) -> Any:
        ok = name in _ALLOWED.get(module, ())
        if not ok and (module.startswith(_ALLOWED_MODULES) or module in self.modules):
            ok = isinstance(getattr(__import__(module, fromlist=[name]), name, None), type)
        if not ok:
            raise _Refused(f"refuses {module}.{name}")
        return super().find_class(module, name)


def load(out_dir: str | os.PathLike[str], modules: tuple[str, ...] = ()) -> Checkpoint | None:
    """The checkpoint in ``out_dir`` (``None`` if there is none); ``ValueError``
    (one line) for a file that is not one, or that would build anything but
    a state (``_StateUnpickler``; ``modules``: the user's operator's modules,
    whose classes a state may hold)."""
    import io

    path = checkpoint_dir(out_dir) / STATE_FILE
    if not path.exists():
        return None
    try:
        raw = _StateUnpickler(io.BytesIO(path.read_bytes()), modules).load()
    except _Refused as e:
        raise ValueError(f"{path}: not a checkpoint of this runtime ({e})") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same error
        raise ValueError(f"{path}: not a readable checkpoint ({e.__class__.__name__})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not a checkpoint of this version")
    return Checkpoint(int(raw["batch_id"]), int(raw["messages"]), raw["state"], raw["app"],
                      raw.get("event_time"))


def exists(out_dir: str | os.PathLike[str]) -> bool:
    return checkpoint_dir(out_dir).exists()


# --------------------------------------------------------------------------- write-ahead log

WAL_DIR = "wal"


def _wal_path(out_dir: str | os.PathLike[str], batch_id: int) -> Path:
    return checkpoint_dir(out_dir) / WAL_DIR / f"{int(batch_id):012d}.arrow"


def log_batch(out_dir: str | os.PathLike[str], batch_id: int, table: Any) -> int:
    """Keep micro-batch ``batch_id`` (Arrow) until a checkpoint holds it; bytes."""
    import pyarrow as pa

    path = _wal_path(out_dir, batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    os.replace(tmp, path)
    return path.stat().st_size


def logged_batches(out_dir: str | os.PathLike[str], after: int) -> list[tuple[int, Any]]:
    """The logged micro-batches with an id above ``after``, in order, as tables."""
    import pyarrow as pa

    d = checkpoint_dir(out_dir) / WAL_DIR
    if not d.exists():
        return []
    out = []
    for f in sorted(d.glob("*.arrow")):
        batch_id = int(f.stem)
        if batch_id > after:
            with pa.memory_map(str(f)) as src:
                out.append((batch_id, pa.ipc.open_file(src).read_all()))
    return out


def forget_batches(out_dir: str | os.PathLike[str], upto: int) -> None:
    """Drop the logged micro-batches a checkpoint now holds (ids <= ``upto``)."""
    d = checkpoint_dir(out_dir) / WAL_DIR
    if d.exists():
        for f in d.glob("*.arrow"):
            if int(f.stem) <= upto:
                f.unlink(missing_ok=True)


# --------------------------------------------------------------------------- processes


def record_processes(out_dir: str | os.PathLike[str]) -> None:
    """Remember this process (the driver) and every process below it (Ray's,
    Spark's), each as ``(pid, start time)``."""
    import psutil

    me = psutil.Process()
    children = []
    for c in me.children(recursive=True):
        try:
            children.append([c.pid, c.create_time(), c.cmdline()])
        except psutil.Error:
            continue
    d = checkpoint_dir(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{PROCESSES_FILE}.tmp"
    tmp.write_text(json.dumps({"driver": [me.pid, me.create_time(), me.cmdline()],
                               "children": children}))
    os.replace(tmp, d / PROCESSES_FILE)


def discard_unstarted(out_dir: str | os.PathLike[str]) -> None:
    """Forget what a run that died before its first checkpoint left in
    ``out_dir``'s checkpoint directory: its process list and empty folders.
    ``ValueError`` if anything else is there (then it is not such a run)."""
    d = checkpoint_dir(out_dir)
    if not d.exists():
        return
    (d / PROCESSES_FILE).unlink(missing_ok=True)
    for sub in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    left = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    if left:
        raise ValueError(f"{d} holds {', '.join(left[:3])} but no checkpoint: not a stream "
                         f"that died before its first checkpoint; choose another --out")
    d.rmdir()


def _alive(pid: int, created: float, cmdline: list[str] | None = None) -> Any:
    """The process if it is still the one recorded: same start time, same
    command line, run by this user (a reused pid, or a line someone wrote into
    the file, is not)."""
    import psutil

    try:
        p = psutil.Process(int(pid))
        if abs(p.create_time() - float(created)) >= 0.01 or p.uids().real != os.getuid():
            return None
        if cmdline is not None and p.cmdline() != list(cmdline):
            return None
        return p
    except (psutil.Error, TypeError, ValueError):
        return None


def recorded_driver(out_dir: str | os.PathLike[str]) -> int | None:
    """The pid of the driver that wrote the checkpoint, if it is still running."""
    path = checkpoint_dir(out_dir) / PROCESSES_FILE
    if not path.exists():
        return None
    p = _alive(*json.loads(path.read_text())["driver"])
    return None if p is None else int(p.pid)


def stop_leftovers(out_dir: str | os.PathLike[str], timeout_s: float = 10.0) -> int:
    """SIGKILL what is left of a dead run's processes; how many there were."""
    import psutil

    path = checkpoint_dir(out_dir) / PROCESSES_FILE
    if not path.exists():
        return 0
    procs = [p for p in (_alive(*c) for c in json.loads(path.read_text())["children"])
             if p is not None]
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)
    return len(procs)
