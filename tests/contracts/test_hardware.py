"""hwplace.hardware: the Device record and the check every backend a plugin returns goes through (SPEC section 5)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwplace
from hwplace.contracts.hardware import KINDS, check_backend
from hwplace.foundation.frozen import FrozenDict
from hwplace.testing import backend_plugin

# -- check_backend -----------------------------------------------------------------------------------


class Good(hwplace.HardwareBackend):
    name = "good-backend"
    kind = "device"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return []


def backend_with(name: Any, kind: Any) -> hwplace.HardwareBackend:
    """A backend instance whose ``name`` and ``kind`` are whatever a broken plugin might set."""
    backend = Good()
    object.__setattr__(backend, "name", name)
    object.__setattr__(backend, "kind", kind)
    return backend


class NameRaises(hwplace.HardwareBackend):
    @property
    def name(self) -> str:  # type: ignore[override]
        raise RuntimeError("no name today")


class KindRaises(hwplace.HardwareBackend):
    name = "kind-raises"

    @property
    def kind(self) -> str:  # type: ignore[override]
        raise KeyError("kind")


@pytest.mark.parametrize("kind", KINDS)
def test_a_usable_backend_passes(kind: str) -> None:
    assert check_backend(backend_with("good-backend", kind)) is None


def test_a_backend_name_with_a_final_newline_is_refused() -> None:
    problem = check_backend(backend_with("good-backend\n", "accelerator"))
    assert problem is not None
    assert ".name is 'good-backend\\n'; a backend name is 1 to 64" in problem


def test_the_base_class_defaults_to_an_accelerator_without_a_name() -> None:
    assert hwplace.HardwareBackend.kind == "accelerator"
    problem = check_backend(hwplace.HardwareBackend())
    assert problem is not None
    assert problem.startswith("HardwareBackend.name is ''")


@pytest.mark.parametrize("thing", [object(), "cuda", None, Good])
def test_something_that_is_not_a_backend_is_refused(thing: object) -> None:
    assert check_backend(thing) == f"{thing!r} is not a hwplace.HardwareBackend"


def test_a_name_property_that_raises_is_reported_not_raised() -> None:
    assert check_backend(NameRaises()) == (
        "reading NameRaises.name and .kind raised RuntimeError('no name today')"
    )


def test_a_kind_property_that_raises_is_reported_not_raised() -> None:
    assert check_backend(KindRaises()) == "reading KindRaises.name and .kind raised KeyError('kind')"


@pytest.mark.parametrize(
    "name",
    ["", "Upper", "-leading-dash", ".dot", "has space", "x" * 65, "é", "a/b", 5, None, b"bytes", ["cuda"]],
)
def test_bad_names_are_refused_with_the_rule(name: Any) -> None:
    problem = check_backend(backend_with(name, "accelerator"))
    assert problem == (f"Good.name is {name!r}; a backend name is 1 to 64 lower-case letters, digits, '.', '_' "
                       "and '-', starting with a letter or digit")


@pytest.mark.parametrize("name", ["a", "0", "x" * 64, "fake-robot", "my.tpu_v2-b"])
def test_good_names_pass(name: str) -> None:
    assert check_backend(backend_with(name, "accelerator")) is None


@pytest.mark.parametrize("kind", ["gpu", "Accelerator", "", 5, None, ("accelerator",), b"node"])
def test_bad_kinds_are_refused_naming_the_backend_and_the_allowed_kinds(kind: Any) -> None:
    assert check_backend(backend_with("good-backend", kind)) == (
        f"backend 'good-backend' has kind {kind!r}; allowed: accelerator, device, node"
    )


@given(st.one_of(st.integers(), st.floats(), st.binary(), st.none(), st.lists(st.text())))
def test_any_non_string_name_is_refused(name: Any) -> None:
    problem = check_backend(backend_with(name, "node"))
    assert problem is not None
    assert problem.startswith("Good.name is ")


@given(st.one_of(st.integers(), st.floats(), st.none(), st.text().filter(lambda t: t not in KINDS)))
def test_any_kind_outside_the_three_is_refused(kind: Any) -> None:
    problem = check_backend(backend_with("b", kind))
    assert problem is not None
    assert problem.startswith("backend 'b' has kind ")


def test_base_backend_defaults() -> None:
    backend = Good()
    assert backend.isolation_env([hwplace.Device(0, "m")]) == {}
    backend.check_config({"node_rank": 0})  # accepts anything unless a backend says otherwise
    assert repr(backend) == "<Good 'good-backend' (device)>"
    with pytest.raises(NotImplementedError, match=r"HardwareBackend\.detect"):
        hwplace.HardwareBackend().detect([])


# -- Device ------------------------------------------------------------------------------------------


def test_device_defaults() -> None:
    device = hwplace.Device(3, "H100")
    assert (device.index, device.model, device.healthy, device.reason) == (3, "H100", True, "")
    assert device.properties == {}
    assert isinstance(device.properties, FrozenDict)


@pytest.mark.parametrize("index", [-1, True, False, 1.0, "0", None])
def test_device_index_must_be_a_non_negative_integer(index: Any) -> None:
    with pytest.raises(TypeError, match=r"Device\.index must be a non-negative integer, got "):
        hwplace.Device(index, "m")


@pytest.mark.parametrize("model", [None, 5, b"H100", ["H100"]])
def test_device_model_must_be_a_string(model: Any) -> None:
    with pytest.raises(TypeError, match=r"Device\.model must be a string, got " + repr(model).replace("[", r"\[")):
        hwplace.Device(0, model)


@pytest.mark.parametrize("reason", [None, 5, b"hot"])
def test_device_reason_must_be_a_string(reason: Any) -> None:
    with pytest.raises(TypeError, match=r"Device\.reason must be a string"):
        hwplace.Device(0, "m", healthy=False, reason=reason)


@pytest.mark.parametrize("healthy", [1, 0, "yes", None])
def test_device_healthy_must_be_a_bool(healthy: Any) -> None:
    with pytest.raises(TypeError, match=r"Device\.healthy must be True or False, got "):
        hwplace.Device(0, "m", healthy=healthy)


@pytest.mark.parametrize("properties", [[("uuid", "x")], "uuid", None, 5])
def test_device_properties_must_be_a_mapping(properties: Any) -> None:
    with pytest.raises(TypeError, match=r"Device\.properties must be a mapping, got "):
        hwplace.Device(0, "m", properties=properties)


@pytest.mark.parametrize(
    ("properties", "where"),
    [
        ({"port": object()}, r"Device\.properties\['port'\] is a object"),
        ({"ids": [1, {2}]}, r"Device\.properties\['ids'\]\[1\] is a set"),
        ({"nested": {"deep": b"x"}}, r"Device\.properties\['nested'\]\['deep'\] is a bytes"),
        ({5: "x"}, r"Device\.properties: key 5 is not a string"),
    ],
)
def test_device_properties_must_be_json_like_naming_where(properties: dict[Any, Any], where: str) -> None:
    with pytest.raises(TypeError, match=where):
        hwplace.Device(0, "m", properties=properties)


def test_device_is_frozen() -> None:
    device = hwplace.Device(0, "m", properties={"uuid": "GPU-1"})
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'index'"):
        device.index = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'properties'"):
        device.properties = {}  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        device.properties["uuid"] = "GPU-2"  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        del device.properties["uuid"]  # type: ignore[attr-defined]
    assert device.properties == {"uuid": "GPU-1"}


def test_device_properties_are_deep_frozen_copies() -> None:
    source: dict[str, Any] = {"ids": [1, [2, 3]], "nested": {"list": ["a"], "inner": {"x": 1}}, "none": None}
    device = hwplace.Device(0, "m", properties=source)
    assert device.properties["ids"] == (1, (2, 3))
    assert device.properties["nested"]["list"] == ("a",)
    assert isinstance(device.properties["nested"], FrozenDict)
    assert isinstance(device.properties["nested"]["inner"], FrozenDict)
    with pytest.raises(TypeError, match="read-only"):
        device.properties["nested"]["inner"]["x"] = 2
    with pytest.raises(AttributeError, match="append"):
        device.properties["ids"].append(4)
    source["ids"].append(99)
    source["nested"]["inner"]["x"] = 2
    assert device.properties["ids"] == (1, (2, 3))  # a copy: later changes to the source do not leak in
    assert device.properties["nested"]["inner"]["x"] == 1


def test_device_pickles_and_copies_equal() -> None:
    device = hwplace.Device(2, "A800", healthy=False, reason="ECC errors",
                            properties={"uuid": "GPU-2", "pci": {"bus": 3, "ids": [1, 2]}})
    for again in (pickle.loads(pickle.dumps(device)), copy.deepcopy(device), copy.copy(device)):
        assert again == device
        assert hash(again) == hash(device)
        assert isinstance(again.properties, FrozenDict)
        assert isinstance(again.properties["pci"], FrozenDict)
        with pytest.raises(TypeError, match="read-only"):
            again.properties["pci"]["bus"] = 4


def test_devices_compare_and_hash_by_value() -> None:
    a = hwplace.Device(0, "m", properties={"ids": [1, 2]})
    b = hwplace.Device(0, "m", properties={"ids": (1, 2)})
    assert a == b
    assert len({a, b}) == 1
    assert a != hwplace.Device(1, "m", properties={"ids": [1, 2]})
    assert a != hwplace.Device(0, "m", healthy=False, properties={"ids": [1, 2]})


def test_device_properties_are_json_serialisable() -> None:
    device = hwplace.Device(0, "m", properties={"uuid": "GPU-0", "ids": [1, 2], "nested": {"ok": True, "x": None}})
    assert json.loads(json.dumps(device.properties)) == {"uuid": "GPU-0", "ids": [1, 2],
                                                         "nested": {"ok": True, "x": None}}
    assert json.loads(json.dumps(dataclasses.asdict(device))) == {
        "index": 0, "model": "m", "healthy": True, "reason": "",
        "properties": {"uuid": "GPU-0", "ids": [1, 2], "nested": {"ok": True, "x": None}},
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


def thaw(value: Any) -> Any:
    """What ``value`` looks like after a JSON round trip: mappings are dicts, sequences are lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


