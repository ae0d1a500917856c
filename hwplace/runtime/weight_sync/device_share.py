"""Weights shared on one device between two processes: double-buffered slots, read seqlock-style.

For a target that shares the source's accelerator, the source (:class:`SlotWriter`) copies a state dict into
one of two *slots*: flat byte buffers on its device, tensors back to back at 256-byte offsets, each slot shared
once per allocation (CUDA IPC for CUDA tensors). ``write`` fills the slot that does not hold the newest version,
waits for the device, takes a digest on the device and returns a small picklable :class:`SlotDescriptor`. The
target (:class:`SlotReader`) maps the slot once per allocation, copies the used bytes into a buffer of its own
on that device and checks the digest there. There is no lock between the processes: a reader copying the newest
version can only be overwritten when two more versions are written meanwhile, and then the digest differs and
the read raises :class:`TornRead` (the caller reads a newer version).

Lifetime: a slot is freed by its writer only (when a state dict outgrows it, or with the writer). On CUDA the
writer returns the consumer count torch's IPC puts on each share at once, so a freed slot is freed at once and
never waits in torch's "limbo" for a reader that may never come; a reader still mapping it reads garbage that
its digest rejects. A reader drops a slot's old mapping when it sees the slot's next allocation.

CPU tensors share through torch's file-system shared memory (``/dev/shm``, counted by torch's ``torch_shm_manager``,
which unlinks a file once no process holds it), so the whole flow runs for real without a GPU. Imports the
foundation, the buckets' ``aligned`` layout and the communicator's torch loader.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import WeightSyncError
from hwplace.foundation.wording import safe_repr
from hwplace.runtime.messaging.communicator import torch_module
from hwplace.runtime.weight_sync.buckets import aligned

ALIGN = 256  # each tensor starts at a multiple of this many bytes in a slot
CHUNK_WORDS = 4 * 2**20  # int32 words per step of a digest: 16 MiB read, 64 MiB of int64 temporaries at most
MASK = 2**64 - 1
Handle = tuple[Any, ...]


class TornRead(WeightSyncError):
    """A slot did not hold the version its descriptor names when it was read: overwritten by a newer version
    (read that one), freed, or corrupted."""

    def __init__(self, version: int, reason: str) -> None:
        self.version = version
        self.reason = reason
        super().__init__(f"weight sync version {version}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes with its fields
        return type(self), (self.version, self.reason)


@dataclass(frozen=True)
class ShareKind:
    """How a slot's memory is shared: ``share(storage)`` gives a picklable handle (once per allocation), and
    ``open(handle, device_index)`` maps it in another process, as that process's device ``device_index``."""

    name: str
    share: Callable[[Any], Handle]
    open: Callable[[Handle, int], Any]


def _share_cuda(storage: Any) -> Handle:
    # (device, IPC handle, size, offset in the allocation, ref counter file, its offset, event handle, event needed)
    handle = tuple(storage._share_cuda_())
    # torch expects one consumer to release each share; the writer owns the slot's lifetime instead
    torch_module().UntypedStorage._release_ipc_counter_cuda(handle[4], handle[5])
    return handle


def _open_cuda(handle: Handle, device_index: int) -> Any:
    # in another process only: CUDA does not open an IPC handle in the process that made it
    torch = torch_module()
    torch.cuda._lazy_init()
    return torch.UntypedStorage._new_shared_cuda(device_index, *handle[1:])


def _share_cpu(storage: Any) -> Handle:
    manager, filename, size = storage._share_filename_cpu_()  # moves it to /dev/shm, names the file
    return manager, filename, size


def _open_cpu(handle: Handle, device_index: int) -> Any:
    return torch_module().UntypedStorage._new_shared_filename_cpu(*handle)


CUDA = ShareKind("cuda", _share_cuda, _open_cuda)
CPU = ShareKind("cpu", _share_cpu, _open_cpu)
KINDS: dict[str, ShareKind] = {"cuda": CUDA, "cpu": CPU}


