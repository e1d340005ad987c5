"""The topology YAML schema (pydantic): load, override, validate.

Field names are a contract (DESIGN.md). Every error becomes one line naming
the field and the bad value: ``TopologyError("workers.capacity: ... (got -1)")``;
the command-line tools print it and exit 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

FILE_FORMATS = ("parquet", "csv", "json")
GENERATED_FORMATS = ("zipf", "evolving-zipf")
THROTTLES = ("duty-cycle", "cpulimit", "service")
APPS = ("wordcount", "naive-bayes", "heavy-hitters")


class TopologyError(ValueError):
    """A topology problem, as one line naming the field and the value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


PosInt = Annotated[int, Field(strict=True, ge=1)]
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

    @model_validator(mode="after")
    def _path_for_files(self) -> InputSpec:
        if self.format in FILE_FORMATS and not self.path:
            raise ValueError(f"input.path: required for format {self.format!r}")
        if self.format in GENERATED_FORMATS and self.path:
            raise ValueError(f"input.path: not used by generated format {self.format!r}")
        if self.format == "evolving-zipf" and self.shift_every is None:
            self.shift_every = max(1, self.messages // 4)
        return self

    @property
    def generated(self) -> bool:
        return self.format in GENERATED_FORMATS


class CapacityChange(_Strict):
    at_s: NonNegFloat
    worker: Annotated[int, Field(strict=True, ge=0)]
    capacity: Annotated[float, Field(gt=0)]


class WorkersSpec(_Strict):
    count: PosInt = 4
    capacity: float | list[float] = 1.0
    service_us: NonNegFloat = 100.0
    throttle: Literal["duty-cycle", "cpulimit", "service"] = "duty-cycle"
    changes: list[CapacityChange] = []
    #: bounded input queue per worker, in batches
    queue_batches: PosInt = 8

    @field_validator("capacity")
    @classmethod
    def _positive(cls, v: float | list[float]) -> float | list[float]:
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise ValueError("must not be empty")
        for c in vals:
            if not c > 0:
                raise ValueError(f"every capacity must be > 0 (got {c})")
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
            if ch.worker >= self.count:
                raise ValueError(
                    f"workers.changes.{i}.worker: worker {ch.worker} does not exist "
                    f"(workers.count={self.count})"
                )
        return self

    def capacities(self) -> list[float]:
        """Initial capacity of every worker (one value broadcast)."""
        caps = self.capacity if isinstance(self.capacity, list) else [self.capacity]
        return [float(c) for c in caps] * (self.count if len(caps) == 1 else 1)


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
            raise ValueError(
                f"grouping.scheme: unknown scheme {self.scheme!r} "
                f"(known: {', '.join(sorted(SCHEMES))})"
            )
        mine = scheme_params(self.scheme)
        anyone = {p for name in SCHEMES for p in scheme_params(name)}
        for k in self.model_extra or {}:
            if k not in anyone:
                raise ValueError(
                    f"grouping.{k}: unknown parameter for scheme {self.scheme!r} "
                    f"(known: {', '.join(sorted(mine)) or 'none'})"
                )
        return self

    def params(self) -> dict[str, Any]:
        """The parameters that apply to the chosen scheme."""
        from runtime.grouping import scheme_params

        mine = scheme_params(self.scheme)
        return {k: v for k, v in (self.model_extra or {}).items() if k in mine}

    def ignored_params(self) -> list[str]:
        """Parameters given for other schemes, unused by this one."""
        return sorted(set(self.model_extra or {}) - set(self.params()))


class AppSpec(_Strict):
    kind: Literal["wordcount", "naive-bayes", "heavy-hitters"] = "wordcount"
    aggregate_every_s: Annotated[float, Field(gt=0)] = 1.0
    #: heavy-hitters: SpaceSaving counters per worker and top-k reported
    counters: PosInt = 1000
    top_k: PosInt = 100


class FaultSpec(_Strict):
    at_s: NonNegFloat
    kill: str

    @field_validator("kill")
    @classmethod
    def _actor_name(cls, v: str) -> str:
        kind, _, idx = v.partition("-")
        if kind not in ("worker", "source") or not idx.isdigit():
            raise ValueError(f"must name an actor like worker-3 or source-0 (got {v!r})")
        return v


class RunSpec(_Strict):
    batch: PosInt = 1000
    rate: NonNegFloat = 0.0
    seed: int = 0
    #: unacknowledged batches a source keeps in flight per worker (backpressure)
    max_inflight: PosInt = 2
    #: worker utilization time slot (s) for load signals and time series
    slot_s: Annotated[float, Field(gt=0)] = 0.5


class Topology(_Strict):
    name: str = "topology"
    input: InputSpec = Field(default_factory=InputSpec)
    sources: PosInt = 1
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
        for i, f in enumerate(self.faults):
            kind, _, idx = f.kill.partition("-")
            limit = self.workers.count if kind == "worker" else self.sources
            if int(idx) >= limit:
                raise ValueError(f"faults.{i}.kill: {f.kill!r} does not exist ({kind}s: {limit})")
        for name in self.placement:
            kind, _, idx = name.partition("-")
            if kind != "worker" or not idx.isdigit() or int(idx) >= self.workers.count:
                raise ValueError(f"placement: {name!r} is not a worker of this topology")
        return self

    def input_path(self) -> Path | None:
        """The input file, resolved relative to the topology file's directory."""
        if self.input.path is None:
            return None
        p = Path(os.path.expanduser(self.input.path))
        return p if p.is_absolute() else (Path(self._base_dir) / p)

    def grouping_params(self) -> dict[str, Any]:
        return self.grouping.params()


# --------------------------------------------------------------------------- loading


def _format_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith("function-after"))
    msg = e["msg"].removeprefix("Value error, ")
    if _names_a_field(msg):
        return msg  # the validator already named the field
    got = e.get("input")
    if e["type"] == "extra_forbidden":
        return f"{loc}: unknown field (got {got!r})"
    if e["type"] == "missing":
        return f"{loc}: required field is missing"
    if isinstance(got, dict):
        return f"{loc}: {msg}" if loc else msg
    return f"{loc}: {msg} (got {got!r})" if loc else msg


def _names_a_field(msg: str) -> bool:
    head = msg.split(" ", 1)[0]
    return head.endswith(":") and head[:-1].split(".")[0] in Topology.model_fields


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
    except yaml.YAMLError:
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
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or "invalid YAML"
            raise TopologyError(f"{path}: malformed YAML{where}: {problem}") from None
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
    topo._base_dir = base_dir
    if check_input:
        check_input_exists(topo)
    return topo


def check_input_exists(topo: Topology) -> None:
    p = topo.input_path()
    if p is None:
        return
    if not p.exists():
        raise TopologyError(f"input.path: file not found (got {topo.input.path!r})")
    if p.is_file() and not os.access(p, os.R_OK):
        raise TopologyError(f"input.path: file is not readable (got {topo.input.path!r})")
