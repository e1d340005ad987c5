"""What a user's operator prints: into the run's ``OUT/operators.log``.

Ray starts its actors with ``log_to_driver=False`` (the console has our own
lines only), so a ``print`` inside an operator would end up in Ray's session
logs, where nobody looks. The workers and the aggregator - the processes that
run the operator - call ``capture(path, name)`` when the run starts (again
in a process reused by the next run, which closes the last run's file): their
``sys.stdout`` and ``sys.stderr`` then append to ``path``, one line at a time,
each line prefixed with the actor's name (``[worker-3] ...``). On a cluster
whose nodes do not share the output directory, an actor whose node lacks it
keeps Ray's own log (``capture`` returns ``False``).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TextIO

#: the file in the run's directory
OPERATOR_LOG = "operators.log"


class _Prefixed:
    """A text stream that appends whole lines, each prefixed, to one file
    (``O_APPEND``: lines of several processes never mix)."""

    def __init__(self, fd: int, prefix: str) -> None:
        self.fd, self.prefix = fd, prefix
        self.pending = ""
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
            if "\n" in self.pending:
                *lines, self.pending = self.pending.split("\n")
                os.write(self.fd, "".join(f"{self.prefix}{ln}\n" for ln in lines).encode())
        return len(text)

    def flush(self) -> None:
        with self.lock:
            if self.pending:
                os.write(self.fd, f"{self.prefix}{self.pending}\n".encode())
                self.pending = ""

    def isatty(self) -> bool:
        return False


def capture(path: str, name: str) -> bool:
    """Send this process's ``print``s to ``path`` (``[name] ``-prefixed
    lines); ``False`` if its directory is not on this node."""
    target = Path(path)
    if not target.parent.is_dir():
        return False
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    stream: TextIO = _Prefixed(fd, f"[{name}] ")  # type: ignore[assignment]
    old = sys.stdout
    sys.stdout = sys.stderr = stream
    if isinstance(old, _Prefixed):  # a reused process (actors.pool): the last run's file
        old.flush()
        os.close(old.fd)
    return True
