"""The weight-sync plan from placements alone (no Ray): the transport to each target rank."""

from __future__ import annotations

import pytest

import hwplace
from hwplace.planning.sync_plan import SyncTarget, plan_sync, relayed, relays, transport

CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {
    "trainer": "0-1", "rollout": "0-1,3,4", "cpu": {"node_group": "node", "placement": "0-1"}}}}


@pytest.fixture(scope="module")
def plan() -> hwplace.ComponentPlacement:
    cluster = hwplace.testing.fake_cluster(CONFIG["cluster"], accelerators_per_node=4)
    return hwplace.ComponentPlacement(CONFIG, cluster)


def test_transports_follow_the_placements(plan: hwplace.ComponentPlacement) -> None:
    source = plan.get_placements("trainer")[1]
    assert plan_sync(source, {"rollout": plan.get_placements("rollout")}) == (
        SyncTarget("rollout", 0, 0, "same-node"), SyncTarget("rollout", 1, 0, "same-device"),
        SyncTarget("rollout", 2, 0, "same-node"), SyncTarget("rollout", 3, 1, "other-node", ("rollout", 3)))


def test_each_other_node_has_one_relay_its_first_target_rank() -> None:
    config = {"num_nodes": 3, "component_placement": {"trainer": "0", "rollout": "1-3,4-6,8-9", "critic": "5,10"}}
    cluster = hwplace.testing.fake_cluster(config, accelerators_per_node=4)
    plan = hwplace.ComponentPlacement({"cluster": config}, cluster)
    targets = plan_sync(plan.get_placements("trainer")[0], {g: plan.get_placements(g) for g in ("rollout", "critic")})
    assert relays(targets) == {1: ("rollout", 3), 2: ("rollout", 6)}
    assert [(t.group, t.rank, t.relay) for t in targets if t.node == 1] == [
        ("rollout", 3, ("rollout", 3)), ("rollout", 4, ("rollout", 3)), ("rollout", 5, ("rollout", 3)),
        ("critic", 0, ("rollout", 3))]
    assert [t.relay for t in targets if t.node == 0] == [None, None, None]
    assert [(t.group, t.rank) for t in relayed(targets, ("rollout", 6))] == [("rollout", 7), ("critic", 1)]
    assert [t.direct for t in targets] == [True, True, True, True, False, False, True, False, False, False]


def test_processes_without_accelerators_share_no_accelerator(plan: hwplace.ComponentPlacement) -> None:
    cpu = plan.get_placements("cpu")
    assert [transport(cpu[0], p) for p in cpu] == ["same-node", "other-node"]
    assert transport(plan.get_placements("trainer")[0], cpu[0]) == "same-node"


def test_accelerator_0_is_shared_like_any_other(plan: hwplace.ComponentPlacement) -> None:
    trainer, rollout = plan.get_placements("trainer"), plan.get_placements("rollout")
    assert (trainer[0].local_accelerator_id, rollout[0].local_accelerator_id) == (0, 0)
    assert transport(trainer[0], rollout[0]) == "same-device"
    assert transport(rollout[0], trainer[0]) == "same-device"
    assert transport(trainer[0], rollout[1]) == "same-node"
