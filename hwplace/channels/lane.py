"""A channel's same-node lane: large items in their producer's shared memory, read in place by consumers.

An item whose pickle (protocol 5) carries at least :data:`LANE_BYTES` of out-of-band buffers (numpy arrays, and
containers of them), put by a process on the node of the channel's host, travels by the lane: the producer copies
its buffers into a slot of its own (a memfd, :class:`Slots`), and the payload the host queues carries only where
they lie (the producer's process, descriptor, inode and the slot's generation), the pickle's small rest and the
buffers' sizes. A consumer on that node maps the slot (a mapping it keeps, populated, for the slot's next items)
and unpickles the item over it: read-only arrays over the producer's memory, as Ray's object store gives them.

A slot's header says what it holds: its generation (one per item) and state: ``QUEUED`` while the item is in the
channel (queued, or held for a taker until acknowledged), ``TAKEN`` once it has left for good. The producer
reuses a slot only when it is not ``QUEUED`` and it gets an exclusive ``flock`` on it; a consumer holds a shared
lock while any array of the item lives (a finalizer lets go), so a slot is never rewritten under a reader, and a
reader's death lets go of its lock. Who marks ``TAKEN``: a consumer that got the item outright, once it holds
the lock; the host for an item acknowledged, discarded as stale, or dropped (a failed put, a close). So an item
held until acknowledged stays ``QUEUED`` while its taker lives, and when the taker dies the host hands the same
payload out again, the item intact. A consumer on another node (one that began reading after the producer chose
the lane) gets the item by value from the host, which runs on the producer's node (:func:`inline_of`); so does a
snapshot (its copy holds the item itself). Like an item in Ray's store, an item whose producer died before it
was read is lost (a ``ChannelLost``). Imports the foundation, :mod:`hwplace.channels.wire` and the queues' ``Status``;
numpy on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import pickle
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from hwplace.channels import wire
from hwplace.channels.queues import Status
from hwplace.foundation.errors import ChannelLost
from hwplace.foundation.peer_files import KeptMappings, open_peer

LANE_BYTES = 1 << 20
"""Items whose out-of-band buffers total at least this many bytes go by the lane (when it is open to them)."""
LANE_MAX = 1 << 30
"""The most shared memory a producer keeps in its slots; an item that would need more goes by the object store."""
KEEP = 64  # a consumer keeps its mappings of this many slots (the most recently read)
HEADER = 64
ALIGN = 64
MAGIC = 0x68776C616E65  # "hwlane"
STAMP = struct.Struct("<qqq")  # magic, generation, state
FREE, QUEUED, TAKEN = 0, 1, 2
REF = struct.Struct("!16siiqqI")  # node, pid, fd, inode, generation, buffer count
SIZE = struct.Struct("!Q")
BUFFERS = struct.Struct("!I")  # an inline payload's buffer count (after its first byte), then each one's SIZE


def node_key(node: str) -> bytes:
    """The 16 bytes a lane payload names its producer's node by."""
    return hashlib.sha256(node.encode()).digest()[:16]


def inline(data: bytes | memoryview, raws: Sequence[Any], trailer: bytes) -> bytes:
    """An inline payload: the pickle ``data`` and its out-of-band buffers ``raws``, then ``trailer``."""
    head = BUFFERS.pack(len(raws)) + b"".join(SIZE.pack(memoryview(r).nbytes) for r in raws)
    return b"".join((wire.INLINE, head, data, *raws, trailer))


def _offsets(sizes: Sequence[int]) -> tuple[list[int], int]:
    offsets, end = [], HEADER
    for size in sizes:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + size
    return offsets, end


