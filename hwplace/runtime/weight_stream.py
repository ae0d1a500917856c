"""A weight sync's broadcast to the targets on other nodes: a sender on the source, a receiver thread on each.

The communicator's members are the source (index 0) and the targets on other nodes; it is built when the
source first publishes and each of those targets first asks for weights. Each version travels as a head (the
entries and bucket sizes, pickled into a fixed-size buffer), each bucket, and then the buckets' digests. Once
every member has joined, the source broadcasts a version straight from its own tensors while ``publish`` waits
(no copy, one bucket in flight); before that, or when targets on its node need a stored copy anyway, a thread
broadcasts the newest stored version (versions published meanwhile are skipped, never mixed). A receiver checks
every digest before the version becomes its latest; waiting for one is a wait on a condition. Imports the
layers below and :mod:`hwplace.runtime.buckets`, :mod:`hwplace.runtime.communicator`.
"""

from __future__ import annotations

import pickle
import threading
import warnings
from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import Any

from hwplace.contracts.executor import VersionBoard
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError, WeightSyncError
from hwplace.plugin.current import current_executor
from hwplace.runtime.buckets import Entry, Manifest, Weights, check, unpack
from hwplace.runtime.communicator import connect, find_entry, torch_module


def _connect(uid: str, members: tuple[tuple[str, int], ...], context: WorkerContext) -> Any:
    executor = current_executor()
    address = find_entry(executor, context.group).addresses[context.rank]
    index = members.index((context.group, context.rank))
    return connect(executor, f"wsync/{uid}", members, index, address, None)


HEAD_BYTES = 64 * 1024  # a version's head (version, entries, bucket sizes) travels in one broadcast up to this


def sizes(entries: Sequence[Entry]) -> list[int]:
    """Each bucket's size in bytes, from the entries that lie in it."""
    out: list[int] = []
    for entry in entries:
        out.extend([0] * (entry.bucket + 1 - len(out)))
        out[entry.bucket] = max(out[entry.bucket], entry.offset + entry.nbytes)
    return out


def _send_pickle(comm: Any, value: Any, torch: Any) -> None:
    """Broadcast a small value as one fixed-size buffer (its pickle's length, then the pickle), with a second
    broadcast for the rest of a pickle that does not fit."""
    data = pickle.dumps(value, protocol=5)
    head = torch.zeros(HEAD_BYTES, dtype=torch.uint8)
    first = len(data).to_bytes(8, "little") + data[: HEAD_BYTES - 8]
    head[: len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
    comm.gloo.broadcast(head, 0).wait()
    if len(data) > HEAD_BYTES - 8:
        comm.gloo.broadcast(torch.frombuffer(bytearray(data[HEAD_BYTES - 8 :]), dtype=torch.uint8), 0).wait()


def _recv_pickle(comm: Any, torch: Any) -> Any:
    """The value :func:`_send_pickle` broadcast."""
    head = torch.empty(HEAD_BYTES, dtype=torch.uint8)
    comm.gloo.broadcast(head, 0).wait()
    raw = head.numpy().tobytes()
    size = int.from_bytes(raw[:8], "little")
    data = raw[8 : 8 + size]
    if size > HEAD_BYTES - 8:
        rest = torch.empty(size - (HEAD_BYTES - 8), dtype=torch.uint8)
        comm.gloo.broadcast(rest, 0).wait()
        data += rest.numpy().tobytes()
    return pickle.loads(data)


class Sender:
    """The source's side. Once every member has joined, :meth:`send` broadcasts a version straight from the
    caller's buffers (no copy); until then, and while targets on the source's node need a stored copy anyway,
    :meth:`offer` hands a stored version to a thread that broadcasts the newest one offered (versions offered
    meanwhile are skipped, never mixed)."""

    def __init__(self, name: str, uid: str, members: tuple[tuple[str, int], ...], board: VersionBoard,
                 context: WorkerContext) -> None:
        self.name = name
        self.error: HwplaceError | None = None
        self._board = board
        self._changed = threading.Condition()
        self._sending = threading.Lock()  # one version on the wire at a time
        self._comm: Any = None
        self._offered: Manifest | None = None
        self._sent = 0
        threading.Thread(target=self._run, args=(uid, members, context), daemon=True,
                         name=f"hwplace-wsync-send-{name}").start()

    @property
    def connected(self) -> bool:
        """Whether every member has joined (then :meth:`send` does not block on a target that never asked)."""
        return self._comm is not None and self.error is None

    def offer(self, manifest: Manifest) -> None:
        with self._changed:
            self._offered = manifest
            self._changed.notify_all()

    def stream(self, version: int, entries: Sequence[Entry], buckets: Iterable[tuple[Any, str]]) -> None:
        """Broadcast a version now, in the caller's thread, bucket by bucket as ``buckets`` yields them with
        their digests; raises the :class:`WeightSyncError` of a broken broadcast."""
        try:
            self._send(version, entries, buckets)
        except BaseException as exc:
            self.error = self._broke(exc)
            raise self.error from None

    def _send(self, version: int, entries: Sequence[Entry], buckets: Iterable[tuple[Any, str]]) -> None:
        """Head (version, entries, bucket sizes), each bucket, then the digests: one bucket in flight at a time."""
        torch = torch_module()
        with self._sending:
            if version <= self._sent:
                return
            _send_pickle(self._comm, (version, tuple(entries), sizes(entries)), torch)
            digests = []
            with warnings.catch_warnings():  # object-store buffers are read-only; the root only reads them
                warnings.simplefilter("ignore", UserWarning)
                for buffer, digest in buckets:
                    if buffer.nbytes:
                        self._comm.gloo.broadcast(torch.from_numpy(buffer), 0).wait()
                    digests.append(digest)
            _send_pickle(self._comm, tuple(digests), torch)
            self._sent = version

    def _broke(self, exc: BaseException) -> WeightSyncError:
        return WeightSyncError(f"weight sync {self.name!r}: the broadcast to the targets on other nodes broke "
                               f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); a target has "
                               "died or shut down")

    def _run(self, uid: str, members: tuple[tuple[str, int], ...], context: WorkerContext) -> None:
        try:
            self._comm = _connect(uid, members, context)
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._offered is not None and self._offered.version > self._sent)
                    manifest = self._offered
                if manifest is not None:
                    buffers = manifest.inline or self._board.fetch(manifest.refs)
                    self._send(manifest.version, manifest.entries, zip(buffers, manifest.digests, strict=True))
        except BaseException as exc:
            self.error = self._broke(exc)


