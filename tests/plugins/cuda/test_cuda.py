"""The cuda backend against an NVML stand-in: detection, inherited masks, isolation, health, no driver."""

from __future__ import annotations

import inspect
import io
import sys
from collections.abc import Mapping
from typing import Any

import pynvml  # type: ignore[import-untyped, import-not-found, unused-ignore]
import pytest
from nvml_standin import FUNCTIONS, FakeGpu, FakeMig, FakeNvml

import hwplace
import hwplace_plugins.cuda
from hwplace.application.cli import main
from hwplace.plugin.manager import PluginManager
from hwplace.testing import backend_plugin, fake_cluster, registered_plugin
from hwplace.testing.conformance import BackendConformance  # (hwplace.testing loads it lazily: Any to mypy)
from hwplace_plugins.cuda import MISSING, NVML_FUNCTIONS, UNKNOWN_MODEL, CudaBackend
from hwplace_plugins.cuda.mask import GpuIds, select

ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


def uuid(i: int) -> str:
    """A GPU UUID whose first hex digit differs per GPU: ``GPU-0a...``, ``GPU-1a...``."""
    return f"GPU-{i:x}a{i:06x}-d72c-4106-c12f-20bd9faed9f{i:x}"


def gpu(i: int, **fields) -> FakeGpu:
    """GPU ``i`` of a machine, in PCI bus order 0x18, 0x28, ..."""
    return FakeGpu(uuid=uuid(i), pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0", **fields)


def machine(n: int = 4, **kwargs) -> FakeNvml:
    return FakeNvml([gpu(i) for i in range(n)], **kwargs)


def detect(nvml: FakeNvml, environ: Mapping[str, str] | None = None) -> list[hwplace.Device]:
    return CudaBackend(nvml=nvml, environ=environ or {}).detect([])


def masked(mask: str, n: int = 4, **environ: str) -> list[hwplace.Device]:
    return detect(machine(n), {"CUDA_VISIBLE_DEVICES": mask, **environ})


def ordinals(devices: list[hwplace.Device]) -> list[int]:
    assert [d.index for d in devices] == list(range(len(devices)))
    return [d.properties["cuda_ordinal"] for d in devices]


# -- detection -----------------------------------------------------------------------------------------


def test_detects_every_gpu_with_its_properties() -> None:
    nvml = FakeNvml([gpu(0), gpu(1, name="NVIDIA A100-SXM4-40GB", memory_bytes=40 * 2**30)])
    devices = detect(nvml)
    assert [(d.index, d.model, d.healthy, d.reason) for d in devices] == [
        (0, "NVIDIA H100 80GB HBM3", True, ""), (1, "NVIDIA A100-SXM4-40GB", True, "")]
    assert dict(devices[1].properties) == {
        "uuid": uuid(1), "pci_bus_id": "00000000:28:00.0", "memory_bytes": 40 * 2**30, "nvml_index": 1,
        "cuda_ordinal": 1}
    assert "mask_problem" not in devices[0].properties
    assert nvml.initialized == 0  # nvmlInit and nvmlShutdown are paired


def test_gpus_are_numbered_in_pci_bus_order_whatever_nvml_order_is() -> None:
    nvml = FakeNvml([gpu(2), gpu(0), gpu(1)])  # NVML's index order promises nothing
    devices = detect(nvml)
    assert [d.properties["uuid"] for d in devices] == [uuid(0), uuid(1), uuid(2)]
    assert [d.properties["nvml_index"] for d in devices] == [1, 2, 0]
    assert ordinals(devices) == [0, 1, 2]


def test_pci_domain_counts_before_bus() -> None:
    far = FakeGpu(uuid=uuid(0), pci_bus_id="00000001:04:00.0")
    near = FakeGpu(uuid=uuid(1), pci_bus_id="00000000:F0:00.0")
    assert [d.properties["uuid"] for d in detect(FakeNvml([far, near]))] == [uuid(1), uuid(0)]


def test_an_unreadable_bus_id_keeps_nvml_order() -> None:
    nvml = FakeNvml([gpu(2), gpu(0, failures={"nvmlDeviceGetPciInfo": pynvml.NVML_ERROR_UNKNOWN})])
    devices = detect(nvml)
    assert [d.properties["nvml_index"] for d in devices] == [0, 1]
    assert not devices[1].healthy
    assert "nvmlDeviceGetPciInfo: Unknown Error (NVML_ERROR_UNKNOWN)" in devices[1].reason


def test_the_backend_is_registered_through_its_entry_point() -> None:
    (backend,) = hwplace_plugins.cuda.hwplace_hardware_backends()
    assert isinstance(backend, CudaBackend)
    info = PluginManager().backends()["cuda"]
    assert (info.kind, info.distribution) == ("accelerator", "hwplace")


# -- no pynvml, no driver --------------------------------------------------------------------------------


def test_without_pynvml_there_are_no_gpus_and_the_reason_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    devices = CudaBackend().detect([])
    assert isinstance(devices, hwplace.NoDevices)
    assert devices == []
    assert devices.reason == "pynvml is not installed: pip install 'hwplace[cuda]'" == MISSING


def test_hwplace_hardware_shows_why_cuda_found_nothing(monkeypatch, fresh_manager) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    manager = fresh_manager()
    detection = manager.detect("cuda")
    assert (detection.devices, detection.error, detection.absent) == ((), None, MISSING)
    out, err = io.StringIO(), io.StringIO()
    assert main(["hardware"], out=out, err=err) == 0
    assert f"0: {MISSING}" in out.getvalue()
    assert "cuda" not in err.getvalue()  # finding nothing is not a problem


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver here (libnvidia-ml.so.1 was not found): nvmlInit: "
                                              "NVML Shared Library Not Found (NVML_ERROR_LIBRARY_NOT_FOUND)"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "the NVIDIA driver is not loaded: nvmlInit: Driver Not Loaded "
                                              "(NVML_ERROR_DRIVER_NOT_LOADED)"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "differ in version"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to use the NVIDIA driver"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML could not start: nvmlInit: Unknown Error (NVML_ERROR_UNKNOWN)"),
    ],
)
def test_no_driver_means_no_gpus_with_the_reason(code, reason) -> None:
    nvml = machine(init_error=code)
    devices = detect(nvml)
    assert isinstance(devices, hwplace.NoDevices)
    assert reason in devices.reason
    assert nvml.calls == [("nvmlInit", None)]  # nothing else is asked, nothing to shut down


