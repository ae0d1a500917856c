"""The plugin manager: discovery through entry points, collisions, broken plugins, tracing, bounded detection."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

import hwplace
from hwplace.application.cli import main
from hwplace.plugin.manager import PluginManager
from hwplace.testing import backend_plugin, fake_cluster, registered_plugin

TPU_PLUGIN = """
import hwplace

class TPU(hwplace.HardwareBackend):
    name = "{name}"
    kind = "accelerator"
    def detect(self, configs):
        return [hwplace.Device(0, "vendor tpu")]
    def isolation_env(self, devices):
        return {{"TPU_VISIBLE_CHIPS": ",".join(str(d.index) for d in devices)}}

@hwplace.hookimpl
def hwplace_hardware_backends():
    return [TPU()]
"""


class Sleepy(hwplace.HardwareBackend):
    name = "sleepy"
    kind = "accelerator"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = False

    def detect(self, configs):
        self.release.wait(30)
        self.returned = True
        return []


class Raising(hwplace.HardwareBackend):
    name = "raising"
    kind = "accelerator"

    def detect(self, configs):
        raise RuntimeError("driver exploded")


class AsGiven:
    """A plugin whose hooks return what it was given, unchecked: things that are not backends or executors, or
    one backend rather than a list of them (a plugin that provides good ones is ``backend_plugin``'s)."""

    def __init__(self, *, backends: object = None, executors: object = None) -> None:
        self.backends = [] if backends is None else backends
        self.executors = [] if executors is None else executors

    @hwplace.hookimpl
    def hwplace_hardware_backends(self):
        return self.backends

    @hwplace.hookimpl
    def hwplace_executors(self):
        return self.executors


BUILTIN_KINDS = {"node": "node", "fake-accelerator": "accelerator", "fake-robot": "device",
                 "cuda": "accelerator", "npu": "accelerator", "serial-robot": "device"}


def test_builtin_plugins_register_through_entry_points() -> None:
    manager = PluginManager()
    assert manager.plugins() == dict.fromkeys(["node", "fake", "ray", "cuda", "npu", "serial"], "hwplace")
    assert manager.executors()["ray"].distribution == "hwplace"
    backends = manager.backends()
    assert {name: info.kind for name, info in backends.items()} == BUILTIN_KINDS
    assert backends["fake-robot"].plugin == "fake"
    assert backends["fake-robot"].distribution == "hwplace"


def test_vendor_package_is_found_through_its_entry_point(vendor_distribution) -> None:
    vendor_distribution("vendor-tpu", "vendor_tpu", TPU_PLUGIN.format(name="vendor-tpu"))
    info = PluginManager().backend("vendor-tpu")
    assert (info.plugin, info.distribution, info.kind) == ("vendor_tpu", "vendor-tpu", "accelerator")
    chips = [hwplace.Device(0, "tpu"), hwplace.Device(2, "tpu")]
    assert info.backend.isolation_env(chips) == {"TPU_VISIBLE_CHIPS": "0,2"}


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
    manager.register(AsGiven(backends=["not a backend"]), name="garbage")
    manager.register(AsGiven(backends=Raising()), name="single")  # one backend, not a list of them
    manager.register(backend_plugin(type("Bad", (hwplace.HardwareBackend,), {"name": "Bad Name!"})()), name="badname")
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
    assert set(manager.backends()) == set(BUILTIN_KINDS) - {"fake-accelerator", "fake-robot"}
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
    manager.register(backend_plugin(sleepy), name="sleepy-plugin")
    detection = manager.detect("sleepy", timeout=0.2)
    assert not sleepy.returned  # detect was cut off while the backend still hung
    sleepy.release.set()
    assert detection.devices == ()
    assert detection.error == "detect did not finish within 0.2 s"


def test_detection_that_raises_is_reported_not_raised() -> None:
    manager = PluginManager()
    manager.register(backend_plugin(Raising()), name="raising-plugin")
    detection = manager.detect("raising")
    assert "driver exploded" in str(detection.error)


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
    manager.register(backend_plugin(backend), name="odd-plugin")
    assert problem in str(manager.detect("odd").error)


def test_device_backends_answer_every_config() -> None:
    backend = type("Short", (hwplace.HardwareBackend,),
                   {"name": "short", "kind": "device", "detect": lambda self, c: []})()
    manager = PluginManager()
    manager.register(backend_plugin(backend), name="short-plugin")
    assert manager.detect("short", [{"node_rank": 0}]).error == "detect returned 0 devices for 1 configs"


def test_detect_timeout_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", "soon")
    with pytest.raises(hwplace.PluginError, match="HWPLACE_DETECT_TIMEOUT"):
        PluginManager().detect("node")


def test_broken_backend_does_not_hide_the_others_on_a_node(monkeypatch, fresh_manager) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "3")
    fresh_manager()
    with registered_plugin(backend_plugin(Raising()), name="raising-plugin"):
        cluster = hwplace.Cluster.this_machine()  # every backend detected
    node = cluster.nodes[0]
    assert len(node.devices("fake-accelerator")) == 3
    assert any("raising" in p and "driver exploded" in p for p in cluster.problems)


