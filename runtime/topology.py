"""The topology YAML schema (pydantic): load, override, validate.

Field names are a contract (docs/design.md, "Topology YAML"). Every error
becomes one line naming the field and the bad value, at most ``MAX_MESSAGE``
characters: ``TopologyError("workers.capacity: ... (got -1)")``; the command-line
tools print it and exit 2.

YAML is read as YAML 1.2's core schema (``010`` is ten, ``1:30`` is text, ``yes``
is text), and a hostile file is refused before it costs anything: at most
``MAX_FILE_BYTES``, nested at most ``MAX_DEPTH`` levels, at most ``MAX_VALUES``
values once its aliases are expanded (docs/input.md, "The topology").
"""

from __future__ import annotations

import math
import os
import re
import stat
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
#: the longest error line (the field comes first, so a cut keeps it)
MAX_MESSAGE = 200
#: a topology file is a few KB: more than this is not one (``/dev/zero``, a log...)
MAX_FILE_BYTES = 1 << 20
#: nesting levels a YAML document may have (a topology needs 4)
MAX_DEPTH = 32
#: values (mappings, lists, scalars) a YAML document may hold once its aliases
#: are expanded (a topology holds a few hundred; a "billion laughs" holds 10**9)
MAX_VALUES = 100_000
#: values a YAML document may hold as written (each costs Python time to build:
#: a per-worker capacity list for the most workers, 10,000, still fits)
MAX_NODES = 20_000
#: longest run name: it names the output directory (``<name>-<UTC timestamp>``)
#: and a Ray namespace
MAX_NAME = 100
#: Linux's limits: a path longer, or with a longer component, cannot exist
PATH_MAX, NAME_MAX = 4095, 255


class TopologyError(ValueError):
    """A topology problem, as one line naming the field and the value.

    Always one line: a control character from the input (a field name with a
    newline in it) is shown escaped (``\\n``)."""

    def __init__(self, message: str) -> None:
        line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
        if len(line) > MAX_MESSAGE:  # a hostile value or path: keep the field, cut the rest
            line = line[: MAX_MESSAGE - 3] + "..."
        super().__init__(line)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


#: sizes (batch, counters, queue lengths): a billion is a typo, and would be
#: allocated before it failed
PosInt = Annotated[int, Field(strict=True, ge=1, le=10**9)]
#: message counts (a generated stream's length, ``limit``)
Messages = Annotated[int, Field(strict=True, ge=1, le=10**12)]
#: how many workers / sources: each is a process, so a typo of 10**6 is an error
MAX_WORKERS = 10_000
Count = Annotated[int, Field(strict=True, ge=1, le=MAX_WORKERS)]
#: a seed: numpy, Spark (a long) and the hashes take 0 .. 2**63 - 1
Seed = Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)]
#: a time in seconds (``at_s``, intervals): a year at most (``time.sleep`` of
#: 1e300 overflows; an event after a year never comes)
MAX_SECONDS = 365 * 86400.0
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
PosSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
Millis = Annotated[float, Field(ge=0, le=MAX_SECONDS * 1000)]


class InputSpec(_Strict):
    format: Literal["parquet", "csv", "json", "zipf", "evolving-zipf"] = "zipf"
    path: str | None = None
    key: str = "key"
    #: naive-bayes: the class label column (files) - generated streams make one
    label: str = "label"
    limit: Messages | None = None
    # generators
    messages: Messages = 200_000
    #: distinct keys: each is a string held in memory (``generators.key_names``)
    keys: Annotated[int, Field(strict=True, ge=1, le=10**7)] = 10_000
    skew: Annotated[float, Field(ge=0, le=100)] = 1.0
    seed: Seed = 0
    shift_every: Messages | None = None
    classes: Annotated[int, Field(strict=True, ge=1, le=10_000)] = 2  # naive-bayes labels
    features: Annotated[int, Field(strict=True, ge=1, le=1000)] = 4  # naive-bayes features
    #: a generated stream of more messages than this is produced by Spark in
    #: chunks of it, one Spark job each (null, the default: one job, whose
    #: partitions are handed over one by one all the same; ``actors.shard_feed``)
    chunk_messages: Messages | None = None
    #: a live stream: ``path`` is a directory read by Spark Structured Streaming;
    #: every file that lands in it is processed (README, "Streams that keep coming")
    stream: bool = False
    #: live stream: most new files one Spark micro-batch takes
    max_files_per_trigger: PosInt = 8

    @field_validator("path")
    @classmethod
    def _possible_path(cls, v: str | None) -> str | None:
        return _local_path("input.path", v)

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
    at_s: Seconds
    worker: Annotated[int, Field(strict=True, ge=0)]
    capacity: Annotated[float, Field(gt=0)]

    @model_validator(mode="before")
    @classmethod
    def _by_time(cls, data: Any) -> Any:
        if isinstance(data, dict) and "after_messages" in data:
            raise ValueError("a capacity change comes at a time (at_s), not after a count "
                             "of messages (after_messages is for faults, add and remove)")
        return data


