"""``hwplace.WeightSync``: versioned, digest-checked weights from one source rank to the ranks of target groups.

Created on the driver once the groups run, it carries its plan (:mod:`hwplace.planning.sync_plan`) and pickles
into worker methods. ``publish`` packs the state dict into buckets (:mod:`hwplace.runtime.weight_sync.buckets`) and
announces each version on a link to each target (:mod:`hwplace.runtime.weight_sync.links`):

- targets on the source's node: a small version travels in its announcement; a larger one is written once, bucket
  after bucket, into a shared-memory segment of the source (:mod:`hwplace.runtime.weight_sync.segments`), which they map
  without a copy; CUDA tensors reach a target on the same GPU through CUDA IPC
  (:mod:`hwplace.runtime.weight_sync.device_share`), without passing through host memory;
- targets on other nodes: the buckets follow the announcement on the link, straight from the source's tensors
  once every such target has joined.

Every bucket's digest is checked on the target before the version becomes its latest. Imports the layers below
and those modules.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.contracts.capabilities import Rendezvous, require
from hwplace.foundation.errors import ConfigError, WeightSyncError
from hwplace.foundation.wording import safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.planning.sync_plan import OTHER_NODE, SAME_DEVICE, SyncTarget, plan_sync
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import check_member, find_entry
from hwplace.runtime.weight_sync.buckets import DEFAULT_BUCKET_BYTES, INLINE_BYTES, Weights, pack, sizes
from hwplace.runtime.weight_sync.device_share import SlotDescriptor, SlotWriter
from hwplace.runtime.weight_sync.links import ANNOUNCED_BYTES, Announcement, Link, Receiver, buckets_of, fan_out
from hwplace.runtime.weight_sync.segments import SegmentPool


class _State:
    """One process's side of one weight sync: the source's version count, links and stores, or a target's
    receiver."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.links: dict[tuple[str, int], Link] = {}
        self.segments: SegmentPool | None = None
        self.slots: SlotWriter | None = None
        self.receiver: Receiver | None = None


def _states() -> dict[str, _State]:
    """This process's side of each weight sync it takes part in, by the sync's id (in the session)."""
    return session().state("weight_sync", dict)


