"""A weight sync's broadcast to the targets on other nodes: a sender thread on the source, a receiver on each.

The communicator's members are the source (index 0) and the targets on other nodes; it is built when the
source first publishes and each of those targets first asks for weights. The sender broadcasts the newest
version it was offered (versions published meanwhile are skipped, never mixed): a header with the entries,
digests and bucket sizes, then each bucket, read from the object store's copy. A receiver checks every
digest before the version becomes its latest; waiting for one is a wait on a condition. Imports the layers
below and :mod:`hwplace.runtime.buckets`, :mod:`hwplace.runtime.communicator`.
"""

from __future__ import annotations

import threading
import warnings
from types import MappingProxyType
from typing import Any

from hwplace.contracts.executor import VersionBoard
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError, WeightSyncError
from hwplace.plugin.current import current_executor
from hwplace.runtime.buckets import Manifest, Weights, check, unpack
from hwplace.runtime.communicator import HEADER, connect, decode, empty_payload, encode, find_entry, torch_module


def _connect(uid: str, members: tuple[tuple[str, int], ...], context: WorkerContext) -> Any:
    executor = current_executor()
    address = find_entry(executor, context.group).addresses[context.rank]
    index = members.index((context.group, context.rank))
    return connect(executor, f"wsync/{uid}", members, index, address, None)


class Sender:
    """The source's side: broadcasts the newest offered version whenever it is newer than the last one sent."""

    def __init__(self, name: str, uid: str, members: tuple[tuple[str, int], ...], board: VersionBoard,
                 context: WorkerContext) -> None:
        self.name = name
        self.error: HwplaceError | None = None
        self._board = board
        self._changed = threading.Condition()
        self._offered: Manifest | None = None
        self._sent = 0
        threading.Thread(target=self._run, args=(uid, members, context), daemon=True,
                         name=f"hwplace-wsync-send-{name}").start()

    def offer(self, manifest: Manifest) -> None:
        with self._changed:
            self._offered = manifest
            self._changed.notify_all()

    def _run(self, uid: str, members: tuple[tuple[str, int], ...], context: WorkerContext) -> None:
        torch = torch_module()
        try:
            comm = _connect(uid, members, context)
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._offered is not None and self._offered.version > self._sent)
                    manifest = self._offered
                if manifest is None:
                    continue
                buffers = self._board.fetch(manifest.refs)
                meta = (manifest.version, manifest.entries, manifest.digests, [int(b.nbytes) for b in buffers])
                header, payload = encode(meta, device_ok=False)
                comm.gloo.broadcast(header, 0).wait()
                comm.gloo.broadcast(payload, 0).wait()
                with warnings.catch_warnings():  # object-store buffers are read-only; the root only reads them
                    warnings.simplefilter("ignore", UserWarning)
                    for buffer in buffers:
                        if buffer.nbytes:
                            comm.gloo.broadcast(torch.from_numpy(buffer), 0).wait()
                self._sent = manifest.version
        except BaseException as exc:
            self.error = WeightSyncError(f"weight sync {self.name!r}: the broadcast to the targets on other nodes "
                                         f"broke ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                                         "a target has died or shut down")


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
                header = torch.zeros(HEADER, dtype=torch.int64)
                comm.gloo.broadcast(header, 0).wait()
                payload = empty_payload(header)
                comm.gloo.broadcast(payload, 0).wait()
                version, entries, digests, sizes = decode(header, payload)
                buffers = []
                for size in sizes:
                    buffer = torch.empty(size, dtype=torch.uint8)
                    if size:
                        comm.gloo.broadcast(buffer, 0).wait()
                    buffers.append(buffer.numpy())
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
