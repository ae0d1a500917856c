"""backend_plugin: a plugin object providing the hardware backends and executors it is given."""

from __future__ import annotations

import pytest

import hwplace
from hwplace.testing import backend_plugin, registered_plugin


class Lamp(hwplace.HardwareBackend):
    name = "test-lamp"
    kind = "device"


class Elsewhere(hwplace.Executor):
    name = "test-elsewhere"

    def discover(self, config: object, plugin_manager: object) -> list[hwplace.Node]:
        return []

    def free_port(self, node: hwplace.Node) -> int:
        return 29500

    def start_group(self, request: object) -> hwplace.executor.GroupRuntime:
        raise hwplace.ConfigError("executor", "this test executor starts no groups")

    def find_group(self, name: str) -> None:
        return None

    def where(self) -> str:
        return "elsewhere"


def test_the_plugin_provides_its_backends_and_executors_as_given() -> None:
    lamp, elsewhere = Lamp(), Elsewhere()
    plugin = backend_plugin(lamp, elsewhere)
    manager = hwplace.PluginManager(load_entry_points=False)
    with registered_plugin(plugin, name="lamp-plugin", plugin_manager=manager):
        assert manager.backend("test-lamp").backend is lamp
        assert manager.backend("test-lamp").plugin == "lamp-plugin"
        assert manager.executor("test-elsewhere") is elsewhere
        assert manager.failures == []
    assert "test-lamp" not in manager.backends()
    assert (plugin.hwplace_hardware_backends(), plugin.hwplace_executors()) == ([lamp], [elsewhere])
    assert repr(plugin) == f"backend_plugin({lamp!r}, {elsewhere!r})"


def test_an_empty_plugin_provides_nothing() -> None:
    manager = hwplace.PluginManager(load_entry_points=False)
    manager.register(backend_plugin(), name="empty")
    assert (dict(manager.backends()), dict(manager.executors()), manager.failures) == ({}, {}, [])


def test_anything_but_a_backend_or_an_executor_is_refused() -> None:
    with pytest.raises(TypeError, match=r"takes hwplace.HardwareBackend and hwplace.executor.Executor instances, "
                                        r"not 'tpu', <class '.*Lamp'>$"):
        backend_plugin(Lamp(), "tpu", Lamp)  # type: ignore[arg-type]
