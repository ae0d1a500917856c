"""``hwplace.WeightSync``: versioned, digest-checked weights from one source rank to the ranks of target groups.

Created on the driver once the groups run, it carries its plan (:mod:`hwplace.planning.sync_plan`) and pickles
into worker methods. ``publish`` packs the state dict into buckets (:mod:`hwplace.runtime.buckets`) and
announces each version on the sync's streams (:mod:`hwplace.runtime.weight_stream`):

- targets on the source's node: a small version travels in its announcement; a larger one is written once, bucket
  after bucket, into a shared-memory segment of the source (:mod:`hwplace.runtime.segments`), which they map
  without a copy; CUDA tensors reach a target on the same GPU through CUDA IPC
  (:mod:`hwplace.runtime.device_share`), without passing through host memory;
- targets on other nodes: the buckets follow the announcement in a broadcast, straight from the source's
  tensors once every such target has joined.

Every bucket's digest is checked on the target before the version becomes its latest. Imports the layers below
and those modules.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.foundation.errors import ConfigError, WeightSyncError
from hwplace.foundation.wording import safe_repr
from hwplace.planning.sync_plan import BROADCAST, SHARED_MEMORY, SyncTarget, plan_sync
from hwplace.plugin.current import current_executor
from hwplace.runtime.buckets import DEFAULT_BUCKET_BYTES, INLINE_BYTES, Weights, pack, sizes
from hwplace.runtime.communicator import check_member, find_entry
from hwplace.runtime.current import worker_context
from hwplace.runtime.device_share import SlotDescriptor, SlotWriter
from hwplace.runtime.segments import SegmentPool
from hwplace.runtime.weight_stream import ANNOUNCED_BYTES, Announcement, Member, Receiver, Sender

NODE, OTHER = "node", "other"  # the two streams: to the targets on the source's node, and on other nodes


class _State:
    """One process's side of one weight sync: the source's version count, senders and stores, or a target's
    receiver."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.senders: dict[str, Sender] = {}
        self.segments: SegmentPool | None = None
        self.slots: SlotWriter | None = None
        self.receiver: Receiver | None = None


_states: dict[str, _State] = {}
_states_lock = threading.Lock()


