"""Everything an executor plugin's author needs, in one public module (the façade over the layers).

Subclass :class:`Executor` (and :class:`GroupRuntime`, :class:`Handle`) for the core every executor has, and
the capabilities it offers besides (:class:`ChannelHosting` with an :class:`ObjectStore`, :class:`Rendezvous`,
:class:`Leases`, :class:`TurnArbitration`, :class:`LocalClusters`, :class:`Restarts` with
:class:`Incarnations`); on each node run :func:`detect_here`; in each
worker process host the worker with :func:`start_worker` and :func:`run_method` / :func:`run_method_async`;
serve a channel with :class:`ChannelServer` and turns with :class:`TurnServer`; check a ``Handle.wait``'s
timeout with :func:`wait_timeout`; :func:`quiet_workers` says whether to keep workers' output off the
terminal. The process's state is its :class:`Session` (:func:`session`; tests swap it with
:func:`swapped_session`). The contracts themselves are :mod:`hwplace.contracts.executor` and
:mod:`hwplace.contracts.capabilities`. No module of hwplace imports this one. Each name's module is imported
on first use, so a worker process loads only what it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# What each name is, and where: imported on first use, so that a process (a worker, a node's probe) pays
# only for the modules it touches.
_LAZY: dict[str, tuple[str, str | None]] = {
    'ChannelServer': ('hwplace.channels.server', 'ChannelServer'),
    'Capability': ('hwplace.contracts.capabilities', 'Capability'),
    'ChannelAddress': ('hwplace.contracts.capabilities', 'ChannelAddress'),
    'ChannelHosting': ('hwplace.contracts.capabilities', 'ChannelHosting'),
    'Leases': ('hwplace.contracts.capabilities', 'Leases'),
    'LocalClusters': ('hwplace.contracts.capabilities', 'LocalClusters'),
    'ObjectStore': ('hwplace.contracts.capabilities', 'ObjectStore'),
    'Rendezvous': ('hwplace.contracts.capabilities', 'Rendezvous'),
    'Restarts': ('hwplace.contracts.capabilities', 'Restarts'),
    'TurnAddress': ('hwplace.contracts.capabilities', 'TurnAddress'),
    'TurnArbitration': ('hwplace.contracts.capabilities', 'TurnArbitration'),
    'capabilities_of': ('hwplace.contracts.capabilities', 'capabilities_of'),
    'require': ('hwplace.contracts.capabilities', 'require'),
    'CORE_METHODS': ('hwplace.contracts.executor', 'CORE_METHODS'),
    'BackendRegistry': ('hwplace.contracts.executor', 'BackendRegistry'),
    'ClusterSpec': ('hwplace.contracts.executor', 'ClusterSpec'),
    'Executor': ('hwplace.contracts.executor', 'Executor'),
    'GroupEntry': ('hwplace.contracts.executor', 'GroupEntry'),
    'GroupRequest': ('hwplace.contracts.executor', 'GroupRequest'),
    'GroupRuntime': ('hwplace.contracts.executor', 'GroupRuntime'),
    'Handle': ('hwplace.contracts.executor', 'Handle'),
    'Pending': ('hwplace.contracts.executor', 'Pending'),
    'WorkerSpec': ('hwplace.contracts.executor', 'WorkerSpec'),
    'check_executor': ('hwplace.contracts.executor', 'check_executor'),
    'WorkerContext': ('hwplace.contracts.records', 'WorkerContext'),
    'DeviceLease': ('hwplace.contracts.registry', 'DeviceLease'),
    'GroupRecord': ('hwplace.contracts.registry', 'GroupRecord'),
    'LeaseConflict': ('hwplace.contracts.registry', 'LeaseConflict'),
    'WorkerRecord': ('hwplace.contracts.registry', 'WorkerRecord'),
    'quiet_workers': ('hwplace.foundation.settings', 'read_quiet_workers'),
    'wait_timeout': ('hwplace.foundation.timeouts', 'wait_timeout'),
    'detect_here': ('hwplace.inventory.detection', 'detect_here'),
    'LeaseBook': ('hwplace.inventory.leases', 'LeaseBook'),
    'lease_refusal': ('hwplace.inventory.leases', 'lease_refusal'),
    'Share': ('hwplace.planning.sharing', 'Share'),
    'shared_accelerators': ('hwplace.planning.sharing', 'shared_accelerators'),
    'detect_timeout': ('hwplace.plugin.detection', 'detect_timeout'),
    'Session': ('hwplace.plugin.session', 'Session'),
    'current_executor': ('hwplace.plugin.session', 'current_executor'),
    'session': ('hwplace.plugin.session', 'session'),
    'swapped_session': ('hwplace.plugin.session', 'swapped_session'),
    'RemoteFailure': ('hwplace.runtime.hosting', 'RemoteFailure'),
    'run_method': ('hwplace.runtime.hosting', 'run_method'),
    'run_method_async': ('hwplace.runtime.hosting', 'run_method_async'),
    'start_worker': ('hwplace.runtime.hosting', 'start_worker'),
    'unpicklable_arguments': ('hwplace.runtime.hosting', 'unpicklable_arguments'),
    'Incarnations': ('hwplace.runtime.restarts', 'Incarnations'),
    'TurnServer': ('hwplace.runtime.turns.arbiter', 'TurnServer'),
}

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


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept here)."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'hwplace.executor' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), str(where[1]))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
