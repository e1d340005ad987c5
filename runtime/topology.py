"""The topology YAML schema (pydantic): load, override, validate.

Field names are a contract (DESIGN.md). Every error becomes one line naming
the field and the bad value: ``TopologyError("workers.capacity: ... (got -1)")``;
the command-line tools print it and exit 2.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from runtime.placement import validate_amounts

FILE_FORMATS = ("parquet", "csv", "json")
GENERATED_FORMATS = ("zipf", "evolving-zipf")
THROTTLES = ("duty-cycle", "cpulimit", "service")
#: ``app.kind``: the built-in operators, then the user's own (``runtime.operators``)
AppKind = Literal["wordcount", "naive-bayes", "heavy-hitters", "aggregate", "operator"]
APPS: tuple[str, ...] = get_args(AppKind)
#: ``app.kind: aggregate``: the per-key aggregates one may ask for
AGGS = ("count", "sum", "min", "max", "mean")
#: a URI scheme (``s3a://``, ``hdfs://``, ``file://``): the path is not a local file name
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class TopologyError(ValueError):
    """A topology problem, as one line naming the field and the value.

    Always one line: a control character from the input (a field name with a
    newline in it) is shown escaped (``\\n``)."""

    def __init__(self, message: str) -> None:
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message)))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


PosInt = Annotated[int, Field(strict=True, ge=1)]
#: how many workers / sources: each is a process, so a typo of 10**6 is an error
Count = Annotated[int, Field(strict=True, ge=1, le=10_000)]
NonNegFloat = Annotated[float, Field(ge=0)]


class InputSpec(_Strict):
    format: Literal["parquet", "csv", "json", "zipf", "evolving-zipf"] = "zipf"
    path: str | None = None
    key: str = "key"
    #: naive-bayes: the class label column (files) - generated streams make one
    label: str = "label"
    limit: PosInt | None = None
    # generators
    messages: PosInt = 200_000
    keys: PosInt = 10_000
    skew: NonNegFloat = 1.0
    seed: int = 0
    shift_every: PosInt | None = None
    classes: PosInt = 2  # naive-bayes generated labels
    features: PosInt = 4  # naive-bayes generated features per message
    #: a generated stream of more messages than this is produced by Spark in
    #: chunks of it: the sources start on the first chunk while Spark produces
    #: the next (``actors.shard_feed``). Null (default) loads the whole stream
    #: first: on a 2-core box both phases use every core, and overlapping them
    #: starts the stream sooner but ends the run later (docs/benchmarks.md)
    chunk_messages: PosInt | None = None
    #: a live stream: ``path`` is a directory read by Spark Structured Streaming;
    #: every file that lands in it is processed (README, "Streams that keep coming")
    stream: bool = False
    #: live stream: most new files one Spark micro-batch takes
    max_files_per_trigger: PosInt = 8

    @model_validator(mode="after")
    def _path_for_files(self) -> InputSpec:
        if self.format in FILE_FORMATS and not self.path:
            raise ValueError(f"input.path: required for format {self.format!r}")
        if self.format in GENERATED_FORMATS and self.path:
            raise ValueError(f"input.path: not used by generated format {self.format!r}")
        if self.format in FILE_FORMATS and "chunk_messages" in self.model_fields_set:
            raise ValueError(f"input.chunk_messages: only for generated streams (format "
                             f"{', '.join(GENERATED_FORMATS)}; got format {self.format!r})")
        if self.format == "evolving-zipf" and self.shift_every is None:
            self.shift_every = max(1, self.messages // 4)
        if self.stream:
            if self.format not in FILE_FORMATS:
                raise ValueError(f"input.stream: only for files landing in a directory "
                                 f"(format {', '.join(FILE_FORMATS)}; got format "
                                 f"{self.format!r})")
            if self.limit is not None:
                raise ValueError(f"input.limit: not for a live stream (got {self.limit}); "
                                 f"stop it with run.until_idle_s or run.duration_s")
        elif "max_files_per_trigger" in self.model_fields_set:
            raise ValueError("input.max_files_per_trigger: only for a live stream "
                             "(input.stream: true)")
        return self

    @property
    def generated(self) -> bool:
        return self.format in GENERATED_FORMATS


class CapacityChange(_Strict):
    at_s: NonNegFloat
    worker: Annotated[int, Field(strict=True, ge=0)]
    capacity: Annotated[float, Field(gt=0)]


class MembershipChange(_Strict):
    """``workers.changes`` entry ``{at_s, add: k}`` (k workers join, ids after the
    existing ones, at ``capacity``) or ``{at_s, remove: i}`` (worker i leaves)."""

    at_s: NonNegFloat
    add: Annotated[int, Field(strict=True, ge=1)] | None = None
    remove: Annotated[int, Field(strict=True, ge=0)] | None = None
    capacity: Annotated[float, Field(gt=0)] = 1.0

    @model_validator(mode="after")
    def _one(self) -> MembershipChange:
        if (self.add is None) == (self.remove is None):
            raise ValueError("workers.changes: give exactly one of add or remove "
                             f"(got add={self.add}, remove={self.remove})")
        return self


class WorkersSpec(_Strict):
    count: Count = 4
    capacity: float | list[float] = 1.0
    service_us: NonNegFloat = 100.0
    throttle: Literal["duty-cycle", "cpulimit", "service"] = "duty-cycle"
    changes: list[CapacityChange] = []
    #: ``changes`` entries with ``add``/``remove`` (moved here when loading)
    membership: list[MembershipChange] = []
    #: bounded input queue per worker, in batches
    queue_batches: PosInt = 8

    @model_validator(mode="before")
    @classmethod
    def _split_membership(cls, data: Any) -> Any:
        """``changes`` holds capacity changes and membership changes (``add`` /
        ``remove``); the latter go to ``membership`` so that ``changes`` keeps
        meaning capacity changes for every consumer."""
        if isinstance(data, dict) and isinstance(data.get("changes"), list):
            ch = data["changes"]
            mem = [i for i, c in enumerate(ch) if isinstance(c, dict)
                   and ("add" in c or "remove" in c)]
            if mem:
                data = {**data,
                        "changes": [c for i, c in enumerate(ch) if i not in mem],
                        "membership": [*data.get("membership", []), *(ch[i] for i in mem)]}
        return data

    @property
    def total_count(self) -> int:
        """Workers ever in the run: ``count`` plus every added one."""
        return self.count + sum(m.add or 0 for m in self.membership)

    def added(self) -> list[tuple[float, int, float]]:
        """``(at_s, worker id, capacity)`` of every added worker."""
        out, nxt = [], self.count
        for m in self.membership:
            for _ in range(m.add or 0):
                out.append((m.at_s, nxt, m.capacity))
                nxt += 1
        return out

    @field_validator("capacity", mode="before")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        def number(c: Any) -> bool:
            return isinstance(c, (int, float)) and not isinstance(c, bool)

        if not (number(v) or isinstance(v, list)):
            raise ValueError(f"workers.capacity: expected a number or a list of numbers "
                             f"(got {_show(v)})")
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise ValueError("workers.capacity: must not be empty (got [])")
        for i, c in enumerate(vals):
            where = f"workers.capacity.{i}" if isinstance(v, list) else "workers.capacity"
            if not number(c):
                raise ValueError(f"{where}: expected a number (got {_show(c)})")
            if not math.isfinite(c) or not c > 0:
                raise ValueError(f"{where}: every capacity must be > 0 and finite (got {c})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> WorkersSpec:
        caps = self.capacity if isinstance(self.capacity, list) else [self.capacity]
        if len(caps) not in (1, self.count):
            raise ValueError(
                f"workers.capacity: {len(caps)} values for workers.count={self.count} "
                f"(give one value or exactly {self.count})"
            )
        over = [c for c in caps + [ch.capacity for ch in self.changes] if c > 1]
        if over and self.throttle != "service":
            raise ValueError(
                f"workers.capacity: {over[0]} > 1 needs workers.throttle=service "
                f"(got throttle={self.throttle!r}; duty-cycle can only slow a worker down)"
            )
        for i, ch in enumerate(self.changes):
            if ch.worker >= self.total_count:
                raise ValueError(
                    f"workers.changes.{i}.worker: worker {ch.worker} does not exist "
                    f"(workers.count={self.count})"
                )
        for m in self.membership:
            if m.remove is not None and m.remove >= self.total_count:
                raise ValueError(f"workers.changes: remove: worker {m.remove} does not exist "
                                 f"(workers.count={self.count})")
        return self

    def capacities(self) -> list[float]:
        """Initial capacity of every worker (one value broadcast)."""
        caps = self.capacity if isinstance(self.capacity, list) else [self.capacity]
        return [float(c) for c in caps] * (self.count if len(caps) == 1 else 1)


def unknown_scheme(name: str) -> str:
    """``unknown scheme 'pck', did you mean 'pkg'? (known: acg, cg, ...)``."""
    from runtime.grouping import SCHEMES

    hint = _did_you_mean(name, SCHEMES)
    return (f"unknown scheme {name!r}{', ' + hint if hint else ''} "
            f"(known: {', '.join(sorted(SCHEMES))})")


class GroupingSpec(BaseModel):
    """``scheme`` plus scheme parameters, flat (``grouping.virtual_per_worker``).

    A parameter no scheme knows is an error (a typo). A parameter of *another*
    scheme is ignored for this one, so one topology can carry the tunables of
    several schemes and ``--set grouping.scheme=kg`` still works on a CG file;
    ``ignored_params()`` lists them (reports record them).
    """

    model_config = ConfigDict(extra="allow")
    scheme: str = "cg"

    @model_validator(mode="after")
    def _known(self) -> GroupingSpec:
        from runtime.grouping import SCHEMES, scheme_params

        if self.scheme not in SCHEMES:
            raise ValueError(f"grouping.scheme: {unknown_scheme(self.scheme)}")
        mine = scheme_params(self.scheme)
        anyone = {p for name in SCHEMES for p in scheme_params(name)}
        for k in self.model_extra or {}:
            if k not in anyone:
                hint = _did_you_mean(k, sorted(mine) + sorted(anyone - set(mine)) + ["scheme"])
                raise ValueError(
                    f"grouping.{k}: unknown parameter for scheme {self.scheme!r}"
                    f"{', ' + hint if hint else ''} "
                    f"(known: {', '.join(sorted(mine)) or 'none'})"
                )
        return self

    def check_values(self, n_workers: int, seed: int) -> None:
        """Build the scheme once, so a bad parameter value is a load-time error
        (``grouping.eps: must be in [0, 10.0] (got -1)``), not a crash in a
        source actor."""
        from runtime.grouping import make_grouping

        params = self.params()
        try:
            make_grouping(self.scheme, n_workers, seed=seed, **params)
            return
        except (TypeError, ValueError, OverflowError) as e:
            first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        for k in params:  # the constructor's message names the parameter?
            if first.startswith(f"{k} "):
                raise ValueError(f"grouping.{k}: {first.removeprefix(k + ' ')}")
        for k, v in params.items():  # else: which one alone fails?
            try:
                make_grouping(self.scheme, n_workers, seed=seed, **{k: v})
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"grouping.{k}: invalid value for scheme {self.scheme!r} "
                                 f"(got {_show(v)})") from None
        raise ValueError(f"grouping: invalid parameters for scheme {self.scheme!r} ({first})")

    def params(self) -> dict[str, Any]:
        """The parameters that apply to the chosen scheme."""
        from runtime.grouping import scheme_params

        mine = scheme_params(self.scheme)
        return {k: v for k, v in (self.model_extra or {}).items() if k in mine}

    def ignored_params(self) -> list[str]:
        """Parameters given for other schemes, unused by this one."""
        return sorted(set(self.model_extra or {}) - set(self.params()))


class AppSpec(_Strict):
    """``app``: what the workers compute (DESIGN.md, "Applications over records")."""

    kind: AppKind = "wordcount"
    aggregate_every_s: Annotated[float, Field(gt=0)] = 1.0
    #: heavy-hitters: SpaceSaving counters per worker and top-k reported
    counters: PosInt = 1000
    top_k: PosInt = 100
    #: aggregate: the value column and the per-key aggregates (in this order)
    value: str | None = None
    aggs: list[str] | None = None
    #: operator: the user's class (``module:Class`` or ``path/file.py:Class``),
    #: the input columns it gets besides the key, and its constructor's arguments
    operator: str | None = None
    columns: list[str] = []
    params: dict[str, Any] = {}

    @model_validator(mode="after")
    def _fields_of_kind(self) -> AppSpec:
        own = {"aggregate": ("value", "aggs"), "operator": ("operator", "columns", "params")}
        for kind, fields in own.items():
            for f in fields:
                if self.kind != kind and f in self.model_fields_set:
                    raise ValueError(f"app.{f}: only for kind {kind} (got kind {self.kind!r})")
        if self.kind == "aggregate":
            if not self.value:
                raise ValueError("app.value: required for kind aggregate (the value column)")
            if not self.aggs:
                raise ValueError(f"app.aggs: required for kind aggregate: a non-empty list "
                                 f"of {', '.join(AGGS)} (got {self.aggs!r})")
            for a in self.aggs:
                if a not in AGGS:
                    hint = _did_you_mean(a, AGGS)
                    raise ValueError(f"app.aggs: unknown aggregate {a!r}"
                                     f"{', ' + hint if hint else ''} (known: {', '.join(AGGS)})")
            if len(set(self.aggs)) != len(self.aggs):
                raise ValueError(f"app.aggs: an aggregate is listed twice (got {self.aggs})")
        if self.kind == "operator":
            if not self.operator or ":" not in self.operator:
                raise ValueError("app.operator: required for kind operator: 'module:Class' or "
                                 f"'path/file.py:Class' (got {self.operator!r})")
            bad = [c for c in self.columns if not c or c == "key"]
            if bad or len(set(self.columns)) != len(self.columns):
                raise ValueError("app.columns: input columns besides the key, each once "
                                 f"(got {self.columns})")
        return self

    def columns_needed(self) -> list[str]:
        """The input columns the workers get besides ``key``, as the app names
        them (naive-bayes' label column is always ``label``)."""
        if self.kind == "naive-bayes":
            return ["label"]
        if self.kind == "aggregate":
            return [str(self.value)]
        if self.kind == "operator":
            return list(self.columns)
        return []


class FaultSpec(_Strict):
    at_s: NonNegFloat
    kill: str

    @field_validator("kill")
    @classmethod
    def _actor_name(cls, v: str) -> str:
        kind, _, idx = v.partition("-")
        if v != "aggregator" and (kind not in ("worker", "source") or not idx.isdigit()):
            raise ValueError(f"must name an actor like worker-3, source-0 or aggregator "
                             f"(got {v!r})")
        return v


class RunSpec(_Strict):
    batch: PosInt = 1000
    rate: NonNegFloat = 0.0
    seed: int = 0
    #: unacknowledged calls a source keeps in flight per worker (backpressure)
    max_inflight: PosInt = 2
    #: most messages in one call to a worker: a worker's routed sub-batches
    #: that wait for a free in-flight slot are coalesced into one call up to it
    call_messages: PosInt = 8192
    #: a source holds a worker's routed messages back up to this long to fill
    #: one call (to ``call_messages``, ``CALL_S`` of the worker's measured work,
    #: or half its memory bound), so calls carry more than one micro-batch;
    #: 0 (and ``behind_linger_ms`` 0) sends as soon as a window is open. 10
    #: (default) moves 2.5-3x more with no emulated work (docs/benchmarks.md)
    linger_ms: NonNegFloat = 10.0
    #: the linger of a source behind its input (its next batch already due:
    #: ``rate`` 0, or paced and late): its messages wait for it anyway, and
    #: larger calls let it catch up; latency under the offered rate keeps
    #: ``linger_ms`` (docs/benchmarks.md)
    behind_linger_ms: NonNegFloat = 50.0
    #: worker utilization time slot (s) for load signals and time series
    slot_s: Annotated[float, Field(gt=0)] = 0.5
    #: live stream: stop after this many seconds without new data
    until_idle_s: Annotated[float, Field(gt=0)] | None = None
    #: live stream: stop this many seconds after the start
    duration_s: Annotated[float, Field(gt=0)] | None = None
    #: live stream: most rows a source holds that it has not routed yet; Spark's
    #: next micro-batch waits (bounded memory when input outpaces the cluster)
    max_pending_rows: PosInt = 100_000
    #: live stream: checkpoint the result with the stream position after every
    #: micro-batch (exactly once across a --resume; docs/reliability.md)
    checkpoint: bool = True
    #: live stream: at most this often (at a micro-batch's end)
    checkpoint_every_s: Annotated[float, Field(gt=0)] = 1.0


def _run_name(v: str) -> str:
    """A run's name becomes a directory name and a Ray namespace."""
    if not v.strip() or any(c in v for c in "/\\") or not v.isprintable():
        raise ValueError(f"name: must be a non-empty name without '/' or control characters "
                         f"(got {v!r})")
    return v


class Topology(_Strict):
    name: Annotated[str, AfterValidator(_run_name)] = "topology"
    input: InputSpec = Field(default_factory=InputSpec)
    sources: Count = 1
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    grouping: GroupingSpec = Field(default_factory=GroupingSpec)
    app: AppSpec = Field(default_factory=AppSpec)
    faults: list[FaultSpec] = []
    placement: dict[str, dict[str, float]] = {}
    run: RunSpec = Field(default_factory=RunSpec)

    #: directory of the YAML file, for resolving relative input paths
    _base_dir: str = PrivateAttr(default=".")

    @model_validator(mode="after")
    def _cross(self) -> Topology:
        if not self.input.stream:
            for name in ("until_idle_s", "duration_s", "max_pending_rows", "checkpoint",
                         "checkpoint_every_s"):
                if name in self.run.model_fields_set:
                    raise ValueError(f"run.{name}: only for a live stream (input.stream: true)")
        for i, f in enumerate(self.faults):
            kind, _, idx = f.kill.partition("-")
            limit = self.workers.count if kind == "worker" else self.sources
            if kind != "aggregator" and int(idx) >= limit:
                raise ValueError(f"faults.{i}.kill: {f.kill!r} does not exist ({kind}s: {limit})")
        for name in self.placement:
            kind, _, idx = name.partition("-")
            limit = {"worker": self.workers.count, "source": self.sources}.get(kind, 0)
            if name != "aggregator" and not (idx.isdigit() and int(idx) < limit):
                raise ValueError(f"placement: {name!r} is not an actor of this topology "
                                 f"(worker-0..{self.workers.count - 1}, "
                                 f"source-0..{self.sources - 1} or aggregator)")
            validate_amounts(name, self.placement[name])
        return self

    @property
    def base_dir(self) -> str:
        """The topology file's directory (relative input paths and operator
        files are resolved from it)."""
        return self._base_dir

    def input_path(self) -> Path | None:
        """The input file on this machine, resolved relative to the topology
        file's directory (``file://`` URIs included); ``None`` for generated
        streams and for remote URIs (``s3a://``, ``hdfs://``, ``gs://``...)."""
        if self.input.path is None:
            return None
        if _URI.match(self.input.path):
            if not self.input.path.startswith("file://"):
                return None
            return Path(self.input.path.removeprefix("file://"))
        p = Path(os.path.expanduser(self.input.path))
        return p if p.is_absolute() else (Path(self._base_dir) / p)

    def input_uri(self) -> str | None:
        """What Spark's executors read: a remote URI as given, else the absolute
        local path. On a cluster a local path must exist on every node that
        runs an executor (a shared file system, or the same image)."""
        if self.input.path is None:
            return None
        local = self.input_path()
        return self.input.path if local is None else str(local.resolve())

    def grouping_params(self) -> dict[str, Any]:
        return self.grouping.params()

    def app_input_columns(self) -> list[tuple[str, str]]:
        """``(field, column)`` of every input column an aggregate or operator
        app reads besides the key (naive-bayes' label is ``input.label``)."""
        if self.app.kind == "aggregate":
            return [("app.value", str(self.app.value))]
        if self.app.kind == "operator":
            return [("app.columns", c) for c in self.app.columns]
        return []


# --------------------------------------------------------------------------- loading


def _format_error(err: ValidationError) -> str:
    """The first validation error as one line: ``field: problem (got value)``.

    An unknown field goes first: a misspelled name usually also explains a
    "required field is missing" next to it."""
    errors = err.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    parts = [x for x in e["loc"] if not _is_validator_tag(x)]
    loc = ".".join(str(x) for x in parts)
    msg = e["msg"].removeprefix("Value error, ")
    if _names_a_field(msg):
        return msg  # the validator already named the field
    got = e.get("input")
    kind = e["type"]
    ctx = e.get("ctx") or {}
    if kind == "extra_forbidden":
        name = str(parts[-1]) if parts else loc
        hint = _did_you_mean(name, _fields_at(parts[:-1]))
        return f"{loc}: unknown field" + (f", {hint}" if hint else "")
    if kind == "missing":
        return f"{loc}: required field is missing"
    if kind == "literal_error":
        import re

        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        hint = _did_you_mean(str(got), allowed)
        return (f"{loc}: must be one of {', '.join(allowed)} (got {_show(got)})"
                + (f", {hint}" if hint else ""))
    if kind in ("model_type", "model_attributes_type", "dict_type", "mapping_type"):
        return f"{loc or 'topology'}: expected a mapping of fields (got {_show(got)})"
    if kind == "invalid_key":
        return f"{loc or 'topology'}: field names must be text (got {_show(got)})"
    msg = _PLAIN.get(kind, msg).format(**ctx)
    if "(got " in msg:  # the validator showed the value itself
        return f"{loc}: {msg}" if loc else msg
    return f"{loc}: {msg} (got {_show(got)})" if loc else f"{msg} (got {_show(got)})"


#: pydantic's messages for the common problems, in our words
_PLAIN = {
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "finite_number": "must be a finite number",
    "string_type": "expected text",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "list_type": "expected a list",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "recursion_loop": "refers to itself (a YAML alias cycle)",
}


def _is_validator_tag(x: object) -> bool:
    """pydantic's loc entries that name a validator or a union member, not a field."""
    s = str(x)
    return s.startswith(("function-", "list[", "dict[")) or s in ("float", "int", "str")


def _show(value: object, limit: int = 60) -> str:
    """A value for a one-line message: its repr, shortened."""
    if isinstance(value, dict) and len(repr(value)) > limit:
        return f"a mapping with fields {', '.join(map(str, list(value)[:5]))}"
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _did_you_mean(name: str, candidates: Any) -> str:
    """``did you mean 'count'?`` for the closest candidate, or ``""``."""
    import difflib

    names = [str(c) for c in candidates]
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    if not close:  # a prefix or a different case: "work" -> "workers", "KG" -> "kg"
        low = str(name).lower()
        close = [c for c in names if c.lower() == low
                 or (len(low) >= 3 and c.lower().startswith(low))][:1]
    return f"did you mean {close[0]!r}?" if close else ""


def _fields_at(loc: list[Any]) -> list[str]:
    """The valid field names of the section at ``loc`` (list indexes skipped)."""
    import typing

    model: Any = Topology
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(str(part))
        if field is None:
            return []
        model = field.annotation
        for _ in range(3):  # unwrap list[X], X | None
            args = [a for a in typing.get_args(model) if a is not type(None)]
            if hasattr(model, "model_fields") or not args:
                break
            model = args[0]
    return list(getattr(model, "model_fields", {}))


def _names_a_field(msg: str) -> bool:
    head = msg.split(" ", 1)[0]
    return head.endswith(":") and head[:-1].split(".")[0] in Topology.model_fields


#: what PyYAML's safe constructors raise besides YAMLError for explicitly
#: tagged values that do not parse (``!!int`` -> IndexError, ``!!bool`` ->
#: KeyError, ``!!float x`` / ``!!timestamp 2020-13-45`` -> ValueError)
_YAML_ERRORS = (yaml.YAMLError, ValueError, IndexError, KeyError, TypeError, OverflowError)


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a field given twice in one mapping
    (plain YAML keeps the last one silently: a pasted duplicate would win)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *defaults" may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if dup:
                raise yaml.constructor.ConstructorError(
                    None, None, f"field {key!r} given twice", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``key.path=value`` -> (["key", "path"], yaml-parsed value)."""
    if "=" not in item:
        raise TopologyError(f"--set: expected key.path=value (got {item!r})")
    key, _, raw = item.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise TopologyError(f"--set: empty field name (got {item!r})")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except _YAML_ERRORS:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise TopologyError(f"--set {'.'.join(path)}: {part!r} is not a section")
            node = nxt
        node[path[-1]] = value
    return data


def load_topology(
    source: str | os.PathLike[str] | dict[str, Any],
    overrides: list[str] | None = None,
    *,
    check_input: bool = False,
) -> Topology:
    """Load and validate a topology from a YAML path (or a dict).

    Raises ``TopologyError`` with one line naming the field and the value.
    """
    base_dir = "."
    if isinstance(source, dict):
        data: Any = source
    else:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TopologyError(f"{path}: topology file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise TopologyError(f"{path}: cannot read topology file ({e.__class__.__name__})") from None
        try:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or "invalid YAML"
            raise TopologyError(f"{path}: malformed YAML{where}: {problem}") from None
        except _YAML_ERRORS as e:  # a bad explicit tag value: "!!int" with nothing, "!!float x"
            raise TopologyError(f"{path}: malformed YAML: a tagged value that is not of its tag's "
                                f"type ({e.__class__.__name__}: {e})") from None
        base_dir = str(path.resolve().parent)
        if data is None:
            data = {}
    if not isinstance(data, dict):
        raise TopologyError(f"topology: expected a mapping of fields (got {type(data).__name__})")
    data = apply_overrides(dict(data), overrides or [])
    try:
        topo = Topology.model_validate(data)
    except ValidationError as e:
        raise TopologyError(_format_error(e)) from None
    except (TypeError, ValueError) as e:  # validators that raise outside pydantic
        raise TopologyError(str(e)) from None
    try:
        topo.grouping.check_values(topo.workers.count, topo.run.seed)
    except ValueError as e:
        raise TopologyError(str(e)) from None
    topo._base_dir = base_dir
    if check_input:
        check_input_exists(topo)
    return topo


def check_input_exists(topo: Topology) -> None:
    p = topo.input_path()
    if p is None:
        return
    if topo.input.stream:
        if not p.is_dir():
            raise TopologyError(f"input.path: a live stream reads a directory, and "
                                f"{topo.input.path!r} is {'a file' if p.exists() else 'not found'}")
        return
    if not p.exists():
        raise TopologyError(f"input.path: file not found (got {topo.input.path!r})")
    if p.is_file() and not os.access(p, os.R_OK):
        raise TopologyError(f"input.path: file is not readable (got {topo.input.path!r})")
