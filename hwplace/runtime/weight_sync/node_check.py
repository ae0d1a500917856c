"""One check per node of a version in the node's shared memory: a target hashes it while the source writes it,
and posts the digests on the source's board for the node's other targets.

Every target checks a version's announced digests before it becomes visible (SPEC §9). On one node the targets
read the same bytes, one segment of the source (:mod:`hwplace.runtime.weight_sync.segments`), so one reading of
them serves all: the first target to claim the board (a file lock, let go when its process dies) hashes the
version as the segment's header says it is written, chunk after chunk, mostly while the bytes are still in the
shared cache, and posts the digests of that write (its serial) on the board. Each target then compares the
announced digests with the posted ones, under its shared lock on the segment, whose stamp says that write is what
it holds: equal, the version is checked; not posted, or different, the target hashes the version itself, as
without a board (so a corrupted version is a ``WeightSyncError`` wherever it was found). A target waits for a
claimed board to be posted only while its checker lives and for at most :data:`WAIT_POSTED` seconds. A
version no target checked while it was written (none was waiting, or a relay received it) is checked by the
first target to take it, for the node in the same way (:func:`check_for_node`).

The board is a small file of the source's (a memfd on Linux); a target opens it through ``/proc/<pid>/fd`` and
maps it shared. Its second half is the source's: once a version is written and noted, the source *seals* it there
(the write's serial and its digests), and a target its Writing note reached takes it from there
(:func:`wait_sealed`): no announcement follows on its link. A target checking or waiting beside the source's
write does so :func:`in_background` (``SCHED_BATCH``): its polls do not preempt the copy on a busy core. Imports
the foundation and the buckets and segments modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from hwplace.runtime.weight_sync.buckets import Hasher
from hwplace.runtime.weight_sync.pieces import CHUNK
from hwplace.runtime.weight_sync.segments import SegmentRef, progress, try_lock

BOARD_BYTES = 64 * 1024  # the board: two halves, each a header, then digests, one per line
POSTED, SEALED = 0, BOARD_BYTES // 2  # where the half a target posts its check in starts, and the source's
HEAD = struct.Struct("<qq")  # the serial whose digests are in a half (0: none, or being written), their text's length
POLL = 0.0002  # seconds between looks at a write's progress, or at a board being posted or sealed
WHILE_WRITTEN = 0.002  # seconds between looks for a seal while the write has more than NEAR bytes to go
NEAR = 32 * CHUNK  # 8 MiB: a write about a millisecond from its end
T = TypeVar("T")
WAIT_POSTED = 2.0  # the longest a target waits for a claimed board to be posted before it checks by itself


class Board:
    """A pool's board: the digests one target of the node worked out for a write, for the others to compare."""

    def __init__(self, fd: int, mapping: mmap.mmap) -> None:
        self.fd, self.map = fd, mapping
        self._claimed = False  # this process holds the board (a lock taken again on one description converts it)

    @classmethod
    def create(cls, name: str) -> Board | None:
        """The source's board (None where the system has no memfd: its targets each check by themselves)."""
        if not hasattr(os, "memfd_create"):  # pragma: no cover - not Linux
            return None
        fd = os.memfd_create(f"hwplace-wsync-{name}-board", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, BOARD_BYTES)
            return cls(fd, mmap.mmap(fd, BOARD_BYTES, flags=mmap.MAP_SHARED))
        except OSError:
            os.close(fd)
            return None

    @classmethod
    def open(cls, ref: SegmentRef) -> Board | None:
        """The board of the pool that wrote ``ref``, opened by a target (a description of its own, to lock), or
        None where it has none or it cannot be opened."""
        if ref.board < 0:
            return None
        try:
            fd = os.open(f"/proc/{ref.pid}/fd/{ref.board}", os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            return cls(fd, mmap.mmap(fd, BOARD_BYTES, flags=mmap.MAP_SHARED))
        except (OSError, ValueError):
            os.close(fd)
            return None

    def claim(self) -> bool:
        """Whether this process may check the write now (no other target does): an exclusive lock, until
        :meth:`let_go` or this process's end."""
        self._claimed = not self._claimed and try_lock(self.fd, fcntl.LOCK_EX)
        return self._claimed

    def let_go(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self._claimed = False

    def claimed(self) -> bool:
        """Whether another target holds the board now (it is checking a write)."""
        if self._claimed:
            return False
        if not try_lock(self.fd, fcntl.LOCK_SH):
            return True
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False

    def post(self, serial: int, digests: Sequence[str]) -> None:
        """Post the digests of write ``serial`` (those that do not fit are not posted: targets check by themselves)."""
        self._put(POSTED, serial, digests)

    def posted(self, serial: int) -> list[str] | None:
        """The digests posted for write ``serial``, or None."""
        return self._get(POSTED, serial)

    def seal(self, serial: int, digests: Sequence[str]) -> bool:
        """The source's: write ``serial`` is whole, noted, and has ``digests``; whether they fit (those that do not
        are not sealed: the targets are announced the version on their links)."""
        return self._put(SEALED, serial, digests)

    def sealed(self, serial: int) -> list[str] | None:
        """The digests the source sealed write ``serial`` with, or None."""
        return self._get(SEALED, serial)

    def _put(self, base: int, serial: int, digests: Sequence[str]) -> bool:
        text = "\n".join(digests).encode()
        HEAD.pack_into(self.map, base, 0, 0)  # no serial while the text changes
        if HEAD.size + len(text) > BOARD_BYTES // 2:
            return False
        self.map[base + HEAD.size : base + HEAD.size + len(text)] = text
        HEAD.pack_into(self.map, base, serial, len(text))
        return True

    def _get(self, base: int, serial: int) -> list[str] | None:
        found, length = HEAD.unpack_from(self.map, base)
        if found != serial or not serial:
            return None
        text = bytes(self.map[base + HEAD.size : base + HEAD.size + length])
        if HEAD.unpack_from(self.map, base) != (found, length):  # written again meanwhile
            return None
        return text.decode().split("\n") if text else []

    def close(self) -> None:
        """Idempotent: a second call closes nothing (the descriptor's number may be another file's by then)."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        with contextlib.suppress(OSError, BufferError):
            self.map.close()
        with contextlib.suppress(OSError):
            os.close(fd)


def check_while_written(board: Board, ref: SegmentRef, mapping: Any, going: Callable[[], bool]) -> bool:
    """Claim ``board`` and hash write ``ref`` in ``mapping`` (a read-only mapping of its whole segment) as the
    segment's header says it is written, then post the digests; False when another target claimed it first, or the
    write was given up (another began in the segment, or ``going()`` turned False while none was written)."""
    if not board.claim():
        return False
    try:
        with in_background():
            digests = _hash_while_written(ref, mapping, going)
        if digests is not None:
            board.post(ref.serial, digests)
        return digests is not None
    finally:
        board.let_go()


def check_for_node(board: Board, serial: int, digests: Sequence[str], check: Callable[[], T]) -> T:
    """Run ``check`` (a full check of write ``serial`` against ``digests``, raising when it fails) holding
    ``board`` when no other target does, and post the digests it found: the node's other targets then compare
    and take the version without reading it again. Without the board (another target holds it, for another
    write) the check runs all the same, and nothing is posted."""
    claimed = board.claim()
    try:
        version = check()
        if claimed:
            board.post(serial, digests)
        return version
    finally:
        if claimed:
            board.let_go()


def _hash_while_written(ref: SegmentRef, mapping: Any, going: Callable[[], bool]) -> list[str] | None:
    digests = []
    for offset, length in zip(ref.offsets, ref.lengths, strict=True):
        hasher, start = Hasher(), 0
        while start < length:
            serial, done = progress(mapping)
            if serial != ref.serial:
                return None
            upto = min(done - offset, length)
            if upto <= start:
                if not going():
                    return None
                time.sleep(POLL)
                continue
            while start < upto:
                end = min(upto, start + 16 * CHUNK)
                hasher.update(mapping[offset + start : offset + end])
                start = end
        digests.append(hasher.hexdigest())
    return digests if progress(mapping)[0] == ref.serial else None  # not begun again while it was hashed


def wait_posted(board: Board, serial: int) -> list[str] | None:
    """The digests posted for write ``serial``, waiting while another target claims the board (at most
    :data:`WAIT_POSTED` seconds); None when none are."""
    deadline = time.monotonic() + WAIT_POSTED
    while True:
        found = board.posted(serial)
        if found is not None or not board.claimed() or time.monotonic() > deadline:
            return found if found is not None else board.posted(serial)
        time.sleep(POLL)


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Meanwhile the calling thread runs under Linux's ``SCHED_BATCH`` (where it ran under the default policy):
    waking from a poll, it does not preempt what runs on a busy core (the source's copy beside a checking or waiting
    target), yet keeps its share of the CPU as before (the same weight). Unprivileged; elsewhere nothing changes."""
    batch = getattr(os, "SCHED_BATCH", None)
    switched = batch is not None and _policy() == os.SCHED_OTHER and _set_policy(batch)
    try:
        yield
    finally:
        if switched:
            _set_policy(os.SCHED_OTHER)


def _policy() -> int | None:
    try:
        return os.sched_getscheduler(0)
    except OSError:
        return None


def _set_policy(policy: int) -> bool:
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:  # a seccomp profile may refuse it: the thread goes on as it was
        return False
    return True


def wait_sealed(board: Board, ref: SegmentRef, mapping: Any, going: Callable[[], bool]) -> list[str] | None:
    """The digests the source sealed write ``ref`` with (:meth:`Board.seal`), waiting while ``going()``; None when
    it stops first, or the segment's header (``mapping``) names another write. Looks every :data:`POLL` s once the
    header says the write is within :data:`NEAR` bytes of its end, less often before."""
    end = max((o + n for o, n in zip(ref.offsets, ref.lengths, strict=True)), default=0)
    with in_background():
        while True:
            found = board.sealed(ref.serial)
            serial, done = progress(mapping)
            if found is not None or serial != ref.serial or not going():
                return found
            time.sleep(POLL if end - done <= NEAR else WHILE_WRITTEN)
