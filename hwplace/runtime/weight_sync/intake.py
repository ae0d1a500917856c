"""A target's side of one weight sync: the versions announced on its link, taken when it asks.

The receiver (:class:`~hwplace.runtime.weight_sync.receiver.Receiver`) keeps the newest announcement; ``latest()`` and
``load_into`` take it, by the transport its ``where`` names (:mod:`hwplace.runtime.weight_sync.transports`), in the
caller's thread: nothing is copied behind the caller's back (on a shared GPU, never while the trainer holds its
turn). A version whose buckets or segment hold a newer one by then is skipped for that one; a version that does not
match its digests is a ``WeightSyncError``, once, and the previous one stays the latest; while a version of at
least ``min_version`` is awaited, older ones are not taken, and one the source is writing into the node's
shared memory may be checked for the whole node as it is written (by whichever waiting target claims the source's
board first; it becomes the latest only once sealed or announced and its digests match). The target keeps the newest
version it took, and each ``latest()`` call gets tensors of its own: copy-on-write views of a version in host memory
(:class:`~hwplace.runtime.weight_sync.transports.HostVersion`), a copy from the source's device buckets of a same-device
one, into the buffer of the one before when nothing else holds that any more; ``load_into`` copies one
straight from the source's buckets into the module. Imports the layers below and the room's buckets,
device-share, device-ring, links and transports modules.
"""

from __future__ import annotations

import threading
import time
from types import MappingProxyType
from typing import Any

from hwplace.runtime.messaging.communicator import torch_module
from hwplace.runtime.weight_sync.announcements import Announcement, Writing
from hwplace.runtime.weight_sync.buckets import Weights
from hwplace.runtime.weight_sync.device_ring import RingDescriptor
from hwplace.runtime.weight_sync.device_share import TornRead, entry_views
from hwplace.runtime.weight_sync.receiver import Receiver
from hwplace.runtime.weight_sync.transports import HostVersion, OtherNode, SameDevice, SameNode


