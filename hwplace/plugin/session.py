"""The state of this process in one object: its plugin manager, its executor and, in a worker, who it is.

As torch.distributed keeps its process groups in one ``_world``, hwplace keeps what a process has in one
:class:`Session`: the plugin manager (made on first use), the executor of the last cluster started here or,
in a worker, its own, the worker's :class:`~hwplace.contracts.records.WorkerContext`, and the per-process
state of the runtime's subsystems (a worker's messenger, its weight syncs, its channel connections).
:class:`~hwplace.Cluster` fills it on the driver and the worker start-up in each worker; tests swap it with
:func:`swapped_session`, never by patching module globals. Imports the foundation, the contracts' records, and
the plugin manager and the capability check on first use (:mod:`hwplace.plugin.deferred`: a worker may never
use them).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import ConfigError, HwplaceError
from hwplace.plugin import deferred

if TYPE_CHECKING:  # used here in annotations only; deferred gives them out on first use
    from hwplace.contracts.capabilities import Capability
    from hwplace.contracts.executor import Executor
    from hwplace.plugin.manager import PluginManager

C = TypeVar("C", bound="Capability")
T = TypeVar("T")


class Session:
    """What this process has: ``plugin_manager``, the executor, the worker context, the runtime's state."""

    def __init__(self, plugin_manager: PluginManager | None = None, executor: Executor | str | None = None,
                 worker: WorkerContext | None = None) -> None:
        self._lock = threading.RLock()
        self._plugin_manager = plugin_manager
        self._executor = executor
        self.worker = worker
        self._state: dict[str, Any] = {}

    @property
    def plugin_manager(self) -> PluginManager:
        """The plugin manager, created (and entry points loaded) on first use."""
        with self._lock:
            if self._plugin_manager is None:
                self._plugin_manager = deferred.PluginManager()
            return self._plugin_manager

    def set_executor(self, executor: Executor | str) -> None:
        """Make ``executor`` (or the one of that name, looked up on first use) this process's executor."""
        with self._lock:
            self._executor = executor

    @property
    def executor(self) -> Executor:
        """This process's executor: the one of the last cluster started here, or the worker's own."""
        with self._lock:
            executor = self._executor
            if executor is None:
                raise ConfigError("cluster", "there is no running cluster in this process",
                                  allowed="start one first with hwplace.Cluster(cluster_cfg), or call this "
                                  "inside a worker")
            if isinstance(executor, str):
                executor = self._executor = self.plugin_manager.executor(executor)
            return executor

    def require(self, capability: type[C], where: str) -> C:
        """This process's executor as a ``capability``; a ``PluginError`` naming both when it lacks it."""
        return deferred.require(self.executor, capability, where)

    def worker_context(self, what: str) -> WorkerContext:
        """This worker's context; ``HwplaceError`` saying ``what`` runs inside a worker when there is none."""
        if self.worker is None:
            raise HwplaceError(f"{what} runs inside a worker (a method of a hwplace.Worker), not on the driver")
        return self.worker

    def state(self, key: str, make: Callable[[], T]) -> T:
        """The state the runtime keeps under ``key`` in this process (``"messaging"``, ...), made on first use."""
        with self._lock:
            if key not in self._state:
                self._state[key] = make()
            return self._state[key]  # type: ignore[no-any-return]

    def made(self, thing: Any) -> None:
        """This process made ``thing`` (a channel, a weight sync): tell the hooks :meth:`on_made` registered (a
        job's driver records them for its snapshots)."""
        hooks: list[Callable[[Any], None]] = self.state("made", list)
        for hook in list(hooks):
            hook(thing)

    def on_made(self, hook: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``hook`` with each channel and weight sync this process makes from now on; returns the call that
        stops it."""
        hooks: list[Callable[[Any], None]] = self.state("made", list)
        hooks.append(hook)
        return lambda: hooks.remove(hook) if hook in hooks else None

    def __repr__(self) -> str:
        executor = self._executor if isinstance(self._executor, str) else getattr(self._executor, "name", None)
        who = f" worker {self.worker.group!r} rank {self.worker.rank}" if self.worker else ""
        return f"<hwplace Session executor={executor!r}{who}>"


_sessions: list[Session] = [Session()]  # the one session of this process; swapped_session pushes another


def session() -> Session:
    """This process's :class:`Session`."""
    return _sessions[-1]


def get_plugin_manager() -> PluginManager:
    """The process's plugin manager, created (and entry points loaded) on first use.

    A convenience at the public edge: everything that uses a manager also accepts one passed in.
    """
    return session().plugin_manager


def current_executor() -> Executor:
    """This process's executor (``session().executor``): the last cluster's, or in a worker its own."""
    return session().executor


@contextlib.contextmanager
def swapped_session(replacement: Session | None = None) -> Iterator[Session]:
    """Use ``replacement`` (a fresh :class:`Session` by default) as this process's session inside the block; the
    previous one is back afterwards, whatever happens. For tests."""
    new = replacement if replacement is not None else Session()
    _sessions.append(new)
    try:
        yield new
    finally:
        _sessions.remove(new)
