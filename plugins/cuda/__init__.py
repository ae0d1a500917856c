"""The ``cuda`` backend: NVIDIA GPUs through NVML (``pip install 'hwplace[cuda]'`` for nvidia-ml-py).

Detection (on the node) asks NVML for every GPU: model, UUID, total memory, PCI bus id, MIG devices and
health. Without nvidia-ml-py, or without an NVIDIA driver, it finds no GPU and says why (``hwplace
hardware`` shows it); it never raises for that.

**Numbering.** NVML's own index order carries no promise, so the backend sorts the GPUs by PCI bus id
itself: position ``k`` in that order is CUDA ordinal ``k`` under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` with no
mask (property ``cuda_ordinal``; NVML's index is ``nvml_index``). A MIG-enabled GPU is not usable whole:
its MIG devices stand in for it (property ``mig``); one with MIG on but no MIG device is reported unhealthy.

**An inherited mask.** When the node's processes already have ``CUDA_VISIBLE_DEVICES`` (from a batch
scheduler or a container), the backend reports only the GPUs it leaves visible, in its order, read exactly
as CUDA reads it (indices in PCI bus order, renumbered subsets, full or abbreviated UUIDs, MIG ids; see
:mod:`hwplace_plugins.cuda.mask`). ``Device.index`` ``i`` is therefore the GPU a CUDA process under that mask
calls ``cuda:i`` (for whole GPUs; see MIG below). A malformed mask is not an error: like CUDA, the list stops
at its first invalid entry, and every device reports what was dropped in its ``mask_problem`` property (or,
when nothing is left, the ``NoDevices`` reason says it).

**Isolation.** ``isolation_env`` names the chosen GPUs by UUID (``GPU-...``, or ``MIG-...`` for a MIG
device) in ``CUDA_VISIBLE_DEVICES``, so they are the same GPUs whatever mask, numbering or order a process
inherits; it replaces the inherited mask rather than indexing into it. Devices without a UUID (the planned
devices of an offline inventory, or a GPU NVML could not read) are named by ``cuda_ordinal``, else by index,
with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` making those ordinals PCI bus order; UUIDs and numbers are never mixed
in one list, since CUDA stops at an entry of another form. ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``
keeps Ray from overwriting the variable with its own GPU ids. A CUDA process enumerates one MIG device only,
so give each process at most one.

**Health.** An NVML error reading a GPU makes it unhealthy with the call and the error as the reason; so do
a lost GPU (``NVML_ERROR_GPU_IS_LOST``, the XID 79 "fallen off the bus" state), a GPU that needs a reset,
retired pages pending (``nvmlDeviceGetRetiredPagesPendingStatus``) and pending or failed row remapping
(``nvmlDeviceGetRemappedRows``, the Ampere-and-later successor of page retirement). A function a GPU does not
support (``NVML_ERROR_NOT_SUPPORTED``, or one an older driver lacks) is not a health problem.

**Time.** Detection makes a fixed number of NVML calls per GPU and per MIG slot, with both counts capped;
hwplace bounds the whole ``detect`` call in time (``HWPLACE_DETECT_TIMEOUT``). A GPU that is lost is not
asked anything more.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hwplace
from hwplace_plugins.cuda.mask import VARIABLE, GpuIds, MigIds, Selection, quoted, select

MISSING = "pynvml is not installed: pip install 'hwplace[cuda]'"
MAX_GPUS = 1024  # per node; NVML reporting more is not a machine
MAX_MIG_SLOTS = 64  # per GPU (hardware has at most 7 or 8)
UNKNOWN_MODEL = "NVIDIA GPU (name unreadable)"
ISOLATION_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
SAFE_ID = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-/_.")

INIT_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "no NVIDIA driver here (libnvidia-ml.so.1 was not found)",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA driver is not loaded",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the NVIDIA driver and its NVML library differ in version "
                                          "(a driver update waiting for a reboot?)",
    "NVML_ERROR_NO_PERMISSION": "no permission to use the NVIDIA driver (/dev/nvidia*)",
}
FATAL_HINTS = {
    "NVML_ERROR_GPU_IS_LOST": "the GPU has fallen off the bus (XID 79): reset it or reboot the node",
    "NVML_ERROR_RESET_REQUIRED": "the GPU needs a reset",
    "NVML_ERROR_CORRUPTED_INFOROM": "the GPU's infoROM is corrupted",
}
UNSUPPORTED = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")
NVML_FUNCTIONS = (
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
    "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo", "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
)
"""Every pynvml function detection calls."""


@dataclass
class _Probe:
    """What NVML said about one GPU or MIG device, and what went wrong asking."""

    model: str = UNKNOWN_MODEL
    uuid: str | None = None
    memory_bytes: int | None = None
    problems: list[str] = field(default_factory=list)
    lost: bool = False


@dataclass
class _Mig(_Probe):
    slot: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass
class _Gpu(_Probe):
    nvml_index: int = 0
    pci_bus_id: str | None = None
    mig_enabled: bool = False
    migs: list[_Mig] = field(default_factory=list)


class _Nvml:
    """The NVML module of one detection, with its error codes named."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.error: type[BaseException] = module.NVMLError
        self.names: dict[int, str] = {}
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("NVML_ERROR_") and isinstance(value, int):
                self.names.setdefault(value, name)

    def code(self, exc: BaseException) -> str:
        value = getattr(exc, "value", None)
        return self.names.get(value, f"NVML error {value}") if isinstance(value, int) else "NVML error"

    def describe(self, call: str, exc: BaseException) -> str:
        code = self.code(exc)
        hint = FATAL_HINTS.get(code)
        return f"{call}: {exc} ({code})" + (f": {hint}" if hint else "")

    def ask(self, probe: _Probe, call: str, *args: Any) -> Any:
        """``module.call(*args)``; ``None`` when it fails, with the failure noted on ``probe`` unless unsupported."""
        function = getattr(self.module, call, None)
        if probe.lost or function is None:  # bindings older than the function: not supported either
            return None
        try:
            return function(*args)
        except self.error as exc:
            code = self.code(exc)
            if code not in UNSUPPORTED:
                probe.problems.append(self.describe(call, exc))
                probe.lost = code == "NVML_ERROR_GPU_IS_LOST"
            return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) and value else None