class WeightSync:
    """Weights from rank ``source_rank`` of group ``source`` to every rank of the ``targets`` groups.

    ``WeightSync.create(name, source, targets, source_rank=0)`` on the driver; pass it to worker methods.
    ``sync.publish(state_dict)`` on the source returns the new version (1, 2, ...); ``sync.latest(min_version,
    timeout)`` on a target returns :class:`Weights`; ``sync.load_into(module)`` loads them into a torch module.
    ``sync.plan`` lists each target rank's group, rank, node and transport.
    """

    def __init__(self, name: str, source: str, source_rank: int, plan: tuple[SyncTarget, ...], uid: str,
                 bucket_bytes: int) -> None:
        self.name = name
        self.source = source
        self.source_rank = source_rank
        self.plan = plan
        self.bucket_bytes = bucket_bytes
        self._uid = uid
        me = (source, source_rank)
        self._streams: dict[str, tuple[Member, ...]] = {
            where: (me, *((t.group, t.rank) for t in plan if (t.transport == BROADCAST) == (where == OTHER)))
            for where in (NODE, OTHER)}
        self._all_shared = all(t.transport in (SHARED_MEMORY, BROADCAST) for t in plan)  # this node's: one GPU

    @classmethod
    def create(cls, name: str, source: str, targets: Sequence[str] = ("rollout",), source_rank: int = 0,
               bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightSync:
        """A new weight sync between running groups; ``ConfigError`` naming a group or rank that is not there."""
        if not isinstance(name, str) or not name:
            raise ConfigError("name", "a weight sync's name is a non-empty string", value=name)
        if isinstance(targets, str) or not targets:
            raise ConfigError("targets", "a tuple of target group names", value=targets)
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ConfigError("bucket_bytes", "a number of bytes above 0", value=bucket_bytes)
        executor = current_executor()
        entry = find_entry(executor, source)
        check_member(entry, source_rank, "source_rank")
        if source in targets:
            raise ConfigError("targets", f"include the source group {source!r}", allowed="other groups")
        plan = plan_sync(entry.placements[source_rank], {t: find_entry(executor, t).placements for t in targets})
        return cls(name, source, source_rank, plan, os.urandom(8).hex(), bucket_bytes)

    def __repr__(self) -> str:
        targets = sorted({t.group for t in self.plan})
        return f"<WeightSync {self.name!r}: {self.source} rank {self.source_rank} -> {', '.join(targets)}>"

    def _state(self) -> _State:
        with _states_lock:
            return _states.setdefault(self._uid, _State())

    def _key(self, where: str) -> str:
        return f"wsync/{self._uid}/{where}"

    def publish(self, state_dict: Mapping[str, Any]) -> int:
        """Send ``state_dict`` (names to torch tensors or numpy arrays) to every target; returns its version."""
        context = worker_context("WeightSync.publish")
        if (context.group, context.rank) != (self.source, self.source_rank):
            raise WeightSyncError(f"weight sync {self.name!r}: publish runs on its source, group {self.source!r} "
                                  f"rank {self.source_rank}, not on group {context.group!r} rank {context.rank}")
        if not isinstance(state_dict, Mapping):
            raise WeightSyncError(f"publish takes a mapping of names to tensors, got {safe_repr(state_dict)}")
        state = self._state()
        with state.lock:
            for sender in state.senders.values():
                if sender.error is not None:
                    raise sender.error
            for where, members in self._streams.items():
                if len(members) > 1 and where not in state.senders:
                    state.senders[where] = Sender(self.name, self._key(where), members, context,
                                                  "on this node" if where == NODE else "on other nodes")
            version = state.version + 1
            node, other = state.senders.get(NODE), state.senders.get(OTHER)
            slot = None
            if node is not None and _on_device(state_dict) and any(t.transport == SHARED_MEMORY for t in self.plan):
                state.slots = state.slots or SlotWriter(context.placement.visible_accelerators or None)
                slot = state.slots.write(version, state_dict)  # CUDA IPC: the same GPU, no host copy
            host_here = node is not None and not (slot is not None and self._all_shared)
            if host_here or other is not None:
                self._send_host(state, version, state_dict, node if host_here else None, other, slot)
            if node is not None and not host_here:
                _announce(node, Announcement(version, (), slot=slot))
            state.version = version
            return version

    def _send_host(self, state: _State, version: int, state_dict: Mapping[str, Any], node: Sender | None,
                   other: Sender | None, slot: SlotDescriptor | None) -> None:
        """The version in host memory: packed into buckets, copied once for this node (in its announcement when
        small, else into a segment) and announced there; streamed to the other nodes."""
        entries, buckets = pack(state_dict, self.bucket_bytes)
        lengths = tuple(sizes(entries))
        if node is None and other is not None and other.connected:  # no copy: straight from the tensors
            if sum(lengths) <= INLINE_BYTES:  # small: the digests go ahead of the buckets
                pairs = list(buckets)
                other.send(Announcement(version, tuple(entries), tuple(d for _, d in pairs), lengths, follows=True),
                           pairs)
            else:
                other.send(Announcement(version, tuple(entries), lengths=lengths, follows=True, digests_follow=True),
                           buckets)
            return
        copies: list[Any]
        if node is not None and sum(lengths) > ANNOUNCED_BYTES:
            state.segments = state.segments or SegmentPool(self._uid)
            segment, digests = state.segments.write(version, lengths, buckets)
            note = Announcement(version, tuple(entries), tuple(digests), lengths, segment=segment, slot=slot)
            copies = state.segments.views(segment) if other is not None else []
        else:
            pairs = [(bucket.copy(), digest) for bucket, digest in buckets]
            copies, digests = [b for b, _ in pairs], [d for _, d in pairs]
            note = Announcement(version, tuple(entries), tuple(digests), lengths, slot=slot,
                                inline=tuple(b.tobytes() for b in copies) if node is not None else ())
        if node is not None:
            _announce(node, note)
        if other is not None:
            follows = Announcement(version, note.entries, note.digests, lengths, follows=True)
            if other.connected:
                other.send(follows, zip(copies, note.digests, strict=True))
            else:
                other.offer(follows, [c.copy() for c in copies])

    def _me(self, what: str) -> SyncTarget:
        context = worker_context(what)
        for target in self.plan:
            if (target.group, target.rank) == (context.group, context.rank):
                return target
        groups = ", ".join(sorted({t.group for t in self.plan}))
        raise WeightSyncError(f"weight sync {self.name!r}: {what} runs on a rank of its targets ({groups}), not on "
                              f"group {context.group!r} rank {context.rank}")

    def latest(self, min_version: int = 0, timeout: float | None = None) -> Weights:
        """The newest version that arrived intact, waiting (up to ``timeout`` s) for one at least ``min_version``.

        A version whose buckets do not match their digests raises :class:`hwplace.WeightSyncError` (once); the
        previous version stays the one returned.
        """
        if isinstance(min_version, bool) or not isinstance(min_version, int) or min_version < 0:
            raise WeightSyncError(f"min_version is a version number (0 or more), got {safe_repr(min_version)}")
        me = self._me("WeightSync.latest")
        state = self._state()
        with state.lock:
            if state.receiver is None:
                where = OTHER if me.transport == BROADCAST else NODE
                state.receiver = Receiver(self.name, self._key(where), self._streams[where],
                                          worker_context("WeightSync.latest"), me.transport)
        return state.receiver.latest(min_version, timeout)

    def load_into(self, module: Any, min_version: int = 0, timeout: float | None = None) -> int:
        """Load the latest weights into a torch module (``load_state_dict``); returns their version."""
        weights = self.latest(min_version, timeout)
        module.load_state_dict(dict(weights.tensors))
        return weights.version


def _on_device(state_dict: Mapping[str, Any]) -> bool:
    """Whether the state dict's tensors are on an accelerator (then a shared accelerator takes them there)."""
    device = getattr(next(iter(state_dict.values()), None), "device", None)
    return getattr(device, "type", "cpu") != "cpu"


def _announce(sender: Sender, note: Announcement) -> None:
    """Announce on the node's stream: now when every target there has joined, else when they have."""
    if sender.connected:
        sender.send(note)
    else:
        sender.offer(note)
