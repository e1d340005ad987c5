"""Shared command-line plumbing: arguments, topology loading, exit code 2.

Bad input (topology, overrides, input file) ends with one line on stderr
naming the field and the value, exit code 2, and no traceback.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from runtime.topology import Topology, TopologyError, load_topology, unknown_scheme

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    """argparse that ends a bad command line with one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {TopologyError(message)}\n")  # one short line


#: every tool checks a topology before it runs, ``runtime.run --check`` included
CHECK_RUNS_OPERATORS = (
    "Checking a topology (also with --check) imports the module of app.operator "
    "(app.kind: operator) and constructs the operator with app.params: its code "
    "runs on this machine, so check only topologies whose operator you trust.")


def base_parser(prog: str, description: str,
                out_default: str = "runs/<name>-<UTC timestamp>/") -> argparse.ArgumentParser:
    """The arguments every tool takes; ``out_default``: what ``--help`` says
    ``--out`` defaults to (the tool's own ``default_out_dir`` call)."""
    p = Parser(prog=prog, description=description, epilog=CHECK_RUNS_OPERATORS)
    p.add_argument("topology", help="topology YAML file")
    p.add_argument("--out", type=out_dir, default=None,
                   help=f"output directory (default {out_default})")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY.PATH=VALUE", help="override a topology field (repeatable)")
    return p


def out_dir(text: str) -> Path:
    """``--out``: a directory we can create or write into, checked before the run
    (a file in the way would otherwise fail only when the outputs are written)."""
    p = Path(text)
    shown = repr(text if len(text) <= 80 else f"{text[:38]}...{text[-38:]}")
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    try:
        exists = p.exists()
    except (OSError, ValueError) as e:  # ENAMETOOLONG, a NUL
        raise argparse.ArgumentTypeError(
            f"not a possible path ({getattr(e, 'strerror', None) or type(e).__name__}; "
            f"got {shown})") from None
    if exists and not p.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory (got {shown})")
    parent = p.parent if not exists else p
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{str(parent)!r} is not a directory (got {shown})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{str(parent)!r} is not writable (got {shown})")
    return p


#: the ``--out`` directories this process claimed -> their open, locked
#: descriptors: held until it ends
_CLAIMED: dict[Path, int] = {}


def claim_out_dir(out: str | os.PathLike[str]) -> None:
    """``out`` is this run's alone: an exclusive lock (``flock``) on the
    directory, held until this process ends - the system lets go of it however
    the process ends, SIGKILL included. A second run on the same ``--out`` (two
    ``--resume``s of one stream, say) exits 2 with one line. A directory this
    call created is removed again at exit if nothing was written into it."""
    import atexit
    import fcntl

    path = Path(out)
    if path.resolve() in _CLAIMED:
        return
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        fail(f"--out: cannot use {str(path)!r} ({e.strerror or type(e).__name__})")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        fail(f"--out: {str(path)!r} is in use by another run; wait for it to end or choose "
             f"another --out")
    _CLAIMED[path.resolve()] = fd
    if created:
        atexit.register(_remove_if_empty, path)


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()  # only if empty: nothing was written
    except OSError:
        pass


def load_or_exit(path: str, overrides: Sequence[str], *, check_input: bool = True) -> Topology:
    """The topology, or exit 2 with one line; with ``check_input``, its input
    exists and its app can run (the operator loads: ``check_app``)."""
    try:
        topo = load_topology(path, list(overrides), check_input=check_input)
        if check_input:
            from runtime.inputs.input_check import check_app

            check_app(topo)
        return topo
    except TopologyError as e:
        fail(str(e))


def fail(message: str) -> NoReturn:
    print(f"error: {TopologyError(message)}", file=sys.stderr)  # one line, escaped
    raise SystemExit(EXIT_BAD_INPUT)


def parse_schemes(text: str, option: str = "--schemes") -> list[str]:
    """``"kg,pkg"`` -> ``["kg", "pkg"]``: registered schemes, each once; else
    exit 2 with one line naming ``option``."""
    from runtime.grouping import SCHEMES

    schemes = [s.strip() for s in text.split(",") if s.strip()]
    if not schemes:
        fail(f"{option}: empty list")
    for s in schemes:
        if s not in SCHEMES:
            fail(f"{option}: {unknown_scheme(s)}")
    if len(set(schemes)) != len(schemes):
        fail(f"{option}: a scheme is listed twice ({text!r})")
    return schemes


#: exit codes (README, "Exit codes"): 0 done, 2 bad input, 130 interrupted, and
#: the user's operator failed during a run
EXIT_OPERATOR = 1
#: ``--verify``: the result differs from Spark's answer
EXIT_MISMATCH = 3
#: anything else went wrong: a bug, or the engine (Ray, Spark) failed
EXIT_INTERNAL = 70


def run_main(main: Callable[[], int | None]) -> None:
    """Run a CLI main: TopologyError -> exit 2 with one line; an exception in
    the user's operator mid-run -> exit 1 with one line naming it (the run
    wrote nothing); Ctrl-C -> 130; any other exception -> its traceback, then
    one line, exit 70."""
    from runtime.operators import find_operator_error

    try:
        code = main()
    except TopologyError as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except Exception as e:
        op_error = find_operator_error(e)
        if op_error is None:
            import traceback

            traceback.print_exc()
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            print(f"error: internal error: {type(e).__name__}{': ' + first if first else ''} "
                  f"(exit {EXIT_INTERNAL}; the traceback is above)", file=sys.stderr)
            code = EXIT_INTERNAL
        else:
            print(f"error: {op_error}", file=sys.stderr)
            code = EXIT_OPERATOR
    raise SystemExit(code or 0)


def check_address(address: str | None) -> None:
    """``--address HOST:PORT`` must answer (a TCP connect within 5 s): Ray
    itself retries an unreachable head for minutes."""
    if address is None or address == "auto":
        return
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"--address: expected HOST:PORT of the Ray head, or auto (got {address!r})")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        fail(f"--address: no Ray cluster answers at {address!r} "
             f"({e.strerror or type(e).__name__})")
