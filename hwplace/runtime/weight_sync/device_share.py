"""Device memory shared between two processes of one node, the primitives of the same-device ring
(:mod:`hwplace.runtime.weight_sync.device_ring`): how a buffer is shared and mapped (:class:`ShareKind`: CUDA IPC
for CUDA tensors, torch's file-system shared memory for CPU ones), the layout of a state dict's tensors back to back
at 256-byte offsets and their views (:class:`SlotEntry`, :func:`slot_layout`, :func:`entry_views`), the digest
taken on the device (:func:`device_digest`), the mapping of device indices between processes that see different
GPUs (:func:`physical_device`, :func:`device_index`), the one device of a state dict
(:func:`source_tensors_device`), and the errors of a read: :class:`TornRead` (the bytes hold another version by
now: read a newer one) and :class:`SlotOpenError` (the memory cannot be mapped here, named why).

On CUDA a share returns the consumer count torch's IPC puts on it at once: the writer owns the memory's lifetime
(under its locks), so freed memory goes back to torch's cache at once, never waiting in torch's "limbo" for a
reader that may never come. CPU tensors share through ``/dev/shm`` (counted by torch's ``torch_shm_manager``, which
unlinks a file once no process holds it), so the whole flow runs for real without a GPU. Imports the foundation,
the buckets' ``aligned`` layout and ``rebuilt``, and the communicator's torch loader.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import WeightSyncError
from hwplace.foundation.wording import safe_repr
from hwplace.runtime.messaging.communicator import torch_module
from hwplace.runtime.weight_sync.buckets import aligned, rebuilt

ALIGN = 256  # each tensor starts at a multiple of this many bytes
CHUNK_WORDS = 4 * 2**20  # int32 words per step of a digest: 16 MiB read, 64 MiB of int64 temporaries at most
MASK = 2**64 - 1
Handle = tuple[Any, ...]


class TornRead(WeightSyncError):
    """A bucket did not hold the version its descriptor names when it was read: being written or overwritten by a
    newer version (read that one), or freed."""

    def __init__(self, version: int, reason: str) -> None:
        self.version = version
        self.reason = reason
        super().__init__(f"weight sync version {version}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes with its fields
        return type(self), (self.version, self.reason)


@dataclass(frozen=True)
class ShareKind:
    """How a bucket's memory is shared: ``share(storage)`` gives a picklable handle (once per allocation), and
    ``open(handle, device_index)`` maps it in another process, as that process's device ``device_index``."""

    name: str
    share: Callable[[Any], Handle]
    open: Callable[[Handle, int], Any]


def _share_cuda(storage: Any) -> Handle:
    # (device, IPC handle, size, offset in the allocation, ref counter file, its offset, event handle, event needed)
    handle = tuple(storage._share_cuda_())
    # torch expects one consumer to release each share; the writer owns the bucket's lifetime instead
    torch_module().UntypedStorage._release_ipc_counter_cuda(handle[4], handle[5])
    return handle


def _open_cuda(handle: Handle, device_index: int) -> Any:
    # in another process only: CUDA does not open an IPC handle in the process that made it
    torch = torch_module()
    torch.cuda._lazy_init()
    return torch.UntypedStorage._new_shared_cuda(device_index, *handle[1:])


MANAGER_TRIES = 5  # torch's client gives its torch_shm_manager 1 s to answer: a loaded machine can miss that
MANAGER_TIMEOUT = "Shared memory manager connection has timed out"  # torch's words when it does


def _asking_manager(call: Callable[[], Any]) -> Any:
    """``call()`` (which connects to torch's torch_shm_manager first), made again where torch gave up waiting for
    the manager's answer, up to ``MANAGER_TRIES`` in all; any other failure, or the last, stands."""
    for _ in range(MANAGER_TRIES - 1):
        try:
            return call()
        except RuntimeError as exc:
            if MANAGER_TIMEOUT not in str(exc):
                raise
    return call()


def _share_cpu(storage: Any) -> Handle:
    return tuple(_asking_manager(storage._share_filename_cpu_))  # (manager, file name, size): in /dev/shm, named


def _open_cpu(handle: Handle, device_index: int) -> Any:
    return _asking_manager(lambda: torch_module().UntypedStorage._new_shared_filename_cpu(*handle))


class SlotOpenError(WeightSyncError):
    """A bucket that holds the version wanted cannot be mapped in this process (CUDA IPC refused): the cause is named,
    and every version will fail the same way."""


CUDA = ShareKind("cuda", _share_cuda, _open_cuda)
CPU = ShareKind("cpu", _share_cpu, _open_cpu)
KINDS: dict[str, ShareKind] = {"cuda": CUDA, "cpu": CPU}


@dataclass(frozen=True)
class SlotEntry:
    """One tensor of a version: its name, dtype (``float32``), shape, and bytes ``[offset, offset + nbytes)``."""

    name: str | int
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    kind: str = "torch"  # or "parameter": an nn.Parameter, rebuilt as one
    requires_grad: bool = False


def slot_layout(sizes: Sequence[int], align: int = ALIGN) -> tuple[list[int], int]:
    """Each size's offset (back to back, each a multiple of ``align``) and the bytes used in all."""
    return aligned(sizes, align)


def layout_bytes(state_dict: Mapping[Any, Any]) -> int:
    """The bytes a state dict's tensors take laid out in buckets, each at a multiple of ``ALIGN`` bytes (up to
    ``ALIGN - 1`` more per tensor than their sum): the model size the sync's device memory follows."""
    return slot_layout([int(getattr(value, "nbytes", 0)) for value in state_dict.values()])[1]


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
                              f"not see (its devices are GPUs {list(visible)}); a bucket is read on its own GPU")
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
