"""What an executor may do beyond its core: optional capabilities, each a small contract of its own.

The core (:class:`hwplace.contracts.executor.Executor`) discovers nodes, hands out ports, starts groups and
says where a group's ranks run. The rest is optional, and an executor says what it offers by subclassing
these classes beside :class:`Executor`:

- :class:`ChannelHosting`: hosts channels (``hwplace.Channel``);
- :class:`Rendezvous`: a small key-value store shared by the cluster's processes (weight sync and messaging
  build their communicators through it);
- :class:`Leases`: a registry of running groups that leases devices to jobs, for shared clusters and
  ``hwplace status``;
- :class:`TurnArbitration`: a turn arbiter on each node where groups share accelerators (``Worker.turn``);
- :class:`LocalClusters`: starts a throwaway multi-node cluster on this machine (``hwplace run --nodes``,
  ``hwplace.testing.local_ray_cluster``);
- :class:`Restarts`: notices a worker process's death and starts it again in place (``launch(...,
  restart=hwplace.Restart(...))``, SPEC §12).

A feature that needs one calls :func:`require` where it starts (``Channel.create``, ``WeightSync.create``,
``launch``), so an executor without it is a :class:`~hwplace.errors.PluginError` naming the executor and the
capability there, never a failure deep inside a worker. Contracts and records only; imports the foundation.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from hwplace.contracts.executor import GroupRuntime, Handle
from hwplace.contracts.records import Placement
from hwplace.contracts.registry import GroupRecord, WorkerRecord
from hwplace.foundation.errors import PluginError


class Capability:
    """Base of every optional capability: ``feature`` says what it enables, for the error an executor without
    it gets; ``methods`` lists what an executor implements to offer it."""

    feature: ClassVar[str] = ""
    methods: ClassVar[tuple[str, ...]] = ()


class ObjectStore:
    """How a channel's payloads travel; an executor subclasses it. Instances must pickle.

    Items pickle with :meth:`dumps` and travel inside the channel's messages, except large ones: those go
    by :meth:`stash` into the executor's object store, handed to the channel's host, and the message carries
    only their key; the consumer gets them back with :meth:`fetch`.
    """

    def dumps(self, item: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
        """Pickle ``item`` (protocol 5, large buffers out of band through ``buffer_callback``)."""
        return pickle.dumps(item, protocol=5, buffer_callback=buffer_callback)

    def stash(self, item: Any) -> bytes:
        """Put ``item`` in the object store, held by the channel's host; returns its 16-byte key."""
        raise NotImplementedError(f"{type(self).__name__}.stash")

    def node(self) -> str:
        """The executor's id of the node this process runs on, as :attr:`ChannelAddress.node` names a host's; ""
        (the default) when it does not say: then no item goes by the same-node lane (:mod:`hwplace.channels.lane`)."""
        return ""

    def fetch(self, keys: Sequence[bytes], keep: bool = False) -> list[Any]:
        """Take the stashed items of ``keys`` from the channel's host, in order.

        With ``keep`` (items taken with ``ack=False``), the host keeps holding them, to hand them out again if
        their taker dies; it lets them go when the channel's server tells it (its ``on_drop``), once they are
        acknowledged. Called with ``keep`` only for such items.
        """
        raise NotImplementedError(f"{type(self).__name__}.fetch")


@dataclass(frozen=True)
class ChannelAddress:
    """Where a channel's host serves (a :class:`hwplace.executor.ChannelServer`) and how to reach it; it pickles.

    ``where`` describes the host's place for messages (``"node 10.0.0.2"``).
    """

    name: str
    host: str
    port: int
    token: bytes
    maxsize: int
    where: str
    store: ObjectStore
    node: str = ""
    """The executor's id of the host's node (see :meth:`ObjectStore.node`): a producer there puts large items
    through the same-node lane; "" for none."""


