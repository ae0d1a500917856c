"""``hwplace.WeightSync``: versioned, digest-checked weights from one source rank to the ranks of target groups.

Created on the driver once the groups run, it carries its plan (:mod:`hwplace.planning.sync_plan`) and pickles
into worker methods. ``publish`` chooses each target's transport for the version
(:func:`~hwplace.runtime.weight_sync.transports.choose`: ``same-device`` only when the tensors lie on a GPU the
target holds), lays the version down once per transport (:class:`~hwplace.runtime.weight_sync.source.Source`)
and announces it on a link to each target (:mod:`hwplace.runtime.weight_sync.links`; the target's end:
:mod:`hwplace.runtime.weight_sync.receiver`); a target takes it when it asks
(:mod:`hwplace.runtime.weight_sync.intake`), checking every bucket's digest before the version becomes its latest.
A target whose link broke is dropped, named in a warning and in ``dead_targets``; the others go on.
With restarts (SPEC §12), a link is keyed by both ends' processes (their incarnations in the group entries): the
source links again to a target its group restarted (a thread of the source watches the target groups' entries)
and offers it the newest version where that still lies (:meth:`~hwplace.runtime.weight_sync.source.Source.newest`);
a restarted source goes on from the version its predecessor noted in the rendezvous at each publish.
``close()`` lets go of everything a process holds for the sync. Imports the layers below and those modules.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.config.weight_sync import DEFAULT_BUCKET_BYTES, DEFAULT_DEVICE_BUCKETS, check_buckets
from hwplace.contracts.capabilities import Rendezvous, require
from hwplace.contracts.executor import GroupEntry
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import ConfigError, WeightSyncError
from hwplace.foundation.timeouts import wait_timeout
from hwplace.foundation.trace import SYNC, WAIT, traced
from hwplace.foundation.wording import safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.planning.sync_plan import SAME_DEVICE, TRANSPORTS, SyncPlan, SyncTarget, relayed, relays, sync_plan
from hwplace.plugin.session import session
from hwplace.runtime.messaging.communicator import check_member, find_entry
from hwplace.runtime.weight_sync.buckets import Weights, check_state_dict, state_bytes
from hwplace.runtime.weight_sync.device_share import layout_bytes
from hwplace.runtime.weight_sync.intake import Intake
from hwplace.runtime.weight_sync.links import WATCH, Link, incarnation, link_key
from hwplace.runtime.weight_sync.receiver import Receiver
from hwplace.runtime.weight_sync.relay import Relay, relayed_dead
from hwplace.runtime.weight_sync.source import Source
from hwplace.runtime.weight_sync.transports import SameDevice, SameNode, choose, source_device
from hwplace.runtime.weight_sync.versions import continued_version, note_continued, version_key


class _State:
    """One process's side of one weight sync: the source's version count, links and stores, or a target's
    receiver."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.links: dict[tuple[str, int], Link] = {}
        self.dead: dict[tuple[str, int], str] = {}  # targets whose link broke: why
        self.gone: dict[tuple[str, int], int] = {}  # the same targets: the process the broken link reached
        self.me: int | None = None  # the source's incarnation, once this process has published
        self.device: int | None = None  # the GPU the newest version's tensors lay on (None: host memory)
        self.source: Source | None = None
        self.intake: Intake | None = None
        self.relay: Relay | None = None  # on a node's relay: its side of relaying
        self.relayed: dict[int, dict[tuple[str, int], str]] = {}  # on the source: what each node's relay reported
        self.closed = False


def _states() -> dict[str, _State]:
    """This process's side of each weight sync it takes part in, by the sync's id (in the session)."""
    return session().state("weight_sync", dict)


_STATES_LOCK = threading.Lock()


def noted_version(sync: WeightSync, rendezvous: Rendezvous) -> int:
    """The newest version ``sync``'s source noted (before sending it), read from anywhere, the driver too: what a
    snapshot records, for a resumed job's source to go on from (0 when none was published)."""
    return continued_version(rendezvous, sync._uid)


