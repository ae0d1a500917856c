"""The lock and stamp of one device bucket (a *slot*): what keeps a source from rewriting or freeing a bucket while a
target copies from it, and tells a target whether the bucket still holds the version it was told of.

Each bucket of a :class:`~hwplace.runtime.weight_sync.device_ring.RingWriter` has a small file of its own (a memfd
on Linux, a file in the temp dir elsewhere) holding a stamp: a magic number, the bucket's generation (its
allocation) and the version it holds (0 while it is written). The source rewrites or frees a bucket only under an
exclusive ``flock`` of that file, waiting for a target still copying from it; a target copies only under a
shared lock, taken without waiting, and only when the stamp names the version it wants. So a copy is never torn
and a freed bucket is never read; a target that finds the bucket being written or rewritten skips that version,
as a newer one is on its way. A process that dies lets go of its locks. Imports nothing of hwplace but the
foundation.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import tempfile
from collections.abc import Iterator

from hwplace.foundation.errors import WeightSyncError

MAGIC = 0x68777073_6C_6F_74  # "hwpslot"
STAMP = struct.Struct("<qqq")  # magic, generation, version
LockRef = tuple[int, int, int, str]  # the source's pid, the file's descriptor there, its inode, its path ("": memfd)


class SlotLock:
    """The source's end: the file, its stamp and its exclusive lock."""

    def __init__(self, name: str) -> None:
        if hasattr(os, "memfd_create"):
            self.fd, self.path = os.memfd_create(name, os.MFD_CLOEXEC), ""
        else:  # pragma: no cover - not Linux
            self.fd, self.path = tempfile.mkstemp(prefix=f"{name}-")
        os.pwrite(self.fd, STAMP.pack(MAGIC, 0, 0), 0)
        self.ref: LockRef = (os.getpid(), self.fd, os.fstat(self.fd).st_ino, self.path)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the slot against every reader (waiting for one that is copying from it); its stamp says that
        it holds no version until :meth:`stamp` says which."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            os.pwrite(self.fd, STAMP.pack(MAGIC, 0, 0), 0)
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def stamp(self, generation: int, version: int) -> None:
        """Say that the slot's allocation ``generation`` holds ``version`` (under :meth:`exclusive`)."""
        os.pwrite(self.fd, STAMP.pack(MAGIC, generation, version), 0)

    def close(self) -> None:
        """Idempotent: a second call closes nothing (the descriptor's number may be another file's by then)."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        with contextlib.suppress(OSError):
            os.close(fd)
        if self.path:  # pragma: no cover - not Linux
            with contextlib.suppress(OSError):
                os.unlink(self.path)


@contextlib.contextmanager
def reading(ref: LockRef, generation: int, version: int) -> Iterator[str]:
    """Hold the slot whose lock is ``ref`` against its writer while the block runs, when it
    holds ``version`` in allocation ``generation``: yields ``""`` then, else why not (and holds nothing)."""
    pid, fd_there, inode, path = ref
    try:
        fd = os.open(path or f"/proc/{pid}/fd/{fd_there}", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        yield f"generation {generation} cannot be opened (its lock is gone); the source freed it or ended"
        return
    except OSError as exc:
        raise WeightSyncError(f"cannot open the lock of the source's device bucket ({exc}); the source (process "
                              f"{pid}) and this target must run as the same user on one node, with /proc "
                              "readable") from None
    try:
        if os.fstat(fd).st_ino != inode:
            yield f"generation {generation} cannot be opened (its lock is gone); the source freed it or ended"
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            yield "is being written: read a newer version"
            return
        magic, held_generation, held_version = STAMP.unpack(os.pread(fd, STAMP.size, 0))
        if magic != MAGIC or (held_generation, held_version) != (generation, version):
            yield (f"was overwritten (it holds version {held_version} of generation {held_generation} now); read "
                   "a newer version")
            return
        yield ""
    finally:
        os.close(fd)  # lets go of the shared lock
