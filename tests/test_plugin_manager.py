"""The plugin manager: discovery through entry points, collisions, broken plugins, tracing, bounded detection."""

from __future__ import annotations

import threading
import time

import pytest

import hwplace
from hwplace import plugin_manager
from hwplace.plugin_manager import PluginManager
from hwplace.testing import fake_cluster, registered_plugin

TPU_PLUGIN = """
import hwplace

class TPU(hwplace.HardwareBackend):
    name = "{name}"
    kind = "accelerator"
    def detect(self, configs):
        return [hwplace.Device(0, "vendor tpu")]
    def isolation_env(self, local_ids):
        return {{"TPU_VISIBLE_CHIPS": ",".join(map(str, local_ids))}}

@hwplace.hookimpl
def hwplace_hardware_backends():
    return [TPU()]
"""


class Sleepy(hwplace.HardwareBackend):
    name = "sleepy"
    kind = "accelerator"

    def __init__(self) -> None:
        self.release = threading.Event()

    def detect(self, configs):
        self.release.wait(30)
        return []


class Raising(hwplace.HardwareBackend):
    name = "raising"
    kind = "accelerator"

    def detect(self, configs):
        raise RuntimeError("driver exploded")


class Plugin:
    def __init__(self, *backends: object) -> None:
        self.backends = list(backends)

    @hwplace.hookimpl
    def hwplace_hardware_backends(self):
        return self.backends


def test_builtin_plugins_register_through_entry_points() -> None:
    manager = PluginManager()
    assert manager.plugins() == {"node": "hwplace", "fake": "hwplace"}
    backends = manager.backends()
    assert {name: info.kind for name, info in backends.items()} == {
        "node": "node", "fake-accelerator": "accelerator", "fake-robot": "device"}
    assert backends["fake-robot"].plugin == "fake"
    assert backends["fake-robot"].distribution == "hwplace"


def test_vendor_package_is_found_through_its_entry_point(vendor_distribution) -> None:
    vendor_distribution("vendor-tpu", "vendor_tpu", TPU_PLUGIN.format(name="vendor-tpu"))
    info = PluginManager().backend("vendor-tpu")
    assert (info.plugin, info.distribution, info.kind) == ("vendor_tpu", "vendor-tpu", "accelerator")
    assert info.backend.isolation_env([0, 2]) == {"TPU_VISIBLE_CHIPS": "0,2"}


def test_two_backends_with_one_name_is_an_error_naming_both_distributions(vendor_distribution) -> None:
    vendor_distribution("alpha-tpu", "alpha_tpu", TPU_PLUGIN.format(name="tpu"))
    vendor_distribution("beta-tpu", "beta_tpu", TPU_PLUGIN.format(name="tpu"))
    with pytest.raises(hwplace.PluginError, match="two backends are named 'tpu'") as caught:
        PluginManager().backends()
    assert "alpha-tpu" in str(caught.value)
    assert "beta-tpu" in str(caught.value)


def test_two_plugins_with_one_entry_point_name_is_an_error_naming_both(vendor_distribution) -> None:
    vendor_distribution("alpha-tpu", "alpha_tpu", TPU_PLUGIN.format(name="a"), entry_point="tpu")
    vendor_distribution("beta-tpu", "beta_tpu", TPU_PLUGIN.format(name="b"), entry_point="tpu")
    with pytest.raises(hwplace.PluginError, match="two plugins are named 'tpu'") as caught:
        PluginManager()
    assert "alpha-tpu" in str(caught.value)
    assert "beta-tpu" in str(caught.value)


def test_a_plugin_that_fails_to_import_is_reported_and_the_others_work(vendor_distribution) -> None:
    vendor_distribution("broken-tpu", "broken_tpu", "raise ImportError('libtpu.so not found')\n")
    manager = PluginManager()
    assert [(f.plugin, f.distribution) for f in manager.failures] == [("broken_tpu", "broken-tpu")]
    assert "libtpu.so not found" in manager.failures[0].error
    assert "fake-accelerator" in manager.backends()


def test_a_hook_that_raises_or_returns_garbage_is_reported_by_name() -> None:
    class Exploding:
        @hwplace.hookimpl
        def hwplace_hardware_backends(self):
            raise RuntimeError("boom")

    manager = PluginManager()
    manager.register(Exploding(), name="exploding")
    manager.register(Plugin("not a backend"), name="garbage")
    single = Plugin()
    single.backends = Raising()  # one backend, not a list of them
    manager.register(single, name="single")
    manager.register(Plugin(type("Bad", (hwplace.HardwareBackend,), {"name": "Bad Name!"})()), name="badname")
    failures = {f.plugin: f.error for f in manager.failures}
    assert "boom" in failures["exploding"]
    assert "not a hwplace.HardwareBackend" in failures["garbage"]
    assert "lower-case" in failures["badname"]
    assert "hwplace_hardware_backends returned <Raising 'raising' (accelerator)>, not a list" in failures["single"]
    assert "node" in manager.backends()


