"""The fake backend: a first-class plugin that behaves like a real one."""

from __future__ import annotations

import os

import pytest

import hwplace
from hwplace.plugin.manager import PluginManager
from hwplace_plugins.fake import FakeAccelerator, FakeRobot


def test_accelerators_are_counted_from_the_node_environment(monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "3")
    devices = FakeAccelerator().detect([])
    assert [d.index for d in devices] == [0, 1, 2]
    assert all(d.healthy for d in devices)
    assert len({d.properties["uuid"] for d in devices}) == 3


def test_no_variable_means_no_accelerators(monkeypatch) -> None:
    monkeypatch.delenv("HWPLACE_FAKE_ACCELERATORS", raising=False)
    assert FakeAccelerator().detect([]) == []


def test_a_bad_count_is_reported_as_a_broken_backend(monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "eight")
    detection = PluginManager().detect("fake-accelerator")
    assert detection.devices == ()
    assert "HWPLACE_FAKE_ACCELERATORS must be an integer from 0 to 4096, got 'eight'" in str(detection.error)


@pytest.mark.parametrize("count", ["4097", "1000000000", "9" * 5000, "٣"])
def test_an_absurd_count_is_refused_before_anything_is_allocated(monkeypatch, count) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", count)
    detection = PluginManager().detect("fake-accelerator", timeout=5)
    assert detection.devices == ()
    assert "must be an integer from 0 to 4096" in str(detection.error)
    assert detection.seconds < 1


@pytest.mark.parametrize(("value", "expected"), [
    (None, 80 * 2**30), ("", 80 * 2**30), ("40GiB", 40 * 2**30), ("24 GB", 24 * 10**9), ("0.5TiB", 2**39),
    ("1073741824", 2**30), (" 10GiB ", 10 * 2**30),
])
def test_each_accelerator_has_the_memory_the_variable_gives(monkeypatch, value: str | None, expected: int) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "2")
    if value is None:
        monkeypatch.delenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", raising=False)
    else:
        monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", value)
    assert [d.properties["memory_bytes"] for d in FakeAccelerator().detect([])] == [expected] * 2
    planned = hwplace.testing.fake_cluster(num_nodes=1, accelerators_per_node=2)  # offline inventories alike
    assert [d.properties["memory_bytes"] for d in planned.nodes[0].devices("fake-accelerator")] == [expected] * 2


@pytest.mark.parametrize("value", ["80G", "lots", "-1GiB", "1.5", "9" * 30, "2000000TiB"])
def test_a_bad_memory_is_reported_naming_the_variable(monkeypatch, value: str) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "2")
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", value)
    detection = PluginManager().detect("fake-accelerator", timeout=5)
    assert detection.devices == ()
    assert "HWPLACE_FAKE_ACCELERATOR_MEMORY: " in str(detection.error)
    with pytest.raises(hwplace.ConfigError, match=r"^HWPLACE_FAKE_ACCELERATOR_MEMORY: ") as caught:
        hwplace.testing.fake_cluster(num_nodes=1, accelerators_per_node=2)
    assert caught.value.path == "HWPLACE_FAKE_ACCELERATOR_MEMORY"
    hwplace.testing.fake_cluster(num_nodes=1, accelerators_per_node=0)  # no fake accelerator: not read


def test_isolation_variables() -> None:
    accelerators = [hwplace.Device(i, "fake") for i in (1, 3)]
    assert FakeAccelerator().isolation_env(accelerators) == {"FAKE_VISIBLE_DEVICES": "1,3"}
    robots = FakeRobot().detect([{"node_rank": 0, "name": "left"}, {"node_rank": 0}])
    assert FakeRobot().isolation_env(robots) == {"FAKE_ROBOTS": "left,fake-robot-1"}
    assert FakeRobot().isolation_env(robots[1:]) == {"FAKE_ROBOTS": "fake-robot-1"}


def test_one_robot_per_config_with_its_health() -> None:
    robots = FakeRobot().detect([{"node_rank": 0, "name": "arm"}, {"node_rank": 0, "unhealthy": "e-stop pressed"}])
    assert [(r.index, r.healthy, r.reason, r.properties["name"]) for r in robots] == [
        (0, True, "", "arm"), (1, False, "e-stop pressed", "fake-robot-1")]


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"node_rank": 0, "port": "/dev/ttyUSB0"}, "unknown fake-robot key"),
        ({"node_rank": 0, "name": 3}, "string"),
        ({"node_rank": 0, "name": "a,b"}, "may not contain ','"),
    ],
)
def test_robot_configs_are_checked(config, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        FakeRobot().check_config(config)


def test_fake_cluster_plans_per_node_counts_and_declared_robots() -> None:
    cfg = {"num_nodes": 2, "node_groups": [{"label": "robot", "node_ranks": 1, "hardware": {
        "type": "fake-robot", "configs": [{"node_rank": 1, "name": "a"}, {"node_rank": 1, "name": "b"}]}}]}
    cluster = hwplace.testing.fake_cluster(cfg, accelerators_per_node=[4, 2])
    assert [len(n.devices("fake-accelerator")) for n in cluster.nodes] == [4, 2]
    assert [d.properties["name"] for d in cluster.nodes[1].devices("fake-robot")] == ["a", "b"]
    assert cluster.nodes[0].devices("fake-robot") == ()
    assert [n.node_id for n in cluster.nodes] == ["fake-node-0", "fake-node-1"]
    assert cluster.problems == []


def test_fake_cluster_leaves_the_callers_environment_alone(monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "7")
    hwplace.testing.fake_cluster(num_nodes=3, accelerators_per_node=1)
    assert os.environ["HWPLACE_FAKE_ACCELERATORS"] == "7"


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"num_nodes": 2, "accelerators_per_node": [8]}, "gives 1 counts for num_nodes=2"),
        ({"accelerators_per_node": [8, -1]}, "-1 is not a count from 0 to 65536"),
        ({"accelerators_per_node": True}, "must be an integer"),
        ({"accelerators_per_node": []}, "at least one node"),
    ],
)
def test_fake_cluster_arguments_are_checked(kwargs, problem) -> None:
    with pytest.raises(hwplace.ConfigError, match=problem):
        hwplace.testing.fake_cluster(**kwargs)


def test_fake_cluster_refuses_fewer_nodes_than_the_config_asks_for() -> None:
    with pytest.raises(hwplace.ConfigError, match="asks for 4 nodes but 2 are available") as caught:
        hwplace.testing.fake_cluster({"num_nodes": 4}, num_nodes=2)
    assert caught.value.path == "cluster.num_nodes"
    assert "fake-node-1" in str(caught.value)
