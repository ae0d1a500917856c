"""hwplace: place the processes of a distributed RL/ML job on a cluster's hardware.

Plugin authors need :data:`hookimpl`, :class:`HardwareBackend`, :class:`Device` and :class:`Executor`. Importing hwplace
imports neither ray nor torch.
"""

from __future__ import annotations

import pluggy

from hwplace import testing
from hwplace.balance import balanced_split, imbalance
from hwplace.channel import Channel, ChannelHandle
from hwplace.cluster import Cluster, Node
from hwplace.component import ComponentPlacement
from hwplace.config import ClusterConfig, NodeGroup, parse_cluster_config
from hwplace.errors import (
    ChannelClosed,
    ChannelEmpty,
    ChannelFull,
    ChannelLost,
    ChannelTimeout,
    ConfigError,
    HwplaceError,
    PlacementError,
    PluginError,
    WorkerError,
)
from hwplace.executor import Executor, Handle
from hwplace.group import WorkerGroup
from hwplace.hardware import Device, HardwareBackend, NoDevices
from hwplace.job import Job, run_job
from hwplace.loading import load_config
from hwplace.placement import Placement
from hwplace.plugin_manager import PluginManager, get_plugin_manager
from hwplace.strategies import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementStrategy,
)
from hwplace.worker import Worker

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("hwplace")
"""Marks a function of a hwplace plugin as a hook implementation."""

__all__ = [
    "Channel",
    "ChannelClosed",
    "ChannelEmpty",
    "ChannelFull",
    "ChannelHandle",
    "ChannelLost",
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
    "NoDevices",
    "Node",
    "NodeGroup",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementError",
    "PlacementStrategy",
    "PluginError",
    "PluginManager",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "__version__",
    "balanced_split",
    "get_plugin_manager",
    "hookimpl",
    "imbalance",
    "load_config",
    "parse_cluster_config",
    "run_job",
    "testing",
]
