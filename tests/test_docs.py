"""The docs say what the repository has (issue 30): every markdown file a
tracked file names exists, the README's topology block is the file it names,
every live metric is in docs/monitoring.md, and the tools' help is true."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from runtime.reporting import live_metrics

ROOT = Path(__file__).resolve().parent.parent
#: a markdown file named in text: ``docs/design.md``, ``../README.md``
MD_REF = re.compile(r"(?<![\w/.:-])([\w/.-]+\.md)\b")
#: a markdown link's target: ``[algorithms](algorithms.md)``
MD_LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#[^)]*)?\)")


def _is_doc_citation(ref: str, path: Path) -> bool:
    """A path into the repository (``docs/x.md``, ``../README.md``) or a
    document's conventional upper-case name (``CHANGES.md``) - not a file a
    tool writes (``compare.md``, ``DIR/grid.md``, ``out/x.md``)."""
    if "/" in ref:
        first = ref.split("/", 1)[0]
        return first in ("..", ".") or (ROOT / first).is_dir() or (path.parent / first).is_dir()
    return ref[0].isupper()


def tracked(*suffixes: str) -> list[Path]:
    """The repository's tracked files (``git ls-files``; every file under the
    root when git is not there, e.g. in an unpacked archive)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True, timeout=30).stdout.decode()
        files = [ROOT / f for f in out.split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = [p for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts]
    return [p for p in files if p.suffix in suffixes and p.is_file()]


def missing_md_refs(path: Path, text: str) -> list[str]:
    """The markdown files ``text`` cites that exist neither from the
    repository's root nor from ``path``'s folder: markdown links, paths into
    the repository and upper-case names (``_is_doc_citation``). A URL is not a
    path (``MD_REF`` skips what follows ``/`` or ``:``)."""
    refs = [m.group(1) for m in MD_LINK.finditer(text) if "://" not in m.group(1)]
    refs += [m.group(1) for m in MD_REF.finditer(text) if _is_doc_citation(m.group(1), path)]
    return [ref for ref in dict.fromkeys(refs)
            if not ((ROOT / ref).exists() or (path.parent / ref).exists())]


def test_every_markdown_file_named_in_a_tracked_file_exists() -> None:
    """A user's clone has only the repository: a doc cited in a docstring, a
    comment or another doc must be in it."""
    bad = []
    for path in tracked(".py", ".md", ".yaml", ".yml", ".toml", ".txt"):
        if path.resolve() == Path(__file__).resolve():  # this file's examples name missing ones
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        bad += [f"{path.relative_to(ROOT)}: {ref}" for ref in missing_md_refs(path, text)]
    assert bad == []


def test_the_reference_check_can_fail(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    assert missing_md_refs(doc, "see NOTES.md and docs/nowhere.md, docs/design.md") == [
        "NOTES.md", "docs/nowhere.md"]
    assert missing_md_refs(doc, "[a](gone.md) [b](https://x.org/a.md) https://x.org/README.md "
                                "writes DIR/compare.md and grid.md") == ["gone.md"]
    assert missing_md_refs(ROOT / "docs" / "x.md", "[algorithms](algorithms.md#metrics)") == []


def _readme_topology_block() -> tuple[str, str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## A topology\n", 1)[1].split("\n## ", 1)[0]
    named = re.search(r"`(topologies/[\w.-]+\.yaml)`", section)
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert named and block, "README's 'A topology' section lost its file name or its block"
    return named.group(1), block.group(1)


def test_readme_topology_block_is_the_file_it_names() -> None:
    name, block = _readme_topology_block()
    assert yaml.safe_load(block) == yaml.safe_load((ROOT / name).read_text()), name


def test_every_live_metric_is_in_monitoring_md() -> None:
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    assert live_metrics.METRICS, "no metrics defined?"
    assert [m for m in live_metrics.METRICS if f"`{m}`" not in doc] == []
    readme = (ROOT / "README.md").read_text()
    assert "hetero_*" not in readme and "`hs_*`" in readme and "`ray_hs_*`" in readme


def test_python_requirement_matches_the_code() -> None:
    """The code uses ``datetime.UTC`` and ``typing.NotRequired`` (3.11)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["requires-python"] == ">=3.11,<3.13"


def _help(module: str) -> str:
    return subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True).stdout


@pytest.mark.parametrize("module, out_default", [
    ("runtime.run", "runs/<name>-<UTC timestamp>/"),
    ("runtime.compare", "runs/compare-<name>-<UTC timestamp>/"),
])
def test_help_states_out_default_and_that_check_runs_the_operator(module: str,
                                                                   out_default: str) -> None:
    text = " ".join(_help(module).split())
    assert f"(default {out_default}" in text
    assert "imports the module of app.operator" in text and "constructs the operator" in text
