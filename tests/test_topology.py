"""The topology loader: defaults, overrides, and one-line errors for bad input."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.topology import TopologyError, load_topology

TOPOLOGIES = sorted(Path(__file__).resolve().parent.parent.glob("topologies/*.yaml"))


def err(data: object, overrides: list[str] | None = None) -> str:
    with pytest.raises(TopologyError) as e:
        load_topology(data if isinstance(data, dict) else data, overrides)  # type: ignore[arg-type]
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_defaults_are_valid() -> None:
    t = load_topology({"grouping": {"scheme": "kg"}})
    assert t.workers.capacities() == [1.0] * t.workers.count
    assert t.input.generated


def test_shipped_topologies_are_found() -> None:
    """The next test is parametrized by a glob: an empty one would skip, not fail."""
    assert {"demo.yaml", "wordcount-hetero.yaml"} <= {p.name for p in TOPOLOGIES}


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_shipped_topologies_validate_with_their_input(path: Path) -> None:
    load_topology(path, check_input=True)  # raises TopologyError on any problem


@pytest.mark.parametrize(
    "data, field, value",
    [
        ({"workers": {"count": 2, "capacity": [1, 1, 1]}}, "workers.capacity", "3 values"),
        ({"workers": {"capacity": 0}}, "workers.capacity", "0"),
        ({"workers": {"capacity": [1, -0.5]}, "grouping": {"scheme": "kg"}}, "workers.capacity", "-0.5"),
        ({"workers": {"capacity": 2}}, "workers.capacity", "throttle"),
        ({"grouping": {"scheme": "nope"}}, "grouping.scheme", "'nope'"),
        ({"grouping": {"scheme": "kg", "epsilonn": 1}}, "grouping.epsilonn", "unknown parameter"),
        ({"wrkers": {"count": 1}}, "wrkers", "unknown field"),
        ({"workers": {"cnt": 1}}, "workers.cnt", "unknown field"),
        ({"workers": {"count": "eight"}}, "workers.count", "'eight'"),
        ({"workers": {"count": 0}}, "workers.count", "0"),
        ({"sources": 1.5}, "sources", "1.5"),
        ({"input": {"format": "parquet"}}, "input.path", "required"),
        ({"input": {"format": "xml", "path": "a"}}, "input.format", "'xml'"),
        ({"input": {"format": "parquet", "path": "a", "chunk_messages": 10}},
         "input.chunk_messages", "'parquet'"),
        ({"input": {"chunk_messages": 0}}, "input.chunk_messages", "0"),
        ({"faults": [{"at_s": 1, "kill": "worker-9"}]}, "faults.0.kill", "worker-9"),
        ({"faults": [{"at_s": 1, "kill": "node-1"}]}, "faults.0.kill", "node-1"),
        ({"workers": {"changes": [{"at_s": 1, "worker": 7, "capacity": 0.5}]}},
         "workers.changes.0.worker", "worker 7"),
        ({"run": {"batch": 0}}, "run.batch", "0"),
        ({"app": {"kind": "sort"}}, "app.kind", "'sort'"),
    ],
)
def test_bad_fields_are_named_with_their_value(data: dict, field: str, value: str) -> None:
    data.setdefault("grouping", {"scheme": "kg"})
    msg = err(data)
    assert msg.startswith(field), msg
    assert value in msg, msg


def test_overrides() -> None:
    t = load_topology({"grouping": {"scheme": "kg"}},
                      ["grouping.scheme=sg", "workers.count=8", "input.keys=7"])
    assert t.grouping.scheme == "sg" and t.workers.count == 8 and t.input.keys == 7
    assert err({"grouping": {"scheme": "kg"}}, ["workers.count=x"]).startswith("workers.count")
    assert err({}, ["noequals"]).startswith("--set")


def test_files(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("name: [unclosed\n")
    assert "malformed YAML at line" in err(str(p))
    p.write_text("- a list\n")
    assert "expected a mapping" in err(str(p))
    assert "not found" in err(str(tmp_path / "missing.yaml"))
    p.write_text(yaml.safe_dump({"grouping": {"scheme": "kg"},
                                 "input": {"format": "parquet", "path": "nope.parquet"}}))
    load_topology(p)  # existence is checked only on request (--check / run)
    with pytest.raises(TopologyError, match=r"^input.path: file not found"):
        load_topology(p, check_input=True)
    t = load_topology(p)
    assert t.input_path() == tmp_path / "nope.parquet"  # relative to the YAML file


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                     st.text(string.printable, max_size=8))
_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(st.sampled_from(["count", "capacity", "scheme", "format",
                                                          "path", "at_s", "kill", "batch", "x"]),
                                         c, max_size=3), max_leaves=8)
_fields = st.sampled_from(["name", "input", "sources", "workers", "grouping", "app", "faults",
                           "placement", "run", "bogus"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_fields, _values, max_size=5))
def test_fuzzed_topologies_never_raise_anything_but_topology_error(data: dict) -> None:
    try:
        load_topology(data)
    except TopologyError as e:
        assert str(e) and "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_fuzzed_yaml_text(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    p = tmp_path_factory.mktemp("fz") / "t.yaml"
    p.write_text(text, encoding="utf-8")
    try:
        load_topology(p)
    except TopologyError as e:
        assert "\n" not in str(e)


def test_another_schemes_parameter_is_refused_naming_the_schemes_that_take_it() -> None:
    """``theta`` under acg used to be ignored silently (issue 30)."""
    with pytest.raises(TopologyError) as e:
        load_topology({"grouping": {"scheme": "acg"}}, ["grouping.theta=0.5"])
    assert str(e.value) == ("grouping.theta: not a parameter of scheme 'acg', it would be ignored "
                            "(taken by dchoices, fish, wchoices; for them write "
                            "grouping.dchoices.theta)")
    with pytest.raises(TopologyError, match=r"^grouping.epoch: not a parameter of scheme 'cg'"):
        load_topology({"grouping": {"scheme": "cg", "epoch": 100}})
    # a scheme's block: only its own parameters, each checked
    with pytest.raises(TopologyError, match=r"^grouping.fish.eps: unknown parameter for scheme "
                                            r"'fish'"):
        load_topology({"grouping": {"scheme": "cg", "fish": {"eps": 1}}})
    with pytest.raises(TopologyError, match=r"^grouping.fish: expected a mapping"):
        load_topology({"grouping": {"scheme": "cg", "fish": 3}})
    with pytest.raises(TopologyError, match=r"^grouping.fish.epoch: must be an int"):
        load_topology({"grouping": {"scheme": "cg", "fish": {"epoch": -1}}},
                      ["grouping.scheme=fish"])


def test_switching_the_scheme_drops_the_files_own_parameters_and_uses_the_block() -> None:
    doc = {"grouping": {"scheme": "cg", "virtual_per_worker": 5, "eps": 0.1,
                        "fish": {"epoch": 100}}}
    t = load_topology(doc)
    assert t.grouping_params() == {"virtual_per_worker": 5, "eps": 0.1}
    assert t.grouping.ignored_params() == ["fish.epoch"]
    t = load_topology(doc, ["grouping.scheme=kg"])
    assert t.grouping_params() == {}
    assert t.grouping.ignored_params() == ["eps", "fish.epoch", "virtual_per_worker"]
    t = load_topology(doc, ["grouping.scheme=fish", "grouping.fish.decay=0.25"])
    assert t.grouping_params() == {"epoch": 100, "decay": 0.25}
    # chbl and acg take eps too, but the file's eps was written for cg: dropped
    t = load_topology(doc, ["grouping.scheme=chbl"])
    assert t.grouping_params() == {}
    assert t.grouping.ignored_params() == ["eps", "fish.epoch", "virtual_per_worker"]
    t = load_topology(doc, ["grouping.scheme=acg", "grouping.eps=3"])  # unless given again
    assert t.grouping_params() == {"eps": 3}
    assert doc["grouping"]["scheme"] == "cg"  # the caller's dict is left alone
    # a parameter set on the command line must be the running scheme's
    with pytest.raises(TopologyError, match=r"^grouping.virtual_per_worker: not a parameter"):
        load_topology(doc, ["grouping.scheme=kg", "grouping.virtual_per_worker=3"])


@pytest.mark.parametrize("text", ["sources: !!int\n", "sources: !!int ''\n", "sources: !!float x\n",
                                  "name: !!timestamp 2020-13-45\n", "sources: !!bool\n"])
def test_badly_tagged_yaml_values_are_malformed_yaml(tmp_path: Path, text: str) -> None:
    """PyYAML's constructors raise IndexError/KeyError/ValueError for these, not YAMLError."""
    p = tmp_path / "t.yaml"
    p.write_text(text)
    with pytest.raises(TopologyError, match="malformed YAML") as e:
        load_topology(p)
    assert "\n" not in str(e.value)
    # as a --set value the text is taken literally, then validated
    with pytest.raises(TopologyError, match="sources"):
        load_topology({}, ["sources=!!int"])
