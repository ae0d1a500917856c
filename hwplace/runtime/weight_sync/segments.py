"""A weight sync's object store on the source's node: versions in shared-memory segments, mapped by reference.

The source process owns a few segments (memfd files on Linux, files in the temp dir elsewhere) and writes each
version into one of them, bucket after bucket: one copy per node, whatever the number of targets on it. A
target opens the segment (``/proc/<source pid>/fd/<fd>``) and maps it copy-on-write (``MAP_PRIVATE``) for each
caller: the version is read in place, without a copy, and a caller that writes into its tensors gets private
copies of the pages it writes, never changing the segment. A target's received buckets (from another node)
lie in a file of its own, mapped the same way (:func:`receiving`).

Lifetime is a file lock per segment. A target holds a shared lock on it for as long as any tensor of the
version it read is alive (a finalizer on the version's buffer lets go); the source rewrites a segment only
under an exclusive lock, which it can take only when no target holds the segment, and otherwise takes
another or makes a new one. A segment carries the version it holds, written last: a target that locks a
segment the source has since rewritten sees another version and skips it (a newer one is on its way). A
process that dies lets go of its locks, and a segment is freed when its source and every mapping are gone: a
target maps a segment while it holds a version in it, and keeps one read-only mapping of the last few segments it
checked (:meth:`SegmentReader.checking`), let go once the source lets the segment go. The source writes a bucket a
chunk at a time and hashes each chunk just after copying it, while it is in cache: one pass over memory for the
copy and the digest. The header says how far the version being written is in, chunk by chunk, and each write
has a serial number of the pool: one reader of the node can hash the version while it is written and post its
digests on the pool's board (:mod:`hwplace.runtime.weight_sync.node_check`). Imports the foundation and
:mod:`hwplace.runtime.weight_sync.buckets`; numpy on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import mmap
import os
import struct
import tempfile
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import WeightSyncError
from hwplace.foundation.peer_files import KeptMappings, open_peer, peer_path
from hwplace.runtime.weight_sync.buckets import DEFAULT_DIGEST, Hasher, aligned
from hwplace.runtime.weight_sync.pieces import ALGORITHM as TREE
from hwplace.runtime.weight_sync.pieces import CHUNK, copy_hashed, threads

HEADER = 64  # bytes before the first bucket: the stamp, then the write's progress
ALIGN = 64  # each bucket starts at a multiple of this
MAGIC = 0x68777073_79_6E_63  # "hwpsync"
STAMP = struct.Struct("<qqq")  # magic, version and the write's serial (0 and 0 while the source writes)
WORD = struct.Struct("<q")
WRITING, DONE = 24, 32  # header offsets: the serial of the write under way, the offset written up to so far
KEEP = 3  # a reader keeps its checking mappings of this many segments of a source (two take turns, mostly)


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
    serial: int = 0  # the pool's count of writes, this one's: a version written again gets another
    board: int = -1  # the source's descriptor of the pool's board (node_check), -1 where it has none


def offsets_of(lengths: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Each bucket's offset in a segment (after the header, aligned) and the bytes the segment needs."""
    offsets, end = aligned(lengths, ALIGN)
    return tuple(HEADER + offset for offset in offsets), HEADER + -(-end // ALIGN) * ALIGN


class _Segment:
    """One segment of the source: its file, its writable mapping and its capacity."""

    def __init__(self, capacity: int, name: str) -> None:
        self.capacity = capacity
        self.version = 0
        self.fd, self.path = _new_file(name)
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

    def close(self, empty: bool = False) -> None:
        """Let go of the segment; ``empty`` (only while it is locked exclusively: no target holds it) frees its
        memory at once, even where a target still keeps a mapping of it (:meth:`SegmentReader.checking`).
        Idempotent: a second call closes nothing (the descriptor's number may be another file's by then)."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        if empty:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        with contextlib.suppress(OSError, BufferError, AttributeError):
            self.map.close()
        with contextlib.suppress(OSError):
            os.close(fd)
        if self.path:  # pragma: no cover - not Linux
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class SegmentPool:
    """The source's segments for one weight sync; :meth:`write` puts a version in a segment no target holds."""

    def __init__(self, name: str, board: int = -1) -> None:
        self._name = f"hwplace-wsync-{name}"
        self._segments: list[_Segment] = []
        self._serial = 0
        self._board = board  # a descriptor SegmentRefs carry for targets to find the pool's board (node_check)

    def write(self, version: int, lengths: Sequence[int], buckets: Iterable[tuple[Any, str | None]],
              started: Callable[[SegmentRef], None] | None = None) -> tuple[SegmentRef, list[str]]:
        """Write ``version`` (``buckets``: each bucket and its digest, or None for the pool to work it out as it
        copies the bucket, ``lengths`` their sizes) into a free segment; returns where it lies and the digests.
        ``started`` is told where it will lie before the first byte is written (see :meth:`fill`)."""
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        digests: list[str] = []

        def copy(views: list[Any], done: Callable[[int, int], None]) -> None:
            for index, ((bucket, given), view) in enumerate(zip(buckets, views, strict=True)):
                flat = np.asarray(bucket, dtype=np.uint8).reshape(-1)
                if given is None:  # one pass: each chunk hashed right after it is copied, still in cache
                    given = _copy_hashed(view, flat, functools.partial(done, index))
                else:
                    view[:] = flat
                digests.append(given)
                done(index, len(flat))

        return self.fill(version, lengths, copy, started), digests

    def fill(self, version: int, lengths: Sequence[int],
             fill: Callable[[list[Any], Callable[[int, int], None]], None],
             started: Callable[[SegmentRef], None] | None = None) -> SegmentRef:
        """Put ``version`` into a free segment: ``fill`` writes each bucket (of ``lengths``) into the writable view
        it is given (a relay receives them straight into it), in order, calling ``done(i, n)`` once the first ``n``
        bytes of bucket ``i`` are in (the header says so, for a reader hashing it meanwhile); returns where the
        version lies, which ``started`` is told before the first byte is written. A ``fill`` that raises leaves
        the segment without a version."""
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        offsets, need = offsets_of(lengths)
        segment = self._claim(need)
        self._serial += 1
        ref = SegmentRef(os.getpid(), segment.fd, segment.path, segment.inode, version, offsets, tuple(lengths),
                         self._serial, self._board)
        try:
            STAMP.pack_into(segment.map, 0, MAGIC, 0, 0)
            segment.version = 0
            WORD.pack_into(segment.map, DONE, 0)  # before the serial it counts for: no reader pairs them wrongly
            WORD.pack_into(segment.map, WRITING, ref.serial)
            if started is not None:
                started(ref)
            view = np.frombuffer(segment.map, dtype=np.uint8)
            try:
                fill([view[offset : offset + length] for offset, length in zip(offsets, lengths, strict=True)],
                     lambda index, written: WORD.pack_into(segment.map, DONE, offsets[index] + written))
            finally:
                del view
            STAMP.pack_into(segment.map, 0, MAGIC, version, ref.serial)
            segment.version = version
        finally:
            fcntl.flock(segment.fd, fcntl.LOCK_UN)
        return ref

    def _claim(self, need: int) -> _Segment:
        """A segment of at least ``need`` bytes that no target holds, locked exclusively: the oldest free one,
        else a new one (free segments too small for it are let go)."""
        for segment in sorted(self._segments, key=lambda s: s.version):
            if try_lock(segment.fd, fcntl.LOCK_EX):
                if segment.capacity >= need:
                    return segment
                self._segments.remove(segment)
                segment.close(empty=True)
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
            segment.close()  # not emptied: the source's own views of it may live on
        self._segments.clear()


def _copy_hashed(into: Any, source: Any, written: Callable[[int], None]) -> str:
    """Copy ``source`` into ``into`` chunk by chunk, hashing each chunk just after it is copied (while it is still
    in cache): one pass over memory for both; ``written(n)`` after each, with the bytes in so far. Returns the
    digest: an ``xxh3t`` one piece by piece on :func:`~hwplace.runtime.weight_sync.pieces.threads` threads (the
    default digest), else a stream of ``CHUNK``-byte chunks."""
    if DEFAULT_DIGEST == TREE:
        return copy_hashed(into, source, written, threads())
    hasher = Hasher()
    for start in range(0, len(source), CHUNK):
        into[start : start + CHUNK] = source[start : start + CHUNK]
        hasher.update(into[start : start + CHUNK])
        written(min(start + CHUNK, len(source)))
    return hasher.hexdigest()


def _new_file(name: str) -> tuple[int, str]:
    """A new file of this process: a memfd (path ``""``), or a file in the temp dir where there is none."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name, os.MFD_CLOEXEC), ""
    return tempfile.mkstemp(prefix=f"{name}-")  # pragma: no cover - not Linux


def _close_file(fd: int, path: str) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    if path:  # pragma: no cover - not Linux
        with contextlib.suppress(OSError):
            os.unlink(path)


class HeldFile:
    """A version's buckets in a file this process holds open: a source's segment (under a shared lock) or the
    buckets a target received. Each :meth:`views` maps the file anew, copy-on-write (``MAP_PRIVATE``): the
    views are writable, and what is written stays in the caller's own pages, never in the file, the source or
    another caller's views. Each mapping keeps a duplicate of the descriptor, so the file (and its lock) stays
    as long as this object or any view of it lives, and no longer: nothing is kept mapped after that."""

    def __init__(self, fd: int, offsets: Sequence[int], lengths: Sequence[int], path: str = "") -> None:
        self.fd = fd
        self.offsets = tuple(offsets)
        self.lengths = tuple(lengths)
        self._closer = weakref.finalize(self, _close_file, fd, path)

    def views(self) -> list[Any]:
        """Each bucket as a writable uint8 array, copy-on-write over the file."""
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        array = np.frombuffer(mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY), dtype=np.uint8)
        return [array[offset : offset + length] for offset, length in zip(self.offsets, self.lengths, strict=True)]

    def close(self) -> None:
        self._closer()


def receiving(lengths: Sequence[int]) -> tuple[list[Any], HeldFile]:
    """A file of this process for buckets of ``lengths`` to be received into: writable views to fill (shared
    with the file), and the file, held (:class:`HeldFile`) once they are filled and dropped."""
    import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

    offsets, size = offsets_of(lengths)
    fd, path = _new_file("hwplace-wsync-received")
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    except OSError as exc:
        _close_file(fd, path)
        raise WeightSyncError(f"cannot hold a {size:,}-byte version of a weight sync in this process's memory "
                              f"({exc})") from None
    array = np.frombuffer(mapping, dtype=np.uint8)
    fill = [array[offset : offset + length] for offset, length in zip(offsets, lengths, strict=True)]
    return fill, HeldFile(fd, offsets, lengths, path)


class SegmentReader:
    """A target's side: opens the source's segments and holds the version it takes.

    Besides the views of the versions it holds, a reader keeps one read-only mapping of each of the last
    :data:`KEEP` segments it checked (:meth:`checking`): the source writes each version into one of a few segments
    it reuses, and a mapping kept populated lets the next version there be checked without a page fault per
    4 KiB page (7 ms per 100 MB here, twice the digest itself). Each :meth:`hold` lets go of those whose segment
    the source has let go or that ended with it, and :meth:`close` of all; a segment the source replaces by a
    larger one is emptied first (it is, when no target holds a version in it), so a kept mapping of it holds no
    memory even before then."""

    def __init__(self) -> None:
        self._kept = KeptMappings(KEEP)

    def hold(self, ref: SegmentRef) -> HeldFile | None:
        """The version ``ref`` names, held (a shared lock on its segment, for as long as the returned file or a
        view of it lives), or ``None`` when the segment has since been given to a newer version or let go."""
        self._kept.prune()
        try:
            fd = open_peer(ref.pid, ref.fd, ref.inode, path=ref.path)
        except OSError as exc:
            path = ref.path or peer_path(ref.pid, ref.fd)
            raise WeightSyncError(f"cannot open the source's shared-memory segment {path} ({exc}); the source "
                                  f"(process {ref.pid}) and this target must run as the same user on one node, "
                                  "with /proc readable") from None
        if fd is None:
            return None  # the source let the segment go (a newer version replaced it), or it is another file now
        try:
            if not try_lock(fd, fcntl.LOCK_SH):
                os.close(fd)
                return None  # the source is writing a newer version into it
            magic, version, serial = STAMP.unpack(os.pread(fd, STAMP.size, 0))
            if magic != MAGIC or version != ref.version or serial != ref.serial:
                os.close(fd)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return HeldFile(fd, ref.offsets, ref.lengths)

    def checking(self, ref: SegmentRef) -> list[Any] | None:
        """Read-only views of the buckets of version ``ref``, which the caller holds (:meth:`hold`), over the
        mapping this reader keeps of its segment (made, populated, on first use): for checking digests and
        copying out, without faulting the pages in again for each version. None when the segment cannot be
        mapped so (the caller checks its own views then)."""
        array = self.mapping(ref)
        if array is None:
            return None
        return [array[offset : offset + length] for offset, length in zip(ref.offsets, ref.lengths, strict=True)]

    def mapping(self, ref: SegmentRef) -> Any | None:
        """The whole of the read-only mapping this reader keeps of ``ref``'s segment (:meth:`checking`), header
        included, as a uint8 array, or None."""
        import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

        end = max((o + n for o, n in zip(ref.offsets, ref.lengths, strict=True)), default=0)
        kept = self._kept.get((ref.pid, ref.fd, ref.inode), end, ref.path)
        return None if kept is None else np.frombuffer(kept, dtype=np.uint8)

    def close(self) -> None:
        """Let go of every kept mapping."""
        self._kept.clear()

    def take(self, ref: SegmentRef) -> list[Any] | None:
        """The version's buckets (writable copy-on-write views of the segment, which hold it until they are all
        gone), or ``None`` as for :meth:`hold`."""
        held = self.hold(ref)
        return None if held is None else held.views()


def progress(mapping: Any) -> tuple[int, int]:
    """The serial of the write under way in a segment (or the last one) and the offset it is written up to: the
    serial read first, as the source sets the offset (back to 0) before it sets a new write's serial."""
    serial = WORD.unpack_from(mapping, WRITING)[0]
    return serial, WORD.unpack_from(mapping, DONE)[0]


def try_lock(fd: int, kind: int) -> bool:
    """Take the file lock ``kind`` (``fcntl.LOCK_SH`` or ``LOCK_EX``) on ``fd`` if no other holder is in the way."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