class _Trigger(_Strict):
    """When a fault or a membership change happens: ``at_s`` seconds into the
    run, or once the sources have had ``after_messages`` messages acked (what
    a test that must not depend on the machine's speed uses). Exactly one."""

    at_s: Seconds | None = None
    after_messages: Annotated[int, Field(strict=True, ge=0, le=10**15)] | None = None

    @model_validator(mode="after")
    def _one_trigger(self) -> _Trigger:
        if (self.at_s is None) == (self.after_messages is None):
            raise ValueError(f"give exactly one of at_s or after_messages "
                             f"(got at_s={self.at_s}, after_messages={self.after_messages})")
        return self


class MembershipChange(_Trigger):
    """``workers.changes`` entry ``{at_s, add: k}`` (k workers join, ids after the
    existing ones, at ``capacity``) or ``{at_s, remove: i}`` (worker i leaves);
    ``after_messages`` instead of ``at_s`` triggers it by progress."""

    add: Annotated[int, Field(strict=True, ge=1, le=MAX_WORKERS)] | None = None
    remove: Annotated[int, Field(strict=True, ge=0, le=MAX_WORKERS)] | None = None
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
    #: at most 10 s per message
    service_us: Annotated[float, Field(ge=0, le=10_000_000)] = 100.0
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

    def added(self) -> list[tuple[MembershipChange, int]]:
        """``(change, worker id)`` of every added worker (its capacity and
        trigger are the change's)."""
        out, nxt = [], self.count
        for m in self.membership:
            for _ in range(m.add or 0):
                out.append((m, nxt))
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
        if self.total_count > MAX_WORKERS:
            i = next(i for i, m in enumerate(self.membership) if m.add)
            raise ValueError(f"workers.changes: adds {self.total_count - self.count} workers to "
                             f"workers.count={self.count}: more than {MAX_WORKERS:,} in all "
                             f"(the first add: {self.membership[i].add})")
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
    """``scheme`` plus its parameters, flat (``grouping.virtual_per_worker``),
    and optionally other schemes' parameters in a mapping named after the
    scheme (``grouping.fish: {theta: 0.0002}``), used when that scheme runs.

    - A flat parameter must be one the chosen scheme takes: another scheme's
      is refused, naming the schemes that take it (it would be ignored); one
      that no scheme takes is a typo.
    - ``--set grouping.scheme=kg`` (and ``runtime.compare --schemes``) switch
      the scheme of a file: the file's flat parameters of its own scheme are
      dropped (``ignored_params()`` lists them), since they were written for
      it - also those the new scheme takes too: cg's ``eps: 0.1`` (PoRC's
      slack, tuned for cg) reached acg, whose default is 2, and took the word
      count's replication from 1.27 to 1.69 (docs/benchmarks.md). One given
      with ``--set`` is kept (it must be the new scheme's).
    - ``grouping.<scheme>`` entries override flat ones when that scheme runs.
    """

    model_config = ConfigDict(extra="allow")
    scheme: str = "cg"
    #: flat parameters dropped when an override switched the scheme (load_topology)
    _dropped: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _known(self) -> GroupingSpec:
        from runtime.grouping import SCHEMES, scheme_params

        if self.scheme not in SCHEMES:
            raise ValueError(f"grouping.scheme: {unknown_scheme(self.scheme)}")
        mine = scheme_params(self.scheme)
        anyone = {p for name in SCHEMES for p in scheme_params(name)}
        for k, v in (self.model_extra or {}).items():
            if k in SCHEMES:  # grouping.fish: {theta: ...}
                _check_scheme_block(k, v)
                continue
            if k in mine:
                continue
            if k in anyone:
                takers = sorted(name for name in SCHEMES if k in scheme_params(name))
                raise ValueError(
                    f"grouping.{k}: not a parameter of scheme {self.scheme!r}, it would be "
                    f"ignored (taken by {', '.join(takers)}; for them write "
                    f"grouping.{takers[0]}.{k})")
            hint = _did_you_mean(k, sorted(mine) + sorted(anyone - set(mine)) + ["scheme"])
            raise ValueError(
                f"grouping.{_cut(k, 40)}: unknown parameter for scheme {self.scheme!r}"
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
        where = {k: (f"{self.scheme}.{k}" if k in self._block() else k) for k in params}
        try:
            make_grouping(self.scheme, n_workers, seed=seed, **params)
            return
        except (TypeError, ValueError, OverflowError) as e:
            first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        for k in params:  # the constructor's message names the parameter?
            if first.startswith(f"{k} "):
                raise ValueError(f"grouping.{where[k]}: {first.removeprefix(k + ' ')}")
        for k, v in params.items():  # else: which one alone fails?
            try:
                make_grouping(self.scheme, n_workers, seed=seed, **{k: v})
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"grouping.{where[k]}: invalid value for scheme "
                                 f"{self.scheme!r} (got {_show(v)})") from None
        raise ValueError(f"grouping: invalid parameters for scheme {self.scheme!r} "
                         f"({_show(first, 100)})")

    def _block(self) -> dict[str, Any]:
        block = (self.model_extra or {}).get(self.scheme)
        return dict(block) if isinstance(block, dict) else {}

    def params(self) -> dict[str, Any]:
        """The parameters of the chosen scheme: its flat ones, then its own
        ``grouping.<scheme>`` entries over them."""
        from runtime.grouping import scheme_params

        mine = scheme_params(self.scheme)
        flat = {k: v for k, v in (self.model_extra or {}).items() if k in mine}
        return {**flat, **self._block()}

    def ignored_params(self) -> list[str]:
        """What this scheme does not use: flat parameters of the file's scheme
        dropped by a scheme switch, and other schemes' ``<scheme>.<param>``."""
        from runtime.grouping import SCHEMES

        other = [f"{name}.{k}" for name, block in (self.model_extra or {}).items()
                 if name in SCHEMES and name != self.scheme and isinstance(block, dict)
                 for k in block]
        return sorted([*self._dropped, *other])


