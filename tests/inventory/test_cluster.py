"""hwplace.cluster: Node records, the Cluster inventory and its checks, and detection on this machine."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwplace
from hwplace.config.records import ClusterConfig, NodeGroup
from hwplace.executor import BackendRegistry, ClusterSpec
from hwplace.foundation.frozen import FrozenDict
from hwplace.inventory.detection import detect_node_hardware
from hwplace.plugin.manager import PluginManager
from hwplace.testing import backend_plugin, fake_cluster, registered_plugin


def gpus(count: int, model: str = "gpu") -> tuple[hwplace.Device, ...]:
    return tuple(hwplace.Device(i, model) for i in range(count))


def node(rank: int, node_id: str | None = None, **kwargs: Any) -> hwplace.Node:
    name = node_id or f"n{rank}"
    return hwplace.Node(rank, name, f"10.0.0.{rank}", **kwargs)


@pytest.fixture
def manager() -> PluginManager:
    return PluginManager()


# -- Node --------------------------------------------------------------------------------------------


def test_node_defaults_and_devices() -> None:
    n = node(0, hardware={"fake-accelerator": list(gpus(2))})
    assert n.hardware == {"fake-accelerator": gpus(2)}
    assert type(n.hardware["fake-accelerator"]) is tuple
    assert n.devices("fake-accelerator") == gpus(2)
    assert n.devices("missing") == ()
    assert n.problems == {}
    assert node(1).hardware == {}


@pytest.mark.parametrize("rank", [-1, True, False, 1.0, "0", None])
def test_node_rank_must_be_a_non_negative_integer(rank: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^nodes: node 'bad' has rank .*; a node rank is a non-negative "
                                                  r"integer$") as info:
        hwplace.Node(rank, "bad", "addr")
    assert info.value.path == "nodes"
    assert repr(rank) in str(info.value)


def test_node_hardware_must_hold_devices() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"node 3: hardware\['cuda'\] holds something that is not a "
                                                  r"hwplace\.Device"):
        node(3, hardware={"cuda": (hwplace.Device(0, "m"), "GPU-1")})


def test_node_is_immutable() -> None:
    n = node(0, hardware={"cuda": gpus(1)}, problems={"npu": "no driver"})
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'rank'"):
        n.rank = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        n.hardware["cuda"] = ()  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        n.problems["npu"] = "fixed"  # type: ignore[index]
    assert isinstance(n.hardware, FrozenDict)
    assert isinstance(n.problems, FrozenDict)


def test_node_copies_its_inputs() -> None:
    hardware: dict[str, Any] = {"cuda": [hwplace.Device(0, "m")]}
    problems = {"npu": "no driver"}
    n = node(0, hardware=hardware, problems=problems)
    hardware["cuda"].append(hwplace.Device(1, "m"))
    hardware["other"] = ()
    problems["npu"] = "changed"
    assert n.hardware == {"cuda": (hwplace.Device(0, "m"),)}
    assert n.problems == {"npu": "no driver"}


def test_node_pickles_equal() -> None:
    n = node(2, hardware={"cuda": gpus(2)}, problems={"npu": "no driver"})
    again = pickle.loads(pickle.dumps(n))
    assert again == n
    assert isinstance(again.hardware, FrozenDict)


# -- Cluster: given nodes ----------------------------------------------------------------------------


def test_cluster_of_given_nodes(manager: PluginManager) -> None:
    cluster = hwplace.Cluster(nodes=[node(0), node(1)], plugin_manager=manager)
    assert cluster.num_nodes == 2
    assert [n.node_id for n in cluster.nodes] == ["n0", "n1"]
    assert isinstance(cluster.nodes, tuple)
    assert cluster.config == ClusterConfig(num_nodes=2)
    assert cluster.plugin_manager is manager
    assert repr(cluster) == "<Cluster 2 nodes>"
    assert repr(hwplace.Cluster(nodes=[node(0)], plugin_manager=manager)) == "<Cluster 1 node>"


def test_cluster_without_a_manager_uses_the_process_wide_one() -> None:
    from hwplace import get_plugin_manager

    assert hwplace.Cluster(nodes=[node(0)]).plugin_manager is get_plugin_manager()


@pytest.mark.parametrize(
    ("ranks", "bad"),
    [([1, 0], "node 'n1' has rank 1 at position 0"), ([0, 2], "node 'n2' has rank 2 at position 1"),
     ([0, 1, 1], "node 'n1' has rank 1 at position 2"), ([3], "node 'n3' has rank 3 at position 0")],
)
def test_nodes_must_come_in_rank_order_without_gaps(manager: PluginManager, ranks: list[int], bad: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=f"^nodes: {bad}; nodes must be given in rank order 0..N-1$"):
        hwplace.Cluster(nodes=[node(r) for r in ranks], plugin_manager=manager)


def test_nodes_may_be_any_sequence(manager: PluginManager) -> None:
    cluster = hwplace.Cluster(nodes=(node(0), node(1)), plugin_manager=manager)
    assert cluster.num_nodes == 2


def test_empty_nodes_are_refused(manager: PluginManager) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^nodes: a cluster needs at least one node$"):
        hwplace.Cluster(nodes=[], plugin_manager=manager)
    with pytest.raises(hwplace.ConfigError, match=r"^nodes: a cluster needs at least one node$"):
        hwplace.Cluster({"num_nodes": 1}, nodes=[], plugin_manager=manager)


@pytest.mark.parametrize("thing", [None, "n0", {"rank": 0}, 0])
def test_items_that_are_not_nodes_are_refused(manager: PluginManager, thing: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=rf"^nodes: position 1 holds {thing!r}, not a hwplace\.Node$"):
        hwplace.Cluster(nodes=[node(0), thing], plugin_manager=manager)


def test_more_nodes_asked_for_than_available(manager: PluginManager) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^cluster\.num_nodes: asks for 3 nodes but 2 are available; "
                       r"found node 0: n0 \(10\.0\.0\.0\); node 1: n1 \(10\.0\.0\.1\)$") as info:
        hwplace.Cluster({"num_nodes": 3}, nodes=[node(0), node(1)], plugin_manager=manager)
    assert info.value.path == "cluster.num_nodes"


def test_more_nodes_asked_for_than_the_one_available(manager: PluginManager) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"asks for 2 nodes but 1 is available; found node 0: n0 "):
        hwplace.Cluster({"num_nodes": 2}, nodes=[node(0)], plugin_manager=manager)


def test_exactly_the_nodes_asked_for(manager: PluginManager) -> None:
    assert hwplace.Cluster({"num_nodes": 2}, nodes=[node(0), node(1)], plugin_manager=manager).num_nodes == 2


def test_fewer_nodes_asked_for_than_available_keeps_the_first(manager: PluginManager) -> None:
    cluster = hwplace.Cluster({"num_nodes": 2}, nodes=[node(0), node(1), node(2)], plugin_manager=manager)
    assert [n.rank for n in cluster.nodes] == [0, 1]
    assert cluster.config.num_nodes == 2


@given(st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=6))
def test_num_nodes_against_any_inventory(asked: int, found: int) -> None:
    manager = PluginManager(load_entry_points=False)
    nodes = [node(r) for r in range(found)]
    if asked > found:
        with pytest.raises(hwplace.ConfigError, match=rf"asks for {asked} nodes but {found} "):
            hwplace.Cluster({"num_nodes": asked}, nodes=nodes, plugin_manager=manager)
    else:
        assert hwplace.Cluster({"num_nodes": asked}, nodes=nodes, plugin_manager=manager).num_nodes == asked


def test_a_parsed_config_is_taken_as_it_is(manager: PluginManager) -> None:
    config = ClusterConfig(num_nodes=1)
    assert hwplace.Cluster(config, nodes=[node(0)], plugin_manager=manager).config is config


def test_a_cluster_needs_a_config_or_nodes(manager: PluginManager) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^cluster: Cluster\(\) needs the cluster: section of a config, "
                                                  r"or nodes=\[\.\.\.\]$"):
        hwplace.Cluster(plugin_manager=manager)


def test_without_nodes_and_without_an_executor_names_cluster_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_DISABLED_PLUGINS", "ray")
    manager = PluginManager()
    with pytest.raises(hwplace.ConfigError, match=r"^cluster\.executor: no executor is named 'ray'; registered: "
                       r"none \(disabled here: HWPLACE_DISABLED_PLUGINS=ray\); install the executor's plugin .* "
                       r"hwplace\.testing\.fake_cluster or "
                       r"Cluster\.this_machine$") as info:
        hwplace.Cluster({"num_nodes": 1}, plugin_manager=manager)
    assert info.value.path == "cluster.executor"


class ListedExecutor(hwplace.Executor):
    name = "listed"

    def __init__(self, nodes: list[hwplace.Node]) -> None:
        self.nodes = nodes
        self.seen: list[tuple[Any, Any]] = []

    def discover(self, config: ClusterSpec, plugin_manager: BackendRegistry) -> list[hwplace.Node]:
        self.seen.append((config, plugin_manager))
        return self.nodes

    def free_port(self, node: hwplace.Node) -> int:
        return 29500

    def start_group(self, request: Any) -> Any:
        raise hwplace.ConfigError("executor", "this test executor starts no groups")

    def find_group(self, name: str) -> None:
        return None

    def where(self) -> str:
        return "a list of nodes"


def test_without_nodes_the_configured_executor_discovers_them(manager: PluginManager) -> None:
    executor = ListedExecutor([node(0), node(1)])
    with registered_plugin(backend_plugin(executor), name="test-listed", plugin_manager=manager):
        cluster = hwplace.Cluster({"num_nodes": 2, "executor": "listed"}, plugin_manager=manager)
    assert [n.node_id for n in cluster.nodes] == ["n0", "n1"]
    [(config, seen_manager)] = executor.seen
    assert config == cluster.config
    assert seen_manager is manager


def test_discovered_nodes_are_checked_like_given_ones(manager: PluginManager) -> None:
    executor = ListedExecutor([node(1)])
    with registered_plugin(backend_plugin(executor), name="test-listed", plugin_manager=manager), \
            pytest.raises(hwplace.ConfigError, match="node 'n1' has rank 1 at position 0"):
        hwplace.Cluster({"num_nodes": 1, "executor": "listed"}, plugin_manager=manager)


# -- Cluster: what it knows about its hardware -------------------------------------------------------


def test_backend_kind_and_node_type(manager: PluginManager) -> None:
    cluster = hwplace.Cluster(nodes=[node(0)], plugin_manager=manager)
    backend = cluster.backend("fake-robot")
    assert backend is not None
    assert backend.name == "fake-robot"
    assert cluster.backend("no-such") is None
    assert cluster.kind("fake-accelerator") == "accelerator"
    assert cluster.kind("fake-robot") == "device"
    assert cluster.kind("node") == "node"
    assert cluster.kind("no-such") is None
    assert cluster.node_type() == "node"


def test_node_type_without_a_node_backend_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_DISABLED_PLUGINS", "node")
    cluster = hwplace.Cluster(nodes=[node(0)], plugin_manager=PluginManager())
    with pytest.raises(hwplace.PluginError, match="exactly one backend of kind 'node' must be registered, found none"):
        cluster.node_type()


def test_accelerator_types_are_the_registered_accelerators_present(manager: PluginManager) -> None:
    nodes = [
        node(0, hardware={"fake-accelerator": gpus(2), "fake-robot": gpus(1), "unregistered": gpus(1)}),
        node(1, hardware={"fake-accelerator": ()}),
        node(2, hardware={"node": gpus(1)}),
    ]
    cluster = hwplace.Cluster(nodes=nodes, plugin_manager=manager)
    assert cluster.accelerator_types([0, 1, 2]) == ["fake-accelerator"]
    assert cluster.accelerator_types([1, 2]) == []  # an empty record is no accelerator
    assert cluster.accelerator_types([]) == []


def test_problems_are_reported_once_with_the_nodes_they_were_seen_on(manager: PluginManager) -> None:
    nodes = [
        node(0, problems={"cuda": "no driver", "plugin 'x'": "import failed"}),
        node(1, problems={"cuda": "no driver"}),
        node(2),
        node(3, problems={"cuda": "no driver", "npu": "timed out"}),
        node(4, problems={"cuda": "NVML error"}),
    ]
    cluster = hwplace.Cluster(nodes=nodes, plugin_manager=manager)
    assert cluster.problems == [
        "nodes 0-1,3: cuda: no driver",
        "node 0: plugin 'x': import failed",
        "node 3: npu: timed out",
        "node 4: cuda: NVML error",
    ]


def test_no_problems(manager: PluginManager) -> None:
    assert hwplace.Cluster(nodes=[node(0), node(1)], plugin_manager=manager).problems == []


def test_problems_of_nodes_beyond_num_nodes_are_not_reported(manager: PluginManager) -> None:
    nodes = [node(0), node(1, problems={"cuda": "no driver"})]
    assert hwplace.Cluster({"num_nodes": 1}, nodes=nodes, plugin_manager=manager).problems == []


# -- detection on this machine -----------------------------------------------------------------------


def test_this_machine_detects_fake_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "3")
    manager = PluginManager()
    cluster = hwplace.Cluster.this_machine(plugin_manager=manager)
    assert cluster.plugin_manager is manager
    assert cluster.num_nodes == 1
    [only] = cluster.nodes
    assert only.rank == 0
    accelerators = only.devices("fake-accelerator")
    assert [d.index for d in accelerators] == [0, 1, 2]
    assert all(d.healthy for d in accelerators)
    [record] = only.devices("node")
    assert only.address == record.properties["address"]
    assert only.node_id == record.properties["hostname"]
    assert cluster.problems == []
    placements = hwplace.PackedPlacementStrategy(0, 2).get_placement(cluster)
    assert [p.env for p in placements] == [{"FAKE_VISIBLE_DEVICES": str(i)} for i in range(3)]


def test_this_machine_without_fake_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPLACE_FAKE_ACCELERATORS", raising=False)
    cluster = hwplace.Cluster.this_machine(plugin_manager=PluginManager())
    assert cluster.nodes[0].devices("fake-accelerator") == ()
    assert cluster.problems == []


def test_this_machine_reports_a_failed_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "lots")
    cluster = hwplace.Cluster.this_machine(plugin_manager=PluginManager())
    assert cluster.nodes[0].devices("fake-accelerator") == ()
    [problem] = cluster.problems
    assert problem.startswith("node 0: fake-accelerator: detect raised ValueError(")
    assert "HWPLACE_FAKE_ACCELERATORS must be an integer" in problem


def test_this_machine_detects_the_devices_declared_for_node_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "1")
    section = {
        "num_nodes": 1,
        "node_groups": [{"label": "arms", "node_ranks": 0, "hardware": {"type": "fake-robot", "configs": [
            {"node_rank": 0, "name": "left"}, {"node_rank": 0, "name": "right", "unhealthy": "e-stop"}]}}],
        "component_placement": {"arm": {"node_group": "arms", "placement": "0"}},
    }
    manager = PluginManager()
    cluster = hwplace.Cluster.this_machine(section, plugin_manager=manager)
    robots = cluster.nodes[0].devices("fake-robot")
    assert [(d.properties["name"], d.healthy, d.reason) for d in robots] == [("left", True, ""),
                                                                               ("right", False, "e-stop")]
    placement = hwplace.ComponentPlacement({"cluster": section}, cluster)
    assert placement.get_placements("arm")[0].env == {"FAKE_ROBOTS": "left", "FAKE_VISIBLE_DEVICES": ""}


def test_this_machine_without_the_node_plugin_uses_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("HWPLACE_DISABLED_PLUGINS", "node")
    cluster = hwplace.Cluster.this_machine(plugin_manager=PluginManager())
    only = cluster.nodes[0]
    assert only.address == only.node_id == socket.gethostname()
    assert "node" not in only.hardware


def test_detect_node_hardware_reports_undeclared_backends_and_plugin_failures(manager: PluginManager) -> None:
    class Broken:
        @hwplace.hookimpl
        def hwplace_hardware_backends(self) -> list[hwplace.HardwareBackend]:
            raise RuntimeError("vendor bug")

    with registered_plugin(Broken(), name="test-broken", plugin_manager=manager):
        hardware, problems = detect_node_hardware(
            {"no-such-robot": [{"node_rank": 0}], "fake-robot": [{"node_rank": 0, "name": "r"}]}, manager=manager)
    assert hardware["fake-robot"] == (hwplace.Device(0, "hwplace fake robot", properties={"name": "r"}),)
    assert problems["no-such-robot"] == "no such backend is registered on this node"
    assert problems["plugin 'test-broken'"].endswith("hwplace_hardware_backends raised RuntimeError('vendor bug')")


def test_detect_node_hardware_skips_undeclared_device_backends(manager: PluginManager) -> None:
    hardware, problems = detect_node_hardware({}, manager=manager)
    assert "fake-robot" not in hardware
    assert "node" in hardware
    assert problems == {}


def test_a_reserved_group_spans_every_node(manager: PluginManager) -> None:
    cluster = fake_cluster({"num_nodes": 3}, accelerators_per_node=1, plugin_manager=manager)
    assert cluster.config.group("cluster") == NodeGroup("cluster", (0, 1, 2))
    assert cluster.config.group("node") == NodeGroup("node", (0, 1, 2), ignore_hardware=True)
