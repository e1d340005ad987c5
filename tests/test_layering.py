"""The layering the README's Layout section describes, checked on the source:
``actors/`` is the only Ray layer; the core (``runtime/``) never imports Ray,
RayDP, Spark or ``actors`` outside its entry points; the grouping code is pure
(numpy, numba, mmh3 and the standard library, plus the core's own kernels)."""

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
#: what runtime/grouping may import
GROUPING_THIRD_PARTY = {"numpy", "numba", "llvmlite", "mmh3"}
GROUPING_FIRST_PARTY = {"runtime.grouping", "runtime.jit", "runtime.hashing",
                        "runtime.sketches", "runtime.signals"}


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (also inside
    functions and ``TYPE_CHECKING`` blocks), as absolute dotted names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if not node.level:
                out.add(str(node.module))
                continue
            base = ".".join(package[: len(package) - node.level + 1])
            if node.module:
                out.add(f"{base}.{node.module}")
            else:  # from . import x: x is a module of the package
                out.update(f"{base}.{a.name}" for a in node.names)
    return out


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


CORE = sorted(p for p in RUNTIME.rglob("*.py") if rel(p) not in ENTRY_POINTS)
GROUPING = sorted((RUNTIME / "grouping").glob("*.py"))


def test_the_module_lists_are_not_empty() -> None:
    assert len(CORE) > 20 and len(GROUPING) > 10
    for entry in ENTRY_POINTS:
        assert (ROOT / entry).exists(), entry


@pytest.mark.parametrize("path", CORE, ids=rel)
def test_the_core_never_imports_an_engine(path: Path) -> None:
    bad = sorted(m for m in imports(path) if m.split(".")[0] in ENGINE)
    assert not bad, f"{rel(path)} imports {bad}: only actors/ and the entry points may"


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
