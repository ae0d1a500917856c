"""The weight-sync plan from placements alone (no Ray): transports, and the config's weight_sync: section."""

from __future__ import annotations

import re

import pytest

import hwplace
from hwplace.planning.sync_plan import SyncSpec, SyncTarget, parse_weight_sync, plan_sync, transport

CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {
    "trainer": "0-1", "rollout": "0-1,3,4", "cpu": {"node_group": "node", "placement": "0-1"}}}}


@pytest.fixture(scope="module")
def plan() -> hwplace.ComponentPlacement:
    cluster = hwplace.testing.fake_cluster(CONFIG["cluster"], accelerators_per_node=4)
    return hwplace.ComponentPlacement(CONFIG, cluster)


def test_transports_follow_the_placements(plan: hwplace.ComponentPlacement) -> None:
    source = plan.get_placements("trainer")[1]
    assert plan_sync(source, {"rollout": plan.get_placements("rollout")}) == (
        SyncTarget("rollout", 0, 0, "object-store"), SyncTarget("rollout", 1, 0, "shared-memory"),
        SyncTarget("rollout", 2, 0, "object-store"), SyncTarget("rollout", 3, 1, "broadcast"))


def test_processes_without_accelerators_share_no_accelerator(plan: hwplace.ComponentPlacement) -> None:
    cpu = plan.get_placements("cpu")
    assert [transport(cpu[0], p) for p in cpu] == ["object-store", "broadcast"]
    assert transport(plan.get_placements("trainer")[0], cpu[0]) == "object-store"


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


def test_accelerator_0_is_shared_like_any_other(plan: hwplace.ComponentPlacement) -> None:
    trainer, rollout = plan.get_placements("trainer"), plan.get_placements("rollout")
    assert (trainer[0].local_accelerator_id, rollout[0].local_accelerator_id) == (0, 0)
    assert transport(trainer[0], rollout[0]) == "shared-memory"
    assert transport(rollout[0], trainer[0]) == "shared-memory"
    assert transport(trainer[0], rollout[1]) == "object-store"


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
        (entry(sorce_rank=1), "weight_sync.p.sorce_rank: is not a weight_sync key; source, targets, source_rank; "
                              "did you mean 'source_rank'?"),
        (entry(target="rollout"), "weight_sync.p.target: is not a weight_sync key; source, targets, source_rank; "
                                  "did you mean 'targets'?"),
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
