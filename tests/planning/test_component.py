"""Strategies, the Placement record and ComponentPlacement (SPEC sections 2-4), offline on fake clusters."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import pytest

import hwplace
from hwplace.config.section import cluster_section
from hwplace.config.weight_sync import SyncSpec
from hwplace.testing import backend_plugin, fake_cluster, registered_plugin

ROBOT_GROUP = {
    "label": "robot",
    "node_ranks": 1,
    "hardware": {
        "type": "fake-robot",
        "configs": [{"node_rank": 1, "name": "arm0"}, {"node_rank": 1, "unhealthy": "motor overheated"}],
    },
}


def cluster_of(counts: list[int] | int, num_nodes: int | None = None, **section: Any) -> hwplace.Cluster:
    nodes = num_nodes if num_nodes is not None else (len(counts) if isinstance(counts, list) else 1)
    return fake_cluster({"num_nodes": nodes, **section}, accelerators_per_node=counts)


def resources(placements: list[hwplace.Placement]) -> list[tuple[int, list[int]]]:
    """(node_rank, local_hardware_ranks) of each placement, in order."""
    return [(p.node_rank, list(p.local_hardware_ranks)) for p in placements]


def place(section: dict[str, Any], cluster: hwplace.Cluster) -> hwplace.ComponentPlacement:
    return hwplace.ComponentPlacement({"cluster": section}, cluster)


# -- PackedPlacementStrategy -------------------------------------------------------------------------


def test_packed_is_contiguous() -> None:
    placements = hwplace.PackedPlacementStrategy(0, 7).get_placement(cluster_of([8]))
    assert [p.rank for p in placements] == list(range(8))
    assert resources(placements) == [(0, [i]) for i in range(8)]


def test_packed_several_per_process() -> None:
    placements = hwplace.PackedPlacementStrategy(0, 7, num_accelerators_per_process=2).get_placement(cluster_of([8]))
    assert resources(placements) == [(0, [0, 1]), (0, [2, 3]), (0, [4, 5]), (0, [6, 7])]


def test_packed_stride_two_interleaves_inside_a_block() -> None:
    strategy = hwplace.PackedPlacementStrategy(0, 3, num_accelerators_per_process=2, stride=2)
    assert resources(strategy.get_placement(cluster_of([4]))) == [(0, [0, 2]), (0, [1, 3])]


def test_packed_stride_repeats_per_block() -> None:
    strategy = hwplace.PackedPlacementStrategy(0, 7, num_accelerators_per_process=2, stride=2)
    assert resources(strategy.get_placement(cluster_of([8]))) == [(0, [0, 2]), (0, [1, 3]), (0, [4, 6]), (0, [5, 7])]


def test_packed_stride_with_one_per_process() -> None:
    strategy = hwplace.PackedPlacementStrategy(0, 3, num_accelerators_per_process=1, stride=2)
    assert resources(strategy.get_placement(cluster_of([4]))) == [(0, [0]), (0, [1]), (0, [2]), (0, [3])]


def test_packed_starts_at_start() -> None:
    placements = hwplace.PackedPlacementStrategy(4, 7).get_placement(cluster_of([8]))
    assert resources(placements) == [(0, [4]), (0, [5]), (0, [6]), (0, [7])]
    assert [p.rank for p in placements] == [0, 1, 2, 3]


def test_packed_numbers_ids_node_by_node() -> None:
    placements = hwplace.PackedPlacementStrategy(0, 7, num_accelerators_per_process=2).get_placement(cluster_of([4, 4]))
    assert resources(placements) == [(0, [0, 1]), (0, [2, 3]), (1, [0, 1]), (1, [2, 3])]


def test_packed_ids_count_over_the_selected_group() -> None:
    cluster = cluster_of([4, 4], node_groups=[{"label": "late", "node_ranks": 1}])
    placements = hwplace.PackedPlacementStrategy(0, 3, node_group="late").get_placement(cluster)
    assert resources(placements) == [(1, [0]), (1, [1]), (1, [2]), (1, [3])]
    assert {p.node_group for p in placements} == {"late"}


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((0, 2), {"num_accelerators_per_process": 2}),  # 3 ids, blocks of 2
        ((0, 5), {"num_accelerators_per_process": 2, "stride": 2}),  # 6 ids, blocks of 4
        ((0, 4), {"stride": 2}),  # 5 ids, blocks of 2
    ],
)
def test_packed_rejects_ranges_that_do_not_split_into_blocks(args: tuple[int, int], kwargs: dict[str, Any]) -> None:
    with pytest.raises(hwplace.PlacementError, match="block"):
        hwplace.PackedPlacementStrategy(*args, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_accelerators_per_process": 0},
        {"num_accelerators_per_process": -2},
        {"stride": 0},
        {"stride": -1},
    ],
)
def test_packed_rejects_non_positive_sizes(kwargs: dict[str, Any]) -> None:
    with pytest.raises(hwplace.PlacementError, match="must be at least 1"):
        hwplace.PackedPlacementStrategy(0, 7, **kwargs)


def test_packed_rejects_negative_start() -> None:
    with pytest.raises(hwplace.PlacementError, match="start_accelerator_id"):
        hwplace.PackedPlacementStrategy(-1, 3)


def test_packed_rejects_end_below_start() -> None:
    with pytest.raises(hwplace.PlacementError, match="end_accelerator_id 1 is below start_accelerator_id 4"):
        hwplace.PackedPlacementStrategy(4, 1)


@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        ((True, 3), {}, "start_accelerator_id"),
        ((0, True), {}, "end_accelerator_id"),
        ((0, 3), {"num_accelerators_per_process": True}, "num_accelerators_per_process"),
        ((0, 3), {"stride": True}, "stride"),
        ((0, 3), {"stride": False}, "stride"),
        ((0.0, 3), {}, "start_accelerator_id"),
        (("0", 3), {}, "start_accelerator_id"),
    ],
)
def test_packed_rejects_bools_and_non_integers(args: tuple[Any, Any], kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(hwplace.PlacementError, match=name):
        hwplace.PackedPlacementStrategy(*args, **kwargs)


def test_packed_block_spanning_nodes_in_one_process_is_an_error() -> None:
    # 2 nodes of 3: the block 2-3 holds accelerator 2 of node 0 and accelerator 0 of node 1.
    strategy = hwplace.PackedPlacementStrategy(0, 5, num_accelerators_per_process=2)
    with pytest.raises(hwplace.PlacementError, match="node"):
        strategy.get_placement(cluster_of([3, 3]))


def test_packed_strided_block_spanning_nodes_is_an_error() -> None:
    # 2 nodes of 4: the block 2-5 with stride 2 gives process 0 ids [2, 4] on nodes 0 and 1.
    strategy = hwplace.PackedPlacementStrategy(2, 5, num_accelerators_per_process=2, stride=2)
    with pytest.raises(hwplace.PlacementError, match="node"):
        strategy.get_placement(cluster_of([4, 4]))


def test_packed_block_crossing_a_node_boundary_is_an_error_even_if_each_process_stays_on_one_node() -> None:
    # SPEC section 4: "a block that would cross a node boundary ... [is a] PlacementError".
    # 2 nodes of 1 accelerator, stride 2: the one block is ids 0-1, which crosses from node 0 to node 1.
    strategy = hwplace.PackedPlacementStrategy(0, 1, num_accelerators_per_process=1, stride=2)
    with pytest.raises(hwplace.PlacementError, match="node"):
        strategy.get_placement(cluster_of([1, 1]))


def test_packed_block_that_leaves_a_node_and_returns_is_an_error() -> None:
    # Groups a (node 0), b (node 1), c (node 0) each declare two robots of their own, numbered 2 + 2 + 2;
    # the block 1-4 starts and ends on node 0 but passes through node 1.
    def robots(label: str, rank: int) -> dict[str, Any]:
        configs = [{"node_rank": rank, "name": f"{label}{i}"} for i in range(2)]
        return {"label": label, "node_ranks": rank, "hardware": {"type": "fake-robot", "configs": configs}}

    cluster = cluster_of([0, 0], node_groups=[robots("a", 0), robots("b", 1), robots("c", 0)])
    strategy = hwplace.PackedPlacementStrategy(1, 4, stride=4, node_group=["a", "b", "c"])  # one id per process
    with pytest.raises(hwplace.PlacementError, match=r"crosses a node boundary \(nodes \[0, 1\]\)"):
        strategy.get_placement(cluster)


def test_groups_sharing_accelerators_cannot_be_selected_together() -> None:
    groups = [{"label": "a", "node_ranks": "0-1"}, {"label": "b", "node_ranks": 1}]
    cluster = cluster_of([2, 2], node_groups=groups)
    with pytest.raises(hwplace.PlacementError, match=r"groups 'a' and 'b' share fake-accelerator 0 of node 1"):
        hwplace.PackedPlacementStrategy(0, 5, node_group=["a", "b"]).get_placement(cluster)
    assert len(hwplace.PackedPlacementStrategy(0, 3, node_group="a").get_placement(cluster)) == 4


# -- FlexiblePlacementStrategy -----------------------------------------------------------------------


def test_flexible_keeps_process_order_and_sorts_ids() -> None:
    placements = hwplace.FlexiblePlacementStrategy([[3, 1], [0], [7, 5, 6]]).get_placement(cluster_of([8]))
    assert [p.rank for p in placements] == [0, 1, 2]
    assert resources(placements) == [(0, [1, 3]), (0, [0]), (0, [5, 6, 7])]
    assert [p.local_accelerator_id for p in placements] == [1, 0, 5]
    assert placements[0].visible_accelerators == (1, 3)


def test_flexible_never_mutates_its_input() -> None:
    inner = [[3, 1], [0], [7, 5, 6]]
    outer = list(inner)
    snapshot = copy.deepcopy(inner)
    strategy = hwplace.FlexiblePlacementStrategy(inner)
    strategy.get_placement(cluster_of([8]))
    strategy.get_placement(cluster_of([8]), isolate_accelerator=False)
    assert inner == snapshot
    assert all(a is b for a, b in zip(inner, outer, strict=True))


def test_flexible_never_mutates_tuples_or_shared_lists() -> None:
    shared = [2, 0]
    lists = (shared, (5, 4))
    snapshot = copy.deepcopy(lists)
    hwplace.FlexiblePlacementStrategy(lists).get_placement(cluster_of([8]))
    assert lists == snapshot
    assert shared == [2, 0]


def test_flexible_later_changes_to_the_input_do_not_leak_in() -> None:
    lists = [[0, 1], [2]]
    strategy = hwplace.FlexiblePlacementStrategy(lists)
    lists[0].append(5)
    lists.append([3])
    assert resources(strategy.get_placement(cluster_of([8]))) == [(0, [0, 1]), (0, [2])]


def test_flexible_numbers_ids_node_by_node() -> None:
    placements = hwplace.FlexiblePlacementStrategy([[5, 4], [0]]).get_placement(cluster_of([4, 4]))
    assert resources(placements) == [(1, [0, 1]), (0, [0])]
    assert [p.local_rank for p in placements] == [0, 0]


def test_flexible_duplicate_ids_are_an_error() -> None:
    with pytest.raises(hwplace.PlacementError, match="repeat") as info:
        hwplace.FlexiblePlacementStrategy([[0], [1, 2, 1]])
    assert info.value.rank == 1


def test_flexible_ids_on_two_nodes_are_an_error() -> None:
    strategy = hwplace.FlexiblePlacementStrategy([[0], [3, 4]])
    with pytest.raises(hwplace.PlacementError, match="one node") as info:
        strategy.get_placement(cluster_of([4, 4]))
    assert info.value.rank == 1


def test_flexible_ids_beyond_the_group_are_an_error() -> None:
    strategy = hwplace.FlexiblePlacementStrategy([[0], [8]])
    with pytest.raises(hwplace.PlacementError, match="8"):
        strategy.get_placement(cluster_of([8]))


def test_flexible_on_a_node_kind_group_holds_one_node_per_process() -> None:
    cluster = cluster_of([0, 0])
    placements = hwplace.FlexiblePlacementStrategy([[1], [0]], node_group="node").get_placement(cluster)
    assert [(p.node_rank, p.hardware_type) for p in placements] == [(1, "node"), (0, "node")]
    with pytest.raises(hwplace.PlacementError, match="one node"):
        hwplace.FlexiblePlacementStrategy([[0, 1]], node_group="node").get_placement(cluster)


@pytest.mark.parametrize("lists", [[], [[]], [[0], []], [[-1]], [[True]], [["0"]], "01", [0, 1], [[0.0]]])
def test_flexible_rejects_malformed_lists(lists: Any) -> None:
    with pytest.raises(hwplace.PlacementError, match=r"accelerator_id_lists|accelerator ids|not an accelerator id"):
        hwplace.FlexiblePlacementStrategy(lists)


# -- NodePlacementStrategy ---------------------------------------------------------------------------


def test_node_strategy_allows_repeats_and_sees_all_accelerators() -> None:
    cluster = cluster_of([4, 4])
    placements = hwplace.NodePlacementStrategy([0, 0, 1]).get_placement(cluster)
    assert [p.node_rank for p in placements] == [0, 0, 1]
    assert [p.local_rank for p in placements] == [0, 1, 0]
    assert [p.local_world_size for p in placements] == [2, 2, 1]
    for p in placements:
        assert p.visible_accelerators == (0, 1, 2, 3)
        assert p.local_accelerator_id == -1
        assert p.hardware_type == "node"
        assert p.node_group == "node"
        assert p.env == {}


def test_node_strategy_sees_all_accelerators_when_not_isolated_too() -> None:
    placements = hwplace.NodePlacementStrategy([1]).get_placement(cluster_of([2, 3]), isolate_accelerator=False)
    assert placements[0].visible_accelerators == (0, 1, 2)
    assert placements[0].isolate_accelerator is False


def test_node_strategy_on_nodes_without_accelerators() -> None:
    placements = hwplace.NodePlacementStrategy([0, 1]).get_placement(cluster_of([0, 0]))
    assert [p.visible_accelerators for p in placements] == [(), ()]


def test_node_strategy_counts_over_the_selected_group() -> None:
    cluster = cluster_of([2, 2, 2], node_groups=[{"label": "tail", "node_ranks": "1-2"}])
    placements = hwplace.NodePlacementStrategy([0, 1, 1], node_group="tail").get_placement(cluster)
    assert [p.node_rank for p in placements] == [1, 2, 2]
    assert [p.node_id for p in placements] == ["fake-node-1", "fake-node-2", "fake-node-2"]


def test_node_strategy_counts_group_after_group() -> None:
    cluster = cluster_of([0, 0, 0], node_groups=[{"label": "a", "node_ranks": 2}, {"label": "b", "node_ranks": "0-1"}])
    placements = hwplace.NodePlacementStrategy([0, 1, 2], node_group=["a", "b"]).get_placement(cluster)
    assert [p.node_rank for p in placements] == [2, 0, 1]
    assert [p.node_group for p in placements] == ["a", "b", "b"]


def test_node_strategy_index_beyond_the_group_is_an_error() -> None:
    cluster = cluster_of([0, 0, 0], node_groups=[{"label": "tail", "node_ranks": "1-2"}])
    with pytest.raises(hwplace.PlacementError, match=r"process 0 asks for resource 2, but group 'tail' has 2 nodes"):
        hwplace.NodePlacementStrategy([2], node_group="tail").get_placement(cluster)


@pytest.mark.parametrize("ranks", [[], [-1], [True], ["0"], "0", [0.0]])
def test_node_strategy_rejects_malformed_ranks(ranks: Any) -> None:
    with pytest.raises(hwplace.PlacementError, match=r"node_ranks must be a non-empty list|is not a node index"):
        hwplace.NodePlacementStrategy(ranks)


# -- the Placement record ----------------------------------------------------------------------------


def test_placement_fields_isolated() -> None:
    cluster = cluster_of([4, 4])
    placements = hwplace.PackedPlacementStrategy(0, 7, num_accelerators_per_process=2).get_placement(cluster)
    p = placements[3]
    assert p.rank == 3
    assert p.node_rank == 1
    assert p.node_id == cluster.nodes[1].node_id
    assert p.local_accelerator_id == 2
    assert p.local_rank == 1
    assert p.local_world_size == 2
    assert p.visible_accelerators == (2, 3)
    assert p.isolate_accelerator is True
    assert p.local_hardware_ranks == (2, 3)
    assert p.hardware_type == "fake-accelerator"
    assert p.node_group == "cluster"
    assert p.env == {"FAKE_VISIBLE_DEVICES": "2,3"}


def test_placement_fields_not_isolated() -> None:
    cluster = cluster_of([4, 4])
    placements = hwplace.PackedPlacementStrategy(0, 7, num_accelerators_per_process=2).get_placement(
        cluster, isolate_accelerator=False
    )
    p = placements[3]
    assert p.isolate_accelerator is False
    assert p.visible_accelerators == (0, 1, 2, 3)  # all of the node's
    assert p.local_hardware_ranks == (2, 3)  # still its own
    assert p.local_accelerator_id == 2
    assert set(p.env["FAKE_VISIBLE_DEVICES"].split(",")) == {"0", "1", "2", "3"}


def test_placement_types_match_the_spec() -> None:
    p = hwplace.PackedPlacementStrategy(0, 1).get_placement(cluster_of([2]))[1]
    assert isinstance(p.visible_accelerators, tuple)
    assert all(isinstance(i, int) for i in p.visible_accelerators)
    assert isinstance(p.local_hardware_ranks, tuple)
    assert isinstance(p.env, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in p.env.items())


def test_local_rank_counts_only_this_strategys_processes_per_node() -> None:
    placements = hwplace.FlexiblePlacementStrategy([[4], [0], [5], [1], [6]]).get_placement(cluster_of([4, 4]))
    assert [p.node_rank for p in placements] == [1, 0, 1, 0, 1]
    assert [p.local_rank for p in placements] == [0, 0, 1, 1, 2]
    assert [p.local_world_size for p in placements] == [3, 2, 3, 2, 3]


def test_robot_placement_fields() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [ROBOT_GROUP],
        "component_placement": {"env": {"node_group": "robot", "placement": "0:0-1"}},
    }
    cluster = fake_cluster(section, accelerators_per_node=2)
    placements = place(section, cluster).get_placements("env")
    assert len(placements) == 2
    for local_rank, p in enumerate(placements):
        assert p.node_rank == 1
        assert p.node_id == "fake-node-1"
        assert p.hardware_type == "fake-robot"
        assert p.node_group == "robot"
        assert p.local_hardware_ranks == (0,)
        assert p.local_accelerator_id == -1
        assert p.local_rank == local_rank
        assert p.local_world_size == 2
        # Isolated, a robot process owns no accelerator: the node's accelerators are hidden from it.
        assert p.visible_accelerators == ()
        assert p.env == {"FAKE_ROBOTS": "arm0", "FAKE_VISIBLE_DEVICES": ""}  # a robot is known by its name
    shared = place(section, cluster).get_strategy("env").get_placement(cluster, isolate_accelerator=False)
    assert [(p.visible_accelerators, p.env) for p in shared] == [((0, 1), {"FAKE_ROBOTS": "arm0"})] * 2


# -- ComponentPlacement ------------------------------------------------------------------------------


def full_section(num_nodes: int = 2) -> dict[str, Any]:
    return {
        "num_nodes": num_nodes,
        "node_groups": [{"label": "gpu", "node_ranks": "all"}, ROBOT_GROUP],
        "component_placement": {
            "actor,inference": "0-7",
            "rollout": "0-3:0-7",
            "env": {"node_group": "robot", "placement": 0},
            "agent": {"node_group": "node", "placement": "0-1:0-3"},
        },
    }


@pytest.fixture
def full() -> tuple[hwplace.ComponentPlacement, hwplace.Cluster]:
    section = full_section()
    cluster = fake_cluster(section, accelerators_per_node=4)
    return place(section, cluster), cluster


def test_components_in_config_order(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster]) -> None:
    placement, _ = full
    assert placement.components == ["actor", "inference", "rollout", "env", "agent"]


def test_world_sizes(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster]) -> None:
    placement, _ = full
    assert [placement.get_world_size(n) for n in placement.components] == [8, 8, 8, 1, 4]


def test_strategy_kinds(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster]) -> None:
    placement, _ = full
    for name in ("actor", "inference", "rollout", "env"):
        assert isinstance(placement.get_strategy(name), hwplace.FlexiblePlacementStrategy)
    assert isinstance(placement.get_strategy("agent"), hwplace.NodePlacementStrategy)


def test_strategies_reproduce_the_placements(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster]) -> None:
    placement, cluster = full
    for name in placement.components:
        assert placement.get_strategy(name).get_placement(cluster) == placement.get_placements(name)


def test_node_group_example_through_component_placement(
    full: tuple[hwplace.ComponentPlacement, hwplace.Cluster],
) -> None:
    placement, _ = full
    agent = placement.get_placements("agent")
    assert [p.node_rank for p in agent] == [0, 0, 1, 1]
    assert [p.local_rank for p in agent] == [0, 1, 0, 1]
    assert all(p.visible_accelerators == (0, 1, 2, 3) for p in agent)


def test_two_processes_per_accelerator(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster]) -> None:
    placement, _ = full
    assert resources(placement.get_placements("rollout")) == [
        (0, [0]),
        (0, [0]),
        (0, [1]),
        (0, [1]),
        (0, [2]),
        (0, [2]),
        (0, [3]),
        (0, [3]),
    ]


def test_yaml_integer_placement_of_a_robot(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster]) -> None:
    placement, _ = full
    [p] = placement.get_placements("env")
    assert (p.node_rank, p.hardware_type, p.local_hardware_ranks) == (1, "fake-robot", (0,))


def test_shared_key_gives_independent_copies(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster]) -> None:
    placement, _ = full
    actor, inference = placement.get_placements("actor"), placement.get_placements("inference")
    assert actor == inference
    assert placement.get_strategy("actor") is not placement.get_strategy("inference")
    assert all(a is not b for a, b in zip(actor, inference, strict=True))
    with pytest.raises(TypeError, match="read-only"):
        actor[0].env["FAKE_VISIBLE_DEVICES"] = "changed"
    with pytest.raises(AttributeError, match="append"):
        actor[0].visible_accelerators.append(99)  # type: ignore[attr-defined]
    fresh = placement.get_placements("inference")[0]
    assert fresh.env == {"FAKE_VISIBLE_DEVICES": "0"}
    assert fresh.visible_accelerators == (0,)


def test_yaml_file_config(tmp_path: Any) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 3\n    rollout: ' 0 - 1 : 0 - 3 '\n")
    placement = hwplace.ComponentPlacement(str(path), cluster_of([4]))
    assert resources(placement.get_placements("actor")) == [(0, [3])]
    assert resources(placement.get_placements("rollout")) == [(0, [0]), (0, [0]), (0, [1]), (0, [1])]


def test_multi_group_numbering() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [
            {"label": "gpu", "node_ranks": 0},
            {**ROBOT_GROUP, "hardware": {"type": "fake-robot", "configs": [{"node_rank": 1}, {"node_rank": 1}]}},
        ],
        "component_placement": {
            "mixed": {"node_group": ["gpu", "robot"], "placement": "1-3"},
            "reverse": {"node_group": "robot, gpu", "placement": "1-2"},
        },
    }
    cluster = fake_cluster(section, accelerators_per_node=[2, 2])
    placement = place(section, cluster)
    mixed = placement.get_placements("mixed")
    assert [(p.node_rank, p.hardware_type, list(p.local_hardware_ranks), p.node_group) for p in mixed] == [
        (0, "fake-accelerator", [1], "gpu"),
        (1, "fake-robot", [0], "robot"),
        (1, "fake-robot", [1], "robot"),
    ]
    hidden = {"FAKE_VISIBLE_DEVICES": ""}  # robot processes own no accelerator of their node
    assert [p.env for p in mixed] == [
        {"FAKE_VISIBLE_DEVICES": "1"},
        {"FAKE_ROBOTS": "fake-robot-0"} | hidden,
        {"FAKE_ROBOTS": "fake-robot-1"} | hidden,
    ]
    reverse = placement.get_placements("reverse")
    assert [(p.node_rank, p.hardware_type, p.local_hardware_ranks) for p in reverse] == [
        (1, "fake-robot", (1,)),
        (0, "fake-accelerator", (0,)),
    ]


def test_a_process_may_not_mix_hardware_types() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [
            {"label": "gpu", "node_ranks": 1},
            {**ROBOT_GROUP, "hardware": {"type": "fake-robot", "configs": [{"node_rank": 1}]}},
        ],
        "component_placement": {"mixed": {"node_group": ["gpu", "robot"], "placement": "0,1-2:1"}},
    }
    cluster = fake_cluster(section, accelerators_per_node=[0, 2])
    with pytest.raises(hwplace.PlacementError, match="type") as info:
        place(section, cluster)
    assert info.value.component == "mixed"
    assert info.value.entry == "1-2:1"


def test_mixing_node_kind_and_hardware_kind_groups_is_an_error() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [{"label": "gpu", "node_ranks": "all"}],
        "component_placement": {"actor": {"node_group": ["gpu", "node"], "placement": "0-1"}},
    }
    cluster = fake_cluster(section, accelerators_per_node=2)
    with pytest.raises(hwplace.PlacementError, match="mixed") as info:
        place(section, cluster)
    assert info.value.component == "actor"


def test_mixing_node_kind_group_without_accelerators_is_an_error() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [{"label": "cpu", "node_ranks": 0}, {"label": "gpu", "node_ranks": 1}],
        "component_placement": {"actor": {"node_group": "gpu,cpu", "placement": "0"}},
    }
    cluster = fake_cluster(section, accelerators_per_node=[0, 2])
    with pytest.raises(hwplace.PlacementError, match="cannot be mixed in one node_group list"):
        place(section, cluster)


def test_a_process_holds_exactly_one_node() -> None:
    section = {"num_nodes": 2, "component_placement": {"agent": {"node_group": "node", "placement": "0-1:0"}}}
    with pytest.raises(hwplace.PlacementError, match="one node") as info:
        place(section, cluster_of([0, 0]))
    assert info.value.component == "agent"
    assert info.value.entry == "0-1:0"


class OtherAccelerator(hwplace.HardwareBackend):
    name = "test-other-accelerator"
    kind = "accelerator"

    def detect(self, configs: Any) -> list[hwplace.Device]:
        return []

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        return {"OTHER_VISIBLE": ",".join(str(d.index) for d in devices)}


def two_type_nodes() -> list[hwplace.Node]:
    def devices(count: int, model: str) -> tuple[hwplace.Device, ...]:
        return tuple(hwplace.Device(i, model) for i in range(count))

    return [
        hwplace.Node(
            0, "n0", "10.0.0.1", {"fake-accelerator": devices(2, "fake"), OtherAccelerator.name: devices(4, "other")}
        ),
        hwplace.Node(1, "n1", "10.0.0.2", {"fake-accelerator": devices(2, "fake")}),
    ]


def test_group_with_several_accelerator_types_is_a_config_error() -> None:
    with registered_plugin(backend_plugin(OtherAccelerator()), name="test-other-plugin"):
        section = {"num_nodes": 2, "component_placement": {"actor": "0-1"}}
        cluster = hwplace.Cluster(section, nodes=two_type_nodes())
        with pytest.raises(hwplace.ConfigError, match="accelerators of several types") as info:
            place(section, cluster)
        message = str(info.value)
        assert "fake-accelerator" in message
        assert OtherAccelerator.name in message
        assert "hardware.type" in message
        assert info.value.path == "cluster.node_groups"  # the reserved group 'cluster' cannot name a type


def test_configured_group_with_several_accelerator_types_names_its_hardware_key() -> None:
    with registered_plugin(backend_plugin(OtherAccelerator()), name="test-other-plugin"):
        section = {"num_nodes": 2, "node_groups": [{"label": "gpus", "node_ranks": "all"}],
                   "component_placement": {"actor": {"node_group": "gpus", "placement": "0-1"}}}
        cluster = hwplace.Cluster(section, nodes=two_type_nodes())
        with pytest.raises(hwplace.ConfigError, match=r"name the one to use in hardware\.type") as info:
            place(section, cluster)
        assert info.value.path == "cluster.node_groups[0].hardware.type"


def test_hardware_type_picks_one_accelerator_type() -> None:
    with registered_plugin(backend_plugin(OtherAccelerator()), name="test-other-plugin"):
        section = {
            "num_nodes": 2,
            "node_groups": [
                {"label": "other", "node_ranks": "all", "hardware": {"type": OtherAccelerator.name}},
                {"label": "fake", "node_ranks": "all", "hardware": {"type": "fake-accelerator"}},
            ],
            "component_placement": {
                "actor": {"node_group": "other", "placement": "0-3:0-1"},
                "critic": {"node_group": "fake", "placement": "1-2"},
            },
        }
        cluster = hwplace.Cluster(section, nodes=two_type_nodes())
        placement = place(section, cluster)
        actor = placement.get_placements("actor")
        assert [(p.node_rank, p.hardware_type, list(p.local_hardware_ranks)) for p in actor] == [
            (0, OtherAccelerator.name, [0, 1]),
            (0, OtherAccelerator.name, [2, 3]),
        ]
        assert [p.env for p in actor] == [{"OTHER_VISIBLE": "0,1"}, {"OTHER_VISIBLE": "2,3"}]
        critic = placement.get_placements("critic")
        assert [(p.node_rank, p.hardware_type, list(p.local_hardware_ranks)) for p in critic] == [
            (0, "fake-accelerator", [1]),
            (1, "fake-accelerator", [0]),
        ]


def with_detected_robots(section: dict[str, Any]) -> hwplace.Cluster:
    """A planned cluster whose node 1 carries what the fake-robot backend really detects there."""
    planned = fake_cluster(section, accelerators_per_node=0)
    robot_backend = planned.backend("fake-robot")
    assert robot_backend is not None
    detected = robot_backend.detect(planned.config.declared_configs(1)["fake-robot"])
    nodes = list(planned.nodes)
    nodes[1] = dataclasses.replace(nodes[1], hardware={**nodes[1].hardware, "fake-robot": tuple(detected)})
    return hwplace.Cluster(section, nodes=nodes)


def test_process_on_unhealthy_robot_is_an_error() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [ROBOT_GROUP],
        "component_placement": {"env": {"node_group": "robot", "placement": "0,1"}},
    }
    with pytest.raises(hwplace.PlacementError, match="which is unhealthy") as info:
        place(section, with_detected_robots(section))
    exc = info.value
    assert exc.component == "env"
    assert exc.entry == "1"
    assert exc.rank == 1
    assert "motor overheated" in str(exc)
    assert re.search(r"fake-robot\D*1\b", str(exc)), str(exc)  # names the device: robot 1
    assert "unhealthy" in str(exc)


def test_healthy_robot_next_to_an_unhealthy_one_is_fine() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [ROBOT_GROUP],
        "component_placement": {"env": {"node_group": "robot", "placement": "0:0-2"}},
    }
    cluster = with_detected_robots(section)
    assert place(section, cluster).get_world_size("env") == 3


@pytest.mark.parametrize(
    ("text", "entry", "why"),
    [
        ("0-3,3-5", "3-5", "overlap"),
        ("0-1, 2-9:2", "2-9:2", "does not exist"),  # 8 resources
        ("0-2:0-1", "0-2:0-1", "divide"),
        ("0-1:0-1,2-3:1-2", "2-3:1-2", "continue"),
        ("0-1,2-5:2-3", "2-5:2-3", "one node"),  # process 2 would get accelerators 2-3: nodes 0 and 1
        (" 0 , 2-5 : 1-2 ", "2-5 : 1-2", "one node"),
        ("0,,1", ",,", "empty"),
    ],
)
def test_errors_name_the_component_and_quote_the_entry(text: str, entry: str, why: str) -> None:
    section = {"num_nodes": 2, "component_placement": {"actor": "0-1", "critic": text}}
    with pytest.raises(hwplace.PlacementError, match=why) as info:
        place(section, cluster_of([3, 3] if why == "one node" else [4, 4]))
    exc = info.value
    assert exc.component == "critic"
    assert exc.text == text
    assert exc.entry == entry
    assert why in exc.reason
    assert "'critic'" in str(exc)
    assert repr(entry) in str(exc)


def test_unknown_component_is_a_config_error_with_suggestion(
    full: tuple[hwplace.ComponentPlacement, hwplace.Cluster],
) -> None:
    placement, _ = full
    with pytest.raises(hwplace.ConfigError, match="did you mean 'actor'"):
        placement.get_strategy("actr")
    with pytest.raises(hwplace.ConfigError, match="rollout"):
        placement.get_world_size("rolout")


@pytest.mark.parametrize("method", ["get_strategy", "get_world_size", "get_placements", "spec"])
def test_an_unknown_component_is_named_whole(full: tuple[hwplace.ComponentPlacement, hwplace.Cluster],
                                             method: str) -> None:
    placement, _ = full
    with pytest.raises(hwplace.ConfigError, match="has no component") as caught:
        getattr(placement, method)("actr")
    assert (caught.value.path, caught.value.problem, caught.value.value, caught.value.allowed) == (
        "cluster.component_placement", "has no component 'actr'", None,
        "components: actor, inference, rollout, env, agent; did you mean 'actor'?")
    with pytest.raises(hwplace.ConfigError, match="has no component") as caught:
        getattr(placement, method)(3)
    assert caught.value.problem == "has no component 3"


def test_more_nodes_in_config_than_in_cluster() -> None:
    section = {"num_nodes": 3, "component_placement": {"actor": "0"}}
    with pytest.raises(hwplace.ConfigError, match=r"cluster\.num_nodes: is 3 but the cluster has 2 nodes") as info:
        place(section, fake_cluster(num_nodes=2, accelerators_per_node=1))
    assert info.value.path == "cluster.num_nodes"
    assert "3" in str(info.value)


def test_a_config_that_does_not_match_its_cluster_is_named_whole() -> None:
    with pytest.raises(hwplace.ConfigError, match="num_nodes") as caught:
        place({"num_nodes": 3, "component_placement": {"actor": "0"}},
              fake_cluster(num_nodes=2, accelerators_per_node=1))
    assert (caught.value.path, caught.value.problem, caught.value.allowed) == (
        "cluster.num_nodes", "is 3 but the cluster has 2 nodes", "build the Cluster with the same config")
    robots = {"num_nodes": 2, "node_groups": [ROBOT_GROUP],
              "component_placement": {"env": {"node_group": "robot", "placement": "0"}}}
    with pytest.raises(hwplace.ConfigError, match="node_groups") as caught:
        place(robots, fake_cluster(num_nodes=2, accelerators_per_node=1))
    assert (caught.value.problem, caught.value.allowed) == (
        "declare devices other than the ones the cluster was built with, so the cluster has not detected them",
        "build the Cluster (or fake_cluster) with the same config")
    with pytest.raises(hwplace.ConfigError, match="component_placement") as caught:
        place({"num_nodes": 1}, cluster_of([1]))
    assert (caught.value.path, caught.value.problem) == (
        "cluster.component_placement", "is missing or empty: no component to place")


def test_fake_cluster_with_fewer_nodes_than_config() -> None:
    with pytest.raises(hwplace.ConfigError, match="num_nodes"):
        fake_cluster({"num_nodes": 2}, accelerators_per_node=[4])


def test_missing_component_placement_is_a_config_error() -> None:
    with pytest.raises(hwplace.ConfigError, match="component_placement"):
        place({"num_nodes": 1}, cluster_of([1]))


def test_robots_not_declared_to_the_cluster_is_a_config_error() -> None:
    # The cluster was built without the robot declarations: it has not detected them.
    section = {
        "num_nodes": 2,
        "node_groups": [ROBOT_GROUP],
        "component_placement": {"env": {"node_group": "robot", "placement": "0"}},
    }
    with pytest.raises(hwplace.ConfigError, match=r"build the Cluster \(or fake_cluster\) with the same") as info:
        place(section, fake_cluster(num_nodes=2, accelerators_per_node=1))
    assert info.value.path == "cluster.node_groups"


def test_robots_whose_detection_failed_say_why() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [ROBOT_GROUP],
        "component_placement": {"env": {"node_group": "robot", "placement": "0"}},
    }
    nodes = list(fake_cluster(section).nodes)
    hardware = {name: devices for name, devices in nodes[1].hardware.items() if name != "fake-robot"}
    nodes[1] = dataclasses.replace(nodes[1], hardware=hardware, problems={"fake-robot": "detect raised OSError(5)"})
    with pytest.raises(hwplace.PlacementError, match=r"node 1, but the node has 0: detecting them failed: detect "
                       r"raised OSError\(5\)") as info:
        place(section, hwplace.Cluster(section, nodes=nodes))
    assert info.value.component == "env"
    assert "same config" not in str(info.value)


def test_a_components_strategy_hands_back_what_component_placement_planned() -> None:
    cfg = {"cluster": {"num_nodes": 2, "component_placement": {"actor": "0-3:0-7", "env": {
        "node_group": "node", "placement": "0-1:0-3"}}}}
    cluster = hwplace.testing.fake_cluster(cfg["cluster"], accelerators_per_node=4)
    plan = hwplace.ComponentPlacement(cfg, cluster)
    for name in plan.components:
        strategy = plan.get_strategy(name)
        planned = strategy.get_placement(cluster)
        assert planned == plan.get_placements(name)
        assert strategy.get_placement(cluster) is not planned  # a fresh list each time
        assert planned[0] is plan.get_placements(name)[0]  # the records themselves are reused, not rebuilt
        with pytest.raises(dataclasses.FrozenInstanceError, match=r"a planned strategy is immutable"):
            strategy.planned = None  # type: ignore[misc]  # the plan cannot be dropped
        unplanned: hwplace.PlacementStrategy
        if isinstance(strategy, hwplace.NodePlacementStrategy):
            unplanned = hwplace.NodePlacementStrategy(strategy.node_ranks, node_group=strategy.node_group)
        else:
            assert isinstance(strategy, hwplace.FlexiblePlacementStrategy)
            unplanned = hwplace.FlexiblePlacementStrategy(strategy.accelerator_id_lists, node_group=strategy.node_group)
        assert unplanned.planned is None
        assert unplanned.get_placement(cluster) == planned  # rebuilt: the same placements
    other = hwplace.testing.fake_cluster(cfg["cluster"], accelerators_per_node=4)
    actor = plan.get_strategy("actor")
    assert actor.get_placement(other)[0] is not plan.get_placements("actor")[0]  # another cluster: placed anew
    assert [p.visible_accelerators for p in actor.get_placement(cluster, isolate_accelerator=False)][:2] == [
        (0, 1, 2, 3), (0, 1, 2, 3)]


# -- the config it plans from --------------------------------------------------------------------------

JOB = {"cluster": {"num_nodes": 1, "component_placement": {"trainer": "0", "rollout": "1-3"}},
       "weight_sync": {"policy": {"source": "trainer", "targets": "rollout"}}, "job": {"steps": 5}}


def test_a_job_config_is_planned_from_as_it_is(count_calls: Any) -> None:
    job = hwplace.parse_job_config(JOB)
    cluster = fake_cluster(job.cluster, accelerators_per_node=4)
    with count_calls(hwplace.parse_job_config, hwplace.load_config, hwplace.parse_cluster_config) as calls:
        plan = hwplace.ComponentPlacement(job, cluster)
    assert set(calls.of.values()) == {0}  # nothing read or checked again
    assert (plan.job, plan.config) == (job, job.cluster)
    assert plan.job is job
    assert plan.config is job.cluster
    assert plan.job.weight_sync == (SyncSpec("policy", "trainer", ("rollout",)),)
    from_mapping = hwplace.ComponentPlacement(JOB, cluster)
    assert from_mapping.job == job
    for name in plan.components:
        assert plan.get_placements(name) == from_mapping.get_placements(name)
        assert plan.get_strategy(name).get_placement(cluster) == plan.get_placements(name)


def test_a_raw_config_is_parsed_once_and_a_cluster_config_not_at_all(count_calls: Any) -> None:
    job = hwplace.parse_job_config(JOB)
    cluster = fake_cluster(job.cluster, accelerators_per_node=4)
    watched = (hwplace.parse_job_config, hwplace.load_config, cluster_section)
    with count_calls(*watched) as calls:
        plan = hwplace.ComponentPlacement(JOB, cluster)
    assert calls.of == dict.fromkeys(watched, 1)
    assert plan.config == job.cluster
    with count_calls(*watched) as calls:
        plan = hwplace.ComponentPlacement(job.cluster, cluster)
    assert set(calls.of.values()) == {0}
    assert plan.config is job.cluster
    assert plan.job == hwplace.JobConfig(job.cluster)  # a cluster: section alone: no other section


def test_a_raw_config_gets_the_errors_of_the_job_file_parser() -> None:
    cluster = fake_cluster({"num_nodes": 1}, accelerators_per_node=4)
    with pytest.raises(hwplace.ConfigError, match=r"^weight_sync\.policy\.targets\[0\]: 'rolout' is not a "):
        hwplace.ComponentPlacement({**JOB, "weight_sync": {"policy": {"source": "trainer", "targets": ["rolout"]}}},
                                   cluster)