def _check_scheme_block(name: str, block: Any) -> None:
    """``grouping.<scheme>``: a mapping of that scheme's parameters."""
    from runtime.grouping import scheme_params

    if not isinstance(block, dict):
        raise ValueError(f"grouping.{name}: expected a mapping of scheme {name!r}'s parameters "
                         f"(got {_show(block)})")
    mine = scheme_params(name)
    for k in block:
        if k not in mine:
            hint = _did_you_mean(k, sorted(mine))
            raise ValueError(f"grouping.{name}.{_cut(k, 40)}: unknown parameter for scheme "
                             f"{name!r}{', ' + hint if hint else ''} "
                             f"(known: {', '.join(sorted(mine)) or 'none'})")


def _drop_switched_params(before: Any, data: dict[str, Any],
                          parsed: list[tuple[list[str], Any]]) -> list[str]:
    """An override switched the scheme (``--set grouping.scheme=kg``): drop the
    file's flat parameters (its own scheme's), also those the new one takes
    too, unless the overrides give them (``GroupingSpec`` explains why);
    return their names."""
    from runtime.grouping import SCHEMES, scheme_params

    after = data.get("grouping")
    if not (isinstance(before, dict) and isinstance(after, dict)) or after is before:
        return []
    old, new = before.get("scheme", "cg"), after.get("scheme", "cg")
    if not (isinstance(old, str) and isinstance(new, str)) or old == new \
            or old not in SCHEMES or new not in SCHEMES:
        return []
    given = {path[1] for path, _ in parsed if path[0] == "grouping" and len(path) > 1}
    theirs = scheme_params(old)
    dropped = [k for k in after if isinstance(k, str) and k in before and k not in given
               and k in theirs]
    for k in dropped:
        del after[k]
    return sorted(dropped)


#: ``app.window`` durations: a number, or a number with a unit (``500ms``, ``1m``)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h|d)\s*$")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: most windows one record may fall in (``ceil(size / slide)``): each costs work per record
MAX_WINDOWS_PER_RECORD = 1000


def duration_s(field: str, value: Any) -> float:
    """A window duration with a unit (``"500ms"``, ``"1m"``) in seconds; a
    ``ValueError`` naming ``field`` for anything else."""
    m = _DURATION.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{field}: a number, or a duration like 500ms, 10s, 1m, 2h, 1d "
                         f"(got {_show(value)})")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


WindowLength = Annotated[int | float | str, Field(union_mode="left_to_right")]