class ChannelHosting(Capability):
    """Hosts channels: starts a channel's host on a node and finds it again by name."""

    feature: ClassVar[str] = "host channels (hwplace.Channel)"
    methods: ClassVar[tuple[str, ...]] = ("create_channel", "connect_channel")

    def create_channel(self, name: str, maxsize: int, group: str | None, rank: int) -> ChannelAddress:
        """Start the host of a new channel, serving a :class:`hwplace.executor.ChannelServer`, and return its
        address.

        The host runs on the node of ``group``'s worker ``rank``, or on this process's node when ``group`` is
        ``None``. A name in use is a ``ConfigError``.
        """
        raise NotImplementedError(f"{type(self).__name__}.create_channel")

    def connect_channel(self, name: str) -> ChannelAddress:
        """The address of the channel called ``name``; ``ConfigError`` naming the channels there are if none."""
        raise NotImplementedError(f"{type(self).__name__}.connect_channel")


class Rendezvous(Capability):
    """A small key-value store shared by every process of the cluster, where communicators meet."""

    feature: ClassVar[str] = "sync weights and send messages between workers (their communicators meet through it)"
    methods: ClassVar[tuple[str, ...]] = ("kv_put", "kv_wait")

    def kv_put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` in a small key-value store shared by the cluster's processes."""
        raise NotImplementedError(f"{type(self).__name__}.kv_put")

    def kv_wait(self, key: str, timeout: float) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for a process to store it (``TimeoutError``)."""
        raise NotImplementedError(f"{type(self).__name__}.kv_wait")


class Leases(Capability):
    """A registry of the cluster's running groups that leases their devices to their job."""

    feature: ClassVar[str] = "lease devices to jobs (shared clusters) and report hwplace status"
    methods: ClassVar[tuple[str, ...]] = ("register_group", "deregister_group", "update_workers", "cluster_status")

    def register_group(self, record: GroupRecord) -> None:
        """Record a group about to start in the cluster's registry, leasing its devices to this job.

        Raises ``PlacementError`` naming the device, its node and the holder (job and group) when another live
        job holds one of ``record.leases``, and records nothing then; groups of one job may share devices. The
        leases last until :meth:`deregister_group` or the end of this job's driver, however it ends.
        """
        raise NotImplementedError(f"{type(self).__name__}.register_group")

    def deregister_group(self, group: str) -> None:
        """Forget this job's group ``group`` and end its leases; a name not registered is no error."""
        raise NotImplementedError(f"{type(self).__name__}.deregister_group")

    def update_workers(self, group: str, workers: Sequence[WorkerRecord]) -> None:
        """The workers of this job's running group ``group`` changed state (a restart, a death): keep their new
        records for ``hwplace status``; the group's leases stay as they are. A name not registered is no error."""
        raise NotImplementedError(f"{type(self).__name__}.update_workers")

    def cluster_status(self, address: str | None) -> dict[str, Any]:
        """What runs on the cluster at ``address`` (the one this process is connected to, or would connect to,
        when ``None``), for ``hwplace status``: a JSON-ready mapping with the keys ``cluster`` (``address``,
        ``nodes``), ``jobs``, ``groups``, ``leases`` and ``channels``, each a list of mappings (see
        ``docs/guide.md``). Jobs whose driver has ended are left out, with their groups and leases.
        """
        raise NotImplementedError(f"{type(self).__name__}.cluster_status")


@dataclass(frozen=True)
class TurnAddress:
    """Where a node's turn arbiter (a :class:`hwplace.executor.TurnServer`) listens, and its token."""

    host: str
    port: int
    token: str


class TurnArbitration(Capability):
    """Runs a turn arbiter on each node where groups share accelerators."""

    feature: ClassVar[str] = "take turns on shared accelerators (Worker.turn) for groups whose placements share them"
    methods: ClassVar[tuple[str, ...]] = ("turn_arbiter",)

    def turn_arbiter(self, placement: Placement) -> TurnAddress | None:
        """In a worker process: the turn arbiter of the node of ``placement`` (the worker's own), or ``None`` when
        there is none (no group
        shares an accelerator there; ``turn()`` then costs nothing). The executor runs a
        :class:`hwplace.executor.TurnServer` on each node where it starts groups whose placements share
        accelerators with other groups."""
        raise NotImplementedError(f"{type(self).__name__}.turn_arbiter")


class LocalClusters(Capability):
    """Starts a throwaway cluster of several nodes on this machine, for rehearsals and tests."""

    feature: ClassVar[str] = "start a throwaway local cluster (hwplace run --nodes, hwplace.testing.local_ray_cluster)"
    methods: ClassVar[tuple[str, ...]] = ("local_cluster",)

    def local_cluster(self, node_envs: Sequence[Mapping[str, str]], *,
                      cpus_per_node: int) -> AbstractContextManager[str]:
        """A context manager that starts one node on this machine per entry of ``node_envs``, node ``i`` with the
        environment ``node_envs[i]`` (hwplace puts its node rank and fake accelerators there), each offering
        ``cpus_per_node`` CPUs; it connects this process, yields the cluster's address and stops every process
        it started on exit. No other process finds the cluster by itself (a plain ``ray.init()`` does not)."""
        raise NotImplementedError(f"{type(self).__name__}.local_cluster")


class Restarts(Capability):
    """Notices when a worker process of a group it started dies, and starts it again in place."""

    feature: ClassVar[str] = "restart workers in place (launch(..., restart=hwplace.Restart(...)))"
    methods: ClassVar[tuple[str, ...]] = ("watch", "restart", "gave_up")

    def watch(self, runtime: GroupRuntime, on_death: Callable[[int, str], bool]) -> None:
        """From now on, call ``on_death(rank, cause)`` once for each process of ``runtime`` (a group this
        executor started) that dies of any cause, except those that ``shutdown`` or :meth:`restart` stop: from a
        thread of the executor's own, as soon as the death is seen, by a watcher or by a call the death ended,
        whichever comes first. ``on_death`` answers whether the rank will be restarted; the ``WorkerError`` of
        each call that the death ended carries that answer as ``restarted``."""
        raise NotImplementedError(f"{type(self).__name__}.watch")

    def restart(self, runtime: GroupRuntime, ranks: Sequence[int], attempt: int, cause: str) -> Handle:
        """Start each rank of ``ranks`` again from its :class:`~hwplace.contracts.executor.WorkerSpec`: the same
        node, devices, environment and constructor arguments, with ``WorkerContext.attempt`` and ``cause`` set
        (a process of those ranks still alive is stopped first). Calls made from now on reach the new processes.
        Returns a handle on their constructors, as ``GroupRuntime.ready`` does."""
        raise NotImplementedError(f"{type(self).__name__}.restart")

    def gave_up(self, runtime: GroupRuntime, rank: int) -> None:
        """The group gave ``rank`` up for good after a :meth:`restart` of it failed (its constructor or
        ``on_restart`` raised, its node is gone, or nothing could start) and no restarts are left: show the rank
        ``dead`` to the group's peers from now on (``GroupEntry.states``), as after a death ``on_death`` answered
        ``False`` to, so that a peer's ``recv`` or weight sync fails naming it rather than waiting for it."""
        raise NotImplementedError(f"{type(self).__name__}.gave_up")


CAPABILITIES: tuple[type[Capability], ...] = (ChannelHosting, Rendezvous, Leases, TurnArbitration, LocalClusters,
                                              Restarts)

C = TypeVar("C", bound=Capability)


def require(executor: object, capability: type[C], where: str = "") -> C:
    """``executor`` as a ``capability``; a :class:`PluginError` naming both when it does not offer it.

    ``where`` names the feature that asked (``"Channel.create"``) for the message.
    """
    if isinstance(executor, capability):
        return executor
    name = getattr(executor, "name", "") or type(executor).__name__
    asked = f"{where}: " if where else ""
    raise PluginError(f"{asked}the executor {name!r} cannot {capability.feature}: it does not implement "
                      f"hwplace.executor.{capability.__name__} ({', '.join(capability.methods)})",
                      plugins=(str(name),))


def capabilities_of(executor: object) -> tuple[str, ...]:
    """The names of the capabilities ``executor`` offers, in :data:`CAPABILITIES` order."""
    return tuple(c.__name__ for c in CAPABILITIES if isinstance(executor, c))
