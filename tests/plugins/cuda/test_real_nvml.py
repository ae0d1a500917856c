"""The cuda backend against the real NVML library (``tox -e cuda``); skips, saying why, where there is no GPU.

The same detection the stand-in tests exercise, checked against what pynvml itself reports. Without an
NVIDIA driver the GPU tests skip with ``no NVIDIA driver here: <NVML error>``, and one test checks that the
backend then finds nothing and says the same thing instead of raising.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import hwplace
import hwplace_plugins.cuda
from hwplace.testing.conformance import BackendConformance  # (hwplace.testing loads it lazily: Any to mypy)
from hwplace_plugins.cuda import CudaBackend

pynvml = pytest.importorskip("pynvml", reason="pynvml is not installed: pip install 'hwplace[cuda]'")

BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")


def driver_problem() -> str | None:
    """Why NVML cannot be used here, or ``None`` when it can and sees at least one GPU."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"no NVIDIA driver here: {exc}"
    try:
        return None if pynvml.nvmlDeviceGetCount() else "the NVIDIA driver is loaded but NVML finds no GPU"
    finally:
        pynvml.nvmlShutdown()


PROBLEM = driver_problem()
needs_gpu = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")


@pytest.fixture
def gpus() -> Iterator[list[dict[str, object]]]:
    """What pynvml says about each whole GPU, in NVML order."""
    pynvml.nvmlInit()
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                mig = pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                mig = False
            found.append({"uuid": pynvml.nvmlDeviceGetUUID(handle), "name": pynvml.nvmlDeviceGetName(handle),
                          "bus": pynvml.nvmlDeviceGetPciInfo(handle).busId, "mig": mig})
        yield found
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.skipif(PROBLEM is None, reason="there are NVIDIA GPUs here")
def test_without_a_gpu_detection_finds_nothing_and_says_why(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = CudaBackend().detect([])
    assert isinstance(devices, hwplace.NoDevices)
    assert devices == []
    assert PROBLEM is not None
    assert PROBLEM.removeprefix("no NVIDIA driver here: ") in devices.reason


@needs_gpu
def test_detects_every_gpu_nvml_reports(gpus, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = CudaBackend().detect([])
    assert [d.index for d in devices] == list(range(len(devices)))
    whole = [d for d in devices if "mig" not in d.properties]
    assert sorted(str(d.properties["uuid"]) for d in whole) == sorted(str(g["uuid"]) for g in gpus if not g["mig"])
    for device in devices:
        assert device.model
        assert str(device.properties["uuid"]).startswith(("GPU-", "MIG-"))
        assert BUS_ID.match(str(device.properties["pci_bus_id"])), device.properties
        assert int(device.properties["memory_bytes"]) > 2**28
        assert device.healthy or device.reason
    by_bus = [g["uuid"] for g in sorted(gpus, key=lambda g: [int(p, 16) for p in re.split(r"[:.]", str(g["bus"]))])]
    assert [d.properties["cuda_ordinal"] for d in whole] == [by_bus.index(d.properties["uuid"]) for d in whole]


@needs_gpu
def test_a_uuid_mask_and_an_index_mask_select_the_same_gpu(gpus, monkeypatch) -> None:
    whole = [g for g in gpus if not g["mig"]]
    if not whole:
        pytest.skip("every GPU here is in MIG mode")
    last = str(whole[-1]["uuid"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", last)
    (by_uuid,) = CudaBackend().detect([])
    assert by_uuid.properties["uuid"] == last
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(by_uuid.properties["cuda_ordinal"]))
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    (by_index,) = CudaBackend().detect([])
    assert by_index.properties["uuid"] == last
    assert CudaBackend().isolation_env([by_index])["CUDA_VISIBLE_DEVICES"] == last


@needs_gpu
def test_detection_is_quick(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    detection = hwplace.PluginManager().detect("cuda", timeout=30)
    assert detection.error is None
    assert detection.devices
    assert detection.seconds < 10


class TestCudaConformanceHere(BackendConformance):
    """hwplace's conformance kit on this machine's real NVML: GPUs where there are some, the reason where not."""

    plugin = hwplace_plugins.cuda
    backend_name = "cuda"