def test_a_failed_count_is_a_reason_and_nvml_is_still_shut_down() -> None:
    nvml = machine(count_error=pynvml.NVML_ERROR_UNKNOWN)
    devices = detect(nvml)
    assert isinstance(devices, hwplace.NoDevices)
    assert devices.reason == "NVML could not count the GPUs: nvmlDeviceGetCount: Unknown Error (NVML_ERROR_UNKNOWN)"
    assert nvml.initialized == 0


@pytest.mark.parametrize(("count", "reason"), [
    (0, "the NVIDIA driver is loaded but NVML finds no GPU"),
    (10**9, "NVML reports 1000000000 GPUs; expected 0 to 1024"),
    (-1, "NVML reports -1 GPUs; expected 0 to 1024"),
])
def test_no_gpu_or_an_absurd_count(count, reason) -> None:
    devices = detect(machine(count=count))
    assert isinstance(devices, hwplace.NoDevices)
    assert devices.reason == reason


# -- an inherited CUDA_VISIBLE_DEVICES ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        ("0,1,2,3", [0, 1, 2, 3]),
        ("2", [2]),  # a subset, renumbered: cuda:0 is GPU 2
        ("3,1", [3, 1]),  # in mask order
        (" 1 , 3", [1, 3]),
        ("+1,02", [1, 2]),
        ("1gpu2,2ampere", [1, 2]),  # read like strtoul, as CUDA does
    ],
)
def test_index_masks_select_and_renumber(mask, expected) -> None:
    devices = masked(mask)
    assert ordinals(devices) == expected
    assert [d.properties["uuid"] for d in devices] == [uuid(i) for i in expected]
    assert all("mask_problem" not in d.properties for d in devices)


