"""The source node's object store of a weight sync: segments written once per version, read in place by
reference, recycled only when no reader holds them (file locks, released by a reader's process exiting too)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import multiprocessing
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from descriptors import closes_once

import hwplace
from hwplace.runtime.weight_sync.buckets import digest
from hwplace.runtime.weight_sync.segments import (
    ALIGN,
    HEADER,
    HeldFile,
    SegmentPool,
    SegmentReader,
    SegmentRef,
    _Segment,
    offsets_of,
)

np = pytest.importorskip("numpy")


def buckets(version: int, sizes: tuple[int, ...] = (1000, 3, 70_000)) -> list[tuple[Any, str]]:
    out = []
    for index, size in enumerate(sizes):
        bucket = np.full(size, (version * 7 + index) % 251, dtype=np.uint8)
        out.append((bucket, digest(bucket)))
    return out


def write(pool: SegmentPool, version: int, sizes: tuple[int, ...] = (1000, 3, 70_000)) -> SegmentRef:
    ref, digests = pool.write(version, sizes, buckets(version, sizes))
    assert digests == [d for _, d in buckets(version, sizes)]
    return ref


@pytest.fixture
def pool():
    made = SegmentPool(f"test-{os.getpid()}")
    yield made
    made.close()


def test_buckets_start_aligned_after_the_header() -> None:
    offsets = (HEADER, HEADER + 1024, HEADER + 1024 + ALIGN)
    assert offsets_of([1000, 3, 70_000]) == (offsets, HEADER + 1024 + 64 + 70_016)
    assert offsets_of([]) == ((), HEADER)
    assert offsets_of([0, 5]) == ((HEADER, HEADER), HEADER + ALIGN)


def test_a_version_is_read_in_place_and_written_copy_on_write(pool: SegmentPool) -> None:
    ref = write(pool, 1)
    reader = SegmentReader()
    got = reader.take(ref)
    assert got is not None
    assert [b.tobytes() for b in got] == [b.tobytes() for b, _ in buckets(1)]
    assert got[0].flags.writeable
    got[0][:] = 99  # the caller's own pages: neither the segment nor another reader sees it
    again = reader.take(ref)
    assert again is not None
    assert again[0].tobytes() == buckets(1)[0][0].tobytes()
    assert pool.views(ref)[0].tobytes() == buckets(1)[0][0].tobytes()
    assert set(got[0].tolist()) == {99}


def test_a_segment_is_recycled_only_when_no_reader_holds_it(pool: SegmentPool) -> None:
    reader = SegmentReader()
    first = write(pool, 1)
    held = reader.take(first)
    assert held is not None
    second = write(pool, 2)  # version 1's segment is held: a second one
    assert pool.count == 2
    assert second.inode != first.inode
    assert [b.tobytes() for b in held] == [b.tobytes() for b, _ in buckets(1)]  # untouched
    del held
    third = write(pool, 3)  # version 1's segment is free again
    assert pool.count == 2
    assert third.inode == first.inode
    kept = reader.take(third)
    assert kept is not None
    assert kept[2][0] == buckets(3)[2][0][0]


def test_a_segment_given_to_a_newer_version_is_skipped(pool: SegmentPool) -> None:
    old = write(pool, 1)
    write(pool, 2)  # nobody held version 1: its segment now holds version 2
    assert pool.count == 1
    assert SegmentReader().take(old) is None


def test_a_segment_that_is_gone_is_skipped_and_an_unreadable_one_is_an_error(pool: SegmentPool) -> None:
    ref = write(pool, 1)
    pool.close()
    assert SegmentReader().take(ref) is None
    assert SegmentReader().mapping(ref) is None  # nor is a mapping of it kept to check on
    assert SegmentReader().take(replace(ref, path="/nonexistent-hwplace/segment")) is None
    with pytest.raises(hwplace.WeightSyncError, match=r"cannot open the source's shared-memory segment /etc/hostn"):
        SegmentReader().take(replace(ref, path="/etc/hostname/x"))


def test_a_free_segment_too_small_is_replaced(pool: SegmentPool) -> None:
    small = write(pool, 1, (10,))
    big = write(pool, 2, (200_000,))
    assert pool.count == 1
    assert big.inode != small.inode
    got = SegmentReader().take(big)
    assert got is not None
    assert got[0].nbytes == 200_000


def _hold(ref: SegmentRef, ready: Any, done: Any) -> None:
    held = SegmentReader().take(ref)
    ready.put(None if held is None else held[0].tobytes()[:4])
    done.get()  # holds the version until told, then exits holding it: the lock goes with the process


def test_a_reader_in_another_process_holds_the_segment_until_it_exits(pool: SegmentPool) -> None:
    context = multiprocessing.get_context("spawn")
    ref = write(pool, 5)
    ready, done = context.Queue(), context.Queue()
    child = context.Process(target=_hold, args=(ref, ready, done))
    child.start()
    try:
        assert ready.get(timeout=120) == bytes([(5 * 7) % 251] * 4)
        write(pool, 6)
        assert pool.count == 2  # the child's version stays put
        done.put(None)
        child.join(timeout=120)
        assert child.exitcode == 0
        write(pool, 7)
        write(pool, 8)
        assert pool.count == 2  # its segment came back once it exited
    finally:
        if child.is_alive():
            child.kill()


def segment_fds() -> set[int]:
    """This process's open descriptors of weight-sync segments."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if "hwplace-wsync" in os.readlink(f"/proc/self/fd/{name}"):
                fds.add(int(name))
    return fds


