"""The layering the README's Layout section describes, checked on the source:
``actors/`` is the only Ray layer; the core (``runtime/``) never imports Ray,
RayDP, Spark or ``actors`` outside its entry points, and those import an
engine only inside a function (the engine seam: ``runtime.engine``, with
``actors.engine.RayEngine`` behind it), so ``--check`` and ``--help`` never
load Ray; the grouping code is pure (numpy, numba, mmh3 and the standard
library, plus the core's own kernels)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "runtime"

#: engine layers: never imported by the core
ENGINE = {"ray", "raydp", "pyspark", "actors"}
#: entry points and the Spark reference (they start sessions or compare with
#: Spark's own answer); every other module of runtime/ is core
ENTRY_POINTS = {"runtime/run.py", "runtime/compare.py", "runtime/top.py", "runtime/api.py",
                "runtime/operators/reference.py"}
#: the command-line and Python entry points: each reaches the engine layer from
#: one function (the Spark reference may call pyspark from several)
COMMANDS = ("runtime/run.py", "runtime/compare.py", "runtime/api.py", "runtime/top.py")
#: what runtime/grouping may import
GROUPING_THIRD_PARTY = {"numpy", "numba", "llvmlite", "mmh3"}
GROUPING_FIRST_PARTY = {"runtime.grouping", "runtime.kernels", "runtime.hashing"}


def _absolute(node: ast.Import | ast.ImportFrom, package: tuple[str, ...]) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not node.level:
        return {str(node.module)}
    base = ".".join(package[: len(package) - node.level + 1])
    if node.module:
        return {f"{base}.{node.module}"}
    return {f"{base}.{a.name}" for a in node.names}  # from . import x: x is a module


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (also inside
    functions and ``TYPE_CHECKING`` blocks), as absolute dotted names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            out |= _absolute(node, package)
    return out


def engine_imports_by_function(path: Path) -> dict[str | None, set[str]]:
    """The engine modules ``path`` imports, by the top-level function (or class)
    whose body holds the import; ``None``: at module level."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out: dict[str | None, set[str]] = {}
    for top in tree.body:
        where = top.name if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef
                                       | ast.ClassDef) else None
        for node in ast.walk(top):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found = {m for m in _absolute(node, package) if m.split(".")[0] in ENGINE}
                if found:
                    out.setdefault(where, set()).update(found)
    return out


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


CORE = sorted(p for p in RUNTIME.rglob("*.py") if rel(p) not in ENTRY_POINTS)
GROUPING = sorted((RUNTIME / "grouping").glob("*.py"))


def test_the_module_lists_are_not_empty() -> None:
    assert len(CORE) > 20 and len(GROUPING) > 10
    for entry in ENTRY_POINTS:
        assert (ROOT / entry).exists(), entry
    assert set(COMMANDS) <= ENTRY_POINTS


@pytest.mark.parametrize("path", CORE, ids=rel)
def test_the_core_never_imports_an_engine(path: Path) -> None:
    bad = sorted(m for m in imports(path) if m.split(".")[0] in ENGINE)
    assert not bad, f"{rel(path)} imports {bad}: only actors/ and the entry points may"


def test_the_engine_seam_and_the_simulator_are_core() -> None:
    core = {rel(p) for p in CORE}
    assert "runtime/engine.py" in core
    sim = {rel(p) for p in (RUNTIME / "sim").rglob("*.py")}
    assert sim and sim <= core, sorted(sim - core)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_points_import_an_engine_only_inside_a_function(entry: str) -> None:
    found = engine_imports_by_function(ROOT / entry)
    assert None not in found, f"{entry} imports {sorted(found[None])} at module level"
    if entry in COMMANDS:
        assert len(found) <= 1, f"{entry} reaches the engine from {sorted(found)}: one only"


@pytest.mark.parametrize("path", GROUPING, ids=rel)
def test_grouping_code_is_pure(path: Path) -> None:
    stdlib = sys.stdlib_module_names
    bad = []
    for m in imports(path):
        top = m.split(".")[0]
        if top in stdlib or top == "__future__" or top in GROUPING_THIRD_PARTY:
            continue
        if any(m == p or m.startswith(p + ".") for p in GROUPING_FIRST_PARTY):
            continue
        bad.append(m)
    assert not bad, f"{rel(path)} imports {sorted(bad)}"


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    probe = tmp_path / "runtime" / "grouping" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("import numpy\n\ndef f():\n    import ray.util\n\n"
                     "from . import base\nfrom ..sim import engine\nfrom .. import jit\n")
    assert imports(probe, root=tmp_path) == {
        "numpy", "ray.util", "runtime.grouping.base", "runtime.sim", "runtime.jit"}


DATAFLOW = sorted((RUNTIME / "dataflow").glob("*.py"))


def _scheme_modules() -> set[str]:
    """The modules that implement a scheme (everything in runtime/grouping but
    the registry, the shared bases and what coordinated schemes share)."""
    shared = {"__init__", "base", "coordination", "signals", "fastmod"}
    return {f"runtime.grouping.{p.stem}" for p in (RUNTIME / "grouping").glob("*.py")
            if p.stem not in shared}


@pytest.mark.parametrize("path", DATAFLOW, ids=rel)
def test_the_dataflow_cores_import_no_scheme_and_no_engine(path: Path) -> None:
    """The cores are shared by both engines and every scheme: a scheme arrives
    as a grouping object, never as an import."""
    bad = sorted(m for m in imports(path)
                 if m.split(".")[0] in ENGINE or m in _scheme_modules())
    assert not bad, f"{rel(path)} imports {bad}"


def test_the_actors_are_thin() -> None:
    """The dataflow logic lives in runtime/dataflow/; the actors translate calls."""
    for name in ("source.py", "worker.py", "aggregator.py"):
        lines = len((ROOT / "actors" / name).read_text().splitlines())
        assert lines < 400, f"actors/{name}: {lines} lines"


def test_what_crosses_between_the_cores_is_frozen() -> None:
    """The messages between the cores and their settings are frozen dataclasses
    (or enums): both engines pass them as they are - Ray pickles them, the
    simulator shares them - so nobody may change one on its way."""
    for name in ("messages.py", "settings.py"):
        tree = ast.parse((RUNTIME / "dataflow" / name).read_text())
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        assert classes, name
        for cls in classes:
            if any(isinstance(b, ast.Attribute) and b.attr == "Enum" for b in cls.bases):
                continue
            frozen = [d for d in cls.decorator_list if isinstance(d, ast.Call)
                      and getattr(d.func, "id", None) == "dataclass"
                      and any(k.arg == "frozen" and getattr(k.value, "value", None) is True
                              for k in d.keywords)]
            assert frozen, f"runtime/dataflow/{name}: {cls.name} is not a frozen dataclass"