@dataclass(frozen=True)
class SlotEntry:
    """One tensor in a slot: its name, dtype (``float32``), shape, and bytes ``[offset, offset + nbytes)``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SlotDescriptor:
    """One written version: where it lies (writer, slot, the slot's generation, its share handle and kind), the
    source's physical device (node-local hardware rank and UUID; ``-1`` and ``""`` on CPU), the entries, the
    bytes used and their digest. Small and picklable: it travels, the weights do not."""

    writer: str
    version: int
    slot: int
    generation: int
    kind: str
    handle: Handle
    device: int
    uuid: str
    entries: tuple[SlotEntry, ...]
    nbytes: int
    digest: str


def slot_layout(sizes: Sequence[int], align: int = ALIGN) -> tuple[list[int], int]:
    """Each size's offset (back to back, each a multiple of ``align``) and the bytes used in all."""
    return aligned(sizes, align)


def physical_device(index: int, visible: Sequence[int] | None) -> int:
    """The node-local hardware rank of this process's device ``index``: ``visible[index]``, where ``visible`` is
    what the process sees in order (its placement's ``visible_accelerators``), or ``index`` itself for None."""
    if visible is None:
        return index
    if not 0 <= index < len(visible):
        raise WeightSyncError(f"device index {index} is not among this process's devices ({list(visible)})")
    return visible[index]


def device_index(physical: int, visible: Sequence[int] | None) -> int:
    """This process's index of the device with node-local hardware rank ``physical`` (see
    :func:`physical_device`); ``WeightSyncError`` naming both when this process does not see it."""
    if visible is None:
        return physical
    if physical not in visible:
        raise WeightSyncError(f"the source's weights lie on GPU {physical} of its node, which this process does "
                              f"not see (its devices are GPUs {list(visible)}); a slot is read on its own GPU")
    return list(visible).index(physical)


def device_digest(data: Any, chunk_words: int = CHUNK_WORDS) -> str:
    """``wsum:<s1>:<s2>:<nbytes>`` of a flat uint8 tensor, taken with torch on its own device: the bytes as
    int32 words (the tail padded with zeros), ``s1`` their sum and ``s2`` the sum of word * (index + 1), both
    wrapping int64, in steps of ``chunk_words``. It catches a flipped bit, two swapped words, another length and
    other contents but one in 2**64; it is a check against torn or corrupted copies, not against tampering."""
    torch = torch_module()
    flat = data.reshape(-1)
    if flat.storage_offset() % 4:
        flat = flat.clone()
    nbytes = flat.numel()
    whole = nbytes // 4 * 4
    words = flat[:whole].view(torch.int32)
    if whole < nbytes:
        tail = torch.zeros(4, dtype=torch.uint8, device=flat.device)
        tail[: nbytes - whole] = flat[whole:]
        words = torch.cat([words, tail.view(torch.int32)])
    s1 = torch.zeros((), dtype=torch.int64, device=flat.device)
    s2 = torch.zeros((), dtype=torch.int64, device=flat.device)
    step = max(1, chunk_words)
    index = torch.arange(1, min(step, words.numel()) + 1, dtype=torch.int64, device=flat.device)
    for start in range(0, words.numel(), step):
        chunk = words[start : start + step].to(torch.int64)
        part = chunk.sum()
        s1 += part
        s2 += (chunk * index[: chunk.numel()]).sum() + part * start
    return f"wsum:{int(s1.item()) & MASK:016x}:{int(s2.item()) & MASK:016x}:{nbytes}"


def _source_device(tensors: Mapping[str, Any]) -> Any:
    """The one device of the state dict's tensors; ``WeightSyncError`` naming an entry that is not one."""
    torch = torch_module()
    if not isinstance(tensors, Mapping) or not tensors:
        raise WeightSyncError(f"a slot holds a non-empty mapping of names to torch tensors, got {safe_repr(tensors)}")
    device = None
    for name, value in tensors.items():
        allowed = "a slot holds torch tensors (dense, strided) on the one source device"
        if not isinstance(value, torch.Tensor):
            raise WeightSyncError(f"state dict entry {name!r} is {safe_repr(value)}; {allowed}")
        if value.layout != torch.strided or value.is_quantized:
            raise WeightSyncError(f"state dict entry {name!r} is a {value.layout} tensor of {value.dtype}; {allowed}")
        if device is None:
            device = value.device
            if device.type not in KINDS:
                raise WeightSyncError(f"state dict entry {name!r} is on {device}; {allowed}, one of "
                                      f"{', '.join(KINDS)}")
        elif value.device != device:
            raise WeightSyncError(f"state dict entry {name!r} is on {value.device}, the entries before it on "
                                  f"{device}; {allowed}")
    return device


@dataclass
class _Slot:
    buffer: Any  # flat uint8 tensor
    generation: int
    handle: Handle


class SlotWriter:
    """The source's two slots of one weight sync, in the source process.

    ``visible``: the node-local hardware ranks of the devices this process sees, in device-index order (its
    placement's ``visible_accelerators``); None when index and hardware rank agree.
    """

    def __init__(self, visible: Sequence[int] | None = None) -> None:
        self.visible = None if visible is None else tuple(visible)
        self.writer = os.urandom(8).hex()
        self._slots: list[_Slot | None] = [None, None]
        self._newest: int | None = None  # the slot that holds the newest complete version
        self._generations = 0

    def write(self, version: int, tensors: Mapping[str, Any]) -> SlotDescriptor:
        """Copy ``tensors`` into the slot not holding the newest version; the descriptor of the result."""
        torch = torch_module()
        device = _source_device(tensors)
        values = [t.detach() for t in tensors.values()]
        sizes = [t.numel() * t.element_size() for t in values]
        offsets, used = slot_layout(sizes)
        index = 0 if self._newest is None else 1 - self._newest
        slot = self._slots[index]
        if slot is None or slot.buffer.device != device or slot.buffer.numel() < used:
            self._slots[index] = None  # the old allocation goes before the new one comes
            slot = self._slots[index] = self._allocate(device, max(used, ALIGN))
        entries = []
        for name, value, offset, size in zip(tensors, values, offsets, sizes, strict=True):
            if size:
                slot.buffer[offset : offset + size].view(value.dtype).view(value.shape).copy_(value)
            entries.append(SlotEntry(str(name), str(value.dtype).removeprefix("torch."), tuple(value.shape),
                                     offset, size))
        physical, uuid = -1, ""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            physical = physical_device(device.index, self.visible)
            uuid = str(torch.cuda.get_device_properties(device).uuid)
        digest = device_digest(slot.buffer[:used])
        self._newest = index
        return SlotDescriptor(self.writer, version, index, slot.generation, device.type, slot.handle, physical,
                              uuid, tuple(entries), used, digest)

    def _allocate(self, device: Any, nbytes: int) -> _Slot:
        torch = torch_module()
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        handle = KINDS[device.type].share(buffer.untyped_storage())
        self._generations += 1
        return _Slot(buffer, self._generations, handle)


class SlotReader:
    """A target's side of one weight sync's slots: each slot mapped once per allocation (generation).

    ``visible``: as for :class:`SlotWriter`, in the target's process.
    """

    def __init__(self, visible: Sequence[int] | None = None) -> None:
        self.visible = None if visible is None else tuple(visible)
        self._mapped: dict[int, tuple[str, int, Any]] = {}  # slot: (writer, generation, uint8 tensor)

    def read(self, descriptor: SlotDescriptor) -> dict[str, Any]:
        """The version ``descriptor`` names, as tensors on this process's own device that view a private copy
        (the source may overwrite its slot afterwards); :class:`TornRead` when the copy does not match."""
        torch = torch_module()
        mapped = self._mapping(descriptor)
        if descriptor.nbytes > mapped.numel():
            raise TornRead(descriptor.version, f"slot {descriptor.slot} holds {mapped.numel()} bytes, fewer than "
                                               f"the {descriptor.nbytes} its descriptor names (corrupted)")
        private = torch.empty(descriptor.nbytes, dtype=torch.uint8, device=mapped.device)
        private.copy_(mapped[: descriptor.nbytes])
        digest = device_digest(private)
        if digest != descriptor.digest:
            raise TornRead(descriptor.version, f"slot {descriptor.slot} was overwritten or corrupted while it was "
                                               f"read (digest {digest}, expected {descriptor.digest}); read a "
                                               "newer version")
        out = {}
        for e in descriptor.entries:
            dtype = getattr(torch, e.dtype)
            out[e.name] = (private[e.offset : e.offset + e.nbytes].view(dtype).view(e.shape) if e.nbytes
                           else torch.empty(e.shape, dtype=dtype, device=private.device))
        return out

    def _mapping(self, descriptor: SlotDescriptor) -> Any:
        torch = torch_module()
        held = self._mapped.get(descriptor.slot)
        if held is not None and held[:2] == (descriptor.writer, descriptor.generation):
            return held[2]
        self._mapped.pop(descriptor.slot, None)  # the slot's old allocation: unmapped before the new one
        kind = KINDS.get(descriptor.kind)
        if kind is None:
            raise WeightSyncError(f"weight sync version {descriptor.version}: slot kind {descriptor.kind!r} is "
                                  f"unknown here ({', '.join(KINDS)})")
        index = device_index(descriptor.device, self.visible) if descriptor.kind == "cuda" else -1
        if descriptor.uuid and str(torch.cuda.get_device_properties(index).uuid) != descriptor.uuid:
            raise WeightSyncError(f"weight sync version {descriptor.version}: this process's cuda:{index} is not "
                                  f"GPU {descriptor.device} of the source ({descriptor.uuid}); its visible "
                                  f"devices are given wrong ({self.visible})")
        try:
            storage = kind.open(descriptor.handle, index)
        except RuntimeError as exc:
            raise TornRead(descriptor.version, f"slot {descriptor.slot} generation {descriptor.generation} cannot "
                                               f"be opened ({exc}); the source freed it or ended") from None
        tensor = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        self._mapped[descriptor.slot] = (descriptor.writer, descriptor.generation, tensor)
        return tensor
