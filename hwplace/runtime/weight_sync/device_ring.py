"""Weights shared on one device in a ring of fixed-size buckets: the source's device memory for a weight sync is
bounded by ``device_buckets * bucket_bytes`` whatever the model's size.

The source (:class:`RingWriter`) lays a version's tensors out back to back at 256-byte offsets
(:func:`~hwplace.runtime.weight_sync.device_share.slot_layout`) and cuts those bytes into buckets of
``bucket_bytes`` (rounded up to a multiple of 256; a tensor may straddle buckets). Buckets go to the **ring**:
``device_buckets`` buffers on the tensors' device, allocated once (at the size the bucket needs, at most
``bucket_bytes``) and reused across versions. While a version needs at most half the ring, consecutive versions
take turns between its start and its end (the newest stays whole while the next is written); a larger one takes
the ring from its first bucket. A version
larger than the whole ring puts its remaining buckets in host shared memory (torch's ``/dev/shm`` files, also
reused across versions): the source's GPU memory stays bounded, and its publish never waits for a target (a
target copies when it asks, possibly long after, in its turn). Each bucket has a lock and a stamp
(:mod:`hwplace.runtime.weight_sync.slot_lock`) and a digest (taken on the device for a ring bucket, XXH3 for a
host one), all named in the small picklable :class:`RingDescriptor` that travels instead of the weights.

A target (:class:`RingReader`) maps each bucket once per allocation; when it asks, it holds every bucket of the
version under a shared lock (taken without waiting: a bucket being written or holding another version is a
:class:`~hwplace.runtime.weight_sync.device_share.TornRead`, as a newer version is on its way), checks every
digest in place, and only then copies: into a flat buffer of its own (``read``) or straight into a module's
tensors (``load``), so neither ever holds a mix of two versions. The source rewrites or frees a bucket only under
its exclusive lock, waiting for a target still copying from it; a target that dies lets go of its locks. A
bucket that cannot be mapped is a :class:`~hwplace.runtime.weight_sync.device_share.SlotOpenError` naming why.

On CPU the ring is torch's file-system shared memory too, which is how the CPU suite runs all of this. Imports the
foundation, the config's defaults, the planning's bucket size, the buckets' digests, the device-share primitives
and the slot locks.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.config.weight_sync import DEFAULT_BUCKET_BYTES, DEFAULT_DEVICE_BUCKETS
from hwplace.foundation.errors import WeightSyncError
from hwplace.planning.sync_plan import ring_bucket_bytes
from hwplace.runtime.messaging.communicator import torch_module
from hwplace.runtime.weight_sync.buckets import DEFAULT_DIGEST, carried, digest
from hwplace.runtime.weight_sync.device_share import (
    KINDS,
    Handle,
    SlotEntry,
    SlotOpenError,
    TornRead,
    device_digest,
    device_index,
    entry_views,
    physical_device,
    slot_layout,
    source_tensors_device,
)
from hwplace.runtime.weight_sync.slot_lock import LockRef, SlotLock, reading

MAX_BUCKETS = 4096  # a target holds a lock (a file descriptor) on every bucket of the version it copies


@dataclass(frozen=True)
class BucketRef:
    """One bucket of a version: where it lies (its index: ring positions first, then host ones; its allocation's
    generation, share kind, handle and lock), which bytes of the version it holds (``start``, ``nbytes``) and their
    digest."""

    index: int
    generation: int
    kind: str
    handle: Handle
    lock: LockRef
    start: int
    nbytes: int
    digest: str


@dataclass(frozen=True)
class RingDescriptor:
    """One written version: the writer, the source's physical device (node-local hardware rank and UUID; ``-1``
    and ``""`` on CPU), the entries (offsets into the version's bytes), the bytes in all, the bucket size (every
    bucket but the last is full) and each bucket."""

    writer: str
    version: int
    device: int
    uuid: str
    entries: tuple[SlotEntry, ...]
    nbytes: int
    bucket_bytes: int
    buckets: tuple[BucketRef, ...]


@dataclass
class _Bucket:
    buffer: Any  # flat uint8 tensor
    generation: int
    handle: Handle


def _let_go(buckets: dict[int, _Bucket], locks: dict[int, SlotLock]) -> None:
    """Free every bucket under its lock, then the locks (``close``, or the writer's end)."""
    for index, lock in list(locks.items()):
        with contextlib.suppress(OSError), lock.exclusive():
            buckets.pop(index, None)
        lock.close()
    locks.clear()


def pieces(start: int, size: int, bucket_bytes: int) -> Iterator[tuple[int, int, int, int]]:
    """The parts of bytes ``[start, start + size)`` of a version cut into buckets of ``bucket_bytes``: each part's
    bucket, its offset in the bucket and in the range, and its length."""
    done = 0
    while done < size:
        at = start + done
        bucket, offset = divmod(at, bucket_bytes)
        length = min(size - done, bucket_bytes - offset)
        yield bucket, offset, done, length
        done += length


class RingWriter:
    """The source's ring of device buckets for one weight sync, in the source process.

    ``visible``: the node-local hardware ranks of the devices this process sees, in device-index order (its
    placement's ``visible_accelerators``); None when index and hardware rank agree.
    """

    def __init__(self, visible: Sequence[int] | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 device_buckets: int = DEFAULT_DEVICE_BUCKETS) -> None:
        if bucket_bytes < 1 or device_buckets < 1:
            raise WeightSyncError(f"a ring needs buckets of 1 byte or more and 1 bucket or more, got {device_buckets} "
                                  f"of {bucket_bytes} bytes")
        self.visible = None if visible is None else tuple(visible)
        self.bucket_bytes = ring_bucket_bytes(bucket_bytes)  # a multiple of the 256-byte alignment
        self.device_buckets = device_buckets
        self.writer = os.urandom(8).hex()
        self._buckets: dict[int, _Bucket] = {}  # ring positions 0.., host ones from device_buckets on
        self._locks: dict[int, SlotLock] = {}
        self._newest: tuple[int, ...] = ()  # the indices that hold the newest complete version
        self._generations = 0
        self._closed = weakref.finalize(self, _let_go, self._buckets, self._locks)

    @property
    def device_bytes(self) -> int:
        """The memory the ring holds now (on the device; on CPU, the stand-in's shared memory)."""
        return sum(b.buffer.numel() for i, b in self._buckets.items() if i < self.device_buckets)

    @property
    def host_bytes(self) -> int:
        """The host shared memory holding the buckets of a version larger than the ring."""
        return sum(b.buffer.numel() for i, b in self._buckets.items() if i >= self.device_buckets)

    def places(self, count: int) -> tuple[int, ...]:
        """Where the next version's ``count`` buckets go: while two versions fit in the ring, its start or its end,
        whichever the newest version is not in (that one stays whole while this one is written); else the ring from
        its start, then host buckets (indices from ``device_buckets`` on)."""
        ring, first = self.device_buckets, tuple(range(count))
        if 2 * count <= ring and set(first) & set(self._newest):
            return tuple(range(ring - count, ring))
        return first

    def write(self, version: int, tensors: Mapping[str, Any]) -> RingDescriptor:
        """Copy ``tensors`` into buckets of the ring (each once no reader copies from it); the descriptor."""
        torch = torch_module()
        if not self._closed.alive:
            raise WeightSyncError(f"weight sync version {version}: the device buckets are closed")
        device = source_tensors_device(tensors)
        values = [carried(name, t).detach() for name, t in tensors.items()]
        sizes = [t.numel() * t.element_size() for t in values]
        offsets, used = slot_layout(sizes)
        count = max(1, -(-used // self.bucket_bytes))
        if count > MAX_BUCKETS:
            raise WeightSyncError(f"weight sync version {version}: {used} bytes make {count} buckets of bucket_bytes "
                                  f"{self.bucket_bytes}, more than the {MAX_BUCKETS} a target can hold at once; "
                                  f"give the sync a bucket_bytes of at least {-(-used // MAX_BUCKETS)}")
        places = self.places(count)
        if any(i < self.device_buckets and b.buffer.device != device for i, b in self._buckets.items()):
            self._free(set(self._buckets))  # the tensors moved to another device: the ring follows them
        physical, uuid = -1, ""
        if device.type == "cuda":
            physical = physical_device(device.index, self.visible)
            uuid = str(torch.cuda.get_device_properties(device).uuid)
        kept = () if set(self._newest) & set(places) else self._newest  # the newest version, when it stays whole
        flats: dict[int, Any] = {}  # the tensors across buckets as flat bytes, made contiguous once
        refs = []
        for number, index in enumerate(places):
            start = number * self.bucket_bytes
            length = min(self.bucket_bytes, used - start) if used else 0
            if index not in self._locks:
                self._locks[index] = SlotLock(f"hwplace-ring-{self.writer}-{index}")
            lock = self._locks[index]
            with lock.exclusive():
                bucket = self._bucket(index, device, length)
                self._fill(bucket.buffer, number, values, offsets, sizes, flats)
                data = bucket.buffer[:length]
                if index < self.device_buckets:
                    sealed = device_digest(data)  # waits for the copies on a GPU
                else:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    sealed = digest(data.numpy(), DEFAULT_DIGEST)
                lock.stamp(bucket.generation, version)
            refs.append(BucketRef(index, bucket.generation, "cuda" if bucket.buffer.device.type == "cuda" else "cpu",
                                  bucket.handle, lock.ref, start, length, sealed))
        self._free(set(self._locks) - set(places) - set(kept))
        self._newest = places
        entries = tuple(SlotEntry(name, str(value.dtype).removeprefix("torch."), tuple(value.shape), offset, size,
                                  "parameter" if isinstance(tensors[name], torch.nn.Parameter) else "torch",
                                  tensors[name].requires_grad)
                        for name, value, offset, size in zip(tensors, values, offsets, sizes, strict=True))
        return RingDescriptor(self.writer, version, physical, uuid, entries, used, self.bucket_bytes, tuple(refs))

    def _fill(self, buffer: Any, number: int, values: Sequence[Any], offsets: Sequence[int], sizes: Sequence[int],
              flats: dict[int, Any]) -> None:
        """Copy into ``buffer`` the bytes of the version that bucket ``number`` holds."""
        low, high = number * self.bucket_bytes, (number + 1) * self.bucket_bytes
        first = bisect.bisect_right(offsets, low) - 1  # offsets grow: the tensors of this bucket lie together
        for position in range(max(first, 0), len(values)):
            value, offset, size = values[position], offsets[position], sizes[position]
            if offset >= high:
                break
            if not size or offset + size <= low:
                continue
            if low <= offset and offset + size <= high:  # wholly in this bucket: one copy, strides and all
                buffer[offset - low : offset - low + size].view(value.dtype).view(value.shape).copy_(value)
                continue
            if position not in flats:
                flats.clear()  # the tensor before it is done: buckets are filled in order
                flats[position] = value.contiguous().reshape(-1).view(torch_module().uint8)
            flat = flats[position]
            for bucket, at, done, length in pieces(offset, size, self.bucket_bytes):
                if bucket == number:
                    buffer[at : at + length].copy_(flat[done : done + length], non_blocking=True)

    def _bucket(self, index: int, device: Any, length: int) -> _Bucket:
        """Bucket ``index`` with room for ``length`` bytes (allocated anew at that size, the old one freed first,
        when it has not); under its lock."""
        bucket = self._buckets.get(index)
        if bucket is None or bucket.buffer.numel() < max(length, 1):
            self._buckets.pop(index, None)  # the old allocation goes before the new one comes
            torch = torch_module()
            where = device if index < self.device_buckets else torch.device("cpu")
            buffer = torch.empty(max(length, 1), dtype=torch.uint8, device=where)
            handle = KINDS[where.type].share(buffer.untyped_storage())
            self._generations += 1
            bucket = self._buckets[index] = _Bucket(buffer, self._generations, handle)
        return bucket

    def _free(self, indices: set[int]) -> None:
        """Free buckets ``indices`` (each under its lock: a reader still copying is waited for)."""
        for index in sorted(indices):
            lock = self._locks.pop(index, None)
            if lock is None:
                continue
            with contextlib.suppress(OSError), lock.exclusive():
                self._buckets.pop(index, None)
            lock.close()

    def close(self) -> None:
        """Free every bucket (waiting for a reader still copying from one) and their locks; idempotent."""
        self._closed()


class RingReader:
    """A target's side of one weight sync's ring: each bucket mapped once per allocation.

    ``visible``: as for :class:`RingWriter`, in the target's process.
    """

    def __init__(self, visible: Sequence[int] | None = None) -> None:
        self.visible = None if visible is None else tuple(visible)
        self._mapped: dict[int, tuple[str, int, Any]] = {}  # bucket index: (writer, generation, uint8 tensor)

    @property
    def mapped(self) -> int:
        """How many buckets this reader maps now."""
        return len(self._mapped)

    def read(self, descriptor: RingDescriptor, into: Any = None) -> dict[str | int, Any]:
        """The version ``descriptor`` names, as tensors on this process's device that view a private copy:
        ``into`` (a flat uint8 tensor there, reused when it is large enough) or a new buffer, written only once
        every bucket is known to hold the version intact. See :meth:`held` for what it raises."""
        torch = torch_module()
        with self.held(descriptor) as parts:
            device = _home(descriptor, parts)
            fits = into is not None and into.device == device and into.numel() >= descriptor.nbytes
            private = into if fits else torch.empty(max(descriptor.nbytes, 1), dtype=torch.uint8, device=device)
            for ref, part in zip(descriptor.buckets, parts, strict=True):
                private[ref.start : ref.start + ref.nbytes].copy_(part, non_blocking=part.device.type == "cpu")
        return entry_views(descriptor.entries, private)

    def load(self, descriptor: RingDescriptor, module: Any) -> None:
        """Load the version straight from its buckets into ``module`` (``load_state_dict``): a tensor that lies in
        one bucket is copied from there; one across buckets is copied piece by piece into the module's own tensor
        when that has its dtype and shape, else into a staging tensor. Nothing is copied unless every bucket holds
        the version intact."""
        torch = torch_module()
        own = module.state_dict()
        direct = set(own) == {e.name for e in descriptor.entries}  # else load_state_dict names the mismatch first
        size = descriptor.bucket_bytes
        with self.held(descriptor) as parts:
            device = _home(descriptor, parts)
            tensors: dict[Any, Any] = {}
            for e in descriptor.entries:
                first = min(e.offset // size, len(parts) - 1)
                if e.offset + e.nbytes <= (first + 1) * size:  # in one bucket (or empty): a view of it
                    tensors.update(entry_views((e,), parts[first], first * size))
                    continue
                dtype = getattr(torch, e.dtype)
                mine = own.get(e.name) if direct else None
                target = mine if (mine is not None and mine.dtype == dtype and tuple(mine.shape) == e.shape
                                  and mine.is_contiguous()) else torch.empty(e.shape, dtype=dtype, device=device)
                flat = target.reshape(-1).view(torch.uint8)
                for bucket, at, done, length in pieces(e.offset, e.nbytes, size):
                    flat[done : done + length].copy_(parts[bucket][at : at + length])
                tensors[e.name] = target
            module.load_state_dict(tensors)

    @contextlib.contextmanager
    def held(self, descriptor: RingDescriptor) -> Iterator[list[Any]]:
        """Each bucket's bytes of the version ``descriptor`` names, checked against their digests and kept from the
        writer while the block runs (the device is waited for before it may write again).

        :class:`TornRead` when a bucket holds another version by now (read a newer one) or is gone;
        ``WeightSyncError`` when a bucket does not match its digest (corrupted); :class:`SlotOpenError` when a
        bucket cannot be mapped here.
        """
        torch = torch_module()
        for ref in descriptor.buckets:  # a bucket's old allocation is unmapped first, whatever comes of this read
            held = self._mapped.get(ref.index)
            if held is not None and held[:2] != (descriptor.writer, ref.generation):
                del self._mapped[ref.index]
        with contextlib.ExitStack() as stack:
            parts = []
            for ref in descriptor.buckets:
                why = stack.enter_context(reading(ref.lock, ref.generation, descriptor.version))
                if why:
                    raise TornRead(descriptor.version, f"bucket {ref.index} {why}")
                mapped = self._mapping(descriptor, ref)
                if ref.nbytes > mapped.numel():
                    raise TornRead(descriptor.version, f"bucket {ref.index} holds {mapped.numel()} bytes, fewer than "
                                                       f"the {ref.nbytes} its descriptor names (corrupted)")
                parts.append(mapped[: ref.nbytes])
            for ref, data in zip(descriptor.buckets, parts, strict=True):
                found = device_digest(data) if ref.digest.startswith("wsum:") else \
                    digest(data.numpy(), ref.digest.split(":", 1)[0])
                if found != ref.digest:
                    raise WeightSyncError(f"weight sync version {descriptor.version}: bucket {ref.index} does not "
                                          f"match its digest (digest {found}, expected {ref.digest}): corrupted; the "
                                          "previous version stays the latest")
            try:
                yield parts
            finally:
                device = _home(descriptor, parts)
                if device.type == "cuda":  # the copies (from host buckets too) are done before the writer may write
                    torch.cuda.current_stream(device).synchronize()

    def close(self) -> None:
        """Drop every bucket's mapping (on CUDA, closes the IPC handles: the source's memory can then be freed)."""
        self._mapped.clear()

    def _mapping(self, descriptor: RingDescriptor, ref: BucketRef) -> Any:
        torch = torch_module()
        held = self._mapped.get(ref.index)
        if held is not None:
            return held[2]
        kind = KINDS.get(ref.kind)
        if kind is None:
            raise WeightSyncError(f"weight sync version {descriptor.version}: bucket kind {ref.kind!r} is unknown "
                                  f"here ({', '.join(KINDS)})")
        index = device_index(descriptor.device, self.visible) if ref.kind == "cuda" else -1
        if ref.kind == "cuda" and descriptor.uuid and \
                str(torch.cuda.get_device_properties(index).uuid) != descriptor.uuid:
            raise WeightSyncError(f"weight sync version {descriptor.version}: this process's cuda:{index} is not "
                                  f"GPU {descriptor.device} of the source ({descriptor.uuid}); its visible "
                                  f"devices are given wrong ({self.visible})")
        try:
            storage = kind.open(ref.handle, index)
        except RuntimeError as exc:
            raise SlotOpenError(
                f"weight sync version {descriptor.version}: cannot map bucket {ref.index} of the source "
                f"(process {ref.lock[0]}, {ref.kind} device {descriptor.device}) in this process: "
                f"{str(exc).strip() or type(exc).__name__}. The bucket holds the version (it is locked), so this is "
                "no race: CUDA IPC is refused here. A source with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                "shares through pidfd_getfd, which ptrace rules (kernel.yama.ptrace_scope) or seccomp can refuse: "
                "unset it in the source, or allow it") from None
        tensor = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        self._mapped[ref.index] = (descriptor.writer, ref.generation, tensor)
        return tensor


def _home(descriptor: RingDescriptor, parts: Sequence[Any]) -> Any:
    """The device a target copies the version onto: the ring's (the source's GPU, as this process sees it)."""
    for ref, part in zip(descriptor.buckets, parts, strict=True):
        if ref.kind == "cuda":
            return part.device
    return torch_module().device("cpu")