def test_registered_plugin_is_always_unregistered(fresh_manager) -> None:
    manager = fresh_manager()
    seen = []

    def use_and_fail() -> None:
        with registered_plugin(backend_plugin(Raising()), name="temporary"):
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
    manager.register(backend_plugin(BrokenRobots()), name="broken-robots")
    detection = manager.detect("fake-robot", [{"node_rank": 0}])
    assert detection.error == "detect raised ZeroDivisionError('division by zero')"
    nodes = [hwplace.Node(rank, f"n{rank}", f"10.0.0.{rank}", problems={"fake-robot": detection.error} if rank != 4
                          else {}) for rank in range(6)]
    cluster = hwplace.Cluster(nodes=nodes, plugin_manager=manager)
    assert cluster.problems == ["nodes 0-3,5: fake-robot: detect raised ZeroDivisionError('division by zero')"]


# -- hooks are called through pluggy ------------------------------------------------------------------


class Extra(hwplace.HardwareBackend):
    name = "extra"
    kind = "accelerator"

    def detect(self, configs):
        return []


class Wrapping:
    """A plugin that wraps the other plugins' results, as pluggy's new-style wrappers do."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    @hwplace.hookimpl(wrapper=True)
    def hwplace_hardware_backends(self):
        results = yield
        self.seen.append(sorted(b.name for result in results for b in result))
        return [*results, [Extra()]]


def test_a_hook_wrapper_sees_every_result_and_may_add_to_them() -> None:
    manager = PluginManager()
    wrapper = Wrapping()
    manager.register(wrapper, name="wrapping")
    backends = manager.backends()
    assert wrapper.seen == [sorted(BUILTIN_KINDS)]
    assert set(backends) == {*BUILTIN_KINDS, "extra"}
    assert backends["extra"].plugin == "(a hook wrapper)"
    assert backends["fake-robot"].plugin == "fake"
    assert manager.failures == []


def test_a_plain_hook_that_raises_does_not_stop_a_wrapper_or_the_others() -> None:
    manager = PluginManager()
    wrapper = Wrapping()
    manager.register(wrapper, name="wrapping")
    manager.register(backend_plugin(Raising()), name="fine")
    manager.register(Exploding(), name="exploding")
    assert {"node", "fake-accelerator", "raising", "extra"} <= set(manager.backends())
    assert [(f.plugin, f.error) for f in manager.failures] == [
        ("exploding", "hwplace_hardware_backends raised SystemExit(3)")]


class Exploding:
    @hwplace.hookimpl
    def hwplace_hardware_backends(self):
        raise SystemExit(3)


def test_wrapper_true_on_a_plain_function_cannot_be_registered() -> None:
    class NotAGenerator:
        @hwplace.hookimpl(wrapper=True)
        def hwplace_hardware_backends(self):
            return []

    manager = PluginManager()
    with pytest.raises(hwplace.PluginError, match=r"plugin 'not-a-generator' .* cannot be registered.*generator"):
        manager.register(NotAGenerator(), name="not-a-generator")
    assert "not-a-generator" not in manager.plugins()
    assert "fake-accelerator" in manager.backends()


def test_a_misspelled_hook_is_refused_at_registration_and_leaves_nothing_behind() -> None:
    class Misspelled:
        @hwplace.hookimpl
        def hwplace_executor(self):
            return []

    manager = PluginManager()
    with pytest.raises(hwplace.PluginError, match=r"plugin 'typo' \(\(registered at run time\)\) cannot be registered: "
                       r"hwplace_executor is not a hwplace hook; did you mean 'hwplace_executors'\? \(hooks: "
                       r"hwplace_executors, hwplace_hardware_backends\)"):
        manager.register(Misspelled(), name="typo")
    assert "typo" not in manager.plugins()
    manager._pm.check_pending()  # pluggy's own check finds nothing left unmatched
    assert "ray" in manager.executors()


# -- plugins broken in every way are reported by name; the others keep working -----------------------

BROKEN_PLUGINS = {
    "wrong signature": ("import hwplace\n@hwplace.hookimpl\ndef hwplace_hardware_backends(cluster):\n    return []\n",
                        "cannot be registered"),
    "exit at import": ("raise SystemExit('no licence server')\n", "SystemExit('no licence server')"),
    "wrapper on a plain function": (
        "import hwplace\n@hwplace.hookimpl(wrapper=True)\ndef hwplace_hardware_backends():\n    return []\n",
        "cannot be registered"),
    "name that raises": ("import hwplace\nclass B(hwplace.HardwareBackend):\n    kind = 'accelerator'\n"
                         "    @property\n    def name(self):\n        raise KeyError('name')\n"
                         "    def __repr__(self):\n        raise ValueError('repr')\n"
                         "@hwplace.hookimpl\ndef hwplace_hardware_backends():\n    return [B()]\n",
                         "reading B.name and .kind raised KeyError('name')"),
    "returns a string": ("import hwplace\n@hwplace.hookimpl\ndef hwplace_hardware_backends():\n    return 'tpu'\n",
                         "returned 'tpu', not a list"),
    "misspelled hook": ("import hwplace\n@hwplace.hookimpl\ndef hwplace_hardware_backend():\n    return []\n",
                        "hwplace_hardware_backend is not a hwplace hook; did you mean 'hwplace_hardware_backends'?"),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN_PLUGINS))
def test_a_broken_plugin_is_reported_by_name_and_the_others_work(
    vendor_distribution, fresh_manager, breakage, capsys
) -> None:
    source, problem = BROKEN_PLUGINS[breakage]
    vendor_distribution("broken-vendor", "broken_vendor", source)
    manager = fresh_manager()
    failures = [(f.plugin, f.distribution) for f in manager.failures]
    assert failures == [("broken_vendor", "broken-vendor")]
    assert problem in manager.failures[0].error
    assert {"node", "fake-accelerator", "fake-robot"} <= set(manager.backends())
    code = main(["hardware", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert any("broken_vendor" in p and problem in p for p in report["problems"])


def test_an_entry_point_naming_a_module_already_registered_is_reported(vendor_distribution) -> None:
    info = vendor_distribution("copycat", "copycat_unused", "", entry_point="copycat")
    (info / "entry_points.txt").write_text("[hwplace]\ncopycat = hwplace_plugins.fake\nstdlib = json\n")
    manager = PluginManager()
    # Whichever entry point comes first holds the module; the other is reported, naming both.
    [failure] = manager.failures
    assert failure.plugin in {"fake", "copycat"}
    assert re.search(r"hwplace_plugins.fake.*already registered as plugin '(fake|copycat)'", failure.error)
    assert {"fake", "copycat"} - {failure.plugin} <= set(manager.plugins())
    assert manager.backends()["fake-accelerator"].plugin in {"fake", "copycat"}
    assert "stdlib" in manager.plugins()  # a module without hooks is harmless


def test_check_config_raising_anything_is_a_config_error_naming_the_backend() -> None:
    class Picky(hwplace.HardwareBackend):
        name = "picky"
        kind = "device"

        def detect(self, configs):
            return []

        def check_config(self, config):
            return config["port"]  # KeyError for a config without one

    manager = PluginManager()
    manager.register(backend_plugin(Picky()), name="picky-plugin")
    section = {"num_nodes": 1, "node_groups": [{"label": "arms", "node_ranks": 0,
                                                "hardware": {"type": "picky", "configs": [{"node_rank": 0}]}}]}
    with pytest.raises(hwplace.ConfigError, match=r"configs\[0\]: the 'picky' backend .* failed to check this entry: "
                       r"check_config raised KeyError\('port'\)"):
        hwplace.parse_cluster_config(section, plugin_manager=manager)


def test_device_properties_that_are_not_plain_data_fail_detection_not_the_command(fresh_manager, capsys) -> None:
    fresh_manager()
    class Odd(hwplace.HardwareBackend):
        name = "odd"
        kind = "accelerator"

        def detect(self, configs):
            return [hwplace.Device(0, "odd", properties={"handle": object()})]

    class Nullish(hwplace.HardwareBackend):
        name = "nullish"
        kind = "accelerator"

        def detect(self, configs):
            return [hwplace.Device(0, "nullish", properties={"serial": None, "ids": [1, 2]})]

    with registered_plugin(backend_plugin(Odd(), Nullish()), name="odd-plugin"):
        code = main(["hardware", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    odd = next(b for b in report["backends"] if b["name"] == "odd")
    assert odd["devices"] == []
    assert "Device.properties['handle'] is a object" in odd["problem"]
    nullish = next(b for b in report["backends"] if b["name"] == "nullish")
    assert nullish["devices"][0]["properties"] == {"serial": None, "ids": [1, 2]}


# -- detection runs once, and a hung detect is never started twice -----------------------------------


class Counting(hwplace.HardwareBackend):
    name = "counting"
    kind = "accelerator"

    def __init__(self) -> None:
        self.calls = 0

    def detect(self, configs):
        self.calls += 1
        return [hwplace.Device(0, "counted")]


def test_detection_runs_once_per_manager_unless_refreshed() -> None:
    backend = Counting()
    manager = PluginManager(load_entry_points=False)
    manager.register(backend_plugin(backend), name="counting-plugin")
    first = manager.detect("counting")
    assert manager.detect("counting") is first
    hwplace.Cluster.this_machine(plugin_manager=manager)
    assert backend.calls == 1
    manager.detect("counting", refresh=True)
    assert backend.calls == 2


def test_a_detect_that_timed_out_is_not_started_again_while_it_runs() -> None:
    sleepy = Sleepy()
    manager = PluginManager(load_entry_points=False)
    manager.register(backend_plugin(sleepy), name="sleepy-plugin")
    try:
        before = threading.active_count()
        assert manager.detect("sleepy", timeout=0.05).error == "detect did not finish within 0.05 s"
        for _ in range(5):
            again = manager.detect("sleepy", timeout=0.05, refresh=True)
            assert again.error == "an earlier detect is still running (it timed out and has not returned)"
        assert threading.active_count() == before + 1
    finally:
        sleepy.release.set()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e9"])
def test_detect_timeout_must_be_a_finite_positive_bound(monkeypatch, value) -> None:
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", value)
    with pytest.raises(hwplace.PluginError, match=r"HWPLACE_DETECT_TIMEOUT is .*above 0 and at most 3600"):
        PluginManager().detect("node")


# -- registered_plugin while the plugin is also installed ---------------------------------------------


def test_registered_plugin_of_an_installed_plugin_leaves_it_in_place() -> None:
    import hwplace_plugins.fake as fake_plugin

    manager = PluginManager()
    with registered_plugin(fake_plugin, plugin_manager=manager) as name:
        assert name == "fake"
        assert manager.backends()["fake-accelerator"].distribution == "hwplace"
    assert manager.plugins()["fake"] == "hwplace"


def test_registered_plugin_sets_aside_an_installed_one_providing_the_same_backend() -> None:
    import hwplace_plugins.fake as fake_plugin

    class DevelopmentFake(hwplace.HardwareBackend):
        name = "fake-accelerator"
        kind = "accelerator"

        def detect(self, configs):
            return []

    manager = PluginManager()
    with registered_plugin(backend_plugin(DevelopmentFake()), name="fake-dev", plugin_manager=manager):
        assert isinstance(manager.backend("fake-accelerator").backend, DevelopmentFake)
        assert "fake" not in manager.plugins()
    assert manager.plugin("fake") is fake_plugin
    assert manager.plugins()["fake"] == "hwplace"
    assert manager.backend("fake-accelerator").plugin == "fake"
    with registered_plugin(fake_plugin, name="fake-again", plugin_manager=manager):
        assert manager.backend("fake-accelerator").plugin == "fake-again"
    assert manager.backend("fake-accelerator").plugin == "fake"


# -- executors ------------------------------------------------------------------------------------------


class InventoryExecutor(hwplace.Executor):
    """An executor over a fixed inventory, enough to exercise the hook and Cluster's use of it."""

    name = "inventory"

    def discover(self, config, plugin_manager):
        return [hwplace.Node(rank, f"inv-{rank}", f"10.1.0.{rank}") for rank in range(3)]

    def free_port(self, node):
        return 29500

    def start_group(self, request):
        raise hwplace.ConfigError("executor", "this test executor starts no groups")

    def find_group(self, name):
        return None

    def where(self):
        return "a list of nodes"