def _count(value: Any, limit: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit else None


def _read_common(nvml: _Nvml, probe: _Probe, handle: Any) -> None:
    probe.uuid = _text(nvml.ask(probe, "nvmlDeviceGetUUID", handle))
    probe.model = _text(nvml.ask(probe, "nvmlDeviceGetName", handle)) or UNKNOWN_MODEL
    memory = nvml.ask(probe, "nvmlDeviceGetMemoryInfo", handle)
    probe.memory_bytes = _count(getattr(memory, "total", None), 2**62)


def _read_health(nvml: _Nvml, gpu: _Gpu, handle: Any) -> None:
    pending = nvml.ask(gpu, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    if pending == nvml.module.NVML_FEATURE_ENABLED:
        gpu.problems.append("retired pages are pending (memory pages with ECC errors await retirement): "
                            "reset the GPU before using it")
    rows = nvml.ask(gpu, "nvmlDeviceGetRemappedRows", handle)
    if isinstance(rows, Sequence) and len(rows) == 4:
        if rows[3]:
            gpu.problems.append("row remapping failed (uncorrectable memory errors): the GPU needs service")
        elif rows[2]:
            gpu.problems.append("row remapping is pending (uncorrectable memory errors): reset the GPU before "
                                "using it")


def _read_migs(nvml: _Nvml, gpu: _Gpu, handle: Any) -> None:
    mode = nvml.ask(gpu, "nvmlDeviceGetMigMode", handle)
    gpu.mig_enabled = isinstance(mode, Sequence) and len(mode) == 2 and \
        mode[0] == nvml.module.NVML_DEVICE_MIG_ENABLE
    if not gpu.mig_enabled:
        return
    slots = _count(nvml.ask(gpu, "nvmlDeviceGetMaxMigDeviceCount", handle), MAX_MIG_SLOTS) or 0
    for slot in range(slots):
        try:
            mig_handle = nvml.module.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.error as exc:
            if nvml.code(exc) in ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"):
                continue  # an empty slot
            gpu.problems.append(nvml.describe(f"nvmlDeviceGetMigDeviceHandleByIndex(slot {slot})", exc))
            gpu.lost = nvml.code(exc) == "NVML_ERROR_GPU_IS_LOST"
            break
        mig = _Mig(slot=slot)
        _read_common(nvml, mig, mig_handle)
        mig.gpu_instance_id = _count(nvml.ask(mig, "nvmlDeviceGetGpuInstanceId", mig_handle), 2**31)
        mig.compute_instance_id = _count(nvml.ask(mig, "nvmlDeviceGetComputeInstanceId", mig_handle), 2**31)
        gpu.migs.append(mig)


def _read_gpu(nvml: _Nvml, index: int) -> _Gpu:
    gpu = _Gpu(nvml_index=index)
    try:
        handle = nvml.module.nvmlDeviceGetHandleByIndex(index)
    except nvml.error as exc:
        gpu.problems.append(nvml.describe(f"nvmlDeviceGetHandleByIndex({index})", exc))
        return gpu
    _read_common(nvml, gpu, handle)
    gpu.pci_bus_id = _text(getattr(nvml.ask(gpu, "nvmlDeviceGetPciInfo", handle), "busId", None))
    _read_health(nvml, gpu, handle)
    _read_migs(nvml, gpu, handle)
    return gpu


def _pci_key(bus_id: str | None) -> tuple[int, int, int, int] | None:
    """``00000000:3B:00.0`` as numbers (domain, bus, device, function), or ``None`` when it is not one."""
    if bus_id is None:
        return None
    domain, _, rest = bus_id.partition(":")
    bus, _, rest = rest.partition(":")
    device, _, function = rest.partition(".")
    try:
        return int(domain, 16), int(bus, 16), int(device, 16), int(function or "0", 16)
    except ValueError:
        return None


def _pci_order(gpus: list[_Gpu]) -> list[_Gpu]:
    """The GPUs in CUDA's ``PCI_BUS_ID`` order; NVML's order when a bus id is unreadable (they agree in practice)."""
    keys = [key for gpu in gpus if (key := _pci_key(gpu.pci_bus_id)) is not None]
    if len(keys) < len(gpus):
        return gpus
    return [gpu for _, gpu in sorted(zip(keys, gpus, strict=True), key=lambda pair: pair[0])]


def _properties(gpu: _Gpu, ordinal: int, probe: _Probe) -> dict[str, Any]:
    found: dict[str, Any] = {"uuid": probe.uuid, "pci_bus_id": gpu.pci_bus_id, "memory_bytes": probe.memory_bytes,
                             "nvml_index": gpu.nvml_index, "cuda_ordinal": ordinal}
    if isinstance(probe, _Mig):
        mig = {"parent_uuid": gpu.uuid, "gpu_instance_id": probe.gpu_instance_id,
               "compute_instance_id": probe.compute_instance_id, "slot": probe.slot}
        found["mig"] = {key: value for key, value in mig.items() if value is not None}
    return {key: value for key, value in found.items() if value is not None}


def _records(ordered: list[_Gpu], selection: Selection) -> list[tuple[str, list[str], dict[str, Any]]]:
    """``(model, problems, properties)`` of each device the selection leaves, in its order."""
    records: list[tuple[str, list[str], dict[str, Any]]] = []
    for position, slot in selection.targets:
        gpu = ordered[position]
        if slot is not None:
            mig = gpu.migs[slot]
            records.append((mig.model, gpu.problems + mig.problems, _properties(gpu, position, mig)))
        elif gpu.mig_enabled and gpu.migs:
            records += [(mig.model, gpu.problems + mig.problems, _properties(gpu, position, mig)) for mig in gpu.migs]
        elif gpu.mig_enabled:
            problems = [*gpu.problems, "MIG mode is on but the GPU holds no MIG device: create GPU and compute "
                                       "instances (nvidia-smi mig -cgi ... -C) or turn MIG off (nvidia-smi -mig 0)"]
            records.append((gpu.model, problems, _properties(gpu, position, gpu)))
        else:
            records.append((gpu.model, gpu.problems, _properties(gpu, position, gpu)))
    return records


def _order_warning(selection: Selection, ordered: list[_Gpu], environ: Mapping[str, str]) -> str:
    """Indices in an inherited mask under CUDA's default order, on a node whose GPUs differ: say how they are read."""
    order = environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    if selection.form != "index" or order == "PCI_BUS_ID" or len({gpu.model for gpu in ordered}) < 2:
        return ""
    return (f"{VARIABLE} gives indices and CUDA_DEVICE_ORDER is {order}, so on this node of different GPU models "
            "CUDA may number them fastest first; hwplace reads them in PCI bus order: set CUDA_DEVICE_ORDER="
            "PCI_BUS_ID or give UUIDs")


class CudaBackend(hwplace.HardwareBackend):
    """NVIDIA GPUs through NVML; isolation by UUID in ``CUDA_VISIBLE_DEVICES``.

    ``nvml`` replaces the ``pynvml`` module (tests pass a stand-in); ``environ`` replaces ``os.environ`` as the
    source of the inherited ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``.
    """

    name = "cuda"
    kind = "accelerator"
    collective_backend = "nccl"

    def __init__(self, nvml: Any = None, environ: Mapping[str, str] | None = None) -> None:
        self._nvml = nvml
        self._environ = environ

    def _module(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        try:
            return importlib.import_module("pynvml")
        except ImportError:
            return None

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        module = self._module()
        if module is None:
            return hwplace.NoDevices(MISSING)
        nvml = _Nvml(module)
        try:
            module.nvmlInit()
        except nvml.error as exc:
            code = nvml.code(exc)
            return hwplace.NoDevices(f"{INIT_HINTS.get(code, 'NVML could not start')}: nvmlInit: {exc} ({code})")
        try:
            return self._detect(nvml, os.environ if self._environ is None else self._environ)
        finally:
            with contextlib.suppress(nvml.error):
                module.nvmlShutdown()

    def _detect(self, nvml: _Nvml, environ: Mapping[str, str]) -> list[hwplace.Device]:
        try:
            raw = nvml.module.nvmlDeviceGetCount()
        except nvml.error as exc:
            return hwplace.NoDevices(f"NVML could not count the GPUs: {nvml.describe('nvmlDeviceGetCount', exc)}")
        count = _count(raw, MAX_GPUS)
        if count is None:
            return hwplace.NoDevices(f"NVML reports {str(raw)[:20]} GPUs; expected 0 to {MAX_GPUS}")
        if count == 0:
            return hwplace.NoDevices("the NVIDIA driver is loaded but NVML finds no GPU")
        ordered = _pci_order([_read_gpu(nvml, index) for index in range(count)])
        text = environ.get(VARIABLE)
        selection = select(text, [
            GpuIds(gpu.uuid, tuple(MigIds(m.uuid, m.gpu_instance_id, m.compute_instance_id) for m in gpu.migs))
            for gpu in ordered])
        records = _records(ordered, selection)
        if not records:
            return hwplace.NoDevices(selection.problem or f"{VARIABLE}={quoted(text or '')} leaves no GPU visible")
        note = "; ".join(filter(None, [selection.problem, _order_warning(selection, ordered, environ)]))
        return [
            hwplace.Device(i, model, healthy=not problems, reason="; ".join(problems),
                           properties={**properties, **({"mask_problem": note} if note else {})})
            for i, (model, problems, properties) in enumerate(records)
        ]

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` naming ``devices`` by UUID, or all by number when one has no UUID."""
        uuids = [d.properties.get("uuid") for d in devices]
        if all(isinstance(u, str) and u.startswith(("GPU-", "MIG-")) and set(u) <= SAFE_ID for u in uuids):
            names = [str(u) for u in uuids]
        else:
            names = [str(_ordinal(d)) for d in devices]
        return {VARIABLE: ",".join(names), **ISOLATION_ORDER}


def _ordinal(device: hwplace.Device) -> int:
    ordinal = device.properties.get("cuda_ordinal")
    return ordinal if isinstance(ordinal, int) and not isinstance(ordinal, bool) and ordinal >= 0 else device.index


@hwplace.hookimpl
def hwplace_hardware_backends() -> list[hwplace.HardwareBackend]:
    return [CudaBackend()]
