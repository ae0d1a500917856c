"""The one error hierarchy of hwplace, rooted at :class:`HwplaceError` (public face of
:mod:`hwplace.foundation.errors`). No module of hwplace imports this one."""

from __future__ import annotations

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

__all__ = [
    "CallCancelled",
    "ChannelClosed",
    "ChannelEmpty",
    "ChannelFull",
    "ChannelLost",
    "ChannelNotHeld",
    "ChannelTimeout",
    "ConfigError",
    "HwplaceError",
    "PlacementError",
    "PluginError",
    "WeightSyncError",
    "WorkerError",
]
