"""hwplace: place the processes of a distributed RL/ML job on a cluster's hardware.

Plugin authors need :data:`hookimpl`, :class:`HardwareBackend`, :class:`Device` and :class:`Executor`. Importing hwplace
imports neither ray nor torch, and few of its own modules: the errors and the version at once, every other public name
from its module on first use (PEP 562). So a worker process loads what it uses (``Worker`` and its hosting), not the
whole public API (planning, the job runner, weight sync).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from hwplace.foundation.errors import (
    CallCancelled,
    ChannelClosed,
    ChannelEmpty,
    ChannelFull,
    ChannelLost,
    ChannelNotHeld,
    ChannelTimeout,
    ConfigError,
    HwplaceError,
    PlacementError,
    PluginError,
    WeightSyncError,
    WorkerError,
)
from hwplace.foundation.lazy import on_first_use as _on_first_use
from hwplace.foundation.version import __version__

if TYPE_CHECKING:  # what __getattr__ below loads on first use (_HOMES says from where), as type checkers see it
    from hwplace import errors as errors
    from hwplace import executor as executor
    from hwplace import testing as testing
    from hwplace.application.job import Job, run_job
    from hwplace.channels.balance import balanced_split, imbalance
    from hwplace.channels.channel import Channel
    from hwplace.channels.handle import ChannelHandle
    from hwplace.channels.holds import Taken
    from hwplace.channels.queues import QueueStats
    from hwplace.channels.snapshot import ChannelContents, export_channel
    from hwplace.config.job_config import JobConfig, parse_job_config
    from hwplace.config.loading import load_config
    from hwplace.config.records import ClusterConfig, NodeGroup
    from hwplace.config.restart import Restart
    from hwplace.config.section import parse_cluster_config
    from hwplace.contracts.executor import Executor, Handle, Pending
    from hwplace.contracts.hardware import Device, HardwareBackend, NoDevices
    from hwplace.contracts.records import Node, Placement, RestartInfo
    from hwplace.foundation.sizes import parse_size
    from hwplace.foundation.trace import user_span as span
    from hwplace.inventory.cluster import Cluster
    from hwplace.planning.component import ComponentPlacement
    from hwplace.planning.cost import Prediction, predict
    from hwplace.planning.layouts import SearchResult
    from hwplace.planning.profile import NotMeasured, Profile, load_profile, parse_profile
    from hwplace.planning.search import search_placements
    from hwplace.planning.strategies import (
        FlexiblePlacementStrategy,
        NodePlacementStrategy,
        PackedPlacementStrategy,
        PlacementStrategy,
    )
    from hwplace.plugin.manager import PluginManager
    from hwplace.plugin.session import get_plugin_manager
    from hwplace.runtime.group import WorkerGroup
    from hwplace.runtime.messaging.pair import MessageHandle
    from hwplace.runtime.restarts import RankStatus
    from hwplace.runtime.weight_sync.buckets import Weights
    from hwplace.runtime.weight_sync.sync import WeightSync
    from hwplace.runtime.worker import Worker

hookimpl = pluggy.HookimplMarker("hwplace")
"""Marks a function of a hwplace plugin as a hook implementation."""

_HOMES: dict[str, str] = {  # each name loaded on first use: its module, or "module:its name there"
    "errors": "hwplace.errors",
    "executor": "hwplace.executor",
    "testing": "hwplace.testing",
    "Job": "hwplace.application.job",
    "run_job": "hwplace.application.job",
    "balanced_split": "hwplace.channels.balance",
    "imbalance": "hwplace.channels.balance",
    "Channel": "hwplace.channels.channel",
    "ChannelHandle": "hwplace.channels.handle",
    "Taken": "hwplace.channels.holds",
    "QueueStats": "hwplace.channels.queues",
    "ChannelContents": "hwplace.channels.snapshot",
    "export_channel": "hwplace.channels.snapshot",
    "JobConfig": "hwplace.config.job_config",
    "parse_job_config": "hwplace.config.job_config",
    "load_config": "hwplace.config.loading",
    "ClusterConfig": "hwplace.config.records",
    "NodeGroup": "hwplace.config.records",
    "Restart": "hwplace.config.restart",
    "parse_cluster_config": "hwplace.config.section",
    "Executor": "hwplace.contracts.executor",
    "Handle": "hwplace.contracts.executor",
    "Pending": "hwplace.contracts.executor",
    "Device": "hwplace.contracts.hardware",
    "HardwareBackend": "hwplace.contracts.hardware",
    "NoDevices": "hwplace.contracts.hardware",
    "Node": "hwplace.contracts.records",
    "Placement": "hwplace.contracts.records",
    "RestartInfo": "hwplace.contracts.records",
    "parse_size": "hwplace.foundation.sizes",
    "span": "hwplace.foundation.trace:user_span",
    "Cluster": "hwplace.inventory.cluster",
    "ComponentPlacement": "hwplace.planning.component",
    "Prediction": "hwplace.planning.cost",
    "predict": "hwplace.planning.cost",
    "SearchResult": "hwplace.planning.layouts",
    "NotMeasured": "hwplace.planning.profile",
    "Profile": "hwplace.planning.profile",
    "load_profile": "hwplace.planning.profile",
    "parse_profile": "hwplace.planning.profile",
    "search_placements": "hwplace.planning.search",
    "FlexiblePlacementStrategy": "hwplace.planning.strategies",
    "NodePlacementStrategy": "hwplace.planning.strategies",
    "PackedPlacementStrategy": "hwplace.planning.strategies",
    "PlacementStrategy": "hwplace.planning.strategies",
    "PluginManager": "hwplace.plugin.manager",
    "get_plugin_manager": "hwplace.plugin.session",
    "WorkerGroup": "hwplace.runtime.group",
    "MessageHandle": "hwplace.runtime.messaging.pair",
    "RankStatus": "hwplace.runtime.restarts",
    "Weights": "hwplace.runtime.weight_sync.buckets",
    "WeightSync": "hwplace.runtime.weight_sync.sync",
    "Worker": "hwplace.runtime.worker",
}

if not TYPE_CHECKING:  # type checkers see the imports above instead, and so still flag a misspelled name
    __getattr__ = _on_first_use(__name__, _HOMES)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "CallCancelled",
    "Channel",
    "ChannelClosed",
    "ChannelContents",
    "ChannelEmpty",
    "ChannelFull",
    "ChannelHandle",
    "ChannelLost",
    "ChannelNotHeld",
    "ChannelTimeout",
    "Cluster",
    "ClusterConfig",
    "ComponentPlacement",
    "ConfigError",
    "Device",
    "Executor",
    "FlexiblePlacementStrategy",
    "Handle",
    "HardwareBackend",
    "HwplaceError",
    "Job",
    "JobConfig",
    "MessageHandle",
    "NoDevices",
    "Node",
    "NodeGroup",
    "NodePlacementStrategy",
    "NotMeasured",
    "PackedPlacementStrategy",
    "Pending",
    "Placement",
    "PlacementError",
    "PlacementStrategy",
    "PluginError",
    "PluginManager",
    "Prediction",
    "Profile",
    "QueueStats",
    "RankStatus",
    "Restart",
    "RestartInfo",
    "SearchResult",
    "Taken",
    "WeightSync",
    "WeightSyncError",
    "Weights",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "__version__",
    "balanced_split",
    "export_channel",
    "get_plugin_manager",
    "hookimpl",
    "imbalance",
    "load_config",
    "load_profile",
    "parse_cluster_config",
    "parse_job_config",
    "parse_profile",
    "parse_size",
    "predict",
    "run_job",
    "search_placements",
    "span",
    "testing",
]