def note_version(sync: WeightSync, rendezvous: Rendezvous, version: int) -> None:
    """Before ``sync``'s source first publishes: its versions go on from ``version`` (a resumed job's, from its
    snapshot), never back below one noted already."""
    note_continued(rendezvous, sync._uid, version)


class WeightSync:
    """Weights from rank ``source_rank`` of group ``source`` to every rank of the ``targets`` groups.

    ``WeightSync.create(name, source, targets, source_rank=0)`` on the driver; pass it to worker methods.
    ``sync.publish(state_dict)`` on the source returns the new version (1, 2, ...); ``sync.latest(min_version,
    timeout)`` on a target returns :class:`Weights`; ``sync.load_into(module)`` loads them into a torch module.
    ``sync.plan`` lists each target rank's group, rank, node and transport, and what the sync costs in device
    memory (a :class:`~hwplace.planning.sync_plan.SyncPlan`), ``sync.device_bytes(state_dict)`` in numbers;
    ``sync.close()`` lets go of what this process holds for it.
    """

    def __init__(self, name: str, source: str, source_rank: int, plan: SyncPlan, uid: str,
                 holds: Mapping[tuple[str, int], tuple[int, ...]] | None = None) -> None:
        self.name = name
        self.source = source
        self.source_rank = source_rank
        self.plan = plan
        self.bucket_bytes, self.device_buckets = plan.bucket_bytes, plan.device_buckets
        self._uid = uid
        self._holds = dict(holds or {})  # same-device targets: the node-local hardware ranks each holds

    @classmethod
    def create(cls, name: str, source: str, targets: Sequence[str] = ("rollout",), source_rank: int = 0,
               bucket_bytes: int | str = DEFAULT_BUCKET_BYTES, *, device_buckets: int = DEFAULT_DEVICE_BUCKETS,
               cluster: Cluster | None = None) -> WeightSync:
        """A new weight sync between running groups; ``ConfigError`` naming a group or rank that is not there, or
        a ``bucket_bytes`` or ``device_buckets`` out of bounds (:func:`~hwplace.config.weight_sync.check_buckets`).

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
        size, ring = check_buckets(bucket_bytes, device_buckets)
        entry = find_entry(executor, source)
        check_member(entry, source_rank, "source_rank")
        if source in targets:
            raise ConfigError("targets", f"include the source group {source!r}", allowed="other groups")
        placements = {t: find_entry(executor, t).placements for t in targets}
        plan = sync_plan(entry.placements[source_rank], (source, source_rank), placements, size, ring)
        holds = {(t.group, t.rank): placements[t.group][t.rank].local_hardware_ranks for t in plan
                 if t.transport == SAME_DEVICE}
        made = cls(name, source, source_rank, plan, os.urandom(8).hex(), holds)
        session().made(made)  # a job's driver records it for its snapshots (and continues its versions when resumed)
        return made

    def __repr__(self) -> str:
        targets = sorted({t.group for t in self.plan})
        return f"<WeightSync {self.name!r}: {self.source} rank {self.source_rank} -> {', '.join(targets)}>"

    def _state(self) -> _State:
        with _STATES_LOCK:
            return _states().setdefault(self._uid, _State())

    def _link(self, state: _State, target: SyncTarget, incarnation: int, context: WorkerContext) -> Link:
        """A link from this source process to process ``incarnation`` of ``target``."""
        assert state.me is not None
        member = (target.group, target.rank)
        return Link(self.name, link_key(self._uid, state.me, member, incarnation),
                    ((self.source, self.source_rank), member), context,
                    f"group {target.group!r} rank {target.rank} (node {target.node})", incarnation,
                    (context.placement.node_rank, target.node))

    def _direct(self) -> tuple[SyncTarget, ...]:
        """The targets the source links to itself: those of its node and each other node's relay."""
        return tuple(t for t in self.plan if t.direct)

    def _entries(self) -> dict[str, GroupEntry]:
        executor = session().executor
        return {group: find_entry(executor, group) for group in dict.fromkeys(t.group for t in self.plan)}

    def _start(self, state: _State, context: WorkerContext) -> None:
        """This process's first publish: the version it continues from (a restarted source's predecessor's, or
        the one a resumed job noted from its snapshot, from the rendezvous), a link to each target's current
        process, and the thread that re-links a restarted one."""
        rendezvous = session().require(Rendezvous, "weight sync")
        me = find_entry(session().executor, self.source).incarnation(self.source_rank)
        entries = self._entries()  # all found before anything is kept: a group not found leaves no half start
        state.version = continued_version(rendezvous, self._uid)  # a restarted source's, or a resumed job's
        state.me = me
        for t in self._direct():
            state.links[t.group, t.rank] = self._link(state, t, entries[t.group].incarnation(t.rank), context)
        threading.Thread(target=self._watch, args=(state, context), daemon=True,
                         name=f"hwplace-wsync-watch-{self.name}").start()

    def _watch(self, state: _State, context: WorkerContext) -> None:
        """On the source, until the sync is closed here: re-link each target whose process was restarted, without
        waiting for the next publish (it is offered the newest version where that still lies)."""
        while not state.closed:
            time.sleep(WATCH)
            try:
                entries = self._entries()
            except Exception:  # a group being shut down: the next look, or close(), settles it
                continue
            with state.lock:
                if not state.closed:
                    self._readmit(state, entries, context)

    def _standby(self, state: _State, entries: Mapping[str, GroupEntry], device: int | None) -> set[str]:
        """The transports of the dead targets that their groups may restart: each version is laid down for them
        too, for the source to offer the newest to a restarted one (for ``other-node``, a copy it keeps)."""
        return {choose(t.transport, self._holds.get((t.group, t.rank), ()), device) for t in self.plan
                if (t.group, t.rank) in state.dead and entries[t.group].state(t.rank) != "dead"}

    def _readmit(self, state: _State, entries: Mapping[str, GroupEntry], context: WorkerContext,
                 state_dict: Mapping[Any, Any] | None = None, standby: set[str] | None = None) -> None:
        """Under the lock: a new link to each target whose group runs a new process of it (the old link, broken
        or not, reached the one that died), offered the newest version where it still lies for its transport;
        during a publish (``state_dict`` given), laid down again where it does not, and for ``standby``."""
        missed: dict[str, list[Link]] = {name: [] for name in TRANSPORTS}
        for t in self._direct():
            member = (t.group, t.rank)
            link = state.links.get(member)
            was = link.incarnation if link is not None else state.gone.get(member)
            now = entries[t.group].incarnation(t.rank)
            if was is None or now == was or entries[t.group].state(t.rank) == "dead":
                continue
            if link is not None:
                link.close()
            state.dead.pop(member, None)
            state.gone.pop(member, None)
            fresh = state.links[member] = self._link(state, t, now, context)
            transport = choose(t.transport, self._holds.get(member, ()), state.device)
            newest = None if state.source is None or not state.version else state.source.newest(transport)
            if newest is not None:
                note, copies = newest
                fresh.offer(note, [c.copy() for c in copies])  # the source's buffers change at the next publish
            else:
                missed[transport].append(fresh)
        if state_dict is not None and state.source is not None:
            lay = {name for name in standby or () if state.source.newest(name) is None}
            if lay or any(missed.values()):
                state.source.publish(state.version, state_dict, missed, again=True, standby=lay)

    @traced("weights.publish", SYNC, lambda sync, state_dict: {"sync": sync.name, "bytes": state_bytes(state_dict)})
    def publish(self, state_dict: Mapping[Any, Any]) -> int:
        """Send ``state_dict`` (names to torch tensors or numpy arrays) to every target; returns its version.

        Keys are strings or ints, kept as they are; an ``nn.Parameter`` arrives as one. A value that would not
        arrive as it left (a meta, sparse, nested or quantized tensor, an array of objects, a masked array) or
        another key is a :class:`hwplace.WeightSyncError` naming the key, and nothing is sent."""
        context = session().worker_context("WeightSync.publish")
        if (context.group, context.rank) != (self.source, self.source_rank):
            raise WeightSyncError(f"weight sync {self.name!r}: publish runs on its source, group {self.source!r} "
                                  f"rank {self.source_rank}, not on group {context.group!r} rank {context.rank}")
        check_state_dict(state_dict)  # what cannot travel exactly is refused by key, before anything is sent
        state = self._state()
        with state.lock:
            self._check_open(state)
            if state.me is None:
                self._start(state, context)
            visible = context.placement.visible_accelerators or None
            device = source_device(state_dict, visible)
            self._bury(state)
            standby: set[str] = set()
            if state.dead:  # only then a look at the targets' groups: one restarted may be linked again at once
                entries = self._entries()
                self._readmit(state, entries, context)
                standby = self._standby(state, entries, device)
            version, rendezvous = state.version + 1, session().require(Rendezvous, "weight sync")
            links: dict[str, list[Link]] = {name: [] for name in TRANSPORTS}
            for t in self._direct():
                link = state.links.get((t.group, t.rank))
                if link is not None:
                    links[choose(t.transport, self._holds.get((t.group, t.rank), ()), device)].append(link)
            state.source = state.source or Source(self._uid, visible, self.bucket_bytes, self.device_buckets)
            dead = len(state.dead)
            state.source.publish(version, state_dict, links, standby=standby, noting=lambda: rendezvous.kv_put(
                version_key(self._uid), str(version).encode()))  # noted while it is laid down, before it is announced
            state.version, state.device = version, device
            self._bury(state)
            if len(state.dead) > dead:  # a target died: if its group restarted it already, it gets this version
                entries = self._entries()
                self._readmit(state, entries, context, state_dict, self._standby(state, entries, device))
            return version

    def _bury(self, state: _State) -> None:
        """Drop the links that broke, each named in a warning and in :attr:`dead_targets`; the others go on. A
        relay that reported ranks of its node dead: each one newly dead is named in a warning too."""
        for key, link in list(state.links.items()):
            if link.reported and link.pair is not None:
                link.reported = False
                rendezvous = session().require(Rendezvous, "weight sync")
                now = relayed_dead(rendezvous, self._uid, [link.pair[1]])
                for member, why in now.items():
                    if member not in state.relayed.get(link.pair[1], {}):
                        warnings.warn(f"{why}; it gets no more versions, the other targets do", RuntimeWarning,
                                      stacklevel=3)
                state.relayed[link.pair[1]] = now
            if link.error is not None:
                del state.links[key]
                state.dead[key] = str(link.error)
                state.gone[key] = link.incarnation
                link.close()
                warnings.warn(f"{link.error}; it gets no more versions, the other targets do", RuntimeWarning,
                              stacklevel=3)

    @property
    def dead_targets(self) -> dict[tuple[str, int], str]:
        """On the source: the targets (group, rank) whose link broke, each with why; they get no more versions
        unless their group restarts them (a restarted target is linked again and leaves this list). A target
        on another node is its relay's to link: the relay reports it (one look in the rendezvous per node)."""
        state = self._state()
        with state.lock:
            dead = dict(state.dead)
        nodes = sorted(relays(self.plan))
        if nodes:
            dead.update(relayed_dead(session().require(Rendezvous, "weight sync"), self._uid, nodes))
        return dead

    def device_bytes(self, model: int | Mapping[Any, Any]) -> dict[str, int]:
        """The most GPU memory this sync takes besides the model, by holder: ``"source"`` (its ring, when a target
        shares its GPU) and ``"<group> <rank>"`` for each same-device target (its copy with ``latest()``), for
        ``model``: a state dict, or its bytes as buckets lay them out (a little more than their sum:
        :func:`~hwplace.runtime.weight_sync.device_share.layout_bytes`): what ``sync.plan`` states."""
        return self.plan.device_bytes(model if isinstance(model, int) else layout_bytes(model))

    def close(self) -> None:
        """Let go of everything this process holds for the sync: on the source its device buckets, segments and
        links, on a target its link, kept version and mappings. Idempotent; the sync is closed in this process."""
        state = self._state()
        with state.lock:
            state.closed = True
            for link in state.links.values():
                link.close()
            state.links.clear()
            if state.source is not None:
                state.source.close()
                state.source = None
            intake, state.intake = state.intake, None
            relay, state.relay = state.relay, None
        if intake is not None:
            intake.close()
        if relay is not None:
            relay.close()

    def _check_open(self, state: _State) -> None:
        if state.closed:
            raise WeightSyncError(f"weight sync {self.name!r} is closed in this process (close() was called)")

    def _me(self, what: str) -> SyncTarget:
        context = session().worker_context(what)
        for target in self.plan:
            if (target.group, target.rank) == (context.group, context.rank):
                return target
        groups = ", ".join(sorted({t.group for t in self.plan}))
        raise WeightSyncError(f"weight sync {self.name!r}: {what} runs on a rank of its targets ({groups}), not on "
                              f"group {context.group!r} rank {context.rank}")

    @traced("weights.latest", WAIT, lambda sync, *_, **__: {"sync": sync.name})
    def latest(self, min_version: int = 0, timeout: float | None = None) -> Weights:
        """The newest version that arrived intact, waiting (up to ``timeout`` s) for one at least ``min_version``.

        A version whose buckets do not match their digests raises :class:`hwplace.WeightSyncError` (once); the
        previous version stays the one returned. ``timeout`` None or ``float("inf")`` waits without end; a bad one
        (negative, NaN, not a number) is a :class:`hwplace.ConfigError` naming it.
        """
        if isinstance(min_version, bool) or not isinstance(min_version, int) or min_version < 0:
            raise WeightSyncError(f"min_version is a version number (0 or more), got {safe_repr(min_version)}")
        return self._intake("WeightSync.latest").latest(min_version, wait_timeout(timeout))

    def _intake(self, what: str) -> Intake:
        me = self._me(what)
        state = self._state()
        with state.lock:
            self._check_open(state)
            if state.intake is None:
                context = session().worker_context(what)
                visible = context.placement.visible_accelerators or None
                mine = incarnation(me.group, me.rank)
                if me.direct:
                    upstream, uid, what_upstream = (self.source, self.source_rank), self._uid, "the source"
                else:
                    assert me.relay is not None
                    upstream, uid = me.relay, f"{self._uid}.relay"
                    what_upstream = f"its node's relay, group {me.relay[0]!r} rank {me.relay[1]} (node {me.node})"
                if me.relays:
                    state.relay = Relay(self.name, self._uid, me, relayed(self.plan, me.relay or upstream), context)

                def key(source: int) -> str:
                    return link_key(uid, source, (me.group, me.rank), mine)

                receiver = Receiver(self.name, key, (upstream, (me.group, me.rank)), context, what_upstream,
                                    state.relay.receive if state.relay is not None else None)
                if state.relay is not None:
                    state.relay.report = receiver.report
                state.intake = Intake(self.name, receiver, SameDevice(visible), SameNode(self._uid))
            return state.intake

    @traced("weights.load_into", SYNC, lambda sync, *_, **__: {"sync": sync.name})
    def load_into(self, module: Any, min_version: int = 0, timeout: float | None = None) -> int:
        """Load the latest weights into a torch module (``load_state_dict``); returns their version. A version on
        this GPU (``same-device``) is copied from the source's buckets straight into the module's parameters."""
        if isinstance(min_version, bool) or not isinstance(min_version, int) or min_version < 0:
            raise WeightSyncError(f"min_version is a version number (0 or more), got {safe_repr(min_version)}")
        return self._intake("WeightSync.load_into").load_into(module, min_version, wait_timeout(timeout))