def test_an_executor_plugin_is_found_by_name_and_used_by_cluster() -> None:
    manager = PluginManager()
    manager.register(backend_plugin(InventoryExecutor()), name="inventory-plugin")
    assert manager.executors()["inventory"].plugin == "inventory-plugin"
    cluster = hwplace.Cluster({"num_nodes": 2, "executor": "inventory"}, plugin_manager=manager)
    assert [n.node_id for n in cluster.nodes] == ["inv-0", "inv-1"]
    with pytest.raises(hwplace.ConfigError, match=r"cluster.executor: no executor is named 'inventary'; registered: "
                       r"inventory, ray; did you mean 'inventory'\?"):
        hwplace.Cluster({"num_nodes": 1, "executor": "inventary"}, plugin_manager=manager)


def test_broken_or_clashing_executors() -> None:
    manager = PluginManager()
    manager.register(AsGiven(executors=["not an executor", InventoryExecutor()]), name="mixed")
    assert set(manager.executors()) == {"inventory", "ray"}
    assert any("'not an executor' is not a hwplace.Executor" in f.error for f in manager.failures)
    manager.register(backend_plugin(InventoryExecutor()), name="second")
    with pytest.raises(hwplace.PluginError, match=r"two executors are named 'inventory': one from plugin '(mix|sec)"):
        manager.executors()


