"""The weight-sync plan from placements alone (no Ray): transports, and the config's weight_sync: section."""

from __future__ import annotations

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
