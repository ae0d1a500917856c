"""A stand-in for the NVML bindings (nvidia-ml-py's ``pynvml``) on a configurable fake machine.

``FakeNvml(gpus)`` behaves like the ``pynvml`` module for the functions the cuda backend calls: the same
names and signatures (a test compares them with the real ones), the same return types (``c_nvmlDevice_t``
handles, ``c_nvmlMemory_t``, ``nvmlPciInfo_t``, ints and lists), and the real ``pynvml.NVMLError``
subclasses with the real error codes, ``NVML_ERROR_UNINITIALIZED`` before ``nvmlInit`` included. Its
``NVML_*`` constants and ``NVMLError*`` classes are pynvml's own; any other attribute is missing, so a
backend that calls a function the stand-in does not implement fails loudly instead of reaching the library.

A ``FakeGpu`` lists what NVML would report about one GPU, and ``failures`` maps an NVML function name to
the error code it raises for that GPU (``lost=True`` makes every call raise ``NVML_ERROR_GPU_IS_LOST``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import pynvml  # type: ignore[import-untyped, import-not-found, unused-ignore]

NVMLError = pynvml.NVMLError


def error(code: int) -> pynvml.NVMLError:
    """The exception pynvml raises for ``code``: ``NVMLError(code)`` is the matching ``NVMLError_*`` subclass."""
    return pynvml.NVMLError(code)


@dataclass
class FakeMig:
    """One MIG device of a MIG-enabled GPU."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    memory_bytes: int = 40 * 2**30
    gpu_instance_id: int = 1
    compute_instance_id: int = 0
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeGpu:
    """One GPU as NVML sees it.

    ``mig``: ``None`` for a GPU without MIG support (``nvmlDeviceGetMigMode`` is unsupported), else whether
    MIG mode is on; ``migs`` holds its MIG device slots, ``None`` for an empty slot.
    ``retired_pages_pending`` and ``remapped_rows`` are ``None`` where the GPU does not support them (page
    retirement before Ampere, row remapping from Ampere on).
    """

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = 80 * 2**30
    pci_bus_id: str = "00000000:18:00.0"
    mig: bool | None = None
    migs: list[FakeMig | None] = field(default_factory=list)
    max_mig_devices: int = 7
    retired_pages_pending: bool | None = None
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    failures: dict[str, int] = field(default_factory=dict)
    lost: bool = False


class FakeNvml:
    """The ``pynvml`` module of a machine holding ``gpus`` (in NVML's index order)."""

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None, count_error: int | None = None,
                 count: Any = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.count_error = count_error
        self.count = count  # what nvmlDeviceGetCount returns instead of len(gpus), to fake a broken library
        self.initialized = 0
        self.calls: list[tuple[str, str | None]] = []  # (function, the GPU or MIG UUID it was asked about)
        self._handles: dict[int, tuple[FakeGpu, FakeMig | None]] = {}
        self._structs: list[pynvml.struct_c_nvmlDevice_t] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "NVMLError")):
            return getattr(pynvml, name)
        raise AttributeError(f"the NVML stand-in has no {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(n for n in dir(pynvml) if n.startswith(("NVML_", "NVMLError")))})

    # -- plumbing ---------------------------------------------------------------------------------------

    def _enter(self, function: str, about: str | None = None) -> None:
        self.calls.append((function, about))
        if not self.initialized:
            raise error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _handle(self, gpu: FakeGpu, mig: FakeMig | None) -> Any:
        struct = pynvml.struct_c_nvmlDevice_t()
        self._structs.append(struct)
        self._handles[ctypes.addressof(struct)] = (gpu, mig)
        return pynvml.c_nvmlDevice_t(struct)

    def _device(self, function: str, handle: Any) -> tuple[FakeGpu, FakeMig | None]:
        found = None
        if isinstance(handle, pynvml.c_nvmlDevice_t) and handle:
            found = self._handles.get(ctypes.addressof(handle.contents))
        self._enter(function, None if found is None else (found[1] or found[0]).uuid)
        if found is None:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, mig = found
        if gpu.lost:
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)
        code = (mig.failures if mig is not None else gpu.failures).get(function)
        if code is not None:
            raise error(code)
        return gpu, mig

    # -- the NVML functions -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append(("nvmlInit", None))
        if self.init_error is not None:
            raise error(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        if self.count_error is not None:
            raise error(self.count_error)
        return len(self.gpus) if self.count is None else self.count  # type: ignore[no-any-return]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        code = gpu.failures.get("nvmlDeviceGetHandleByIndex")
        if code is not None:
            raise error(code)
        return self._handle(gpu, None)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, mig = self._device("nvmlDeviceGetName", handle)
        return mig.name if mig is not None else gpu.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, mig = self._device("nvmlDeviceGetUUID", handle)
        return mig.uuid if mig is not None else gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu, mig = self._device("nvmlDeviceGetMemoryInfo", handle)
        total = mig.memory_bytes if mig is not None else gpu.memory_bytes
        if version:
            return pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=0, free=total, used=0)
        return pynvml.c_nvmlMemory_t(total=total, free=total, used=0)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu, _ = self._device("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = f"{int(domain, 16) & 0xFFFF:04X}:{bus}:{rest}".encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        return info

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        gpu, mig = self._device("nvmlDeviceGetRetiredPagesPendingStatus", device)
        if mig is not None or gpu.retired_pages_pending is None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(pynvml.NVML_FEATURE_ENABLED if gpu.retired_pages_pending else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        gpu, mig = self._device("nvmlDeviceGetRemappedRows", device)
        if mig is not None or gpu.remapped_rows is None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped_rows

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu, mig = self._device("nvmlDeviceGetMigMode", device)
        if mig is not None or gpu.mig is None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu, mig = self._device("nvmlDeviceGetMaxMigDeviceCount", device)
        if mig is not None or gpu.mig is None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu, mig = self._device("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if mig is not None or not gpu.mig or not 0 <= index < gpu.max_mig_devices:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = gpu.migs[index] if index < len(gpu.migs) else None
        if found is None:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._handle(gpu, found)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        _, mig = self._device("nvmlDeviceGetGpuInstanceId", device)
        if mig is None:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        _, mig = self._device("nvmlDeviceGetComputeInstanceId", device)
        if mig is None:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.compute_instance_id


FUNCTIONS = sorted(name for name in vars(FakeNvml) if name.startswith("nvml"))
"""The NVML functions the stand-in implements."""