@pytest.mark.parametrize(
    ("mask", "expected", "problem"),
    [
        ("0,abc,1", [0], "entry 2 ('abc') is not a GPU index, UUID or MIG id; CUDA stops at the first invalid "
                         "entry, so only the 1 GPU before it is visible"),
        ("0,2,-1,1", [0, 2], "entry 3 ('-1') is a negative index"),  # NVIDIA's own example
        ("1,3,7,0", [1, 3], "entry 3 ('7') is GPU index 7, but this node has 4 GPUs (0 to 3); CUDA stops at the "
                            "first invalid entry, so only the 2 GPUs before it are visible"),
        ("2,", [2], "entry 2 ('') is not a GPU index"),
        ("1," + "9" * 5000, [1], "is GPU index 999999999..., but this node has 4 GPUs"),
        (f"0,{uuid(1)}", [0], f"entry 2 ('{uuid(1)}') is not a GPU index"),  # forms do not mix
    ],
)
def test_a_malformed_index_mask_stops_where_cuda_stops_and_says_so(mask, expected, problem) -> None:
    devices = masked(mask)
    assert ordinals(devices) == expected
    assert all(problem in d.properties["mask_problem"] for d in devices)
    assert all(d.healthy for d in devices)  # the GPUs themselves are fine


@pytest.mark.parametrize(
    ("mask", "reason"),
    [
        ("", "CUDA_VISIBLE_DEVICES='' is set and empty: CUDA shows no GPU (Ray sets it so in a task or actor without "
             "GPUs, unless RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1)"),
        ("abc", "entry 1 ('abc') is not a GPU index, UUID or MIG id; CUDA stops at the first invalid entry, so no "
                "GPU is visible"),
        ("NoDevFiles", "is not a GPU index"),
        ("-1", "is a negative index"),
        ("4", "is GPU index 4, but this node has 4 GPUs (0 to 3)"),
        ("0,1,0", "CUDA_VISIBLE_DEVICES='0,1,0' names GPU 0 twice, and CUDA then shows no GPU at all"),
        ("+1,01", "names GPU 1 twice"),
        ("0,0,abc", "names GPU 0 twice"),
        ("٣", "is not a GPU index"),
    ],
)
def test_a_mask_that_leaves_nothing_is_a_reason_not_an_error(mask, reason) -> None:
    devices = masked(mask)
    assert isinstance(devices, hwplace.NoDevices)
    assert reason in devices.reason


def test_a_huge_mask_is_read_quickly_and_quoted_short(count_calls) -> None:
    with count_calls() as calls:
        devices = masked("1,2," + "x" * 1_000_000)
    assert calls.count < 100_000  # not a Python step per character (a million of them)
    assert ordinals(devices) == [1, 2]
    assert len(devices[0].properties["mask_problem"]) < 400


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (f"{uuid(3)},{uuid(0)}", [3, 0]),
        ("GPU-2a", [2]),  # an abbreviated UUID that names one GPU
        (f"GPU-1,{uuid(3)[:12]}", [1, 3]),
    ],
)
def test_uuid_masks_select_by_uuid_and_prefix(mask, expected) -> None:
    devices = masked(mask)
    assert ordinals(devices) == expected
    assert all("mask_problem" not in d.properties for d in devices)


@pytest.mark.parametrize(
    ("mask", "expected", "problem"),
    [
        (f"{uuid(2)},GPU-ffff", [2], "entry 2 ('GPU-ffff') matches no GPU here"),
        (f"{uuid(2)},GPU-", [2], "entry 2 ('GPU-') is the start of 4 GPUs' UUIDs, so it names none of them"),
        (f"{uuid(2)},1", [2], "entry 2 ('1') is not a GPU UUID, and a list that starts with a GPU UUID holds only"),
        (f"{uuid(2)}, {uuid(1)}", [2], "is not a GPU UUID"),  # no blank is skipped before a UUID
    ],
)
def test_a_uuid_mask_stops_at_an_unknown_or_ambiguous_uuid(mask, expected, problem) -> None:
    devices = masked(mask)
    assert ordinals(devices) == expected
    assert problem in devices[0].properties["mask_problem"]