class WindowSpec(_Strict):
    """``app.window``: event-time windows over an input column (README, "Windows").

    ``column``: an integer column (sizes in its own units) or a timestamp
    column (sizes in seconds, or with a unit: ``500ms``, ``1m``). Windows are
    ``[k*slide, k*slide + size)``, aligned to 0 as Spark aligns ``window()``
    to the epoch; a record falls in every window that holds its time.
    ``lateness``: in a live stream, how far behind the stream's watermark (the
    newest event time handed over) a record may be and still count.
    """

    column: str
    size: WindowLength
    slide: WindowLength | None = None  # default: size (tumbling windows)
    lateness: WindowLength = 0

    @field_validator("size", "slide", "lateness", mode="before")
    @classmethod
    def _not_bool(cls, v: Any, info: Any) -> Any:
        if isinstance(v, bool):  # YAML's true is not a length
            raise ValueError(f"app.window.{info.field_name}: a number, or a duration like "
                             f"500ms, 10s, 1m (got {_show(v)})")
        return v

    @field_validator("column")
    @classmethod
    def _column(cls, v: str) -> str:
        if not v or v == "key":
            raise ValueError(f"app.window.column: the event-time column, not the key "
                             f"(got {_show(v)})")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> WindowSpec:
        size = self.seconds("size")
        slide = self.seconds("slide")
        if not size > 0:
            raise ValueError(f"app.window.size: must be > 0 (got {_show(self.size)})")
        if not slide > 0:
            raise ValueError(f"app.window.slide: must be > 0 (got {_show(self.slide)})")
        if slide > size:
            raise ValueError(f"app.window.slide: at most the size {_show(self.size)} "
                             f"(got {_show(self.slide)})")
        if math.ceil(size / slide - 1e-9) > MAX_WINDOWS_PER_RECORD:
            raise ValueError(f"app.window.slide: a record would fall in more than "
                             f"{MAX_WINDOWS_PER_RECORD} windows (size / slide; got "
                             f"{_show(self.slide)} for size {_show(self.size)})")
        if not self.seconds("lateness") >= 0:
            raise ValueError(f"app.window.lateness: must be >= 0 (got {_show(self.lateness)})")
        return self

    def seconds(self, name: str) -> float:
        """``size``/``slide``/``lateness`` as a number (a unit's in seconds)."""
        value = getattr(self, name)
        if value is None and name == "slide":
            value = self.size
        if isinstance(value, bool):
            raise ValueError(f"app.window.{name}: a number (got {_show(value)})")
        if isinstance(value, (int, float)):
            if not math.isfinite(value) or abs(value) > 1e18:
                raise ValueError(f"app.window.{name}: a finite number (got {_show(value)})")
            return float(value)
        return duration_s(f"app.window.{name}", value)

    def has_units(self) -> bool:
        """A length was given with a unit (only a timestamp column takes one)."""
        return any(isinstance(v, str) for v in (self.size, self.slide, self.lateness))


class AppSpec(_Strict):
    """``app``: what the workers compute (docs/design.md, "Applications over records")."""

    kind: AppKind = "wordcount"
    aggregate_every_s: PosSeconds = 1.0
    #: heavy-hitters: SpaceSaving counters per worker and top-k reported
    counters: Annotated[int, Field(strict=True, ge=1, le=10**7)] = 1000
    top_k: Annotated[int, Field(strict=True, ge=1, le=10**7)] = 100
    #: aggregate: the value column and the per-key aggregates (in this order)
    value: str | None = None
    aggs: list[str] | None = None
    #: operator: the user's class (``module:Class`` or ``path/file.py:Class``),
    #: the input columns it gets besides the key, and its constructor's arguments
    operator: str | None = None
    columns: list[str] = []
    params: dict[str, Any] = {}
    #: event-time windows (any kind): results per (window, key)
    window: WindowSpec | None = None

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
                                 f"'path/file.py:Class' (got {_show(self.operator)})")
            _local_path("app.operator", self.operator.rpartition(":")[0])
            bad = [c for c in self.columns if not c or c == "key"]
            if bad or len(set(self.columns)) != len(self.columns):
                raise ValueError("app.columns: input columns besides the key, each once "
                                 f"(got {self.columns})")
        return self

    def columns_needed(self) -> list[str]:
        """The input columns the workers get besides ``key``, as the app names
        them (naive-bayes' label column is always ``label``)."""
        cols = {"naive-bayes": ["label"], "aggregate": [str(self.value)],
                "operator": list(self.columns)}.get(self.kind, [])
        if self.window is not None and self.window.column not in cols:
            cols.append(self.window.column)
        return cols


class FaultSpec(_Trigger):
    """``{at_s: 10, kill: worker-3}``, or ``{after_messages: 50000, kill: ...}``."""

    kill: str

    @field_validator("kill")
    @classmethod
    def _actor_name(cls, v: str) -> str:
        kind, _, idx = v.partition("-")
        if v != "aggregator" and (kind not in ("worker", "source")
                                  or not (idx.isdigit() and idx == str(int(idx)))):
            raise ValueError(f"must name an actor like worker-3, source-0 or aggregator "
                             f"(got {_show(v)})")
        return v