_STATES_LOCK = threading.Lock()


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
        self._all_shared = all(t.transport in (SAME_DEVICE, OTHER_NODE) for t in plan)  # this node's: one GPU

    @classmethod
    def create(cls, name: str, source: str, targets: Sequence[str] = ("rollout",), source_rank: int = 0,
               bucket_bytes: int = DEFAULT_BUCKET_BYTES, *, cluster: Cluster | None = None) -> WeightSync:
        """A new weight sync between running groups; ``ConfigError`` naming a group or rank that is not there.

        ``cluster`` names the cluster the groups run on (default: this process's, :func:`hwplace.executor.session`);
        an executor without a rendezvous (:class:`hwplace.executor.Rendezvous`) is a ``PluginError`` naming it.
        """
        if cluster is not None and not isinstance(cluster, Cluster):
            raise ConfigError("cluster", f"{safe_repr(cluster)} is not a hwplace.Cluster")
        executor = cluster.executor() if cluster is not None else session().executor
        require(executor, Rendezvous, "WeightSync.create")
        if not isinstance(name, str) or not name:
            raise ConfigError("name", "a weight sync's name is a non-empty string", value=name)
        if isinstance(targets, str) or not targets:
            raise ConfigError("targets", "a tuple of target group names", value=targets)
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ConfigError("bucket_bytes", "a number of bytes above 0", value=bucket_bytes)
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
        with _STATES_LOCK:
            return _states().setdefault(self._uid, _State())

    def _key(self, target: SyncTarget) -> str:
        return f"wsync/{self._uid}/{target.group}/{target.rank}"

    def publish(self, state_dict: Mapping[str, Any]) -> int:
        """Send ``state_dict`` (names to torch tensors or numpy arrays) to every target; returns its version."""
        context = session().worker_context("WeightSync.publish")
        if (context.group, context.rank) != (self.source, self.source_rank):
            raise WeightSyncError(f"weight sync {self.name!r}: publish runs on its source, group {self.source!r} "
                                  f"rank {self.source_rank}, not on group {context.group!r} rank {context.rank}")
        if not isinstance(state_dict, Mapping):
            raise WeightSyncError(f"publish takes a mapping of names to tensors, got {safe_repr(state_dict)}")
        state = self._state()
        with state.lock:
            for link in state.links.values():
                if link.error is not None:
                    raise link.error
            for t in self.plan:
                if (t.group, t.rank) not in state.links:
                    state.links[t.group, t.rank] = Link(self.name, self._key(t), ((self.source, self.source_rank),
                                                        (t.group, t.rank)), context,
                                                        f"group {t.group!r} rank {t.rank} (node {t.node})")
            version = state.version + 1
            node = [state.links[t.group, t.rank] for t in self.plan if t.transport != OTHER_NODE]
            other = [state.links[t.group, t.rank] for t in self.plan if t.transport == OTHER_NODE]
            slot = None
            if node and _on_device(state_dict) and any(t.transport == SAME_DEVICE for t in self.plan):
                state.slots = state.slots or SlotWriter(context.placement.visible_accelerators or None)
                slot = state.slots.write(version, state_dict)  # CUDA IPC: the same GPU, no host copy
            host_here = bool(node) and not (slot is not None and self._all_shared)
            if host_here or other:
                self._send_host(state, version, state_dict, node if host_here else [], other, slot)
            if node and not host_here:
                _deliver(node, Announcement(version, (), slot=slot))
            state.version = version
            return version

    def _send_host(self, state: _State, version: int, state_dict: Mapping[str, Any], node: list[Link],
                   other: list[Link], slot: SlotDescriptor | None) -> None:
        """The version in host memory: packed into buckets, copied once for this node (in its announcement when
        small, else into a segment) and announced there; sent on to the other nodes."""
        entries, buckets = pack(state_dict, self.bucket_bytes)
        lengths = tuple(sizes(entries))
        if not node and all(link.connected for link in other):  # no copy: straight from the tensors
            small = sum(lengths) <= INLINE_BYTES  # packed whole first, so its digests go ahead of the buckets
            sent: Any = list(buckets) if small else buckets
            ahead = tuple(d for _, d in sent) if small else ()
            fan_out(other, Announcement(version, tuple(entries), ahead, lengths, follows=True,
                                        digests_follow=not small), sent)
            return
        copies: list[Any]
        if node and sum(lengths) > ANNOUNCED_BYTES:
            state.segments = state.segments or SegmentPool(self._uid)
            segment, digests = state.segments.write(version, lengths, buckets)
            note = Announcement(version, tuple(entries), tuple(digests), lengths, segment=segment, slot=slot)
            copies = state.segments.views(segment) if other else []
        else:
            pairs = [(bucket.copy(), digest) for bucket, digest in buckets]
            copies, digests = [b for b, _ in pairs], [d for _, d in pairs]
            note = Announcement(version, tuple(entries), tuple(digests), lengths, slot=slot,
                                inline=tuple(b.tobytes() for b in copies) if node else ())
        if node:
            _deliver(node, note)
        if other:
            _deliver(other, Announcement(version, note.entries, note.digests, lengths, follows=True), copies)

    def _me(self, what: str) -> SyncTarget:
        context = session().worker_context(what)
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
                members = ((self.source, self.source_rank), (me.group, me.rank))
                state.receiver = Receiver(self.name, self._key(me), members,
                                          session().worker_context("WeightSync.latest"), me.transport)
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


def _deliver(links: list[Link], note: Announcement, copies: Sequence[Any] = ()) -> None:
    """Send ``note`` now to the targets that have joined; leave it, with copies of ``copies`` (its buckets, when
    they follow), to the others' links until they join."""
    waiting = [link for link in links if not link.connected]
    if waiting:
        kept = [c.copy() for c in copies]  # the caller's buffers may change after publish returns
        for link in waiting:
            link.offer(note, kept)
    ready = [link for link in links if link not in waiting]
    if ready:
        fan_out(ready, note, buckets_of(note, copies))
