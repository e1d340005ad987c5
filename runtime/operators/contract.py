"""The operator contract, its checks, and the adapter the runtime calls.

An operator (docs/design.md, "Applications over records") is a class::

    class Op:
        mergeable = True                 # False: only schemes that keep a key on one worker
        columns = ("amount",)            # optional: input columns besides 'key'
        wants_key_hash = False           # optional: True adds a uint64 'key_hash' column
        def __init__(self, **params): ...
        def create(self): ...            # an empty partial state (picklable)
        def add(self, state, batch): ... # pa.RecordBatch: 'key' (string) + columns; returns the state
        def compact(self, state): ...    # optional: before a state leaves the worker (default: identity)
        def merge(self, a, b): ...       # associative and commutative
        def finish(self, state): ...     # -> pa.Table (a RecordBatch is converted)

How the runtime drives it (the engines and the simulator alike): a worker
starts from ``create()``, calls ``add`` per micro-batch (~50-5000 rows), and
every ``app.aggregate_every_s`` sends ``compact(state)`` to the aggregator and
starts again from ``create()``; the aggregator folds every committed flush with
``total = merge(total, partial)``, in any order across workers, and writes
``finish(total)``. So ``finish`` of the merged flushes must not depend on how
the stream was cut into batches, workers and flushes (a key may be split
across workers and flushes); ``tests/test_operators.py`` checks exactly this
for every built-in.

Ownership: a state passed to ``add``, ``compact`` or ``merge`` is never used
again by the runtime (only the returned one is), so these may modify and return
their argument (replay must keep pickled bytes, not live states). ``finish``
must leave its state usable: live streams call it every interval and keep
merging. States cross process boundaries pickled.

``mergeable = False`` declares that ``merge`` is only correct on states over
disjoint key sets. The runtime then refuses key-splitting schemes
(``require_mergeable``) - and, since a worker's successive flushes hold the
same keys, must not reset such a worker at a flush: it sends snapshots of its
whole state and the aggregator merges only each worker's latest one.

``BoundOperator`` is what the runtime holds: it calls the user's methods
directly (one ``try`` per call, nothing else on the hot path) and turns any
exception into a one-line ``OperatorError`` naming the operator and the
method.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

#: methods every operator class must define (callable)
REQUIRED_METHODS = ("create", "add", "merge", "finish")
#: column names the runtime puts in every batch (never requested)
RESERVED_COLUMNS = ("key", "key_hash")
#: longest exception message kept in an ``OperatorError``
MAX_MESSAGE_CHARS = 500


class OperatorError(Exception):
    """An operator could not be loaded, built or run; ``str()`` is one line
    starting with the field (``app.operator: <spec>: ...``)."""


def find_operator_error(exc: BaseException | None) -> OperatorError | None:
    """The ``OperatorError`` in ``exc``'s chain, or None. Ray wraps a remote
    one in a ``RayTaskError`` that is also an ``OperatorError`` but whose text
    holds the remote traceback; the original is its ``.cause`` (once per hop)."""
    seen: set[int] = set()
    wrapped: BaseException | None = None
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc) is OperatorError:
            return exc
        if isinstance(exc, OperatorError):
            wrapped = exc
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__
    if wrapped is None:
        return None
    # no plain one in reach: the wrapper's last line is the original message
    lines = [ln for ln in str(wrapped).splitlines() if "OperatorError: " in ln]
    return OperatorError(lines[-1].split("OperatorError: ", 1)[1] if lines else str(wrapped))


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` on one line: newlines escaped, cut at ``limit`` characters."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(value: Any) -> str:
    """A short, one-line description of a value for error messages."""
    r = one_line(repr(value), 60)
    return f"{type(value).__name__} {r}" if not isinstance(value, type) else r


@dataclass(frozen=True)
class OperatorSpec:
    """What the runtime needs to know about an operator, besides its methods.

    ``name``: the spec string used in messages (``path/topk.py:TopK``,
    ``wordcount``); ``field``: the topology field it came from;
    ``columns``: input columns besides ``key``; ``wants_key_hash``: the batch
    also carries ``key_hash`` (uint64, ``runtime.hashing.hash_arrow(keys)``);
    ``has_compact``: the operator defines ``compact``.
    """

    name: str
    field: str = "app.operator"
    columns: tuple[str, ...] = ()
    mergeable: bool = True
    wants_key_hash: bool = False
    has_compact: bool = False


def _error(field: str, name: str, message: str) -> OperatorError:
    return OperatorError(one_line(f"{field}: {name}: {message}"))


def _check_columns(value: Any, field: str, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise _error(field, name, f"{where} must be a list of column names (got {describe(value)})")
    cols = tuple(value)
    for c in cols:
        if not isinstance(c, str) or not c:
            raise _error(field, name, f"{where} must hold non-empty strings (got {describe(c)})")
        if c in RESERVED_COLUMNS:
            raise _error(field, name, f"{where}: {c!r} is reserved (every batch has 'key'; "
                                      "set wants_key_hash = True for 'key_hash')")
    if len(set(cols)) != len(cols):
        dup = sorted({c for c in cols if cols.count(c) > 1})
        raise _error(field, name, f"{where}: column(s) listed twice: {', '.join(dup)}")
    return cols


def check_operator_class(cls: Any, name: str, field: str = "app.operator") -> type:
    """Check that ``cls`` is an operator class; returns it.

    Raises ``OperatorError`` (one line naming ``name``) if it is not a class,
    lacks one of ``create/add/merge/finish`` (or has a non-callable one, or a
    non-callable ``compact``), or has a ``mergeable``/``wants_key_hash`` that
    is not a bool or ``columns`` that is not a list of names.
    """
    if not isinstance(cls, type):
        kind = "module" if inspect.ismodule(cls) else (
            "function" if inspect.isroutine(cls) else type(cls).__name__)
        raise _error(field, name, f"{getattr(cls, '__name__', repr(cls))!r} is a {kind}, "
                                  "not a class")
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise _error(field, name, f"class {cls.__name__} lacks method(s) {', '.join(missing)} "
                                  f"(an operator defines {', '.join(REQUIRED_METHODS)})")
    if not callable(getattr(cls, "compact", _identity)):
        raise _error(field, name, f"{cls.__name__}.compact must be a method")
    for flag in ("mergeable", "wants_key_hash"):
        value = getattr(cls, flag, False)
        if not isinstance(value, bool) and not isinstance(value, property):
            raise _error(field, name, f"{cls.__name__}.{flag} must be True or False "
                                      f"(got {describe(value)})")
    cols = getattr(cls, "columns", ())
    if not isinstance(cols, property):
        _check_columns(cols, field, name, f"{cls.__name__}.columns")
    return cls


def instantiate(cls: type, params: Mapping[str, Any] | None, name: str,
                field: str = "app.operator") -> Any:
    """``cls(**params)``; a bad or missing parameter (``TypeError``) or an
    exception in the constructor becomes a one-line ``OperatorError``."""
    params = dict(params or {})
    bad = [k for k in params if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise _error(field, name, f"app.params: keys must be identifiers (got {bad[0]!r})")
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as e:
        raise _error(field, name, f"bad app.params {sorted(params)}: {cls.__name__}(): {e}"
                     ) from e
    except ValueError:  # no signature (a builtin-backed class): let the call decide
        pass
    try:
        return cls(**params)
    except Exception as e:
        raise _error(field, name, f"{type(e).__name__} in __init__: {e}") from e


def spec_of(op: Any, name: str | None = None, field: str = "app.operator",
            columns: Iterable[str] | None = None) -> OperatorSpec:
    """The ``OperatorSpec`` of an operator instance (the runtime's only
    introspection: it never ``getattr``-s operators itself).

    ``columns``: the topology's ``app.columns``, if given (it wins over the
    class's ``columns``; the built-ins declare theirs).
    """
    cls = type(op)
    label = name or cls.__name__
    mergeable = getattr(op, "mergeable", True)
    wants = getattr(op, "wants_key_hash", False)
    for flag, value in (("mergeable", mergeable), ("wants_key_hash", wants)):
        if not isinstance(value, bool):
            raise _error(field, label, f"{cls.__name__}.{flag} must be True or False "
                                       f"(got {describe(value)})")
    if columns is None:
        cols = _check_columns(getattr(op, "columns", ()), field, label, f"{cls.__name__}.columns")
    else:
        cols = _check_columns(columns, field, label, "app.columns")
    return OperatorSpec(name=label, field=field, columns=cols, mergeable=mergeable,
                        wants_key_hash=wants, has_compact=callable(getattr(op, "compact", None)))


def require_mergeable(spec: OperatorSpec, scheme: str, splits_keys: bool) -> None:
    """Refuse a non-mergeable operator under a scheme that splits keys."""
    if splits_keys and not spec.mergeable:
        raise _error(spec.field, spec.name,
                     f"not mergeable (mergeable = False) but grouping.scheme {scheme!r} "
                     "splits a key across workers; use a scheme that keeps each key on one "
                     "worker (e.g. kg)")


def _identity(state: Any) -> Any:
    return state


class BoundOperator:
    """An operator instance as the runtime calls it: every user exception
    becomes ``OperatorError("<field>: <name>: <ExcType> in <method>: <msg>")``
    (one line); ``finish`` must give a ``pa.Table`` (a RecordBatch is
    converted); ``add``/``compact``/``merge`` returning ``None`` for a
    non-``None`` state is reported (a forgotten ``return state``).

    Picklable: with ``origin`` (set by ``loading.make_operator``) it pickles as
    "load this spec again with these params", so a class loaded from a file
    reaches another process without its module being importable there.
    """

    __slots__ = ("op", "spec", "origin", "_create", "_add", "_compact", "_merge", "_finish")

    def __init__(self, op: Any, spec: OperatorSpec,
                 origin: tuple[Any, ...] | None = None) -> None:
        self.op = op
        self.spec = spec
        self.origin = origin
        self._create = op.create
        self._add = op.add
        self._compact = op.compact if spec.has_compact else _identity
        self._merge = op.merge
        self._finish = op.finish

    # the per-call path: a direct call inside one try
    def create(self) -> Any:
        try:
            return self._create()
        except Exception as e:
            raise self._failed("create", e) from e

    def add(self, state: Any, batch: pa.RecordBatch) -> Any:
        try:
            out = self._add(state, batch)
        except Exception as e:
            raise self._failed("add", e) from e
        if out is None and state is not None:
            raise self._returned_none("add")
        return out

    def compact(self, state: Any) -> Any:
        try:
            out = self._compact(state)
        except Exception as e:
            raise self._failed("compact", e) from e
        if out is None and state is not None:
            raise self._returned_none("compact")
        return out

    def merge(self, a: Any, b: Any) -> Any:
        try:
            out = self._merge(a, b)
        except Exception as e:
            raise self._failed("merge", e) from e
        if out is None and (a is not None or b is not None):
            raise self._returned_none("merge")
        return out

    def finish(self, state: Any) -> pa.Table:
        try:
            out = self._finish(state)
        except Exception as e:
            raise self._failed("finish", e) from e
        if isinstance(out, pa.Table):
            return out
        if isinstance(out, pa.RecordBatch):
            return pa.Table.from_batches([out])
        raise _error(self.spec.field, self.spec.name,
                     f"finish returned {describe(out)}, expected a pyarrow.Table")

    # errors (cold path)
    def _failed(self, method: str, e: Exception) -> OperatorError:
        if isinstance(e, OperatorError):
            return e
        msg = str(e)
        where = self._user_frame(e) if self.spec.field == "app.operator" else ""
        text = f"{type(e).__name__} in {method}" + (f": {msg}" if msg else "") + where
        return _error(self.spec.field, self.spec.name, text)

    def _returned_none(self, method: str) -> OperatorError:
        return _error(self.spec.field, self.spec.name,
                      f"{method} returned None (forgot to return the state?)")

    def _user_frame(self, e: BaseException) -> str:
        """`` (at file.py:LINE)`` of the innermost frame in the operator's own file."""
        try:
            src = inspect.getsourcefile(type(self.op))
        except TypeError:
            return ""
        if not src:
            return ""
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == src]
        if not frames:
            return ""
        where = frames[-1].filename
        target = self.spec.name.rpartition(":")[0]
        if target.endswith(".py") and os.path.basename(where).startswith("_operator_"):
            where = target  # the user's own file, not the copy shipped to this node
        return f" (at {where}:{frames[-1].lineno})"

    def __reduce__(self) -> tuple[Any, ...]:
        if self.origin is not None:
            from runtime.operators.loading import make_operator

            return (make_operator, self.origin)
        return (BoundOperator, (self.op, self.spec))

    def __repr__(self) -> str:
        return f"BoundOperator({self.spec.name!r}, {self.op!r})"


def bind(op: Any, name: str | None = None, field: str = "app.operator",
         columns: Iterable[str] | None = None) -> BoundOperator:
    """Wrap an operator instance for the runtime (``spec_of`` + ``BoundOperator``)."""
    check_operator_class(type(op), name or type(op).__name__, field)
    return BoundOperator(op, spec_of(op, name, field, columns))


__all__ = [
    "BoundOperator",
    "OperatorError",
    "OperatorSpec",
    "REQUIRED_METHODS",
    "bind",
    "check_operator_class",
    "instantiate",
    "one_line",
    "require_mergeable",
    "spec_of",
]
