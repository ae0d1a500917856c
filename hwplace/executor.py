"""Everything an executor plugin's author needs, in one public module (the façade over the layers).

Subclass :class:`Executor` (and :class:`GroupRuntime`, :class:`Handle`) for the core every executor has, and
the capabilities it offers besides (:class:`ChannelHosting` with an :class:`ObjectStore`, :class:`Rendezvous`,
:class:`Leases`, :class:`TurnArbitration`, :class:`LocalClusters`, :class:`Restarts` with
:class:`Incarnations`); on each node run :func:`detect_here`; in each
worker process host the worker with :func:`start_worker` and :func:`run_method` / :func:`run_method_async`;
serve a channel with :class:`ChannelServer` and turns with :class:`TurnServer`; check a ``Handle.wait``'s
timeout with :func:`wait_timeout`; quote an underlying error in a message with :func:`first_line`;
:func:`quiet_workers` says whether to keep workers' output off the
terminal. The process's state is its :class:`Session` (:func:`session`; tests swap it with
:func:`swapped_session`). The contracts themselves are :mod:`hwplace.contracts.executor` and
:mod:`hwplace.contracts.capabilities`. No module of hwplace imports this one. Each name is loaded from its
module on first use (PEP 562), so a worker process that hosts with a few of them loads only theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwplace.foundation.lazy import on_first_use

if TYPE_CHECKING:  # what __getattr__ below loads on first use (_HOMES says from where), as type checkers see it
    from hwplace.channels.server import ChannelServer
    from hwplace.contracts.capabilities import (
        Capability,
        ChannelAddress,
        ChannelHosting,
        Leases,
        LocalClusters,
        ObjectStore,
        Rendezvous,
        Restarts,
        TurnAddress,
        TurnArbitration,
        capabilities_of,
        require,
    )
    from hwplace.contracts.executor import (
        CORE_METHODS,
        BackendRegistry,
        ClusterSpec,
        Executor,
        GroupEntry,
        GroupRequest,
        GroupRuntime,
        Handle,
        Pending,
        WorkerSpec,
        check_executor,
    )
    from hwplace.contracts.records import WorkerContext
    from hwplace.contracts.registry import DeviceLease, GroupRecord, LeaseConflict, WorkerRecord
    from hwplace.foundation.settings import read_quiet_workers as quiet_workers
    from hwplace.foundation.timeouts import wait_timeout
    from hwplace.foundation.wording import first_line
    from hwplace.inventory.detection import detect_here
    from hwplace.inventory.leases import LeaseBook, lease_refusal
    from hwplace.planning.sharing import Share, shared_accelerators
    from hwplace.plugin.detection import detect_timeout
    from hwplace.plugin.session import Session, current_executor, session, swapped_session
    from hwplace.runtime.hosting import (
        RemoteFailure,
        run_method,
        run_method_async,
        start_worker,
        unpicklable_arguments,
    )
    from hwplace.runtime.restarts import Incarnations
    from hwplace.runtime.turns.arbiter import TurnServer

_HOMES: dict[str, str] = {  # each name loaded on first use: its module, or "module:its name there"
    "ChannelServer": "hwplace.channels.server",
    "Capability": "hwplace.contracts.capabilities",
    "ChannelAddress": "hwplace.contracts.capabilities",
    "ChannelHosting": "hwplace.contracts.capabilities",
    "Leases": "hwplace.contracts.capabilities",
    "LocalClusters": "hwplace.contracts.capabilities",
    "ObjectStore": "hwplace.contracts.capabilities",
    "Rendezvous": "hwplace.contracts.capabilities",
    "Restarts": "hwplace.contracts.capabilities",
    "TurnAddress": "hwplace.contracts.capabilities",
    "TurnArbitration": "hwplace.contracts.capabilities",
    "capabilities_of": "hwplace.contracts.capabilities",
    "require": "hwplace.contracts.capabilities",
    "BackendRegistry": "hwplace.contracts.executor",
    "CORE_METHODS": "hwplace.contracts.executor",
    "ClusterSpec": "hwplace.contracts.executor",
    "Executor": "hwplace.contracts.executor",
    "GroupEntry": "hwplace.contracts.executor",
    "GroupRequest": "hwplace.contracts.executor",
    "GroupRuntime": "hwplace.contracts.executor",
    "Handle": "hwplace.contracts.executor",
    "Pending": "hwplace.contracts.executor",
    "WorkerSpec": "hwplace.contracts.executor",
    "check_executor": "hwplace.contracts.executor",
    "WorkerContext": "hwplace.contracts.records",
    "DeviceLease": "hwplace.contracts.registry",
    "GroupRecord": "hwplace.contracts.registry",
    "LeaseConflict": "hwplace.contracts.registry",
    "WorkerRecord": "hwplace.contracts.registry",
    "quiet_workers": "hwplace.foundation.settings:read_quiet_workers",
    "wait_timeout": "hwplace.foundation.timeouts",
    "first_line": "hwplace.foundation.wording",
    "detect_here": "hwplace.inventory.detection",
    "LeaseBook": "hwplace.inventory.leases",
    "lease_refusal": "hwplace.inventory.leases",
    "Share": "hwplace.planning.sharing",
    "shared_accelerators": "hwplace.planning.sharing",
    "detect_timeout": "hwplace.plugin.detection",
    "Session": "hwplace.plugin.session",
    "current_executor": "hwplace.plugin.session",
    "session": "hwplace.plugin.session",
    "swapped_session": "hwplace.plugin.session",
    "RemoteFailure": "hwplace.runtime.hosting",
    "run_method": "hwplace.runtime.hosting",
    "run_method_async": "hwplace.runtime.hosting",
    "start_worker": "hwplace.runtime.hosting",
    "unpicklable_arguments": "hwplace.runtime.hosting",
    "Incarnations": "hwplace.runtime.restarts",
    "TurnServer": "hwplace.runtime.turns.arbiter",
}

if not TYPE_CHECKING:  # type checkers see the imports above instead, and so still flag a misspelled name
    __getattr__ = on_first_use(__name__, _HOMES)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "CORE_METHODS",
    "BackendRegistry",
    "Capability",
    "ChannelAddress",
    "ChannelHosting",
    "ChannelServer",
    "ClusterSpec",
    "DeviceLease",
    "Executor",
    "GroupEntry",
    "GroupRecord",
    "GroupRequest",
    "GroupRuntime",
    "Handle",
    "Incarnations",
    "LeaseBook",
    "LeaseConflict",
    "Leases",
    "LocalClusters",
    "ObjectStore",
    "Pending",
    "RemoteFailure",
    "Rendezvous",
    "Restarts",
    "Session",
    "Share",
    "TurnAddress",
    "TurnArbitration",
    "TurnServer",
    "WorkerContext",
    "WorkerRecord",
    "WorkerSpec",
    "capabilities_of",
    "check_executor",
    "current_executor",
    "detect_here",
    "detect_timeout",
    "first_line",
    "lease_refusal",
    "quiet_workers",
    "require",
    "run_method",
    "run_method_async",
    "session",
    "shared_accelerators",
    "start_worker",
    "swapped_session",
    "unpicklable_arguments",
    "wait_timeout",
]