class RunSpec(_Strict):
    batch: PosInt = 1000
    rate: Annotated[float, Field(ge=0, le=1e12)] = 0.0
    seed: Seed = 0
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
    linger_ms: Millis = 10.0
    #: the linger of a source behind its input (its next batch already due:
    #: ``rate`` 0, or paced and late): its messages wait for it anyway, and
    #: larger calls let it catch up; latency under the offered rate keeps
    #: ``linger_ms`` (docs/benchmarks.md)
    behind_linger_ms: Millis = 50.0
    #: worker utilization time slot (s) for load signals and time series
    slot_s: PosSeconds = 0.5
    #: live stream: stop after this many seconds without new data
    until_idle_s: PosSeconds | None = None
    #: live stream: stop this many seconds after the start
    duration_s: PosSeconds | None = None
    #: live stream: most rows a source holds that it has not routed yet; Spark's
    #: next micro-batch waits (bounded memory when input outpaces the cluster)
    max_pending_rows: PosInt = 100_000
    #: live stream: checkpoint the result with the stream position after every
    #: micro-batch (exactly once across a --resume; docs/reliability.md)
    checkpoint: bool = True
    #: live stream: at most this often (at a micro-batch's end)
    checkpoint_every_s: PosSeconds = 1.0


def _run_name(v: str) -> str:
    """A run's name becomes a directory name and a Ray namespace."""
    if not v.strip() or any(c in v for c in "/\\") or not v.isprintable():
        raise ValueError(f"name: must be a non-empty name without '/' or control characters "
                         f"(got {_show(v)})")
    if len(v) > MAX_NAME or len(v.encode()) > 2 * MAX_NAME:
        raise ValueError(f"name: at most {MAX_NAME} characters: it names the run's output "
                         f"directory (got {len(v)} characters: {_show(v, 30)})")
    return v


