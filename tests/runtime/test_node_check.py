"""One check per node of a same-node version (without Ray): a target claims the source's board, hashes the write as
the segment's header says it is in and posts the digests; every target of the node takes the version without
reading it again when the posted digests of that very write are the announced ones, and checks it in full
otherwise, so a corrupted version is still a ``WeightSyncError``."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from descriptors import closes_once

import hwplace
from hwplace.runtime.weight_sync import buckets as buckets_module
from hwplace.runtime.weight_sync import node_check, segments, transports
from hwplace.runtime.weight_sync.announcements import Announcement, Writing
from hwplace.runtime.weight_sync.buckets import check, digest, pack, sizes
from hwplace.runtime.weight_sync.node_check import BOARD_BYTES, Board, check_while_written, wait_posted, wait_sealed
from hwplace.runtime.weight_sync.pieces import PIECE
from hwplace.runtime.weight_sync.segments import WORD, WRITING, SegmentPool, SegmentReader, SegmentRef
from hwplace.runtime.weight_sync.transports import SameNode

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

SIZES = (1000, 3, 3 * PIECE + 5)  # the last bucket: pieces a writer or checker with threads takes at once


def buckets(version: int) -> list[Any]:
    return [np.full(size, (version * 7 + index) % 251, dtype=np.uint8) for index, size in enumerate(SIZES)]


@pytest.fixture
def board() -> Iterator[Board]:
    made = Board.create(f"test-{os.getpid()}")
    assert made is not None
    yield made
    made.close()


@pytest.fixture
def pool(board: Board) -> Iterator[SegmentPool]:
    made = SegmentPool(f"test-node-check-{os.getpid()}", board.fd)
    yield made
    made.close()


def opened(ref: SegmentRef) -> Board:
    found = Board.open(ref)
    assert found is not None
    return found


@pytest.mark.time_limit(120)  # a checker the header never told of the bytes written would wait for ever
@pytest.mark.parametrize("threads", [1, 3])  # as on a node of 2 or 3 cores, and as on one of 6 or 7
def test_a_checker_hashes_each_chunk_once_the_header_says_it_is_written_and_posts_the_digests(
        pool: SegmentPool, monkeypatch: Any, threads: int) -> None:
    monkeypatch.setattr(node_check, "WAIT_POSTED", 600.0)  # however loaded the machine: the waiter sees the post
    for module in (segments, buckets_module):  # the writer's copy-and-hash, and the checker's hasher
        monkeypatch.setattr(module, "threads", lambda: threads)
    reader, results = SegmentReader(), []
    boards: list[Board] = []

    def paced() -> Iterator[tuple[Any, None]]:
        for index, bucket in enumerate(buckets(1)):
            if index == 2:  # the last bucket is written only once the checker holds the board
                for _ in range(60_000):
                    if boards[1].claimed():
                        break
                    threading.Event().wait(0.001)
                assert boards[1].claimed()
            yield bucket, None

    def started(ref: SegmentRef) -> None:
        boards.extend([opened(ref), opened(ref)])  # the checker's, and another target's
        threading.Thread(target=lambda: results.append(
            check_while_written(boards[0], ref, reader.mapping(ref), lambda: True)), daemon=True).start()

    ref, digests = pool.write(1, SIZES, paced(), started)
    assert wait_posted(boards[1], ref.serial) == digests  # waits while the checker holds the board
    assert digests == [digest(b) for b in buckets(1)]
    for _ in range(60_000):  # the checker lets go of the board after posting: its board is closed only then
        if results:
            break
        threading.Event().wait(0.001)
    for board in boards:
        board.close()
    assert results == [True]


def stopped_write(pool: SegmentPool) -> SegmentRef:
    """Where version 2 lies after its source stopped once its first bucket was in."""
    refs: list[SegmentRef] = []

    def failing() -> Iterator[tuple[Any, None]]:
        yield buckets(2)[0], None
        raise RuntimeError("the source stopped mid-write")

    with pytest.raises(RuntimeError, match="mid-write"):
        pool.write(2, SIZES, failing(), refs.append)
    return refs[0]


def test_a_checker_gives_up_a_write_that_stopped_and_posts_nothing(pool: SegmentPool) -> None:
    ref = stopped_write(pool)
    board = opened(ref)
    assert not check_while_written(board, ref, SegmentReader().mapping(ref), lambda: False)
    assert board.posted(ref.serial) is None
    board.close()


def test_a_checker_gives_up_a_segment_given_to_another_write(pool: SegmentPool) -> None:
    refs: list[SegmentRef] = []
    pool.write(1, SIZES, [(b, None) for b in buckets(1)], refs.append)
    mapping = SegmentReader().mapping(refs[0])
    second, _ = pool.write(2, SIZES, [(b, None) for b in buckets(2)])  # version 1's segment was free: reused
    assert (second.fd, second.inode) == (refs[0].fd, refs[0].inode)
    board = opened(refs[0])
    assert not check_while_written(board, refs[0], mapping, lambda: True)
    assert board.posted(refs[0].serial) is None
    board.close()


def test_one_target_at_a_time_claims_the_board_and_a_dead_one_lets_go(pool: SegmentPool) -> None:
    ref, _ = pool.write(1, SIZES, [(b, None) for b in buckets(1)])
    first, second = opened(ref), opened(ref)
    assert first.claim()
    assert not first.claimed()  # by this very board: no other target's claim
    assert not first.claim()  # not twice
    assert not second.claim()
    assert second.claimed()
    first.let_go()
    assert not second.claimed()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a target process that claims the board and is killed while it holds it
        mine = Board.open(ref)
        os.write(write, b"1" if mine is not None and mine.claim() else b"0")
        signal.pause()
        os._exit(0)
    try:
        assert os.read(read, 1) == b"1"
        assert second.claimed()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert not second.claimed()
    first.close()
    second.close()


def test_a_claimed_board_never_posted_is_waited_for_only_so_long(pool: SegmentPool, monkeypatch: Any) -> None:
    monkeypatch.setattr(node_check, "WAIT_POSTED", 0.2)
    ref, _ = pool.write(1, SIZES, [(b, None) for b in buckets(1)])
    holder, waiter = opened(ref), opened(ref)
    assert holder.claim()
    assert wait_posted(waiter, ref.serial) is None  # the target then checks by itself
    holder.close()
    waiter.close()


def laid_down(source: SameNode, version: int, state: dict[str, Any],
              corrupt: bool = False) -> tuple[Announcement, Announcement]:
    """Version ``version`` of ``state`` in ``source``'s segment: its Writing note and its announcement."""
    entries, packed = pack(state, 1 << 20)
    warned: list[Announcement] = []
    note, _ = source.lay_down(version, entries, sizes(entries), packed, True, False, warned.append)
    if corrupt:  # after its digests were taken: what a bug writing into the segment would do
        assert isinstance(note.where, SegmentRef)
        assert source.segments is not None
        source.segments.views(note.where)[0][3] ^= 0xFF
    return warned[0], note