@given(st.dictionaries(st.text(max_size=5), json_values, max_size=4))
def test_any_json_like_properties_freeze_pickle_and_serialise(properties: dict[str, Any]) -> None:
    device = hwplace.Device(0, "m", properties=properties)
    assert thaw(device.properties) == thaw(properties)
    assert json.loads(json.dumps(device.properties)) == thaw(properties)
    assert pickle.loads(pickle.dumps(device)) == device
    hash(device)


def test_no_devices_is_an_empty_list_that_says_why_and_pickles() -> None:
    none = hwplace.NoDevices("no driver here")
    assert isinstance(none, list)
    assert none == []
    again = pickle.loads(pickle.dumps(none))
    assert (type(again), again.reason, again) == (hwplace.NoDevices, "no driver here", [])
    with pytest.raises(TypeError, match=r"NoDevices\(reason\) takes a string, got 3"):
        hwplace.NoDevices(3)  # type: ignore[arg-type]


def test_a_detection_keeps_the_reason_a_backend_gave_for_finding_nothing() -> None:
    class Absent(hwplace.HardwareBackend):
        name = "absent"

        def detect(self, configs):
            return hwplace.NoDevices("nothing plugged in")

    manager = hwplace.PluginManager(load_entry_points=False)
    manager.register(backend_plugin(Absent()), name="absent-plugin")
    detection = manager.detect("absent")
    assert (detection.devices, detection.error, detection.absent) == ((), None, "nothing plugged in")