def failing(version: int, sizes: tuple[int, ...], after: int) -> Iterator[tuple[Any, str]]:
    """A version's buckets that stop with an error after ``after`` of them."""
    yield from buckets(version, sizes)[:after]
    raise RuntimeError("the source stopped mid-write")


def test_a_write_that_fails_midway_leaves_no_version_to_read(pool: SegmentPool) -> None:
    sizes = (1000, 3, 70_000)
    first = write(pool, 1)
    with pytest.raises(RuntimeError, match="the source stopped mid-write"):
        pool.write(2, sizes, failing(2, sizes, after=1))
    assert pool.count == 1  # version 1's segment was free: the failed write went into it
    assert SegmentReader().take(first) is None  # partly overwritten: it holds no version any more
    third = write(pool, 3)  # the failed write let go of its lock
    assert pool.count == 1
    got = SegmentReader().take(third)
    assert got is not None
    assert [b.tobytes() for b in got] == [b.tobytes() for b, _ in buckets(3)]


def test_a_segment_left_without_a_version_is_the_first_one_taken_again(pool: SegmentPool) -> None:
    sizes = (1000, 3, 70_000)
    reader = SegmentReader()
    first = write(pool, 1)
    held = reader.take(first)
    with pytest.raises(RuntimeError, match="the source stopped mid-write"):
        pool.write(2, sizes, failing(2, sizes, after=2))  # version 1 is held: into a second segment
    assert pool.count == 2
    del held
    third = write(pool, 3)  # both are free: the one without a version goes first
    assert pool.count == 2
    assert third.inode != first.inode
    assert reader.take(first) is not None  # version 1 is still there


def test_buckets_and_lengths_that_disagree_are_refused(pool: SegmentPool) -> None:
    with pytest.raises(ValueError, match=r"zip\(\) argument 2 is longer than argument 1"):
        pool.write(1, (10, 20), buckets(1, (10,)))
    ref = write(pool, 2)  # the pool is none the worse for it
    got = SegmentReader().take(ref)
    assert got is not None
    assert [b.tobytes() for b in got] == [b.tobytes() for b, _ in buckets(2)]


def test_a_bucket_of_any_shape_is_written_as_its_bytes(pool: SegmentPool) -> None:
    grid = np.arange(600, dtype=np.uint16).astype(np.uint8).reshape(3, 200)
    ref, digests = pool.write(1, (600,), [(grid, "d")])
    assert digests == ["d"]
    got = SegmentReader().take(ref)
    assert got is not None
    assert got[0].tobytes() == grid.tobytes()


