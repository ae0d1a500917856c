"""A weight sync's object store on the source's node: versions in shared-memory segments, mapped by reference.

The source process owns a few segments (memfd files on Linux, files in the temp dir elsewhere) and writes each
version into one of them, bucket after bucket: one copy per node, whatever the number of targets on it. A
target maps the segment (``/proc/<source pid>/fd/<fd>``) and reads the version in place, without a copy; the
mapping is kept for the next version the segment holds, so its pages are set up once.

Lifetime is a file lock per segment. A target holds a shared lock on it for as long as any tensor of the
version it read is alive (a finalizer on the version's buffer lets go); the source rewrites a segment only
under an exclusive lock, which it can take only when no target holds the segment, and otherwise takes
another or makes a new one. A segment carries the version it holds, written last: a target that locks a
segment the source has since rewritten sees another version and skips it (a newer one is on its way). A
process that dies lets go of its locks, and a segment is freed when its source and every mapping are gone:
nothing is left behind. Imports the foundation and :mod:`hwplace.runtime.weight_sync.buckets`; numpy on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import tempfile
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import WeightSyncError
from hwplace.runtime.weight_sync.buckets import aligned

HEADER = 64  # bytes before the first bucket: a magic number, then the version the segment holds
ALIGN = 64  # each bucket starts at a multiple of this
MAGIC = 0x68777073_79_6E_63  # "hwpsync"
STAMP = struct.Struct("<qq")  # magic, version (0 while the source writes)
KEPT_MAPPINGS = 8  # a target keeps at most this many segments mapped


@dataclass(frozen=True)
class SegmentRef:
    """Where a version lies: the source's process and file (``fd``, or ``path`` where there is no memfd), the
    file's inode, the version, and each bucket's offset and length. It pickles."""

    pid: int
    fd: int
    path: str
    inode: int
    version: int
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]


def offsets_of(lengths: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Each bucket's offset in a segment (after the header, aligned) and the bytes the segment needs."""
    offsets, end = aligned(lengths, ALIGN)
    return tuple(HEADER + offset for offset in offsets), HEADER + -(-end // ALIGN) * ALIGN


class _Segment:
    """One segment of the source: its file, its writable mapping and its capacity."""

    def __init__(self, capacity: int, name: str) -> None:
        self.capacity = capacity
        self.version = 0
        if hasattr(os, "memfd_create"):
            self.fd, self.path = os.memfd_create(name, os.MFD_CLOEXEC), ""
        else:  # pragma: no cover - not Linux
            self.fd, self.path = tempfile.mkstemp(prefix=f"{name}-")
        try:
            os.ftruncate(self.fd, capacity)
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # a new segment is the writer's until its first version is in
            populate = getattr(mmap, "MAP_POPULATE", 0)
            self.map = mmap.mmap(self.fd, capacity, flags=mmap.MAP_SHARED | populate)
        except OSError as exc:
            self.close()
            raise WeightSyncError(f"cannot make a {capacity:,}-byte shared-memory segment for a weight sync "
                                  f"({exc}); the source's node needs that much free memory") from None
        self.inode = os.fstat(self.fd).st_ino

    def close(self) -> None:
        with contextlib.suppress(OSError, BufferError, AttributeError):
            self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if self.path:  # pragma: no cover - not Linux
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class SegmentPool:
    """The source's segments for one weight sync; :meth:`write` puts a version in a segment no target holds."""

    def __init__(self, name: str) -> None:
        self._name = f"hwplace-wsync-{name}"
        self._segments: list[_Segment] = []

    def write(self, version: int, lengths: Sequence[int], buckets: Iterable[tuple[Any, str]]) -> tuple[
            SegmentRef, list[str]]:
        """Write ``version`` (``buckets``: each bucket and its digest, ``lengths`` their sizes) into a free
        segment; returns where it lies and the digests."""
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        offsets, need = offsets_of(lengths)
        segment = self._claim(need)
        try:
            STAMP.pack_into(segment.map, 0, MAGIC, 0)
            view = np.frombuffer(segment.map, dtype=np.uint8)
            digests = []
            for (bucket, digest), offset, length in zip(buckets, offsets, lengths, strict=True):
                view[offset : offset + length] = np.asarray(bucket, dtype=np.uint8).reshape(-1)
                digests.append(digest)
            del view
            STAMP.pack_into(segment.map, 0, MAGIC, version)
            segment.version = version
        finally:
            fcntl.flock(segment.fd, fcntl.LOCK_UN)
        ref = SegmentRef(os.getpid(), segment.fd, segment.path, segment.inode, version, offsets, tuple(lengths))
        return ref, digests

    def _claim(self, need: int) -> _Segment:
        """A segment of at least ``need`` bytes that no target holds, locked exclusively: the oldest free one,
        else a new one (free segments too small for it are let go)."""
        for segment in sorted(self._segments, key=lambda s: s.version):
            if _try_lock(segment.fd, fcntl.LOCK_EX):
                if segment.capacity >= need:
                    return segment
                self._segments.remove(segment)
                segment.close()
        segment = _Segment(need, self._name)
        self._segments.append(segment)
        return segment

    def views(self, ref: SegmentRef) -> list[Any]:
        """The source's own views of a version's buckets, valid until the pool writes its next version."""
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        segment = next(s for s in self._segments if s.fd == ref.fd and s.inode == ref.inode)
        view = np.frombuffer(segment.map, dtype=np.uint8)
        return [view[offset : offset + length] for offset, length in zip(ref.offsets, ref.lengths, strict=True)]

    @property
    def count(self) -> int:
        """How many segments the pool holds."""
        return len(self._segments)

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
        self._segments.clear()


class SegmentReader:
    """A target's side: maps the source's segments (kept mapped) and takes versions from them."""

    def __init__(self) -> None:
        self._maps: dict[tuple[int, int, str, int], mmap.mmap] = {}
        self._lock = threading.Lock()

    def take(self, ref: SegmentRef) -> list[Any] | None:
        """The version's buckets (read-only views into the segment, held until they are all gone), or ``None``
        when the segment has since been given to a newer version."""
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        path = ref.path or f"/proc/{ref.pid}/fd/{ref.fd}"
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None  # the source let the segment go: a newer version replaced it
        except OSError as exc:
            raise WeightSyncError(f"cannot open the source's shared-memory segment {path} ({exc}); the source "
                                  f"(process {ref.pid}) and this target must run as the same user on one node, "
                                  "with /proc readable") from None
        try:
            if os.fstat(fd).st_ino != ref.inode or not _try_lock(fd, fcntl.LOCK_SH):
                os.close(fd)
                return None  # another file now, or the source is writing a newer version into it
            try:
                mapping = self._mapping(ref, path)
            except FileNotFoundError:
                os.close(fd)
                return None
            magic, version = STAMP.unpack_from(mapping, 0)
            if magic != MAGIC or version != ref.version:
                os.close(fd)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        held = np.frombuffer(mapping, dtype=np.uint8)
        weakref.finalize(held, os.close, fd)  # the shared lock lasts as long as a view of this version
        return [held[offset : offset + length] for offset, length in zip(ref.offsets, ref.lengths, strict=True)]

    def _mapping(self, ref: SegmentRef, path: str) -> mmap.mmap:
        """The segment's mapping, made once. It is made from a file descriptor of its own: an mmap keeps a
        duplicate of the descriptor it was made from, which would hold that descriptor's lock for good."""
        key = (ref.pid, ref.fd, ref.path, ref.inode)
        with self._lock:
            mapping = self._maps.get(key)
            if mapping is None:
                populate = getattr(mmap, "MAP_POPULATE", 0)
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    if os.fstat(fd).st_ino != ref.inode:
                        raise FileNotFoundError(path)
                    mapping = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED | populate,
                                        prot=mmap.PROT_READ)
                finally:
                    os.close(fd)
                while len(self._maps) >= KEPT_MAPPINGS:  # views still in use keep theirs alive
                    self._maps.pop(next(iter(self._maps)))
                self._maps[key] = mapping
            return mapping


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
