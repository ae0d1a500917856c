"""hwplace: place the processes of a distributed RL/ML job on a cluster's hardware.

Plugin authors need :data:`hookimpl`, :class:`HardwareBackend`, :class:`Device` and :class:`Executor`. Importing hwplace
imports neither ray nor torch.
"""

from __future__ import annotations

import pluggy

from hwplace import errors as errors  # the public modules: hwplace.errors, hwplace.executor, hwplace.testing
from hwplace import executor as executor
from hwplace import testing
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
from hwplace.foundation.trace import user_span as span
from hwplace.foundation.version import __version__
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