@pytest.mark.parametrize("mask", [f"{uuid(1)},{uuid(1)}", f"{uuid(1)},GPU-1a"])
def test_a_gpu_named_twice_by_uuid_hides_every_gpu(mask) -> None:
    devices = masked(mask)
    assert isinstance(devices, hwplace.NoDevices)
    assert "twice, and CUDA then shows no GPU at all" in devices.reason


def test_index_masks_warn_when_cuda_may_number_mixed_gpus_differently() -> None:
    nvml = FakeNvml([gpu(0), gpu(1, name="NVIDIA A100-SXM4-40GB")])
    devices = detect(nvml, {"CUDA_VISIBLE_DEVICES": "1"})
    assert "CUDA_DEVICE_ORDER is FASTEST_FIRST" in devices[0].properties["mask_problem"]
    assert ordinals(devices) == [1]  # read in PCI bus order all the same
    quiet = [detect(nvml, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
             detect(nvml, {"CUDA_VISIBLE_DEVICES": uuid(1)}), masked("1")]
    assert [(ordinals(d), "mask_problem" in d[0].properties) for d in quiet] == [([1], False)] * 3


def test_the_mask_is_read_from_the_process_environment_by_default(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert ordinals(CudaBackend(nvml=machine()).detect([])) == [2]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert ordinals(CudaBackend(nvml=machine()).detect([])) == [0, 1, 2, 3]


def test_mask_reading_needs_no_nvml() -> None:
    selection = select("1,0", [GpuIds("GPU-a"), GpuIds("GPU-b")])
    assert (selection.form, selection.targets, selection.problem) == ("index", ((1, None), (0, None)), "")
    assert select(None, [GpuIds(None)]).targets == ((0, None),)


# -- MIG -----------------------------------------------------------------------------------------------


def mig_uuid(g: int, k: int) -> str:
    return f"MIG-{g:x}{k:x}c4f1ef-42e4-5de3-91c7-45d71c87eb3f"


def mig_machine() -> FakeNvml:
    """GPU 0 whole; GPU 1 in MIG mode with devices in slots 0 and 2 (slot 1 empty); GPU 2 whole."""
    migs: list[FakeMig | None] = [
        FakeMig(mig_uuid(1, 0), gpu_instance_id=1, compute_instance_id=0),
        None,
        FakeMig(mig_uuid(1, 2), name="NVIDIA A100-SXM4-80GB MIG 1g.10gb", memory_bytes=10 * 2**30,
                gpu_instance_id=9, compute_instance_id=0),
    ]
    return FakeNvml([gpu(0, mig=False), gpu(1, name="NVIDIA A100-SXM4-80GB", mig=True, migs=migs), gpu(2)])


def test_a_mig_gpu_is_its_mig_devices() -> None:
    devices = detect(mig_machine())
    assert [(d.model, d.properties["uuid"], d.properties["cuda_ordinal"]) for d in devices] == [
        ("NVIDIA H100 80GB HBM3", uuid(0), 0),
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", mig_uuid(1, 0), 1),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", mig_uuid(1, 2), 1),
        ("NVIDIA H100 80GB HBM3", uuid(2), 2),
    ]
    assert devices[2].properties["memory_bytes"] == 10 * 2**30
    assert devices[2].properties["pci_bus_id"] == "00000000:28:00.0"
    assert dict(devices[2].properties["mig"]) == {
        "parent_uuid": uuid(1), "gpu_instance_id": 9, "compute_instance_id": 0, "slot": 2}
    assert "mig" not in devices[0].properties


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (mig_uuid(1, 2), [mig_uuid(1, 2)]),
        (f"{mig_uuid(1, 2)},{mig_uuid(1, 0)[:10]}", [mig_uuid(1, 2), mig_uuid(1, 0)]),
        (f"MIG-{uuid(1)}/1/0", [mig_uuid(1, 0)]),  # the form drivers before R470 used
        ("1", [mig_uuid(1, 0), mig_uuid(1, 2)]),  # an index naming a MIG GPU: its MIG devices
        (f"{uuid(2)},{uuid(1)}", [uuid(2), mig_uuid(1, 0), mig_uuid(1, 2)]),
    ],
)
def test_mig_masks(mask, expected) -> None:
    devices = detect(mig_machine(), {"CUDA_VISIBLE_DEVICES": mask, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [d.properties["uuid"] for d in devices] == expected
    assert all("mask_problem" not in d.properties for d in devices)


@pytest.mark.parametrize(
    ("mask", "expected", "problem"),
    [
        (f"{mig_uuid(1, 0)},MIG-ffff", [mig_uuid(1, 0)], "matches no MIG device here"),
        (f"{mig_uuid(1, 0)},{uuid(0)}", [mig_uuid(1, 0)], "is not a MIG id, and a list that starts with a MIG id"),
        (f"{mig_uuid(1, 0)},MIG-{uuid(1)}/5/0", [mig_uuid(1, 0)], "names GPU instance 5, compute instance 0, which"),
        (f"{mig_uuid(1, 0)},MIG-{uuid(1)}/x", [mig_uuid(1, 0)], "is not a MIG id (MIG-GPU-<uuid>/<gpu instance>"),
        (f"{mig_uuid(1, 0)},MIG-GPU-ff/1/0", [mig_uuid(1, 0)], "names no GPU here as its parent"),
        (f"{mig_uuid(1, 0)},MIG-1", [mig_uuid(1, 0)], "is the start of 2 MIG devices' UUIDs"),
    ],
)
def test_a_mig_mask_stops_at_an_unknown_mig_id(mask, expected, problem) -> None:
    devices = detect(mig_machine(), {"CUDA_VISIBLE_DEVICES": mask})
    assert [d.properties["uuid"] for d in devices] == expected
    assert problem in devices[0].properties["mask_problem"]


def test_a_mig_device_named_twice_hides_every_gpu() -> None:
    devices = detect(mig_machine(), {"CUDA_VISIBLE_DEVICES": f"{mig_uuid(1, 0)},MIG-{uuid(1)}/1/0"})
    assert isinstance(devices, hwplace.NoDevices)
    assert f"names the MIG device MIG-{uuid(1)}/1/0 twice" in devices.reason


def test_mig_mode_without_mig_devices_is_unhealthy() -> None:
    (device,) = detect(FakeNvml([gpu(0, mig=True)]))
    assert not device.healthy
    assert "MIG mode is on but the GPU holds no MIG device" in device.reason
    assert device.properties["uuid"] == uuid(0)


def test_a_failing_mig_device_is_unhealthy_and_the_others_are_not() -> None:
    nvml = mig_machine()
    broken = nvml.gpus[1].migs[2]
    assert broken is not None
    broken.failures["nvmlDeviceGetGpuInstanceId"] = pynvml.NVML_ERROR_UNKNOWN
    devices = detect(nvml)
    assert [d.healthy for d in devices] == [True, True, False, True]
    assert devices[2].reason == "nvmlDeviceGetGpuInstanceId: Unknown Error (NVML_ERROR_UNKNOWN)"
    assert "gpu_instance_id" not in devices[2].properties["mig"]


def test_a_mig_slot_error_other_than_empty_is_reported_on_the_gpu() -> None:
    nvml = mig_machine()
    nvml.gpus[1].failures["nvmlDeviceGetMigDeviceHandleByIndex"] = pynvml.NVML_ERROR_UNKNOWN
    devices = detect(nvml)
    assert [d.properties["uuid"] for d in devices][1] == uuid(1)
    assert "nvmlDeviceGetMigDeviceHandleByIndex(slot 0): Unknown Error" in devices[1].reason


# -- health ---------------------------------------------------------------------------------------------


def test_an_nvml_error_makes_only_that_gpu_unhealthy() -> None:
    nvml = machine(3)
    nvml.gpus[1].failures["nvmlDeviceGetName"] = pynvml.NVML_ERROR_UNKNOWN
    devices = detect(nvml)
    assert [d.healthy for d in devices] == [True, False, True]
    assert devices[1].reason == "nvmlDeviceGetName: Unknown Error (NVML_ERROR_UNKNOWN)"
    assert devices[1].model == UNKNOWN_MODEL
    assert devices[1].properties["uuid"] == uuid(1)  # what could be read still is


def test_a_lost_gpu_is_unhealthy_and_not_asked_again() -> None:
    nvml = machine(2)
    nvml.gpus[0].lost = True
    devices = detect(nvml)
    assert not devices[0].healthy
    assert devices[0].reason == ("nvmlDeviceGetUUID: GPU is lost (NVML_ERROR_GPU_IS_LOST): the GPU has fallen off "
                                 "the bus (XID 79): reset it or reboot the node")
    assert [call for call, about in nvml.calls if about == uuid(0)] == ["nvmlDeviceGetUUID"]  # then nothing more
    assert devices[1].healthy
    assert ordinals(devices) == [0, 1]  # NVML order stands in for the unreadable bus id


def test_a_gpu_whose_handle_cannot_be_had_is_unhealthy() -> None:
    nvml = machine(2)
    nvml.gpus[1].failures["nvmlDeviceGetHandleByIndex"] = pynvml.NVML_ERROR_GPU_IS_LOST
    devices = detect(nvml)
    assert (devices[1].healthy, devices[1].model, dict(devices[1].properties)) == (
        False, UNKNOWN_MODEL, {"nvml_index": 1, "cuda_ordinal": 1})
    assert devices[1].reason.startswith("nvmlDeviceGetHandleByIndex(1): GPU is lost (NVML_ERROR_GPU_IS_LOST)")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"retired_pages_pending": True}, "retired pages are pending"),
        ({"remapped_rows": (0, 2, 1, 0)}, "row remapping is pending"),
        ({"remapped_rows": (0, 2, 1, 1)}, "row remapping failed"),
        ({"failures": {"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_RESET_REQUIRED}},
         "nvmlDeviceGetMemoryInfo: GPU requires restart (NVML_ERROR_RESET_REQUIRED): the GPU needs a reset"),
        ({"failures": {"nvmlDeviceGetRetiredPagesPendingStatus": pynvml.NVML_ERROR_CORRUPTED_INFOROM}},
         "infoROM is corrupted"),
    ],
)
def test_memory_faults_and_resets_make_a_gpu_unhealthy(fields, problem) -> None:
    devices = detect(FakeNvml([gpu(0, **fields), gpu(1)]))
    assert not devices[0].healthy
    assert problem in devices[0].reason
    assert devices[1].healthy


