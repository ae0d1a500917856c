"""The source process's side of one weight sync (:class:`Source`): it lays each version down once per transport
(:mod:`hwplace.runtime.weight_sync.transports`) for the targets linked to it, announces it on their links
(:func:`deliver`), and keeps where its newest version still lies for a target that joins late.

Imports the layers below, the planning's transport names, and the room's transports, announcements, buckets,
links and segments modules.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hwplace.config.weight_sync import DEFAULT_DEVICE_BUCKETS
from hwplace.planning.sync_plan import OTHER_NODE, SAME_DEVICE, SAME_NODE
from hwplace.runtime.weight_sync.announcements import Announcement
from hwplace.runtime.weight_sync.buckets import pack, sizes
from hwplace.runtime.weight_sync.links import Link, buckets_of, fan_out, forewarn
from hwplace.runtime.weight_sync.segments import SegmentRef
from hwplace.runtime.weight_sync.transports import OtherNode, SameDevice, SameNode


class Source:
    """The source process's side of one weight sync: its three transports, and where its newest version still
    lies for each (:meth:`newest`: what a target that joins late is offered)."""

    def __init__(self, uid: str, visible: Sequence[int] | None, bucket_bytes: int,
                 device_buckets: int = DEFAULT_DEVICE_BUCKETS) -> None:
        self.same_device = SameDevice(visible, bucket_bytes, device_buckets)
        self.same_node = SameNode(uid)
        self.bucket_bytes = bucket_bytes
        self._newest: dict[str, tuple[Announcement, list[Any]]] = {}
        self._thread: ThreadPoolExecutor | None = None
        self._thread_pid = 0  # the process that started ``_thread``: a forked child has none of its threads

    def publish(self, version: int, state_dict: Mapping[str, Any], links: Mapping[str, list[Link]],
                again: bool = False, standby: Collection[str] = (), noting: Callable[[], None] | None = None) -> None:
        """Lay ``version`` down for each transport's targets (``links``, by transport name) and announce it.

        ``standby``: transports to lay it down for even without a link now (a target of theirs is dead and may be
        restarted: :meth:`newest` offers it then). ``again``: the newest version once more, for targets linked
        again after it was first laid down. ``noting`` (noting the version in the rendezvous) runs in a thread
        while the version is laid down, and has returned before any target is told of it; its error is raised."""
        noted = self._meanwhile(noting)
        if not again:
            self._newest.clear()  # never offer an older version than the newest
        if links[SAME_DEVICE] or SAME_DEVICE in standby:
            self._newest[SAME_DEVICE] = (self.same_device.lay_down(version, state_dict), [])
            noted()
            deliver(links[SAME_DEVICE], self._newest[SAME_DEVICE][0])
        node, other = links[SAME_NODE], links[OTHER_NODE]
        to_node, to_other = bool(node) or SAME_NODE in standby, bool(other) or OTHER_NODE in standby
        if not to_node and not to_other:
            noted()
            return
        entries, buckets = pack(state_dict, self.bucket_bytes)
        lengths = sizes(entries)
        if not to_node and OTHER_NODE not in standby and all(link.connected for link in other):
            noted()
            OtherNode.stream(other, version, entries, lengths, iter(buckets))  # straight from the tensors: none kept
            return
        warned: list[Callable[[], list[Link]]] = []
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        early = None if cores < 2 else \
            lambda writing: warned.append(forewarn(node, writing))  # a core for the source and one checking target
        note, copies = self.same_node.lay_down(version, entries, lengths, buckets, to_node, to_other, early)
        reached = {link for sent in warned for link in sent()}
        noted()
        if to_node:
            self._newest[SAME_NODE] = (note, [])
            if reached and self.same_node.seal(note):  # the seal is their announcement: a target takes it from there
                for link in reached:
                    with link.lock:
                        link.sent = max(link.sent, version)
            deliver([link for link in node if link.sent < version], note)
        if to_other:
            following = OtherNode.following(note)
            self._newest[OTHER_NODE] = (following, [] if isinstance(note.where, SegmentRef) else copies)
            deliver(other, following, copies)

    def _meanwhile(self, work: Callable[[], None] | None) -> Callable[[], None]:
        """Start ``work`` in this source's thread (one, kept: a client it opens is reused); the returned call waits
        for it and raises what it raised."""
        if work is None:
            return lambda: None
        if self._thread is None or self._thread_pid != os.getpid():  # a pool inherited by a fork would never run it
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="hwplace-wsync-note")
            self._thread_pid = os.getpid()
        return self._thread.submit(work).result

    def newest(self, transport: str) -> tuple[Announcement, list[Any]] | None:
        """The newest version as it was announced to ``transport``'s targets, with its buckets when they follow
        (copies of the source's own: valid until the next publish), or None when it no longer lies anywhere for
        them: none was laid down for that transport, or (``other-node``) it was streamed from the tensors."""
        found = self._newest.get(transport)
        if found is None:
            return None
        note, copies = found
        if transport == OTHER_NODE and not copies and note.lengths and self.same_node.segments is not None:
            node = self._newest.get(SAME_NODE)
            if node is None or not isinstance(node[0].where, SegmentRef):
                return None
            copies = self.same_node.segments.views(node[0].where)  # the node's copy: intact until the next publish
        return note, copies

    def close(self) -> None:
        self._newest.clear()
        if self._thread is not None:
            self._thread.shutdown(wait=False)
        self.same_device.close()
        self.same_node.close()


def deliver(links: list[Link], note: Announcement, copies: Sequence[Any] = ()) -> None:
    """Send ``note`` now to the targets that have joined; leave it, with copies of ``copies`` (its buckets, when
    they follow), to the others' links until they join. No links: nothing to do."""
    waiting = [link for link in links if not link.connected]
    if waiting:
        kept = [c.copy() for c in copies]  # the caller's buffers may change after publish returns
        for link in waiting:
            link.offer(note, kept)
    ready = [link for link in links if link not in waiting]
    if ready:
        fan_out(ready, note, buckets_of(note, copies))