def state(version: int) -> dict[str, Any]:
    """A state dict just large enough to go with a Writing note."""
    return {"a": torch.full((transports.EARLY_BYTES // 4,), float(version)), "b": torch.full((300,), float(-version))}


@pytest.fixture
def checks(monkeypatch: Any) -> list[int]:
    """Each full check a target makes by itself."""
    made: list[int] = []

    def counted(*args: Any) -> None:
        made.append(1)
        check(*args)

    monkeypatch.setattr(transports, "check", counted)
    return made


def test_a_smaller_version_goes_without_a_writing_note() -> None:
    source = SameNode(f"early-{os.getpid()}")
    try:
        entries, packed = pack({"a": torch.ones(transports.EARLY_BYTES // 4 - 1)}, 1 << 20)
        warned: list[Announcement] = []
        note, _ = source.lay_down(1, entries, sizes(entries), packed, True, False, warned.append)
        assert isinstance(note.where, SegmentRef)
        assert not warned
    finally:
        source.close()


def test_a_version_one_target_checked_is_taken_by_every_target_of_the_node_without_reading_it_again(
        checks: list[int]) -> None:
    source, first, second = SameNode(f"early-{os.getpid()}"), SameNode("first"), SameNode("second")
    try:
        writing, note = laid_down(source, 1, state(1))
        assert isinstance(writing.where, Writing)
        assert writing.where.segment == note.where
        assert first.early(writing, lambda: False)
        for target in (second, first):
            got = target.take(note)
            assert got is not None
            assert got.weights().tensors["b"][-1] == -1.0
        assert not checks
        writing, note = laid_down(source, 2, state(2))
        got = second.take(note)  # nobody checked this write early: the target checks it by itself
        assert got is not None
        assert checks == [1]
    finally:
        for end in (source, first, second):
            end.close()


def test_a_version_corrupted_before_the_node_check_is_refused_by_every_target(checks: list[int]) -> None:
    source, first, second = SameNode(f"early-{os.getpid()}"), SameNode("first"), SameNode("second")
    try:
        writing, note = laid_down(source, 1, state(1), corrupt=True)
        assert first.early(writing, lambda: False)  # hashed after the corruption: not the announced digests
        for target in (first, second):
            with pytest.raises(hwplace.WeightSyncError, match="does not match its digest"):
                target.take(note)
        assert checks == [1, 1]
    finally:
        for end in (source, first, second):
            end.close()


def test_digests_posted_for_another_write_stand_for_nothing(checks: list[int]) -> None:
    source, target = SameNode(f"early-{os.getpid()}"), SameNode("target")
    try:
        _, note = laid_down(source, 1, state(1), corrupt=True)
        assert isinstance(note.where, SegmentRef)
        assert source.board is not None
        source.board.post(note.where.serial + 1, list(note.digests))  # the announced digests, for another write
        with pytest.raises(hwplace.WeightSyncError, match="does not match its digest"):
            target.take(note)
        assert checks == [1]
    finally:
        source.close()
        target.close()


def test_a_version_nobody_checked_while_written_is_checked_once_for_the_node_by_the_first_to_take_it(
        checks: list[int]) -> None:
    source, first, second = SameNode(f"late-{os.getpid()}"), SameNode("first"), SameNode("second")
    try:
        _, note = laid_down(source, 1, state(1))  # its Writing note went unheard: no target was waiting
        for target in (first, second):
            got = target.take(note)
            assert got is not None
            assert got.weights().tensors["a"][0] == 1.0
        assert checks == [1]  # the first target's, posted for the second
        _, note = laid_down(source, 2, state(2), corrupt=True)
        for target in (first, second):
            with pytest.raises(hwplace.WeightSyncError, match="does not match its digest"):
                target.take(note)
        assert checks == [1, 1, 1]  # a check that failed posts nothing: each target finds the corruption
    finally:
        for end in (source, first, second):
            end.close()


def test_a_seal_names_its_write_and_leaves_the_posted_digests_alone(board: Board) -> None:
    board.post(4, ["xxh128:posted"])
    assert board.sealed(4) is None
    assert board.seal(4, ["xxh128:a", "xxh128:b"])
    assert board.sealed(4) == ["xxh128:a", "xxh128:b"]
    assert board.sealed(3) is None  # another write's seal stands for nothing
    assert board.sealed(5) is None
    assert board.posted(4) == ["xxh128:posted"]  # the halves are apart
    board.post(5, ["xxh128:other"])
    assert board.sealed(4) == ["xxh128:a", "xxh128:b"]
    assert not board.seal(6, ["xxh128:" + "f" * 32] * (BOARD_BYTES // 2 // 40))  # more than half a board
    assert board.sealed(6) is None
    assert board.sealed(4) is None  # nor is the seal before it left standing


def test_a_target_waits_for_the_seal_while_going_and_no_longer(pool: SegmentPool, board: Board) -> None:
    ref, _ = pool.write(1, SIZES, [(b, None) for b in buckets(1)])
    reader, waiter = SegmentReader(), opened(ref)
    deadline = time.monotonic() + 120  # bounds each wait should it never end

    def going() -> bool:
        return time.monotonic() < deadline

    try:
        assert wait_sealed(waiter, ref, reader.mapping(ref), lambda: False) is None
        again, digests = pool.write(2, SIZES, [(b, None) for b in buckets(2)])  # the only segment: the same one
        assert again.fd == ref.fd
        assert wait_sealed(waiter, ref, reader.mapping(ref), going) is None  # the segment holds another write
        threading.Timer(0.2, board.seal, (again.serial, digests)).start()
        assert wait_sealed(waiter, again, reader.mapping(again), going) == digests
    finally:
        waiter.close()
        reader.close()


def test_a_version_sealed_on_the_board_is_taken_as_its_announcement_says(checks: list[int]) -> None:
    source, first, second = SameNode(f"sealed-{os.getpid()}"), SameNode("first"), SameNode("second")
    try:
        writing, note = laid_down(source, 1, state(1))
        assert first.early(writing, lambda: False)
        assert first.sealed(writing, lambda: False) is None  # written, but not yet sealed
        source.seal(note)
        for target in (first, second):
            sealed = target.sealed(writing, lambda: False)
            assert sealed == note  # where it lies, its entries, digests and lengths
            got = target.take(sealed)
            assert got is not None
            assert got.weights().tensors["b"][-1] == -1.0
        assert not checks  # the one check of the node served both
        writing, note = laid_down(source, 2, state(2), corrupt=True)
        assert second.early(writing, lambda: False)
        source.seal(note)
        for target in (first, second):
            sealed = target.sealed(writing, lambda: False)
            assert sealed is not None
            with pytest.raises(hwplace.WeightSyncError, match="does not match its digest"):
                target.take(sealed)
    finally:
        for end in (source, first, second):
            end.close()


def test_a_board_a_live_source_has_that_cannot_be_opened_is_a_clear_error() -> None:
    source, target = SameNode(f"sealed-{os.getpid()}"), SameNode("target")
    try:
        writing, _ = laid_down(source, 1, state(1))
        assert isinstance(writing.where, Writing)
        hidden = replace(writing, where=Writing(replace(writing.where.segment, board=65000)))  # no such descriptor
        named = f"cannot open the source's board /proc/{os.getpid()}/fd/65000"
        with pytest.raises(hwplace.WeightSyncError, match=named):
            target.sealed(hidden, lambda: True)  # its seals would go unseen: an error, not a wait
    finally:
        source.close()
        target.close()


def test_closing_a_board_twice_leaves_a_file_given_its_number_meanwhile_open() -> None:
    made = Board.create(f"test-close-{os.getpid()}")
    assert made is not None
    closes_once(made.fd, made.close)


linux_policies = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")


@linux_policies
def test_a_checking_or_sealed_waiting_target_runs_under_sched_batch_and_comes_back_as_it_was(
        pool: SegmentPool) -> None:
    seen: list[int] = []

    def looking() -> bool:
        seen.append(os.sched_getscheduler(0))
        return False  # one look, then the wait ends

    ref = stopped_write(pool)
    reader, checker = SegmentReader(), opened(ref)
    try:
        assert not check_while_written(checker, ref, reader.mapping(ref), looking)  # hashed bucket 0, then waited
        assert wait_sealed(checker, ref, reader.mapping(ref), looking) is None
    finally:
        checker.close()
        reader.close()
    assert seen == [os.SCHED_BATCH, os.SCHED_BATCH]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


@linux_policies
def test_in_background_leaves_a_thread_under_another_policy_as_it_was(monkeypatch: Any) -> None:
    outcome: list[int] = []

    def batch_already() -> None:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        with node_check.in_background():
            outcome.append(os.sched_getscheduler(0))
        outcome.append(os.sched_getscheduler(0))  # not put back to the default: it was not the default

    thread = threading.Thread(target=batch_already)
    thread.start()
    thread.join()
    assert outcome == [os.SCHED_BATCH, os.SCHED_BATCH]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # another thread's policy is its own

    def refused(*args: Any) -> None:
        raise PermissionError("a seccomp profile refuses sched_setscheduler")

    monkeypatch.setattr(os, "sched_setscheduler", refused)
    with node_check.in_background():  # goes on as it was
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_posted_digests_read_back_exactly_and_a_post_too_large_leaves_none_standing(board: Board) -> None:
    board.post(3, [])
    assert board.posted(3) == []  # a version of no buckets: no digests, not one empty digest
    board.post(4, ["xxh128:a", "xxh128:b"])
    assert board.posted(4) == ["xxh128:a", "xxh128:b"]
    board.post(5, ["xxh128:" + "f" * 32] * (BOARD_BYTES // 2 // 40))  # more than half a board
    assert [serial for serial in range(8) if board.posted(serial) is not None] == []  # nor the post before it


def test_a_target_finding_the_board_claimed_leaves_the_write_to_the_checker(pool: SegmentPool) -> None:
    ref, _ = pool.write(1, SIZES, [(b, None) for b in buckets(1)])
    checker, other = opened(ref), opened(ref)
    reader = SegmentReader()
    try:
        assert checker.claim()
        assert not check_while_written(other, ref, reader.mapping(ref), lambda: True)
        assert other.posted(ref.serial) is None
        assert other.claimed()  # still the checker's
    finally:
        checker.close()
        other.close()
        reader.close()


@pytest.mark.time_limit(120)
def test_digests_posted_while_their_checker_still_holds_the_board_are_taken_at_once(
        pool: SegmentPool, monkeypatch: Any) -> None:
    monkeypatch.setattr(node_check, "WAIT_POSTED", 600.0)  # a wait for the let-go would outlast the time limit
    ref, digests = pool.write(1, SIZES, [(b, None) for b in buckets(1)])
    holder, waiter = opened(ref), opened(ref)
    try:
        assert holder.claim()
        holder.post(ref.serial, digests)
        assert wait_posted(waiter, ref.serial) == digests
    finally:
        holder.close()
        waiter.close()


def test_a_write_begun_again_while_its_last_bytes_were_hashed_gives_no_digests(pool: SegmentPool) -> None:
    ref, _ = pool.write(1, SIZES, [(b, None) for b in buckets(1)])
    reader = SegmentReader()
    whole = reader.mapping(ref)
    assert whole is not None
    end = max(o + n for o, n in zip(ref.offsets, ref.lengths, strict=True))

    array: Any = np.ndarray

    class Rewritten(array):  # type: ignore[misc]
        """The segment as the checker sees it: the source begins another write in it as the last bytes are read."""

        def __getitem__(self, key: Any) -> Any:
            if isinstance(key, slice) and key.stop == end:
                WORD.pack_into(self, WRITING, ref.serial + 1)
            return super().__getitem__(key)

    board = opened(ref)
    try:
        assert not check_while_written(board, ref, np.array(whole).view(Rewritten), lambda: True)
        assert board.posted(ref.serial) is None
    finally:
        board.close()
        reader.close()


def test_a_board_s_descriptors_stay_out_of_programs_a_source_or_target_starts(pool: SegmentPool, board: Board) -> None:
    ref, _ = pool.write(1, SIZES, [(b, None) for b in buckets(1)])
    target = opened(ref)
    try:  # a program inheriting one would hold a target's claim on past the target's death
        assert not os.get_inheritable(board.fd)
        assert not os.get_inheritable(target.fd)
    finally:
        target.close()
