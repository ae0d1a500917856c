"""The executor contract: what an executor plugin implements to discover nodes and run workers on them.

The built-in one is Ray (``plugins/ray``); ``cluster.executor`` in the config names the one to use. Subclass
:class:`Executor` (and :class:`GroupRuntime`, :class:`Handle`, :class:`ObjectStore`); the functions an
executor calls on nodes and in worker processes are gathered for its authors in :mod:`hwplace.executor`.
Contracts and records only; imports the foundation and the other contracts.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hwplace.contracts.hardware import PLUGIN_NAME
from hwplace.contracts.records import Node, Placement
from hwplace.contracts.registry import GroupRecord
from hwplace.foundation.wording import safe_repr

if TYPE_CHECKING:
    from hwplace.config.records import ClusterConfig
    from hwplace.plugin.manager import PluginManager
    from hwplace.runtime.worker import Worker


class Handle:
    """A call in flight on one or more workers of a group; its results come back in rank order.

    ``wait(timeout=None)`` returns them, raising :class:`hwplace.WorkerError` for the first rank that failed
    and ``TimeoutError`` when ``timeout`` seconds elapse (the call goes on, and ``wait`` may be called again).
    ``done()`` says whether every rank has answered; ``await handle`` waits inside async code;
    ``cancel(force=False)`` stops the call.
    """

    def wait(self, timeout: float | None = None) -> list[Any]:
        raise NotImplementedError(f"{type(self).__name__}.wait")

    def done(self) -> bool:
        raise NotImplementedError(f"{type(self).__name__}.done")

    @property
    def num_done(self) -> int:
        """How many ranks have answered so far."""
        raise NotImplementedError(f"{type(self).__name__}.num_done")

    async def wait_async(self) -> list[Any]:
        """``wait()`` for async code; ``await handle`` calls it."""
        raise NotImplementedError(f"{type(self).__name__}.wait_async")

    def cancel(self, force: bool = False) -> bool:
        """Stop the call on every rank where it still runs; ``True`` when it was stopped there.

        An ``async def`` method is interrupted (the worker sees ``asyncio.CancelledError``) and waiting then
        raises :class:`hwplace.CallCancelled`. A plain method cannot be interrupted: this returns ``False``,
        unless ``force`` ends the workers running it (waiting then raises ``WorkerError``: the process died).
        ``False`` too when the call had already finished everywhere.
        """
        raise NotImplementedError(f"{type(self).__name__}.cancel")

    def __await__(self) -> Generator[Any, None, list[Any]]:
        return self.wait_async().__await__()


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process is started with.

    ``process_env`` (the group's ``env_configs``) and ``python_interpreter_path`` take effect when the process
    starts; ``env`` (``process_env`` again, then the isolation and torch.distributed variables) is set in the
    process before the worker class is loaded, so nothing the runtime changed in between survives.
    """

    placement: Placement
    node: Node
    env: Mapping[str, str]
    process_env: Mapping[str, str]
    python_interpreter_path: str | None


@dataclass(frozen=True)
class GroupRequest:
    """A group to start: its name, worker class, constructor arguments and one spec per rank."""

    name: str
    worker_class: type[Worker]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    workers: Sequence[WorkerSpec]


