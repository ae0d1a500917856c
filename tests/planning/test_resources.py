"""hwplace.resources: what the resource ranks of node groups index (SPEC sections 2, 3 and 5)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwplace
from hwplace.planning.resources import Resource, group_resource_type, resource_space
from hwplace.planning.strategies import GroupSelection
from hwplace.plugin.manager import PluginManager
from hwplace.testing import backend_plugin, fake_cluster, registered_plugin


def robots(label: str, *declared: tuple[int, str], ranks: Any = None) -> dict[str, Any]:
    """A node group declaring fake robots: ``(node_rank, name)`` pairs, in declaration order."""
    configs = [{"node_rank": rank, "name": name} for rank, name in declared]
    node_ranks = ranks if ranks is not None else sorted({rank for rank, _ in declared})
    return {"label": label, "node_ranks": node_ranks, "hardware": {"type": "fake-robot", "configs": configs}}


def place(section: dict[str, Any], cluster: hwplace.Cluster) -> hwplace.ComponentPlacement:
    return hwplace.ComponentPlacement({"cluster": section}, cluster)


def env_names(placements: Sequence[hwplace.Placement]) -> list[str]:
    return [p.env["FAKE_ROBOTS"] for p in placements]


def space_of(cluster: hwplace.Cluster, *labels: str, nodes_only: bool = False) -> list[tuple[int, str, str, int]]:
    groups = [cluster.config.group(label) for label in labels]
    return [(r.node_rank, r.hardware_type, r.group, r.local_index)
            for r in resource_space(cluster, groups, nodes_only=nodes_only).resources]


# -- declared devices belong to the group that declares them (SPEC section 5) ---------------------


LEFT_RIGHT = {
    "num_nodes": 1,
    "node_groups": [robots("left", (0, "L")), robots("right", (0, "R"))],
}


def test_two_groups_on_one_node_each_own_their_robot() -> None:
    section = {**LEFT_RIGHT, "component_placement": {"l": {"node_group": "left", "placement": "0"},
                                                      "r": {"node_group": "right", "placement": "0"}}}
    placement = place(section, fake_cluster(section))
    [left] = placement.get_placements("l")
    [right] = placement.get_placements("r")
    assert right.env == {"FAKE_ROBOTS": "R"}
    assert left.env == {"FAKE_ROBOTS": "L"}
    assert (right.node_rank, right.hardware_type, right.node_group) == (0, "fake-robot", "right")
    assert right.local_hardware_ranks == (1,)  # node-local: the second fake-robot of node 0
    assert left.local_hardware_ranks == (0,)


def test_a_group_cannot_reach_another_groups_robot() -> None:
    section = {**LEFT_RIGHT, "component_placement": {"r": {"node_group": "right", "placement": "0-1"}}}
    cluster = fake_cluster({**LEFT_RIGHT})
    with pytest.raises(hwplace.PlacementError, match=r"resource rank 1 does not exist: .*\b1 fake-robot resource\b"
                                                     r"(?!s).*\b0-0\b") as info:
        place(section, cluster)
    assert info.value.component == "r"
    assert info.value.entry == "0-1"


def test_strategies_see_only_the_groups_own_robots() -> None:
    cluster = fake_cluster(LEFT_RIGHT)
    [right] = hwplace.FlexiblePlacementStrategy([[0]], node_group="right").get_placement(cluster)
    assert right.env == {"FAKE_ROBOTS": "R"}
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 asks for resource 1, but .*'right'.* 1 fake-robot "
                                                     r"resource\b(?!s).*\(ranks 0-0\)$"):
        hwplace.FlexiblePlacementStrategy([[1]], node_group="right").get_placement(cluster)
    assert space_of(cluster, "left", "right") == [(0, "fake-robot", "left", 0), (0, "fake-robot", "right", 1)]


INTERLEAVED = {
    "num_nodes": 4,
    "node_groups": [
        robots("a", (2, "a2x"), (0, "a0x"), (2, "a2y"), (0, "a0y")),
        {"label": "gpus", "node_ranks": "all"},
        robots("b", (1, "b1x"), (2, "b2x"), (0, "b0x"), (1, "b1y"), ranks="0-3"),  # node 3: none of its own
        robots("c", (2, "c2x")),
        robots("d", (0, "d0x"), (3, "d3x"), (0, "d0y")),
    ],
}


@pytest.mark.parametrize(
    ("label", "names"),
    [
        ("a", ["a0x", "a0y", "a2x", "a2y"]),  # node by node, then in declaration order
        ("b", ["b0x", "b1x", "b1y", "b2x"]),
        ("c", ["c2x"]),
        ("d", ["d0x", "d0y", "d3x"]),
    ],
)
def test_interleaved_declarations_on_many_nodes(label: str, names: list[str]) -> None:
    section = {**INTERLEAVED, "component_placement": {"x": {"node_group": label, "placement": "all"}}}
    placements = place(section, fake_cluster(section, accelerators_per_node=1)).get_placements("x")
    assert env_names(placements) == [f"{name}" for name in names]
    assert [p.node_rank for p in placements] == [int(name[1]) for name in names]


def test_interleaved_declarations_node_local_indexes() -> None:
    cluster = fake_cluster(INTERLEAVED, accelerators_per_node=1)
    # Node 2 holds, in declaration order, a2x a2y (group a), b2x (group b), c2x (group c).
    assert [d.properties["name"] for d in cluster.nodes[2].devices("fake-robot")] == ["a2x", "a2y", "b2x", "c2x"]
    assert [(rank, index) for rank, _, _, index in space_of(cluster, "c")] == [(2, 3)]
    assert [(rank, index) for rank, _, _, index in space_of(cluster, "b")] == [(0, 2), (1, 0), (1, 1), (2, 2)]
    assert [(rank, index) for rank, _, _, index in space_of(cluster, "d")] == [(0, 3), (0, 4), (3, 0)]


def test_several_groups_together_number_group_after_group() -> None:
    section = {**INTERLEAVED, "component_placement": {"x": {"node_group": "c, a, d", "placement": "all"}}}
    placements = place(section, fake_cluster(section, accelerators_per_node=1)).get_placements("x")
    assert env_names(placements) == ["c2x", "a0x", "a0y", "a2x", "a2y", "d0x", "d0y", "d3x"]
    assert [p.node_group for p in placements] == ["c"] + ["a"] * 4 + ["d"] * 3


class Lamp(hwplace.HardwareBackend):
    name = "test-lamp"
    kind = "device"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return [hwplace.Device(i, "lamp") for i, _ in enumerate(configs)]

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        return {"LAMPS": ",".join(str(d.index) for d in devices)}


def test_declarations_of_another_type_do_not_shift_a_groups_robots() -> None:
    manager = PluginManager()
    with registered_plugin(backend_plugin(Lamp()), name="test-lamp-plugin", plugin_manager=manager):
        section = {
            "num_nodes": 1,
            "node_groups": [
                robots("first", (0, "F")),
                {"label": "lamps", "node_ranks": 0,
                 "hardware": {"type": "test-lamp", "configs": [{"node_rank": 0}, {"node_rank": 0}]}},
                robots("second", (0, "S")),
            ],
            "component_placement": {"s": {"node_group": "second", "placement": "0"},
                                    "l": {"node_group": "lamps", "placement": "0-1"}},
        }
        placement = place(section, fake_cluster(section, plugin_manager=manager))
        [second] = placement.get_placements("s")
        assert second.env == {"FAKE_ROBOTS": "S"}
        assert second.local_hardware_ranks == (1,)
        assert [p.env["LAMPS"] for p in placement.get_placements("l")] == ["0", "1"]


@st.composite
def robot_layouts(draw: st.DrawFn) -> tuple[int, list[tuple[str, list[int], list[int]]]]:
    """A number of nodes and groups, each with its nodes and the node of each robot it declares, in order."""
    num_nodes = draw(st.integers(min_value=1, max_value=4))
    groups = []
    for g in range(draw(st.integers(min_value=1, max_value=4))):
        declared = draw(st.lists(st.integers(min_value=0, max_value=num_nodes - 1), min_size=1, max_size=5))
        extra = draw(st.lists(st.integers(min_value=0, max_value=num_nodes - 1), max_size=2))
        groups.append((f"g{g}", sorted(set(declared) | set(extra)), declared))
    return num_nodes, groups


@settings(max_examples=60, deadline=None)
@given(robot_layouts())
def test_any_layout_each_group_indexes_exactly_its_own_declarations(
    layout: tuple[int, list[tuple[str, list[int], list[int]]]],
) -> None:
    num_nodes, groups = layout
    node_groups = [
        {"label": label, "node_ranks": ranks,
         "hardware": {"type": "fake-robot",
                      "configs": [{"node_rank": r, "name": f"{label}-{i}"} for i, r in enumerate(declared)]}}
        for label, ranks, declared in groups
    ]
    section = {"num_nodes": num_nodes, "node_groups": node_groups,
               "component_placement": {label: {"node_group": label, "placement": "all"} for label, _, _ in groups}}
    placement = place(section, fake_cluster(section))
    for label, _, declared in groups:
        order = sorted(range(len(declared)), key=lambda i: (declared[i], i))  # node by node, stable
        placements = placement.get_placements(label)
        assert env_names(placements) == [f"{label}-{i}" for i in order]
        assert [p.node_rank for p in placements] == [declared[i] for i in order]
        assert {p.node_group for p in placements} == {label}
        for p in placements:
            own = placement.cluster.nodes[p.node_rank].devices("fake-robot")[p.local_hardware_ranks[0]]
            assert own.properties["name"] == p.env["FAKE_ROBOTS"]


# -- declared devices that are missing ------------------------------------------------------------


ROBOT_ON_1 = {"num_nodes": 2, "node_groups": [robots("arms", (1, "x"), (1, "y"))],
              "component_placement": {"arm": {"node_group": "arms", "placement": "0"}}}


def without_robots(problems: dict[str, str], keep: int = 0) -> hwplace.Cluster:
    nodes = list(fake_cluster(ROBOT_ON_1).nodes)
    hardware = dict(nodes[1].hardware)
    hardware["fake-robot"] = hardware["fake-robot"][:keep]
    nodes[1] = dataclasses.replace(nodes[1], hardware=hardware, problems=problems)
    return hwplace.Cluster(ROBOT_ON_1, nodes=nodes)


def test_a_group_whose_detection_failed_says_why() -> None:
    cluster = without_robots({"fake-robot": "port /dev/ttyUSB0 is busy"})
    with pytest.raises(hwplace.PlacementError, match=r"^component 'arm': group 'arms' declares 2 fake-robot devices "
                       r"on node 1, but the node has 0: detecting them failed: port /dev/ttyUSB0 is busy$"):
        place(ROBOT_ON_1, cluster)


def test_a_group_whose_node_found_too_few_says_so() -> None:
    cluster = without_robots({"fake-robot": "detect returned 1 devices for 2 configs"}, keep=1)
    with pytest.raises(hwplace.PlacementError, match=r"declares 2 fake-robot devices on node 1, but the node has 1: "
                       r"detecting them failed: detect returned 1 devices for 2 configs"):
        hwplace.FlexiblePlacementStrategy([[0]], node_group="arms").get_placement(cluster)


def test_missing_devices_without_a_problem_point_at_the_config() -> None:
    cluster = without_robots({})
    with pytest.raises(hwplace.PlacementError, match=r"declares 2 fake-robot devices on node 1, but the node has 0: "
                       r"the cluster was not built with the config that declares them \(build the Cluster, or "
                       r"fake_cluster, with the same config\)$"):
        place(ROBOT_ON_1, cluster)


def test_one_declared_device_is_singular() -> None:
    section = {"num_nodes": 2, "node_groups": [robots("arm", (1, "x"))]}
    nodes = list(fake_cluster(section).nodes)
    nodes[1] = dataclasses.replace(nodes[1], hardware={}, problems={})
    with pytest.raises(hwplace.PlacementError, match=r"group 'arm' declares 1 fake-robot device on node 1, but the "
                                                     r"node has 0"):
        hwplace.FlexiblePlacementStrategy([[0]], node_group="arm").get_placement(hwplace.Cluster(section, nodes=nodes))


def test_a_node_without_its_node_record_cannot_be_a_node_resource() -> None:
    nodes = list(fake_cluster(num_nodes=2).nodes)
    nodes[1] = dataclasses.replace(nodes[1], hardware={}, problems={"node": "detect raised OSError(5)"})
    cluster = hwplace.Cluster(nodes=nodes)
    with pytest.raises(hwplace.PlacementError, match=r"^node 1 has no 'node' record, so it cannot be a node-kind "
                                                     r"resource of group 'node': detect raised OSError\(5\)$"):
        hwplace.NodePlacementStrategy([0]).get_placement(cluster)
    nodes[1] = dataclasses.replace(nodes[1], problems={})
    with pytest.raises(hwplace.PlacementError, match=r"node 1 has no 'node' record, .*: it reported nothing for "
                                                     r"this node$"):
        hwplace.NodePlacementStrategy([0]).get_placement(hwplace.Cluster(nodes=nodes))


def test_a_node_resource_is_the_first_record_only() -> None:
    nodes = [hwplace.Node(0, "n0", "a0", {"node": (hwplace.Device(0, "n"), hwplace.Device(1, "n"))})]
    cluster = hwplace.Cluster(nodes=nodes)
    assert space_of(cluster, "node") == [(0, "node", "node", 0)]


# -- selected groups may not share a resource (SPEC section 3) -------------------------------------


def test_accelerator_groups_sharing_a_node_name_it() -> None:
    groups = [{"label": "a", "node_ranks": "0-1"}, {"label": "b", "node_ranks": "1-2"}]
    section = {"num_nodes": 3, "node_groups": groups,
               "component_placement": {"x": {"node_group": ["a", "b"], "placement": "0"}}}
    with pytest.raises(hwplace.PlacementError, match=r"^component 'x': groups 'a' and 'b' share fake-accelerator 0 "
                       r"of node 1; the groups of one node_group list may not share a resource$"):
        place(section, fake_cluster(section, accelerators_per_node=2))


def test_node_groups_sharing_a_node_name_it() -> None:
    section = {"num_nodes": 3, "node_groups": [{"label": "a", "node_ranks": "0,2"}, {"label": "b", "node_ranks": 2}],
               "component_placement": {"x": {"node_group": "a,b", "placement": "0"}}}
    with pytest.raises(hwplace.PlacementError, match=r"groups 'a' and 'b' share node 0 of node 2; the groups"):
        place(section, fake_cluster(section, accelerators_per_node=0))


def test_groups_sharing_a_node_as_nodes_only() -> None:
    # Accelerator groups that share a node share it as a node too, when a Node strategy counts their nodes.
    section = {"num_nodes": 2, "node_groups": [{"label": "a", "node_ranks": "0-1"}, {"label": "b", "node_ranks": 0}]}
    cluster = fake_cluster(section, accelerators_per_node=2)
    with pytest.raises(hwplace.PlacementError, match=r"groups 'a' and 'b' share node 0 of node 0"):
        hwplace.NodePlacementStrategy([0], node_group=["a", "b"]).get_placement(cluster)


def test_disjoint_groups_may_be_selected_together() -> None:
    section = {"num_nodes": 3, "node_groups": [{"label": "a", "node_ranks": "0,2"}, {"label": "b", "node_ranks": 1}],
               "component_placement": {"x": {"node_group": "b,a", "placement": "all"},
                                       "y": {"node_group": "a,b", "placement": "all"}}}
    cluster = fake_cluster(section, accelerators_per_node=1)
    placement = place(section, cluster)
    assert [p.node_rank for p in placement.get_placements("x")] == [1, 0, 2]
    assert [p.node_rank for p in placement.get_placements("y")] == [0, 2, 1]
    assert [(r, g) for r, _, g, _ in space_of(cluster, "b", "a", nodes_only=True)] == [(1, "b"), (0, "a"), (2, "a")]


def test_robot_groups_sharing_a_node_do_not_share_robots() -> None:
    section = {**LEFT_RIGHT, "component_placement": {"x": {"node_group": ["right", "left"], "placement": "0-1"}}}
    placements = place(section, fake_cluster(section)).get_placements("x")
    assert env_names(placements) == ["R", "L"]


def test_a_group_and_a_group_of_its_robots_node_share_nothing() -> None:
    section = {"num_nodes": 1, "node_groups": [robots("arm", (0, "x")), {"label": "gpu", "node_ranks": 0}],
               "component_placement": {"x": {"node_group": ["gpu", "arm"], "placement": "0-2"}}}
    placements = place(section, fake_cluster(section, accelerators_per_node=2)).get_placements("x")
    assert [p.hardware_type for p in placements] == ["fake-accelerator"] * 2 + ["fake-robot"]


def test_a_group_listed_twice_is_not_booked_twice() -> None:
    section = {"num_nodes": 2, "node_groups": [{"label": "a", "node_ranks": "0-1"}]}
    cluster = fake_cluster(section, accelerators_per_node=2)
    group = cluster.config.group("a")
    selections: list[GroupSelection] = [["a", "a"], "a, a", [group, "a"], [group, group]]
    for selection in selections:
        with pytest.raises(hwplace.PlacementError, match=r"^group 'a' is listed twice in one node_group list; it "
                                                         r"would book its resources twice$"):
            hwplace.PackedPlacementStrategy(0, 7, node_group=selection).get_placement(cluster)
    with pytest.raises(hwplace.PlacementError, match=r"group 'node' is listed twice"):
        hwplace.NodePlacementStrategy([0], node_group="node,node").get_placement(cluster)


# -- node kind and hardware kind may not be mixed ----------------------------------------------------


def test_the_mixing_error_lists_every_group_of_each_kind() -> None:
    section = {"num_nodes": 3, "node_groups": [robots("arm", (0, "x")), {"label": "gpu", "node_ranks": 0},
                                               {"label": "cpu", "node_ranks": 1},
                                               {"label": "plain", "node_ranks": 2, "ignore_hardware": True}]}
    cluster = fake_cluster(section, accelerators_per_node=[2, 0, 2])
    with pytest.raises(hwplace.PlacementError, match=r"^node groups of node kind \(cpu, plain\) and of hardware kind "
                       r"\(gpu \(fake-accelerator\), arm \(fake-robot\)\) cannot be mixed in one node_group list$"):
        hwplace.FlexiblePlacementStrategy([[0]], node_group=["gpu", "cpu", "arm", "plain"]).get_placement(cluster)


def test_node_kind_and_hardware_kind_groups_are_not_mixed() -> None:
    section = {"num_nodes": 2, "node_groups": [{"label": "gpu", "node_ranks": 0}, {"label": "cpu", "node_ranks": 1}],
               "component_placement": {"x": {"node_group": ["cpu", "gpu"], "placement": "0"}}}
    with pytest.raises(hwplace.PlacementError, match=r"^component 'x': node groups of node kind \(cpu\) and of "
                       r"hardware kind \(gpu \(fake-accelerator\)\) cannot be mixed in one node_group list$"):
        place(section, fake_cluster(section, accelerators_per_node=[2, 0]))


def test_node_kind_groups_and_a_robot_group_are_not_mixed() -> None:
    section = {"num_nodes": 2, "node_groups": [robots("arm", (0, "x")),
                                               {"label": "plain", "node_ranks": 0, "ignore_hardware": True},
                                               {"label": "bare", "node_ranks": 1}]}
    cluster = fake_cluster(section, accelerators_per_node=[1, 0])
    with pytest.raises(hwplace.PlacementError, match=r"node kind \(plain, bare\) and of hardware kind \(arm "
                                                     r"\(fake-robot\)\) cannot be mixed"):
        hwplace.FlexiblePlacementStrategy([[0]], node_group=["plain", "arm", "bare"]).get_placement(cluster)


def test_several_node_kind_groups_mix_fine() -> None:
    section = {"num_nodes": 2, "node_groups": [{"label": "plain", "node_ranks": 1, "ignore_hardware": True}],
               "component_placement": {"x": {"node_group": ["plain"], "placement": "0:0-2"}}}
    cluster = fake_cluster(section, accelerators_per_node=[0, 2])
    placements = place(section, cluster).get_placements("x")
    assert [(p.node_rank, p.hardware_type, p.visible_accelerators) for p in placements] == [(1, "node", (0, 1))] * 3


# -- what a group's resources are ----------------------------------------------------------------------


def test_group_resource_types() -> None:
    section = {"num_nodes": 3, "node_groups": [
        {"label": "gpu", "node_ranks": "0-1"},
        {"label": "cpu", "node_ranks": 2},
        {"label": "ignored", "node_ranks": 0, "ignore_hardware": True},
        {"label": "typed", "node_ranks": "0-2", "hardware": {"type": "fake-accelerator"}},
        robots("arm", (2, "x")),
    ]}
    cluster = fake_cluster(section, accelerators_per_node=[2, 1, 0])
    types = {g: group_resource_type(cluster, cluster.config.group(g))
             for g in ("gpu", "cpu", "ignored", "typed", "arm", "cluster", "node")}
    assert types == {"gpu": "fake-accelerator", "cpu": "node", "ignored": "node", "typed": "fake-accelerator",
                     "arm": "fake-robot", "cluster": "fake-accelerator", "node": "node"}
    assert space_of(cluster, "typed") == [(0, "fake-accelerator", "typed", 0), (0, "fake-accelerator", "typed", 1),
                                          (1, "fake-accelerator", "typed", 0)]
    assert space_of(cluster, "ignored") == [(0, "node", "ignored", 0)]


def test_resource_records() -> None:
    cluster = fake_cluster(num_nodes=2, accelerators_per_node=[1, 2])
    space = resource_space(cluster, [cluster.config.group("cluster")])
    assert len(space) == 3
    assert not space.is_node_kind
    assert "3 fake-accelerator resources" in space.description
    assert "'cluster'" in space.description
    last = space.resources[-1]
    assert last == Resource(1, "fake-accelerator", "cluster", cluster.nodes[1].devices("fake-accelerator")[1])
    assert last.local_index == 1
    with pytest.raises(AttributeError, match="set attribute"):  # a named tuple: no field can be set
        last.node_rank = 0  # type: ignore[misc]
    assert last.node_rank == 1
    nodes = resource_space(cluster, [cluster.config.group("cluster")], nodes_only=True)
    assert nodes.is_node_kind
    assert "2 nodes" in nodes.description
    assert "accelerator" not in nodes.description
    assert [r.hardware_type for r in nodes.resources] == ["node", "node"]


# -- the node backend is found by kind, with no fallback -----------------------------------------------


@pytest.fixture
def no_node_plugin(monkeypatch: pytest.MonkeyPatch) -> PluginManager:
    monkeypatch.setenv("HWPLACE_DISABLED_PLUGINS", "node")
    return PluginManager()


NO_NODE_BACKEND = r"exactly one backend of kind 'node' must be registered, found none"


def test_without_a_node_backend_the_node_group_cannot_be_placed(no_node_plugin: PluginManager) -> None:
    section = {"num_nodes": 2, "component_placement": {"agent": {"node_group": "node", "placement": "0-1"}}}
    cluster = fake_cluster(section, accelerators_per_node=1, plugin_manager=no_node_plugin)
    assert all("node" not in n.hardware for n in cluster.nodes)  # nothing stands in for the node backend
    with pytest.raises(hwplace.PlacementError, match=rf"^component 'agent': {NO_NODE_BACKEND};.*HWPLACE_DISABLED_"
                                                     r"PLUGINS=node\)$"):
        place(section, cluster)
    with pytest.raises(hwplace.PlacementError, match=NO_NODE_BACKEND):
        hwplace.NodePlacementStrategy([0]).get_placement(cluster)
    with pytest.raises(hwplace.PlacementError, match=NO_NODE_BACKEND):
        hwplace.NodePlacementStrategy([0], node_group="cluster").get_placement(cluster)


def test_without_a_node_backend_nodes_without_accelerators_cannot_be_placed(no_node_plugin: PluginManager) -> None:
    cluster = fake_cluster({"num_nodes": 1}, accelerators_per_node=0, plugin_manager=no_node_plugin)
    with pytest.raises(hwplace.PlacementError, match=NO_NODE_BACKEND):
        hwplace.PackedPlacementStrategy(0, 0).get_placement(cluster)
    section = {"num_nodes": 1, "node_groups": [{"label": "plain", "node_ranks": 0, "ignore_hardware": True}]}
    cluster = fake_cluster(section, accelerators_per_node=1, plugin_manager=no_node_plugin)
    with pytest.raises(hwplace.PlacementError, match=NO_NODE_BACKEND):
        hwplace.PackedPlacementStrategy(0, 0, node_group="plain").get_placement(cluster)


def test_without_a_node_backend_accelerators_still_place(no_node_plugin: PluginManager) -> None:
    cluster = fake_cluster({"num_nodes": 1}, accelerators_per_node=2, plugin_manager=no_node_plugin)
    placements = hwplace.PackedPlacementStrategy(0, 1).get_placement(cluster)
    assert [p.env for p in placements] == [{"FAKE_VISIBLE_DEVICES": "0"}, {"FAKE_VISIBLE_DEVICES": "1"}]


class Host(hwplace.HardwareBackend):
    name = "test-host"
    kind = "node"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return [hwplace.Device(0, "host")]

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        return {"HOST_SLOT": ",".join(str(d.index) for d in devices)}


def test_a_node_backend_of_another_name_is_found_by_kind(no_node_plugin: PluginManager) -> None:
    with registered_plugin(backend_plugin(Host()), name="test-host-plugin", plugin_manager=no_node_plugin):
        section = {"num_nodes": 2, "component_placement": {"agent": {"node_group": "node", "placement": "0-1"}}}
        cluster = fake_cluster(section, accelerators_per_node=1, plugin_manager=no_node_plugin)
        placements = place(section, cluster).get_placements("agent")
        assert [(p.node_rank, p.hardware_type, p.env) for p in placements] == [
            (0, "test-host", {"HOST_SLOT": "0"}), (1, "test-host", {"HOST_SLOT": "0"})]
        with pytest.raises(hwplace.PlacementError, match=r"'node'.* 2 nodes \(ranks 0-1\)$"):
            hwplace.NodePlacementStrategy([2]).get_placement(cluster)


def test_two_node_backends_are_an_error_naming_both() -> None:
    manager = PluginManager()
    with registered_plugin(backend_plugin(Host()), name="test-host-plugin", plugin_manager=manager):
        cluster = fake_cluster({"num_nodes": 1}, plugin_manager=manager)
        with pytest.raises(hwplace.PlacementError, match=r"exactly one backend of kind 'node' must be registered, "
                                                         r"found '.*") as info:
            hwplace.NodePlacementStrategy([0]).get_placement(cluster)
        assert "'node' (hwplace)" in str(info.value)
        assert "'test-host' ((registered at run time))" in str(info.value)


# -- message wording ---------------------------------------------------------------------------------

NO_ACCELERATOR = "(no accelerator was detected on its nodes, so the resources are the nodes themselves)"


@pytest.mark.parametrize(
    ("counts", "group", "what", "note"),
    [
        ([0], "node", "1 node", False),
        ([0, 0], "node", "2 nodes", False),
        ([0], "cluster", "1 node", True),
        ([1], "cluster", "1 fake-accelerator resource", False),
        ([2, 1], "cluster", "3 fake-accelerator resources", False),
    ],
)
def test_descriptions_count_in_words(counts: list[int], group: str, what: str, note: bool) -> None:
    cluster = fake_cluster(num_nodes=len(counts), accelerators_per_node=counts)
    description = resource_space(cluster, [cluster.config.group(group)]).description
    assert re.search(rf"\b{what}(?!s)\b", description), description
    assert re.search(rf"\bgroup '{group}'", description), description
    assert description.endswith(NO_ACCELERATOR) == note
    assert not re.search(r"\b1 \S+s\b", description), description  # never "1 nodes"


def test_descriptions_of_several_groups() -> None:
    section = {"num_nodes": 3, "node_groups": [{"label": "a", "node_ranks": 0}, {"label": "b", "node_ranks": "1-2"},
                                               robots("arm", (0, "x"))]}
    cluster = fake_cluster(section, accelerators_per_node=0)
    groups = [cluster.config.group("a"), cluster.config.group("b")]
    description = resource_space(cluster, groups).description
    assert "groups 'a' + 'b'" in description
    assert "3 nodes" in description
    assert description.endswith(NO_ACCELERATOR.replace("its", "their"))
    description = resource_space(cluster, groups, nodes_only=True).description
    assert "3 nodes" in description
    assert "(" not in description
    cluster = fake_cluster(section, accelerators_per_node=1)
    groups = [cluster.config.group("arm"), cluster.config.group("b")]
    description = resource_space(cluster, groups).description
    assert "groups 'arm' + 'b'" in description
    assert "3 fake-accelerator/fake-robot resources" in description
    assert "(" not in description


def test_one_robot_is_one_resource_in_messages() -> None:
    cluster = fake_cluster(LEFT_RIGHT)
    with pytest.raises(hwplace.PlacementError, match=r"end_accelerator_id 1 does not exist: .*\b1 fake-robot "
                                                     r"resource\b(?!s)") as info:
        hwplace.PackedPlacementStrategy(0, 1, node_group="left").get_placement(cluster)
    assert "1 fake-robot resources" not in str(info.value)


# -- several accelerator types on one group ------------------------------------------------------------


class Other(hwplace.HardwareBackend):
    name = "test-other"
    kind = "accelerator"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return []


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ("cluster", "cluster.node_groups: the nodes of group 'cluster' have accelerators of several types: "
                    "fake-accelerator, test-other; define a node group whose hardware.type names the one to use"),
        ("gpus", "cluster.node_groups[0].hardware.type: the nodes of group 'gpus' have accelerators of several types: "
                 "fake-accelerator, test-other; name the one to use in hardware.type"),
    ],
)
def test_a_group_with_several_accelerator_types_must_name_one(group: str, message: str) -> None:
    manager = PluginManager()
    with registered_plugin(backend_plugin(Other()), name="test-other-plugin", plugin_manager=manager):
        section = {"num_nodes": 2, "node_groups": [{"label": "gpus", "node_ranks": "all"},
                                                   {"label": "picked", "node_ranks": "all",
                                                    "hardware": {"type": "test-other"}}]}
        cluster = fake_cluster(section, accelerators_per_node=2, accelerator_type=["test-other", "fake-accelerator"],
                               plugin_manager=manager)
        with pytest.raises(hwplace.ConfigError, match=r"several types") as info:
            hwplace.PackedPlacementStrategy(0, 0, node_group=group).get_placement(cluster)
        assert str(info.value) == message
        assert space_of(cluster, "picked") == [(0, "test-other", "picked", 0), (0, "test-other", "picked", 1)]
