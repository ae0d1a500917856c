"""A bucket's ``xxh3t`` digest from its pieces (hwplace.runtime.weight_sync.pieces): its definition, the same on any
number of threads and in parts of any length, and the copy-and-hash that reports how far it has copied."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
import xxhash

from hwplace.runtime.weight_sync import pieces
from hwplace.runtime.weight_sync.pieces import PIECE, TreeHasher, copy_hashed, threads, tree_digest

SIZES = (0, 1, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 5)


def definition(data: bytes) -> str:
    """``xxh3t`` as docs and the module's docstring define it, with xxhash alone."""
    parts = [xxhash.xxh3_128_digest(data[start : start + PIECE]) for start in range(0, len(data), PIECE)]
    return "xxh3t:" + xxhash.xxh3_128_hexdigest(b"".join(parts))


def data_of(size: int, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("workers", [1, 3])
def test_the_digest_is_its_definition_on_any_number_of_threads(size: int, workers: int) -> None:
    data = data_of(size)
    assert tree_digest(data, workers) == definition(data.tobytes())
    assert tree_digest(data.tobytes(), workers) == definition(data.tobytes())  # any buffer


def test_it_is_not_the_digest_of_the_bytes_as_one_stream() -> None:
    data = data_of(2 * PIECE).tobytes()
    assert tree_digest(data).removeprefix("xxh3t:") != xxhash.xxh3_128_hexdigest(data)


def test_a_changed_byte_in_any_piece_or_two_pieces_swapped_change_it() -> None:
    data = data_of(3 * PIECE + 5)
    whole = tree_digest(data)
    for position in (0, PIECE - 1, PIECE, 2 * PIECE + 7, len(data) - 1):
        changed = data.copy()
        changed[position] ^= 1
        assert tree_digest(changed) != whole, position
    swapped = np.concatenate([data[PIECE : 2 * PIECE], data[:PIECE], data[2 * PIECE :]])
    assert tree_digest(swapped) != whole
    assert tree_digest(data[:-1]) != whole
    assert tree_digest(np.concatenate([data, np.zeros(1, np.uint8)])) != whole


@pytest.mark.parametrize("part", [1, 7, PIECE // 3, PIECE, PIECE + 1, 2 * PIECE + 3])
@pytest.mark.parametrize("workers", [1, 3])
def test_parts_of_any_length_give_the_digest_of_the_whole(part: int, workers: int) -> None:
    data = data_of(3 * PIECE + 5)[: 2 * PIECE + 11] if part == 1 else data_of(3 * PIECE + 5)
    hasher = TreeHasher(workers)
    for start in range(0, len(data), part):
        hasher.update(data[start : start + part])
    assert hasher.hexdigest() == definition(data.tobytes())


def test_an_empty_hasher_is_the_digest_of_nothing() -> None:
    hasher = TreeHasher()
    hasher.update(b"")
    assert hasher.hexdigest() == definition(b"") == tree_digest(b"")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("workers", [1, 3])
def test_copy_hashed_copies_every_byte_and_reports_only_what_is_in(size: int, workers: int) -> None:
    source = data_of(size, seed=size)
    into = np.zeros(size, dtype=np.uint8)
    reported: list[int] = []

    def written(upto: int) -> None:
        assert np.array_equal(into[:upto], source[:upto])  # everything before what is reported is in
        reported.append(upto)

    assert copy_hashed(into, source, written, workers) == definition(source.tobytes())
    assert np.array_equal(into, source)
    assert reported == sorted(set(reported))  # growing, each once
    assert all(n % pieces.CHUNK == 0 or n == size for n in reported)  # whole chunks (pieces are whole chunks)
    assert reported[-1:] == ([size] if size else [])


def test_a_piece_that_cannot_be_copied_is_raised_on_any_number_of_threads() -> None:
    source = data_of(3 * PIECE)
    for workers in (1, 3):
        with pytest.raises(ValueError, match="could not broadcast input array"):
            copy_hashed(np.zeros(3 * PIECE - 5, dtype=np.uint8), source, lambda n: None, workers)


@pytest.mark.time_limit(120)
def test_when_a_piece_raises_no_other_piece_is_still_being_copied() -> None:
    reading, raised, finished = threading.Event(), threading.Event(), []

    class Source:  # piece 0 fails once piece 2 is being read; piece 2 is done only after that
        def __len__(self) -> int:
            return 3 * PIECE

        def __getitem__(self, span: slice) -> np.ndarray:
            if span.start == 0:
                reading.wait(60)
                raised.set()
                raise ValueError("piece 0 cannot be read")
            if span.start == 2 * PIECE:
                reading.set()
                raised.wait(60)
                threading.Event().wait(0.05)  # still copying when piece 0 has failed
                finished.append(span.start)
            return np.zeros(span.stop - span.start, dtype=np.uint8)

    with pytest.raises(ValueError, match="piece 0 cannot be read"):
        copy_hashed(np.zeros(3 * PIECE, dtype=np.uint8), Source(), lambda n: None, 3)
    assert finished == [2 * PIECE]  # copy_hashed raised only once the last piece was done


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (16, 8), (64, 8)])
def test_threads_are_half_the_cores_at_most_eight_and_one_below_four(
        monkeypatch: pytest.MonkeyPatch, cores: int, expected: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert threads() == expected
    assert pieces.MAX_THREADS == 8


@pytest.mark.time_limit(120)
def test_a_process_forked_after_the_threads_ran_hashes_on_threads_of_its_own() -> None:
    many, two = data_of(8 * PIECE), data_of(2 * PIECE)
    assert tree_digest(many, 3) == definition(many.tobytes())  # this process's pool of 3 threads, idle now
    child = os.fork()
    if child == 0:  # the child: a pool inherited as it was counts its idle threads and starts none for two pieces
        os._exit(0 if tree_digest(two, 3) == definition(two.tobytes()) else 1)
    for _ in range(60_000):
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.001)
    else:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child never finished hashing: its pool's threads were its parent's")
    assert os.waitstatus_to_exitcode(status) == 0
