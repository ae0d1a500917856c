"""The backend conformance kit: what every hwplace hardware backend must do, as pytest tests.

A backend author subclasses :class:`BackendConformance` in a test module and names the backend::

    from hwplace.testing.conformance import BackendConformance
    import my_tpu_hwplace

    class TestMyTPU(BackendConformance):
        plugin = my_tpu_hwplace            # the module (or object) the entry point names
        backend_name = "my-tpu"
        configs = []                       # device backends: sample hardware.configs entries for one node

pytest then runs every check below against it, on whatever this machine has: real hardware where
present, the backend's answer for "none here" where not. Requires pytest (imported here only).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from hwplace.contracts.hardware import KINDS, PLUGIN_NAME, Device, HardwareBackend, check_backend
from hwplace.inventory.offline import fake_cluster
from hwplace.planning.strategies import PackedPlacementStrategy
from hwplace.plugin.detection import Detection, detect_timeout
from hwplace.plugin.manager import PluginManager

ODD_CONFIGS: tuple[Any, ...] = (
    {}, {"": None}, {"unknown-key": 1}, {"port": None}, {"port": 12}, {"baudrate": -1},
    {"name": "x" * 10_000}, {"nested": {"deep": [1, {"x": None}]}}, {"node_rank": 0},
)
"""``hardware.configs`` entries a backend must refuse with a ``ValueError`` (or accept), never crash on."""


class BackendConformance:
    """Subclass as ``Test<Something>`` and set ``plugin`` and ``backend_name`` (and ``configs`` for devices)."""

    plugin: Any = None  # not a ClassVar: type checkers then accept a module assigned in the subclass
    backend_name: ClassVar[str] = ""
    configs: ClassVar[Sequence[Mapping[str, Any]]] = ()

    # -- fixtures --------------------------------------------------------------------------------------

    @pytest.fixture
    def manager(self) -> PluginManager:
        """A plugin manager holding only this plugin, registered the way its entry point would."""
        if self.plugin is None or not self.backend_name:
            pytest.fail(f"{type(self).__name__} must set `plugin` (the plugin module) and `backend_name`")
        manager = PluginManager(load_entry_points=False)
        manager.register(self.plugin, name="conformance-plugin")
        return manager

    @pytest.fixture
    def backend(self, manager: PluginManager) -> HardwareBackend:
        return manager.backend(self.backend_name).backend

    @pytest.fixture
    def detection(self, manager: PluginManager, backend: HardwareBackend) -> Detection:
        """``detect`` on this machine, run as hwplace runs it: bounded in time, its result checked."""
        detection = manager.detect(self.backend_name, self._configs(backend), refresh=True)
        if detection.error is not None:
            pytest.fail(f"{self.backend_name}: {detection.error}; a backend reports what it finds, unhealthy "
                        "devices with a reason, or NoDevices(reason) — it never raises or hangs")
        return detection

    @pytest.fixture
    def detected(self, detection: Detection) -> list[Device]:
        return list(detection.devices)

    def _configs(self, backend: HardwareBackend) -> Sequence[Mapping[str, Any]]:
        return list(self.configs) if backend.kind == "device" else []

    # -- identity --------------------------------------------------------------------------------------

    def test_the_plugin_provides_the_backend(self, manager: PluginManager) -> None:
        assert self.backend_name in manager.backends(), (
            f"the plugin provides {sorted(manager.backends())}, not {self.backend_name!r}; failures: "
            f"{[f.error for f in manager.failures]}")
        assert manager.failures == []

    def test_name_and_kind_are_valid(self, backend: HardwareBackend) -> None:
        assert check_backend(backend) is None
        assert PLUGIN_NAME.match(backend.name)
        assert backend.kind in KINDS

    # -- detection -------------------------------------------------------------------------------------

    def test_detect_finishes_within_its_time_bound_and_returns_devices(
        self, manager: PluginManager, backend: HardwareBackend
    ) -> None:
        detection = manager.detect(self.backend_name, self._configs(backend), refresh=True)
        assert detection.error is None, f"detect failed here: {detection.error}"
        assert detection.seconds < detect_timeout()

    def test_devices_are_numbered_from_zero_and_well_formed(
        self, backend: HardwareBackend, detected: list[Device]
    ) -> None:
        assert all(isinstance(d, Device) for d in detected)
        assert [d.index for d in detected] == list(range(len(detected)))
        if backend.kind == "device":
            assert len(detected) == len(self._configs(backend)), "a device backend answers each config entry"
        for device in detected:
            assert device.model, f"device {device.index} has no model"
            assert device.healthy or device.reason, f"unhealthy device {device.index} gives no reason"

    def test_none_here_says_why(self, backend: HardwareBackend, detection: Detection) -> None:
        if detection.devices or backend.kind == "device":
            pytest.skip(f"{len(detection.devices)} {self.backend_name} device(s) here")
        if not (detection.absent or "").strip():
            pytest.fail("detect found nothing without saying why: return hwplace.NoDevices('the reason')")

    def test_detection_is_stable(self, manager: PluginManager, backend: HardwareBackend,
                                 detected: list[Device]) -> None:
        rerun = manager.detect(self.backend_name, self._configs(backend), refresh=True)
        assert rerun.error is None
        again = rerun.devices
        assert [d.index for d in again] == [d.index for d in detected]
        assert [d.properties for d in again if d.healthy] == [d.properties for d in detected if d.healthy]

    def test_devices_are_immutable_and_picklable(self, detected: list[Device]) -> None:
        for device in self._or_planned(detected):
            assert pickle.loads(pickle.dumps(device)) == device
            with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign"):
                device.index = 99  # type: ignore[misc]

    # -- isolation -------------------------------------------------------------------------------------

    def _or_planned(self, detected: list[Device]) -> list[Device]:
        return detected or [Device(0, f"planned {self.backend_name}"), Device(1, f"planned {self.backend_name}")]

    def test_isolation_env_is_plain_strings(self, backend: HardwareBackend, detected: list[Device]) -> None:
        devices = self._or_planned(detected)
        for subset in ([devices[0]], devices):
            env = backend.isolation_env(subset)
            assert isinstance(env, dict)
            for key, value in env.items():
                assert isinstance(key, str) and key.isidentifier(), f"variable name {key!r}"  # noqa: PT018
                assert isinstance(value, str) and "\0" not in value, f"{key}={value!r}"  # noqa: PT018
            assert backend.isolation_env(subset) == env, "isolation_env must be deterministic"

    def test_isolation_tells_devices_apart(self, backend: HardwareBackend, detected: list[Device]) -> None:
        if backend.kind == "node":
            pytest.skip("a node backend asks for no isolation")
        devices = self._or_planned(detected)
        if len(devices) < 2:
            pytest.skip("one device here: nothing to tell apart")
        first, second = backend.isolation_env([devices[0]]), backend.isolation_env([devices[1]])
        assert first, "isolation_env gives no variables: every process would see every device"
        assert first != second, "two devices get the same isolation variables"

    def test_planning_offline_uses_the_backend_isolation(self, manager: PluginManager,
                                                         backend: HardwareBackend) -> None:
        if backend.kind != "accelerator":
            pytest.skip("offline accelerator inventories are for accelerator backends")
        cluster = fake_cluster({"num_nodes": 2}, accelerators_per_node=4, accelerator_type=self.backend_name,
                               plugin_manager=manager)
        placements = PackedPlacementStrategy(0, 7, num_accelerators_per_process=2).get_placement(cluster)
        assert [p.hardware_type for p in placements] == [self.backend_name] * 4
        assert placements[1].env == backend.isolation_env(cluster.nodes[0].devices(self.backend_name)[2:4])

    # -- configs ---------------------------------------------------------------------------------------

    @pytest.mark.parametrize("config", ODD_CONFIGS, ids=repr)
    def test_odd_configs_are_refused_with_a_value_error_or_accepted(
        self, backend: HardwareBackend, config: Mapping[str, Any]
    ) -> None:
        try:
            backend.check_config(config)
        except ValueError as exc:
            if not str(exc).strip():
                pytest.fail(f"check_config({config!r}) refused it without saying what is wrong")
        except Exception as exc:  # anything else is the backend crashing on input it should judge
            pytest.fail(f"check_config({config!r}) raised {exc!r}; refuse a bad entry with ValueError")

    def test_the_sample_configs_are_accepted(self, backend: HardwareBackend) -> None:
        for config in self._configs(backend):
            backend.check_config(config)


__all__ = ["ODD_CONFIGS", "BackendConformance"]