class _Slot:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.generation = 0
        self.fd = os.memfd_create("hwplace-lane", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, capacity)
            self.map = mmap.mmap(self.fd, capacity, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except OSError:
            os.close(self.fd)
            raise
        self.inode = os.fstat(self.fd).st_ino

    def state(self) -> int:
        magic, _, state = STAMP.unpack_from(self.map, 0)
        return state if magic == MAGIC else FREE


class Slots:
    """A producer's slots (one per item in flight), reused once their item has left and no reader holds them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []

    def put(self, node: str, data: bytes, raws: Sequence[Any]) -> bytes | None:
        """The lane payload (without its trailer) of the item pickled as ``data`` and ``raws``, its buffers copied
        into a free slot; None when that would take this process past :data:`LANE_MAX` (or no memory is left)."""
        import numpy as np  # noqa: PLC0415 (the lane carries out-of-band buffers: numpy's)

        sizes = [memoryview(r).nbytes for r in raws]
        offsets, need = _offsets(sizes)
        with self._lock:
            slot = self._claim(need)
            if slot is None:
                return None
            try:
                STAMP.pack_into(slot.map, 0, MAGIC, slot.generation, FREE)
                view = np.frombuffer(slot.map, dtype=np.uint8)
                for raw, offset, size in zip(raws, offsets, sizes, strict=True):
                    view[offset : offset + size] = np.frombuffer(raw, dtype=np.uint8)
                del view
                slot.generation += 1
                STAMP.pack_into(slot.map, 0, MAGIC, slot.generation, QUEUED)
            finally:
                fcntl.flock(slot.fd, fcntl.LOCK_UN)
        ref = REF.pack(node_key(node), os.getpid(), slot.fd, slot.inode, slot.generation, len(sizes))
        return wire.LANE + ref + b"".join(SIZE.pack(s) for s in sizes) + data

    def _claim(self, need: int) -> _Slot | None:
        """A slot of at least ``need`` bytes, locked exclusively, whose item has left and that no reader holds."""
        best = None
        for slot in self._slots:
            if slot.capacity >= need and (best is None or slot.capacity < best.capacity) and \
                    slot.state() != QUEUED and _try_lock(slot.fd, fcntl.LOCK_EX):
                if slot.state() == QUEUED:
                    fcntl.flock(slot.fd, fcntl.LOCK_UN)
                    continue
                if best is not None:
                    fcntl.flock(best.fd, fcntl.LOCK_UN)
                best = slot
        if best is not None:
            return best
        capacity = -(-need // (1 << 20)) << 20  # whole MiB: a slot serves items of a little more next time
        if sum(s.capacity for s in self._slots) + capacity > LANE_MAX:
            return None
        try:
            slot = _Slot(capacity)
        except OSError:
            return None
        fcntl.flock(slot.fd, fcntl.LOCK_EX)
        self._slots.append(slot)
        return slot

    @property
    def count(self) -> int:
        return len(self._slots)


SLOTS = Slots()
"""This process's slots (a forked child starts with none: its parent's descriptors are not its own)."""


def parse(payload: bytes | bytearray | memoryview) -> tuple[bytes, int, int, int, int, list[int], memoryview]:
    """A lane payload's node key, pid, fd, inode, generation, buffer sizes and pickle data."""
    view = memoryview(payload)
    node, pid, fd, inode, generation, count = REF.unpack_from(view, 1)
    at = 1 + REF.size
    sizes = [SIZE.unpack_from(view, at + i * SIZE.size)[0] for i in range(count)]
    at += count * SIZE.size
    return node, pid, fd, inode, generation, sizes, view[at : len(view) - wire.TRAILER.size]


def _open(pid: int, fd: int, inode: int, flags: int = os.O_RDONLY) -> int | None:
    try:
        return open_peer(pid, fd, inode, flags)
    except OSError:
        return None


def _stamp(fd: int) -> tuple[int, int, int]:
    data = os.pread(fd, STAMP.size, 0)
    return STAMP.unpack(data) if len(data) == STAMP.size else (0, 0, 0)


