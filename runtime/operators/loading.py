"""Loading a user's operator class from ``app.operator``.

Two spellings (docs/design.md):

- ``"module.path:ClassName"``: ``importlib.import_module``; the module must be
  importable from ``sys.path`` (PYTHONPATH) or from ``base_dir`` (the
  topology's directory), which is appended to ``sys.path`` for this (and kept,
  so that the module's own lazy imports and unpickling keep working).
- ``"path/to/file.py:ClassName"`` (absolute, or relative to ``base_dir``):
  loaded by location under a module name derived from the file's resolved
  path (``module_name_for``), registered in ``sys.modules``. Every process that
  loads the same file gets the same module name, so states and classes pickled
  in one process unpickle in another once it has loaded the operator (a
  ``BoundOperator`` made here pickles as "load the spec again", which does it).

Every problem is an ``OperatorError`` of one line naming the spec.

On a Ray cluster the user's code reaches every node through Ray's runtime
environment (``runtime_env_for``): a file is shipped as a module named
``module_name_for(path)`` (``py_modules``), so a node without the file imports
it under the very name every other process gives it; an importable module
outside the installed packages is shipped as its top-level package.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from runtime.operators.contract import (
    BoundOperator,
    OperatorError,
    check_operator_class,
    instantiate,
    one_line,
    spec_of,
)

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_FIELD = "app.operator"


def _fail(spec: str, message: str) -> OperatorError:
    return OperatorError(one_line(f"{_FIELD}: {spec}: {message}"))


def parse_spec(spec: str) -> tuple[str, str, bool]:
    """``(target, class_name, is_file)`` of ``"module:Class"`` / ``"file.py:Class"``."""
    if not isinstance(spec, str) or not spec.strip():
        raise OperatorError(f"{_FIELD}: expected 'module.path:ClassName' or "
                            f"'path/to/file.py:ClassName' (got {spec!r})")
    if ":" not in spec:
        raise _fail(spec, "expected 'module.path:ClassName' or 'path/to/file.py:ClassName' "
                          "(no ':' before the class name)")
    target, cls_name = (s.strip() for s in spec.rsplit(":", 1))
    if not _DOTTED.match(cls_name):
        raise _fail(spec, f"{cls_name!r} is not a class name")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if not target:
        raise _fail(spec, "missing the module or file before ':'")
    if not is_file and not _DOTTED.match(target):
        raise _fail(spec, f"{target!r} is neither a module path (a.b.c) nor a .py file")
    return target, cls_name, is_file


def module_name_for(path: str | Path) -> str:
    """The module name a file-path operator is loaded under: stable for a
    given resolved path, in every process (``_operator_<stem>_<sha1[:12]>``)."""
    p = Path(path).expanduser().resolve()
    stem = re.sub(r"\W", "_", p.stem) or "file"
    digest = hashlib.sha1(str(p).encode("utf-8")).hexdigest()[:12]
    return f"_operator_{stem}_{digest}"


def file_fingerprint(spec: str, base_dir: str | Path = ".") -> str | None:
    """What a process that loaded ``spec`` holds of it, when that can be told
    without importing anything: for a file-path spec, the file's resolved
    path and a digest of its bytes (``None`` if it cannot be read); for a
    module spec, ``None``. Two runs with the same fingerprint load the very
    same code, so a process of the first may serve the second
    (``actors.pool``)."""
    try:
        target, _, is_file = parse_spec(spec)
    except OperatorError:
        return None
    if not is_file:
        return None
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = Path(base_dir) / path
    try:
        path = path.resolve()
        data = path.read_bytes()
    except OSError:
        return None
    return f"{path}:{hashlib.sha1(data).hexdigest()}"


def _load_file(spec: str, target: str, base_dir: Path) -> ModuleType:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    path = path.resolve()
    name = module_name_for(path)
    if name not in sys.modules and importlib.util.find_spec(name) is not None:
        return importlib.import_module(name)  # shipped with the job (runtime_env_for)
    if not path.exists():
        raise _fail(spec, f"file not found: {path}")
    if not path.is_file():
        raise _fail(spec, f"not a file: {path}")
    if path.suffix != ".py":
        raise _fail(spec, f"not a .py file: {path}")
    cached = sys.modules.get(name)
    if cached is not None:
        return cached
    mspec = importlib.util.spec_from_file_location(name, path)
    if mspec is None or mspec.loader is None:  # pragma: no cover - .py always has a loader
        raise _fail(spec, f"cannot load {path}")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[name] = module  # before exec: dataclasses and pickle look it up
    try:
        mspec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise _import_failure(spec, str(path), e) from e
    return module


def _import_failure(spec: str, what: str, e: BaseException) -> OperatorError:
    if isinstance(e, SyntaxError):
        return _fail(spec, f"syntax error in {e.filename}:{e.lineno}: {e.msg}")
    if isinstance(e, ImportError):
        return _fail(spec, f"cannot import {what}: {type(e).__name__}: {e}")
    return _fail(spec, f"importing {what} raised {type(e).__name__}: {e}")


def _load_module(spec: str, target: str, base_dir: Path) -> ModuleType:
    base = str(base_dir.resolve())
    if base not in sys.path:
        sys.path.append(base)
    try:
        return importlib.import_module(target)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise _import_failure(spec, f"module {target!r}", e) from e


def _find_class(spec: str, module: ModuleType, cls_name: str, where: str) -> Any:
    obj: Any = module
    for part in cls_name.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if not hint:
                classes = [n for n in names if inspect.isclass(getattr(obj, n))
                           and getattr(getattr(obj, n), "__module__", None) == module.__name__]
                if classes:
                    hint = f" (classes there: {', '.join(sorted(classes)[:10])})"
            raise _fail(spec, f"no {part!r} in {where}{hint}")
        obj = getattr(obj, part)
    return obj


def load_operator(spec: str, base_dir: str | Path = ".") -> type:
    """The operator class named by ``spec``, checked (``check_operator_class``).

    Raises ``OperatorError`` (one line naming ``spec``) for a bad spec, a
    missing file, a module that cannot be imported (with the ImportError's
    message), a syntax error (file:line), a missing class (with a close name
    if any), a non-class, missing methods, a non-bool ``mergeable``.
    """
    target, cls_name, is_file = parse_spec(spec)
    base = Path(base_dir).expanduser()
    if is_file:
        module = _load_file(spec, target, base)
        where = str(Path(module.__file__ or target))
    else:
        module = _load_module(spec, target, base)
        where = f"module {target!r}"
    cls = _find_class(spec, module, cls_name, where)
    return check_operator_class(cls, spec)


def make_operator(spec: str, base_dir: str | Path = ".", params: Mapping[str, Any] | None = None,
                  columns: Iterable[str] | None = None) -> BoundOperator:
    """Load, instantiate with ``params`` and bind the operator ``spec``.

    ``columns``: the topology's ``app.columns`` (default: the class's own
    ``columns``, else none). The result pickles as this call (see module doc).
    """
    base = str(Path(base_dir).expanduser().resolve())
    cls = load_operator(spec, base)
    op = instantiate(cls, params, spec)
    cols = None if columns is None else tuple(columns)
    origin = (spec, base, dict(params or {}), cols)
    return BoundOperator(op, spec_of(op, spec, columns=cols), origin=origin)


def _installed(path: Path) -> bool:
    """Inside the interpreter's own or installed packages (present on every
    node that runs the same environment)."""
    roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return any(r in path.parents for r in roots) or "site-packages" in path.parts


def runtime_env_for(spec: str, base_dir: str | Path = ".") -> dict[str, Any]:
    """Ray ``runtime_env`` fields that bring the operator ``spec``'s code to
    every node: ``{"py_modules": [...]}``, or ``{}`` when nothing needs shipping
    (an installed module). Call after ``load_operator`` succeeded."""
    import atexit
    import shutil
    import tempfile

    target, _, is_file = parse_spec(spec)
    base = Path(base_dir).expanduser()
    if is_file:
        path = Path(target).expanduser()
        path = (path if path.is_absolute() else base / path).resolve()
        scratch = tempfile.mkdtemp(prefix="hs-operator-")
        # Ray packs the file when the job starts; the copy goes when this process ends
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        shipped = Path(scratch) / f"{module_name_for(path)}.py"
        shutil.copyfile(path, shipped)
        return {"py_modules": [str(shipped)]}
    top = target.split(".")[0]
    found = importlib.util.find_spec(top)
    if found is None or found.origin in (None, "built-in", "frozen"):
        return {}
    origin = Path(found.origin).resolve()
    if _installed(origin):
        return {}
    return {"py_modules": [str(origin.parent if found.submodule_search_locations else origin)]}


__all__ = ["load_operator", "make_operator", "module_name_for", "parse_spec", "runtime_env_for"]
