"""The source node's object store of a weight sync: segments written once per version, read in place by
reference, recycled only when no reader holds them (file locks, released by a reader's process exiting too)."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import replace
from typing import Any

import pytest

import hwplace
from hwplace.runtime.buckets import digest
from hwplace.runtime.segments import ALIGN, HEADER, SegmentPool, SegmentReader, SegmentRef, offsets_of

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


def test_a_version_is_read_in_place_and_read_only(pool: SegmentPool) -> None:
    ref = write(pool, 1)
    got = SegmentReader().take(ref)
    assert got is not None
    assert [b.tobytes() for b in got] == [b.tobytes() for b, _ in buckets(1)]
    assert not got[0].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        got[0][0] = 1


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
    assert len(reader._maps) == 1  # versions 1 and 3 lie in one segment, mapped once


def test_a_segment_given_to_a_newer_version_is_skipped(pool: SegmentPool) -> None:
    old = write(pool, 1)
    write(pool, 2)  # nobody held version 1: its segment now holds version 2
    assert pool.count == 1
    assert SegmentReader().take(old) is None


def test_a_segment_that_is_gone_is_skipped_and_an_unreadable_one_is_an_error(pool: SegmentPool) -> None:
    ref = write(pool, 1)
    pool.close()
    assert SegmentReader().take(ref) is None
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
