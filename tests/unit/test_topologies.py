"""Topologies validate with file and YAML path in every error; all shipped ones load."""

from __future__ import annotations

from pathlib import Path

import pytest

from wakeline.topology import TopologyInvalid, load_topology

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["embedded", "local-kafka", "compose"])
def test_shipped_topologies_load(name: str) -> None:
    topo = load_topology(ROOT / "topologies" / f"{name}.yaml")
    assert topo.name == name
    assert topo.topics.changes.partitions == topo.topics.stimuli.partitions, \
        "changes and stimuli are consumed together: they must be co-partitioned"


def test_unknown_key_names_file_and_path(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("name: x\ntopics:\n  changes: {name: c, partitions: 4, partitons: 2}\n")
    with pytest.raises(TopologyInvalid) as err:
        load_topology(p)
    assert f"{p}: topics.changes.partitons" in str(err.value)


def test_bad_values_and_unreadable_yaml(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("name: x\nbroker: {kind: rabbit}\n")
    with pytest.raises(TopologyInvalid, match="broker.kind"):
        load_topology(p)
    p.write_text("name: [unclosed\n")
    with pytest.raises(TopologyInvalid, match="cannot read topology"):
        load_topology(p)


def test_changes_and_stimuli_must_be_co_partitioned(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("name: x\ntopics:\n  changes: {name: c, partitions: 4}\n"
                 "  stimuli: {name: s, partitions: 8}\n")
    with pytest.raises(TopologyInvalid, match="same partition count"):
        load_topology(p)
