"""``hwplace.WeightSync``: versioned, digest-checked weights from one source rank to the ranks of target groups.

Created on the driver once the groups run, it carries its plan (:mod:`hwplace.planning.sync_plan`) and the
executor's :class:`~hwplace.executor.VersionBoard`, and pickles into worker methods. ``publish`` packs the
state dict into buckets (:mod:`hwplace.runtime.buckets`), one at a time into the object store (one copy, on the
source's node), then posts the version. Targets on that node map the buckets from the object store (shared
memory: no copy) once they check every digest; targets on other nodes take part in a broadcast
(:mod:`hwplace.runtime.weight_stream`). Imports the layers below and those modules.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from hwplace.contracts.executor import VersionBoard
from hwplace.foundation.errors import ConfigError, WeightSyncError
from hwplace.foundation.wording import safe_repr
from hwplace.planning.sync_plan import BROADCAST, SyncTarget, plan_sync
from hwplace.plugin.current import current_executor
from hwplace.runtime.buckets import DEFAULT_BUCKET_BYTES, INLINE_BYTES, Entry, Manifest, Weights, check, pack, unpack
from hwplace.runtime.communicator import check_member, find_entry
from hwplace.runtime.current import worker_context
from hwplace.runtime.weight_stream import Receiver, Sender


class _State:
    """One process's side of one weight sync: the source's version count and sender, a target's kept version."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.sender: Sender | None = None
        self.receiver: Receiver | None = None
        self.kept: Weights | None = None
        self.bad: set[int] = set()


_states: dict[str, _State] = {}
_states_lock = threading.Lock()


class WeightSync:
    """Weights from rank ``source_rank`` of group ``source`` to every rank of the ``targets`` groups.

    ``WeightSync.create(name, source, targets, source_rank=0)`` on the driver; pass it to worker methods.
    ``sync.publish(state_dict)`` on the source returns the new version (1, 2, ...); ``sync.latest(min_version,
    timeout)`` on a target returns :class:`Weights`; ``sync.load_into(module)`` loads them into a torch module.
    ``sync.plan`` lists each target rank's group, rank, node and transport.
    """

    def __init__(self, name: str, source: str, source_rank: int, plan: tuple[SyncTarget, ...],
                 board: VersionBoard, uid: str, bucket_bytes: int, members: tuple[tuple[str, int], ...]) -> None:
        self.name = name
        self.source = source
        self.source_rank = source_rank
        self.plan = plan
        self.bucket_bytes = bucket_bytes
        self._board = board
        self._uid = uid
        self._members = members  # the broadcast's members: the source, then the targets on other nodes
        self._on_node = any(t.transport != BROADCAST for t in plan)  # targets that read the board and the store

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
        members = ((source, source_rank), *((t.group, t.rank) for t in plan if t.transport == BROADCAST))
        board = executor.create_board(name, source, source_rank)
        return cls(name, source, source_rank, plan, board, os.urandom(8).hex(), bucket_bytes, members)

    def __repr__(self) -> str:
        targets = sorted({t.group for t in self.plan})
        return f"<WeightSync {self.name!r}: {self.source} rank {self.source_rank} -> {', '.join(targets)}>"

    def _state(self) -> _State:
        with _states_lock:
            return _states.setdefault(self._uid, _State())

    def publish(self, state_dict: Mapping[str, Any]) -> int:
        """Send ``state_dict`` (names to torch tensors or numpy arrays) to every target; returns its version."""
        context = worker_context("WeightSync.publish")
        if (context.group, context.rank) != (self.source, self.source_rank):
            raise WeightSyncError(f"weight sync {self.name!r}: publish runs on its source, group {self.source!r} "
                                  f"rank {self.source_rank}, not on group {context.group!r} rank {context.rank}")
        state = self._state()
        with state.lock:
            if state.sender is not None and state.sender.error is not None:
                raise state.sender.error
            if len(self._members) > 1 and state.sender is None:
                state.sender = Sender(self.name, self._uid, self._members, self._board, context)
            version = state.version + 1
            entries, buckets = pack(state_dict, self.bucket_bytes)
            if state.sender is not None and state.sender.connected and not self._on_node:
                state.sender.stream(version, entries, buckets)  # from the tensors themselves, no copy
            else:
                manifest = self._store(version, entries, buckets)
                if state.sender is not None:
                    state.sender.offer(manifest)
                if self._on_node:
                    self._board.post(version, manifest)
            state.version = version
            return version

    def _store(self, version: int, entries: list[Entry], buckets: Iterator[tuple[Any, str]]) -> Manifest:
        """The version's manifest, its buckets copied: in the manifest itself when they are small, else one at a
        time into the object store (one copy on this node)."""
        inline = sum(e.nbytes for e in entries) <= INLINE_BYTES
        kept, digests = [], []
        for bucket, digest in buckets:  # one bucket in this process at a time
            kept.append(bucket.copy() if inline else self._board.share(bucket))
            digests.append(digest)
        if inline:
            return Manifest(version, tuple(entries), tuple(digests), (), tuple(kept))
        return Manifest(version, tuple(entries), tuple(digests), tuple(kept))

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
        if me.transport == BROADCAST:
            with state.lock:
                if state.receiver is None:
                    state.receiver = Receiver(self.name, self._uid, self._members, worker_context("latest"))
            return state.receiver.latest(min_version, timeout)
        version, manifest = self._board.wait(max(min_version, 1), timeout)
        with state.lock:
            kept = state.kept
            if kept is not None and kept.version == version:
                return kept
            if version in state.bad and kept is not None and kept.version >= min_version:
                return kept
            buffers = list(manifest.inline) if manifest.inline else self._board.fetch(manifest.refs)
            try:
                check(buffers, manifest.digests, f"weight sync {self.name!r} version {version}")
            except WeightSyncError:
                state.bad.add(version)
                raise
            state.kept = Weights(version, MappingProxyType(unpack(manifest.entries, buffers)))
            return state.kept

    def load_into(self, module: Any, min_version: int = 0, timeout: float | None = None) -> int:
        """Load the latest weights into a torch module (``load_state_dict``); returns their version."""
        weights = self.latest(min_version, timeout)
        module.load_state_dict(dict(weights.tensors))
        return weights.version