def test_the_source_sees_each_version_in_its_own_segment(pool: SegmentPool) -> None:
    first = write(pool, 1)
    held = SegmentReader().take(first)
    second = write(pool, 2, (5, 64))  # version 1 is held: another segment
    assert pool.count == 2
    for ref, version, sizes in ((first, 1, (1000, 3, 70_000)), (second, 2, (5, 64))):
        views = pool.views(ref)
        assert [v.dtype for v in views] == [np.uint8] * len(sizes)
        assert [v.tobytes() for v in views] == [b.tobytes() for b, _ in buckets(version, sizes)]
    assert held is not None


def test_closing_the_pool_while_views_of_it_are_alive_is_quiet(pool: SegmentPool) -> None:
    views = pool.views(write(pool, 1))
    pool.close()  # its mapping cannot close under the views; its descriptor does
    assert pool.count == 0
    assert [v.tobytes() for v in views] == [b.tobytes() for b, _ in buckets(1)]


def test_a_segment_that_cannot_be_made_is_a_weight_sync_error_and_leaves_nothing_open(
        pool: SegmentPool, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    before = segment_fds()
    monkeypatch.setattr(os, "ftruncate", no_space)
    with pytest.raises(hwplace.WeightSyncError, match=re.escape(
            "cannot make a 1,088-byte shared-memory segment for a weight sync ([Errno 28] No space left on "
            "device); the source's node needs that much free memory")):
        pool.write(1, (1000,), buckets(1, (1000,)))
    assert pool.count == 0
    assert segment_fds() == before


def test_descriptors_are_not_inherited_by_programs_the_processes_start(pool: SegmentPool) -> None:
    ref = write(pool, 1)
    assert (ref.pid, ref.path) == (os.getpid(), "")  # a memfd, opened through /proc
    assert not os.get_inheritable(ref.fd)
    before = segment_fds()
    reader = SegmentReader()
    got = reader.take(ref)
    assert got is not None
    opened = segment_fds() - before
    assert len(opened) == 1  # the mapping's own, which holds the lock while the version is in use
    assert not any(os.get_inheritable(fd) for fd in opened)
    del got
    assert segment_fds() == before  # nothing is kept for the segment's next version


def test_a_segment_being_written_or_replaced_is_skipped_and_leaves_nothing_open(pool: SegmentPool) -> None:
    ref = write(pool, 1)
    reader = SegmentReader()
    before = segment_fds()
    fcntl.flock(ref.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the source does while it writes a newer version
    try:
        assert reader.take(ref) is None
    finally:
        fcntl.flock(ref.fd, fcntl.LOCK_UN)
    assert reader.take(replace(ref, inode=ref.inode + 1)) is None  # another file behind the descriptor now
    assert segment_fds() == before
    got = reader.take(ref)
    assert got is not None
    assert [b.tobytes() for b in got] == [b.tobytes() for b, _ in buckets(1)]


def test_a_mapping_that_fails_leaves_no_descriptor_and_no_lock(pool: SegmentPool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ref = write(pool, 1)
    reader = SegmentReader()
    before = segment_fds()

    def denied(self: HeldFile) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(HeldFile, "views", denied)
    with pytest.raises(PermissionError, match="Permission denied"):
        reader.take(ref)
    assert segment_fds() == before
    write(pool, 2)
    assert pool.count == 1  # no lock was left behind on version 1's segment


def test_an_unreadable_segment_names_the_source_process_and_what_it_needs(pool: SegmentPool) -> None:
    ref = replace(write(pool, 1), path="/etc/hostname/x")
    with pytest.raises(hwplace.WeightSyncError, match=(
            rf"^cannot open the source's shared-memory segment /etc/hostname/x \(.*\); the source \(process "
            rf"{ref.pid}\) and this target must run as the same user on one node, with /proc readable$")):
        SegmentReader().take(ref)


def mapped_inodes() -> set[int]:
    """The inodes of the weight-sync files this process maps."""
    with open("/proc/self/maps") as maps:
        return {int(line.split()[4]) for line in maps if "hwplace-wsync" in line}


def test_a_reader_maps_no_segment_the_source_let_go(pool: SegmentPool) -> None:
    reader = SegmentReader()
    held = None
    for version, size in enumerate((10, 2_000, 100_000, 3_000_000), start=1):
        held = reader.take(write(pool, version, (size,)))  # each larger: the free one before is let go
        assert held is not None
        assert held[0].tobytes() == buckets(version, (size,))[0][0].tobytes()
    live = {segment.inode for segment in pool._segments}
    assert mapped_inodes() <= live
    del held
    assert pool.count <= 2
    assert mapped_inodes() <= {segment.inode for segment in pool._segments}
    pool.close()
    assert not mapped_inodes()  # the source's own mappings went with it, and the reader holds none


def test_the_pool_works_out_digests_as_it_copies_when_none_are_given(pool: SegmentPool) -> None:
    sizes = (1000, 3, 3_000_000)  # the last one in several chunks
    ref, digests = pool.write(1, sizes, [(bucket, None) for bucket, _ in buckets(1, sizes)])
    assert digests == [d for _, d in buckets(1, sizes)]
    got = SegmentReader().take(ref)
    assert got is not None
    assert [b.tobytes() for b in got] == [b.tobytes() for b, _ in buckets(1, sizes)]


def test_a_reader_checks_on_one_kept_mapping_per_segment_and_lets_go_of_those_the_source_let_go(
        pool: SegmentPool) -> None:
    reader = SegmentReader()
    kept: list[Any] = []
    for version in range(1, 7):  # version v-1 is held while v is written: two segments take turns
        ref = write(pool, version)
        held = reader.hold(ref)
        assert held is not None
        views = reader.checking(ref)
        assert views is not None
        assert [v.tobytes() for v in views] == [b.tobytes() for b, _ in buckets(version)]
        assert not views[0].flags.writeable  # read-only: callers get copy-on-write views of their own
        kept = [held]
    assert pool.count == 2
    assert len(reader._kept) == 2  # one mapping per segment, made once
    live = {segment.inode for segment in pool._segments}
    del kept
    held = reader.hold(write(pool, 7, (5_000_000,)))  # larger: a new segment, the free too-small one let go
    assert held is not None
    assert mapped_inodes() <= {segment.inode for segment in pool._segments} | live
    assert {inode for _, _, inode in reader._kept} <= {segment.inode for segment in pool._segments}
    gone = live - {segment.inode for segment in pool._segments}
    assert gone  # the one replaced was emptied before it was let go: what still maps it holds no memory
    del held
    reader.close()
    assert not reader._kept


def test_closing_a_segment_twice_leaves_a_file_given_its_number_meanwhile_open() -> None:
    segment = _Segment(4096, "test-close-twice")
    closes_once(segment.fd, lambda: segment.close(empty=True))


def test_a_free_segment_too_small_is_emptied_as_it_is_let_go(pool: SegmentPool) -> None:
    small = write(pool, 1, (100_000,))
    kept = os.open(f"/proc/self/fd/{small.fd}", os.O_RDONLY)  # what a target's kept mapping of it holds on to
    try:
        big = write(pool, 2, (200_000,))  # larger: a new segment, the free too-small one let go
        assert big.inode != small.inode
        assert os.fstat(kept).st_size == 0  # what still maps it holds no memory
    finally:
        os.close(kept)


def test_a_reader_holds_only_the_very_write_its_reference_names(pool: SegmentPool) -> None:
    first = write(pool, 1)
    again = write(pool, 1)  # the same version written again, into the one free segment: another write
    assert (again.fd, again.inode, again.version) == (first.fd, first.inode, first.version)
    assert again.serial != first.serial
    reader = SegmentReader()
    try:
        assert reader.hold(first) is None  # its digests were those of another write
        held = reader.hold(again)
        assert held is not None
        held.close()
        stamp = os.open(f"/proc/self/fd/{again.fd}", os.O_RDWR)
        try:
            os.pwrite(stamp, bytes(8), 0)  # the stamp's magic: no longer hwplace's
            assert reader.hold(again) is None
        finally:
            os.close(stamp)
    finally:
        reader.close()