class Intake:
    """The versions of one weight sync in a target process."""

    def __init__(self, name: str, receiver: Receiver, same_device: SameDevice, same_node: SameNode) -> None:
        self.name = name
        self.receiver = receiver
        self.same_device = same_device
        self.same_node = same_node
        self._lock = threading.Lock()  # one taker at a time
        self._host: HostVersion | None = None  # the kept version, when it lies in host memory
        self._kept: Weights | None = None  # the kept version, when it is a copy on this process's device
        self._kept_note: Announcement | None = None
        self._buffer: Any = None  # the device buffer the kept same-device version lies in
        self._seen = 0  # the newest version taken or tried
        self._early = 0  # the newest version whose Writing note this intake acted on (SameNode.early)

    def latest(self, min_version: int, timeout: float | None) -> Weights:
        """The newest version that is intact, waiting (up to ``timeout`` s) for one at least ``min_version``: tensors
        of the caller's own (writing into them changes neither the kept version nor another call's)."""
        with self._lock:
            self._take(max(min_version, 1), timeout, None)
            if self._host is not None:
                return self._host.weights()  # copy-on-write views of the kept bytes
            assert self._kept is not None
            self._seen = min(self._seen, self._kept.version - 1)  # the next call copies it anew from the buckets
            return self._kept

    def load_into(self, module: Any, min_version: int, timeout: float | None) -> int:
        """Load the newest intact version into ``module`` (``load_state_dict``); returns its version."""
        with self._lock:
            return self._take(max(min_version, 1), timeout, module)

    def _have(self) -> int:
        kept = self._host or self._kept
        return 0 if kept is None else kept.version

    def _take(self, wanted: int, timeout: float | None, module: Any) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        passed = 0  # a Writing note of this version or older was looked at in this call, and not sealed
        while True:
            have = self._have()
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            # a version below ``wanted`` is not taken while one at least ``wanted`` is awaited: not copied, and a
            # corrupted one that a newer version superseded on its way is no error of this call
            got = self.receiver.newest(self._seen, 0, passed) if have >= wanted else \
                self.receiver.newest(max(self._seen, wanted - 1), wait, passed)
            if got is None:
                if have >= wanted:
                    if module is not None:
                        module.load_state_dict(dict(self._current().tensors))
                    return have
                raise TimeoutError(f"weight sync {self.name!r}: no version >= {wanted} within {timeout:g} s"
                                   if timeout is not None else f"weight sync {self.name!r}: no version >= {wanted}")
            note, held = got
            if isinstance(note.where, Writing):  # being written, or written and sealed: its announcement
                sealed = self._sealed(note, have < wanted, deadline)
                if sealed is None:
                    passed = note.version
                    continue
                note = sealed
            self._seen = note.version
            if isinstance(note.where, RingDescriptor) and module is not None:
                try:
                    self.same_device.load(note.where, module)
                except TornRead:
                    continue  # a newer version is on its way
                self._forget()  # the module holds it now
                self._seen = note.version - 1  # latest() copies it, if asked before a newer one comes
                return note.version
            if isinstance(note.where, RingDescriptor):
                taken = self._taken_slot(note)
            else:
                host = OtherNode.take(note, held) if held is not None else self.same_node.take(note)
                if host is not None:
                    self._forget()
                    self._host = host
                taken = host is not None
            if taken and module is not None and note.version >= wanted:
                module.load_state_dict(dict(self._current().tensors))
                return note.version

    def _sealed(self, note: Announcement, waiting: bool, deadline: float | None) -> Announcement | None:
        """The version a Writing ``note`` names, as the source sealed it on its board: looked for at once, or, by a
        caller ``waiting`` for it, hashed for the node as it is written (once) and waited for while it may still
        come (until ``deadline``). None when it is not sealed by then."""
        if not waiting:
            return self.same_node.sealed(note, lambda: False)

        def going() -> bool:
            return self.receiver.pending(note.version) and (deadline is None or time.monotonic() < deadline)

        if note.version > self._early:
            self._early = note.version
            self.same_node.early(note, going)
        return self.same_node.sealed(note, going)

    def _current(self) -> Weights:
        """The kept version, to load into a module (host memory: read-only views of it, to copy from)."""
        if self._host is not None:
            return self._host.readable()
        assert self._kept is not None
        return self._kept

    def _forget(self) -> None:
        """Let go of the kept version."""
        if self._host is not None:
            self._host.close()
        self._host, self._kept, self._kept_note, self._buffer = None, None, None, None

    def _taken_slot(self, note: Announcement) -> bool:
        """Copy the same-device version ``note`` announces and keep it; False when a newer one has taken its buckets."""
        assert isinstance(note.where, RingDescriptor)
        into = self._free_buffer()
        weights = None
        try:
            weights = self.same_device.take(note.where, into)
        except TornRead:
            pass
        finally:
            if weights is None and into is not None:  # not taken: the kept version still lies in the buffer
                self._keep_buffered()
        if weights is None:
            return False
        self._forget()
        self._kept, self._kept_note, self._buffer = weights, note, _base(weights)
        return True

    def _free_buffer(self) -> Any:
        """The kept same-device version's buffer, when nothing but this intake holds it any more (the kept version
        is let go then, to be built again if the next version is not taken), else None."""
        note, buffer = self._kept_note, self._buffer
        if buffer is None or note is None or not isinstance(note.where, RingDescriptor):
            return None
        self._kept = None  # the only references this intake holds, besides the buffer itself
        count = getattr(torch_module()._C, "_storage_Use_Count", None)
        if count is not None and count(buffer.untyped_storage()._cdata) == 2:  # the buffer and this call's storage
            return buffer
        self._keep_buffered()
        return None

    def _keep_buffered(self) -> None:
        note = self._kept_note
        assert note is not None
        assert isinstance(note.where, RingDescriptor)
        self._kept = Weights(note.version, MappingProxyType(entry_views(note.where.entries, self._buffer)))

    def close(self) -> None:
        """Let go of the link, the kept version and every mapping."""
        with self._lock:
            self.receiver.close()
            self._forget()
            self.same_device.close()
            self.same_node.close()


def _base(weights: Weights) -> Any:
    """The flat buffer a same-device version's tensors view."""
    torch = torch_module()
    for tensor in weights.tensors.values():
        if tensor.numel():
            storage = tensor.untyped_storage()
            return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    return None
