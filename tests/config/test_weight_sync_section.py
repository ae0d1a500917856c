"""The ``weight_sync:`` section: its entries checked against the components, each mistake named, bucket sizes
included (the one rule ``WeightSync.create`` applies too)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import hwplace
from hwplace.config.weight_sync import SyncSpec, check_buckets, parse_weight_sync


def test_the_section_is_checked_against_the_components() -> None:
    components = ["trainer", "rollout"]
    assert parse_weight_sync({"policy": {"source": "trainer", "targets": "rollout"}}, components) == (
        SyncSpec("policy", "trainer", ("rollout",), 0),)
    assert parse_weight_sync(None, components) == ()
    for section, message in (
        ({"p": {"source": "trainr", "targets": ["rollout"]}}, "weight_sync.p.source: 'trainr' is not a component"),
        ({"p": {"source": "trainer", "targets": []}}, "weight_sync.p.targets: names at least one"),
        ({"p": {"source": "trainer", "targets": ["trainer"]}}, "includes the source"),
        ({"p": {"source": "trainer", "targets": ["rollout"], "sorce_rank": 1}}, "weight_sync.p.sorce_rank"),
        ({"p": {"source": "trainer", "targets": ["rollout"], "source_rank": -1}}, "source_rank"),
        (["p"], "weight_sync: is a mapping"),
    ):
        with pytest.raises(hwplace.ConfigError, match=message):
            parse_weight_sync(section, components)


def test_a_source_rank_and_several_targets_are_kept() -> None:
    components = ["trainer", "rollout", "critic"]
    section = {"policy": {"source": "trainer", "targets": ["rollout", "critic"], "source_rank": 2},
               "value": {"source": "critic", "targets": ["rollout"]}}
    assert parse_weight_sync(section, components) == (
        SyncSpec("policy", "trainer", ("rollout", "critic"), 2), SyncSpec("value", "critic", ("rollout",), 0))


def test_every_config_error_names_the_key_the_value_and_what_is_allowed() -> None:
    components = ["trainer", "rollout"]

    def entry(**keys: object) -> dict[str, object]:
        return {"p": {"source": "trainer", "targets": ["rollout"], **keys}}

    for section, message in (
        (["p"], "weight_sync: is a mapping of sync names to {source, targets} (got ['p'])"),
        ({"p": "trainer"}, "weight_sync.p: is a mapping with source and targets (got 'trainer'); "
                           "{source: trainer, targets: [rollout]}"),
        (entry(sorce_rank=1), "weight_sync.p.sorce_rank: is not a weight_sync key; source, targets, source_rank, "
                              "bucket_bytes, device_buckets; did you mean 'source_rank'?"),
        (entry(target="rollout"), "weight_sync.p.target: is not a weight_sync key; source, targets, source_rank, "
                                  "bucket_bytes, device_buckets; did you mean 'targets'?"),
        (entry(source="trainr"), "weight_sync.p.source: 'trainr' is not a component of component_placement; "
                                 "did you mean 'trainer'?; components: trainer, rollout"),
        (entry(source=3), "weight_sync.p.source: 3 is not a component of component_placement; "
                          "components: trainer, rollout"),
        ({"p": {"targets": ["rollout"]}}, "weight_sync.p.source: None is not a component of component_placement; "
                                          "components: trainer, rollout"),
        (entry(targets=[]), "weight_sync.p.targets: names at least one component (got [])"),
        (entry(targets=7), "weight_sync.p.targets: names at least one component (got 7)"),
        (entry(targets=["rollout", "rolout"]), "weight_sync.p.targets[1]: 'rolout' is not a component of "
                                               "component_placement; did you mean 'rollout'?; components: "
                                               "trainer, rollout"),
        (entry(targets=["rollout", "trainer"]), "weight_sync.p.targets: includes the source 'trainer'; "
                                                "other components"),
        (entry(source_rank=-1), "weight_sync.p.source_rank: is a rank of the source (got -1)"),
        (entry(source_rank=True), "weight_sync.p.source_rank: is a rank of the source (got True)"),
        (entry(source_rank="1"), "weight_sync.p.source_rank: is a rank of the source (got '1')"),
        (entry(source_rank=1.0), "weight_sync.p.source_rank: is a rank of the source (got 1.0)"),
    ):
        with pytest.raises(hwplace.ConfigError, match=re.escape(message)) as info:
            parse_weight_sync(section, components)
        assert str(info.value) == message


@pytest.mark.parametrize(("bucket_bytes", "device_buckets", "message"), [
    (0, 8, "bucket_bytes: is the size of one bucket (got 0); above 0 bytes"),
    (-1, 8, "bucket_bytes: is negative"),
    (True, 8, "bucket_bytes: is not an amount of memory"),
    ("64Mb", 8, "bucket_bytes: has an unknown unit 'Mb'"),
    (1.5, 8, "bucket_bytes: is a number without a unit"),
    (1024, 0, "device_buckets: is how many buckets the source keeps on a GPU it shares with a target (got 0); a "
              "whole number from 1 to 65536"),
    (1024, True, "device_buckets: .* (got True)"),
    (1024, 2.0, "device_buckets: .* (got 2.0)"),
    (1024, 70000, "device_buckets: .* (got 70000)"),
])
def test_bucket_sizes_out_of_bounds_are_refused_by_key(bucket_bytes: Any, device_buckets: Any, message: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_buckets(bucket_bytes, device_buckets)
    section = {"policy": {"source": "trainer", "targets": ["rollout"], "bucket_bytes": bucket_bytes,
                          "device_buckets": device_buckets}}
    with pytest.raises(hwplace.ConfigError, match="^weight_sync.policy." + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        parse_weight_sync(section, ["trainer", "rollout"])


def test_bucket_sizes_are_read_from_a_config_with_units() -> None:
    [spec] = parse_weight_sync({"p": {"source": "a", "targets": "b", "bucket_bytes": "16MiB", "device_buckets": 2}},
                               ["a", "b"])
    assert (spec.bucket_bytes, spec.device_buckets) == (16 * 2**20, 2)
    [spec] = parse_weight_sync({"p": {"source": "a", "targets": "b"}}, ["a", "b"])
    assert (spec.bucket_bytes, spec.device_buckets) == (64 * 2**20, 8)
