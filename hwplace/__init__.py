"""hwplace: place the processes of a distributed RL/ML job on a cluster's hardware.

Plugin authors need :data:`hookimpl`, :class:`HardwareBackend`, :class:`Device` and :class:`Executor`. Importing hwplace
imports neither ray nor torch, and each public name's module only when the name is first used: a worker process
loads the runtime it needs, not the planner or the job runner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy

from hwplace.foundation.version import __version__

if TYPE_CHECKING:
    from hwplace import errors as errors  # the public modules: hwplace.errors, hwplace.executor, hwplace.testing
    from hwplace import executor as executor
    from hwplace import testing
    from hwplace.application.job import Job, run_job
    from hwplace.channels.balance import balanced_split, imbalance
    from hwplace.channels.channel import Channel
    from hwplace.channels.handle import ChannelHandle
    from hwplace.channels.holds import Taken
    from hwplace.channels.queues import QueueStats
    from hwplace.config.job_config import JobConfig, parse_job_config
    from hwplace.config.loading import load_config
    from hwplace.config.records import ClusterConfig, NodeGroup
    from hwplace.config.restart import Restart
    from hwplace.config.section import parse_cluster_config
    from hwplace.contracts.executor import Executor, Handle, Pending
    from hwplace.contracts.hardware import Device, HardwareBackend, NoDevices
    from hwplace.contracts.records import Node, Placement
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
    from hwplace.foundation.sizes import parse_size
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

# What each name is, and where: imported on first use, so that a process (a worker, a node's probe) pays
# only for the modules it touches.
_LAZY: dict[str, tuple[str, str | None]] = {
    'errors': ('hwplace.errors', None),
    'executor': ('hwplace.executor', None),
    'testing': ('hwplace.testing', None),
    'Job': ('hwplace.application.job', 'Job'),
    'run_job': ('hwplace.application.job', 'run_job'),
    'balanced_split': ('hwplace.channels.balance', 'balanced_split'),
    'imbalance': ('hwplace.channels.balance', 'imbalance'),
    'Channel': ('hwplace.channels.channel', 'Channel'),
    'ChannelHandle': ('hwplace.channels.handle', 'ChannelHandle'),
    'Taken': ('hwplace.channels.holds', 'Taken'),
    'QueueStats': ('hwplace.channels.queues', 'QueueStats'),
    'JobConfig': ('hwplace.config.job_config', 'JobConfig'),
    'parse_job_config': ('hwplace.config.job_config', 'parse_job_config'),
    'load_config': ('hwplace.config.loading', 'load_config'),
    'ClusterConfig': ('hwplace.config.records', 'ClusterConfig'),
    'NodeGroup': ('hwplace.config.records', 'NodeGroup'),
    'Restart': ('hwplace.config.restart', 'Restart'),
    'parse_cluster_config': ('hwplace.config.section', 'parse_cluster_config'),
    'Executor': ('hwplace.contracts.executor', 'Executor'),
    'Handle': ('hwplace.contracts.executor', 'Handle'),
    'Pending': ('hwplace.contracts.executor', 'Pending'),
    'Device': ('hwplace.contracts.hardware', 'Device'),
    'HardwareBackend': ('hwplace.contracts.hardware', 'HardwareBackend'),
    'NoDevices': ('hwplace.contracts.hardware', 'NoDevices'),
    'Node': ('hwplace.contracts.records', 'Node'),
    'Placement': ('hwplace.contracts.records', 'Placement'),
    'CallCancelled': ('hwplace.foundation.errors', 'CallCancelled'),
    'ChannelClosed': ('hwplace.foundation.errors', 'ChannelClosed'),
    'ChannelEmpty': ('hwplace.foundation.errors', 'ChannelEmpty'),
    'ChannelFull': ('hwplace.foundation.errors', 'ChannelFull'),
    'ChannelLost': ('hwplace.foundation.errors', 'ChannelLost'),
    'ChannelNotHeld': ('hwplace.foundation.errors', 'ChannelNotHeld'),
    'ChannelTimeout': ('hwplace.foundation.errors', 'ChannelTimeout'),
    'ConfigError': ('hwplace.foundation.errors', 'ConfigError'),
    'HwplaceError': ('hwplace.foundation.errors', 'HwplaceError'),
    'PlacementError': ('hwplace.foundation.errors', 'PlacementError'),
    'PluginError': ('hwplace.foundation.errors', 'PluginError'),
    'WeightSyncError': ('hwplace.foundation.errors', 'WeightSyncError'),
    'WorkerError': ('hwplace.foundation.errors', 'WorkerError'),
    'parse_size': ('hwplace.foundation.sizes', 'parse_size'),
    'Cluster': ('hwplace.inventory.cluster', 'Cluster'),
    'ComponentPlacement': ('hwplace.planning.component', 'ComponentPlacement'),
    'Prediction': ('hwplace.planning.cost', 'Prediction'),
    'predict': ('hwplace.planning.cost', 'predict'),
    'SearchResult': ('hwplace.planning.layouts', 'SearchResult'),
    'NotMeasured': ('hwplace.planning.profile', 'NotMeasured'),
    'Profile': ('hwplace.planning.profile', 'Profile'),
    'load_profile': ('hwplace.planning.profile', 'load_profile'),
    'parse_profile': ('hwplace.planning.profile', 'parse_profile'),
    'search_placements': ('hwplace.planning.search', 'search_placements'),
    'FlexiblePlacementStrategy': ('hwplace.planning.strategies', 'FlexiblePlacementStrategy'),
    'NodePlacementStrategy': ('hwplace.planning.strategies', 'NodePlacementStrategy'),
    'PackedPlacementStrategy': ('hwplace.planning.strategies', 'PackedPlacementStrategy'),
    'PlacementStrategy': ('hwplace.planning.strategies', 'PlacementStrategy'),
    'PluginManager': ('hwplace.plugin.manager', 'PluginManager'),
    'get_plugin_manager': ('hwplace.plugin.session', 'get_plugin_manager'),
    'WorkerGroup': ('hwplace.runtime.group', 'WorkerGroup'),
    'MessageHandle': ('hwplace.runtime.messaging.pair', 'MessageHandle'),
    'RankStatus': ('hwplace.runtime.restarts', 'RankStatus'),
    'Weights': ('hwplace.runtime.weight_sync.buckets', 'Weights'),
    'WeightSync': ('hwplace.runtime.weight_sync.sync', 'WeightSync'),
    'Worker': ('hwplace.runtime.worker', 'Worker'),
}

hookimpl = pluggy.HookimplMarker("hwplace")
"""Marks a function of a hwplace plugin as a hook implementation."""


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept here)."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'hwplace' has no attribute {name!r}")
    module = importlib.import_module(where[0])
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

__all__ = [
    "CallCancelled",
    "Channel",
    "ChannelClosed",
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
    "testing",
]
