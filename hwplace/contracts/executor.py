"""The executor contract: what every executor plugin implements to discover nodes and run workers on them.

The built-in one is Ray (``plugins/ray``); ``cluster.executor`` in the config names the one to use. Subclass
:class:`Executor` (and :class:`GroupRuntime`, :class:`Handle`): its core is :data:`CORE_METHODS`, what every
executor must do. What it may do besides (host channels, a rendezvous, leases, turns, local clusters) are the
capabilities of :mod:`hwplace.contracts.capabilities`. The functions an executor calls on nodes and in worker
processes are gathered for its authors in :mod:`hwplace.executor`. Contracts and records only; imports the
foundation and the other contracts, and names what it needs of the layers above as protocols of its own
(:class:`ClusterSpec`, :class:`BackendRegistry`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from hwplace.contracts.hardware import PLUGIN_NAME
from hwplace.contracts.records import Node, Placement
from hwplace.foundation.wording import safe_repr


class ClusterSpec(Protocol):
    """What an executor reads of the validated ``cluster:`` section (``hwplace.config.records.ClusterConfig``)."""

    @property
    def num_nodes(self) -> int: ...

    @property
    def address(self) -> str | None: ...

    def declared_configs(self, node_rank: int) -> dict[str, list[Mapping[str, Any]]]:
        """The device configs the config declares for one node, by hardware type, in declaration order."""
        ...


class BackendRegistry(Protocol):
    """What an executor may ask of the plugin manager (``hwplace.plugin.manager.PluginManager``)."""

    def backends(self) -> Mapping[str, Any]:
        """The registered hardware backends by name (records with ``backend``, ``kind``, ``distribution``)."""
        ...


class Pending:
    """Something in flight that can be waited for: the base of every handle hwplace hands out (a group call's
    :class:`Handle`, a channel operation's ``ChannelHandle``, a message's ``MessageHandle``).

    ``wait(timeout=None)`` returns the result or raises its error, and ``TimeoutError`` when ``timeout``
    seconds elapse first (the operation goes on, and ``wait`` may be called again); ``done()`` says whether it
    finished; ``await handle`` (:meth:`wait_async`) waits inside async code.
    """

    def wait(self, timeout: float | None = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.wait")

    def done(self) -> bool:
        raise NotImplementedError(f"{type(self).__name__}.done")

    async def wait_async(self) -> Any:
        """``wait()`` for async code; ``await handle`` calls it."""
        raise NotImplementedError(f"{type(self).__name__}.wait_async")

    def __await__(self) -> Generator[Any, None, Any]:
        return self.wait_async().__await__()


class Handle(Pending):
    """A call in flight on one or more workers of a group; its results come back in rank order.

    ``wait(timeout=None)`` returns them, raising :class:`hwplace.WorkerError` for the first rank that failed
    and ``TimeoutError`` when ``timeout`` seconds elapse (the call goes on, and ``wait`` may be called again).
    ``done()`` says whether every rank has answered; ``await handle`` waits inside async code;
    ``cancel(force=False)`` stops the call. ``timeout`` passes :func:`hwplace.executor.wait_timeout` first (a
    bad one is a ``ConfigError`` naming it; infinity means no limit), as a channel handle's does.
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
    worker_class: type  # a hwplace.Worker subclass
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

@dataclass(frozen=True)
class GroupEntry:
    """A running group as its executor lists it for other processes: ``launch_id`` is unique to this launch
    (a group relaunched under its name gets a new one), ``placements`` and node ``addresses`` are in rank order.

    With restarts (``hwplace.executor.Restarts``), ``incarnations`` counts each rank's processes (0: its first;
    a restarted rank's communicators are keyed by it) and ``states`` says which ranks are ``restarting`` or
    ``dead`` (empty: all serve, the first process of each)."""

    name: str
    launch_id: str
    placements: tuple[Placement, ...]
    addresses: tuple[str, ...]
    incarnations: tuple[int, ...] = ()
    states: tuple[str, ...] = ()

    def incarnation(self, rank: int) -> int:
        return self.incarnations[rank] if rank < len(self.incarnations) else 0

    def state(self, rank: int) -> str:
        return self.states[rank] if rank < len(self.states) else "serving"


class Executor:
    """Base class of an executor plugin; subclass it and return an instance from ``hwplace_executors()``.

    An executor imports its runtime (Ray, ...) only when one of its methods is called, never at import.
    """

    name: ClassVar[str] = ""

    def discover(self, config: ClusterSpec, plugin_manager: BackendRegistry) -> list[Node]:
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

    def find_group(self, name: str) -> GroupEntry | None:
        """The running group called ``name`` (from any process of the cluster), or ``None``."""
        raise NotImplementedError(f"{type(self).__name__}.find_group")

    def where(self) -> str:
        """The cluster this process is connected to, in a few words (``"Ray cluster at 10.0.0.1:6379"``), for
        ``hwplace run`` to say where it runs before it places anything."""
        raise NotImplementedError(f"{type(self).__name__}.where")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


CORE_METHODS = ("discover", "free_port", "start_group", "find_group", "where")
"""What every executor implements; the capabilities (:mod:`hwplace.contracts.capabilities`) are optional."""


def check_executor(executor: object) -> str | None:
    """Say what is wrong with an executor object a plugin returned, or ``None`` when it is usable: not an
    :class:`Executor`, a bad name, or a method of the core it does not implement."""
    if not isinstance(executor, Executor):
        return f"{safe_repr(executor)} is not a hwplace.Executor"
    try:
        name = executor.name
    except Exception as exc:
        return f"reading {type(executor).__name__}.name raised {safe_repr(exc)}"
    if not isinstance(name, str) or not PLUGIN_NAME.match(name):
        return (f"{type(executor).__name__}.name is {safe_repr(name)}; an executor name is 1 to 64 lower-case "
                "letters, digits, '.', '_' and '-'")
    missing = [m for m in CORE_METHODS if getattr(type(executor), m, None) is getattr(Executor, m)]
    if missing:
        return f"{type(executor).__name__} does not implement {', '.join(missing)} (every executor's core)"
    return None