def test_disabled_plugins_are_not_loaded(monkeypatch, fresh_manager) -> None:
    monkeypatch.setenv("HWPLACE_DISABLED_PLUGINS", "fake, other")
    manager = fresh_manager()
    assert "fake" not in manager.plugins()
    assert set(manager.backends()) == {"node"}
    with pytest.raises(hwplace.ConfigError, match="'fake-accelerator' is not a registered accelerator backend"):
        fake_cluster(num_nodes=1, accelerators_per_node=2)


def test_tracing_prints_hook_calls_and_detections(monkeypatch, capsys) -> None:
    monkeypatch.setenv("HWPLACE_TRACE_PLUGINS", "1")
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "2")
    manager = PluginManager()
    manager.detect("fake-accelerator")
    err = capsys.readouterr().err
    assert "hwplace trace: hwplace_hardware_backends() [plugin fake] -> [<FakeAccelerator" in err
    assert "hwplace trace: fake-accelerator.detect([]) -> [Device(index=0" in err


def test_tracing_is_off_by_default(monkeypatch, capsys) -> None:
    monkeypatch.delenv("HWPLACE_TRACE_PLUGINS", raising=False)
    PluginManager().detect("node")
    assert "hwplace trace" not in capsys.readouterr().err


def test_detection_that_hangs_is_cut_off_and_reported() -> None:
    sleepy = Sleepy()
    manager = PluginManager()
    manager.register(Plugin(sleepy), name="sleepy-plugin")
    start = time.perf_counter()
    detection = manager.detect("sleepy", timeout=0.2)
    assert time.perf_counter() - start < 2
    sleepy.release.set()
    assert detection.devices == ()
    assert detection.error == "detect did not finish within 0.2 s"


def test_detection_that_raises_is_reported_not_raised() -> None:
    manager = PluginManager()
    manager.register(Plugin(Raising()), name="raising-plugin")
    detection = manager.detect("raising")
    assert "driver exploded" in detection.error


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ("nonsense", "not a list of hwplace.Device"),
        ([hwplace.Device(1, "x")], "expected 0..n-1"),
    ],
)
def test_detection_results_are_checked(devices, problem) -> None:
    backend = type("Odd", (hwplace.HardwareBackend,), {"name": "odd", "detect": lambda self, c: devices})()
    manager = PluginManager()
    manager.register(Plugin(backend), name="odd-plugin")
    assert problem in manager.detect("odd").error


def test_device_backends_answer_every_config() -> None:
    backend = type("Short", (hwplace.HardwareBackend,),
                   {"name": "short", "kind": "device", "detect": lambda self, c: []})()
    manager = PluginManager()
    manager.register(Plugin(backend), name="short-plugin")
    assert manager.detect("short", [{"node_rank": 0}]).error == "detect returned 0 devices for 1 configs"


def test_detect_timeout_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", "soon")
    with pytest.raises(hwplace.PluginError, match="HWPLACE_DETECT_TIMEOUT"):
        PluginManager().detect("node")


def test_broken_backend_does_not_hide_the_others_on_a_node(monkeypatch, fresh_manager) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "3")
    fresh_manager()
    with registered_plugin(Plugin(Raising()), name="raising-plugin"):
        cluster = hwplace.Cluster.this_machine()  # every backend detected
    node = cluster.nodes[0]
    assert len(node.devices("fake-accelerator")) == 3
    assert any("raising" in p and "driver exploded" in p for p in cluster.problems)


def test_registered_plugin_is_always_unregistered(fresh_manager) -> None:
    manager = fresh_manager()
    seen = []

    def use_and_fail() -> None:
        with registered_plugin(Plugin(Raising()), name="temporary"):
            seen.append("temporary" in manager.plugins())
            raise RuntimeError("test body failed")

    with pytest.raises(RuntimeError, match="test body failed"):
        use_and_fail()
    assert seen == [True]
    assert "temporary" not in manager.plugins()
    assert "raising" not in manager.backends()



class BrokenRobots(hwplace.HardwareBackend):
    name = "fake-robot"
    kind = "device"

    def detect(self, configs):
        return 1 / 0


def test_a_problem_on_many_nodes_is_reported_once_with_its_nodes() -> None:
    manager = PluginManager(load_entry_points=False)
    manager.register(Plugin(BrokenRobots()), name="broken-robots")
    detection = manager.detect("fake-robot", [{"node_rank": 0}])
    assert detection.error == "detect raised ZeroDivisionError('division by zero')"
    nodes = [hwplace.Node(rank, f"n{rank}", f"10.0.0.{rank}", problems={"fake-robot": detection.error} if rank != 4
                          else {}) for rank in range(6)]
    cluster = hwplace.Cluster(nodes=nodes, plugin_manager=manager)
    assert cluster.problems == ["nodes 0-3,5: fake-robot: detect raised ZeroDivisionError('division by zero')"]
