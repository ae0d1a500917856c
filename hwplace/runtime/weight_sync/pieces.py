"""A bucket's digest made of its pieces' digests, so that a bucket can be written and checked on several threads.

``xxh3t:<hex>`` is XXH3-128 of the XXH3-128 digests (16 bytes each, in xxhash's canonical order) of the bucket's
:data:`PIECE`-byte pieces, in order, the last piece shorter. One stream over a whole bucket, as ``xxh128:`` is,
can only be hashed by one thread; pieces can be hashed by several at once. xxhash lets go of the GIL while it
hashes and numpy while it copies, so the threads of one process share the work: the source's copy-and-hash into
the node's segment (:func:`copy_hashed`), a target's check (:func:`tree_digest`, :class:`TreeHasher`).

How many threads (:func:`threads`): half the cores this process may run on, at most :data:`MAX_THREADS`; one
where it has fewer than 4. The other half is left to the node's targets, one of which checks the version as it
is written. Imports nothing of hwplace; xxhash (which the ray and torch extras bring) when used.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

with contextlib.suppress(ImportError):  # optional: xxhash, which the ray and torch extras bring (buckets.py
    import xxhash  # refuses xxh3t digests without it)

PIECE = 1 << 20  # bytes a piece of a bucket holds; what each thread of a writer copies, then hashes, at a time
CHUNK = 1 << 18  # what a writer on one thread copies, then hashes, at a time: it stays in the core's own cache
MAX_THREADS = 8
ALGORITHM = "xxh3t"

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _forgotten_in_child() -> None:
    """A forked child has none of its parent's threads: its pools would take work and never run it."""
    global _POOLS_LOCK  # the lock may have been held by a thread of the parent at the fork
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forgotten_in_child)


def threads() -> int:
    """How many threads this process hashes (and copies) with: half its cores, at most :data:`MAX_THREADS`, one
    where it has fewer than 4."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 1 if cores < 4 else min(MAX_THREADS, cores // 2)


def _pool(workers: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="hwplace-wsync-hash")
        return _POOLS[workers]


def piece_digest(piece: Any) -> bytes:
    """XXH3-128 of one piece (anything with the buffer protocol), canonical bytes."""
    return xxhash.xxh3_128_digest(piece)


def root(digests: Sequence[bytes]) -> str:
    """The bucket's digest from its pieces' digests, in order."""
    return f"{ALGORITHM}:{xxhash.xxh3_128_hexdigest(b''.join(digests))}"


def tree_digest(buffer: Any, workers: int = 1) -> str:
    """The ``xxh3t`` digest of ``buffer`` (anything with the buffer protocol), its pieces hashed on ``workers``
    threads."""
    return root(_digests(memoryview(buffer).cast("B"), workers))


class TreeHasher:
    """An ``xxh3t`` digest computed part by part (:meth:`update` each part in order, of any length): whole pieces
    are hashed on ``workers`` threads, a piece split across parts as a stream."""

    def __init__(self, workers: int = 1) -> None:
        self._new = xxhash.xxh3_128
        self._workers = workers
        self._digests: list[bytes] = []
        self._piece = self._new()
        self._filled = 0  # bytes of the current piece hashed so far

    def update(self, buffer: Any) -> None:
        view = memoryview(buffer).cast("B")
        at = 0
        if self._filled:  # finish the piece the last part began
            at = min(PIECE - self._filled, len(view))
            self._stream(view[:at])
        whole = (len(view) - at) // PIECE * PIECE
        if whole:
            self._digests.extend(_digests(view[at : at + whole], self._workers))
            at += whole
        if at < len(view):
            self._stream(view[at:])

    def _stream(self, part: memoryview) -> None:
        self._piece.update(part)
        self._filled += len(part)
        if self._filled == PIECE:
            self._digests.append(self._piece.digest())
            self._piece, self._filled = self._new(), 0

    def hexdigest(self) -> str:
        return root(self._digests + ([self._piece.digest()] if self._filled else []))


def _digests(view: memoryview, workers: int) -> list[bytes]:
    starts = range(0, len(view), PIECE)
    if workers > 1 and len(starts) > 1:
        return list(_pool(workers).map(lambda start: piece_digest(view[start : start + PIECE]), starts))
    return [piece_digest(view[start : start + PIECE]) for start in starts]


def copy_hashed(into: Any, source: Any, written: Callable[[int], None], workers: int = 1) -> str:
    """Copy ``source`` into ``into`` (numpy uint8 arrays of one length) a :data:`CHUNK` at a time on one thread, a
    piece at a time on ``workers`` threads (taken in order by whichever thread is free), hashing each just after it
    is copied, while it is still in cache: one pass over memory for both. ``written(n)`` each time the bytes copied
    from the start on grow, with how many: a reader may hash up to there. Returns the ``xxh3t`` digest."""
    size = len(source)
    count = -(-size // PIECE)
    if workers <= 1 or count <= 1:  # TreeHasher's work inlined: through it, 0.4 ms more per 100 MB (3%)
        digests, piece = [], xxhash.xxh3_128()
        for start in range(0, size, CHUNK):  # PIECE is a multiple of CHUNK
            end = min(start + CHUNK, size)
            into[start:end] = source[start:end]
            piece.update(into[start:end])
            if end % PIECE == 0 or end == size:
                digests.append(piece.digest())
                piece = xxhash.xxh3_128()
            written(end)
        return root(digests)
    found: list[bytes | None] = [None] * count
    lock, prefix = threading.Lock(), [0]

    def one(index: int) -> None:
        start, end = index * PIECE, min(index * PIECE + PIECE, size)
        into[start:end] = source[start:end]
        piece = piece_digest(into[start:end])
        with lock:
            found[index] = piece
            done = prefix[0]
            while done < count and found[done] is not None:
                done += 1
            if done > prefix[0]:
                prefix[0] = done
                written(min(done * PIECE, size))

    started = [_pool(workers).submit(one, index) for index in range(count)]
    wait(started)  # a piece that raised leaves none being copied: the caller may give the segment to another write
    for future in started:
        future.result()  # raises what the first piece to fail raised
    return root([piece for piece in found if piece is not None])
