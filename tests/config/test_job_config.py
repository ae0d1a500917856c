"""The job file as one record: ``parse_job_config`` reads a path, a mapping or an OmegaConf object once into an
immutable ``JobConfig``, with the same errors as each section's own parser, and keeps what it does not read."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import hwplace
from hwplace.config.job_config import JobConfig, parse_job_config
from hwplace.config.loading import load_config
from hwplace.config.section import cluster_section, parse_cluster_config
from hwplace.config.weight_sync import SyncSpec, parse_weight_sync

TEXT = """\
cluster:
  num_nodes: 1
  component_placement: {trainer: 0, rollout: 1-2}
weight_sync:
  policy: {source: trainer, targets: [rollout]}
job: {entrypoint: job.py:main, steps: 5, layers: [1, 2]}
model: {lr: 0.1}
"""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    (tmp_path / "job.yaml").write_text(TEXT)
    return tmp_path / "job.yaml"


def test_a_path_a_mapping_and_an_omegaconf_object_parse_alike(path: Path) -> None:
    raw = load_config(path)
    job = parse_job_config(path)
    assert job.cluster == parse_cluster_config(raw["cluster"])
    assert job.weight_sync == (SyncSpec("policy", "trainer", ("rollout",), 0),)
    assert job.to_dict() == raw
    assert parse_job_config(raw) == job
    assert parse_job_config(OmegaConf.create(raw)) == job
    assert hwplace.parse_job_config is parse_job_config
    assert hwplace.JobConfig is JobConfig


def test_a_job_config_is_taken_as_it_is(path: Path) -> None:
    job = parse_job_config(path)
    assert parse_job_config(job) is job


def test_the_record_is_immutable(path: Path) -> None:
    job = parse_job_config(path)
    for field in ("cluster", "weight_sync", "raw"):
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{field}'"):
            setattr(job, field, None)
    with pytest.raises(TypeError, match="read-only"):
        job.raw["job"]["steps"] = 6  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        job.raw["extra"] = {}  # type: ignore[index]
    assert job.raw["job"]["layers"] == (1, 2)  # lists are kept as tuples
    with pytest.raises(TypeError, match="read-only"):
        job.cluster.components["trainer"] = None  # type: ignore[index]


def test_to_dict_gives_a_mutable_copy_of_its_own(path: Path) -> None:
    job = parse_job_config(path)
    plain = job.to_dict()
    plain["job"]["steps"] = 6
    plain["job"]["layers"].append(3)
    assert job.raw["job"] == {"entrypoint": "job.py:main", "steps": 5, "layers": (1, 2)}
    assert job.to_dict() == load_config(path)


def test_the_record_copies_the_mapping_it_was_given() -> None:
    raw: dict[str, Any] = {"cluster": {"num_nodes": 1}, "job": {"steps": [1]}}
    job = parse_job_config(raw)
    raw["job"]["steps"].append(2)
    assert job.raw["job"]["steps"] == (1,)


def test_sections_hwplace_does_not_read_are_kept_not_refused(path: Path) -> None:
    job = parse_job_config(path)
    assert set(job.raw) == {"cluster", "weight_sync", "job", "model"}
    assert job.raw["model"] == {"lr": 0.1}
    odd = parse_job_config({"cluster": {"num_nodes": 1}, "my_own_section": [1], 7: "a key that is no string"})
    assert (odd.raw["my_own_section"], odd.raw[7], odd.weight_sync) == ((1,), "a key that is no string", ())  # type: ignore[index]


def test_a_record_built_by_hand_needs_a_cluster_config() -> None:
    cluster = parse_cluster_config({"num_nodes": 1})
    assert JobConfig(cluster) == JobConfig(cluster, (), {})
    with pytest.raises(hwplace.ConfigError, match=r"^cluster: \{'num_nodes': 1\} is not a ClusterConfig"):
        JobConfig({"num_nodes": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("config", [
    {"job": {}},  # no cluster: section
    {"num_nodes": 1, "component_placement": {"a": 0}},  # the cluster: section itself
    {"cluster": {"num_nodes": 0}},
    {"cluster": {"num_nodes": 1, "component_placment": {}}},
    {"cluster": {"num_nodes": 1, "component_placement": {"a": 0}}, "weight_sync": ["p"]},
    {"cluster": {"num_nodes": 1, "component_placement": {"a": 0, "b": 1}},
     "weight_sync": {"p": {"source": "a", "targets": ["c"]}}},
    {"cluster": {"num_nodes": 1, "component_placement": {"a": 0, "b": 1}},
     "weight_sync": {"p": {"source": "a", "targets": ["b"], "sorce_rank": 1}}},
])
def test_each_mistake_is_the_error_its_sections_parser_raises(config: dict[str, Any]) -> None:
    def each_section() -> None:
        cluster = parse_cluster_config(cluster_section(config))
        parse_weight_sync(config.get("weight_sync"), list(cluster.components))

    with pytest.raises(hwplace.ConfigError, match=r"^(cluster|weight_sync)\b") as expected:
        each_section()
    with pytest.raises(hwplace.ConfigError, match=f"^{re.escape(str(expected.value))}$"):
        parse_job_config(config)


def test_the_cluster_section_is_checked_before_weight_sync() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^cluster\.num_nodes: "):
        parse_job_config({"cluster": {"num_nodes": 0}, "weight_sync": ["not", "a", "mapping"]})


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(hwplace.ConfigError, match="cannot read config file"):
        parse_job_config(tmp_path / "missing.yaml")


def test_the_file_is_read_and_each_section_parsed_once(path: Path, count_calls: Any) -> None:
    with count_calls(load_config, cluster_section, parse_weight_sync) as calls:
        parse_job_config(path)
    assert calls.of == {load_config: 1, cluster_section: 1, parse_weight_sync: 1}
