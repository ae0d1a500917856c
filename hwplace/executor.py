"""Everything an executor plugin's author needs, in one public module (the façade over the layers).

Subclass :class:`Executor` (and :class:`GroupRuntime`, :class:`Handle`, :class:`ObjectStore`); on each node
run :func:`detect_here`; in each worker process host the worker with :func:`start_worker` and
:func:`run_method` / :func:`run_method_async`; serve a channel with :class:`ChannelServer`. The contract
itself is :mod:`hwplace.contracts.executor`. No module of hwplace imports this one.
"""

from __future__ import annotations

from hwplace.channels.server import ChannelServer
from hwplace.contracts.executor import (
    ChannelAddress,
    Executor,
    GroupEntry,
    GroupRequest,
    GroupRuntime,
    Handle,
    ObjectStore,
    TurnAddress,
    WorkerSpec,
    check_executor,
)
from hwplace.contracts.records import WorkerContext
from hwplace.contracts.registry import DeviceLease, GroupRecord, LeaseConflict, WorkerRecord
from hwplace.inventory.detection import detect_here
from hwplace.planning.sharing import Share, shared_accelerators
from hwplace.plugin.current import current_executor, set_current_executor
from hwplace.plugin.detection import detect_timeout
from hwplace.runtime.hosting import RemoteFailure, run_method, run_method_async, start_worker
from hwplace.runtime.turns import TurnServer

__all__ = [
    "ChannelAddress",
    "ChannelServer",
    "DeviceLease",
    "Executor",
    "GroupEntry",
    "GroupRecord",
    "GroupRequest",
    "GroupRuntime",
    "Handle",
    "LeaseConflict",
    "ObjectStore",
    "RemoteFailure",
    "Share",
    "TurnAddress",
    "TurnServer",
    "WorkerContext",
    "WorkerRecord",
    "WorkerSpec",
    "check_executor",
    "current_executor",
    "detect_here",
    "detect_timeout",
    "run_method",
    "run_method_async",
    "set_current_executor",
    "shared_accelerators",
    "start_worker",
]