def _local_path(field: str, v: str | None) -> str | None:
    """A local path that no system can open (longer than PATH_MAX, or a part
    longer than NAME_MAX bytes) is refused here, not by an ``OSError`` later."""
    if v is None or (_URI.match(v) and not v.startswith("file://")):
        return v
    raw = v.removeprefix("file://").encode(errors="surrogateescape")
    if len(raw) > PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise ValueError(f"{field}: no file can have this path: longer than {PATH_MAX} bytes, "
                         f"or a part longer than {NAME_MAX} (got {_show(v, 40)})")
    if "\x00" in v:
        raise ValueError(f"{field}: a path cannot hold a NUL character (got {_show(v, 40)})")
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
                raise ValueError(f"faults.{i}.kill: {_show(f.kill)} does not exist "
                                 f"({kind}s: {limit})")
        for name in self.placement:
            kind, _, idx = name.partition("-")
            limit = {"worker": self.workers.count, "source": self.sources}.get(kind, 0)
            # the engine looks actors up by their exact name: "worker-03" would never match
            canonical = idx.isdigit() and idx == str(int(idx))
            if name != "aggregator" and not (canonical and int(idx) < limit):
                raise ValueError(f"placement: {_show(name, 40)} is not an actor of this topology "
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
        cols: list[tuple[str, str]] = []
        if self.app.kind == "aggregate":
            cols = [("app.value", str(self.app.value))]
        elif self.app.kind == "operator":
            cols = [("app.columns", c) for c in self.app.columns]
        w = self.app.window
        if w is not None and w.column not in [c for _, c in cols]:
            cols.append(("app.window.column", w.column))
        return cols


# --------------------------------------------------------------------------- loading


def _format_error(err: ValidationError, data: Any = None) -> str:
    """The first validation error as one line: ``field: problem (got value)``.

    An unknown field goes first: a misspelled name usually also explains a
    "required field is missing" next to it. ``data``: what was validated
    (``workers.changes`` entries that add or remove workers are validated as
    ``workers.membership``: the message names them as the user wrote them)."""
    errors = err.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    parts = [x for x in e["loc"] if not _is_validator_tag(x)]
    if parts[:2] == ["workers", "membership"] and len(parts) > 2 and isinstance(parts[2], int):
        workers = data.get("workers") if isinstance(data, dict) else None
        changes = workers.get("changes") if isinstance(workers, dict) else None
        mem = [i for i, c in enumerate(changes) if isinstance(c, dict)
               and ("add" in c or "remove" in c)] if isinstance(changes, list) else []
        if parts[2] < len(mem):
            parts = ["workers", "changes", mem[parts[2]], *parts[3:]]
    loc = ".".join(_cut(x, 40) for x in parts)
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


def _cut(text: object, limit: int) -> str:
    """A name for a one-line message, shortened (``_show`` quotes values)."""
    s = str(text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


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


class _Hostile(Exception):
    """A YAML document too deep or too big to be a topology: ``path`` names
    where (mapping keys and list indexes)."""

    def __init__(self, path: list[str], problem: str) -> None:
        super().__init__(problem)
        self.path, self.problem = list(path), problem

    def line(self) -> str:
        where = ".".join(self.path) or "topology"
        return f"{where if len(where) <= 60 else where[:57] + '...'}: {self.problem}"


class _TopologyMixin:
    """What both topology loaders (pure Python and libyaml) add to PyYAML's."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()  # type: ignore[attr-defined]
        if node is None:
            return None
        _check_expansion(node)
        return self.construct_document(node)  # type: ignore[attr-defined]

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *defaults" may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[attr-defined]
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if dup:
                raise yaml.constructor.ConstructorError(
                    None, None, f"field {_show(key, 40)} given twice", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class _TopologyLoader(_TopologyMixin, yaml.SafeLoader):
    """``yaml.safe_load`` for topologies:

    - YAML 1.2's core schema for plain scalars (see ``_core_schema``): ``010``
      is ten, not eight; ``1:30`` is text, not ninety; ``yes``/``no``/``on``/
      ``off`` and dates are text;
    - a field given twice in one mapping is an error (plain YAML keeps the
      last one silently: a pasted duplicate would win);
    - at most ``MAX_DEPTH`` levels of nesting (composing is recursive: 1,000
      levels is a ``RecursionError``), and at most ``MAX_VALUES`` values once
      the aliases are expanded, counted on the node graph before anything is
      built (a "billion laughs" is refused in microseconds). Aliases and
      merge keys (``<<: *defaults``) within that budget are fine.

    ``_load_yaml`` first counts the parser's events (``_precheck``: depth and
    ``MAX_NODES``), then loads with libyaml's parser (``_CTopologyLoader``)
    when PyYAML has it: the pure-Python one takes seconds for 20,000 values.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._where: list[str] = []

    def compose_node(self, parent: Any, index: Any) -> Any:
        label = (None if parent is None else str(index.value) if isinstance(index, yaml.ScalarNode)
                 else str(index) if isinstance(index, int) else "?")
        if label is not None:
            self._where.append(label)
        try:
            if len(self._where) > MAX_DEPTH:
                raise _Hostile(self._where[:MAX_DEPTH], f"nested more than {MAX_DEPTH} levels "
                                                        f"deep (a topology needs 4)")
            return super().compose_node(parent, index)
        finally:
            if label is not None:
                self._where.pop()


def _children(node: Any) -> list[tuple[str, Any]]:
    if isinstance(node, yaml.MappingNode):
        out = []
        for k, v in node.value:
            label = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            out += [(label, k), (label, v)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(str(i), c) for i, c in enumerate(node.value)]
    return []


def _check_expansion(root: Any) -> None:
    """Refuse a node graph whose aliases expand past ``MAX_VALUES`` values or
    ``MAX_DEPTH`` levels, or that contains itself; name the field that holds
    the expansion. Linear in the number of distinct nodes."""
    memo: dict[int, tuple[int, int]] = {}  # id -> (expanded size, height)
    refs: dict[int, int] = {}
    stack: set[int] = set()

    def walk(node: Any, path: list[str]) -> tuple[int, int]:
        k = id(node)
        refs[k] = refs.get(k, 0) + 1
        if k in stack:
            raise _Hostile(path, "a YAML alias that contains itself")
        if k not in memo:
            if len(path) > MAX_DEPTH:
                raise _Hostile(path[:MAX_DEPTH], f"nested more than {MAX_DEPTH} levels deep "
                                                 f"once its YAML aliases are expanded")
            stack.add(k)
            size, height = 1, 0
            for label, child in _children(node):
                path.append(label)
                s, h = walk(child, path)
                path.pop()
                size, height = size + s, max(height, h + 1)
            stack.discard(k)
            memo[k] = (size, height)
        size, height = memo[k]
        if len(path) + height > MAX_DEPTH:
            raise _Hostile(path, f"nested more than {MAX_DEPTH} levels deep once its YAML "
                                 f"aliases are expanded")
        return size, height

    if walk(root, [])[0] <= MAX_VALUES:
        return
    node, where = root, []
    while True:  # down the biggest branch, to the field that holds the expansion
        big = [(memo[id(c)][0], label, c) for label, c in _children(node)
               if memo[id(c)][0] > MAX_VALUES]
        if not big:
            break
        _, label, child = max(big, key=lambda b: b[0])
        if refs[id(child)] > 1:  # an alias: this field is where it expands
            if isinstance(node, yaml.MappingNode):
                where.append(label)
            break
        where.append(label)
        node = child
    raise _Hostile(where, f"more than {MAX_VALUES:,} values once its YAML aliases are expanded "
                          f"(an alias bomb?)")


def _core_schema(loader: type[yaml.SafeLoader]) -> None:
    """Resolve plain scalars as YAML 1.2's core schema does (PyYAML speaks
    YAML 1.1): ints ``[-+]?[0-9]+`` (decimal even with a leading zero; ``_``
    between digits allowed), ``0o17``, ``0x1F``; floats with a dot or an
    exponent, ``.inf``, ``.nan``; booleans ``true``/``false`` only. No
    sexagesimal (``1:30``), no ``0b``, no implicit dates."""
    replaced = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool",
                "tag:yaml.org,2002:timestamp"}
    loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in replaced]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"))
    digits = r"[0-9]+(?:_[0-9]+)*"
    loader.add_implicit_resolver(  # before float: "10" would match both
        "tag:yaml.org,2002:int",
        re.compile(rf"^(?:[-+]?{digits}|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(rf"^(?:[-+]?(?:\.{digits}|{digits}\.(?:{digits})?)(?:[eE][-+]?[0-9]+)?"
                   rf"|[-+]?{digits}[eE][-+]?[0-9]+"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+.0123456789"))

    def construct_int(self: Any, node: Any) -> int:
        v = str(self.construct_scalar(node)).replace("_", "")
        if v.startswith(("0o", "0x")):
            return int(v[2:], 8 if v[1] == "o" else 16)
        return int(v, 10)

    def construct_float(self: Any, node: Any) -> float:
        v = str(self.construct_scalar(node)).replace("_", "").lower()
        if v in (".inf", "+.inf", "-.inf"):
            return -math.inf if v.startswith("-") else math.inf
        if v == ".nan":
            return math.nan
        return float(v)

    loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    loader.add_constructor("tag:yaml.org,2002:float", construct_float)


_core_schema(_TopologyLoader)
_CTopologyLoader: Any = None
if getattr(yaml, "CSafeLoader", None) is not None:
    class _CLoader(_TopologyMixin, yaml.CSafeLoader):
        """``_TopologyLoader`` on libyaml's parser (depth checked before)."""

    _core_schema(_CLoader)
    _CTopologyLoader = _CLoader


def _precheck(text: str) -> None:
    """Walk the parser's events (libyaml's when there is one: fast, and not
    recursive) and refuse, naming where, a document nested deeper than
    ``MAX_DEPTH`` or holding more than ``MAX_NODES`` values as written. A
    YAML error is left to the loader, which words it."""
    from yaml import events as ev

    stack: list[list[Any]] = []  # [label, is_mapping, expecting_key, last_key, next_index]
    nodes = 0
    try:
        for e in yaml.parse(text, Loader=_CTopologyLoader or yaml.SafeLoader):
            if isinstance(e, (ev.SequenceEndEvent, ev.MappingEndEvent)):
                stack.pop()
                continue
            if not isinstance(e, ev.NodeEvent):
                continue
            nodes += 1
            label = None
            if stack:
                top = stack[-1]
                if not top[1]:
                    label, top[4] = str(top[4]), top[4] + 1
                elif top[2]:
                    top[2], label = False, "?"
                    top[3] = e.value if isinstance(e, ev.ScalarEvent) else "?"
                else:
                    top[2], label = True, str(top[3])
            where = [str(x[0]) for x in stack[1:]] + ([label] if stack and label else [])
            if nodes > MAX_NODES:
                raise _Hostile(where[:MAX_DEPTH], f"more than {MAX_NODES:,} values (a topology "
                                                  f"holds a few hundred)")
            if isinstance(e, (ev.SequenceStartEvent, ev.MappingStartEvent)):
                stack.append([label, isinstance(e, ev.MappingStartEvent), True, None, 0])
                if len(stack) > MAX_DEPTH + 1:
                    raise _Hostile(where[:MAX_DEPTH], f"nested more than {MAX_DEPTH} levels "
                                                      f"deep (a topology needs 4)")
    except yaml.YAMLError:
        return


def _load_yaml(text: str) -> Any:
    """The YAML document in ``text``, read as a topology (``_TopologyLoader``)."""
    _precheck(text)
    if _CTopologyLoader is not None:
        try:
            return yaml.load(text, Loader=_CTopologyLoader)  # noqa: S506 - a SafeLoader
        except _Hostile:
            raise
        except _YAML_ERRORS:
            pass  # the pure-Python parser words it as the docs show (same grammar)
    return yaml.load(text, Loader=_TopologyLoader)  # noqa: S506 - a SafeLoader


def _short_path(path: object) -> str:
    """A path for a one-line message: its start and its end."""
    text = str(path)
    return text if len(text) <= 80 else f"{text[:38]}...{text[-38:]}"


def parse_override(item: str) -> tuple[list[str], Any]:
    """``key.path=value`` -> (["key", "path"], YAML-parsed value); a value
    that is not YAML is taken as text."""
    if "=" not in item:
        raise TopologyError(f"--set: expected key.path=value (got {_show(item)})")
    key, _, raw = item.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise TopologyError(f"--set: empty field name (got {_show(item)})")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except _Hostile as e:
        raise TopologyError(f"--set {_cut('.'.join(path), 40)}: {e.problem}") from None
    except _YAML_ERRORS:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any],
                    overrides: list[str] | list[tuple[list[str], Any]]) -> dict[str, Any]:
    """``data`` with the overrides applied: ``workers.count=8`` sets a field,
    ``workers.capacity.1=0.5`` the second entry of a list. The sections on
    the way are copied, so ``data`` itself (and the YAML aliases in it) are
    left alone."""
    data = dict(data)
    for item in overrides:
        path, value = parse_override(item) if isinstance(item, str) else item
        dotted = _cut(".".join(path), 60)
        node: Any = data
        for depth, part in enumerate(path):
            key: Any = part
            if isinstance(node, list):
                here = ".".join(path[:depth])
                if not part.isdigit():
                    raise TopologyError(f"--set {dotted}: {here} is a list: give an entry's "
                                        f"index, 0..{len(node) - 1} (got {_show(part, 20)})")
                key = int(part)
                if key >= len(node):
                    raise TopologyError(f"--set {dotted}: index {key} is out of range: {here} "
                                        f"has {len(node)} entries (0..{len(node) - 1})")
            if depth == len(path) - 1:
                node[key] = value
                break
            nxt = node[key] if isinstance(node, list) else node.get(key)
            if nxt is None:
                nxt = {}
            elif isinstance(nxt, (dict, list)):
                nxt = type(nxt)(nxt)  # copy on write
            else:
                raise TopologyError(f"--set {dotted}: {_show(part, 40)} is {_show(nxt, 30)}, "
                                    f"not a section or a list")
            node[key] = nxt
            node = nxt
    return data


def read_topology_file(path: Path) -> Any:
    """The YAML document of a topology file, or one line (``TopologyError``):
    not found, not a regular file (``/dev/zero``, a FIFO, a directory), larger
    than ``MAX_FILE_BYTES``, not UTF-8, malformed, too deep or too big."""
    shown = _short_path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise TopologyError(f"{shown}: cannot read topology file ({what})")
        if st.st_size > MAX_FILE_BYTES:
            raise TopologyError(f"{shown}: topology file larger than {MAX_FILE_BYTES >> 20} MiB "
                                f"({st.st_size:,} bytes; a topology is a few KB)")
        with open(path, "rb") as f:  # the size may change under us: read one byte more
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise TopologyError(f"{shown}: topology file larger than {MAX_FILE_BYTES >> 20} MiB")
        text = raw.decode("utf-8")
    except TopologyError:
        raise
    except FileNotFoundError:
        raise TopologyError(f"{shown}: topology file not found") from None
    except (OSError, ValueError) as e:  # ENAMETOOLONG, EACCES, a NUL in the path, not UTF-8
        why = getattr(e, "strerror", None) or e.__class__.__name__
        raise TopologyError(f"{shown}: cannot read topology file ({why})") from None
    try:
        return _load_yaml(text)
    except _Hostile as e:
        raise TopologyError(e.line()) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise TopologyError(f"{shown}: malformed YAML{where}: {problem}") from None
    except _YAML_ERRORS as e:  # a bad explicit tag value: "!!int" with nothing, "!!float x"
        raise TopologyError(f"{shown}: malformed YAML: a tagged value that is not of its tag's "
                            f"type ({e.__class__.__name__}: {_show(str(e), 60)})") from None


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
        data = read_topology_file(path)
        base_dir = str(path.resolve().parent)
        if data is None:
            data = {}
    if not isinstance(data, dict):
        raise TopologyError(f"topology: expected a mapping of fields (got {type(data).__name__})")
    parsed = [parse_override(o) for o in overrides or []]
    before = data.get("grouping")
    data = apply_overrides(data, parsed)
    dropped = _drop_switched_params(before, data, parsed)
    try:
        topo = Topology.model_validate(data)
    except ValidationError as e:
        raise TopologyError(_format_error(e, data)) from None
    except (TypeError, ValueError, RecursionError) as e:  # validators that raise outside pydantic
        raise TopologyError(str(e) or e.__class__.__name__) from None
    try:
        topo.grouping.check_values(topo.workers.count, topo.run.seed)
    except ValueError as e:
        raise TopologyError(str(e)) from None
    topo.grouping._dropped = dropped
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
                                f"{_show(topo.input.path)} is "
                                f"{'a file' if p.exists() else 'not found'}")
        return
    if not p.exists():
        raise TopologyError(f"input.path: file not found (got {_show(topo.input.path)})")
    if p.is_file() and not os.access(p, os.R_OK):
        raise TopologyError(f"input.path: file is not readable (got {_show(topo.input.path)})")