class GroupRuntime:
    """The running workers of one group, as an executor holds them."""

    def ready(self) -> Handle:
        """A handle on the constructors: its ``wait`` raises ``WorkerError`` for a rank whose constructor failed."""
        raise NotImplementedError(f"{type(self).__name__}.ready")

    def call(self, ranks: Sequence[int], method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Handle:
        """Call ``method`` on the workers of ``ranks``, without waiting."""
        raise NotImplementedError(f"{type(self).__name__}.call")

    def shutdown(self) -> None:
        """Stop every worker and free the group's name."""
        raise NotImplementedError(f"{type(self).__name__}.shutdown")

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

    def fetch(self, keys: Sequence[bytes]) -> list[Any]:
        """Take the stashed items of ``keys`` from the channel's host, in order."""
        raise NotImplementedError(f"{type(self).__name__}.fetch")


@dataclass(frozen=True)
class TurnAddress:
    """Where a node's turn arbiter (a :class:`hwplace.executor.TurnServer`) listens, and its token."""

    host: str
    port: int
    token: str


@dataclass(frozen=True)
class GroupEntry:
    """A running group as its executor lists it for other processes: ``launch_id`` is unique to this launch
    (a group relaunched under its name gets a new one), ``placements`` and node ``addresses`` are in rank order."""

    name: str
    launch_id: str
    placements: tuple[Placement, ...]
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class ChannelAddress:
    """Where a channel's host serves (a :class:`~hwplace.executor.ChannelServer`) and how to reach it; it pickles.

    ``where`` describes the host's place for messages (``"node 10.0.0.2"``).
    """

    name: str
    host: str
    port: int
    token: bytes
    maxsize: int
    where: str
    store: ObjectStore


class Executor:
    """Base class of an executor plugin; subclass it and return an instance from ``hwplace_executors()``.

    An executor imports its runtime (Ray, ...) only when one of its methods is called, never at import.
    """

    name: ClassVar[str] = ""

    def discover(self, config: ClusterConfig, plugin_manager: PluginManager) -> list[Node]:
        """Connect to (or start) the runtime ``config.address`` names and return its live nodes, in rank order.

        Each node's hardware is what every registered backend detects on that node, plus the devices
        ``config`` declares for it. Fewer live nodes than ``config.num_nodes`` raises ``ConfigError``.
        """
        raise NotImplementedError(f"{type(self).__name__}.discover")

    def free_port(self, node: Node) -> int:
        """A TCP port free on ``node`` now (the group's ``MASTER_PORT``, picked on rank 0's node)."""
        raise NotImplementedError(f"{type(self).__name__}.free_port")

    def start_group(self, request: GroupRequest) -> GroupRuntime:
        """Start one worker per spec, each on its node; a name already in use is a ``ConfigError``.

        Returns without waiting for the constructors (``GroupRuntime.ready`` does).
        """
        raise NotImplementedError(f"{type(self).__name__}.start_group")

    def create_channel(self, name: str, maxsize: int, group: str | None, rank: int) -> ChannelAddress:
        """Start the host of a new channel, serving a :class:`~hwplace.executor.ChannelServer`, and return its address.

        The host runs on the node of ``group``'s worker ``rank``, or on this process's node when ``group`` is
        ``None``. A name in use is a ``ConfigError``.
        """
        raise NotImplementedError(f"{type(self).__name__}.create_channel")

    def connect_channel(self, name: str) -> ChannelAddress:
        """The address of the channel called ``name``; ``ConfigError`` naming the channels there are if none."""
        raise NotImplementedError(f"{type(self).__name__}.connect_channel")

    def turn_arbiter(self, placement: Placement) -> TurnAddress | None:
        """In a worker process: the turn arbiter of the worker's node, or ``None`` when there is none (no group
        shares an accelerator there; ``turn()`` then costs nothing). An executor that starts groups whose
        placements share accelerators with other groups runs a :class:`~hwplace.executor.TurnServer` on each
        such node."""
        return None

    def find_group(self, name: str) -> GroupEntry | None:
        """The running group called ``name`` (from any process of the cluster), or ``None``."""
        raise NotImplementedError(f"{type(self).__name__}.find_group")

    def kv_put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` in a small key-value store shared by the cluster's processes."""
        raise NotImplementedError(f"{type(self).__name__}.kv_put")

    def kv_wait(self, key: str, timeout: float) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for a process to store it (``TimeoutError``)."""
        raise NotImplementedError(f"{type(self).__name__}.kv_wait")

    def where(self) -> str:
        """The cluster this process is connected to, in a few words (``"Ray cluster at 10.0.0.1:6379"``), for
        ``hwplace run`` to say where it runs before it places anything."""
        raise NotImplementedError(f"{type(self).__name__}.where")

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

    def cluster_status(self, address: str | None) -> dict[str, Any]:
        """What runs on the cluster at ``address`` (the one this process is connected to, or would connect to,
        when ``None``), for ``hwplace status``: a JSON-ready mapping with the keys ``cluster`` (``address``,
        ``nodes``), ``jobs``, ``groups``, ``leases`` and ``channels``, each a list of mappings (see
        ``docs/guide.md``). Jobs whose driver has ended are left out, with their groups and leases.
        """
        raise NotImplementedError(f"{type(self).__name__}.cluster_status")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def check_executor(executor: object) -> str | None:
    """Say what is wrong with an executor object a plugin returned, or ``None`` when it is usable."""
    if not isinstance(executor, Executor):
        return f"{safe_repr(executor)} is not a hwplace.Executor"
    try:
        name = executor.name
    except Exception as exc:
        return f"reading {type(executor).__name__}.name raised {safe_repr(exc)}"
    if not isinstance(name, str) or not PLUGIN_NAME.match(name):
        return (f"{type(executor).__name__}.name is {safe_repr(name)}; an executor name is 1 to 64 lower-case "
                "letters, digits, '.', '_' and '-'")
    return None