def test_the_default_executor_is_named_in_the_error_when_missing() -> None:
    manager = PluginManager(load_entry_points=False)
    with pytest.raises(hwplace.ConfigError, match=r"cluster.executor: no executor is named 'ray'.*hwplace\[ray\]"):
        hwplace.Cluster({"num_nodes": 1}, plugin_manager=manager)


def test_the_core_finds_the_node_backend_by_kind_only(monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_DISABLED_PLUGINS", "node")
    manager = PluginManager()
    with pytest.raises(hwplace.PluginError, match=r"exactly one backend of kind 'node' must be registered, found none.*"
                       "HWPLACE_DISABLED_PLUGINS=node"):
        manager.node_backend()
    cluster = fake_cluster(num_nodes=1, accelerators_per_node=2, plugin_manager=manager)
    assert set(cluster.nodes[0].hardware) == {"fake-accelerator"}  # nothing stands in for the node backend
    with pytest.raises(hwplace.PlacementError, match="exactly one backend of kind 'node'"):
        hwplace.NodePlacementStrategy([0]).get_placement(cluster)
    assert len(hwplace.PackedPlacementStrategy(0, 1).get_placement(cluster)) == 2


def test_builtin_plugins_use_only_the_public_api() -> None:
    """``hwplace`` itself, ``hwplace.executor`` (the interface for writing an executor), ``hwplace.names`` (the
    names they share with the core) and ``hwplace.testing`` (test helpers), nothing else."""
    root = Path(hwplace.__file__).resolve().parents[1] / "plugins"
    for source in root.rglob("*.py"):
        text = source.read_text()
        for face in ("hwplace.executor", "hwplace.names", "hwplace.testing"):
            text = text.replace(f"from {face} import", "")
        assert "from hwplace." not in text, source
        assert "import hwplace." not in text, source


def test_two_plugins_without_hooks_are_two_plugins() -> None:
    manager = PluginManager(load_entry_points=False)
    manager.register(object(), name="first")
    manager.register(object(), name="second")
    assert set(manager.plugins()) == {"first", "second"}
    assert manager.failures == []
