"""Weights shared on one device between two processes: double-buffered slots, each read under a lock.

For a target that shares the source's accelerator, the source (:class:`SlotWriter`) copies a state dict into
one of two *slots*: flat byte buffers on its device, tensors back to back at 256-byte offsets, each slot shared
once per allocation (CUDA IPC for CUDA tensors). ``write`` fills the slot that does not hold the newest version,
waits for the device, takes a digest on the device and returns a small picklable :class:`SlotDescriptor`. A
target (:class:`SlotReader`) maps each slot once per allocation and, when it asks, checks the digest in place
and copies the used bytes into a buffer of its own on that device (``read``; a buffer it no longer needs is
reused), or lends them to the caller for the time of a block (``held``: ``load_into`` copies them straight into a
module). Each slot has a lock and a stamp (:mod:`hwplace.runtime.weight_sync.slot_lock`): the source rewrites or
frees a slot only when no target is copying from it, and a target copies only a slot that holds the version it
wants, so a copy is never torn; a slot that holds another version by then is a :class:`TornRead` (the caller
reads a newer one), a digest that does not match is a ``WeightSyncError`` (corrupted), and a slot that cannot
be mapped is a :class:`SlotOpenError` naming why.

Lifetime: a slot is freed by its writer only (when a state dict outgrows it, on ``close``, or with the writer),
under its lock. On CUDA the writer returns the consumer count torch's IPC puts on each share at once, so a freed
slot goes back to torch's cache at once, never waiting in torch's "limbo" for a reader that may never come; the
lock is what keeps it from being freed while a reader copies it. A reader drops a slot's old mapping when it sees
the slot's next allocation, and all of them on ``close``.

CPU tensors share through torch's file-system shared memory (``/dev/shm``, counted by torch's ``torch_shm_manager``,
which unlinks a file once no process holds it), so the whole flow runs for real without a GPU. Imports the
foundation, the buckets' ``aligned`` layout, the slot locks and the communicator's torch loader.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import WeightSyncError
from hwplace.foundation.wording import safe_repr
from hwplace.runtime.messaging.communicator import torch_module
from hwplace.runtime.weight_sync.buckets import aligned, carried, rebuilt
from hwplace.runtime.weight_sync.slot_lock import LockRef, SlotLock, reading

ALIGN = 256  # each tensor starts at a multiple of this many bytes in a slot
CHUNK_WORDS = 4 * 2**20  # int32 words per step of a digest: 16 MiB read, 64 MiB of int64 temporaries at most
MASK = 2**64 - 1
Handle = tuple[Any, ...]


class TornRead(WeightSyncError):
    """A slot did not hold the version its descriptor names when it was read: being written or overwritten by a
    newer version (read that one), or freed."""

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


class SlotOpenError(WeightSyncError):
    """A slot that holds the version wanted cannot be mapped in this process (CUDA IPC refused): the cause is named,
    and every version will fail the same way."""


CUDA = ShareKind("cuda", _share_cuda, _open_cuda)
CPU = ShareKind("cpu", _share_cpu, _open_cpu)
KINDS: dict[str, ShareKind] = {"cuda": CUDA, "cpu": CPU}


@dataclass(frozen=True)
class SlotEntry:
    """One tensor in a slot: its name, dtype (``float32``), shape, and bytes ``[offset, offset + nbytes)``."""

    name: str | int
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    kind: str = "torch"  # or "parameter": an nn.Parameter, rebuilt as one
    requires_grad: bool = False


@dataclass(frozen=True)
class SlotDescriptor:
    """One written version: where it lies (writer, slot, the slot's generation, its share handle and kind, its
    lock), the source's physical device (node-local hardware rank and UUID; ``-1`` and ``""`` on CPU), the entries, the
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
    lock: LockRef = (0, -1, 0, "")  # the slot's lock and stamp (:mod:`hwplace.runtime.weight_sync.slot_lock`)


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
    nbytes = flat.numel()
    s1 = torch.zeros((), dtype=torch.int64, device=flat.device)
    s2 = torch.zeros((), dtype=torch.int64, device=flat.device)
    step = max(1, chunk_words)
    index = torch.arange(1, min(step, -(-nbytes // 4)) + 1, dtype=torch.int64, device=flat.device)
    for start in range(0, nbytes, step * 4):  # one chunk at a time: no copy of the whole
        piece = flat[start : start + step * 4]
        if piece.storage_offset() % 4 or piece.numel() % 4:  # misaligned or the tail: a padded copy of this chunk
            padded = torch.zeros(-(-piece.numel() // 4) * 4, dtype=torch.uint8, device=flat.device)
            padded[: piece.numel()] = piece
            piece = padded
        chunk = piece.view(torch.int32).to(torch.int64)
        part = chunk.sum()
        s1 += part
        s2 += (chunk * index[: chunk.numel()]).sum() + part * (start // 4)
    return f"wsum:{int(s1.item()) & MASK:016x}:{int(s2.item()) & MASK:016x}:{nbytes}"


def source_tensors_device(tensors: Mapping[str, Any]) -> Any:
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


def _let_go(slots: list[_Slot | None], locks: list[SlotLock]) -> None:
    """Free every slot under its lock, then the locks (``close``, or the writer's end)."""
    for index, lock in enumerate(locks):
        with contextlib.suppress(OSError), lock.exclusive():
            slots[index] = None
        lock.close()
    locks.clear()


class SlotWriter:
    """The source's two slots of one weight sync, in the source process.

    ``visible``: the node-local hardware ranks of the devices this process sees, in device-index order (its
    placement's ``visible_accelerators``); None when index and hardware rank agree.
    """

    def __init__(self, visible: Sequence[int] | None = None) -> None:
        self.visible = None if visible is None else tuple(visible)
        self.writer = os.urandom(8).hex()
        self._slots: list[_Slot | None] = [None, None]
        self._locks = [SlotLock(f"hwplace-slot-{self.writer}-{i}") for i in range(2)]
        self._newest: int | None = None  # the slot that holds the newest complete version
        self._generations = 0
        self._closed = weakref.finalize(self, _let_go, self._slots, self._locks)

    @property
    def device_bytes(self) -> int:
        """The device memory the slots hold now."""
        return sum(slot.buffer.numel() for slot in self._slots if slot is not None)

    def write(self, version: int, tensors: Mapping[str, Any]) -> SlotDescriptor:
        """Copy ``tensors`` into the slot not holding the newest version (once no reader copies from it); the
        descriptor of the result."""
        torch = torch_module()
        if not self._closed.alive:
            raise WeightSyncError(f"weight sync version {version}: the device slots are closed")
        device = source_tensors_device(tensors)
        values = [carried(name, t).detach() for name, t in tensors.items()]
        sizes = [t.numel() * t.element_size() for t in values]
        offsets, used = slot_layout(sizes)
        index = 0 if self._newest is None else 1 - self._newest
        lock = self._locks[index]
        with lock.exclusive():
            if self._newest == index:
                self._newest = None
            slot = self._slots[index]
            if slot is None or slot.buffer.device != device or slot.buffer.numel() < used:
                self._slots[index] = None  # the old allocation goes before the new one comes
                slot = self._slots[index] = self._allocate(device, max(used, ALIGN))
            entries = []
            for name, value, offset, size in zip(tensors, values, offsets, sizes, strict=True):
                if size:
                    slot.buffer[offset : offset + size].view(value.dtype).view(value.shape).copy_(value)
                entries.append(SlotEntry(name, str(value.dtype).removeprefix("torch."), tuple(value.shape), offset,
                                         size, "parameter" if isinstance(tensors[name], torch.nn.Parameter)
                                         else "torch", tensors[name].requires_grad))
            physical, uuid = -1, ""
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                physical = physical_device(device.index, self.visible)
                uuid = str(torch.cuda.get_device_properties(device).uuid)
            digest = device_digest(slot.buffer[:used])
            lock.stamp(slot.generation, version)
        self._newest = index
        return SlotDescriptor(self.writer, version, index, slot.generation, device.type, slot.handle, physical,
                              uuid, tuple(entries), used, digest, lock.ref)

    def _allocate(self, device: Any, nbytes: int) -> _Slot:
        torch = torch_module()
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        handle = KINDS[device.type].share(buffer.untyped_storage())
        self._generations += 1
        return _Slot(buffer, self._generations, handle)

    def close(self) -> None:
        """Free both slots (waiting for a reader still copying from one) and their locks; idempotent."""
        self._closed()


def entry_views(entries: Sequence[SlotEntry], data: Any, base: int = 0) -> dict[str | int, Any]:
    """The tensors of ``entries`` as views of ``data``, which holds their bytes from offset ``base`` on, in their
    order (an ``nn.Parameter`` rebuilt as one)."""
    torch = torch_module()
    out = {}
    for e in entries:
        dtype = getattr(torch, e.dtype)
        at = e.offset - base
        tensor = (data[at : at + e.nbytes].view(dtype).view(e.shape) if e.nbytes
                  else torch.empty(e.shape, dtype=dtype, device=data.device))
        out[e.name] = rebuilt(tensor, e.kind, e.requires_grad)
    return out


class SlotReader:
    """A target's side of one weight sync's slots: each slot mapped once per allocation (generation).

    ``visible``: as for :class:`SlotWriter`, in the target's process.
    """

    def __init__(self, visible: Sequence[int] | None = None) -> None:
        self.visible = None if visible is None else tuple(visible)
        self._mapped: dict[int, tuple[str, int, Any]] = {}  # slot: (writer, generation, uint8 tensor)

    def read(self, descriptor: SlotDescriptor, into: Any = None) -> dict[str | int, Any]:
        """The version ``descriptor`` names, as tensors on this process's own device that view a private copy
        (the source may overwrite its slot afterwards): ``into`` (a flat uint8 tensor on that device, reused when
        it is large enough) or a new buffer. See :meth:`held` for what it raises; ``into`` is written only once
        the slot is known to hold the version intact."""
        torch = torch_module()
        with self.held(descriptor) as data:
            fits = into is not None and into.device == data.device and into.numel() >= data.numel()
            private = into if fits else torch.empty(max(data.numel(), 1), dtype=torch.uint8, device=data.device)
            private[: data.numel()].copy_(data)
        return entry_views(descriptor.entries, private)

    @contextlib.contextmanager
    def held(self, descriptor: SlotDescriptor) -> Iterator[Any]:
        """The bytes of the version ``descriptor`` names, in the source's slot, checked against their digest and
        kept from the writer while the block runs (the device is waited for before it may write again).

        :class:`TornRead` when the slot holds another version by now (read a newer one) or is gone;
        ``WeightSyncError`` when its bytes do not match the digest (corrupted); :class:`SlotOpenError` when
        the slot cannot be mapped here.
        """
        torch = torch_module()
        held = self._mapped.get(descriptor.slot)
        if held is not None and held[:2] != (descriptor.writer, descriptor.generation):
            del self._mapped[descriptor.slot]  # the slot's old allocation: unmapped before the new one
        with reading(descriptor.lock, descriptor.generation, descriptor.version) as why:
            if why:
                raise TornRead(descriptor.version, f"slot {descriptor.slot} {why}")
            mapped = self._mapping(descriptor)
            if descriptor.nbytes > mapped.numel():
                raise TornRead(descriptor.version, f"slot {descriptor.slot} holds {mapped.numel()} bytes, fewer "
                                                   f"than the {descriptor.nbytes} its descriptor names (corrupted)")
            data = mapped[: descriptor.nbytes]
            digest = device_digest(data)
            if digest != descriptor.digest:
                raise WeightSyncError(f"weight sync version {descriptor.version}: slot {descriptor.slot} does not "
                                      f"match its digest (digest {digest}, expected {descriptor.digest}): "
                                      "corrupted; the previous version stays the latest")
            try:
                yield data
            finally:
                if data.device.type == "cuda":  # the copies from the slot are done before the writer may write
                    torch.cuda.current_stream(data.device).synchronize()

    def close(self) -> None:
        """Drop every slot's mapping (on CUDA, closes the IPC handles: the source's memory can then be freed)."""
        self._mapped.clear()

    def _mapping(self, descriptor: SlotDescriptor) -> Any:
        torch = torch_module()
        held = self._mapped.get(descriptor.slot)
        if held is not None:
            return held[2]
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
            raise SlotOpenError(
                f"weight sync version {descriptor.version}: cannot map slot {descriptor.slot} of the source "
                f"(process {descriptor.lock[0]}, {descriptor.kind} device {descriptor.device}) in this process: "
                f"{str(exc).strip() or type(exc).__name__}. The slot holds the version (it is locked), so this is no "
                "race: CUDA IPC is refused here. A source with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                "shares through pidfd_getfd, which ptrace rules (kernel.yama.ptrace_scope) or seccomp can refuse: "
                "unset it in the source, or allow it") from None
        tensor = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        self._mapped[descriptor.slot] = (descriptor.writer, descriptor.generation, tensor)
        return tensor