class Receiver:
    """A target's side: receives versions as they are broadcast and keeps the newest one that is intact."""

    def __init__(self, name: str, uid: str, members: tuple[tuple[str, int], ...], context: WorkerContext) -> None:
        self.name = name
        self._changed = threading.Condition()
        self._kept: Weights | None = None
        self._bad: WeightSyncError | None = None  # a newer version that arrived broken, until reported
        self._bad_version = 0
        self._error: HwplaceError | None = None
        threading.Thread(target=self._run, args=(uid, members, context), daemon=True,
                         name=f"hwplace-wsync-recv-{name}").start()

    def _run(self, uid: str, members: tuple[tuple[str, int], ...], context: WorkerContext) -> None:
        torch = torch_module()
        try:
            comm = _connect(uid, members, context)
            while True:
                version, entries, lengths = _recv_pickle(comm, torch)
                buffers = []
                for length in lengths:
                    buffer = torch.empty(length, dtype=torch.uint8)
                    if length:
                        comm.gloo.broadcast(buffer, 0).wait()
                    buffers.append(buffer.numpy())
                digests = _recv_pickle(comm, torch)
                try:
                    check(buffers, digests, f"weight sync {self.name!r} version {version}")
                    weights = Weights(version, MappingProxyType(unpack(entries, buffers)))
                except WeightSyncError as exc:
                    with self._changed:
                        self._bad, self._bad_version = exc, version
                        self._changed.notify_all()
                    continue
                with self._changed:
                    self._kept = weights
                    self._changed.notify_all()
        except BaseException as exc:
            with self._changed:
                self._error = WeightSyncError(f"weight sync {self.name!r}: the broadcast from the source broke "
                                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
                self._changed.notify_all()

    def latest(self, min_version: int, timeout: float | None) -> Weights:
        def ready() -> bool:
            kept = self._kept.version if self._kept else 0
            return self._error is not None or self._bad is not None or kept >= max(min_version, 1)

        with self._changed:
            if not self._changed.wait_for(ready, timeout):
                raise TimeoutError(f"weight sync {self.name!r}: no version >= {max(min_version, 1)} within "
                                   f"{timeout:g} s")
            if self._bad is not None:
                bad, self._bad = self._bad, None
                if self._kept is None or self._kept.version < self._bad_version:
                    raise bad
            if self._kept is not None and self._kept.version >= max(min_version, 1):
                return self._kept
            if self._error is not None:
                raise self._error
            raise TimeoutError(f"weight sync {self.name!r}: no version >= {max(min_version, 1)} yet")