class Reader:
    """A consumer's side: the mappings it keeps of producers' slots, and items read in place over them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps = KeptMappings(KEEP)

    def load(self, payload: bytes | bytearray, describe: str, outright: bool) -> Any:
        """The item of a lane payload of this node, read in place (``outright``: got with ``ack=True``, so its slot
        is marked ``TAKEN``, for its producer to reuse once the item's arrays are gone)."""
        import numpy as np  # noqa: PLC0415 (the lane carries out-of-band buffers: numpy's)

        _, pid, fd, inode, generation, sizes, data = parse(payload)
        lock = _open(pid, fd, inode, os.O_RDWR)
        if lock is None:
            raise ChannelLost(f"{describe}: an item put through the same-node lane was lost with the process that "
                              f"put it (process {pid})")
        try:
            fcntl.flock(lock, fcntl.LOCK_SH)
            magic, held, state = _stamp(lock)
            if magic != MAGIC or held != generation or state != QUEUED:
                raise ChannelLost(f"{describe}: an item put through the same-node lane is no longer in its slot "
                                  f"(generation {held}, state {state}, wanted {generation} queued)")
            offsets, end = _offsets(sizes)
            with self._lock:
                mapping = self._maps.get((pid, fd, inode), end)
            if mapping is None:
                raise ChannelLost(f"{describe}: the producer's slot (process {pid}) is gone")
            # One array per item, over a memoryview (numpy's views keep such an array as their base, where a view
            # of a view would skip it): the item's arrays keep it alive, and its finalizer lets go of the lock.
            base = np.frombuffer(memoryview(mapping)[:end], dtype=np.uint8)
            weakref.finalize(base, os.close, lock)
        except BaseException:
            os.close(lock)
            raise
        if outright:
            os.pwrite(lock, STAMP.pack(MAGIC, generation, TAKEN), 0)
        buffers = [base[o : o + s] for o, s in zip(offsets, sizes, strict=True)]
        del base
        return pickle.loads(data, buffers=buffers)


READER = Reader()
"""This process's reader."""


def _forked() -> None:
    SLOTS._slots.clear()
    READER._maps.clear()


os.register_at_fork(after_in_child=_forked)


def inline_of(payload: bytes | bytearray, taken: bool = False) -> bytes | None:
    """On the host (the producer's node): the lane payload's item as an inline payload (by value), or None when
    its slot is gone; ``taken``: marks the slot ``TAKEN`` once read (the item leaves the channel with it)."""
    _, pid, fd, inode, generation, sizes, data = parse(payload)
    opened = _open(pid, fd, inode, os.O_RDWR)
    if opened is None:
        return None
    try:  # no lock: a queued item's slot is not rewritten (the producer takes only slots of items that left)
        magic, held, state = _stamp(opened)
        if magic != MAGIC or held != generation or state != QUEUED:
            return None
        offsets, _ = _offsets(sizes)
        raws = [os.pread(opened, size, offset) for offset, size in zip(offsets, sizes, strict=True)]
        if taken:
            os.pwrite(opened, STAMP.pack(MAGIC, generation, TAKEN), 0)
        return inline(bytes(data), raws, bytes(payload[len(payload) - wire.TRAILER.size :]))
    finally:
        os.close(opened)


def release(payload: bytes | bytearray) -> None:
    """On the host: the lane item of ``payload`` has left the channel for good (acknowledged, stale, dropped):
    mark its slot ``TAKEN`` (nothing to do when it is gone)."""
    _, pid, fd, inode, generation, _, _ = parse(payload)
    opened = _open(pid, fd, inode, os.O_RDWR)
    if opened is None:
        return
    with contextlib.suppress(OSError):
        magic, held, _ = _stamp(opened)
        if magic == MAGIC and held == generation:
            os.pwrite(opened, STAMP.pack(MAGIC, generation, TAKEN), 0)
    os.close(opened)


def by_value(payload: bytearray, connection: wire.Connection | None, keep: bool, describe: str) -> bytearray:
    """A consumer off the producer's node: the lane item's inline payload, which the host reads from its slot
    (``keep``: held until acknowledged, so the item stays in the channel)."""
    if connection is None:
        raise ChannelLost(f"{describe}: an item in another node's shared memory cannot be read here")
    status, data = connection.request(wire.LANE_READ, 0.0 if keep else 1.0, None, b"", bytes(payload)).result()
    if status != Status.OK:
        raise ChannelLost(f"{describe}: an item put through the same-node lane was lost with the process that put "
                          "it")
    return data


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
