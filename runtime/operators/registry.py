"""The built-in operators by ``app.kind``, and the one entry point from an
``app:`` section to a ``BoundOperator``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.operators.aggregate import Aggregate
from runtime.operators.contract import BoundOperator, spec_of
from runtime.operators.counting import NaiveBayes, WordCount
from runtime.operators.heavy_hitters import HeavyHitters
from runtime.operators.loading import make_operator
from runtime.topology import APPS

#: ``app.kind`` -> built-in operator class
BUILTINS: dict[str, type] = {
    "wordcount": WordCount,
    "naive-bayes": NaiveBayes,
    "heavy-hitters": HeavyHitters,
    "aggregate": Aggregate,
}
#: every ``app.kind`` (listed once, in the topology schema): the built-ins and "operator"
KINDS = APPS
#: the ``app`` fields each kind takes (others in the section are ignored)
PARAMS: dict[str, tuple[str, ...]] = {
    "wordcount": (),
    "naive-bayes": ("label",),
    "heavy-hitters": ("counters", "top_k"),
    "aggregate": ("value", "aggs"),
    "operator": ("operator", "columns", "params"),
}
# the schema's kinds are exactly the built-ins plus the user's operator, each with its fields
assert set(KINDS) == {*BUILTINS, "operator"} == set(PARAMS), (KINDS, BUILTINS, PARAMS)
#: fields of the ``app`` section that are not operator parameters
_RUNTIME_FIELDS = ("kind", "aggregate_every_s", "window")


def _unknown_kind(kind: Any) -> ValueError:
    return ValueError(f"app.kind: unknown application {kind!r} (known: {', '.join(KINDS)})")


def builtin_operator(kind: str, **params: Any) -> BoundOperator:
    """``builtin_operator("heavy-hitters", counters=1000, top_k=100)``: the
    built-in for ``kind``, bound (errors name ``app.kind: <kind>``). A bad
    parameter is a one-line ``ValueError`` naming its field."""
    cls = BUILTINS.get(kind)
    if cls is None:
        raise _unknown_kind(kind)
    unknown = sorted(set(params) - set(PARAMS[kind]))
    if unknown:
        raise ValueError(f"app: unknown parameter(s) {unknown} for {kind!r}")
    if kind == "aggregate" and "value" not in params:
        raise ValueError("app.value: required for kind 'aggregate' (the value column)")
    op = cls(**params)
    return BoundOperator(op, spec_of(op, kind, field="app.kind"))


def operator_for_app(app: Mapping[str, Any], base_dir: str | Path = ".") -> BoundOperator:
    """The ``BoundOperator`` of an ``app:`` section (a mapping, e.g.
    ``topo.app.model_dump()``); ``base_dir``: the topology file's directory
    (for ``operator: path/file.py:Class`` and importable modules there).
    Fields set to ``None`` and fields of other kinds are ignored. With
    ``app.window``, the operator runs per event-time window
    (``runtime.operators.windows``)."""
    op = _operator_for_app(app, base_dir)
    window = app.get("window")
    if window is None:
        return op
    from runtime.operators.windows import windowed

    return windowed(op, window)


def _operator_for_app(app: Mapping[str, Any], base_dir: str | Path) -> BoundOperator:
    kind = app.get("kind")
    if kind not in PARAMS:
        raise _unknown_kind(kind)
    fields = {k: v for k, v in app.items()
              if k in PARAMS[kind] and k not in _RUNTIME_FIELDS and v is not None}
    if kind != "operator":
        return builtin_operator(kind, **fields)
    if "operator" not in fields:
        raise ValueError("app.operator: required for kind 'operator' (module:Class or file.py:Class)")
    return make_operator(fields["operator"], base_dir, fields.get("params"), fields.get("columns"))


__all__ = ["BUILTINS", "KINDS", "PARAMS", "builtin_operator", "operator_for_app"]
