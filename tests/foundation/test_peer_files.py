"""hwplace/foundation/peer_files.py: a file another process holds, opened through /proc by pid, descriptor and
inode (a reused descriptor is not the file meant), and the read-only mappings a reader keeps of such files."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from hwplace.foundation.peer_files import KeptMappings, open_peer, still_held

PID = os.getpid()  # this process holds the files: /proc/<pid>/fd reaches them as it would another's


@pytest.fixture
def files() -> Iterator[list[tuple[int, int]]]:
    """Three memfds of 4 KiB, each (fd, inode), the first byte of each its index."""
    made = []
    for index in range(3):
        fd = os.memfd_create(f"peer-{index}")
        os.ftruncate(fd, 4096)
        os.pwrite(fd, bytes([index]), 0)
        made.append((fd, os.fstat(fd).st_ino))
    yield made
    for fd, inode in made:
        if still_held(PID, fd, inode):  # not one the test closed (its number may be another file's by now)
            os.close(fd)


def test_open_peer_opens_the_file_meant_and_nothing_else(files: list[tuple[int, int]]) -> None:
    (fd, inode), (_, other) = files[0], files[1]
    opened = open_peer(PID, fd, inode)
    assert opened is not None
    assert os.pread(opened, 1, 0) == b"\x00"
    os.close(opened)
    assert open_peer(PID, fd, other) is None  # that descriptor holds another file now
    assert still_held(PID, fd, inode)
    assert not still_held(PID, fd, other)
    os.close(fd)
    assert open_peer(PID, fd, inode) is None
    assert not still_held(PID, fd, inode)


def test_kept_mappings_keep_the_most_recently_used_and_drop_what_was_let_go(files: list[tuple[int, int]]) -> None:
    kept = KeptMappings(keep=2)
    keys = [(PID, fd, inode) for fd, inode in files]
    first = kept.get(keys[0], 4096)
    assert first is not None
    assert first[0] == 0
    assert kept.get(keys[0], 4096) is first  # kept: the same mapping
    assert kept.get(keys[0], 8192) is None  # shorter than asked for
    assert kept.get(keys[1], 1) is not None
    assert kept.get(keys[0], 1) is not None
    third = kept.get(keys[2], 1)  # the third: the least recently used one goes
    assert third is not None
    assert list(kept) == [keys[0], keys[2]]
    os.close(files[0][0])
    kept.prune()
    assert list(kept) == [keys[2]]
    assert kept.get(keys[0], 1) is None
    assert kept.get(keys[2], 1) is third  # still kept: the same mapping
    kept.clear()
    assert len(kept) == 0
