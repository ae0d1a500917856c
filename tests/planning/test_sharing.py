"""Which processes of different components share an accelerator (hwplace.planning.sharing), offline."""

from __future__ import annotations

import hwplace
from hwplace.planning.sharing import Share, accelerator_units, shared_accelerators

CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {
    "rollout,trainer": "0-1", "inference": "1-2", "big": "4-7:0-1", "eval": "5", "env": {"node_group": "node",
                                                                                       "placement": "0-1"}}}}


def test_colocated_components_share_their_accelerators_rank_by_rank() -> None:
    cluster = hwplace.testing.fake_cluster(CONFIG["cluster"], accelerators_per_node=4)
    plan = hwplace.ComponentPlacement(CONFIG, cluster)
    shares = shared_accelerators({name: plan.get_placements(name) for name in plan.components})
    kind = "fake-accelerator"
    assert shares[("trainer", 0)] == (Share(0, kind, 0, "rollout", 0),)
    assert shares[("trainer", 1)] == (Share(0, kind, 1, "inference", 0), Share(0, kind, 1, "rollout", 1))
    assert ("inference", 1) not in shares  # accelerator 2: its own
    assert shares[("big", 0)] == (Share(1, kind, 1, "eval", 0),)  # accelerators 0-1 of node 1
    assert shares[("eval", 0)] == (Share(1, kind, 1, "big", 0),)
    assert not any(name == "env" for name, _ in shares)  # a process on a node owns no accelerator
    assert str(shares[("trainer", 0)][0]) == "shares fake-accelerator 0 (node 0) with rollout rank 0"
    assert accelerator_units(plan.get_placements("big")[1]) == ((kind, 2), (kind, 3))