@pytest.mark.parametrize(
    "fields",
    [
        {"retired_pages_pending": None, "remapped_rows": None},  # neither feature on this GPU
        {"retired_pages_pending": False, "remapped_rows": (3, 0, 0, 0)},  # corrected rows, nothing pending
        {"failures": {"nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}},  # an older driver
        {"failures": {"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_NOT_SUPPORTED}},
        {"failures": {"nvmlDeviceGetMigMode": pynvml.NVML_ERROR_NOT_SUPPORTED}},
    ],
)
def test_what_a_gpu_does_not_support_is_no_health_problem(fields) -> None:
    (device,) = detect(FakeNvml([gpu(0, **fields)]))
    assert (device.healthy, device.reason) == (True, "")
    assert device.properties["uuid"] == uuid(0)


def test_an_unsupported_property_is_left_out() -> None:
    (device,) = detect(FakeNvml([gpu(0, failures={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_NOT_SUPPORTED})]))
    assert "memory_bytes" not in device.properties
    assert device.properties["pci_bus_id"] == "00000000:18:00.0"


def test_a_mig_gpus_fault_shows_on_each_of_its_mig_devices() -> None:
    nvml = mig_machine()
    nvml.gpus[1].retired_pages_pending = True
    devices = detect(nvml)
    assert [d.healthy for d in devices] == [True, False, False, True]
    assert "retired pages are pending" in devices[1].reason


def test_unhealthy_gpus_are_refused_by_placement() -> None:
    nvml = machine(2)
    nvml.gpus[1].retired_pages_pending = True
    cluster = detected_cluster(nvml, {})
    with pytest.raises(hwplace.PlacementError, match="retired pages are pending"):
        hwplace.PackedPlacementStrategy(0, 1).get_placement(cluster)


# -- isolation ------------------------------------------------------------------------------------------


def test_isolation_names_gpus_by_uuid() -> None:
    devices = detect(machine())
    assert CudaBackend().isolation_env(devices[1:3]) == {"CUDA_VISIBLE_DEVICES": f"{uuid(1)},{uuid(2)}", **ORDER}


def test_isolation_under_an_inherited_mask_names_the_chosen_gpus() -> None:
    devices = masked("3,1")  # cuda:0 here is GPU 3
    assert CudaBackend().isolation_env(devices[:1]) == {"CUDA_VISIBLE_DEVICES": uuid(3), **ORDER}


def test_isolation_of_a_mig_device_uses_its_mig_uuid() -> None:
    devices = detect(mig_machine())
    assert CudaBackend().isolation_env(devices[2:3])["CUDA_VISIBLE_DEVICES"] == mig_uuid(1, 2)


def test_isolation_of_no_device_hides_every_gpu() -> None:
    assert CudaBackend().isolation_env([]) == {"CUDA_VISIBLE_DEVICES": "", **ORDER}


def test_planned_devices_are_isolated_by_index() -> None:
    planned = [hwplace.Device(i, "planned cuda") for i in (2, 5)]
    assert CudaBackend().isolation_env(planned) == {"CUDA_VISIBLE_DEVICES": "2,5", **ORDER}


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        ({"cuda_ordinal": 6}, "1,6"),  # one device lacks a UUID: all by PCI-order ordinal, never a mixed list
        ({"uuid": "GPU-a,b", "cuda_ordinal": 6}, "1,6"),  # not an id CUDA_VISIBLE_DEVICES can hold
        ({"uuid": "not-a-gpu"}, "1,4"),
        ({"cuda_ordinal": True}, "1,4"),
    ],
)
def test_isolation_falls_back_to_numbers_for_every_device(properties, expected) -> None:
    devices = [hwplace.Device(0, "m", properties={"uuid": uuid(1), "cuda_ordinal": 1}),
               hwplace.Device(4, "m", properties=properties)]
    assert CudaBackend().isolation_env(devices)["CUDA_VISIBLE_DEVICES"] == expected


# -- planning -------------------------------------------------------------------------------------------


def detected_cluster(nvml: FakeNvml, environ: Mapping[str, str]) -> hwplace.Cluster:
    """A one-node cluster whose GPUs the backend detected through ``nvml``."""
    devices = tuple(detect(nvml, environ))
    node = hwplace.Node(0, "gpu-node", "gpu-node", {"cuda": devices,
                                                    "node": (hwplace.Device(0, "node", properties={}),)})
    return hwplace.Cluster(nodes=[node])


def test_planning_offline_isolates_planned_gpus_by_index() -> None:
    manager = PluginManager()
    with registered_plugin(hwplace_plugins.cuda, plugin_manager=manager):
        cluster = fake_cluster({"num_nodes": 2}, accelerators_per_node=8, accelerator_type="cuda",
                               plugin_manager=manager)
        placements = hwplace.PackedPlacementStrategy(0, 15, num_accelerators_per_process=2).get_placement(cluster)
    assert len(placements) == 8
    assert placements[5].env == {"CUDA_VISIBLE_DEVICES": "2,3", **ORDER}
    assert placements[5].node_rank == 1


def test_placement_on_detected_gpus_under_a_mask_names_them_by_uuid() -> None:
    cluster = detected_cluster(machine(), {"CUDA_VISIBLE_DEVICES": "3,1,2"})
    placements = hwplace.PackedPlacementStrategy(0, 2).get_placement(cluster)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in placements] == [uuid(3), uuid(1), uuid(2)]
    assert all(p.env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1" for p in placements)


def test_memory_per_phase_is_checked_against_each_gpu_and_mig_slice() -> None:
    """SPEC §13 on detected GPUs: a whole 80 GB H100, a 3g.40gb and a 1g.10gb MIG slice, each its own capacity."""
    cluster = detected_cluster(mig_machine(), {})
    assert [d.properties["memory_bytes"] for d in cluster.nodes[0].devices("cuda")] == [
        80 * 2**30, 40 * 2**30, 10 * 2**30, 80 * 2**30]
    config: dict[str, Any] = {"cluster": {"num_nodes": 1, "component_placement": {"trainer": "0", "rollout": "1-2"}},
              "resources": {"trainer": {"memory": {"train": "60GiB"}}, "rollout": {"memory": {"generate": "9GiB"}}}}
    plan = hwplace.ComponentPlacement(config, cluster)
    assert [(d.index, d.capacity, d.peak) for d in plan.memory] == [
        (0, 80 * 2**30, 60 * 2**30), (1, 40 * 2**30, 9 * 2**30), (2, 10 * 2**30, 9 * 2**30)]
    config["resources"]["rollout"]["memory"]["generate"] = "12GiB"
    with pytest.raises(hwplace.PlacementError, match=r"^cuda 2 of node 0 does not hold its peak: 12 GiB .* when "
                                                     r"rollout is in phase 'generate' .*but the device has 10 GiB"):
        hwplace.ComponentPlacement(config, cluster)


def test_planned_gpus_of_an_offline_inventory_report_no_capacity_and_are_not_checked() -> None:
    manager = PluginManager()
    with registered_plugin(hwplace_plugins.cuda, plugin_manager=manager):
        config = {"cluster": {"num_nodes": 1, "component_placement": {"trainer": "0"}},
                  "resources": {"trainer": {"memory": {"train": "1TiB"}}}}
        cluster = fake_cluster(config["cluster"], accelerators_per_node=2, accelerator_type="cuda",
                               plugin_manager=manager)
        (device,) = hwplace.ComponentPlacement(config, cluster).memory
    assert (device.capacity, device.peak, device.fits) == (None, 2**40, True)


# -- the stand-in is faithful to pynvml ----------------------------------------------------------------


@pytest.mark.parametrize("name", FUNCTIONS)
def test_the_standin_has_pynvmls_signatures(name) -> None:
    real = inspect.signature(getattr(pynvml, name))
    standin = inspect.signature(getattr(FakeNvml([]), name))
    assert [(p.name, p.kind, p.default) for p in standin.parameters.values()] == [
        (p.name, p.kind, p.default) for p in real.parameters.values()]


def test_the_standin_raises_pynvmls_own_errors_and_returns_its_types() -> None:
    nvml = machine(1)
    with pytest.raises(pynvml.NVMLError_Uninitialized, match="Uninitialized"):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert nvml.nvmlDeviceGetPciInfo(handle).busId == "00000000:18:00.0"
    with pytest.raises(pynvml.NVMLError_InvalidArgument, match="Invalid Argument"):
        nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported, match="Not Supported"):
        nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    with pytest.raises(AttributeError, match="the NVML stand-in has no 'nvmlDeviceGetPowerUsage'"):
        nvml.nvmlDeviceGetPowerUsage(handle)
    assert nvml.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert "NVML_ERROR_GPU_IS_LOST" in dir(nvml)


def test_the_standin_implements_every_function_the_backend_calls() -> None:
    assert sorted(NVML_FUNCTIONS) == FUNCTIONS
    assert all(callable(getattr(pynvml, name)) for name in NVML_FUNCTIONS)
    nvml = mig_machine()
    nvml.gpus[0].retired_pages_pending = False
    detect(nvml)
    assert {name for name, _ in nvml.calls} == set(NVML_FUNCTIONS)


def test_bindings_without_a_health_function_are_not_a_health_problem() -> None:
    class OldBindings(FakeNvml):
        nvmlDeviceGetRemappedRows = None  # type: ignore[assignment]  # nvidia-ml-py before row remapping

    (device,) = detect(OldBindings([gpu(0)]))
    assert (device.healthy, device.properties["uuid"]) == (True, uuid(0))


# -- the conformance kit every backend runs ---------------------------------------------------------------


class TestCudaConformanceOnAStandIn(BackendConformance):
    plugin = backend_plugin(CudaBackend(nvml=mig_machine(), environ={}))  # the MIG machine above, no inherited mask
    backend_name = "cuda"

    def test_the_standin_machine_is_what_is_checked(self, detected: list[hwplace.Device]) -> None:
        assert [d.properties["uuid"] for d in detected] == [uuid(0), mig_uuid(1, 0), mig_uuid(1, 2), uuid(2)]
